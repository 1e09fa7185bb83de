"""``grpo-monitor report RUN_DIR``: the offline post-mortem of one run.

Quick decisions with live dashboards, deep attribution with local snapshots.

It reads every snapshot record of the run folder (``load``), summarises each core signal by
quantiles rather than means and reads reward, KL and loss together (``statistics``,
``summary``), names what it sees as verdicts, each with the steps and numbers that support it
(``verdicts``), and writes them (``render``).

Outputs (in ``--out``, default ``RUN_DIR/.report`` - a dot folder, which the exporter's ingest
ignores): ``summary.json``, ``verdicts.json``, ``reward-vs-step.csv``, ``report.txt``,
``curves.png``, ``law.png`` (reward against entropy with the fitted entropy-reward law, when it
could be fitted) and ``report.html`` (self-contained, opens offline).

numpy and matplotlib are the ``report`` extra. This package imports its modules on first use of
a name, so that ``python -m grpo_monitor.tools.report`` without the extra reaches the CLI, which names
the extra in one line, instead of failing on ``import numpy`` here.
"""

from __future__ import annotations

import importlib
from typing import Any

# The package's public names, by the module that defines them.
_PUBLIC: dict[str, str] = {
    "RunData": "load", "load_run": "load",
    "RunView": "statistics", "Track": "statistics", "describe": "statistics",
    "percentile": "statistics", "window_size": "statistics", "windows": "statistics",
    "summarize": "summary", "rollout_section": "summary", "law_section": "summary",
    "SUMMARY_SIGNALS": "summary", "ROLLOUT_KEYS": "summary",
    "diagnose": "verdicts", "verdict": "verdicts", "VERDICTS": "verdicts",
    "VerdictKind": "verdicts", "Finding": "verdicts", "SEVERITY_ORDER": "verdicts",
    "build_report": "render", "cmd_report": "render", "text_report": "render",
    "html_report": "render", "write_csv": "render", "plot_curves": "render",
    "plot_law": "render", "CSV_COLUMNS": "render",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})

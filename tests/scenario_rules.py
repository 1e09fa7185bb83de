"""Play a simulated run through the exporter and the real rules, with promtool as the evaluator.

The run is written step by step through the SDK into real files; the exporter's ingest and
store read them; after every ``scrape_every`` steps the exposition is "scraped" (rendered and
parsed) into one sample of each series. Those samples become a promtool unit test whose
evaluation interval stands for one scrape, and promtool evaluates the project's rule files on
them. Which cards fired, and when, is read back from the ALERTS series.
"""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grpo_monitor.health import ExporterHealth
from grpo_monitor.ingest import Ingestor
from grpo_monitor.sdk.writer import SnapshotWriter
from grpo_monitor.simulate import generate
from grpo_monitor.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
RULE_FILES = [str(ROOT / "prometheus" / "rules" / f) for f in
              ("grpo-thresholds.yml", "grpo-signals.yml", "grpo-alerts.yml", "grpo-cluster.yml")]
# The series the rules read; the rest of a scrape only slows promtool down.
RULE_INPUTS = ("grpo_step{", "grpo_kl_mean{", "grpo_baseline_", "grpo_initial_", "grpo_window_",
               "grpo_run_window_", "grpo_rising_windows{", "grpo_forecast_", "grpo_prompt_type_")


@dataclass
class Played:
    series: dict[str, list[str]]  # series -> one value per scrape ("_" when absent)
    scrape_steps: list[int]  # the step of rank 0 at each scrape


def _format(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class Recorder:
    """The exporter's ingest and store over a snapshot folder; each scrape is one sample of every
    series the rules read."""

    def __init__(self, root: Path) -> None:
        self.store = RunStore()
        self.ingestor = Ingestor(root, self.store, ExporterHealth())
        self.series: dict[str, list[str]] = {}
        self.steps: list[int] = []

    def scrape(self, step: int, paths: list[Path]) -> None:
        """Read what is new in ``paths``, then take one sample of the exposition."""
        for path in paths:
            self.ingestor.process(path)
        self.store.flush()
        self.add("".join(self.store.render()), step)

    def add(self, exposition: str, step: int) -> None:
        """One sample from exposition text (a real scrape's body, or the store's rendering)."""
        index = len(self.steps)
        self.steps.append(step)
        for line in exposition.splitlines():
            if line.startswith("#") or not line.startswith(RULE_INPUTS):
                continue
            name, _, value = line.rpartition(" ")
            values = self.series.setdefault(name, ["_"] * index)
            values.extend(["_"] * (index - len(values)))
            values.append(_format(float(value)))

    def played(self) -> Played:
        for values in self.series.values():
            values.extend(["_"] * (len(self.steps) - len(values)))
        return Played(self.series, self.steps)


def play(scenario: str, *, scrape_every: int, steps: int | None = None, ranks: int = 4,
         step_seconds: float = 5.0, log_every: int = 1) -> Played:
    """``log_every``: the trainer logs every k-th step only (TRL's ``logging_steps``)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        recorder = Recorder(root)
        writers = [SnapshotWriter(root, scenario, rank=r, world_size=ranks) for r in range(ranks)]
        for st in generate(scenario, steps=steps, ranks=ranks, step_seconds=step_seconds):
            if st.step % log_every:
                continue
            for rec in st.records:
                writers[rec.rank].log(rec.metrics, st.step, by_type=rec.by_type, events=rec.events,
                                      timestamp=rec.timestamp)
            if st.step % scrape_every == 0:
                recorder.scrape(st.step, [Path(w.path) for w in writers])
        for w in writers:
            w.close()
    return recorder.played()


FIRED = 'group by (alertname, severity) (max_over_time(ALERTS{{alertstate="firing"{only}}}[{minutes}m]))'
FIRING_NOW = 'group by (alertname, severity) (ALERTS{{alertstate="firing"{only}}})'


@dataclass(frozen=True)
class Check:
    """One expectation: exactly ``cards`` at scrape ``at``. ``now``: the cards firing at that
    scrape, rather than at any scrape up to it; ``only``: extra label matchers for ALERTS
    (e.g. ``,severity="critical"``)."""

    at: int
    cards: set[str]
    now: bool = False
    only: str = ""

    def test(self) -> dict[str, object]:
        return {
            "expr": (FIRING_NOW if self.now else FIRED).format(minutes=self.at + 1, only=self.only),
            "eval_time": f"{self.at}m",
            "exp_samples": [{"labels": f'{{alertname="{a}",severity="{SEVERITIES[a]}"}}', "value": 1}
                            for a in sorted(self.cards)],
        }


def check_cards(played: Played, checks: list[tuple[int, set[str]] | Check], tmp: Path, *,
                now: bool = False, only: str = "") -> None:
    """Assert with promtool that exactly the given cards had fired by each given scrape.

    ``checks`` holds (scrape index, expected card names) pairs, which take ``now`` and ``only``
    (see Check), or Checks of their own; each scrape is one minute of promtool's clock. One
    promtool run evaluates them all. Raises AssertionError with promtool's report, which names
    the cards that did fire, when a set differs.
    """
    checks = [c if isinstance(c, Check) else Check(c[0], c[1], now, only) for c in checks]
    test = {
        "rule_files": RULE_FILES,
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": name, "values": " ".join(values)}
                             for name, values in played.series.items()],
            "promql_expr_test": [c.test() for c in checks],
        }],
    }
    path = tmp / "scenario.test.json"
    path.write_text(json.dumps(test))
    proc = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"cards differ from {checks}:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")


def _severities() -> dict[str, str]:
    import yaml

    return {r["alert"]: r["labels"]["severity"] for f in RULE_FILES
            for g in yaml.safe_load(Path(f).read_text())["groups"] for r in g["rules"] if "alert" in r}


SEVERITIES = _severities()  # alert name -> severity, from the rule files


def scrape_index_before(played: Played, step: int) -> int:
    """The last scrape taken before ``step``."""
    return max(i for i, s in enumerate(played.scrape_steps) if s < step)


def scrape_index_at(played: Played, step: int) -> int:
    """The last scrape taken at or before ``step``."""
    return max(i for i, s in enumerate(played.scrape_steps) if s <= step)



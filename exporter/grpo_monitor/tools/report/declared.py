"""The declared card branches (contract/card_logic.py), judged on the exporter's own features.

As the report reads a run through the exporter's ingest and store (load.py), it takes, at each
logged step of rank 0, every feature a declared branch compares (``take``): the same window
statistics and references the exposition would publish then, computed by the same code
(runtime/signals.RankSignals.reading). A branch fires at the steps where one of its lines is
crossed, as its rule would at a scrape after that step; the thresholds are read from the
thresholds table at each judgement, as the live rules read grpo:threshold:* at each evaluation.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from grpo_monitor.contract import thresholds as th
from grpo_monitor.contract.card_logic import WINDOWED, Level, Line, declared
from grpo_monitor.runtime.signals import RankSignals

# One input of a declared branch: (key, feature, window) as RankSignals.reading takes it (no
# window for a reference); READY: the baseline period is over.
Reading = tuple[str, str, int | None]
READY: Reading = ("", "ready", None)
LEVELS: dict[tuple[str, str], Level] = declared()
# The evidence's names of the features: a window statistic is named for its window.
_NAMES = {"p10": "window_p10", "p90": "window_p90", "mean": "window_mean", "rising": "rising_windows"}
_OPS: dict[str, Callable[[Any, Any], Any]] = {">": operator.gt, "<": operator.lt,
                                              ">=": operator.ge, "<=": operator.le}


def _reading(level: Level, feature: str) -> Reading:
    return (level.key, feature, level.window if feature in WINDOWED else None)


def inputs(level: Level) -> list[Reading]:
    """What a level compares: each feature its lines and gates read, the baseline gate."""
    out = [_reading(level, f) for f in level.features]
    if level.baseline:
        out.append(READY)
    return out


READINGS: tuple[Reading, ...] = tuple(dict.fromkeys(r for lv in LEVELS.values() for r in inputs(lv)))


def take(signals: RankSignals) -> dict[Reading, float]:
    """Every declared branch's inputs as the rank's features stand now (absent: not published)."""
    out: dict[Reading, float] = {}
    for reading in READINGS:
        if reading == READY:
            value: float | None = 1.0 if signals.ready else None
        else:
            key, feature, window = reading
            value = signals.reading(key, feature, window or 0)
        if value is not None:
            out[reading] = value
    return out


def judge(steps: list[int], taken: dict[int, dict[Reading, float]], card: str,
          reason: str = "") -> dict[str, Any] | None:
    """Where the declared branch (card, reason) fired on rank 0's logged ``steps``: its first and
    last step, how many steps, each feature it compared and each line at the first one, and the
    window; None where it never fired."""
    level = LEVELS[card, reason]
    if not steps:
        return None
    read: dict[str, np.ndarray] = {
        f: np.array([taken.get(s, {}).get(_reading(level, f), math.nan) for s in steps], dtype=float)
        for f in level.features}

    def crossed(ln: Line) -> tuple[np.ndarray, np.ndarray]:
        line = np.full(len(steps), ln.constant if ln.constant is not None else
                       th.value(ln.threshold) if ln.threshold is not None else 1.0)
        if ln.reference is not None:
            line = line * read[ln.reference]
        with np.errstate(invalid="ignore"):
            return _OPS[ln.op](read[ln.feature], line), line  # NaN (not published) is False

    firing = np.zeros(len(steps), dtype=bool)
    lines: dict[str, np.ndarray] = {}
    for ln in level.lines:
        hit, line = crossed(ln)
        firing |= hit
        lines["above" if ln.op in (">", ">=") else "below"] = line
    for gate in level.gates:
        firing &= crossed(gate)[0]
    if level.baseline:
        firing &= np.array([taken.get(s, {}).get(READY) == 1 for s in steps])
    idx = np.flatnonzero(firing)
    if not idx.size:
        return None
    i = int(idx[0])
    hit: dict[str, Any] = {"steps": [steps[i], steps[int(idx[-1])]], "steps_flagged": int(idx.size)}
    hit.update({_NAMES.get(k, k): float(v[i]) for k, v in {**read, **lines}.items()
                if math.isfinite(v[i])})
    if level.window:
        hit["window_steps"] = level.window
    return hit

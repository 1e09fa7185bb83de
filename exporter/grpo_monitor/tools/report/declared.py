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
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from grpo_monitor.contract import thresholds as th
from grpo_monitor.contract.card_logic import WINDOWED, AnyOf, Level, Line, Logic, declared
from grpo_monitor.runtime.signals import RankSignals

# One input of a declared branch: (key, feature, window) as RankSignals.reading takes it (no
# window for a feature without one); READY: the baseline period is over.
Reading = tuple[str, str, int | None]
READY: Reading = ("", "ready", None)
LOGIC: dict[tuple[str, str], Logic] = declared()
# The evidence's names of the features: a window statistic is named for its window.
_NAMES = {"p10": "window_p10", "p90": "window_p90", "mean": "window_mean", "slope": "slope_per_step",
          "rising": "rising_windows"}
_OPS: dict[str, Callable[[Any, Any], Any]] = {">": operator.gt, "<": operator.lt,
                                              ">=": operator.ge, "<=": operator.le}


def levels(logic: Logic) -> tuple[Level, ...]:
    return logic.levels if isinstance(logic, AnyOf) else (logic,)


def _reading(level: Level, key: str, feature: str) -> Reading:
    return (key, feature, level.window if feature in WINDOWED else None)


def inputs(logic: Logic) -> list[Reading]:
    """What a branch compares: each feature its lines and gates read of each of its keys, and
    the baseline gate."""
    out = [_reading(lv, key, f) for lv in levels(logic) for key in lv.keys for f in lv.features]
    if logic.baseline:
        out.append(READY)
    return out


READINGS: tuple[Reading, ...] = tuple(dict.fromkeys(r for lg in LOGIC.values() for r in inputs(lg)))
COLUMN: dict[Reading, int] = {r: i for i, r in enumerate(READINGS)}


def take(signals: RankSignals) -> array:
    """Every declared branch's inputs as the rank's features stand now, in READINGS' order (NaN:
    not published). An array of doubles: a 20,000-step run keeps 20,000 of them."""
    out = array("d", [math.nan]) * len(READINGS)
    for i, reading in enumerate(READINGS):
        if reading == READY:
            value: float | None = 1.0 if signals.ready else None
        else:
            key, feature, window = reading
            value = signals.reading(key, feature, window or 0)
        if value is not None:
            out[i] = value
    return out


def table(steps: list[int], taken: dict[int, array]) -> np.ndarray:
    """The readings of ``steps`` as a matrix, a row a step, a column a reading (READINGS)."""
    missing = array("d", [math.nan]) * len(READINGS)
    return np.array([taken.get(s, missing) for s in steps], dtype=float).reshape(len(steps), len(READINGS))


def judge(steps: list[int], readings: np.ndarray, card: str,
          reason: str = "") -> dict[str, dict[str, Any] | None]:
    """Where the declared branch (card, reason) fired on rank 0's logged ``steps``, for each
    key it judges (a key of an AnyOf's levels, or each of a level's keys): its first and last
    step, how many steps, each feature it compared and each line at the first one, and the
    window; None for a key where it never fired. ``readings``: ``table`` of the steps."""
    logic = LOGIC[card, reason]
    ready = readings[:, COLUMN[READY]] == 1 if logic.baseline else None
    return {key: _judge(steps, readings, lv, key, ready) for lv in levels(logic) for key in lv.keys}


def _judge(steps: list[int], readings: np.ndarray, level: Level, key: str,
           ready: np.ndarray | None) -> dict[str, Any] | None:
    if not steps:
        return None
    read = {f: readings[:, COLUMN[_reading(level, key, f)]] for f in level.features}

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
    if ready is not None:
        firing &= ready
    idx = np.flatnonzero(firing)
    if not idx.size:
        return None
    i = int(idx[0])
    found: dict[str, Any] = {"steps": [steps[i], steps[int(idx[-1])]], "steps_flagged": int(idx.size)}
    found.update({_NAMES.get(k, k): float(v[i]) for k, v in {**read, **lines}.items()
                  if math.isfinite(v[i])})
    if level.window:
        found["window_steps"] = level.window
    return found

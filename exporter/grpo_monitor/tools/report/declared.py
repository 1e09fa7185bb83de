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
from typing import Any, NamedTuple

import numpy as np

from grpo_monitor.contract import thresholds as th
from grpo_monitor.contract import card_logic as cl
from grpo_monitor.contract.card_logic import WINDOWED, AnyOf, Level, Line, Logic, Rule, declared
from grpo_monitor.runtime.signals import PromptTypeSignals, RankSignals, is_perf

class Reading(NamedTuple):
    """One input of a declared branch, as RankSignals.reading takes it (no window or offset for
    a feature without them)."""

    key: str
    feature: str
    window: int = 0
    offset: int = 0


READY = Reading(cl.NO_KEY, "ready")  # the baseline period is over
# Steps behind the run's most advanced rank (card_logic.Lag): the rule engine's, across ranks;
# the report reads it from every rank's last step once the run is read (verdicts.rank_stalled).
LAG = Reading(cl.NO_KEY, "lag")
LOGIC: dict[tuple[str, str], Logic] = declared()
# The evidence's names of the features: a window statistic is named for its window.
_NAMES = {"p10": "window_p10", "p90": "window_p90", "mean": "window_mean", "slope": "slope_per_step",
          "rising": "rising_windows", "nonfinite": "nonfinite_values", "nonfinite_since": "since_step"}
_OPS: dict[str, Callable[[Any, Any], Any]] = {">": operator.gt, "<": operator.lt,
                                              ">=": operator.ge, "<=": operator.le}


def levels(logic: Logic) -> tuple[Level, ...]:
    """The levels of a declaration (none for an expression)."""
    return () if isinstance(logic, Rule) else logic.levels if isinstance(logic, AnyOf) else (logic,)


def _reading(level: Level, key: str, feature: str) -> Reading:
    return Reading(key, feature, level.window if feature in WINDOWED else 0)


def _series(node: cl.Series, key: str) -> Reading:
    return Reading(key, node.feature, node.window, node.offset)


def _across(node: cl.Agg) -> Reading:
    """The reading of an aggregation across the run's ranks (card_logic.ACROSS_RANKS) of a
    series of one key: its feature named for both, e.g. "run_median:mean"."""
    assert isinstance(node.arg, cl.Series)
    (key,) = node.arg.reads
    return Reading(key, f"{node.name}:{node.arg.feature}", node.arg.window, node.arg.offset)


def is_across(r: Reading) -> bool:
    """A reading across the run's ranks: no rank's signals have it; the report fills it in."""
    return r == LAG or ":" in r.feature


def inputs(logic: Logic) -> list[Reading]:
    """What a branch compares: each feature its lines and gates (or its expression's series)
    read of each of its keys, and the baseline gate."""
    if isinstance(logic, Rule):
        nodes = [*logic.expr.walk(), *logic.evidence]
        out = [_series(n, key) for n in nodes if isinstance(n, cl.Series) for key in n.reads]
        if logic.baseline or any(isinstance(n, cl.Ready) for n in nodes):
            out.append(READY)
        if any(isinstance(n, cl.Lag) for n in nodes):
            out.append(LAG)
        out += [_across(n) for n in nodes if isinstance(n, cl.Agg) and n.name in cl.ACROSS_RANKS]
        return out
    out = [_reading(lv, key, f) for lv in levels(logic) for key in lv.keys for f in lv.features]
    if logic.baseline:
        out.append(READY)
    return out


def _perf(logic: Logic) -> bool:
    """A branch of the performance signals alone: judged on every rank, not on rank 0's steps."""
    return bool(logic.keys) and all(is_perf(k) for k in logic.keys)


# Rank 0's readings at its logged steps, of every branch but the performance ones; those read
# every rank's performance features at that rank's steps (PERF_READINGS).
READINGS: tuple[Reading, ...] = tuple(dict.fromkeys(
    r for lg in LOGIC.values() if not _perf(lg) for r in inputs(lg)
    if r.feature not in cl.TYPED and r.key != cl.ANY_KEY))
COLUMN: dict[Reading, int] = {r: i for i, r in enumerate(READINGS)}
# Each prompt type's readings (of rank 0's record's by_type), at rank 0's logged steps.
TYPE_READINGS: tuple[Reading, ...] = tuple(dict.fromkeys(
    r for lg in LOGIC.values() for r in inputs(lg) if r.feature in cl.TYPED))
TYPE_COLUMN: dict[Reading, int] = {r: i for i, r in enumerate(TYPE_READINGS)}
# A prompt type's table: the type's name -> its readings at each step, a row a step.
TypeTables = dict[str, np.ndarray]
PERF_READINGS: tuple[Reading, ...] = tuple(dict.fromkeys(
    r for lg in LOGIC.values() if _perf(lg) for r in inputs(lg)))
PERF_COLUMN: dict[Reading, int] = {r: i for i, r in enumerate(PERF_READINGS)}
# The readings of any key (card_logic.ANY_KEY: the NaN / Inf counts), each key that has one a
# table as a prompt type has: the key -> its readings at rank 0's steps.
ANY_READINGS: tuple[Reading, ...] = tuple(dict.fromkeys(
    r for lg in LOGIC.values() for r in inputs(lg) if r.key == cl.ANY_KEY))
ANY_COLUMN: dict[Reading, int] = {r: i for i, r in enumerate(ANY_READINGS)}


def take(signals: RankSignals, readings: tuple[Reading, ...] = READINGS) -> array:
    """The ``readings`` (READINGS or PERF_READINGS) as the rank's features stand now, in their
    order (NaN: not published). An array of doubles: a 20,000-step run keeps 20,000 of them."""
    out = array("d", [math.nan]) * len(readings)
    memo: dict[tuple[str, str], Any] = {}
    logged = signals.keys
    for i, reading in enumerate(readings):
        if reading == READY:
            value: float | None = 1.0 if signals.ready else None
        elif reading.key not in logged or is_across(reading):  # most declared keys: a run logs a
            continue  # few dozen; the report fills in the readings across ranks
        else:
            value = signals.reading(*reading, memo=memo)
        if value is not None:
            out[i] = value
    return out


def take_types(types: dict[str, PromptTypeSignals]) -> dict[str, array]:
    """TYPE_READINGS of each prompt type the rank follows, as they stand now."""
    out = {}
    for ptype, history in types.items():
        values = array("d", [math.nan]) * len(TYPE_READINGS)
        for i, r in enumerate(TYPE_READINGS):
            if (v := history.reading(r.key, r.feature.removeprefix("type_"), r.window, r.offset)) is not None:
                values[i] = v
        out[ptype] = values
    return out


def take_any(signals: RankSignals) -> dict[str, array]:
    """ANY_READINGS of each key the rank logs that has one now (most have none)."""
    out = {}
    memo: dict[tuple[str, str], Any] = {}
    for key in signals.keys:
        values = None
        for i, r in enumerate(ANY_READINGS):
            if (v := signals.reading(key, r.feature, r.window, r.offset, memo)) is not None:
                if values is None:
                    values = array("d", [math.nan]) * len(ANY_READINGS)
                values[i] = v
        if values is not None:
            out[key] = values
    return out


def across_ranks(last: dict[int, array], readings: tuple[Reading, ...] = PERF_READINGS) -> dict[int, array]:
    """Each rank's ``readings`` at its last step, with the aggregations across the ranks
    (card_logic.ACROSS_RANKS) filled in from them all: what the rule engine computes over every
    rank's series once all are in (the median rank's value, how many ranks have one)."""
    column = {r: i for i, r in enumerate(readings)}
    out = {rank: array("d", row) for rank, row in last.items()}
    for r in readings:
        if ":" not in r.feature:  # a rank's own (or the lag, which needs the ranks' steps)
            continue
        name, feature = r.feature.split(":")
        of = column[r._replace(feature=feature)]
        values = [row[of] for row in last.values() if not math.isnan(row[of])]
        agg = math.nan if not values else float(np.median(values)) if name == "run_median" else float(len(values))
        for row in out.values():
            row[column[r]] = agg
    return out


def type_tables(steps: list[int], taken: dict[int, dict[str, array]],
                readings: tuple[Reading, ...] = TYPE_READINGS) -> TypeTables:
    """Each prompt type's (or key's, of ANY_READINGS) readings of ``steps`` as a matrix (NaN
    where it has none)."""
    return {name: table(steps, {s: by[name] for s, by in taken.items() if name in by}, readings)
            for name in sorted({t for by in taken.values() for t in by})}


def table(steps: list[int], taken: dict[int, array],
          readings: tuple[Reading, ...] = READINGS) -> np.ndarray:
    """The readings of ``steps`` as a matrix, a row a step, a column a reading."""
    missing = array("d", [math.nan]) * len(readings)
    return np.array([taken.get(s, missing) for s in steps], dtype=float).reshape(len(steps), len(readings))


def judge(steps: list[int], readings: np.ndarray, card: str, reason: str = "",
          types: TypeTables | None = None, anys: TypeTables | None = None
          ) -> dict[str, dict[str, Any] | None]:
    """Where the declared branch (card, reason) fired on rank 0's logged ``steps``, for each
    key it judges (a key of an AnyOf's levels, or each of a level's keys): its first and last
    step, how many steps, each feature it compared and each line at the first one, and the
    window; None for a key where it never fired. ``readings``: ``table`` of the steps;
    ``types``: ``type_tables`` of the steps, for a branch that compares prompt types; ``anys``:
    ``type_tables`` of the steps' ANY_READINGS, for a branch that reads any key."""
    logic = LOGIC[card, reason]
    if isinstance(logic, Rule):
        column = PERF_COLUMN if _perf(logic) else COLUMN
        return {cl.NO_KEY: _judge_rule(steps, readings, logic, column, types or {}, anys or {})}
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


# -- expressions (card_logic.Rule): the tree evaluated on the readings, one array a key ---------

Vec = dict[str, np.ndarray]  # key (card_logic.NO_KEY: none) -> value at each step, NaN: no sample


def _present(v: Vec, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    for a in v.values():
        out |= ~np.isnan(a)
    return out


def _one(v: Vec, n: int) -> np.ndarray:
    """The one sample a (run, rank) of a side matched on the rank (card_logic checks it has
    one key): its values."""
    if not v:
        return np.full(n, math.nan)
    (a,) = v.values() if len(v) == 1 else (np.fmax.reduce(list(v.values())),)
    return a


def _evaluate(node: cl.Expr, column: Callable[[Reading], np.ndarray | dict[str, np.ndarray]], n: int,
              held: np.ndarray, named: dict[str, Vec | float]) -> Vec | float:
    """``node`` on every step at once, as the rule engine evaluates it at each: a vector is
    each key's values (NaN: no sample), or each prompt type's for a vector by prompt type;
    ``held``: the branch's firing at the step before; ``named``: filled with each named
    sub-expression's value."""
    if isinstance(node, cl.Series) and (node.typed or node.key == cl.ANY_KEY):
        (key,) = node.reads
        typed = column(_series(node, key))
        assert isinstance(typed, dict)
        return dict(typed)
    if isinstance(node, cl.Series):
        if node.keys == (cl.NO_KEY,):
            return {cl.NO_KEY: column(_series(node, node.reads[0]))}
        return {k: column(_series(node, k)) for k in node.keys}
    if isinstance(node, cl.Named):
        out = _evaluate(node.arg, column, n, held, named)
        named[node.name] = out
        return out
    if isinstance(node, cl.Threshold):
        return float(th.value(node.name))
    if isinstance(node, cl.Const):
        return float(node.value)
    if isinstance(node, cl.Held):
        return {cl.NO_KEY: np.where(held, 1.0, math.nan)}
    if isinstance(node, cl.Lag):
        return {cl.NO_KEY: column(LAG)}
    if isinstance(node, cl.Ready):
        return {cl.NO_KEY: np.where(column(READY) == 1, 1.0, math.nan)}
    if isinstance(node, cl.Logged):
        return {cl.NO_KEY: np.arange(1, n + 1, dtype=float)}
    if isinstance(node, cl.Func):
        arg = _evaluate(node.arg, column, n, held, named)
        f = {"abs": np.abs, "exp": np.exp, "sqrt": np.sqrt}[node.name]
        with np.errstate(over="ignore"):
            return float(f(arg)) if isinstance(arg, float) else {k: f(a) for k, a in arg.items()}
    if isinstance(node, cl.Agg) and node.name in cl.ACROSS_RANKS:
        return {cl.NO_KEY: column(_across(node))}
    if isinstance(node, cl.Agg):
        arg = _evaluate(node.arg, column, n, held, named)
        assert isinstance(arg, dict)
        if node.keep_key or (node.name == "max" and node.arg.typed):  # the types stay apart
            return arg
        if node.name == "count":
            counted = np.sum([~np.isnan(a) for a in arg.values()], axis=0) if arg else np.zeros(n)
            return {cl.NO_KEY: np.where(counted > 0, counted, math.nan)}
        return {cl.NO_KEY: _one(arg, n)}
    left = _evaluate(node.left, column, n, held, named)  # type: ignore[attr-defined]
    right = _evaluate(node.right, column, n, held, named)  # type: ignore[attr-defined]
    if isinstance(node, cl.SetOp):
        assert isinstance(left, dict) and isinstance(right, dict)
        return _set(node, left, right, n)
    assert isinstance(node, cl.Arith)
    f = _ARITH[node.op]
    if isinstance(left, float) and isinstance(right, float):
        return float(f(left, right))
    if isinstance(left, float):
        assert isinstance(right, dict)
        pairs = [(k, np.full(n, left), a) for k, a in right.items()]
    elif isinstance(right, float):
        pairs = [(k, a, right) for k, a in left.items()]
    elif cl.by_label(node.left, node.right):
        pairs = [(k, a, right[k]) for k, a in left.items() if k in right]
    else:
        r = _one(right, n)
        pairs = [(k, a, r) for k, a in left.items()]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if isinstance(node, cl.Cmp):
            return {k: np.where(f(a, b), a, math.nan) for k, a, b in pairs}
        return {k: f(a, b) for k, a, b in pairs}


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "==": operator.eq,
    **_OPS}


def _set(node: cl.SetOp, left: Vec, right: Vec, n: int) -> Vec:
    nan = np.full(n, math.nan)
    if cl.by_label(node.left, node.right, node.op):
        if node.op == "or":
            out = {k: np.where(np.isnan(a), right.get(k, nan), a) for k, a in left.items()}
            return {**{k: a for k, a in right.items() if k not in left}, **out}
        keep = (lambda k: ~np.isnan(right.get(k, nan))) if node.op == "and" else \
            (lambda k: np.isnan(right.get(k, nan)))
        return {k: np.where(keep(k), a, math.nan) for k, a in left.items()}
    if node.op == "or":
        taken = _present(left, n)
        out = dict(left)
        for k, a in right.items():
            masked = np.where(taken, math.nan, a)
            out[k] = np.where(np.isnan(out[k]), masked, out[k]) if k in out else masked
        return out
    there = _present(right, n)
    keep_where = there if node.op == "and" else ~there
    return {k: np.where(keep_where, a, math.nan) for k, a in left.items()}


def _judge_rule(steps: list[int], readings: np.ndarray, rule: Rule, columns: dict[Reading, int],
                types: TypeTables, anys: TypeTables) -> dict[str, Any] | None:
    """Where an expression fired: as ``_judge``, with each series it reads at the first step
    (named by feature and window, and by key where it reads several keys) and the value the
    rule's sample carried there (``value``)."""
    n = len(steps)
    if not n:
        return None

    def column(r: Reading) -> np.ndarray | dict[str, np.ndarray]:
        if r.feature in cl.TYPED:
            return {ptype: t[:, TYPE_COLUMN[r]] for ptype, t in types.items()}
        if r.key == cl.ANY_KEY:
            return {key: t[:, ANY_COLUMN[r]] for key, t in anys.items()}
        return readings[:, columns[r]]

    named: dict[str, Vec | float] = {}

    def fired(held: np.ndarray) -> tuple[np.ndarray, np.ndarray, Vec]:
        out = _evaluate(rule.expr, column, n, held, named)
        assert isinstance(out, dict)
        present = _present(out, n)
        if rule.baseline:
            present &= column(READY) == 1
        return present, _one(out, n), out

    # The first step a branch fires at, it is not held (it was not firing the step before).
    free, value, out = fired(np.zeros(n, dtype=bool))
    if rule.held:  # a hold reads the branch's firing at the evaluation before
        kept, v1, _ = fired(np.ones(n, dtype=bool))
        firing = np.zeros(n, dtype=bool)
        for i in range(n):
            firing[i] = kept[i] if i and firing[i - 1] else free[i]
        value = np.where(firing & ~free, v1, value)
    else:
        firing = free
    idx = np.flatnonzero(firing)
    if not idx.size:
        return None
    i = int(idx[0])
    found: dict[str, Any] = {"steps": [steps[i], steps[int(idx[-1])]], "steps_flagged": int(idx.size)}
    if math.isfinite(value[i]):
        found["value"] = float(value[i])
    if rule.expr.typed:  # the prompt types it fired for (its alerts' prompt_type labels)
        found["prompt_types"] = sorted(t for t, a in out.items() if not math.isnan(a[i]))
    for name, v in named.items():  # as evaluated last: held, where the rule holds
        _evidence(found, name, v if isinstance(v, float) else _at(v, i))
    several = len(rule.keys) > 1
    for node in [*rule.expr.walk(), *rule.evidence]:
        if isinstance(node, cl.Series) and node.key == cl.ANY_KEY:
            # each key that had one where the branch fired, as it was the first such step: a
            # key that went bad after the first is named too, as the live description names it
            by_key = {}
            for key, a in column(_series(node, cl.ANY_KEY)).items():  # type: ignore[union-attr]
                at = idx[~np.isnan(a[idx])]
                if at.size:
                    by_key[key] = float(a[at[0]])
            _evidence(found, _evidence_name(node, cl.ANY_KEY, False), by_key)
        elif isinstance(node, cl.Series):
            for key in node.reads:
                v = column(_series(node, key))
                _evidence(found, _evidence_name(node, key, several),
                          float(v[i]) if isinstance(v, np.ndarray) else _at(v, i))
    return found


def _at(v: Vec, i: int) -> float | dict[str, float]:
    """A vector's value at step ``i``: its one key's, or each prompt type's (or key's)."""
    if len(v) == 1:
        (a,) = v.values()
        return float(a[i])
    return {k: float(a[i]) for k, a in sorted(v.items()) if math.isfinite(a[i])}


def _evidence(found: dict[str, Any], name: str, value: float | dict[str, float]) -> None:
    if isinstance(value, dict):
        if value:
            found[name] = value
    elif math.isfinite(value):
        found[name] = value


def _evidence_name(node: cl.Series, key: str, several: bool) -> str:
    name = _NAMES.get(node.feature, node.feature)
    if node.window and node.feature not in ("slope",):
        name += f"_{node.window}"
    if node.offset:
        name += f"_back_{node.offset}"
    return f"{key}:{name}" if several and node.keys != (cl.NO_KEY,) else name

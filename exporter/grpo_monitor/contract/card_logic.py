"""A card branch's logic, declared once: the live rule's PromQL is rendered from it, and the
report evaluates the same declaration on the features the exporter's own code computes.

Two kinds. The *level*: a signal's features against lines. A feature is one the
exporter publishes for the signal: a window statistic ("p10": over the line in 90% of the
window, one-step spikes do not count; "p90": under it in 90%; the mean; the least-squares
slope), its floor, its count of rising windows, its trend's Z, its initial or baseline mean. A
line is a threshold of the thresholds table, that threshold times a reference feature, the
reference alone, or a constant. Any line crossed fires the branch while every gate holds, after
the baseline period where the level waits for it; a level may judge several signals alike, and
``AnyOf`` fires where any of its levels does. The *expression* (``Rule``): a tree of published
features, thresholds, arithmetic, comparisons and set operations, with a hold on the card's own
firing (``Held``), for what a level cannot say. The declaration sits in the card's entry of
``contract/cards.py`` (``Branch.logic``); ``make docs`` writes each declared branch's expression
into ``prometheus/rules/grpo-alerts.yml`` (the rest of the rule, its labels and its annotations,
stays written there), and a test fails when the two differ. The report
(``tools/report/declared.py``) evaluates the declaration on the features the exporter computes
(``runtime/signals.RankSignals.reading``), taken at each logged step as the run is read, and
says it in words (``words``) where it names a card's line.

Standard library only: the trainer side may import it (through cards.py).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grpo_monitor.contract import thresholds

Feature = Literal["p10", "p90", "mean", "slope", "floor", "rising", "trend_z", "initial", "baseline"]
Op = Literal[">", "<", ">=", "<="]
Reference = Literal["initial", "baseline", "floor"]

# The exporter's series each feature of a key is published as; the window statistics carry the
# level's window (a mean its offset 0 too).
FEATURE_SERIES: dict[Feature, str] = {
    "p10": "grpo_window_p10", "p90": "grpo_window_p90", "mean": "grpo_window_mean",
    "slope": "grpo_window_slope", "floor": "grpo_run_window_mean_min",
    "rising": "grpo_rising_windows", "trend_z": "grpo_trend_z", "initial": "grpo_initial_mean",
    "baseline": "grpo_baseline_mean"}
WINDOWED: frozenset[Feature] = frozenset({"p10", "p90", "mean", "slope"})
BASELINE_READY = "run_rank:grpo_baseline_ready:training"
# A feature in a person's words (Level.words, Series.words).
FEATURE_WORDS: dict[str, str] = {"rising": "rising windows", "trend_z": "trend Z",
                                 "baseline_ratio": "mean over its baseline"}


@dataclass(frozen=True)
class Line:
    """One comparison of a level: its ``feature`` ``op`` the line, where the line is the
    threshold ``threshold`` times ``reference`` (either may be left out, not both), or the
    ``constant``."""

    feature: Feature
    op: Op
    threshold: str | None = None
    constant: float | None = None
    reference: Reference | None = None

    def __post_init__(self) -> None:
        if self.constant is not None and (self.threshold is not None or self.reference is not None):
            raise ValueError("a line is a constant, or a threshold and / or a reference")
        if self.constant is None and self.threshold is None and self.reference is None:
            raise ValueError("a line needs a threshold, a reference or a constant")


def above(threshold: str, reference: Reference | None = None) -> Line:
    """Over the line in 90% of the window: its 10th percentile above it."""
    return Line("p10", ">", threshold, reference=reference)


def below(threshold: str, reference: Reference | None = None) -> Line:
    """Under the line in 90% of the window: its 90th percentile below it."""
    return Line("p90", "<", threshold, reference=reference)


def mean_above(threshold: str) -> Line:
    """The window's mean above the threshold."""
    return Line("mean", ">", threshold)


@dataclass(frozen=True)
class Level:
    """A signal's features against lines: the branch fires where any of ``lines`` is crossed
    while every one of ``gates`` holds (and, with ``baseline``, once the baseline period is
    over: the rule reads run_rank:grpo_baseline_ready:training).

    ``key``: the canonical key, or several judged alike (each on its own features: the rule
    selects them by a regular expression and matches on the key); ``window``: the window in
    steps of its window statistics (a published window: runtime/signals.TRAINING_PERCENTILES,
    TRAINING_MEANS, SLOPE_WINDOWS; 0 where it reads none).
    """

    key: str | tuple[str, ...]
    window: int
    lines: tuple[Line, ...]
    gates: tuple[Line, ...] = ()
    baseline: bool = False

    def __post_init__(self) -> None:
        if not self.lines:
            raise ValueError(f"a level of {self.key} needs a line")
        if self.window <= 0 and WINDOWED & set(self.features):
            raise ValueError(f"a level of {self.key} that reads a window statistic needs its window")

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key,) if isinstance(self.key, str) else self.key

    def selector(self, feature: Feature) -> str:
        """The series of one feature of the key(s), as the rule selects it."""
        keys = self.keys
        key = f'key="{keys[0]}"' if len(keys) == 1 else f'key=~"{"|".join(map(re.escape, keys))}"'
        if feature not in WINDOWED:
            return f"{FEATURE_SERIES[feature]}{{{key}}}"
        offset = ',offset_steps="0"' if feature == "mean" else ""
        return f'{FEATURE_SERIES[feature]}{{{key},window_steps="{self.window}"{offset}}}'

    def comparison(self, ln: Line) -> str:
        """One line as PromQL: the feature's samples that cross it."""
        left = self.selector(ln.feature)
        if ln.constant is not None:
            return f"{left} {ln.op} {_number(ln.constant)}"
        if ln.reference is None:
            return f"{left}\n  {ln.op} on() group_left() grpo:threshold:{ln.threshold}"
        ref = self.selector(ln.reference)
        line = ref if ln.threshold is None else \
            f"({ref} * on() group_left() grpo:threshold:{ln.threshold})"
        return f"{left}\n  {ln.op} on(run, rank, key) group_left()\n{line}"

    def words(self) -> str:
        """The branch in words with the table's numbers, e.g. "50-step p10 > 2x initial and p10
        > 0.001 and slope > 0"."""
        def term(ln: Line) -> str:
            if ln.constant is not None:
                line = _number(ln.constant)
            else:
                number = "" if ln.threshold is None else _number(thresholds.value(ln.threshold))
                line = (number if ln.reference is None else
                        f"{number}x {ln.reference}" if number else ln.reference)
            return f"{FEATURE_WORDS.get(ln.feature, ln.feature)} {ln.op} {line}"

        window = f"{self.window}-step " if self.window else ""
        text = window + " or ".join(term(ln) for ln in self.lines)
        text += "".join(f" and {term(g)}" for g in self.gates)
        return text + (" (after the baseline)" if self.baseline else "")

    @property
    def features(self) -> tuple[Feature, ...]:
        """Every feature of the key the branch reads."""
        return tuple(dict.fromkeys(f for ln in (*self.lines, *self.gates)
                                   for f in (ln.feature, ln.reference) if f is not None))

    def promql(self, keep_key: bool | None = None) -> str:
        """The rule's expression: one sample a (run, rank) while the branch fires (a (run, rank,
        key) of several keys), valued at the feature that crossed its line. ``keep_key``: keep
        the key label or not, whatever the lines read."""
        lines = "\n  or\n".join(_indent(self.comparison(ln), 2) for ln in self.lines)
        if self.gates and len(self.lines) > 1:
            lines = f"  (\n{_indent(lines, 2)}\n  )"
        gates = "".join(f"\n  and on(run, rank, key)\n  (\n{_indent(self.comparison(g), 4)}\n  )"
                        for g in self.gates)
        # The key stays a label where a line is the signal's own reference (the description
        # reads the reference by it), or where several keys are judged.
        if keep_key is None:
            keep_key = len(self.keys) > 1 or any(ln.reference for ln in (*self.lines, *self.gates))
        dropped = ["window_steps"] if keep_key else ["key", "window_steps"]
        # The labels the lines' own series carry beyond those (the gates' are not kept).
        if any(ln.feature == "mean" for ln in self.lines):
            dropped.append("offset_steps")
        if any(ln.feature == "trend_z" for ln in self.lines) and not keep_key:
            dropped.append("records")
        expr = f"max without ({', '.join(dropped)}) (\n{lines}{gates}\n)"
        if self.baseline:
            expr += f"\nand on(run, rank) {BASELINE_READY}"
        return expr + "\n"


@dataclass(frozen=True)
class AnyOf:
    """Levels of different signals, any one of which fires the branch (each judged without the
    baseline: ``baseline`` gates them all)."""

    levels: tuple[Level, ...]
    baseline: bool = False

    def __post_init__(self) -> None:
        if any(lv.baseline for lv in self.levels):
            raise ValueError("the levels of an AnyOf wait for the baseline through it")

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(k for lv in self.levels for k in lv.keys))

    def words(self) -> str:
        text = " or ".join(f"{'/'.join(lv.keys)} {lv.words()}" for lv in self.levels)
        return text + (" (after the baseline)" if self.baseline else "")

    def promql(self) -> str:
        """The levels' expressions, or'ed: one sample a (run, rank), the first level's where
        several fire."""
        inner = "\n  or\n".join(_indent(lv.promql(keep_key=False).rstrip("\n"), 2)
                                for lv in self.levels)
        expr = f"(\n{inner}\n)"
        if self.baseline:
            expr += f"\nand on(run, rank) {BASELINE_READY}"
        return expr + "\n"


# -- expressions: what a level cannot say ------------------------------------------------------
#
# A branch that compares two signals, a derived quantity (a ratio, a difference, exp), counts
# signals, holds on its own firing (the card's ALERTS) or reads a run-level count is declared as
# an expression tree of these nodes. Each node renders itself as PromQL (``render``) and the
# report evaluates the same tree (tools/report/declared.py); the matching of two vectors is
# decided once here, from the keys each side carries (``keys``), and both evaluators follow it:
# the same keys on both sides match on (run, rank, key) (and the prompt type where both are a
# prompt type's), an or of two keyed sides is their union, otherwise on (run, rank) with the
# right side one sample a rank, or on (run) where a side is a run's.

# The features an expression reads beyond a level's: the baseline's stddev, a window's mean over
# the baseline mean (one series where the rule would otherwise join two, on every rank), the
# working level's highest (grpo_run_window_mean_max), the median of the first records, the record windows' min /
# max / median (``window``: records, ``offset``: offset_records), the trend's factor, the least
# growth of the window's mean over the one before, of the published back-to-back windows.
EXPR_SERIES: dict[str, str] = {
    **FEATURE_SERIES, "stddev": "grpo_baseline_stddev", "baseline_ratio": "grpo_window_baseline_ratio",
    "ceiling": "grpo_run_window_mean_max",
    "first_median": "grpo_first_records_median", "records_min": "grpo_records_min",
    "records_max": "grpo_records_max", "records_median": "grpo_records_median",
    "trend_factor": "grpo_trend_factor", "least_growth": "grpo_window_growth_ratio",
    "type_mean": "grpo_prompt_type_window_mean", "type_initial": "grpo_prompt_type_initial_mean"}
RECORDED: frozenset[str] = frozenset({"records_min", "records_max", "records_median"})
# Features of each prompt type of a record's by_type (a prompt_type label): its window mean and
# its initial mean, as the shortcut card compares them.
TYPED: frozenset[str] = frozenset({"type_mean", "type_initial"})
# Features of the rank, not of a key (no key label): the held-out score's judgement (of
# eval/heldout_score) and the entropy-reward law's fit (of reward/mean and entropy/mean). A
# Series of one names the key it is read from.
RANK_SERIES: dict[str, str] = {
    "heldout_best": "grpo_heldout_best_score", "heldout_recent": "grpo_heldout_recent_score",
    "heldout_noise": "grpo_heldout_noise_score", "heldout_points": "grpo_heldout_points",
    "heldout_reward_at_best": "grpo_heldout_reward_at_best",
    "heldout_smoothed_best": "grpo_heldout_smoothed_best_score",
    "heldout_smoothed_recent": "grpo_heldout_smoothed_recent_score",
    "heldout_reward_at_smoothed_best": "grpo_heldout_reward_at_smoothed_best",
    "law_scale": "grpo_forecast_law_scale", "law_r_squared": "grpo_forecast_fit_r_squared"}
EXPR_SERIES.update(RANK_SERIES)
# Features of any key the rank logs, the trainer's unknown ones too (a Series of ANY_KEY): the
# NaN / Inf count of the last window and the step its streak began. The exporter publishes them
# only for the keys that have one, so the vector is as long as the keys that went bad.
ANY_KEY = "*"
ANY_KEY_SERIES: dict[str, str] = {
    "nonfinite": "grpo_window_nonfinite", "nonfinite_since": "grpo_window_nonfinite_since_step"}
EXPR_SERIES.update(ANY_KEY_SERIES)
# The labels each feature's series carries beyond run, rank and key (``max without`` drops them).
_EXTRA_LABELS: dict[str, tuple[str, ...]] = {
    **{f: ("window_steps",) for f in ("p10", "p90", "slope", "floor", "ceiling", "rising")},
    "mean": ("window_steps", "offset_steps"), "type_mean": ("window_steps", "offset_steps"),
    "least_growth": ("window_steps",), "nonfinite": ("window_steps",), "baseline_ratio": ("window_steps",),
    "trend_z": ("records",), "trend_factor": ("records",),
    **{f: ("records", "offset_records") for f in RECORDED}}
# The expression's features of a window (its window_steps label); least_growth renders its own.
_WINDOWED_EXPR: frozenset[str] = frozenset({"type_mean", "baseline_ratio"})
NO_KEY = ""  # the key of a vector without a key label


class Expr:
    """A node of a branch's expression: a vector (samples of (run, rank), of (run, rank, key)
    where it carries ``keys``, or of (run) where ``run_level``) or, where ``scalar``, a number
    the thresholds table or a constant gives. Built with Python's operators: ``+ - * /`` are
    arithmetic, ``> < >= <=`` and ``eq`` filter the left side's samples, ``&``, ``|`` and
    ``unless`` are PromQL's and, or, unless."""

    scalar = False
    run_level = False
    typed = False  # a sample a prompt type (its prompt_type label)

    @property
    def keys(self) -> tuple[str, ...]:
        raise NotImplementedError

    @property
    def labels(self) -> tuple[str, ...]:
        """Labels beyond run, rank (and job / instance) the samples carry."""
        return ()

    def render(self, alert: str, reason: str) -> str:
        raise NotImplementedError

    def children(self) -> tuple[Expr, ...]:
        return ()

    def walk(self) -> list[Expr]:
        return [self, *(n for c in self.children() for n in c.walk())]

    def words(self) -> str:
        raise NotImplementedError

    def __add__(self, other: Expr | float) -> Expr:
        return Arith("+", self, _expr(other))

    def __sub__(self, other: Expr | float) -> Expr:
        return Arith("-", self, _expr(other))

    def __mul__(self, other: Expr | float) -> Expr:
        return Arith("*", self, _expr(other))

    def __truediv__(self, other: Expr | float) -> Expr:
        return Arith("/", self, _expr(other))

    def __rsub__(self, other: float) -> Expr:
        return Arith("-", Const(other), self)

    def __gt__(self, other: Expr | float) -> Expr:  # type: ignore[override]
        return Cmp(">", self, _expr(other))

    def __lt__(self, other: Expr | float) -> Expr:  # type: ignore[override]
        return Cmp("<", self, _expr(other))

    def __ge__(self, other: Expr | float) -> Expr:  # type: ignore[override]
        return Cmp(">=", self, _expr(other))

    def __le__(self, other: Expr | float) -> Expr:  # type: ignore[override]
        return Cmp("<=", self, _expr(other))

    def eq(self, other: Expr | float) -> Expr:
        return Cmp("==", self, _expr(other))

    def __and__(self, other: Expr) -> Expr:
        return SetOp("and", self, other)

    def __or__(self, other: Expr) -> Expr:
        return SetOp("or", self, other)

    def unless(self, other: Expr) -> Expr:
        return SetOp("unless", self, other)

    def named(self, name: str) -> Expr:
        """The same, its value at the first step a branch fires kept in the report's evidence
        under ``name``."""
        return Named(name, self)


def _expr(x: Expr | float) -> Expr:
    return x if isinstance(x, Expr) else Const(float(x))


def _simple(e: Expr) -> bool:
    # A Ready of any rank is a comparison, but only ever the right side of an and / unless
    # (Arith refuses it), where a comparison binds first.
    return isinstance(e, (Series, Threshold, Const, Held, Ready, Logged, Lag, Func, Agg))


def _wrap(e: Expr, alert: str, reason: str) -> str:
    """An operand: in parentheses unless a selector or a call; on one line where it fits."""
    while isinstance(e, Named):
        e = e.arg
    text = e.render(alert, reason)
    if _simple(e):
        return text
    return f"({text})" if "\n" not in text else f"(\n{_indent(text, 2)}\n)"


@dataclass(frozen=True, eq=False)
class Series(Expr):
    """A feature of one key or of several judged alike (``Level``'s features and EXPR_SERIES):
    ``window`` / ``offset`` are the steps of a window statistic (the records of a record window)."""

    feature: str
    key: str | tuple[str, ...]
    window: int = 0
    offset: int = 0

    def __post_init__(self) -> None:
        if self.feature not in EXPR_SERIES:
            raise ValueError(f"no feature {self.feature!r}")
        if (self.key == ANY_KEY) != (self.feature in ANY_KEY_SERIES):
            raise ValueError(f"{self.feature} is read of {'any key' if self.key == ANY_KEY else 'named keys'}")
        if (self.feature in WINDOWED or self.feature in RECORDED
                or self.feature in _WINDOWED_EXPR or self.feature == "least_growth") and self.window <= 0:
            raise ValueError(f"{self.feature} of {self.key} needs its window")

    @property
    def typed(self) -> bool:  # type: ignore[override]
        return self.feature in TYPED

    @property
    def reads(self) -> tuple[str, ...]:
        """The keys whose features it reads."""
        return (self.key,) if isinstance(self.key, str) else self.key

    @property
    def keys(self) -> tuple[str, ...]:
        return (NO_KEY,) if self.feature in RANK_SERIES else self.reads

    @property
    def labels(self) -> tuple[str, ...]:
        return () if self.feature in RANK_SERIES else ("key", *_EXTRA_LABELS.get(self.feature, ()))

    def render(self, alert: str = "", reason: str = "") -> str:
        if self.feature in RANK_SERIES:
            return RANK_SERIES[self.feature]
        if self.key == ANY_KEY:
            return ANY_KEY_SERIES[self.feature]
        keys = self.keys
        out = [f'key="{keys[0]}"' if len(keys) == 1 else f'key=~"{"|".join(map(re.escape, keys))}"']
        if self.feature == "least_growth":  # the least of the windows' growths, back to back
            out.append(f'window_steps="{self.window}"')
            return f"min without (offset_steps) ({EXPR_SERIES[self.feature]}{{{','.join(out)}}})"
        if self.feature in WINDOWED or self.feature in _WINDOWED_EXPR:
            out.append(f'window_steps="{self.window}"')
            if self.feature in ("mean", "type_mean"):
                out.append(f'offset_steps="{self.offset}"')
        elif self.feature in RECORDED:
            out += [f'records="{self.window}"', f'offset_records="{self.offset}"']
        return f"{EXPR_SERIES[self.feature]}{{{','.join(out)}}}"

    def words(self) -> str:
        what = FEATURE_WORDS.get(self.feature, self.feature)
        if self.feature in RECORDED:
            what = f"{what.split('_')[1]} of {self.window} records" + (
                f" {self.offset} back" if self.offset else "")
        elif self.feature in WINDOWED or self.feature in _WINDOWED_EXPR:
            what = f"{self.window}-step {what}" + (f" {self.offset} steps back" if self.offset else "")
        return f"{'any key' if self.key == ANY_KEY else '/'.join(self.reads)} {what}"


@dataclass(frozen=True, eq=False)
class Threshold(Expr):
    """A threshold of the table (grpo:threshold:NAME), read at each evaluation."""

    name: str
    scalar = True

    def __post_init__(self) -> None:
        if self.name not in thresholds.THRESHOLDS:  # fails here, not in the rule
            raise ValueError(f"no threshold {self.name!r} in the table")

    @property
    def keys(self) -> tuple[str, ...]:
        return ()

    def render(self, alert: str = "", reason: str = "") -> str:
        return f"grpo:threshold:{self.name}"

    def words(self) -> str:
        return _number(thresholds.value(self.name))


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: float
    scalar = True

    @property
    def keys(self) -> tuple[str, ...]:
        return ()

    def render(self, alert: str = "", reason: str = "") -> str:
        return _number(self.value)

    def words(self) -> str:
        return _number(self.value)


def matching(left: Expr, right: Expr, op: str = "") -> str:
    """How two vectors are matched, decided by their keys: see the section's comment. ``or``
    of two keyed sides is their union, key by key."""
    if left.run_level or right.run_level:
        return "on(run)"
    if left.typed and right.typed:
        return "on(run, rank, prompt_type, key)"
    keyed = NO_KEY not in left.keys and NO_KEY not in right.keys
    if keyed and (left.keys == right.keys or op == "or"):
        return "on(run, rank, key)"
    return "on(run, rank)"


def by_label(left: Expr, right: Expr, op: str = "") -> bool:
    """Two vectors matched label by label (the key, and the prompt type where both carry one),
    not on the rank alone."""
    return matching(left, right, op) in ("on(run, rank, key)", "on(run, rank, prompt_type, key)")


def _check_one_side(left: Expr, right: Expr) -> None:
    if not by_label(left, right) and (len(right.keys) > 1 or right.typed):
        raise ValueError(f"the right side of a match on the rank carries several samples a rank: "
                         f"{right.keys}{' by prompt type' if right.typed else ''}")


@dataclass(frozen=True, eq=False)
class Arith(Expr):
    """Arithmetic; between two vectors, matched as ``matching`` says (the left side's labels
    kept); a threshold is a scalar broadcast to every sample."""

    op: Literal["+", "-", "*", "/"]
    left: Expr
    right: Expr

    def __post_init__(self) -> None:
        if isinstance(self.left, Ready) or isinstance(self.right, Ready):
            raise ValueError("the baseline's readiness is a gate: and / unless it")
        if not (self.left.scalar or self.right.scalar):
            _check_one_side(self.left, self.right)
        if self.left.scalar and not self.right.scalar and not isinstance(self.left, Const):
            raise ValueError("a threshold on the left of a vector: write the vector first")

    @property
    def scalar(self) -> bool:  # type: ignore[override]
        return self.left.scalar and self.right.scalar

    @property
    def run_level(self) -> bool:  # type: ignore[override]
        return (self.right if self.left.scalar else self.left).run_level

    @property
    def typed(self) -> bool:  # type: ignore[override]
        return (self.right if self.left.scalar else self.left).typed

    @property
    def keys(self) -> tuple[str, ...]:
        return self.right.keys if self.left.scalar else self.left.keys

    @property
    def labels(self) -> tuple[str, ...]:
        return self.right.labels if self.left.scalar else self.left.labels

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def _join(self) -> str:
        if self.scalar or isinstance(self.right, Const) or isinstance(self.left, Const) or self._scalar_line:
            return ""
        if self.right.scalar:
            return " on() group_left()"
        return f" {matching(self.left, self.right)} group_left()"

    @property
    def _scalar_line(self) -> bool:
        """A comparison with a threshold as it stands: the threshold read as a scalar(), not
        matched as a one-series vector (a match of every rank's samples against it cost 40-60
        ms at 4,096 ranks, docs/benchmarks.md). The same samples compare true: a missing
        threshold is NaN either way."""
        return isinstance(self, Cmp) and isinstance(self.right, Threshold) and not self.left.scalar

    def render(self, alert: str = "", reason: str = "") -> str:
        left, right = _wrap(self.left, alert, reason), _wrap(self.right, alert, reason)
        if self._scalar_line:
            right = f"scalar({right})"
        if self.scalar:
            return f"{left} {self.op} {right}"  # in parentheses where it is an operand
        one_line = f"{left} {self.op}{self._join()} {right}"
        if "\n" not in one_line and len(one_line) <= 110:
            return one_line
        if "\n" not in right and len(right) <= 60:  # a short right side stays on the operator's line
            return f"{left}\n  {self.op}{self._join()} {right}"
        return f"{left}\n  {self.op}{self._join()}\n{right}"

    def words(self) -> str:
        return f"({self.left.words()} {self.op} {self.right.words()})"


@dataclass(frozen=True, eq=False)
class Cmp(Arith):
    """A comparison: the left side's samples where it holds, valued as the left side."""

    op: Literal[">", "<", ">=", "<=", "=="]  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.left.scalar:
            raise ValueError("a comparison filters its left side: a vector")
        super().__post_init__()

    def words(self) -> str:
        op = "=" if self.op == "==" else self.op
        return f"{self.left.words()} {op} {self.right.words()}"


@dataclass(frozen=True, eq=False)
class SetOp(Expr):
    """PromQL's ``and`` (the left side where the right has a sample), ``or`` (the left side,
    and the right where the left has none) and ``unless``, matched as ``matching`` says."""

    op: Literal["and", "or", "unless"]
    left: Expr
    right: Expr

    def __post_init__(self) -> None:
        if self.left.scalar or self.right.scalar:
            raise ValueError(f"{self.op} takes two vectors")
        if self.op == "or" and self.left.typed != self.right.typed:
            raise ValueError("or of a vector by prompt type and one without")

    @property
    def run_level(self) -> bool:  # type: ignore[override]
        return self.left.run_level and (self.op != "or" or self.right.run_level)

    @property
    def typed(self) -> bool:  # type: ignore[override]
        return self.left.typed

    @property
    def keys(self) -> tuple[str, ...]:
        if self.op == "or" and matching(self.left, self.right, "or") == "on(run, rank, key)":
            return tuple(dict.fromkeys((*self.left.keys, *self.right.keys)))
        return self.left.keys

    @property
    def labels(self) -> tuple[str, ...]:
        if self.op == "or":
            return tuple(dict.fromkeys((*self.left.labels, *self.right.labels)))
        return self.left.labels

    def children(self) -> tuple[Expr, ...]:
        return (self.left, self.right)

    def render(self, alert: str = "", reason: str = "") -> str:
        return (f"{_wrap(self.left, alert, reason)}\n{self.op} {matching(self.left, self.right, self.op)}\n"
                f"{_wrap(self.right, alert, reason)}")

    def words(self) -> str:
        op = {"and": "and", "or": "or", "unless": "unless"}[self.op]
        return f"({self.left.words()}) {op} ({self.right.words()})"


class _OfArg(Expr):
    """A node of one argument, ``arg``, whose shape (scalar or vector, keys, labels, level,
    prompt types) it keeps."""

    arg: Expr

    @property
    def scalar(self) -> bool:  # type: ignore[override]
        return self.arg.scalar

    @property
    def keys(self) -> tuple[str, ...]:
        return self.arg.keys

    @property
    def labels(self) -> tuple[str, ...]:
        return self.arg.labels

    @property
    def run_level(self) -> bool:  # type: ignore[override]
        return self.arg.run_level

    @property
    def typed(self) -> bool:  # type: ignore[override]
        return self.arg.typed

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)


@dataclass(frozen=True, eq=False)
class Func(_OfArg):
    """abs, exp or sqrt of each sample (or of a number)."""

    name: Literal["abs", "exp", "sqrt"]
    arg: Expr

    def render(self, alert: str = "", reason: str = "") -> str:
        inner = self.arg.render(alert, reason)
        return f"{self.name}({inner})" if "\n" not in inner else f"{self.name}(\n{_indent(inner, 2)}\n)"

    def __post_init__(self) -> None:
        if self.arg.scalar and not isinstance(self.arg, (Threshold, Const)):
            raise ValueError("a function of a number takes a threshold or a constant")

    def words(self) -> str:
        return f"{self.name}({self.arg.words()})"


@dataclass(frozen=True, eq=False)
class Agg(Expr):
    """One sample a (run, rank) of several: ``max`` (the key dropped, or kept with
    ``keep_key``: the window labels only; a prompt type's samples stay apart), ``count`` (how
    many), ``rank_max`` (the highest of every prompt type's), ``run_max`` (the run's highest,
    one sample a run); across a run's ranks, of a series (ACROSS_RANKS): ``run_median`` (the
    median rank's) and ``run_count`` (how many ranks have one)."""

    name: Literal["max", "count", "rank_max", "run_max", "run_median", "run_count"]
    arg: Expr
    keep_key: bool = False

    def __post_init__(self) -> None:
        if self.name in ACROSS_RANKS and not isinstance(self.arg, Series):
            raise ValueError(f"{self.name} takes a series")

    @property
    def keys(self) -> tuple[str, ...]:
        return self.arg.keys if self.keep_key else (NO_KEY,)

    @property
    def labels(self) -> tuple[str, ...]:
        return ("key",) if self.keep_key else ()

    @property
    def run_level(self) -> bool:  # type: ignore[override]
        return self.name == "run_max" or self.name in ACROSS_RANKS

    @property
    def typed(self) -> bool:  # type: ignore[override]
        return self.name == "max" and self.arg.typed

    def children(self) -> tuple[Expr, ...]:
        return (self.arg,)

    def render(self, alert: str = "", reason: str = "") -> str:
        inner = _indent(self.arg.render(alert, reason), 2)
        if self.name == "count":
            return f"count by (run, rank) (\n{inner}\n)"
        if self.name == "run_median":
            return f"quantile by (run) (0.5, {self.arg.render(alert, reason)})"
        if self.name == "run_count":
            return f"count by (run) ({self.arg.render(alert, reason)})"
        if self.name == "run_max":
            return f"max by (run) (\n{inner}\n)"
        if self.name == "rank_max":
            return f"max by (run, rank) (\n{inner}\n)"
        dropped = [lb for lb in self.arg.labels if not (self.keep_key and lb == "key")]
        if not dropped:
            return self.arg.render(alert, reason)
        return f"max without ({', '.join(dropped)}) (\n{inner}\n)"

    def words(self) -> str:
        if self.name in ACROSS_RANKS:
            return f"the {'median' if self.name == 'run_median' else 'count'} of the run's ranks' {self.arg.words()}"
        return self.arg.words() if self.name != "count" else f"count of ({self.arg.words()})"


# The aggregations across a run's ranks: the rule engine's (a run's ranks may be scraped from
# several exporters); the report computes them from every rank's readings at its last step.
ACROSS_RANKS: frozenset[str] = frozenset({"run_median", "run_count"})


class _Keyless(Expr):
    """A vector without a key label: one sample a rank (or a run, where ``run_level``)."""

    @property
    def keys(self) -> tuple[str, ...]:
        return (NO_KEY,)


# How far back a held card looks for its own firing: several evaluations at the stack's 15 s,
# the previous one alone at a minute.
HOLD_WINDOW = "90s"


@dataclass(frozen=True, eq=False)
class Held(_Keyless):
    """The branch's own card firing at the previous evaluation (its ALERTS series): a card that
    holds while a weaker condition lasts once raised.

    Read over the last HOLD_WINDOW, not at the instant: a scrape that fails (an exporter
    restarting, a timeout) takes every series of its target away for an evaluation, the card
    with them, and an instant read would then find no ALERTS sample to hold on to: the card
    would be gone for good, its jump long over. The window also bridges a store that makes a
    new series searchable seconds after it is written (VictoriaMetrics). Where evaluations are
    a minute apart (promtool's tests) it holds the previous evaluation alone, as the report
    reads it."""

    def render(self, alert: str = "", reason: str = "") -> str:
        return (f'max_over_time(ALERTS{{alertname="{alert}",alertstate="firing",'
                f'reason="{reason}"}}[{HOLD_WINDOW}])')

    def words(self) -> str:
        return "already raised"


@dataclass(frozen=True, eq=False)
class Ready(_Keyless):
    """The rank's baseline period is over: of a rank that logs a training signal (the training
    cards'), or of any rank (``training=False``: the performance signals every rank logs)."""

    training: bool = True

    def render(self, alert: str = "", reason: str = "") -> str:
        return BASELINE_READY if self.training else "grpo_baseline_ready == 1"

    def words(self) -> str:
        return "the baseline is ready"


@dataclass(frozen=True, eq=False)
class Logged(_Keyless):
    """The steps the run has logged (its busiest rank's count): one sample a run."""

    run_level = True

    def render(self, alert: str = "", reason: str = "") -> str:
        return "max by (run) (grpo_run_logged_steps)"

    def words(self) -> str:
        return "logged steps"


@dataclass(frozen=True, eq=False)
class Lag(_Keyless):
    """How many steps the rank is behind its run's most advanced rank: the recording rule
    run_rank:grpo_step:lag (grpo-signals.yml). It is the rule engine's to compute: a run's ranks
    may be scraped from several exporters, one a node, and only the engine sees them all."""

    def render(self, alert: str = "", reason: str = "") -> str:
        return "run_rank:grpo_step:lag"

    def words(self) -> str:
        return "steps behind the run's most advanced rank"


@dataclass(frozen=True, eq=False)
class Named(_OfArg):
    """A sub-expression whose value the report names in its evidence; the rule is the same."""

    name: str
    arg: Expr

    def render(self, alert: str = "", reason: str = "") -> str:
        return self.arg.render(alert, reason)

    def words(self) -> str:
        return self.arg.words()


@dataclass(frozen=True)
class Rule:
    """A branch declared as an expression: it fires where ``expr`` has a sample (once the
    baseline period is over, with ``baseline``). ``evidence``: series its card's description
    names beside those it compares (the step a streak began); the report keeps their values
    where the branch fired."""

    expr: Expr
    baseline: bool = False
    evidence: tuple[Series, ...] = ()

    def __post_init__(self) -> None:
        if self.expr.scalar:
            raise ValueError("a rule's expression is a vector")

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(k for n in self.expr.walk() if isinstance(n, Series)
                                   for k in n.reads if k != ANY_KEY))

    @property
    def held(self) -> bool:
        return any(isinstance(n, Held) for n in self.expr.walk())

    def words(self) -> str:
        return self.expr.words() + (" (after the baseline)" if self.baseline else "")

    def promql(self, alert: str = "", reason: str = "") -> str:
        expr = self.expr.render(alert, reason)
        if self.baseline:
            expr = f"{_wrap(self.expr, alert, reason)}\nand on(run, rank) {BASELINE_READY}"
        return expr + "\n"


Logic = Level | AnyOf | Rule


def expression(logic: Logic, alert: str, reason: str) -> str:
    """The rule expression of the branch (alert, reason) declared as ``logic``."""
    return logic.promql(alert, reason) if hasattr(logic, "expr") else logic.promql()


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


def _number(v: float) -> str:
    return f"{v:g}"


# -- the rule file: each declared branch's expression written into it ---------------------------

RULES_DIR = Path(__file__).resolve().parents[3] / "prometheus" / "rules"
TARGET = RULES_DIR / "grpo-alerts.yml"
# Every rule file that holds a declared branch's rule (a card's rule_file).
TARGETS: tuple[Path, ...] = (TARGET, RULES_DIR / "grpo-cluster.yml")
_RULE = re.compile(r"^      - alert: (\S+)\n        expr: \|\n((?:          .*\n|\n)+?)"
                   r"        labels:\n((?:          .*\n)+)", re.M)
_REASON = re.compile(r"^          reason: (\S+)$", re.M)


def declared(rule_file: str | None = None) -> dict[tuple[str, str], Logic]:
    """(card, reason) -> the branch's declared logic, for every declared branch of the catalog
    (of the cards whose rules ``rule_file`` holds)."""
    from grpo_monitor.contract.cards import CARDS  # cards.py imports this module
    return {(card.name, b.reason): b.logic for card in CARDS for b in card.branches
            if b.logic is not None and rule_file in (None, card.rule_file)}


def feature_keys(feature: str) -> frozenset[str]:
    """The keys whose ``feature`` (an EXPR_SERIES one) a declared branch's expression reads."""
    return frozenset(k for logic in declared().values() if isinstance(logic, Rule)
                     for n in logic.expr.walk() if isinstance(n, Series) and n.feature == feature
                     for k in n.reads)


def rule_exprs(text: str) -> dict[tuple[str, str], str]:
    """(alert, reason label) -> its expression, of a rule file's text."""
    out = {}
    for m in _RULE.finditer(text):
        reason = _REASON.search(m.group(3))
        out[m.group(1), reason.group(1) if reason else ""] = _dedent(m.group(2))
    return out


def _dedent(block: str) -> str:
    return "".join(line[10:] if line.strip() else "\n" for line in block.splitlines(keepends=True))


# The sentence every declared branch's description ends with (before the note for a run nothing
# pauses): the step the card was raised at, the first step its condition held in this streak,
# which the report names as the finding's first step. Prometheus keeps the time an alert became
# active in its ALERTS_FOR_STATE series (vmalert does from v1.97; before, only for rules with
# `for:`, which no card has, and the sentence falls back to the step now); the run's step at
# that time is grpo_step there (the @ modifier). At the evaluation that raises it there is no
# such sample yet, and the step now is that step. A label the alert lacks is "" (``index``), which
# matches its absence.
_STEP_NOW = ('{{ with printf "grpo_step{run=%q,rank=%q}" $labels.run $labels.rank | query }}'
             '{{ . | first | value | printf "%.0f" }}{{ end }}')
_RAISED = (' Raised at step {{{{ with printf "ALERTS_FOR_STATE{{alertname=%q,reason=%q,run=%q,rank=%q,'
           'key=%q,prompt_type=%q}}" "{alert}" "{reason}" $labels.run $labels.rank (index $labels "key") '
           '(index $labels "prompt_type") | query }}}}{{{{ with printf "grpo_step{{run=%q,rank=%q}} @ %.3f" '
           '$labels.run $labels.rank (. | first | value) | query }}}}'
           '{{{{ . | first | value | printf "%.0f" }}}}{{{{ else }}}}{now}{{{{ end }}}}'
           '{{{{ else }}}}{now}{{{{ end }}}}.')
_RAISED_ANY = re.compile(re.escape(_RAISED.format(alert="\0", reason="\1", now=_STEP_NOW))
                         .replace(re.escape("\0"), '[^"]*').replace(re.escape("\1"), '[^"]*'))
_DESCRIPTION = re.compile(r"^(          description: ')(.*)('\n)", re.M)
_NOT_PAUSED = '{{ with printf "grpo_run_info{run=%q,source!~'


def raised_sentence(alert: str, reason: str) -> str:
    """The description's sentence naming the step the branch's card was raised at."""
    return _RAISED.format(alert=alert, reason=reason, now=_STEP_NOW)


def _with_raised(description: str, alert: str, reason: str) -> str:
    text = _RAISED_ANY.sub("", description)
    at = text.find(_NOT_PAUSED)
    at = len(text) if at < 0 else at
    return text[:at] + raised_sentence(alert, reason) + text[at:]


def render(text: str, target: Path = TARGET) -> str:
    """The text of the rule file ``target`` with each declared branch's expression rendered
    afresh, and its description's raised-at sentence; a branch declared for that file without
    its rule there is an error (its labels and annotations are written there)."""
    levels = declared(target.name)
    seen: set[tuple[str, str]] = set()

    def fresh(m: re.Match[str]) -> str:
        reason = _REASON.search(m.group(3))
        branch = (m.group(1), reason.group(1) if reason else "")
        if branch not in levels:
            return m.group(0)
        seen.add(branch)
        text = expression(levels[branch], *branch)
        expr = "".join(f"          {line}\n" for line in text.splitlines())
        return f"      - alert: {branch[0]}\n        expr: |\n{expr}        labels:\n{m.group(3)}"

    out = _RULE.sub(fresh, text)
    if missing := sorted(set(levels) - seen):
        raise ValueError(f"declared branches without a rule in the file: {missing}")
    # Each rule's description, after its labels (the rules are split at each "- alert:").
    parts = re.split(r"(?m)^(?=      - (?:alert|record): )", out)
    for i, part in enumerate(parts):
        head = re.match(r"      - alert: (\S+)\n", part)
        if head is None:
            continue
        reason = _REASON.search(part)
        branch = (head.group(1), reason.group(1) if reason else "")
        if branch in levels:
            parts[i] = _DESCRIPTION.sub(lambda d: d.group(1) + _with_raised(d.group(2), *branch) + d.group(3),
                                        part, count=1)
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The declared card branches' expressions, written into the alert rule file.")
    parser.add_argument("--write", action="store_true",
                        help=f"rewrite {', '.join(t.name for t in TARGETS)} in place")
    args = parser.parse_args(argv)
    for target in TARGETS:
        text = target.read_text(encoding="utf-8")
        if not args.write:
            sys.stdout.write(render(text, target))
        elif (rendered := render(text, target)) != text:
            target.write_text(rendered, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

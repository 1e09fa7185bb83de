"""A card branch's logic, declared once: the live rule's PromQL is rendered from it, and the
report evaluates the same declaration on the features the exporter's own code computes.

The kind declared here is the *level*: a signal's features against lines. A feature is one the
exporter publishes for the signal: a window statistic ("p10": over the line in 90% of the
window, one-step spikes do not count; "p90": under it in 90%; the mean; the least-squares
slope), its floor, its count of rising windows, its trend's Z, its initial or baseline mean. A
line is a threshold of the thresholds table, that threshold times a reference feature, the
reference alone, or a constant. Any line crossed fires the branch while every gate holds, after
the baseline period where the level waits for it; a level may judge several signals alike, and
``AnyOf`` fires where any of its levels does. The declaration sits in the card's entry of
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
# A feature in a person's words (Level.words).
FEATURE_WORDS: dict[Feature, str] = {"rising": "rising windows", "trend_z": "trend Z"}


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


Logic = Level | AnyOf


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


def _number(v: float) -> str:
    return f"{v:g}"


# -- the rule file: each declared branch's expression written into it ---------------------------

TARGET = Path(__file__).resolve().parents[3] / "prometheus" / "rules" / "grpo-alerts.yml"
_RULE = re.compile(r"^      - alert: (\S+)\n        expr: \|\n((?:          .*\n|\n)+?)"
                   r"        labels:\n((?:          .*\n)+)", re.M)
_REASON = re.compile(r"^          reason: (\S+)$", re.M)


def declared() -> dict[tuple[str, str], Logic]:
    """(card, reason) -> the branch's declared logic, for every declared branch of the catalog."""
    from grpo_monitor.contract.cards import CARDS  # cards.py imports this module
    return {(card.name, b.reason): b.logic for card in CARDS for b in card.branches
            if b.logic is not None}


def rule_exprs(text: str) -> dict[tuple[str, str], str]:
    """(alert, reason label) -> its expression, of a rule file's text."""
    out = {}
    for m in _RULE.finditer(text):
        reason = _REASON.search(m.group(3))
        out[m.group(1), reason.group(1) if reason else ""] = _dedent(m.group(2))
    return out


def _dedent(block: str) -> str:
    return "".join(line[10:] if line.strip() else "\n" for line in block.splitlines(keepends=True))


def render(text: str) -> str:
    """The rule file's text with each declared branch's expression rendered afresh; a declared
    branch without its rule in the file is an error (its labels and annotations are written
    there)."""
    levels = declared()
    seen: set[tuple[str, str]] = set()

    def fresh(m: re.Match[str]) -> str:
        reason = _REASON.search(m.group(3))
        branch = (m.group(1), reason.group(1) if reason else "")
        if branch not in levels:
            return m.group(0)
        seen.add(branch)
        expr = "".join(f"          {line}\n" for line in levels[branch].promql().splitlines())
        return f"      - alert: {branch[0]}\n        expr: |\n{expr}        labels:\n{m.group(3)}"

    out = _RULE.sub(fresh, text)
    if missing := sorted(set(levels) - seen):
        raise ValueError(f"declared branches without a rule in the file: {missing}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The declared card branches' expressions, written into the alert rule file.")
    parser.add_argument("--write", action="store_true",
                        help=f"rewrite {TARGET.parent.name}/{TARGET.name} in place")
    args = parser.parse_args(argv)
    text = TARGET.read_text(encoding="utf-8")
    if not args.write:
        sys.stdout.write(render(text))
    elif (rendered := render(text)) != text:
        TARGET.write_text(rendered, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

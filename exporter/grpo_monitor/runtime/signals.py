"""Step-window features of each rank's signals: baselines, windows, rising streaks.

The cards are stated in steps (docs/background.md: "the first 200 steps are the baseline",
"below 0.1x for 50 consecutive steps", "+20% per 100 steps, sustained 300 steps"), while
Prometheus' ``for:``
counts wall time and a scrape sees one step in many. So the exporter keeps a short per-rank step
history and publishes features over it; the rule files compare them to the thresholds (which
live there, never here). A run replayed at 5 s or at 5 min per step yields the same features.

Feature menu (docs/signals.md): the initial mean over a run's first few steps (the reference of
the cards that must work from step one, before any baseline exists); baseline mean/stddev over
the baseline period; window mean over the last N steps, also shifted back by an offset; growth
per 100 steps; window min/max; window 10th/90th percentiles (a 90th percentile below x over N
steps = "below x for N consecutive steps", tolerating a noisy step in ten); the highest and lowest
20-step mean since the run started (a "working level" and a "floor"); the count of consecutive
rising window means; non-finite values within a window; the least-squares slope over a window;
the min, max and median of the last few logged records and of the records before them (windows in
records, not steps: the blow-up card's "left its recent range"); the trend of the last 30 records
(Mann–Kendall's Z, Theil's slope and the factor the signal moved by: trend.py); per prompt type,
the reward's 50-step means now and 200 steps ago and its initial value; and the entropy-reward
law fitted on the run so far (forecast.py).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain, filterfalse
from typing import Any

from grpo_monitor.contract import thresholds
from grpo_monitor.contract.card_logic import feature_keys
from grpo_monitor.contract.cards import CARDS_BY_NAME
from grpo_monitor.runtime.forecast import BLOCK_STEPS, LawFit, LawSums
from grpo_monitor.runtime.trend import Trend, trend_of

# (window_steps, offset_steps) pairs published as grpo_window_mean.
TRAINING_MEANS: tuple[tuple[int, int], ...] = (
    (20, 0), (50, 0), (50, 200), (100, 0), (100, 100), (100, 200), (100, 300), (200, 0))
TRAINING_EXTREMES: tuple[int, ...] = (50, 100, 200)  # grpo_window_min / grpo_window_max
# grpo_window_p10 / grpo_window_p90. The 50-step one is the "for 50 consecutive steps" of docs/background.md;
# the 20-step one lets the early cards act within a few dozen steps of a run's start.
TRAINING_PERCENTILES: tuple[int, ...] = (20, 50)
# "In 90% of the last N steps" rests on at least this many records: a percentile window holding
# fewer (a trainer logging every 10th step has two records in 20 steps, one logging every 50th
# has one) reaches back to the last PERSISTENCE_RECORDS records instead, so that no card fires
# on one or two logged values, however sparse the logging.
PERSISTENCE_RECORDS = 3
# grpo_run_window_mean_max / _min: the extremes of the signal's RANGE_WINDOW-step mean so far.
RANGE_WINDOW = 20
# The initial reference: the mean over each signal's first INITIAL_STEPS steps (settable with
# --signals.initial-steps). Short enough to describe the policy the run started from, long
# enough to average a few noisy steps when the trainer logs every step.
INITIAL_STEPS = 10
# The baseline period: each rank's first BASELINE_STEPS steps (settable with
# --signals.baseline-steps); the cards that compare with a baseline wait for it. The thresholds
# table holds the length, which the report's windows share.
BASELINE_STEPS = thresholds.count("baseline_steps")
# Performance signals are logged by every rank: a smaller menu keeps 1024 ranks affordable.
PERF_MEANS: tuple[tuple[int, int], ...] = ((50, 0),)
PERF_EXTREMES: tuple[int, ...] = (50,)
# grpo_window_baseline_ratio: the BASELINE_RATIO_WINDOW-step mean (offset 0) over the baseline
# mean. The step time's and throughput's cards judge it on every rank: one series a rank instead
# of two joined in the rule, which at 16,384 ranks was most of their cost to the rule engine
# (docs/scaling.md#rules-at-scale). A mean window published for every key (PERF_MEANS,
# TRAINING_MEANS).
BASELINE_RATIO_WINDOW = 50
GROWTH_WINDOW = 100  # grpo_window_growth_ratio: mean(100 @ o) / mean(100 @ o+100) - 1
GROWTH_OFFSETS: tuple[int, ...] = (0, 100, 200)
RISING_WINDOW = 100  # grpo_rising_windows: streak of rising 100-step means
# grpo_window_slope: the least-squares trend per step over the last 50 steps, the direction a
# signal is heading (a mismatch still rising, an entropy still falling and how fast).
SLOPE_WINDOWS: tuple[int, ...] = (50,)
# The entropy-reward law (forecast.py) is fitted on these two keys' block means.
LAW_ENTROPY, LAW_REWARD = "entropy/mean", "reward/mean"
# Per prompt type (a record's by_type) only the reward is followed, and only its 50-step mean,
# the same 200 steps before and its initial value are published: what the shortcut card compares
# (an easy type up, a hard type down, within 200 steps or since the start). A full menu per type
# would multiply the series by the number of types.
PROMPT_TYPE_KEYS: tuple[str, ...] = ("reward/mean",)
PROMPT_TYPE_MEANS: tuple[tuple[int, int], ...] = ((50, 0), (50, 200))
NONFINITE_WINDOW = 50  # grpo_window_nonfinite
# Record windows (grpo_records_min / _max / _median{records, offset_records}): the signal's last
# RECENT_RECORDS logged values, and the (up to) REFERENCE_RECORDS logged before its newest
# REFERENCE_OFFSET_RECORDS, counted in records, not steps. The blow-up card compares the two: a
# signal that leaves the range of its own earlier records in two records running has moved,
# however often the trainer logs (every step, or every 10th). The three records between the two
# windows keep the first records of a ramp out of the reference, which would otherwise chase a
# blow-up that takes a few records to build. The reference is published from
# REFERENCE_MIN_RECORDS records on: a run logging every 5th step is judged from its 10th record.
RECENT_RECORDS = 2
REFERENCE_RECORDS = 10
REFERENCE_OFFSET_RECORDS = 5
REFERENCE_MIN_RECORDS = 5
# Only for the keys the blow-up card reads (its declaration in contract/cards.py): six series
# for each of the ~40 training keys would be a fifth of rank 0's series, read by nothing.
RECORD_KEYS: frozenset[str] = frozenset(CARDS_BY_NAME["GRPOTrainingBlowUp"].keys)
# (records, offset_records, fewest records published)
RECORD_WINDOWS: tuple[tuple[int, int, int], ...] = (
    (RECENT_RECORDS, 0, RECENT_RECORDS), (REFERENCE_RECORDS, REFERENCE_OFFSET_RECORDS, REFERENCE_MIN_RECORDS))
# The trend of a signal's last TREND_RECORDS records (trend.py: Mann–Kendall's Z and Theil's
# slope, the factor it moved by), only for the keys a card's trend branch reads (contract/cards.py,
# reason "trend"): a steady climb or fall that is a sickness in itself.
TREND_KEYS: frozenset[str] = frozenset(
    k for c in CARDS_BY_NAME.values() for b in c.branches if b.reason == "trend" for k in b.keys)
# The perf keys whose ratio to the baseline a card reads (a "baseline_ratio" series of its
# declaration in contract/cards.py); every training key has one (the dashboards' ratio, rank 0's
# in most jobs). Not every perf key: every rank logs them, and a series on every rank that no
# card reads costs each scrape and the store's memory.
RATIO_PERF_KEYS: frozenset[str] = feature_keys("baseline_ratio")
# Published besides: the last PERSISTENCE_RECORDS records, "in each of its last 3 records", the
# persistence of the cards that judge a run from its first records (an entropy cliff in a run's
# first steps).
PUBLISHED_RECORD_WINDOWS: tuple[tuple[int, int, int], ...] = (
    *RECORD_WINDOWS, (PERSISTENCE_RECORDS, 0, PERSISTENCE_RECORDS))
# The first records of a signal (FIRST_RECORDS of them, exact zeros left out) give the reference
# of the cards that must judge a run from its first few records: their median, published as
# grpo_first_records_median once there are that many. Counted in records, so a run logging every
# 10th step has it at its 3rd record; exact zeros left out, since KL is exactly 0 at step 1 (the
# policy is the reference) and a 0 is no scale for a ratio.
FIRST_RECORDS = 3
# Windows of offset 0 that, on a short run, cover the run so far (from its PERSISTENCE_RECORDS-th
# record) instead of waiting until the run is as long as the window: a 14-step run is judged on
# its 14 steps, not never. Only these: the working level and floor (RANGE_WINDOW) and every
# window shifted into the past still need the whole window.
EARLY_WINDOWS: frozenset[int] = frozenset({20, 50})
# The held-out score (validation, a gold reward), logged at its own sparse cadence: judged on its
# own points, not on step windows (HeldOutTracker).
HELDOUT_KEY = "eval/heldout_score"
HELDOUT_RECENT_POINTS = 2  # a fall counts when its last 2 points are both below
# ... or when its 3-point mean has slid from its best 3-point mean (the thresholds table holds
# the count, which the rule's noise of such a mean reads too).
HELDOUT_SMOOTH_POINTS = thresholds.count("heldout_smooth_points")
# Points kept: the noise is the median change over the last HELDOUT_MAX_POINTS points; the best
# point, the best smoothed mean and the count of points are those of every point, the trimmed
# ones folded into a summary as they go (HeldOutTracker).
HELDOUT_MAX_POINTS = 1000
REWARD_LEVEL_WINDOW = 20  # the training reward's level beside a held-out point: its 20-step mean
HISTORY = max(w + o for w, o in TRAINING_MEANS)  # the windows' reach: 400 steps
# A rank that logs a step before its newest (a rollback, a resume from a checkpoint) undoes the
# records after it (docs/signals.md#a-runs-timeline). The history keeps REWIND_RECORDS records
# beyond the windows' reach, so that after a rewind of up to that many records every window is
# what a fresh read of the surviving records gives; a longer rewind leaves the windows that
# reach further back unpublished until the run has logged that far again.
REWIND_RECORDS = HISTORY
# How far back from its newest step a performance signal's series read (its windows, its NaN
# count); a training signal's read HISTORY steps. A first start that reads a long file's head and
# tail (ingest.py) reads this much of its tail.
PERF_REACH = max(max(w + o for w, o in PERF_MEANS), *PERF_EXTREMES, NONFINITE_WINDOW)
KEEP_RECORDS = HISTORY + REWIND_RECORDS
# A rank's logged steps are kept as arithmetic runs (StepLog): one for a trainer that logs every
# k-th step, but one every step or two for one whose steps come at irregular intervals. Beyond
# this many runs the two oldest are merged (their count kept, their steps spread evenly): memory
# stays bounded, and only a rewind further back than this many runs (so than the windows'
# history too) counts the steps it undoes approximately.
STEP_LOG_RUNS = KEEP_RECORDS
# The NaN / Inf steps a key keeps (grpo_window_nonfinite reads the last NONFINITE_WINDOW steps'):
# a NaN logged again and again for one step (a storm of records of the same step) must not grow
# the exporter without bound. The count is exact while fewer lie in the last
# NONFINITE_WINDOW + HISTORY steps.
NONFINITE_KEEP = 2 * (NONFINITE_WINDOW + HISTORY)
LAW_UNDO_BLOCKS = REWIND_RECORDS // BLOCK_STEPS + 1  # closed blocks of the law kept for a rewind
# Events whose steps are left out of the performance windows and baselines: a checkpoint save
# stalls the step (background.md#checkpoint-io: filter the save's IO spike before judging throughput). A stall,
# not the red-card pause (store.py's "paused" mark), which is a run waiting on purpose.
STALL_EVENTS = ("checkpoint_save", "checkpoint", "eval")


class StepLog:
    """The steps a rank has logged, newest last, as arithmetic runs ``[first, stride, count]``:
    20,000 steps logged every step (or every 10th) are one run, so that a rewind knows how many
    logged steps stand without keeping each."""

    __slots__ = ("runs", "count")
    # Declared for the saved state, which decodes each field by its type (state_codec.py).
    runs: list[list[int]]
    count: int

    def __init__(self) -> None:
        self.runs = []
        self.count = 0

    def first(self) -> int | None:
        return self.runs[0][0] if self.runs else None

    def last(self) -> int | None:
        if not self.runs:
            return None
        first, stride, n = self.runs[-1]
        return first + stride * (n - 1)

    def add(self, step: int) -> bool:
        """Note a step newer than the last (a rewind comes first); False for the last again."""
        last = self.last()
        if last is not None and step <= last:
            return False
        if self.runs and (run := self.runs[-1])[2] == 1:
            run[1], run[2] = step - run[0], 2
        elif self.runs and step - last == self.runs[-1][1]:  # type: ignore[operator]
            self.runs[-1][2] += 1
        else:
            self.runs.append([step, 0, 1])
            if len(self.runs) > STEP_LOG_RUNS:
                self._merge_oldest()
        self.count += 1
        return True

    def _merge_oldest(self) -> None:
        """The two oldest runs as one of their count, from the first's first step, its steps
        spread evenly up to the second's last step (at most: the stride is a whole number)."""
        (first, _, n0), (first1, stride1, n1) = self.runs[0], self.runs[1]
        last, n = first1 + stride1 * (n1 - 1), n0 + n1
        self.runs[0] = [first, (last - first) // (n - 1), n]
        del self.runs[1]

    def rewind(self, keep_through: int) -> None:
        while self.runs:
            first, stride, n = self.runs[-1]
            if first > keep_through:
                self.runs.pop()
                self.count -= n
                continue
            keep = n if stride == 0 else min(n, (keep_through - first) // stride + 1)
            self.count -= n - keep
            self.runs[-1][2] = keep
            break


def is_perf(key: str) -> bool:
    return key.startswith("perf/")


@dataclass
class Welford:
    """Running mean and sample standard deviation."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        # d * (x - mean) is d**2 (n-1)/n, never negative; only values near float's limits make
        # it -inf (-inf * inf, an overflow), and sqrt() of a negative m2 would raise.
        self.m2 += abs(d * (x - self.mean))

    @property
    def stddev(self) -> float:
        return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else 0.0


@dataclass
class KeyHistory:
    # Windows are in steps, not in values: a key logged every 100 steps (quantiles, say) has
    # one value in a 100-step window, not a hundred. Arrays, not deques of floats: a third of
    # the memory, and bisect and slices work on them directly. They hold between KEEP_RECORDS
    # and KEEP_RECORDS * 3 / 2 values (trimmed in batches).
    steps: array[int] = field(default_factory=lambda: array("q"))
    values: array[float] = field(default_factory=lambda: array("d"))
    # The lowest and highest RANGE_WINDOW-step mean at each step (NaN where there is none; two
    # records of one step give two means): the working level and the floor are their extremes,
    # re-formed from these after a rewind. Empty for a key without a working level (perf/*).
    means_lo: array[float] = field(default_factory=lambda: array("d"))
    means_hi: array[float] = field(default_factory=lambda: array("d"))
    ranged: bool = True
    first_step: int | None = None  # since when the history is complete
    evicted: int | None = None  # the newest step trimmed off the front: complete after it
    # Steps with a NaN / Inf, one entry a value (the newest NONFINITE_KEEP).
    nonfinite_steps: deque[int] = field(default_factory=lambda: deque(maxlen=NONFINITE_KEEP))
    # The step the current streak of them began: no NONFINITE_WINDOW-step gap since, so the red
    # card has held since then. Kept apart from the steps, which keep only the newest.
    nonfinite_since: int | None = None
    baseline: Welford = field(default_factory=Welford)
    # The baseline period's values, in order: a rewind into the period re-forms the baseline
    # from those that stand.
    baseline_steps: array[int] = field(default_factory=lambda: array("q"))
    baseline_values: array[float] = field(default_factory=lambda: array("d"))
    initial: Welford = field(default_factory=Welford)
    initial_points: list[tuple[int, float]] = field(default_factory=list)
    initial_first: int | None = None  # the key's first finite step
    initial_done: bool = False
    initial_rebased: bool = False  # a re-baseline set the initial reference (restart_initial)
    # Highest and lowest complete RANGE_WINDOW-step mean so far, and over the trimmed steps.
    range_max: float | None = None
    range_min: float | None = None
    trimmed_range: tuple[float, float] | None = None
    rising: int = 0  # consecutive rising RISING_WINDOW means, judged at each window boundary
    last_block_mean: float | None = None
    block: int | None = None  # step // RISING_WINDOW of the last value
    # (step that judged a window, rising before, last_block_mean before): undone by a rewind.
    rising_log: list[tuple[int, int, float | None]] = field(default_factory=list)
    # The first FIRST_RECORDS values other than exactly 0, with their steps.
    first_records: list[tuple[int, float]] = field(default_factory=list)
    # Whether the history holds every value since the key's first: an EARLY_WINDOWS window may
    # then cover the run so far.
    since_start: bool = True

    def note_nonfinite(self, step: int) -> None:
        """A NaN / Inf at ``step``: a new streak where the last one ended a window ago."""
        if not self.nonfinite_steps or step - self.nonfinite_steps[-1] >= NONFINITE_WINDOW:
            self.nonfinite_since = step
        self.nonfinite_steps.append(step)

    def nonfinite_count(self, step: int) -> int:
        """The NaN / Inf values of the NONFINITE_WINDOW steps up to ``step`` (grpo_window_nonfinite)."""
        if not self.nonfinite_steps or self.nonfinite_steps[-1] <= step - NONFINITE_WINDOW:
            return 0
        return sum(1 for s in self.nonfinite_steps if s > step - NONFINITE_WINDOW)

    def streak_start(self) -> int | None:
        """The step the current streak of NaN / Inf values began; found in the steps kept where
        it is not known (after a rewind into the streak, or a state saved before it was kept)."""
        if self.nonfinite_since is not None or not self.nonfinite_steps:
            return self.nonfinite_since
        steps = list(self.nonfinite_steps)
        i = len(steps) - 1
        while i > 0 and steps[i] - steps[i - 1] < NONFINITE_WINDOW:
            i -= 1
        return steps[i]

    def put(self, step: int, value: float, initial_steps: int) -> None:
        """A finite value of ``step``; a second record for the same step wins."""
        lo = hi = math.nan
        if self.steps and self.steps[-1] == step:
            if self.ranged:
                lo, hi = self.means_lo.pop(), self.means_hi.pop()
            del self.steps[-1], self.values[-1]
        self.steps.append(step)
        self.values.append(value)
        if self.ranged:
            self.means_lo.append(lo)
            self.means_hi.append(hi)
        if len(self.steps) > KEEP_RECORDS + KEEP_RECORDS // 2:
            self._trim(len(self.steps) - KEEP_RECORDS)
        self.add_initial(step, value, initial_steps)
        if len(self.first_records) < FIRST_RECORDS and value != 0:
            self.first_records.append((step, value))

    def _trim(self, count: int) -> None:
        gone_lo = [m for m in self.means_lo[:count] if not math.isnan(m)]
        if gone_lo:
            lo, hi = min(gone_lo), max(m for m in self.means_hi[:count] if not math.isnan(m))
            if self.trimmed_range is not None:
                lo, hi = min(lo, self.trimmed_range[0]), max(hi, self.trimmed_range[1])
            self.trimmed_range = (lo, hi)
        self.evicted = self.steps[count - 1]
        self.since_start = False
        del self.steps[:count], self.values[:count], self.means_lo[:count], self.means_hi[:count]
        while self.rising_log and self.rising_log[0][0] <= self.evicted:
            del self.rising_log[0]

    def note_range(self, mean: float) -> None:
        """The RANGE_WINDOW-step mean at the newest step."""
        lo, hi = self.means_lo[-1], self.means_hi[-1]
        self.means_lo[-1] = mean if math.isnan(lo) else min(lo, mean)
        self.means_hi[-1] = mean if math.isnan(hi) else max(hi, mean)
        self.range_max = mean if self.range_max is None else max(self.range_max, mean)
        self.range_min = mean if self.range_min is None else min(self.range_min, mean)

    def rewind(self, keep_through: int, initial_steps: int) -> None:
        """Undo every value of a step after ``keep_through``: what stands is what a fresh read of
        the surviving records gives (docs/signals.md#a-runs-timeline), as far back as the kept
        history reaches."""
        cut = bisect_right(self.steps, keep_through)
        # The working level and the floor change only when an undone step held one of them
        # (a NaN, where a step has no mean, is never one: no comparison picks it).
        low_undone = self.range_min is not None and any(m <= self.range_min for m in self.means_lo[cut:])
        high_undone = self.range_max is not None and any(m >= self.range_max for m in self.means_hi[cut:])
        if cut < len(self.steps):
            del self.steps[cut:], self.values[cut:], self.means_lo[cut:], self.means_hi[cut:]
        while self.nonfinite_steps and self.nonfinite_steps[-1] > keep_through:
            self.nonfinite_steps.pop()
        if self.nonfinite_since is not None and self.nonfinite_since > keep_through:
            self.nonfinite_since = None  # streak_start() finds the standing one's in the steps
        if self.baseline_steps and self.baseline_steps[-1] > keep_through:
            cut = bisect_right(self.baseline_steps, keep_through)
            del self.baseline_steps[cut:], self.baseline_values[cut:]
            self.baseline = _welford(self.baseline_values)
        self.first_records = [p for p in self.first_records if p[0] <= keep_through]
        if not self.initial_rebased and self.initial_points and self.initial_points[-1][0] > keep_through:
            self.initial_points = [p for p in self.initial_points if p[0] <= keep_through]
            self.initial = _welford(v for _, v in self.initial_points)
        if self.initial_first is not None and self.initial_first > keep_through:
            self.initial_first = None
        last = self.steps[-1] if self.steps else self.evicted
        if not self.initial_rebased:
            self.initial_done = (self.initial_first is not None and last is not None
                                 and last >= self.initial_first + initial_steps)
        if low_undone or high_undone:
            self._range_again(low_undone, high_undone)
        while self.rising_log and self.rising_log[-1][0] > keep_through:
            _, self.rising, self.last_block_mean = self.rising_log.pop()
        self.block = None if last is None else last // RISING_WINDOW

    def _range_again(self, low: bool, high: bool) -> None:
        """The floor (``low``) and the working level (``high``) again, after a rewind undid a
        step that held it: unchanged while a kept mean equals it, else the extreme of the kept
        means and the trimmed ones'."""
        trimmed = self.trimmed_range or ()
        if low and self.range_min not in self.means_lo:
            self.range_min = min(chain(filterfalse(math.isnan, self.means_lo), trimmed[:1]), default=None)
        if high and self.range_max not in self.means_hi:
            self.range_max = max(chain(filterfalse(math.isnan, self.means_hi), trimmed[1:]), default=None)

    def unrebase(self) -> None:
        """Back to the baseline period's baseline and the key's first steps' initial reference."""
        self.baseline = _welford(self.baseline_values)
        self.initial = _welford(v for _, v in self.initial_points)
        self.initial_rebased = False
        self.initial_done = False  # rewind() says whether the initial steps are past

    def add_baseline(self, step: int, value: float) -> None:
        """A value of the baseline period; a second record of a step wins, as in the windows
        (and the period keeps a value a step, however often a step is logged again)."""
        if self.baseline_steps and self.baseline_steps[-1] == step:
            self.baseline_values[-1] = value
            self.baseline = _welford(self.baseline_values)
            return
        self.baseline.add(value)
        self.baseline_steps.append(step)
        self.baseline_values.append(value)

    def first_records_median(self) -> float | None:
        if len(self.first_records) < FIRST_RECORDS:
            return None
        return percentile([v for _, v in self.first_records], 0.5)

    def add_initial(self, step: int, value: float, initial_steps: int) -> None:
        """The key's own first steps make its initial reference: a key first logged late (an
        eval every 100 steps) starts when it starts, not with the run."""
        if self.initial_done:
            return
        if self.initial_first is None:
            self.initial_first = step
        if step < self.initial_first + initial_steps:
            if self.initial_points and self.initial_points[-1][0] == step:
                # A second record of the step wins, as in the windows (and the points stay as
                # many as the initial steps, however often a step is logged again).
                self.initial_points[-1] = (step, value)
                self.initial = _welford(v for _, v in self.initial_points)
                return
            self.initial.add(value)
            self.initial_points.append((step, value))
        else:
            self.initial_done = True

    def initial_mean(self, now: int, initial_steps: int) -> float | None:
        """The initial reference, once its steps are over; None before."""
        if self.initial_first is None:
            return None
        if self.initial.n > 0 and (self.initial_done or now >= self.initial_first + initial_steps - 1):
            return self.initial.mean
        return None

    def restart_initial(self, now: int, initial_steps: int) -> None:
        """The last ``initial_steps`` steps become the initial reference (a re-baseline): a
        person who says "this is normal now" means the initial value too, or the early cards
        would keep judging the run against the policy it started from."""
        self.initial, self.initial_done, self.initial_rebased = Welford(), True, True
        for s, v in zip(self.steps, self.values):
            if s > now - initial_steps:
                self.initial.add(v)

    def window(self, now: int, window: int, offset: int, at_least: int = 1,
               early: bool = False) -> Sequence[float] | None:
        """The values of steps (now - offset - window, now - offset], or of the last
        ``at_least`` records up to now - offset where the window holds fewer; None while the
        history does not reach back that far, unless ``early``: then a window of offset 0 over
        a history that holds the key's every value covers them all, from PERSISTENCE_RECORDS (or
        ``at_least``) of them."""
        points = self.window_points(now, window, offset, at_least, early)
        return None if points is None else points[1]

    def records(self, count: int, offset: int, fewest: int) -> list[float] | None:
        """Up to ``count`` values logged before the newest ``offset`` ones (records, not steps);
        None while the history holds fewer than ``fewest`` of them."""
        end = len(self.values) - offset
        if end < fewest:
            return None
        return list(self.values[max(0, end - count):end])

    def window_points(self, now: int, window: int, offset: int, at_least: int = 1,
                      early: bool = False) -> tuple[Sequence[int], Sequence[float]] | None:
        """The steps and values of steps (now - offset - window, now - offset], as window()."""
        start = now - offset - window
        if self.first_step is None or self.first_step > start + 1 or (
                self.evicted is not None and self.evicted > start):
            if (early and offset == 0 and self.since_start
                    and len(self.steps) >= max(at_least, PERSISTENCE_RECORDS)):
                return self.steps, self.values
            return None
        steps = self.steps
        lo, hi = bisect_right(steps, start), bisect_right(steps, now - offset)
        if lo == hi:
            return None
        if hi - lo < at_least:  # reach back to the last at_least records
            lo = hi - at_least
            if lo < 0:
                return None
        return steps[lo:hi], self.values[lo:hi]


def _welford(values: Iterable[float]) -> Welford:
    w = Welford()
    for v in values:
        w.add(v)
    return w


def slope(steps: list[int], values: list[float]) -> float | None:
    """Least-squares slope of values over steps (per step); None for fewer than two steps."""
    n = len(steps)
    if n < 2:
        return None
    mx = sum(steps) / n
    my = sum(values) / n
    sxx = sum((x - mx) ** 2 for x in steps)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(steps, values)) / sxx


@dataclass
class LawTracker:
    """The entropy-reward law fitted on a rank's block means as its steps arrive (forecast.py).

    A block is BLOCK_STEPS consecutive steps; its point is the mean entropy and the mean reward
    of the steps in it that logged both. A block enters the fit when a later block starts, so a
    step logged twice (a record that rewrites a step) still counts once. The last LAW_UNDO_BLOCKS
    closed blocks are kept with the sums before them, so that a rewind re-forms the fit of the
    surviving steps; a rewind further back keeps the sums as of the oldest kept block."""

    sums: LawSums = field(default_factory=LawSums)
    block: int | None = None
    steps: list[int] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    last_step: int | None = None
    # (block, the sums before it, its steps, entropies, rewards), oldest first.
    closed: list[tuple[int, LawSums, list[int], list[float], list[float]]] = field(default_factory=list)

    def add(self, step: int, values: dict[str, float]) -> None:
        h, r = values.get(LAW_ENTROPY), values.get(LAW_REWARD)
        if h is None or r is None or not (math.isfinite(h) and math.isfinite(r)):
            return
        block = step // BLOCK_STEPS
        if block != self.block:
            self._close()
            self.block = block
        elif step == self.last_step:  # a second record for the same step replaces the first
            self.steps.pop()
            self.entropy.pop()
            self.reward.pop()
        self.steps.append(step)
        self.entropy.append(h)
        self.reward.append(r)
        self.last_step = step

    def _close(self) -> None:
        if self.entropy and self.block is not None:
            self.closed.append((self.block, replace(self.sums), self.steps, self.entropy, self.reward))
            if len(self.closed) > LAW_UNDO_BLOCKS:
                del self.closed[0]
            self.sums.add(sum(self.entropy) / len(self.entropy), sum(self.reward) / len(self.reward))
        self.steps, self.entropy, self.reward = [], [], []

    def rewind(self, keep_through: int) -> None:
        """Undo the points of the steps after ``keep_through``."""
        if self.last_step is None or self.last_step <= keep_through:
            return
        keep = bisect_right(self.steps, keep_through)
        if keep:  # the open block keeps some: every block before it stays closed
            del self.steps[keep:], self.entropy[keep:], self.reward[keep:]
            self.last_step = self.steps[-1]
            return
        sums_before: LawSums | None = None
        while self.closed and self.closed[-1][2][0] > keep_through:
            sums_before = self.closed.pop()[1]
        if self.closed:  # the newest surviving block is open again: no later step closed it
            block, sums_before, steps, entropy, reward = self.closed.pop()
            keep = bisect_right(steps, keep_through)
            self.block, self.steps, self.entropy, self.reward = block, steps[:keep], entropy[:keep], reward[:keep]
            self.sums, self.last_step = sums_before, self.steps[-1]
            return
        self.sums = sums_before if sums_before is not None else self.sums
        self.block, self.steps, self.entropy, self.reward, self.last_step = None, [], [], [], None

    def fit(self) -> LawFit | None:
        return self.sums.fit()


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (q in [0, 1]) of a non-empty list."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def window_mean(h: KeyHistory, now: int, window: int, offset: int, perf: bool) -> float | None:
    """grpo_window_mean: the mean of the key's values in steps (now - offset - window, now -
    offset]; None while its history does not reach that far (a training key's EARLY_WINDOWS
    cover the run so far)."""
    chunk = h.window(now, window, offset, early=not perf and window in EARLY_WINDOWS)
    return None if chunk is None else sum(chunk) / len(chunk)


def baseline_ratio(mean: float | None, baseline: float) -> float | None:
    """grpo_window_baseline_ratio: a window's mean over the baseline mean; None without the
    mean, or where the baseline is 0 (no ratio says how far a signal moved from nothing)."""
    return None if mean is None or baseline == 0 else mean / baseline


def window_slope(h: KeyHistory, now: int, window: int) -> float | None:
    """grpo_window_slope: the least-squares slope per step of the key's last ``window`` steps."""
    points = h.window_points(now, window, 0)
    return None if points is None else slope(*points)


def window_percentiles(h: KeyHistory, now: int, window: int) -> tuple[float, float] | None:
    """grpo_window_p10 and grpo_window_p90 of a training key over its last ``window`` steps,
    from PERSISTENCE_RECORDS records; None before."""
    chunk = h.window(now, window, 0, PERSISTENCE_RECORDS, early=window in EARLY_WINDOWS)
    return None if chunk is None else (percentile(chunk, 0.1), percentile(chunk, 0.9))


@dataclass
class Features:
    """What one rank publishes, ready for the exposition."""

    ready: bool
    baseline: dict[str, tuple[float, float]]  # key -> (mean, stddev)
    initial: dict[str, float]  # key -> mean over its first INITIAL_STEPS steps
    means: list[tuple[str, int, int, float]]  # key, window, offset, mean
    growth: list[tuple[str, int, float]]  # key, offset, growth ratio over GROWTH_WINDOW
    extremes: list[tuple[str, int, float, float]]  # key, window, min, max
    percentiles: list[tuple[str, int, float, float]]  # key, window, p10, p90
    ranges: dict[str, tuple[float, float]]  # key -> (lowest, highest) RANGE_WINDOW-step mean
    rising: dict[str, int]
    nonfinite: dict[str, int]
    slopes: list[tuple[str, int, float]] = field(default_factory=list)  # key, window, per step
    # key, records, offset_records, min, max, median (RECORD_WINDOWS)
    records: list[tuple[str, int, int, float, float, float]] = field(default_factory=list)
    law: LawFit | None = None
    first_records: dict[str, float] = field(default_factory=dict)  # key -> FIRST_RECORDS median
    heldout: HeldOutFeatures | None = None
    trends: dict[str, Trend] = field(default_factory=dict)  # key -> trend of its last records
    # key -> the step its current streak of NaN / Inf began, for the keys counted in nonfinite
    nonfinite_since: dict[str, int] = field(default_factory=dict)
    # key -> its BASELINE_RATIO_WINDOW-step mean over its baseline mean, once the baseline is ready
    baseline_ratios: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class HeldOutFeatures:
    """The held-out score judged on its own points: its best so far, the better of its last
    HELDOUT_RECENT_POINTS, the typical change between two consecutive points (its noise), how
    many points, and the training reward's level when the best point was logged."""

    best: float
    recent: float
    noise: float
    points: int
    reward_at_best: float | None
    # The points' HELDOUT_SMOOTH_POINTS-point means (an evaluation's scatter smoothed): the best
    # so far, the latest, and the training reward's level when that best was logged; None while
    # there are fewer points.
    smooth_best: float | None = None
    smooth_recent: float | None = None
    reward_at_smooth_best: float | None = None


@dataclass
class HeldOutTracker:
    """The held-out score's sparse points (one per evaluation), not step windows: an evaluation
    every 50 steps has one point in a 50-step window.

    The last HELDOUT_MAX_POINTS points are kept (the noise is the median change between two of
    them); a point trimmed off the front leaves its part of the other features in a summary:
    the best point among the trimmed, the best HELDOUT_SMOOTH_POINTS-point mean that starts at
    one, and how many were trimmed. So however many points a run logs, the best, the smoothed
    best and the count are those of every point, in bounded memory."""

    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    levels: list[float | None] = field(default_factory=list)  # the reward's level at each point
    best: float | None = None
    reward_at_best: float | None = None
    trimmed_best: tuple[float, float | None] | None = None  # over the points trimmed off
    # The best smoothed mean among those that start at a trimmed point, with the reward's level
    # at its last point; and how many points were trimmed (0 in a state saved before they were
    # counted: such a state's features are those of its kept points, as they were).
    trimmed_smooth_best: tuple[float, float | None] | None = None
    trimmed: int = 0

    def add(self, step: int, value: float, reward_level: float | None) -> None:
        if self.steps and self.steps[-1] == step:  # a second record of the step wins
            self.rewind(step - 1)
        self.steps.append(step)
        self.values.append(value)
        self.levels.append(reward_level)
        if self.best is None or value > self.best:
            self.best, self.reward_at_best = value, reward_level
        if len(self.values) > HELDOUT_MAX_POINTS:
            self._trim_first()

    def _trim_first(self) -> None:
        """Fold the oldest kept point into the summary of the trimmed ones, and drop it."""
        if self.trimmed_best is None or self.values[0] > self.trimmed_best[0]:
            self.trimmed_best = (self.values[0], self.levels[0])
        k = HELDOUT_SMOOTH_POINTS
        if len(self.values) >= k:  # the last mean this point is part of the start of
            mean = sum(self.values[:k]) / k
            if self.trimmed_smooth_best is None or mean > self.trimmed_smooth_best[0]:
                self.trimmed_smooth_best = (mean, self.levels[k - 1])
        self.trimmed += 1
        del self.steps[0], self.values[0], self.levels[0]

    def rewind(self, keep_through: int) -> None:
        """Undo the points of the steps after ``keep_through``; the best is that of the rest. A
        rewind past every kept point leaves the trimmed points' summary as it was."""
        if not self.steps or self.steps[-1] <= keep_through:
            return
        cut = bisect_right(self.steps, keep_through)
        undone_best = self.best is not None and max(self.values[cut:]) >= self.best
        del self.steps[cut:], self.values[cut:], self.levels[cut:]
        if not undone_best:  # the best point stands (an earlier point wins a tie)
            return
        self.best, self.reward_at_best = self.trimmed_best or (None, None)
        for value, level in zip(self.values, self.levels):
            if self.best is None or value > self.best:
                self.best, self.reward_at_best = value, level

    def features(self) -> HeldOutFeatures | None:
        if self.best is None or not self.values:  # none, or a rewind undid every kept point
            return None
        diffs = [abs(b - a) for a, b in zip(self.values, self.values[1:])]
        noise = percentile(diffs, 0.5) if diffs else 0.0
        recent = max(self.values[-HELDOUT_RECENT_POINTS:])
        k = HELDOUT_SMOOTH_POINTS
        smooth_best = smooth_recent = reward_at_smooth_best = None
        if self.trimmed_smooth_best is not None:  # the means that start at a trimmed point
            smooth_best, reward_at_smooth_best = self.trimmed_smooth_best
        for i in range(k, len(self.values) + 1):
            smooth_recent = sum(self.values[i - k:i]) / k
            if smooth_best is None or smooth_recent > smooth_best:
                smooth_best, reward_at_smooth_best = smooth_recent, self.levels[i - 1]
        return HeldOutFeatures(self.best, recent, noise, self.trimmed + len(self.values),
                               self.reward_at_best, smooth_best, smooth_recent, reward_at_smooth_best)


# RankSignals.reading's held-out features: HeldOutFeatures' field each reads.
HELDOUT_READINGS: dict[str, str] = {
    "heldout_best": "best", "heldout_recent": "recent", "heldout_noise": "noise",
    "heldout_points": "points", "heldout_reward_at_best": "reward_at_best",
    "heldout_smoothed_best": "smooth_best", "heldout_smoothed_recent": "smooth_recent",
    "heldout_reward_at_smoothed_best": "reward_at_smooth_best"}


class RankSignals:
    """The step history of one (run, rank) and the features derived from it."""

    # Declared for the saved state, which decodes each field by its type (state_codec.py).
    configured_baseline_steps: int
    baseline_steps: int
    initial_steps: int
    first_step: int | None
    baseline_from: int | None  # first step of the current baseline period
    rebased_at: int | None  # the step at which a re-baseline was applied
    step: int
    keys: dict[str, KeyHistory]
    law: LawTracker
    heldout: HeldOutTracker

    def __init__(self, baseline_steps: int, initial_steps: int = INITIAL_STEPS) -> None:
        self.configured_baseline_steps = self.baseline_steps = baseline_steps
        self.initial_steps = initial_steps
        self.first_step = None
        self.baseline_from = None
        self.rebased_at = None
        self.step = 0
        self.keys = {}
        self.law = LawTracker()
        self.heldout = HeldOutTracker()

    @property
    def ready(self) -> bool:
        return self.baseline_from is not None and self.step >= self.baseline_from + self.baseline_steps

    @property
    def baseline_steps_to_go(self) -> int:
        """Steps until the baseline is ready: the cards that wait for it judge from then on (0
        once they do). A rank at step 150 of a 200-step baseline from step 1 has 51 to go."""
        if self.baseline_from is None:
            return self.baseline_steps
        return max(0, self.baseline_from + self.baseline_steps - self.step)

    def reach(self) -> int:
        """Steps back from the newest step that this rank's published windows read: HISTORY
        once it logs a training signal, PERF_REACH while it logs performance signals only."""
        return PERF_REACH if all(is_perf(key) for key in self.keys) else HISTORY

    def reading(self, key: str, feature: str, window: int = 0, offset: int = 0,
                memo: dict[tuple[str, str], Any] | None = None) -> float | None:
        """One feature of ``key`` as the exposition publishes it now, None where it publishes
        none: "p10" / "p90" (grpo_window_p10 / _p90 over ``window`` steps), "mean"
        (grpo_window_mean over ``window``, ``offset`` steps back), "slope" (grpo_window_slope),
        "initial" (grpo_initial_mean), "baseline" / "stddev" (grpo_baseline_mean / _stddev, once
        the baseline is ready), "baseline_ratio" (grpo_window_baseline_ratio of ``window``),
        "floor" / "ceiling" (grpo_run_window_mean_min / _max), "rising" (grpo_rising_windows),
        "trend_z" / "trend_factor" (grpo_trend_z / _factor), "first_median"
        (grpo_first_records_median), "records_min" / "_max" / "_median" (grpo_records_*:
        ``window`` records, ``offset`` records back), "least_growth" (the least
        grpo_window_growth_ratio of ``window``), "nonfinite" / "nonfinite_since"
        (grpo_window_nonfinite / _since_step); the rank's "heldout_*"
        (grpo_heldout_*, HELDOUT_READINGS) and "law_scale" / "law_r_squared"
        (grpo_forecast_law_scale / _fit_r_squared), ``key`` one they are read from. The report reads a
        declared card branch's inputs through it (contract/card_logic.py), and features() the
        same values through the same functions. ``memo``: a dict kept across the readings of one
        step, so that a trend, the law's fit and the held-out judgement are computed once."""
        if memo is None:
            memo = {}
        h = self.keys.get(key)
        if h is None:
            return None
        if feature.startswith("heldout_"):  # the rank's held-out judgement (of HELDOUT_KEY)
            if ("", "heldout") not in memo:
                memo["", "heldout"] = self.heldout.features()
            held = memo["", "heldout"]
            return None if held is None else getattr(held, HELDOUT_READINGS[feature])
        if feature.startswith("law_"):  # the entropy-reward law's fit
            if ("", "law") not in memo:
                memo["", "law"] = self.law.fit()
            fit = memo["", "law"]
            return None if fit is None else fit.a if feature == "law_scale" else fit.r_squared
        if feature in ("nonfinite", "nonfinite_since"):  # published only for a key that has one
            if not (count := h.nonfinite_count(self.step)):
                return None
            return float(count) if feature == "nonfinite" else h.streak_start()
        perf = is_perf(key)
        if feature in ("p10", "p90"):
            if (key, f"p{window}") not in memo:
                memo[key, f"p{window}"] = None if perf else window_percentiles(h, self.step, window)
            if (p := memo[key, f"p{window}"]) is None:
                return None
            return p[0] if feature == "p10" else p[1]
        if feature == "mean":
            return window_mean(h, self.step, window, offset, perf)
        if feature == "slope":
            return None if perf else window_slope(h, self.step, window)
        if feature == "least_growth":  # the least grpo_window_growth_ratio, as features() has them
            if perf or window != GROWTH_WINDOW:
                return None
            means = [window_mean(h, self.step, window, o, perf)
                     for o in (*GROWTH_OFFSETS, GROWTH_OFFSETS[-1] + window)]
            growth = [latest / before - 1 for latest, before in zip(means, means[1:])
                      if latest is not None and before]
            return min(growth) if growth else None
        if feature in ("trend_z", "trend_factor"):
            if (key, "trend") not in memo:
                memo[key, "trend"] = trend_of(h.steps, h.values) if key in TREND_KEYS else None
            t = memo[key, "trend"]
            return None if t is None else t.z if feature == "trend_z" else t.factor
        if feature == "initial":
            return None if perf else h.initial_mean(self.step, self.initial_steps)
        if feature == "first_median":
            return None if perf else h.first_records_median()
        if feature in ("baseline", "stddev", "baseline_ratio"):
            if not (self.ready and h.baseline.n):
                return None
            if feature == "baseline_ratio":
                if window != BASELINE_RATIO_WINDOW or (perf and key not in RATIO_PERF_KEYS):
                    return None
                return baseline_ratio(window_mean(h, self.step, window, 0, perf), h.baseline.mean)
            return h.baseline.mean if feature == "baseline" else h.baseline.stddev
        if feature in ("floor", "ceiling"):  # published together
            if h.range_max is None or h.range_min is None:
                return None
            return h.range_min if feature == "floor" else h.range_max
        if feature == "rising":
            return h.rising if h.last_block_mean is not None else None
        if feature in ("records_min", "records_max", "records_median"):
            fewest = next((f for c, o, f in PUBLISHED_RECORD_WINDOWS if (c, o) == (window, offset)), None)
            if perf or key not in RECORD_KEYS or fewest is None:
                return None
            values = h.records(window, offset, fewest)
            if values is None:
                return None
            return {"records_min": min, "records_max": max}.get(
                feature, lambda v: percentile(v, 0.5))(values)
        raise ValueError(f"no feature {feature!r}")

    def _history(self, key: str) -> KeyHistory:
        h = self.keys.get(key)
        if h is None:
            h = self.keys[key] = KeyHistory(ranged=not is_perf(key))
            h.first_step = self.step
        return h

    def add(self, step: int, values: dict[str, float], stalled: bool) -> None:
        """One step's canonical values; ``stalled``: a checkpoint save or the like (STALL_EVENTS)
        held the step up, so its performance values are left out."""
        if self.first_step is None:
            self.first_step = self.baseline_from = step
        elif step < self.step:  # went back: the steps from this one on are undone
            self.rewind(step - 1)
            if self.first_step is None:
                self.first_step = self.baseline_from = step
        self.step = step
        self.law.add(step, values)
        in_baseline = not self.ready
        for key, value in values.items():
            h = self._history(key)
            if not math.isfinite(value):
                h.note_nonfinite(step)
                continue
            if stalled and is_perf(key):
                continue
            # Before put(): a window that just ended is judged without this step's value (a
            # second record of the same step stays in its block, so judges nothing).
            self._advance_rising(h, step)
            h.put(step, value, self.initial_steps)
            if in_baseline:
                h.add_baseline(step, value)
            if not is_perf(key):
                self._advance_range(h, step)
        for h in self.keys.values():  # kept for HISTORY steps past their window: for a rewind
            while h.nonfinite_steps and h.nonfinite_steps[0] <= step - NONFINITE_WINDOW - HISTORY:
                h.nonfinite_steps.popleft()
        score = values.get(HELDOUT_KEY)
        if score is not None and math.isfinite(score):
            self.heldout.add(step, score, self._reward_level(step))

    def _reward_level(self, step: int) -> float | None:
        """The training reward's REWARD_LEVEL_WINDOW-step mean at ``step`` (the run so far when
        shorter)."""
        h = self.keys.get(LAW_REWARD)
        chunk = None if h is None else h.window(step, REWARD_LEVEL_WINDOW, 0, 1, early=True)
        return None if not chunk else sum(chunk) / len(chunk)

    def _advance_range(self, h: KeyHistory, step: int) -> None:
        """Track the highest and lowest complete RANGE_WINDOW-step mean of the key."""
        chunk = h.window(step, RANGE_WINDOW, 0)
        if chunk is None:
            return
        h.note_range(sum(chunk) / len(chunk))

    def note_nonfinite(self, key: str, step: int) -> None:
        """A NaN / Inf outside the canonical values (an unknown key, a by_type value)."""
        self._history(key).note_nonfinite(step)

    def _advance_rising(self, h: KeyHistory, step: int) -> None:
        """At each RISING_WINDOW boundary, compare the finished window's mean to the one before."""
        block = step // RISING_WINDOW
        if h.block is not None and block != h.block:
            done = h.window((h.block + 1) * RISING_WINDOW - 1, RISING_WINDOW, 0)
            if done is not None:
                mean = sum(done) / len(done)
                h.rising_log.append((step, h.rising, h.last_block_mean))
                if h.last_block_mean is not None:
                    h.rising = h.rising + 1 if mean > h.last_block_mean else 0
                h.last_block_mean = mean
        h.block = block

    def rebaseline(self, steps: int) -> None:
        """The last ``steps`` steps become the baseline (background.md#thresholds: recalibrate at ~2000).

        Only what the history holds can be used: up to KEEP_RECORDS values per key. A rewind to
        before the step it was applied at undoes it (the store applies the request again when
        the surviving steps reach it).
        """
        self.baseline_steps = steps
        self.baseline_from = self.step - steps
        self.rebased_at = self.step
        for h in self.keys.values():
            h.baseline = _welford(v for s, v in zip(h.steps, h.values) if s > self.step - steps)
            h.restart_initial(self.step, self.initial_steps)

    def rewind(self, keep_through: int, last_step: int | None = None) -> None:
        """Undo every step after ``keep_through`` (a rollback, a resume from a checkpoint, a step
        logged again): every feature is then that of the surviving steps
        (docs/signals.md#a-runs-timeline). ``last_step``: the rank's newest surviving step, as
        the store knows it (a record may carry no canonical value)."""
        if self.first_step is None or keep_through >= self.step:
            return
        if keep_through < self.first_step:  # nothing stands: as a rank never seen
            self.__init__(self.configured_baseline_steps, self.initial_steps)  # type: ignore[misc]
            return
        if self.rebased_at is not None and keep_through < self.rebased_at:
            self.baseline_steps, self.baseline_from = self.configured_baseline_steps, self.first_step
            self.rebased_at = None
            for h in self.keys.values():
                h.unrebase()
        for key, h in list(self.keys.items()):
            if h.first_step is not None and h.first_step > keep_through:
                del self.keys[key]  # first logged in the undone steps
            else:
                h.rewind(keep_through, self.initial_steps)
        self.law.rewind(keep_through)
        self.heldout.rewind(keep_through)
        self.step = keep_through if last_step is None else min(last_step, keep_through)

    def features(self) -> Features:
        ready = self.ready
        baseline: dict[str, tuple[float, float]] = {}
        means: list[tuple[str, int, int, float]] = []
        growth: list[tuple[str, int, float]] = []
        extremes: list[tuple[str, int, float, float]] = []
        percentiles: list[tuple[str, int, float, float]] = []
        initial: dict[str, float] = {}
        ranges: dict[str, tuple[float, float]] = {}
        rising: dict[str, int] = {}
        nonfinite: dict[str, int] = {}
        nonfinite_since: dict[str, int] = {}
        slopes: list[tuple[str, int, float]] = []
        records: list[tuple[str, int, int, float, float, float]] = []
        first_records: dict[str, float] = {}
        trends: dict[str, Trend] = {}
        ratios: dict[str, float] = {}
        for key, h in self.keys.items():
            # Zero counts and streaks not yet judged are left out: at 1024 ranks x 30 keys,
            # series that say "nothing" would be most of a scrape. Absent reads as 0 in the rules.
            if count := h.nonfinite_count(self.step):
                nonfinite[key] = count
                if (since := h.streak_start()) is not None:
                    nonfinite_since[key] = since
            if ready and h.baseline.n:
                baseline[key] = (h.baseline.mean, h.baseline.stddev)
            now = self.step
            perf = is_perf(key)
            by_window: dict[tuple[int, int], float] = {}
            for window, offset in PERF_MEANS if perf else TRAINING_MEANS:
                if (mean := window_mean(h, now, window, offset, perf)) is not None:
                    by_window[window, offset] = mean
                    means.append((key, window, offset, mean))
            for offset in () if perf else GROWTH_OFFSETS:
                latest = by_window.get((GROWTH_WINDOW, offset))
                before = by_window.get((GROWTH_WINDOW, offset + GROWTH_WINDOW))
                if latest is not None and before:
                    growth.append((key, offset, latest / before - 1))
            if (key in baseline and (not perf or key in RATIO_PERF_KEYS) and (ratio := baseline_ratio(
                    by_window.get((BASELINE_RATIO_WINDOW, 0)), baseline[key][0])) is not None):
                ratios[key] = ratio
            for window in PERF_EXTREMES if perf else TRAINING_EXTREMES:
                chunk = h.window(now, window, 0)
                if chunk is not None:
                    extremes.append((key, window, min(chunk), max(chunk)))
            if perf:
                continue
            for window in TRAINING_PERCENTILES:
                if (p10_p90 := window_percentiles(h, now, window)) is not None:
                    percentiles.append((key, window, *p10_p90))
            for window in SLOPE_WINDOWS:
                if (trend := window_slope(h, now, window)) is not None:
                    slopes.append((key, window, trend))
            for count, offset, fewest in PUBLISHED_RECORD_WINDOWS if key in RECORD_KEYS else ():
                values = h.records(count, offset, fewest)
                if values is not None:
                    records.append((key, count, offset, min(values), max(values), percentile(values, 0.5)))
            if (first := h.initial_mean(now, self.initial_steps)) is not None:
                initial[key] = first
            if (median := h.first_records_median()) is not None:
                first_records[key] = median
            if key in TREND_KEYS and (t := trend_of(h.steps, h.values)) is not None:
                trends[key] = t
            if h.range_max is not None and h.range_min is not None:
                ranges[key] = (h.range_min, h.range_max)
            if h.last_block_mean is not None:
                rising[key] = h.rising
        return Features(ready, baseline, initial, means, growth, extremes, percentiles, ranges,
                        rising, nonfinite, slopes, records, self.law.fit(), first_records,
                        self.heldout.features(), trends, nonfinite_since, ratios)


class PromptTypeSignals:
    """One prompt type's PROMPT_TYPE_KEYS on one rank: the PROMPT_TYPE_MEANS windows and the
    initial mean, and nothing else (a rank keeps up to max_prompt_types of these; the full
    RankSignals feature set per type would be computed for every render and never published)."""

    # Declared for the saved state, which decodes each field by its type (state_codec.py).
    initial_steps: int
    step: int
    keys: dict[str, KeyHistory]

    def __init__(self, initial_steps: int = INITIAL_STEPS) -> None:
        self.initial_steps = initial_steps
        self.step = 0
        self.keys = {}

    def add(self, step: int, values: dict[str, float]) -> None:
        if self.keys and step < self.step:  # went back: the steps from this one on are undone
            self.rewind(step - 1)
        self.step = step
        for key, value in values.items():
            if not math.isfinite(value):  # counted by the rank, as every by_type NaN
                continue
            h = self.keys.get(key)
            if h is None:
                h = self.keys[key] = KeyHistory(first_step=step, ranged=False)
            h.put(step, value, self.initial_steps)

    def rebaseline(self) -> None:
        for h in self.keys.values():
            h.restart_initial(self.step, self.initial_steps)

    def rewind(self, keep_through: int) -> None:
        """As RankSignals.rewind; ``self.keys`` is left empty when none of the type's steps stand."""
        for key, h in list(self.keys.items()):
            if h.first_step is not None and h.first_step > keep_through:
                del self.keys[key]
            else:
                h.rewind(keep_through, self.initial_steps)
        self.step = max((h.steps[-1] for h in self.keys.values() if h.steps), default=keep_through)

    def means(self) -> list[tuple[str, int, int, float]]:
        """(key, window, offset, mean) of each PROMPT_TYPE_MEANS window the history covers."""
        return [(key, window, offset, mean) for key in self.keys for window, offset in PROMPT_TYPE_MEANS
                if (mean := self.reading(key, "mean", window, offset)) is not None]

    def initial(self) -> dict[str, float]:
        return {key: first for key in self.keys if (first := self.reading(key, "initial")) is not None}

    def reading(self, key: str, feature: str, window: int = 0, offset: int = 0) -> float | None:
        """The type's "mean" of ``key`` over ``window`` steps ``offset`` back
        (grpo_prompt_type_window_mean) or its "initial" mean (grpo_prompt_type_initial_mean),
        as published; None where it is not. The report reads the shortcut card's inputs so."""
        h = self.keys.get(key)
        if h is None:
            return None
        if feature == "initial":
            return h.initial_mean(self.step, self.initial_steps)
        if feature != "mean":
            raise ValueError(f"no prompt-type feature {feature!r}")
        chunk = h.window(self.step, window, offset) if (window, offset) in PROMPT_TYPE_MEANS else None
        return None if chunk is None else sum(chunk) / len(chunk)

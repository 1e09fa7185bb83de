"""The numbers every part of the report reads, in one view of the run (``RunView``).

Quantiles, the report's windows over the logged steps, each signal's logged values (``Track``,
with the step windows the summary's forecast reads), the declared card branches' readings as a
matrix, the cluster's per-rank series and the exporter's entropy-reward law fits.
``RunView`` holds them for one run, each computed on first use, so that the verdicts and the
summary share one reading of the run.

Every threshold is read from grpo_monitor.contract.thresholds at each use (a test patches the table and
reads the run again), never kept here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from grpo_monitor.contract import thresholds as th
from grpo_monitor.contract.cards import RunShape
from grpo_monitor.runtime.forecast import BLOCK_STEPS, LawFit, block_means
from grpo_monitor.runtime.signals import (
    EARLY_WINDOWS,
    HISTORY,
    INITIAL_STEPS,
    LAW_ENTROPY,
    LAW_REWARD,
    PERSISTENCE_RECORDS,
    SLOPE_WINDOWS,
    LawTracker,
    slope,
)
from grpo_monitor.tools.report.declared import ANY_READINGS, TypeTables, table, type_tables
from grpo_monitor.tools.report.load import RunData

# The throughput signals of a rank, the first one it logs read (else 1 / its step time).
THROUGHPUT_KEYS = ("perf/samples_per_s", "perf/tokens_per_s")


# -- quantiles and window medians ----------------------------------------------------------------


def percentile(values: Any, p: float) -> float:
    """Linear-interpolation percentile (numpy's default): idx=(p/100)*(n-1), NaN for no values."""
    xs = np.sort(np.asarray(values, dtype=float))
    if xs.size == 0:
        return math.nan
    idx = p / 100 * (xs.size - 1)
    lo, hi = math.floor(idx), math.ceil(idx)
    w = idx - lo
    return float(xs[lo] * (1 - w) + xs[hi] * w)


def describe(values: Any) -> dict[str, float]:
    """n, p5, p50, p95, p99, mean, stddev (sample, n-1; 0 under 2 values) of the finite values."""
    xs = np.asarray(values, dtype=float)
    xs = xs[np.isfinite(xs)]
    out: dict[str, float] = {"n": int(xs.size)}
    for p in (5, 50, 95, 99):
        out[f"p{p}"] = percentile(xs, p)
    out["mean"] = float(xs.mean()) if xs.size else math.nan
    out["stddev"] = float(xs.std(ddof=1)) if xs.size >= 2 else 0.0
    return out


def median(x: np.ndarray) -> float:
    """The median of the finite values; NaN when there are none."""
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else math.nan


def ratio(a: float, b: float) -> float:
    """a / b as IEEE 754 (and PromQL) has it, where Python's float division raises: +-inf for
    x / 0, NaN for 0 / 0. A KL whose p95 is 0 (no KL term logs zeros) has a tail ratio."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(a) / b)


def rounded(x: float) -> float | None:
    """A number as the report's JSON writes it: six decimals, None for NaN and infinities."""
    return None if not math.isfinite(x) else round(float(x), 6)


def window_size(n_steps: int) -> int:
    return max(th.count("min_window_steps"), min(th.count("baseline_steps"), n_steps // 5))


def windows(steps: list[int], size: int) -> list[tuple[int, int]]:
    """Index ranges [a, b) of consecutive logged steps, ``size`` each (the last one may be short)."""
    return [(a, min(a + size, len(steps))) for a in range(0, len(steps), size)]


# -- a signal's logged values, and its step windows ---------------------------------------------
#
# The cards' verdicts read the exporter's own features (declared.py); the summary's forecast
# section reads a signal's initial mean, window means and slope at every logged step here, by
# the exporter's definitions (a test holds them equal to the exporter's features).


@dataclass(frozen=True)
class Track:
    """One signal as the exporter's step history holds it: its finite values by logged step."""

    steps: np.ndarray  # ascending logged steps
    values: np.ndarray
    run_first: int  # the run's first step: the baseline period starts there, as the exporter's

    def initial(self) -> float:
        """grpo_initial_mean: the mean over the signal's own first INITIAL_STEPS steps."""
        return float(self.values[self.steps < self.steps[0] + INITIAL_STEPS].mean())

    def rolling(self, window: int, stat: str, offset: int = 0) -> np.ndarray:
        """``stat`` ("mean", "p10", "p90") of the values of steps (t - offset - window, t - offset]
        at each step t; NaN while the history does not reach back that far (signals.KeyHistory),
        but for an EARLY_WINDOWS window of offset 0, which covers the run so far. A percentile
        rests on at least PERSISTENCE_RECORDS records, as the exporter's does."""
        ends = self.steps - offset
        starts = ends - window
        lo = np.searchsorted(self.steps, starts, side="right")
        hi = np.searchsorted(self.steps, ends, side="right")
        q = {"p10": 10, "p90": 90}.get(stat)
        full = (self.steps[0] <= starts + 1) & (hi > lo)
        if q is not None:
            lo = np.minimum(lo, hi - PERSISTENCE_RECORDS)
            full &= lo >= 0
        if window in EARLY_WINDOWS and offset == 0:
            # On a run shorter than the window, the window is the run so far, from its
            # PERSISTENCE_RECORDS-th record (signals.KeyHistory.window_points, early=True).
            young = ~full & (hi >= PERSISTENCE_RECORDS) & (hi < HISTORY)
            lo = np.where(young, 0, lo)
            full |= young
        out = np.full(self.steps.size, math.nan)
        for i in np.flatnonzero(full):
            chunk = self.values[lo[i]:hi[i]]
            out[i] = chunk.mean() if q is None else percentile(chunk, q)
        return out

    def slope(self, window: int) -> np.ndarray:
        """grpo_window_slope: the least-squares slope per step of the values of steps
        (t - window, t] at each step t, by the exporter's own function; NaN while the history
        does not reach back that far, or the window holds fewer than two steps."""
        starts = self.steps - window
        lo = np.searchsorted(self.steps, starts, side="right")
        hi = np.arange(1, self.steps.size + 1)
        out = np.full(self.steps.size, math.nan)
        for i in np.flatnonzero(self.steps[0] <= starts + 1):
            trend = slope(self.steps[lo[i]:hi[i]].tolist(), self.values[lo[i]:hi[i]].tolist())
            if trend is not None:
                out[i] = trend
        return out


# -- the cluster: one rank's performance series --------------------------------------------------


@dataclass(frozen=True)
class RankPerf:
    """One rank's performance signals at its logged steps, checkpoint steps left out (a save
    stalls on IO). ``throughput`` is samples/s, else tokens/s, else 1 / step time;
    ``step_time`` its own step time, else 1 / throughput (only ratios of step times are
    compared: seconds per sample, or per token, will do)."""

    rank: int
    steps: list[int]
    throughput: np.ndarray
    throughput_signal: str
    step_time: np.ndarray
    step_time_signal: str


def _rank_perf(rank: int, by_step: dict[int, dict[str, float]], checkpoints: set[int]) -> RankPerf:
    steps = [st for st in sorted(by_step) if st not in checkpoints]
    key = next((k for k in THROUGHPUT_KEYS if any(k in by_step[st] for st in steps)), None)
    throughput = np.array([by_step[st].get(key, math.nan) if key else
                           (1 / by_step[st]["perf/step_time_s"]
                            if by_step[st].get("perf/step_time_s") else math.nan)
                           for st in steps], dtype=float)
    step_time = np.array([by_step[st].get("perf/step_time_s", math.nan) for st in steps],
                         dtype=float)
    own = bool(np.isfinite(step_time).any())  # the rank logs its step time
    if not own and key:
        with np.errstate(divide="ignore"):
            step_time = 1 / throughput
    return RankPerf(rank, steps, throughput, key or "1/perf/step_time_s", step_time,
                    "perf/step_time_s" if own else f"1/{key}")


# -- the entropy-reward law ----------------------------------------------------------------------


def law_blocks(data: RunData) -> tuple[list[int], dict[int, float], dict[int, float], list[int]]:
    """The law's points: the block means of entropy and reward over the steps that logged both
    (the exporter's LawTracker takes the same steps), the block indices in order, and those
    steps."""
    both = [st for st in data.steps
            if math.isfinite(data.train[st].get(LAW_ENTROPY, math.nan))
            and math.isfinite(data.train[st].get(LAW_REWARD, math.nan))]
    entropy = block_means(both, [data.train[st][LAW_ENTROPY] for st in both])
    reward = block_means(both, [data.train[st][LAW_REWARD] for st in both])
    return sorted(entropy), entropy, reward, both


def block_steps(both: list[int], blocks: list[int]) -> list[int]:
    """The first and last logged step of a run of consecutive blocks."""
    inside = [st for st in both if blocks[0] <= st // BLOCK_STEPS <= blocks[-1]]
    return [inside[0], inside[-1]]


@dataclass(frozen=True)
class Ceiling:
    """GRPORewardCeilingNear's inputs at each step of ``track`` (the entropy): the law still
    promises (exp(H 50-step mean) - 1) / (exp(H initial) - 1) of the reward it promised at the
    start (``headroom``), the fit's a, b and R², the entropy's 50-step mean and slope, and
    ``near``: headroom under ceiling_headroom_ratio, R² at least forecast_min_r2, a > 0, entropy
    still falling and not collapsed."""

    track: Track
    headroom: np.ndarray
    entropy_mean: np.ndarray
    entropy_slope: np.ndarray
    a: np.ndarray
    b: np.ndarray
    r_squared: np.ndarray
    near: np.ndarray


# -- the run, as every verdict and the summary read it ------------------------------------------


class RunView:
    """One run's numbers, shared by the verdicts and the summary.

    The report's windows over the logged steps: *base* (the baseline window, the first),
    *reference* (the window after it; the first when the run has fewer than three) and *last*.
    A run shorter than one window (at least min_window_steps) has one short window.
    """

    def __init__(self, data: RunData) -> None:
        self.data = data
        self.steps = data.steps
        n = len(self.steps)
        self.window = window_size(n)
        self.base = slice(0, min(self.window, n))
        self.reference = slice(self.window, 2 * self.window) if n >= 3 * self.window else self.base
        self.last = slice(max(0, n - self.window), n)
        self._series: dict[str, np.ndarray] = {}
        self._tracks: dict[str, Track | None] = {}

    def span(self, part: slice) -> list[int]:
        """The first and last logged step of a window (the run has at least one step)."""
        return [self.steps[part.start], self.steps[part.stop - 1]]

    @property
    def whole(self) -> list[int]:
        return [self.steps[0], self.steps[-1]]

    def series(self, key: str) -> np.ndarray:
        """``key`` at each logged step of rank 0, NaN where not logged."""
        if key not in self._series:
            self._series[key] = self.data.series(key)
        return self._series[key]

    def has(self, key: str) -> bool:
        """Whether rank 0 logged a finite ``key`` at some step."""
        return bool(np.isfinite(self.series(key)).any())

    def median(self, key: str, part: slice) -> float:
        """``key``'s median over a window (NaN when it has no finite value there)."""
        return median(self.series(key)[part])

    def gain(self, key: str) -> float:
        """``key``'s median over the last window less its median over the reference window."""
        return self.median(key, self.last) - self.median(key, self.reference)

    def track(self, key: str) -> Track | None:
        """``key``'s finite values by logged step; None when it has none."""
        if key not in self._tracks:
            xs = self.series(key)
            keep = np.isfinite(xs)
            self._tracks[key] = (Track(np.asarray(self.steps)[keep], xs[keep], self.steps[0])
                                 if keep.any() else None)
        return self._tracks[key]

    @cached_property
    def readings(self) -> np.ndarray:
        """The declared branches' readings of rank 0's steps (declared.table)."""
        return table(self.steps, self.data.readings)

    @cached_property
    def type_readings(self) -> TypeTables:
        """Each prompt type's readings of rank 0's steps (declared.type_tables)."""
        return type_tables(self.steps, self.data.type_readings)

    @cached_property
    def any_readings(self) -> TypeTables:
        """The readings of any key that had one (its NaN / Inf count), each key's of rank 0's
        steps (declared.type_tables of ANY_READINGS)."""
        return type_tables(self.steps, self.data.any_readings, ANY_READINGS)

    @cached_property
    def checkpoint_steps(self) -> set[int]:
        return {e["step"] for e in self.data.events if e["type"] == "checkpoint_save"}

    @cached_property
    def ranks(self) -> list[RankPerf]:
        """Every rank that logged performance signals, by rank."""
        return [_rank_perf(rank, by_step, self.checkpoint_steps)
                for rank, by_step in sorted(self.data.perf.items())]

    @cached_property
    def law_fits(self) -> list[LawFit | None]:
        """The exporter's entropy-reward law fit (signals.LawTracker: 10-step block means, a
        block counted once a later one starts) as it stood after each logged step of rank 0."""
        law, out = LawTracker(), []
        for st in self.steps:
            law.add(st, self.data.train[st])
            out.append(law.fit())
        return out

    @cached_property
    def ceiling(self) -> Ceiling | None:
        """GRPORewardCeilingNear's inputs at each step that logged entropy; None when the run
        logs no entropy, or its initial entropy is not positive."""
        tr = self.track(LAW_ENTROPY)
        if tr is None or not tr.initial() > 0:
            return None
        fits = self.law_fits
        at = np.searchsorted(np.asarray(self.steps), tr.steps)
        law = {name: np.array([getattr(fits[i], name) if fits[i] is not None else math.nan
                               for i in at], dtype=float)
               for name in ("a", "b", "r_squared")}
        mean, trend = tr.rolling(th.count("sustain_steps"), "mean"), tr.slope(SLOPE_WINDOWS[0])
        # A collapsed entropy (the red card's own test) has no ceiling left to forecast.
        collapsed = tr.rolling(th.count("early_window_steps"), "p90") < \
            tr.initial() * th.value("entropy_collapse_ratio")
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            headroom = (np.exp(mean) - 1) / (np.exp(tr.initial()) - 1)
            near = ((headroom < th.value("ceiling_headroom_ratio"))
                    & (law["r_squared"] >= th.value("forecast_min_r2")) & (law["a"] > 0)
                    & (trend < 0) & ~collapsed)
        return Ceiling(tr, headroom, mean, trend, law["a"], law["b"], law["r_squared"], near)


def run_shape(view: RunView) -> RunShape:
    """The run as the card declarations read it (contract/cards.py): the keys rank 0 logged (and
    the ranks logging each perf key), its ranks, the steps it lacks for a baseline, its prompt
    types. The folder says nothing of GPUs: the GPU cards count as not applicable."""
    data, steps = view.data, view.steps
    key_ranks = {key: 1 for m in data.train.values() for key in m}
    for per_step in data.perf.values():  # perf/* keys: every rank that logged one
        for key in {k for m in per_step.values() for k in m}:
            key_ranks[key] = key_ranks.get(key, 0) + 1
    types = {t for m in data.by_type.values() for t in m}
    baseline = th.count("baseline_steps")
    to_go = max(0, steps[0] + baseline - steps[-1]) if steps else baseline
    ended = any(e.get("type") == "run_end" for e in data.events)
    return RunShape(key_ranks=key_ranks, ranks=len(set(data.perf) | {0}),
                    baseline_steps_to_go=to_go, prompt_types=len(types), ended=ended)

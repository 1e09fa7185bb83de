"""Step-window features of each rank's signals: baselines, windows, rising streaks.

The seeds state their cards in steps ("the first 200 steps are the baseline", "below 0.1x for
50 consecutive steps", "+20% per 100 steps, sustained 300 steps"), while Prometheus' ``for:``
counts wall time and a scrape sees one step in many. So the exporter keeps a short per-rank step
history and publishes features over it; the rule files compare them to the thresholds (which
live there, never here). A run replayed at 5 s or at 5 min per step yields the same features.

Feature menu (docs/signals.md): baseline mean/stddev over the baseline period; window mean over
the last N steps, also shifted back by an offset; growth per 100 steps; window
min/max (a max below x for N steps = "below x for N consecutive steps"); the count of
consecutive rising window means; non-finite values within a window.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

# (window_steps, offset_steps) pairs published as grpo_window_mean.
TRAINING_MEANS: tuple[tuple[int, int], ...] = (
    (50, 0), (50, 200), (100, 0), (100, 100), (100, 200), (100, 300), (200, 0))
TRAINING_EXTREMES: tuple[int, ...] = (50, 100, 200)  # grpo_window_min / grpo_window_max
# Performance signals are logged by every rank: a smaller menu keeps 1024 ranks affordable.
PERF_MEANS: tuple[tuple[int, int], ...] = ((50, 0),)
PERF_EXTREMES: tuple[int, ...] = (50,)
GROWTH_WINDOW = 100  # grpo_window_growth_ratio: mean(100 @ o) / mean(100 @ o+100) - 1
GROWTH_OFFSETS: tuple[int, ...] = (0, 100, 200)
RISING_WINDOW = 100  # grpo_rising_windows: streak of rising 100-step means
NONFINITE_WINDOW = 50  # grpo_window_nonfinite
HISTORY = max(w + o for w, o in TRAINING_MEANS)  # steps kept per key
# Events whose steps are left out of the performance windows and baselines: a checkpoint save
# stalls the step (seed 000 §4.5: filter the save's IO spike before judging throughput).
PAUSE_EVENTS = ("checkpoint_save", "checkpoint", "eval")


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
        self.m2 += d * (x - self.mean)

    @property
    def stddev(self) -> float:
        return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else 0.0


@dataclass
class KeyHistory:
    values: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    nonfinite_steps: deque[int] = field(default_factory=deque)  # steps with a NaN / Inf
    baseline: Welford = field(default_factory=Welford)
    rising: int = 0  # consecutive rising RISING_WINDOW means, judged at each window boundary
    last_block_mean: float | None = None
    since_block: int = 0


@dataclass
class Features:
    """What one rank publishes, ready for the exposition."""

    ready: bool
    baseline: dict[str, tuple[float, float]]  # key -> (mean, stddev)
    means: list[tuple[str, int, int, float]]  # key, window, offset, mean
    growth: list[tuple[str, int, float]]  # key, offset, growth ratio over GROWTH_WINDOW
    extremes: list[tuple[str, int, float, float]]  # key, window, min, max
    rising: dict[str, int]
    nonfinite: dict[str, int]


class RankSignals:
    """The step history of one (run, rank) and the features derived from it."""

    def __init__(self, baseline_steps: int) -> None:
        self.baseline_steps = baseline_steps
        self.first_step: int | None = None
        self.baseline_from: int | None = None  # first step of the current baseline period
        self.step = 0
        self.keys: dict[str, KeyHistory] = {}

    @property
    def ready(self) -> bool:
        return self.baseline_from is not None and self.step >= self.baseline_from + self.baseline_steps

    def add(self, step: int, values: dict[str, float], paused: bool) -> None:
        """One step's canonical values; ``paused``: a checkpoint save or the like happened."""
        if self.first_step is None:
            self.first_step = self.baseline_from = step
        self.step = step
        in_baseline = not self.ready
        for key, value in values.items():
            h = self.keys.get(key)
            if h is None:
                h = self.keys[key] = KeyHistory()
            if not math.isfinite(value):
                h.nonfinite_steps.append(step)
                continue
            if paused and is_perf(key):
                continue
            h.values.append(value)
            if in_baseline:
                h.baseline.add(value)
            self._advance_rising(h)
        for h in self.keys.values():
            while h.nonfinite_steps and h.nonfinite_steps[0] <= step - NONFINITE_WINDOW:
                h.nonfinite_steps.popleft()

    @staticmethod
    def _advance_rising(h: KeyHistory) -> None:
        h.since_block += 1
        if h.since_block < RISING_WINDOW or len(h.values) < RISING_WINDOW:
            return
        h.since_block = 0
        mean = sum(list(h.values)[-RISING_WINDOW:]) / RISING_WINDOW
        if h.last_block_mean is not None:
            h.rising = h.rising + 1 if mean > h.last_block_mean else 0
        h.last_block_mean = mean

    def rebaseline(self, steps: int) -> None:
        """The last ``steps`` values become the baseline (seed 000 §3.3: recalibrate at ~2000)."""
        self.baseline_steps = steps
        self.baseline_from = self.step - steps
        for h in self.keys.values():
            h.baseline = Welford()
            for v in list(h.values)[-steps:]:
                h.baseline.add(v)

    def features(self) -> Features:
        ready = self.ready
        baseline: dict[str, tuple[float, float]] = {}
        means: list[tuple[str, int, int, float]] = []
        growth: list[tuple[str, int, float]] = []
        extremes: list[tuple[str, int, float, float]] = []
        rising: dict[str, int] = {}
        nonfinite: dict[str, int] = {}
        for key, h in self.keys.items():
            nonfinite[key] = len(h.nonfinite_steps)
            if ready and h.baseline.n:
                baseline[key] = (h.baseline.mean, h.baseline.stddev)
            vals = list(h.values)
            n = len(vals)
            perf = is_perf(key)
            by_window: dict[tuple[int, int], float] = {}
            for window, offset in PERF_MEANS if perf else TRAINING_MEANS:
                if n >= window + offset:
                    chunk = vals[n - offset - window:n - offset]
                    by_window[window, offset] = mean = sum(chunk) / window
                    means.append((key, window, offset, mean))
            for offset in () if perf else GROWTH_OFFSETS:
                now, before = by_window.get((GROWTH_WINDOW, offset)), by_window.get(
                    (GROWTH_WINDOW, offset + GROWTH_WINDOW))
                if now is not None and before:
                    growth.append((key, offset, now / before - 1))
            for window in PERF_EXTREMES if perf else TRAINING_EXTREMES:
                if n >= window:
                    chunk = vals[-window:]
                    extremes.append((key, window, min(chunk), max(chunk)))
            if not perf:
                rising[key] = h.rising
        return Features(ready, baseline, means, growth, extremes, rising, nonfinite)

"""A robust trend over a signal's last records: the Mann–Kendall test and Theil's slope.

A sickness that builds steadily (entropy or length doubling over thirty records, rising on nearly
every one; a rollout mismatch creeping up) passes no "multiple of the initial value in 90% of a
window" test until it is far along, and in a run's first records there is no baseline or initial
value that the climb itself has not already moved. What does show it at once is its steadiness:
values that rise on nearly every record, whatever their scale.

* **Mann–Kendall** (Mann 1945, Kendall 1975): S = the number of record pairs that rise in time
  order less the pairs that fall; under "no trend" S is about normal with variance
  n(n-1)(2n+5)/18 (less a term for tied values), so Z = (S -/+ 1) / sd(S) says how steady a climb
  or a fall is in units everyone reads (|Z| >= 3: p < 0.0013 one-sided). Rank-based: one outlier,
  a spike or a NaN left out moves it by at most n-1 pairs, and a signal's scale is irrelevant.
* **Theil's slope** (Theil 1950, the "incomplete" method): the median of the slopes between each
  record of the window's first half and its partner half a window later. Half the pairs of Sen's
  all-pairs median, the same 29% breakdown point, and O(n log n) instead of O(n^2 log n). The
  line through the median of (value - slope x step) gives the window's fitted start and end, and
  their ratio the *factor* the signal moved by (published only where both are positive).

Windows are counted in records, not steps (a trainer logging every 10th step has its 30 records
in 300 steps), so the same card judges both, from TREND_MIN_RECORDS records on. Standard library
only; runtime/signals.py publishes it for the keys a card's trend branch reads.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Sequence
from dataclasses import dataclass

# The records a trend is judged over: the run's first few dozen, then a sliding window as long.
TREND_RECORDS = 30
# The fewest records a trend is published from: with 8 records a perfectly monotone climb has
# Z = 3.34, so |Z| >= 3 is reachable; with fewer, no verdict at that level is possible.
TREND_MIN_RECORDS = 8


@dataclass(frozen=True)
class Trend:
    """The trend of one signal over its last ``records`` records."""

    records: int
    z: float  # Mann–Kendall's Z: > 0 rising, < 0 falling; |Z| >= 3 is a steady move
    slope: float  # Theil's slope, per step
    start: float  # the fitted value at the window's first record
    end: float  # ... and at its last

    @property
    def factor(self) -> float | None:
        """end / start where both are positive: how many times the signal moved over the window."""
        if self.start > 0 and self.end > 0:
            return self.end / self.start
        return None


def mann_kendall_z(values: Sequence[float]) -> float:
    """Mann–Kendall's Z of values in time order, with the tie correction of the variance and
    the continuity correction of S; 0.0 where every value is equal."""
    n = len(values)
    # S from the back: for each value, the later values above it less those below it, counted by
    # bisection in the sorted later values (O(n log n) in C, not n(n-1)/2 Python comparisons).
    s = 0
    later: list[float] = []
    for a in reversed(values):
        s += len(later) - bisect_right(later, a) - bisect_left(later, a)
        insort(later, a)
    ties: dict[float, int] = {}
    for v in values:
        ties[v] = ties.get(v, 0) + 1
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values() if t > 1)) / 18
    if var <= 0 or s == 0:
        return 0.0
    return (s - 1 if s > 0 else s + 1) / math.sqrt(var)


def _median(xs: list[float]) -> float:
    xs.sort()
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def theil_slope(steps: Sequence[int], values: Sequence[float]) -> float | None:
    """Theil's incomplete slope: the median slope between record i and record i + n//2."""
    n = len(values)
    half = n // 2
    slopes = [(values[i + half] - values[i]) / (steps[i + half] - steps[i])
              for i in range(n - half) if steps[i + half] != steps[i]]
    return _median(slopes) if slopes else None


def trend_of(steps: Sequence[int], values: Sequence[float]) -> Trend | None:
    """The trend of the last TREND_RECORDS records; None below TREND_MIN_RECORDS of them."""
    steps, values = steps[-TREND_RECORDS:], values[-TREND_RECORDS:]
    if len(values) < TREND_MIN_RECORDS:
        return None
    b = theil_slope(steps, values)
    if b is None:
        return None
    a = _median([v - b * s for s, v in zip(steps, values)])
    return Trend(len(values), mann_kendall_z(values), b, a + b * steps[0], a + b * steps[-1])

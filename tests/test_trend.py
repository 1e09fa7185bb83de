"""The trend of a signal's last records: Mann–Kendall's Z, Theil's slope, the factor it moved by.

Checked against the textbook definitions computed the slow way (every pair), on shapes whose
answer is known: a steady climb, a flat line with one spike, ties, too few records; then through
the exporter: the keys a trend card reads get grpo_trend_* series, no other key does, and a
rewind leaves the trend of the surviving records; and a slow mismatch ramp reaches its card
through the real rules while it ramps.
"""

from __future__ import annotations

import math
import random
from itertools import combinations
from pathlib import Path

import pytest

from grpo_monitor.runtime.signals import TREND_KEYS, RankSignals
from grpo_monitor.tools.simulate import SCENARIOS
from grpo_monitor.runtime.trend import (
    TREND_MIN_RECORDS,
    TREND_RECORDS,
    mann_kendall_z,
    theil_slope,
    trend_of,
)
from promtool_harness import Check, check_cards, play, scrape_index_at


def slow_z(xs: list[float]) -> float:
    """Mann–Kendall's Z from its definition: S over every pair, the tie-corrected variance."""
    n = len(xs)
    s = sum((b > a) - (b < a) for a, b in combinations(xs, 2))
    groups = [xs.count(v) for v in set(xs)]
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in groups)) / 18
    if s == 0 or var <= 0:
        return 0.0
    return (s - math.copysign(1, s)) / math.sqrt(var)


def test_z_is_the_textbook_statistic_on_random_series() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(2, 40)
        xs = [float(rng.choice([0, 1, 2, 3])) if rng.random() < 0.3 else rng.gauss(0, 1) for _ in range(n)]
        assert mann_kendall_z(xs) == pytest.approx(slow_z(xs))


def test_a_monotone_climb_of_8_records_is_steady_and_a_flat_line_is_not() -> None:
    assert mann_kendall_z([float(i) for i in range(8)]) == pytest.approx(27 / math.sqrt(8 * 7 * 21 / 18))
    assert mann_kendall_z([float(i) for i in range(8)]) > 3
    assert mann_kendall_z([-float(i) for i in range(8)]) < -3
    assert mann_kendall_z([0.0] * 20) == 0.0  # every value tied: no trend, no division by zero
    # One spike in a flat series moves S by at most n - 1 pairs: far from steady.
    assert abs(mann_kendall_z([1.0] * 10 + [50.0] + [1.0] * 10)) < 1


def test_theil_slope_is_robust_to_an_outlier() -> None:
    steps = list(range(0, 40, 2))
    values = [3.0 + 0.5 * s for s in steps]
    assert theil_slope(steps, values) == pytest.approx(0.5)
    values[5] = 1e6  # one wild record
    assert theil_slope(steps, values) == pytest.approx(0.5)
    assert theil_slope([5, 5, 5], [1.0, 2.0, 3.0]) is None  # no two steps apart


def test_trend_of_a_quadrupling_over_30_steps() -> None:
    # 0.5 -> 2.0 over 30 records, one step apart, with noise that never reverses the climb.
    steps = list(range(1, 31))
    values = [0.5 + 1.5 * (s - 1) / 29 + (0.01 if s % 2 else -0.01) for s in steps]
    t = trend_of(steps, values)
    assert t is not None and t.records == 30
    assert t.z > 6
    assert t.factor == pytest.approx(4.0, rel=0.05)
    assert t.slope == pytest.approx(1.5 / 29, rel=0.05)


def test_trend_reads_the_last_records_and_needs_enough_of_them() -> None:
    assert trend_of(list(range(TREND_MIN_RECORDS - 1)), [1.0] * (TREND_MIN_RECORDS - 1)) is None
    steps = list(range(100))
    values = [100.0 - s for s in range(70)] + [float(s) for s in range(30)]  # fell, then rose
    t = trend_of(steps, values)
    assert t is not None and t.records == TREND_RECORDS and t.z > 0  # the last 30: rising
    down = trend_of([1, 2, 3, 4, 5, 6, 7, 8], [8.0, 7, 6, 5, 4, 3, 2, 1])
    assert down is not None and down.z < -3 and down.factor == pytest.approx(1 / 8)
    crossing = trend_of(list(range(10)), [s - 5.0 for s in range(10)])
    assert crossing is not None and crossing.factor is None  # starts below 0: no factor


def test_the_exporter_publishes_a_trend_for_the_keys_a_trend_card_reads() -> None:
    assert {"reward/mean", "entropy/mean", "response/len_mean", "mismatch/kl"} <= TREND_KEYS
    assert "loss" not in TREND_KEYS and "perf/step_time_s" not in TREND_KEYS
    sig = RankSignals(baseline_steps=200)
    for s in range(1, 41):
        sig.add(s, {"response/len_mean": 100.0 + 10 * s, "loss": float(s)}, False)
    f = sig.features()
    assert set(f.trends) == {"response/len_mean"}
    t = f.trends["response/len_mean"]
    assert t.records == TREND_RECORDS and t.slope == pytest.approx(10.0)
    assert t.factor == pytest.approx((100 + 400) / (100 + 110))  # steps 11..40
    # A rewind to step 20: the trend of steps 1..20, as a fresh read of them gives.
    sig.rewind(20)
    again = RankSignals(baseline_steps=200)
    for s in range(1, 21):
        again.add(s, {"response/len_mean": 100.0 + 10 * s, "loss": float(s)}, False)
    assert sig.features().trends == again.features().trends


def test_a_slow_mismatch_ramp_is_caught_while_it_ramps(tmp_path: Path) -> None:
    # simulate's mismatch_rising: KL 0.002 climbing by 5e-5 a step from step 800, twice its
    # start at step 840. The level rule (90% of 50 steps over twice the start) needs until step
    # 885; the trend rule fires within 50 steps of the onset, and not before it.
    sc = SCENARIOS["mismatch_rising"]
    played = play("mismatch_rising", scrape_every=1, ranks=1)
    only = ',alertname="GRPORolloutMismatchRising"'
    check_cards(played, [Check(scrape_index_at(played, sc.onset), set(), only=only),
                         Check(scrape_index_at(played, sc.onset + 50), {"GRPORolloutMismatchRising"},
                               only=only)], tmp_path)

"""The entropy-reward law (forecast.py), its online fit per rank, the window slope and the prompt
types' windows, up to a real scrape that promtool accepts."""

from __future__ import annotations

import json
import math
import random
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from conftest import Running, value
from grpo_monitor.runtime.forecast import (
    BLOCK_STEPS,
    MIN_BLOCKS,
    block_means,
    fit_law,
    score_forecast,
)
from grpo_monitor.runtime.signals import RankSignals


def law(h: float, a: float = 0.4, b: float = 1.5) -> float:
    return b - a * math.exp(h)


def test_the_fit_recovers_the_law_and_its_ceiling() -> None:
    entropy = [1.2 - 0.1 * i for i in range(10)]
    fit = fit_law(entropy, [law(h) for h in entropy])
    assert fit is not None
    assert (fit.a, fit.b) == (pytest.approx(0.4), pytest.approx(1.5))
    assert fit.ceiling == pytest.approx(1.1)
    assert fit.r_squared == pytest.approx(1.0)
    assert fit.points == 10
    assert fit.predict(0.5) == pytest.approx(law(0.5))


def test_no_fit_without_enough_points_or_without_a_spread_in_entropy() -> None:
    assert fit_law([1.0, 0.9, 0.8, 0.7], [0.1, 0.2, 0.3, 0.4]) is None  # MIN_BLOCKS - 1 points
    assert fit_law([0.7] * 8, [0.1 * i for i in range(8)]) is None
    # An entropy that sits still (a 7% spread) fits noise, however well: no law.
    assert fit_law([0.083 - 0.001 * i for i in range(7)], [0.01 * i for i in range(7)]) is None
    # Non-finite points are left out, not propagated.
    fit = fit_law([1.0, 0.9, math.nan, 0.8, 0.7, 0.6], [law(h) for h in (1.0, 0.9, 0.5, 0.8, 0.7, 0.6)])
    assert fit is not None and fit.points == MIN_BLOCKS and fit.a == pytest.approx(0.4)


def test_noise_unrelated_to_entropy_gives_a_poor_fit() -> None:
    rng = random.Random(0)
    entropy = [1.0 - 0.01 * i for i in range(50)]
    fit = fit_law(entropy, [rng.random() for _ in entropy])
    assert fit is not None and fit.r_squared < 0.2


def test_block_means_average_each_block_of_steps() -> None:
    steps = [1, 2, 9, 10, 11, 25]
    assert block_means(steps, [1.0, 2.0, 3.0, 10.0, math.nan, 7.0]) == {0: 2.0, 1: 10.0, 2: 7.0}


def test_a_forecast_cut_counts_blocks_and_scores_the_later_ones() -> None:
    # A run logged from step 400 on: half of it is its first 10 blocks, whatever its step numbers.
    blocks = range(40, 60)
    entropy = {b: 1.2 - 0.04 * (b - 40) for b in blocks}
    reward = {b: law(entropy[b]) for b in blocks}
    score = score_forecast(entropy, reward, len(blocks) // 2)
    assert score.fit_blocks == tuple(range(40, 50)) and score.forecast_blocks == tuple(range(50, 60))
    assert score.fit is not None and score.fit.a == pytest.approx(0.4)
    assert score.scored == score.forecast_blocks
    assert score.mae == pytest.approx(0.0, abs=1e-9)
    # Holding block 49's reward flat misses every later block by what the law gained since.
    assert score.flat_mae == pytest.approx(sum(reward[b] - reward[49] for b in range(50, 60)) / 10)
    assert score.reward_range == pytest.approx(reward[59] - reward[40])
    assert score.mae_pct_of_range == pytest.approx(0.0, abs=1e-6)


def test_a_forecast_skips_an_absurd_entropy_and_needs_a_fit() -> None:
    entropy = {b: 1.2 - 0.05 * b for b in range(12)}
    reward = {b: law(h) for b, h in entropy.items()}
    entropy[10] = 800.0  # exp() overflows: no prediction, no score
    score = score_forecast(entropy, reward, 8)
    assert score.scored == (8, 9, 11) and len(score.errors) == len(score.flat_errors) == 3
    # Fewer blocks than a fit needs: nothing scored, and an unknown error rather than zero.
    short = score_forecast(entropy, reward, MIN_BLOCKS - 1)
    assert short.fit is None and short.scored == () and math.isnan(short.mae)
    # A reward that never moved has no range to express the error in.
    flat = score_forecast(entropy, dict.fromkeys(entropy, 0.5), 8)
    assert flat.reward_range == 0 and flat.mae_pct_of_range is None


def test_the_rank_fits_its_block_means_as_the_steps_arrive() -> None:
    rng = random.Random(1)
    sig = RankSignals(baseline_steps=200)
    steps, ent, rew = [], [], []
    for step in range(1, 101):
        h = 1.5 * math.exp(-step / 60)
        r = law(h) + rng.gauss(0, 0.05)  # batch noise around the law
        sig.add(step, {"entropy/mean": h, "reward/mean": r}, False)
        steps.append(step), ent.append(h), rew.append(r)
    # A rewritten step replaces the first record of it, and does not count twice.
    sig.add(100, {"entropy/mean": ent[-1], "reward/mean": rew[-1]}, False)
    sig.add(110, {"entropy/mean": 0.3, "reward/mean": law(0.3)}, False)  # opens block 11
    live = sig.features().law
    hb, rb = block_means(steps, ent), block_means(steps, rew)
    offline = fit_law([hb[b] for b in sorted(hb)], [rb[b] for b in sorted(rb)])
    assert live is not None and offline is not None
    assert live.points == offline.points == 100 // BLOCK_STEPS + 1  # blocks 0..10; 11 is open
    assert (live.a, live.b, live.r_squared) == (pytest.approx(offline.a), pytest.approx(offline.b),
                                                pytest.approx(offline.r_squared))
    assert live.a == pytest.approx(0.4, rel=0.1) and live.r_squared > 0.95
    # A resume to an earlier step undoes the blocks after it (docs/signals.md#a-runs-timeline):
    # the fit is that of steps 1..49, blocks 0..4, with step 50 opening block 5.
    sig.add(50, {"entropy/mean": 0.8, "reward/mean": law(0.8)}, False)
    resumed = sig.features().law
    hb, rb = block_means(steps[:49], ent[:49]), block_means(steps[:49], rew[:49])
    kept = fit_law([hb[b] for b in sorted(hb)], [rb[b] for b in sorted(rb)])
    assert resumed is not None and kept is not None and resumed.points == kept.points == 5
    assert (resumed.a, resumed.b) == (pytest.approx(kept.a), pytest.approx(kept.b))


def test_the_window_slope_is_the_trend_per_step() -> None:
    sig = RankSignals(baseline_steps=200)
    for step in range(1, 81):
        sig.add(step, {"mismatch/kl": 0.01 + 0.0005 * step, "perf/step_time_s": float(step)}, False)
    slopes = {(k, w): v for k, w, v in sig.features().slopes}
    assert slopes == {("mismatch/kl", 50): pytest.approx(0.0005)}  # no slope for perf keys


def test_a_scrape_carries_the_forecast_the_slope_and_the_prompt_types(
        exporter: Running, snapshot_dir: Path) -> None:
    lines = []
    for step in range(1, 61):
        h = 1.2 - 0.015 * step
        typed = {"easy": {"reward/mean": 0.5 + 0.005 * step}, "hard": {"reward/mean": 0.4 - 0.004 * step}}
        lines.append(json.dumps({"step": step, "time": 1_700_000_000 + step,
                                 "metrics": {"entropy/mean": h, "reward/mean": law(h)},
                                 "by_type": typed}))
    (snapshot_dir / "run-a").mkdir()
    (snapshot_dir / "run-a" / "rank-0.jsonl").write_text("\n".join(lines) + "\n")
    exporter.wait_value("grpo_step", 60, run="run-a", rank="0")
    samples = exporter.scrape()
    base = {"run": "run-a", "rank": "0"}
    # Block means: the mean reward of a block is the law at the mean of exp(H), not at exp of
    # the mean H, so the fit is the law's to within a part in a thousand here.
    assert value(samples, "grpo_forecast_law_scale", **base) == pytest.approx(0.4, rel=1e-3)
    assert value(samples, "grpo_forecast_law_offset", **base) == pytest.approx(1.5, rel=1e-3)
    assert value(samples, "grpo_forecast_reward_ceiling", **base) == pytest.approx(1.1, rel=1e-3)
    assert value(samples, "grpo_forecast_fit_r_squared", **base) == pytest.approx(1.0, abs=1e-6)
    assert value(samples, "grpo_forecast_fit_points", **base) == 6  # blocks 0..5 closed, 6 open
    assert value(samples, "grpo_window_slope", **base, key="entropy/mean",
                 window_steps="50") == pytest.approx(-0.015)
    easy = {**base, "prompt_type": "easy", "key": "reward/mean"}
    hard = {**base, "prompt_type": "hard", "key": "reward/mean"}
    assert value(samples, "grpo_prompt_type_window_mean", **easy, window_steps="50",
                 offset_steps="0") == pytest.approx(0.5 + 0.005 * 35.5)  # steps 11..60
    assert value(samples, "grpo_prompt_type_initial_mean", **hard) == pytest.approx(0.4 - 0.004 * 5.5)
    # The families follow Prometheus' conventions.
    text = requests.get(f"{exporter.url}/metrics", timeout=5).text
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), check


@pytest.mark.parametrize("bad", [math.inf, 1e308])
def test_an_absurd_entropy_never_breaks_the_fit(start_exporter: Callable[..., Running],
                                                snapshot_dir: Path, bad: float) -> None:
    exporter = start_exporter()
    lines = [json.dumps({"step": s, "metrics": {"entropy/mean": 1.0 - 0.01 * s if s != 25 else bad,
                                                 "reward/mean": law(1.0 - 0.01 * s)}})
             for s in range(1, 61)]
    (snapshot_dir / "r").mkdir()
    (snapshot_dir / "r" / "rank-0.jsonl").write_text("\n".join(lines) + "\n")
    exporter.wait_value("grpo_step", 60, run="r", rank="0")
    assert value(exporter.scrape(), "grpo_forecast_law_scale", run="r", rank="0") == pytest.approx(0.4, rel=1e-3)

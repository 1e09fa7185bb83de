"""The newer cards on the real GRPO loop of ``grpo-monitor train-demo``.

Each test trains the ~5k-parameter GRU for real with one knob switched on at ``ONSET``, plays its
snapshots through the exporter's ingest and store (scraped every 10 steps, as in
tests/test_train_demo.py) and evaluates the project's rule files with promtool. It asserts the
signal the knob moves, and the step at which the card first fires. That the healthy default run
raises none of these cards (300 steps, and 600 steps on five seeds) is asserted by
tests/test_train_demo.py, whose cards must stay within its tolerated sets.

The new cards compare with a signal's initial mean (its first 10 steps) or with absolute levels,
so a 50-step healthy start is enough: no 200-step baseline is needed.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from promtool_harness import Played, fired_at
from test_train_demo import train_recorded

from grpo_monitor.contract import thresholds
from grpo_monitor.runtime.forecast import block_means, fit_law
from grpo_monitor.tools.train_demo import Config, StepResult, train

ONSET = 50
# Steps between the onset and the card that every test allows: two 20-step windows of the
# "in 90% of the last 20 steps" cards, and a scrape every 10 steps.
WITHIN = 50


def first_firing(played: Played, tmp: Path) -> dict[str, int]:
    """Each card that fired, with the step of the first scrape at which promtool had it firing."""
    first: dict[str, int] = {}
    for step, firing in zip(played.scrape_steps, fired_at(played, tmp, stale_markers=False)):
        for card, _ in firing:
            first.setdefault(card, step)
    return first


def mean(results: list[StepResult], key: str, lo: int, hi: int) -> float:
    """Mean of ``key`` over steps [lo, hi)."""
    return statistics.fmean(r.metrics[key] for r in results if lo <= r.step < hi and key in r.metrics)


def type_mean(results: list[StepResult], prompt_type: str, lo: int, hi: int) -> float:
    return statistics.fmean(r.by_type[prompt_type]["reward/mean"] for r in results
                            if lo <= r.step < hi and prompt_type in r.by_type)


Run = tuple[list[StepResult], dict[str, int]]


def _play(tmp_path_factory: pytest.TempPathFactory, name: str, **knobs: object) -> Run:
    tmp = tmp_path_factory.mktemp(name)
    results, played = train_recorded(Config(step_seconds=0.0, snapshot_dir=tmp, run=name, onset=ONSET, **knobs))
    return results, first_firing(played, tmp)


@pytest.fixture(scope="module")
def mismatch_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _play(tmp_path_factory, "mismatch", steps=ONSET + 50, rollout_temperature=2.0)


@pytest.fixture(scope="module")
def lag_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _play(tmp_path_factory, "lag", steps=ONSET + 70, rollout_lag=2, rollout_lag_growth=5)


def test_rollout_temperature_mismatch(mismatch_run: Run) -> None:
    results, fired = mismatch_run
    # Before the onset the rollout side samples with the trainer's own fp32 weights: the token
    # log-probs agree to float rounding (step by step against one pass over the sequence).
    assert mean(results, "mismatch/logprob_diff_max", 1, ONSET) < 1e-5
    kl = mean(results, "mismatch/kl", ONSET + 10, ONSET + 50)
    assert kl > thresholds.value("mismatch_kl"), kl
    assert mean(results, "mismatch/k3_kl", ONSET + 10, ONSET + 50) > 0.1
    assert mean(results, "mismatch/is_ess_ratio", ONSET + 10, ONSET + 50) < 0.95
    assert fired.get("GRPORolloutMismatch", 10**9) <= ONSET + WITHIN, fired


def test_bf16_rollouts_mismatch_a_little(tmp_path: Path) -> None:
    # Signal only: a bf16 rollout side differs from the fp32 trainer by rounding, as a real
    # engine does, far below any card.
    results = train(Config(step_seconds=0.0, snapshot_dir=tmp_path, run="bf16", steps=ONSET + 20, onset=ONSET,
                           rollout_precision="bf16"))
    assert mean(results, "mismatch/logprob_diff_mean", 1, ONSET) < 1e-6
    diff = mean(results, "mismatch/logprob_diff_mean", ONSET, ONSET + 20)
    assert 1e-4 < diff < 0.05, diff
    assert abs(mean(results, "mismatch/kl", ONSET, ONSET + 20)) < 0.01 * thresholds.value("mismatch_kl")
    assert mean(results, "mismatch/is_ess_ratio", ONSET, ONSET + 20) > 0.99


def test_growing_rollout_lag_is_stale_and_mismatch_rises(lag_run: Run) -> None:
    results, fired = lag_run
    # The lag is 2 policy versions from the onset, one more every 5 steps.
    assert [r.metrics["staleness/mean"] for r in results if r.step in (ONSET - 1, ONSET, ONSET + 5, ONSET + 30)] \
        == [0.0, 2.0, 3.0, 8.0]
    early = mean(results, "mismatch/kl", ONSET, ONSET + 10)
    late = mean(results, "mismatch/kl", ONSET + 50, ONSET + 70)
    assert late > 2 * early > 0, (early, late)
    assert fired.get("GRPOStaleRollouts", 10**9) <= ONSET + WITHIN, fired
    # The rising card compares 50-step windows: it cannot fire before 50 steps of the rise.
    assert fired.get("GRPORolloutMismatchRising", 10**9) <= ONSET + WITHIN + 10, fired


def test_hard_prompts_are_all_wrong(tmp_path_factory: pytest.TempPathFactory) -> None:
    results, fired = _play(tmp_path_factory, "hard", steps=ONSET + 40, difficulty="hard")
    assert mean(results, "group/all_wrong_frac", 1, ONSET) < 0.35
    assert mean(results, "group/all_wrong_frac", ONSET, ONSET + 40) > 0.95
    assert fired.get("GRPOPromptsTooHard", 10**9) <= ONSET + WITHIN, fired
    assert "GRPOPromptsTooEasy" not in fired


def test_easy_prompts_get_solved_and_entropy_collapses(tmp_path_factory: pytest.TempPathFactory) -> None:
    # "a+0=" without a KL anchor: the policy solves them, and from then on most groups are all
    # right. (Under the default anchor, beta 0.3, it stops near 88% per sample with fewer than
    # half the groups all right, and the card stays quiet, rightly.)
    results, fired = _play(tmp_path_factory, "easy", steps=ONSET + 130, difficulty="easy", sick_beta=0.0)
    assert mean(results, "group/all_right_frac", 1, ONSET) < 0.1
    assert mean(results, "group/all_right_frac", ONSET + 70, ONSET + 130) > 0.6
    # The prompts are too easy once solved, some 60-80 steps after the switch.
    assert fired.get("GRPOPromptsTooEasy", 10**9) <= ONSET + 2 * WITHIN, fired
    assert "GRPOPromptsTooHard" not in fired
    # Solving them keeps sharpening the policy: confident tokens get the positive advantages,
    # the log-prob/advantage covariance surges, and entropy collapses after it.
    cov0 = mean(results, "entropy/logp_adv_cov", 1, 11)
    assert mean(results, "entropy/logp_adv_cov", ONSET + 30, ONSET + 60) > 3 * cov0 > 0
    surge = fired.get("GRPOEntropyCovarianceSurge", 10**9)
    assert surge <= ONSET + WITHIN + 10, fired
    assert surge < fired.get("GRPOEntropyCollapse", 10**9) <= ONSET + 130, fired


def test_reward_ceiling_near_before_the_collapse(tmp_path_factory: pytest.TempPathFactory) -> None:
    # "a+0=" under a weak anchor (beta 0.05): reward climbs to ~1 as entropy is spent, along the
    # entropy-reward law; with nine tenths of the entropy's headroom gone and entropy still
    # falling, the ceiling card warns before the entropy crosses the red collapse line.
    results, fired = _play(tmp_path_factory, "ceiling", steps=ONSET + 150, difficulty="easy",
                           sick_beta=0.05)
    steps = [r.step for r in results]
    entropy = block_means(steps, [r.metrics["entropy/mean"] for r in results])
    reward = block_means(steps, [r.metrics["reward/mean"] for r in results])
    law = fit_law([entropy[b] for b in sorted(entropy)], [reward[b] for b in sorted(entropy)])
    assert law is not None and law.a > 0 and law.r_squared >= thresholds.value("forecast_min_r2"), law
    near = fired.get("GRPORewardCeilingNear", 10**9)
    assert near < fired.get("GRPOEntropyCollapse", 10**9), fired
    assert near <= ONSET + 3 * WITHIN, fired


def test_overlong_penalty_teaches_a_shortcut(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Each answer token beyond the first costs 1.2: a right two-digit (carry) answer now earns
    # less than nothing, so the policy stops answering carry prompts while no-carry ones,
    # which started higher, keep improving.
    results, fired = _play(tmp_path_factory, "shortcut", steps=ONSET + 60, length_penalty=1.2)
    delta = thresholds.value("shortcut_delta")
    carry0, no_carry0 = type_mean(results, "carry", 1, 11), type_mean(results, "no_carry", 1, 11)
    assert carry0 < no_carry0
    assert type_mean(results, "carry", ONSET + 10, ONSET + 60) < carry0 - delta
    assert type_mean(results, "no_carry", ONSET + 10, ONSET + 60) > no_carry0 + delta
    assert fired.get("GRPOShortcutLearning", 10**9) <= ONSET + WITHIN, fired

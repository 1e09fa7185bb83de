"""The real GRPO loop of ``grpo-monitor train-demo``: its signals, and the cards they raise.

Each run trains a ~5k-parameter GRU, warm-started by 50 supervised steps, on single-digit
addition for real (CPU, one thread, seed 0) and writes its snapshots through the SDK. While it
trains, the exporter's own ingest and store read the files and are "scraped" every few steps, as
tests/promtool_harness.py does for simulated runs; promtool then evaluates the project's rule
files on those scrapes.

What reproduces for real, and how (see docs/train-demo.md):
* healthy defaults: reward and sample accuracy rise, entropy falls but stays well above a
  collapse, and no training-signal card fires over 300 steps (see HEALTHY_TOLERATED for the
  perf cards this toy may raise, and why) -- none of the newer ones either (mismatch,
  staleness, dead groups by cause, shortcut, covariance, ceiling, length bias), whose sick
  runs are in tests/test_train_demo_signals.py;
* ``--grader loose --onset 200``: after a healthy baseline the grader pays 1 per generated
  token, the response length surges, reward jumps and accuracy drops ->
  GRPORewardHackingSuspected and GRPOResponseLengthShift;
* ``--nan-reward-at``: the NaN reaches reward/*, loss and grad/norm -> GRPONonFiniteValues;
* ``--group-size 2 --temperature 0.15 --onset 200``: sampling collapses onto the likeliest
  answer, groups of identical answers take over and entropy falls below 0.1x its initial value
  -> GRPOEntropyCollapse and GRPOAdvantageVanishing;
* ``--beta 0 --lr 0.03``: KL to the reference several times the healthy run's. Checked on the
  signal only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from promtool_harness import SEVERITIES, Played, Recorder, fired_at

from grpo_monitor.tools.train_demo import Config, StepResult, train

SCRAPE_EVERY = 10
# Cards the healthy toy run may raise for reasons that are real but not a training sickness:
# its step times are wall-clock times on a shared 2-core host, where other processes stall
# steps by 2-10x. (The k3 KL over 1-3-token answers is heavy-tailed from step 0 too, but the
# tail card asks for a tail heavier than the baseline's, so it stays quiet.)
HEALTHY_TOLERATED = {"GRPOStepTimeDrift", "GRPOThroughputDrop"}
# Past 300 steps the toy's KL is still climbing, and the rule that growth of over 20% per 100
# steps sustained for 300 steps, and accelerating, is a policy that keeps drifting says so: a
# yellow card, rightly. And the per-sequence KL tail: a sampled wrong answer that the policy has
# learned to avoid but the reference (the warm-started policy) still likes has a per-token k3 of
# 3-10 (e.g. log-probs -6.0 against -3.5), so kl/max over kl/p95 grows past 1.5x its baseline
# ratio in four seeds of six between steps 250 and 600: the estimator's heavy tail on one- and
# two-token answers, no prompt hacking the reward. No red card.
LONG_RUN_TOLERATED = HEALTHY_TOLERATED | {"GRPOKLGrowthAccelerating", "GRPOKLTailOutliers"}


def train_recorded(cfg: Config, scrape_every: int = SCRAPE_EVERY) -> tuple[list[StepResult], Played]:
    """Train for real; every ``scrape_every`` steps the exporter ingests the new lines and its
    exposition is parsed into one sample per series (one promtool minute per scrape)."""
    recorder = Recorder(Path(cfg.snapshot_dir))

    def on_step(res: StepResult) -> None:
        if res.step % scrape_every == 0:
            recorder.scrape(res.step, sorted((Path(cfg.snapshot_dir) / cfg.run).glob("rank-*.jsonl")))

    return train(cfg, on_step), recorder.played()


def fired_cards(played: Played, tmp: Path) -> set[str]:
    """The cards that had fired at any scrape, as promtool evaluates the rule files."""
    return {card for firing in fired_at(played, tmp, stale_markers=False) for card, _ in firing}


def mean(results: list[StepResult], key: str, lo: int, hi: int) -> float:
    values = [r.metrics[key] for r in results if lo <= r.step < hi]
    return sum(values) / len(values)


def records(path: Path) -> Iterator[dict]:
    with path.open() as fh:
        for line in fh:
            yield json.loads(line)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[StepResult], Played, Path]:
    tmp = tmp_path_factory.mktemp("healthy")
    results, played = train_recorded(Config(step_seconds=0.0, snapshot_dir=tmp, run="healthy", steps=300))
    return results, played, tmp


def test_healthy_run_learns(healthy: tuple[list[StepResult], Played, Path]) -> None:
    results, _, tmp = healthy
    assert len(results) == 300
    assert mean(results, "reward/mean", 250, 301) > 2 * mean(results, "reward/mean", 1, 51)
    assert mean(results, "eval/sample_acc", 250, 301) > mean(results, "eval/sample_acc", 1, 51) + 0.1
    early, late = mean(results, "entropy/mean", 1, 51), mean(results, "entropy/mean", 250, 301)
    assert 0.3 * early < late < early  # falls, but nowhere near a collapse
    assert 0.01 < mean(results, "kl/mean", 250, 301) < 5
    # The records hold every canonical key and the checkpoint events.
    *recs, end = records(tmp / "healthy" / "rank-0.jsonl")
    assert len(recs) == 300
    # ... and the clean end of the run, after its last step.
    assert (end["step"], end["metrics"], [e["type"] for e in end["events"]]) == (300, {}, ["run_end"])
    for key in ("reward/mean", "kl/mean", "entropy/mean", "group/zero_std_frac", "adv/mean_abs",
                "response/len_mean", "loss", "grad/norm", "train/lr", "eval/sample_acc",
                "perf/step_time_s", "perf/samples_per_s", "entropy/logp_adv_cov",
                "group/all_wrong_frac", "group/all_right_frac", "response/len_correct_mean",
                "response/len_incorrect_mean", "mismatch/kl", "mismatch/chi2_seq",
                "mismatch/is_ess_ratio", "staleness/mean", "staleness/max"):
        assert math.isfinite(recs[-1]["metrics"][key]), key
    # Synchronous fp32 rollouts: no staleness, and the rollout side's log-probs are the
    # trainer's up to float rounding.
    assert max(r["metrics"]["staleness/max"] for r in recs) == 0
    assert max(r["metrics"]["mismatch/logprob_diff_max"] for r in recs) < 1e-5
    # The verifier's score per prompt type: one-digit (no carry) and two-digit (carry) answers.
    assert set(recs[-1]["by_type"]) == {"carry", "no_carry"}
    assert 0 <= recs[-1]["by_type"]["carry"]["reward/mean"] <= 1
    saves = [r["step"] for r in recs if any(e["type"] == "checkpoint_save" for e in r.get("events", []))]
    assert saves == [100, 200, 300]


def test_healthy_run_raises_no_card(healthy: tuple[list[StepResult], Played, Path],
                                    tmp_path: Path) -> None:
    _, played, _ = healthy
    assert fired_cards(played, tmp_path) - HEALTHY_TOLERATED == set()


@pytest.mark.parametrize("seed", range(5))
def test_healthy_runs_of_600_steps_raise_no_red_card(seed: int, tmp_path: Path) -> None:
    _, played = train_recorded(Config(step_seconds=0.0, snapshot_dir=tmp_path, run=f"seed{seed}", steps=600, seed=seed))
    cards = fired_cards(played, tmp_path)
    assert not {c for c in cards if SEVERITIES[c] == "critical"}, cards
    assert cards <= LONG_RUN_TOLERATED, cards


def test_loose_grader_hacks_the_reward_with_length(tmp_path: Path) -> None:
    # 140 sick steps: the 200-step length comparison is +0.71 (this CPU's AVX2 kernels) and
    # +0.90 (ATEN_CPU_CAPABILITY=default) past the 0.5 threshold at step 340. At step 300 it was
    # +0.54 and +0.63: the kernels' rounding moves the toy's trajectory, and +0.54 left a
    # machine whose kernels differ one bad draw from a missing GRPOResponseLengthShift.
    cfg = Config(step_seconds=0.0, snapshot_dir=tmp_path, run="loose", steps=340, grader="loose", onset=200)
    results, played = train_recorded(cfg)
    before, after = (150, 200), (290, 341)
    assert mean(results, "response/len_mean", *after) > 1.5 * mean(results, "response/len_mean", *before)
    assert mean(results, "reward/mean", *after) > mean(results, "reward/mean", *before) + 0.5
    assert mean(results, "eval/sample_acc", *after) < mean(results, "eval/sample_acc", *before)
    cards = fired_cards(played, tmp_path)
    # Paid per token whether right or wrong, the policy pads its wrong answers, while a right
    # answer (its digits, then EOS) cannot grow: incorrect responses longer and longer, correct
    # ones not, the pattern of the length-bias card (here from the grader, not from the loss's
    # length normalisation: the runbook names both causes).
    assert mean(results, "response/len_incorrect_mean", *after) > \
        1.3 * mean(results, "response/len_incorrect_mean", *before)
    assert {"GRPORewardHackingSuspected", "GRPOResponseLengthShift", "GRPOLengthBias"} <= cards, cards
    # The hacking policy walks far from the reference (KL ~0.2 -> ~2 per token), so the red KL
    # card may join; a NaN may not.
    assert "GRPONonFiniteValues" not in cards, cards


def test_the_trajectory_does_not_depend_on_the_thread_count(tmp_path: Path) -> None:
    """train() pins torch's threads (Config.threads) and seeds its streams: a machine with more
    cores (torch's default thread count), or one busy with other work, trains the same steps.
    Only the wall-clock perf/* differ. (Two Config.threads values need not: a matmul split over
    two threads rounds differently on some CPUs.)"""
    import torch

    def trained(default_threads: int) -> list[dict[str, float]]:
        torch.set_num_threads(default_threads)
        res = train(Config(step_seconds=0.0, snapshot_dir=tmp_path, run=f"t{default_threads}", steps=15,
                           pretrain_steps=5))
        return [{k: v for k, v in r.metrics.items() if not k.startswith("perf/")} for r in res]

    before = torch.get_num_threads()
    try:
        assert trained(1) == trained(4)
    finally:
        torch.set_num_threads(before)


def test_nan_reward_raises_the_red_card(tmp_path: Path) -> None:
    cfg = Config(step_seconds=0.0, snapshot_dir=tmp_path, run="nan", steps=60, nan_reward_at=30)
    results, played = train_recorded(cfg)
    bad = results[29].metrics
    assert math.isnan(bad["reward/mean"]) and math.isnan(bad["loss"]) and math.isnan(bad["grad/norm"])
    assert all(math.isfinite(r.metrics["reward/mean"]) for r in results if r.step != 30)
    # The NaN is in the file as the JSON token, and the update was skipped.
    rec = next(r for r in records(tmp_path / "nan" / "rank-0.jsonl") if r["step"] == 30)
    assert math.isnan(rec["metrics"]["reward/mean"])
    assert {"type": "skipped_step", "step": 30, "reason": "nonfinite_grad"} in rec["events"]
    assert "GRPONonFiniteValues" in fired_cards(played, tmp_path)


def test_beta_zero_and_high_lr_blow_kl_up(healthy: tuple[list[StepResult], Played, Path],
                                          tmp_path: Path) -> None:
    results = train(Config(step_seconds=0.0, snapshot_dir=tmp_path, run="kl", steps=120, beta=0.0, lr=0.03))
    sick = mean(results, "kl/mean", 70, 121)
    ok = mean(healthy[0], "kl/mean", 70, 121)
    assert sick > 3 * ok, (sick, ok)


def test_small_groups_and_low_temperature_collapse(healthy: tuple[list[StepResult], Played, Path],
                                                   tmp_path: Path) -> None:
    cfg = Config(step_seconds=0.0, snapshot_dir=tmp_path, run="collapse", steps=300, onset=200, sick_group_size=2,
                 sick_temperature=0.15)
    results, played = train_recorded(cfg)
    before, after = (150, 200), (250, 301)
    assert mean(results, "group/zero_std_frac", *after) > mean(results, "group/zero_std_frac", *before) + 0.2
    assert mean(results, "entropy/mean", *after) < 0.1 * mean(results, "entropy/mean", 1, 201)
    assert mean(results, "entropy/mean", *after) < 0.2 * mean(healthy[0], "entropy/mean", *after)
    cards = fired_cards(played, tmp_path)
    assert {"GRPOEntropyCollapse", "GRPOAdvantageVanishing"} <= cards, cards

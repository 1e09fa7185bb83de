"""Synthetic GRPO runs written through the real SDK: a healthy run and one per sickness.

The healthy run is shaped as docs/background.md describes one (#the-four-layers, #healthy-ranges): reward
rises and its std settles, KL climbs fast then flattens, entropy falls 30-60% and levels off,
response length stays within ±15%, grad norm oscillates in a band with rare one-step spikes, and
a checkpoint is saved every 500 steps (a long step on every rank, background.md#checkpoint-io). Every scenario
starts healthy and turns sick at ``onset``; each sickness follows docs/background.md's description of it.

Rank 0 logs the training signals; every rank logs its performance signals. Each record's
``time`` follows the simulated step times, so a fast replay carries the same trainer clock as a
run in real time.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grpo_monitor.sdk.writer import SnapshotWriter

CHECKPOINT_EVERY = 500
PROMPT_TYPES = ("easy", "medium", "hard")
SAMPLES_PER_STEP = 64  # rollouts per rank per step


@dataclass
class RankRecord:
    rank: int
    metrics: dict[str, float]
    timestamp: float
    by_type: dict[str, dict[str, float]] | None = None
    events: list[dict[str, object]] | None = None


@dataclass
class Step:
    step: int
    records: list[RankRecord]  # a stalled rank has none


@dataclass
class Scenario:
    name: str
    description: str
    reference: str  # where the sickness is described: a docs/background.md section, or a paper
    alerts: tuple[str, ...]  # the cards it must raise (after its onset, and none before)
    # What `grpo-monitor report` names on the scenario's run (its own steps and onset): exactly
    # these verdicts, the sickness's and those it explains, and nothing else.
    verdicts: tuple[str, ...]
    steps: int = 1600
    onset: int = 800
    # Steps after the onset by which the first of ``alerts`` must have fired. 50 for a sickness
    # that shows at once; a trend card's own definition can need longer (KL accelerating over
    # three 100-step windows), and says so where it is set.
    caught_within: int = 50
    sicken: Callable[["Sim", int, dict[str, float]], None] = lambda sim, k, m: None
    # Per-rank performance change after onset: (sim, steps since onset, rank) -> step time factor.
    slow: Callable[["Sim", int, int], float] = lambda sim, k, rank: 1.0
    stalled_rank: int | None = None
    # A run shaped otherwise from its first step (sim, step, metrics), before any sickness.
    shape: Callable[["Sim", int, dict[str, float]], None] | None = None


@dataclass
class Sim:
    rng: random.Random
    step_seconds: float
    state: dict[str, float] = field(default_factory=dict)
    # The newer signals (rollout vs trainer, staleness, ...) draw from their own stream, so that
    # adding them left every older signal's numbers, and every older scenario, as they were.
    aux: random.Random = field(default_factory=lambda: random.Random(1))


def _healthy(sim: Sim, step: int) -> dict[str, float]:
    rng = sim.rng
    progress = 1 - math.exp(-step / 800)  # fast early learning that flattens
    reward = 0.2 + 0.5 * progress + rng.gauss(0, 0.02)
    reward_std = 0.25 + 0.05 * (1 - math.exp(-step / 60)) + rng.gauss(0, 0.005)
    kl = 0.3 * (1 - math.exp(-step / 300)) + abs(rng.gauss(0, 0.005))
    entropy = 1.5 * (0.55 + 0.45 * math.exp(-step / 600)) * (1 + rng.gauss(0, 0.01))
    length = 300 * (1 + 0.05 * math.sin(step / 200)) + rng.gauss(0, 6)
    grad = 0.9 + 0.1 * math.sin(step / 13) + abs(rng.gauss(0, 0.05))
    if step % 337 == 0:  # a one-step spike: not a card (background.md#healthy-ranges wants 50 steps)
        grad *= 8
    return {
        "reward/mean": reward,
        "reward/std": reward_std,
        "reward/min": reward - 2.2 * reward_std,
        "reward/max": min(1.0, reward + 2.2 * reward_std),
        "reward/p25": reward - 0.67 * reward_std + rng.gauss(0, 0.01),
        "reward/p50": reward + rng.gauss(0, 0.01),
        "reward/p75": reward + 0.67 * reward_std + rng.gauss(0, 0.01),
        "reward/p95": reward + 1.6 * reward_std + rng.gauss(0, 0.01),
        "group/reward_gap": 1.2 * reward_std + rng.gauss(0, 0.01),
        "group/reward_std": 0.8 * reward_std,
        "group/zero_std_frac": max(0.0, 0.08 + rng.gauss(0, 0.02)),
        "adv/mean_abs": 0.78 + rng.gauss(0, 0.02),
        "kl/mean": kl,
        "kl/p95": kl * 2.2 * (1 + rng.gauss(0, 0.03)),
        "kl/max": kl * 3.5 * (1 + abs(rng.gauss(0, 0.1))),
        "entropy/mean": entropy,
        "response/len_mean": length,
        "response/len_max": 1024.0 if step % 7 else 900.0,
        "response/clip_ratio": max(0.0, 0.02 + rng.gauss(0, 0.005)),
        "policy/clip_frac": max(0.0, 0.05 + rng.gauss(0, 0.01)),
        "loss": rng.gauss(0, 0.05) - 0.01 * progress,
        "grad/norm": grad,
        "train/lr": 1e-6 * min(1.0, step / 50),
        "eval/sample_acc": 0.25 + 0.45 * progress + rng.gauss(0, 0.02),
    }


def _healthy_newer(sim: Sim, step: int, m: dict[str, float]) -> None:
    """The newer stacks' signals at healthy levels: a rollout engine that agrees with the trainer
    to ~0.002 nats (vLLM against FSDP in bf16), one policy version of async lag, dead groups
    split between too hard and too easy, a log-prob/advantage covariance that fades as the policy
    settles, and wrong answers a little longer than right ones."""
    aux = sim.aux
    zero = m["group/zero_std_frac"]
    m.update({
        "mismatch/kl": 0.002 * (1 + aux.gauss(0, 0.1)),
        "mismatch/k3_kl": 0.002 * (1 + aux.gauss(0, 0.1)),
        "mismatch/logprob_diff_mean": 0.03 * (1 + aux.gauss(0, 0.05)),
        "mismatch/is_weight_mean": 1 + aux.gauss(0, 0.005),
        "mismatch/is_ess_ratio": min(1.0, 0.98 + aux.gauss(0, 0.003)),
        "mismatch/chi2_token": 0.02 * (1 + aux.gauss(0, 0.1)),
        "staleness/mean": 1.0,
        "staleness/max": 2.0,
        "group/all_wrong_frac": 0.6 * zero,
        "group/all_right_frac": 0.4 * zero,
        "entropy/logp_adv_cov": 0.01 * (0.3 + 0.7 * math.exp(-step / 300)) * (1 + aux.gauss(0, 0.2)),
        "response/len_correct_mean": 0.95 * m["response/len_mean"] + aux.gauss(0, 4),
        "response/len_incorrect_mean": 1.05 * m["response/len_mean"] + aux.gauss(0, 6),
    })


# -- the sicknesses (k = steps since onset) -------------------------------------------------


def _nan_loss(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#nan-and-loss-spikes: an extreme grad-norm peak, then the reward model returns NaN and the loss follows.
    if 0 <= k < 3:
        m["grad/norm"] *= 40
    if k >= 3:
        m["loss"] = math.nan
        m["reward/max"] = math.inf


def _kl_explosion(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#kl-explosion: KL mean from ~0.3 to 5 within 100 steps and still rising; a few open-ended
    # prompts carry it (the p95 stays far below the max).
    kl = m["kl/mean"] * (1 + min(k, 100) / 100 * 16 + k / 400)
    m.update({"kl/mean": kl, "kl/p95": kl * 1.3, "kl/max": kl * 6})


def _early_kl_explosion(sim: Sim, k: int, m: dict[str, float]) -> None:
    # The same jump early in a run, carried by the whole batch (its tail keeps its shape): KL
    # from ~0.09 at step 100 to ~1.5 within 100 steps, before any baseline exists.
    factor = 1 + min(k, 100) / 100 * 16 + k / 400
    for key in ("kl/mean", "kl/p95", "kl/max"):
        m[key] *= factor


def _entropy_collapse(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#entropy-collapse: entropy from ~1.5 to 0.05 in under 200 steps, groups turn into near-duplicates,
    # while reward still creeps up.
    entropy = m["entropy/mean"]
    m["entropy/mean"] = max(0.04, entropy * math.exp(-k / 45)) + abs(sim.rng.gauss(0, 0.003))
    m["group/zero_std_frac"] = min(0.95, m["group/zero_std_frac"] + k / 250)
    m["reward/mean"] += min(k, 400) / 400 * 0.03


def _early_entropy_collapse(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#entropy-collapse inside the baseline period: the cliff from a run's first steps (a real TRL run went
    # 0.96 -> 0.11 by step 100), with the groups turning into duplicates.
    m["entropy/mean"] = max(0.04, m["entropy/mean"] * math.exp(-k / 15)) + abs(sim.rng.gauss(0, 0.003))
    m["group/zero_std_frac"] = min(0.97, m["group/zero_std_frac"] + k / 150)


def _entropy_explosion(sim: Sim, k: int, m: dict[str, float]) -> None:
    # The policy turning to noise (a real TRL run at ~step 140 of 200: reward 0.9 -> 0, entropy
    # 0.1 -> 5, every completion truncated): it rambles to the length limit and earns nothing.
    ramp = min(k, 10) / 10
    m["entropy/mean"] *= 1 + 30 * ramp
    m["response/len_mean"] += (1024 - m["response/len_mean"]) * ramp
    m["response/clip_ratio"] += (0.99 - m["response/clip_ratio"]) * ramp
    _reward_to_floor(sim, ramp, m)


def _reward_to_floor(sim: Sim, ramp: float, m: dict[str, float]) -> None:
    # Every rollout earns (almost) nothing: the reward, its quantiles and its spread go to 0.
    for key in ("reward/mean", "reward/p25", "reward/p50", "reward/p75", "reward/p95",
                "reward/max", "eval/sample_acc"):
        m[key] = m[key] * (1 - ramp) + abs(sim.rng.gauss(0, 0.005))
    m["reward/std"] *= 1 - 0.9 * ramp


def _reward_collapse(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#falls-and-saw-teeth, "reward suddenly turns down", all the way: within 5 steps the reward falls
    # back to where the run started and below, while the policy's other signals look normal.
    _reward_to_floor(sim, min(k, 5) / 5, m)


def _dead_signal(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#reward-feedback from the first step: a sparse reward the policy almost never earns (a real TRL run
    # scored 0 at 84 of its 100 steps): the G rewards of nearly every group are equal, so nearly
    # every advantage is 0 and there is nothing to learn from.
    hit = sim.rng.random() < 0.15
    m["group/zero_std_frac"] = 0.875 if hit else 1.0
    m["reward/std"] = 0.12 if hit else 0.0
    m["adv/mean_abs"] = 0.1 if hit else 0.0
    for key in ("reward/mean", "reward/p25", "reward/p50", "reward/p75", "reward/p95"):
        m[key] = 0.0
    m["reward/mean"] = 0.015 if hit else 0.0
    m["reward/max"] = 1.0 if hit else 0.0
    m["reward/min"] = 0.0
    m["group/reward_gap"] = 0.125 if hit else 0.0
    m["group/reward_std"] = 0.04 if hit else 0.0


def _early_length_collapse(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#policy-behaviour early in a run: within ten steps the policy retreats to answers a third as long (a
    # real TRL run went from 53 tokens to 2 by its 20th step).
    m["response/len_mean"] *= 1 - 0.65 * min(k, 10) / 10


def _kl_growth(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#distribution-stability / background.md#healthy-ranges: KL accelerating, +40% per 100 steps and the increments growing.
    kl = m["kl/mean"] * math.exp(k / 300)
    m.update({"kl/mean": kl, "kl/p95": kl * 2.2, "kl/max": kl * 3.5})


def _kl_tail(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#distribution-stability: the mean looks fine, but a few prompts reach several times the p95.
    m["kl/max"] = m["kl/p95"] * (4 + sim.rng.random())


def _reward_hacking(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#reward-hacking: reward 0.2 -> 0.8 within 200 steps while response length goes 300 -> 900 tokens of
    # polite, well-structured filler.
    ramp = min(k, 200) / 200
    m["reward/mean"] = min(0.97, m["reward/mean"] + 0.3 * ramp)
    for q in ("reward/p25", "reward/p50", "reward/p75", "reward/p95"):
        m[q] = min(1.0, m[q] + 0.3 * ramp)
    m["response/len_mean"] *= 1 + 2 * ramp
    m["response/clip_ratio"] = min(1.0, m["response/clip_ratio"] + 0.4 * ramp)


def _reward_up_accuracy_flat(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#the-three-curves: reward climbs while verified sample accuracy does not move.
    frozen = sim.state.setdefault("acc", m["eval/sample_acc"])
    m["reward/mean"] = min(0.97, m["reward/mean"] + 0.25 * min(k, 200) / 200)
    m["eval/sample_acc"] = frozen + sim.rng.gauss(0, 0.01)


def _early_reward_hacking(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#reward-hacking, from a run's first records: a proxy the policy satisfies at
    # once (code that compiles, a format) lifts the reward 0.2 -> 0.7 within 60 steps while
    # verified sample accuracy does not move; no 200-step window exists yet.
    frozen = sim.state.setdefault("acc", m["eval/sample_acc"])
    lift = 0.5 * min(k, 60) / 60
    for q in ("reward/mean", "reward/min", "reward/max", "reward/p25", "reward/p50", "reward/p75",
              "reward/p95"):
        m[q] = min(1.0, m[q] + lift)
    m["eval/sample_acc"] = frozen + sim.rng.gauss(0, 0.01)


def _length_collapse(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#policy-behaviour: after one step the length falls off a cliff: a prompt subset triggers the reward
    # model's penalty on verbosity and the policy retreats to short answers.
    m["response/len_mean"] *= 1 - 0.65 * min(k, 50) / 50


def _reward_std_rising(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#reward-feedback / background.md#healthy-ranges: the spread keeps rising: easy prompts farmed, hard ones abandoned.
    std = m["reward/std"] + 0.02 * k / 100
    m["reward/std"] = std
    m["group/reward_gap"] = 1.2 * std + sim.rng.gauss(0, 0.01)


def _quantile_extreme(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#thresholds / background.md#two-colours: the lower quantiles fall far below anything the baseline saw.
    drop = 0.5 * min(k, 50) / 50
    m["reward/p25"] = max(0.0, m["reward/p25"] - drop)
    m["reward/p50"] = max(0.0, m["reward/p50"] - drop / 2)


def _advantage_vanishing(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#reward-feedback: groups whose G rewards are equal give no advantage: learning crawls.
    share = min(0.85, m["group/zero_std_frac"] + k / 100)
    m["group/zero_std_frac"] = share
    m["adv/mean_abs"] *= 1 - share


def _group_dominated(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#reward-feedback: max - min within a group beyond 2 std: one response dominates the gradient.
    m["group/reward_gap"] = m["reward/std"] * (1.2 + 1.8 * min(k, 50) / 50)


def _grad_norm_spike(sim: Sim, k: int, m: dict[str, float]) -> None:
    # background.md#healthy-ranges: grad norm over 5x its baseline, and staying there.
    m["grad/norm"] *= 8


def _rollout_mismatch(sim: Sim, k: int, m: dict[str, float]) -> None:
    # A rollout engine that no longer computes the trainer's policy (a bad weight sync, another
    # precision): KL 0.002 -> 0.15 within 10 steps, the importance weights far from 1.
    ramp = min(1.0, k / 10)
    m["mismatch/kl"] += 0.15 * ramp
    m["mismatch/k3_kl"] += 0.12 * ramp
    m["mismatch/logprob_diff_mean"] += 0.4 * ramp
    m["mismatch/chi2_token"] += 1.5 * ramp
    m["mismatch/is_weight_mean"] -= 0.45 * ramp
    m["mismatch/is_ess_ratio"] -= 0.7 * ramp


def _mismatch_rising(sim: Sim, k: int, m: dict[str, float]) -> None:
    # The common failure: a slow, steady rise (0.002 -> 0.032 over 600 steps), far under any
    # level line.
    m["mismatch/kl"] += 0.00005 * k
    m["mismatch/k3_kl"] += 0.00005 * k
    m["mismatch/logprob_diff_mean"] += 0.0002 * k


def _stale_rollouts(sim: Sim, k: int, m: dict[str, float]) -> None:
    # The rollout side falls behind: the queue, and the trajectories' age, grow 1 -> 9 versions.
    m["staleness/mean"] = 1.0 + min(8.0, k / 12)
    m["staleness/max"] = 2 * m["staleness/mean"]


def _prompts_too_hard(sim: Sim, k: int, m: dict[str, float]) -> None:
    # A harder data mix: 70% of the groups answer all wrong.
    share = min(0.7, 0.05 + k / 40)
    m["group/all_wrong_frac"] = share + sim.aux.gauss(0, 0.02)
    m["group/zero_std_frac"] = m["group/all_wrong_frac"] + m["group/all_right_frac"]


def _prompts_too_easy(sim: Sim, k: int, m: dict[str, float]) -> None:
    # Solved prompts stay in the mix: 70% of the groups answer all right.
    share = min(0.7, 0.03 + k / 40)
    m["group/all_right_frac"] = share + sim.aux.gauss(0, 0.02)
    m["group/zero_std_frac"] = m["group/all_wrong_frac"] + m["group/all_right_frac"]


def _shortcut(sim: Sim, k: int, m: dict[str, float]) -> None:
    # Easy prompts gain what hard ones lose (background.md#reading-samples): the policy found a shortcut.
    sim.state["type_shift"] = 0.25 * min(1.0, k / 100)


def _covariance_surge(sim: Sim, k: int, m: dict[str, float]) -> None:
    # Confident tokens rewarded in bulk: the covariance that drives entropy down jumps 10x, and
    # entropy loses 60% within 50 steps (still far above a collapse, 0.1x its start).
    m["entropy/logp_adv_cov"] = 0.01 * 10 * min(1.0, k / 10) * (1 + sim.aux.gauss(0, 0.2)) + 0.003
    m["entropy/mean"] *= 1 - 0.6 * min(1.0, k / 50)


def _length_bias(sim: Sim, k: int, m: dict[str, float]) -> None:
    # Per-response length normalisation: wrong answers grow 80% longer over 200 steps, right ones
    # do not (arXiv 2503.20783).
    m["response/len_incorrect_mean"] *= 1 + 0.8 * min(1.0, k / 200)


def _entropy_reward_law(sim: Sim, step: int, m: dict[str, float]) -> None:
    # A run on the entropy-reward law: entropy spent from 1.5 towards 0.2, the reward bought with
    # it R = 1 - 0.2 exp(H). The last tenth of the gain the law promised at the start begins where
    # exp(H) - 1 < 0.1 (exp(H0) - 1) with H0 = 1.465, the mean of the first ten steps: H < 0.287,
    # at step ~540.
    h = (0.2 + 1.3 * math.exp(-step / 200)) * (1 + sim.aux.gauss(0, 0.01))
    m["entropy/mean"] = h
    m["reward/mean"] = 1 - 0.2 * math.exp(h) + sim.aux.gauss(0, 0.01)
    # A verifier's reward: the accuracy climbs with it (a reward that climbed without it would
    # be the hacking card's business).
    m["eval/sample_acc"] = m["reward/mean"]


def _levels(levels: Mapping[str, float]) -> Callable[[Sim, int, dict[str, float]], None]:
    """A run shaped from its first step at ``levels`` (key -> level), each with a little noise of
    its own: a real run's scale rather than the healthy generator's."""
    def shape(sim: Sim, step: int, m: dict[str, float]) -> None:
        for key, level in levels.items():
            m[key] = level * (1 + sim.aux.gauss(0, 0.03))
    return shape


def _blow_up(targets: Mapping[str, float], steps: int) -> Callable[[Sim, int, dict[str, float]], None]:
    """Every signal of ``targets`` (key -> level) moves there in a straight line over ``steps``
    steps and stays; a reward target of 0 takes its quantiles and spread down with it."""
    def sicken(sim: Sim, k: int, m: dict[str, float]) -> None:
        ramp = min(k + 1, steps) / steps
        for key, target in targets.items():
            if key == "reward/mean" and target == 0.0:
                _reward_to_floor(sim, ramp, m)
            else:
                m[key] += (target - m[key]) * ramp
    return sicken


def _entropy_rebound(sim: Sim, step: int, m: dict[str, float]) -> None:
    # A long run whose entropy settles from 0.4 to 0.2 (within its first 150 steps) and stays
    # there for hundreds of steps; the sickness takes it back up from that floor.
    m["entropy/mean"] = (0.2 + 0.2 * math.exp(-step / 50)) * (1 + sim.aux.gauss(0, 0.02))


def _slow_rank(rank: int, factor: float) -> Callable[[Sim, int, int], float]:
    # background.md#cluster-health: one slow node; its rank's own step time (compute, before the collective) grows.
    return lambda sim, k, r: 1 + (factor - 1) * min(k, 100) / 100 if r == rank else 1.0


def _slow_all(factor: float) -> Callable[[Sim, int, int], float]:
    # background.md#throughput-drops: a flaky NVLink on one node makes the gradient sync retry: every rank waits.
    return lambda sim, k, rank: 1 + (factor - 1) * min(k, 100) / 100


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("healthy", "A healthy run: nothing to see, including checkpoint saves and one-step "
             "grad-norm spikes.", "background.md#the-four-layers, background.md#healthy-ranges", (),
             verdicts=("healthy",), steps=3000, onset=3000),
    Scenario("rollout_mismatch", "The rollout engine's token probabilities leave the trainer's: "
             "KL 0.002 -> 0.15, importance weights far from 1.", "background.md#rollout-trainer-mismatch",
             ("GRPORolloutMismatch", "GRPORolloutMismatchRising"),
             verdicts=("rollout_mismatch", "rollout_mismatch_rising"), steps=1000,
             sicken=_rollout_mismatch),
    Scenario("mismatch_rising", "Rollout-trainer KL creeps up 0.002 -> 0.032 over 600 steps.",
             "background.md#rollout-trainer-mismatch", ("GRPORolloutMismatchRising",),
             verdicts=("rollout_mismatch_rising",), steps=1400, sicken=_mismatch_rising,
             # the card's own rule: 90% of 50 steps over twice the initial value (k ~ 40 + 45)
             caught_within=100),
    Scenario("stale_rollouts", "Async rollouts fall behind: trajectories 1 -> 9 versions old.",
             "background.md#staleness", ("GRPOStaleRollouts",),
             verdicts=("stale_rollouts",), steps=1000, sicken=_stale_rollouts,
             # the age passes 4 versions 36 steps in, then 90% of 20 steps
             caught_within=60),
    Scenario("prompts_too_hard", "70% of the groups answer all wrong.", "background.md#dead-groups-by-cause",
             ("GRPOPromptsTooHard", "GRPOAdvantageVanishing"),
             verdicts=("prompts_too_hard", "advantage_vanishing"), steps=1000,
             sicken=_prompts_too_hard),
    Scenario("prompts_too_easy", "70% of the groups answer all right.", "background.md#dead-groups-by-cause",
             ("GRPOPromptsTooEasy", "GRPOAdvantageVanishing"),
             verdicts=("prompts_too_easy", "advantage_vanishing"), steps=1000,
             sicken=_prompts_too_easy),
    Scenario("shortcut_learning", "Easy prompt types gain 0.25 while hard ones lose as much.",
             "background.md#reward-feedback, background.md#shortcut-learning", ("GRPOShortcutLearning",),
             # The types drift apart while the mean reward rises: the report catches it against
             # the types' 50-step means 200 steps before, not against their initial values.
             verdicts=("shortcut_learning",), steps=1000, sicken=_shortcut,
             # the types move 0.05 apart in 20 steps, read as 50-step means against 200 steps
             # before, when the healthy climb (~0.05 per 200 steps on every type) still lifts
             # the hard type's earlier level by as much
             caught_within=80),
    Scenario("covariance_surge", "Cov(log pi, A) jumps to 10x its level while entropy falls 60% "
             "within 50 steps: a collapse under way.",
             "background.md#entropy-covariance", ("GRPOEntropyCovarianceSurge",),
             verdicts=("entropy_covariance_surge",), steps=1000,
             sicken=_covariance_surge),
    Scenario("reward_ceiling", "A run on the entropy-reward law spends its entropy: by step ~540 "
             "less than a tenth of the promised gain is left.", "background.md#entropy-reward-law",
             ("GRPORewardCeilingNear",),
             verdicts=("reward_ceiling_near",), steps=800, onset=540, sicken=lambda sim, k, m: None,
             shape=_entropy_reward_law),
    Scenario("length_bias", "Wrong answers grow 80% longer over 200 steps; right ones do not.",
             "background.md#length-bias", ("GRPOLengthBias",),
             verdicts=("length_bias",), steps=1100, sicken=_length_bias,
             # past +30% (on lengths ~5% under their start at this point of the healthy wave)
             # at k ~ 90, then a 50-step mean
             caught_within=150),
    Scenario("nan_loss", "A grad-norm peak, then NaN loss and an infinite reward.", "background.md#nan-and-loss-spikes",
             ("GRPONonFiniteValues",),
             verdicts=("nonfinite",), sicken=_nan_loss),
    Scenario("kl_explosion", "KL mean 0.3 -> 5 within 100 steps, carried by a few prompts.",
             "background.md#kl-explosion", ("GRPOKLExplosion", "GRPOKLTailOutliers", "GRPOKLGrowthAccelerating"),
             verdicts=("kl_explosion", "kl_tail_outliers", "kl_growth_accelerating"),
             sicken=_kl_explosion),
    # The same blow-up inside the baseline period: judged against the run's floor and an
    # absolute level, with no baseline to compare with.
    Scenario("early_kl_explosion", "KL mean 0.09 -> 1.5 within 100 steps of step 100, before the "
             "baseline exists, carried by the whole batch.", "background.md#kl-explosion", ("GRPOKLExplosion",),
             verdicts=("kl_explosion",), steps=400, onset=100, sicken=_early_kl_explosion,
             # KL passes 0.5 nats at k ~ 30, then 90% of 20 steps
             caught_within=60),
    Scenario("entropy_collapse", "Entropy 1.5 -> 0.05 within 200 steps; groups become duplicates.",
             # The forecast card comes first: by the law fitted on the 800 healthy steps, an
             # entropy under 0.3 leaves less than a tenth of the promised reward; it goes quiet
             # when the red card's own test holds.
             "background.md#entropy-collapse", ("GRPOEntropyCollapse", "GRPOAdvantageVanishing", "GRPORewardCeilingNear"),
             # The groups turn into duplicates as entropy falls: the dead-signal branch of the
             # vanishing card fires too, once nine groups in ten are. Its reward rose as its entropy
             # fell, along the entropy-reward law (R² 0.84): the ceiling card sees the entropy spent
             # (from step 882, before the collapse card at 903).
             verdicts=("entropy_collapse", "advantage_vanishing", "dead_learning_signal",
                       "reward_ceiling_near"),
             sicken=_entropy_collapse,
             # the fall (exp(-k/45) from ~1.0) takes ~85 steps to pass 0.1x the initial entropy
             caught_within=110),
    Scenario("early_entropy_collapse", "Entropy 1.5 -> 0.05 within 50 steps of a run's start.",
             "background.md#entropy-collapse", ("GRPOEntropyCollapse", "GRPOAdvantageVanishing"),
             # Sick inside the baseline period, caught from the first steps. The ceiling card
             # stays quiet: entropy crosses into the red card's collapse before its 50-step mean
             # leaves under a tenth of the promised reward.
             verdicts=("entropy_collapse", "dead_learning_signal", "advantage_vanishing"),
             steps=500, onset=40,
             sicken=_early_entropy_collapse,
             # the cliff (exp(-k/15)) takes 35 steps to pass 0.1x the initial entropy
             caught_within=60),
    Scenario("entropy_explosion", "Entropy x30, every answer truncated, reward to 0 at step 140.",
             "background.md#policy-behaviour", ("GRPOEntropyExplosion", "GRPORewardCollapse", "GRPOCompletionsTruncated",
                      "GRPOResponseLengthShift", "GRPOTrainingBlowUp"),
             # Entropy, length and reward leave their range together within the 10-step ramp:
             # the blow-up card comes first (step 144), the entropy card once 90% of 20 steps are
             # above 5x the start.
             verdicts=("entropy_explosion", "reward_collapse", "completions_truncated",
                       "length_shift", "training_blow_up"), steps=450, onset=140, sicken=_entropy_explosion),
    # A short run that collapses on every front at once in its last steps, as a verl run of a
    # 1.7B model on math did (steps 48-58 of 61): no baseline, no 20-step window fills in time.
    Scenario("blow_up", "Entropy 0.03 -> 6.8, KL 0.15 -> 5.2, grad norm 0.25 -> 2.4, length 900 -> "
             "4800, reward 0.72 -> 0, all within 10 steps at step 48 of a 61-step run.",
             "background.md#blow-ups", ("GRPOTrainingBlowUp", "GRPOResponseLengthShift"),
             # The report also reads the three curves: reward down from its best while KL blew up.
             verdicts=("training_blow_up", "reward_collapse_kl_blowup", "length_shift"), steps=61,
             onset=48,
             shape=_levels({"entropy/mean": 0.03, "kl/mean": 0.15, "grad/norm": 0.25,
                            "response/len_mean": 900.0, "reward/mean": 0.72}),
             sicken=_blow_up({"entropy/mean": 6.8, "kl/mean": 5.2, "grad/norm": 2.4,
                              "response/len_mean": 4800.0, "reward/mean": 0.0}, 10),
             # three signals out of their range in the 2nd and 3rd sick records
             caught_within=3),
    # Its sister run, milder and at the very end (steps 62-72 of 72): three signals, none by an
    # order of magnitude but KL and grad norm.
    Scenario("blow_up_late", "KL 0.12 -> 1.05, length 1400 -> 2600, grad norm 0.1 -> 1.0 in the "
             "last 10 steps of a 72-step run.", "background.md#blow-ups",
             ("GRPOTrainingBlowUp", "GRPOResponseLengthShift"),
             verdicts=("training_blow_up", "length_shift"), steps=72, onset=62,
             shape=_levels({"kl/mean": 0.12, "grad/norm": 0.1, "response/len_mean": 1400.0}),
             sicken=_blow_up({"kl/mean": 1.05, "grad/norm": 1.0, "response/len_mean": 2600.0}, 10),
             # the length, the slowest of the three, passes 1.5x its level in its 6th record
             caught_within=8),
    # Judged against its start, entropy that fell and came back up never looks like an explosion.
    Scenario("entropy_rebound", "Entropy 0.4 -> 0.2 for 750 steps, then back up to 1.0 within 50 "
             "steps of step 800.", "background.md#entropy-explosion",
             # the red card first: it must come within 50 steps; the yellow one comes before it
             ("GRPOEntropyExplosion", "GRPOEntropyRebound"),
             verdicts=("entropy_explosion", "entropy_rebound"), steps=900, onset=800,
             shape=_entropy_rebound,
             sicken=_blow_up({"entropy/mean": 1.0}, 50)),
    Scenario("reward_collapse", "Reward falls back to 0 within 5 steps at step 160.", "background.md#the-three-curves",
             ("GRPORewardCollapse",),
             verdicts=("reward_collapse",), steps=450, onset=160, sicken=_reward_collapse),
    Scenario("dead_signal", "A sparse reward earned at 15% of the steps: nothing to learn from.",
             "background.md#reward-feedback", ("GRPOAdvantageVanishing",),
             verdicts=("dead_learning_signal", "advantage_vanishing"), steps=300, onset=1,
             sicken=_dead_signal),
    Scenario("early_length_collapse", "Response length falls by two thirds at step 60.", "background.md#policy-behaviour",
             ("GRPOResponseLengthShift",),
             verdicts=("length_shift",), steps=400, onset=60, sicken=_early_length_collapse),
    Scenario("rank_stalled", "Rank 2 stops reporting while the others go on.", "background.md#cluster-health",
             ("GRPORankStalled",),
             verdicts=("rank_stalled",), stalled_rank=2),
    Scenario("kl_growth", "KL grows 40% per 100 steps and faster each time.", "background.md#distribution-stability, background.md#healthy-ranges",
             ("GRPOKLGrowthAccelerating",),
             verdicts=("kl_growth_accelerating",), steps=1700, sicken=_kl_growth,
             # the card's own rule: three 100-step windows each growing, 300 steps
             caught_within=320),
    Scenario("kl_tail", "A few prompts reach 4-5x the KL p95.", "background.md#distribution-stability", ("GRPOKLTailOutliers",),
             verdicts=("kl_tail_outliers",), sicken=_kl_tail),
    Scenario("reward_hacking", "Reward 0.2 -> 0.8 while length goes 300 -> 900 tokens.", "background.md#reward-hacking",
             ("GRPORewardHackingSuspected", "GRPOResponseLengthShift"),
             # The length surge is the hacking verdict's evidence, not a verdict of its own.
             verdicts=("reward_hacking",), sicken=_reward_hacking,
             # length passes +50% 50 steps into its 200-step ramp, then a 50-step mean
             caught_within=100),
    Scenario("reward_up_accuracy_flat", "Reward climbs while sample accuracy stays flat.",
             "background.md#the-three-curves", ("GRPORewardHackingSuspected",),
             verdicts=("reward_hacking",), sicken=_reward_up_accuracy_flat,
             # a 3-sigma reward rise within 200 steps takes ~200 steps
             caught_within=220),
    # The same inside the baseline period: judged on the trends of the first records.
    Scenario("early_reward_hacking", "Reward 0.2 -> 0.7 within 60 steps of step 30 while sample "
             "accuracy stays flat, before the baseline exists.", "background.md#reward-hacking",
             ("GRPORewardHackingSuspected",), verdicts=("reward_hacking",), steps=300, onset=30,
             sicken=_early_reward_hacking),
    Scenario("length_collapse", "Response length falls by two thirds within 50 steps.", "background.md#policy-behaviour",
             ("GRPOResponseLengthShift",),
             verdicts=("length_shift",), sicken=_length_collapse,
             # length passes -50% 38 steps into its 50-step ramp, then a 50-step mean
             caught_within=80),
    Scenario("reward_std_rising", "reward/std rises steadily for over 1000 steps.",
             "background.md#reward-feedback, background.md#healthy-ranges", ("GRPORewardStdRising",),
             verdicts=("reward_std_rising",), steps=2400, sicken=_reward_std_rising,
             # the card's own rule: ten rising 100-step windows
             caught_within=1000),
    Scenario("reward_quantile_extreme", "The lower reward quantiles fall far below baseline.",
             "background.md#thresholds, background.md#two-colours", ("GRPORewardQuantileExtreme",),
             verdicts=("reward_quantile_extreme",), sicken=_quantile_extreme),
    Scenario("advantage_vanishing", "Most groups have equal rewards; advantages vanish.", "background.md#reward-feedback",
             ("GRPOAdvantageVanishing",),
             verdicts=("advantage_vanishing",), sicken=_advantage_vanishing,
             # the share passes 0.5 42 steps in, then 90% of 50 steps
             caught_within=100),
    Scenario("group_dominated", "Within-group gaps beyond 2 reward stddevs.", "background.md#reward-feedback",
             ("GRPOGroupDominated",),
             verdicts=("group_dominated",), sicken=_group_dominated,
             # the gap ramps over 50 steps, read as a 50-step mean
             caught_within=60),
    Scenario("grad_norm_spike", "Grad norm at 8x its baseline for hundreds of steps.",
             "background.md#healthy-ranges", ("GRPOGradNormSpike",),
             verdicts=("grad_norm_spike",), sicken=_grad_norm_spike),
    Scenario("step_time_drift", "Every rank's step time 35% longer.", "background.md#cluster-health",
             ("GRPOStepTimeDrift",),
             verdicts=("step_time_drift",), slow=_slow_all(1.35),
             # step time ramps over 100 steps, passes +20% at 57, then a 50-step mean
             caught_within=100),
    Scenario("straggler", "Rank 3 computes 30% slower than the others.", "background.md#cluster-health",
             ("GRPORankStraggler", "GRPOStepTimeDrift"),
             verdicts=("rank_straggler", "step_time_drift"), slow=_slow_rank(3, 1.3),
             # rank 3 slows over 100 steps
             caught_within=120),
    Scenario("throughput_drop", "samples/s from 1.8 to 1.0 per rank: a flaky NVLink.", "background.md#throughput-drops",
             ("GRPOThroughputDrop", "GRPOStepTimeDrift"),
             verdicts=("throughput_drop", "step_time_drift"), slow=_slow_all(1.8),
             # throughput ramps down over 100 steps, then a 50-step mean
             caught_within=100),
)}


def generate(
    scenario: Scenario | str,
    *,
    steps: int | None = None,
    onset: int | None = None,
    ranks: int = 4,
    step_seconds: float = 5.0,
    start_time: float = 1764400000.0,
    seed: int = 0,
) -> Iterator[Step]:
    """The scenario's records, step by step, for every rank."""
    sc = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    steps = sc.steps if steps is None else steps
    onset = sc.onset if onset is None else onset
    sim = Sim(random.Random(seed), step_seconds, aux=random.Random(seed + 1))
    clock = [start_time] * ranks
    for step in range(1, steps + 1):
        k = step - onset
        m = _healthy(sim, step)
        _healthy_newer(sim, step, m)
        if sc.shape is not None:
            sc.shape(sim, step, m)
        if k >= 0:
            sc.sicken(sim, k, m)
        checkpoint = step % CHECKPOINT_EVERY == 0
        events = [{"type": "checkpoint_save", "step": step}] if checkpoint else None
        records = []
        for rank in range(ranks):
            if rank == sc.stalled_rank and k >= 0:
                continue
            factor = sc.slow(sim, k, rank) if k >= 0 else 1.0
            step_time = step_seconds * factor * (1 + sim.rng.gauss(0, 0.03))
            if checkpoint:
                step_time += step_seconds * 4
            clock[rank] += step_time
            perf = {"perf/step_time_s": step_time,
                    "perf/samples_per_s": SAMPLES_PER_STEP / step_time,
                    "perf/comm_time_s": step_seconds * 0.15 * (1 + sim.rng.gauss(0, 0.05)),
                    "perf/memory_allocated_bytes": 61e9 + sim.rng.gauss(0, 2e8)}
            if rank == 0:
                shift = sim.state.get("type_shift", 0.0)
                by_type = {t: {"reward/mean": m["reward/mean"] + off}
                           for t, off in zip(PROMPT_TYPES, (0.15 + shift, 0.0, -0.15 - shift))}
                records.append(RankRecord(0, {**m, **perf}, clock[0], by_type, events))
            else:
                records.append(RankRecord(rank, perf, clock[rank], None, events))
        yield Step(step, records)


@dataclass
class Written:
    """What write_steps wrote: the steps it went through, and per rank the records that reached
    the file and the step of the last of them."""

    steps: int = 0
    records: dict[int, int] = field(default_factory=dict)
    last_step: dict[int, int] = field(default_factory=dict)


def write_steps(
    writers: Mapping[int, SnapshotWriter] | Sequence[SnapshotWriter],
    steps: Iterable[Step],
    *,
    wall_clock: bool = False,
    record: Callable[[RankRecord], RankRecord] | None = None,
    before: Callable[[Step], None] | None = None,
    after: Callable[[Step], None] | None = None,
) -> Written:
    """Write ``steps`` (generate's, or a subset of them) through ``writers``, one per rank.

    ``writers`` by rank; a rank without a writer is skipped, so that a process holding some of a
    run's ranks writes only its own. ``wall_clock`` stamps each record with the time it is
    written instead of its simulated step time. ``record`` rewrites a record before it is logged
    (extra metrics or events). ``before`` and ``after`` run around each step: pacing on a
    schedule or a fixed sleep, a scrape of what was written. The writers stay open: their owner
    closes them, which marks the run's end.
    """
    by_rank = writers if isinstance(writers, Mapping) else dict(enumerate(writers))
    written = Written()
    for st in steps:
        if before is not None:
            before(st)
        for rec in st.records:
            writer = by_rank.get(rec.rank)
            if writer is None:
                continue
            if record is not None:
                rec = record(rec)
            if writer.log(rec.metrics, st.step, by_type=rec.by_type, events=rec.events,
                          timestamp=None if wall_clock else rec.timestamp):
                written.records[rec.rank] = written.records.get(rec.rank, 0) + 1
                written.last_step[rec.rank] = st.step
        written.steps += 1
        if after is not None:
            after(st)
    return written


def write_run(
    snapshot_dir: Path,
    run: str,
    scenario: str = "healthy",
    *,
    steps: int | None = None,
    onset: int | None = None,
    ranks: int = 4,
    step_seconds: float = 5.0,
    realtime: bool = False,
    seed: int = 0,
) -> int:
    """Write a scenario's run under ``snapshot_dir/run``; return the steps written.

    ``realtime`` sleeps ``step_seconds`` per step and stamps records with the wall clock (the
    demo); otherwise it writes as fast as the disk allows, on a simulated clock (tests).
    """
    start = time.time()
    # Each writer as a context manager: the run's end is marked when the scenario is written (or
    # a person interrupts it), not when it crashes (docs/sdk.md).
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(SnapshotWriter(snapshot_dir, run, rank=r, world_size=ranks))
                   for r in range(ranks)]
        written = write_steps(
            writers,
            generate(scenario, steps=steps, onset=onset, ranks=ranks, step_seconds=step_seconds,
                     start_time=start, seed=seed),
            wall_clock=realtime,
            after=(lambda st: time.sleep(step_seconds)) if realtime else None)
    return written.steps

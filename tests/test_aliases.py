"""Aliases of older and other frameworks: what each name means, its unit, and which name wins.

Each alias is checked against what the framework's source logs under that name (the comments in
exporter/grpo_monitor/contract/keys.py say where); the shared real runs show them in the wild
(tests/test_real_runs.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from grpo_monitor.contract.keys import canonical_key, match_key
from grpo_monitor.contract.snapshot import parse_record


def metrics(**logged: Any) -> dict[str, float]:
    """The canonical values a flat record with these keys yields."""
    return parse_record({"step": 1, **logged}, run="r", rank=0, mtime=0.0).metrics


def unknown(**logged: Any) -> dict[str, float]:
    return parse_record({"step": 1, **logged}, run="r", rank=0, mtime=0.0).unknown


@pytest.mark.parametrize(("name", "key"), [
    ("completion_length", "response/len_mean"),  # TRL GRPO, Jan-Apr 2025; Unsloth notebooks
    ("critic/kl", "kl/mean"),  # verl before Apr 2025: KL to the reference, in the reward
    ("actor/reward_kl_penalty", "kl/mean"),  # its later name
    ("actor/entropy_loss", "entropy/mean"),  # verl before June 2025: the entropy itself
    ("policy/entropy", "entropy/mean"),  # Tinker-style and many PPO loops
    ("Training Loss", "loss"),  # Hugging Face's notebook table (Unsloth)
    ("actor_grad_norm", "grad/norm"),  # OpenRLHF
    ("ppo_clip_ratio", "policy/clip_frac"),  # OpenRLHF
    ("timing/step_total", "perf/step_time_s"),  # OpenRLHF
    ("actor/lr(1e-4)", "train/lr"),  # verl before 2025, scaled (below)
    # hand-written loops' plain names
    ("rewards/mean", "reward/mean"), ("rewards/std", "reward/std"),
    ("token_entropy", "entropy/mean"), ("total_grad_norm", "grad/norm"),
])
def test_added_alias_maps_onto_its_key(name: str, key: str) -> None:
    assert canonical_key(name) == key
    assert set(metrics(**{name: 0.5})) == {key}


@pytest.mark.parametrize("name", [
    "rewards/format_reward", "rewards/format_reward/mean",  # TRL's reward functions: their own
    "actor/ppo_kl", "ppo_kl",  # KL between the rollout policy and the updated one, not to the reference
    "entropy_loss",  # +entropy in OpenRLHF, -entropy in Stable-Baselines3: ambiguous
    "critic/kl_coeff", "actor/kl_coef",  # the coefficients, not the KL
    "critic/lr(1e-4)",  # the critic's learning rate, not the policy's
    "timing/gen", "timing_s/gen",  # one phase of a step, not the step
    "critic/advantages/mean",  # ~0 by construction; |advantage| cannot be derived from it
    "critic/rewards/mean",  # score minus the KL penalty: not the reward the cards judge
])
def test_look_alike_names_stay_unmapped(name: str) -> None:
    assert canonical_key(name) is None
    assert unknown(**{name: 0.25}) == {name: 0.25}


def test_an_alias_logged_in_other_units_is_converted() -> None:
    # verl's fsdp_workers logged lr * 1e4 as actor/lr(1e-4): 0.01 there is a learning rate of 1e-6.
    assert metrics(**{"actor/lr(1e-4)": 0.01})["train/lr"] == pytest.approx(1e-6)
    # A plain name of the same key outranks the scaled one.
    assert metrics(**{"actor/lr(1e-4)": 0.01, "actor/lr": 2e-6})["train/lr"] == 2e-6


def test_entropy_loss_keeps_its_sign() -> None:
    # verl's compute_entropy_loss returned masked_mean(entropy): positive, the entropy itself.
    assert metrics(**{"actor/entropy_loss": 0.526}) == {"entropy/mean": 0.526}


@pytest.mark.parametrize("order", [1, -1])
def test_reference_kl_precedence_does_not_depend_on_key_order(order: int) -> None:
    # Recent verl logs actor/kl_loss = 0.0 even with use_kl_loss off; the reward penalty, present
    # only when it is computed, is the KL to trust. actor/ppo_kl is never the reference KL.
    logged = [("actor/kl_loss", 0.0), ("actor/reward_kl_penalty", 0.03), ("actor/ppo_kl", 0.7)]
    assert metrics(**dict(logged[::order]))["kl/mean"] == 0.03
    older = [("critic/kl", 0.21), ("actor/kl_loss", 0.05)]
    assert metrics(**dict(older[::order]))["kl/mean"] == 0.21
    assert metrics(**dict([("actor/ppo_kl", 0.7), ("actor/kl_loss", 0.05)][::order]))["kl/mean"] == 0.05


@pytest.mark.parametrize("order", [1, -1])
def test_entropy_precedence_does_not_depend_on_key_order(order: int) -> None:
    logged = [("actor/entropy_loss", 0.40), ("actor/entropy", 0.41)]
    assert metrics(**dict(logged[::order]))["entropy/mean"] == 0.41
    canonical = [("policy/entropy", 0.3), ("entropy/mean", 0.2)]
    assert metrics(**dict(canonical[::order]))["entropy/mean"] == 0.2


@pytest.mark.parametrize("order", [1, -1])
def test_bare_name_outranks_its_train_prefixed_form(order: int) -> None:
    logged = [("train/kl", 0.9), ("kl", 0.1)]
    assert metrics(**dict(logged[::order]))["kl/mean"] == 0.1
    assert metrics(**{"train/completion_length": 88.0}) == {"response/len_mean": 88.0}


def test_spaces_around_a_slash_are_ignored_for_matching_only() -> None:
    # Hugging Face's notebook table writes "rewards / check_answer" for rewards/check_answer.
    assert canonical_key("completions / mean_length") == "response/len_mean"
    assert match_key("train / kl") == match_key("train/kl")
    assert canonical_key("rewards / check_answer") is None
    # An unknown key is exported as it was logged.
    assert unknown(**{"rewards / check_answer": 1.0}) == {"rewards / check_answer": 1.0}


def test_ranks_are_the_listed_order() -> None:
    # keys.py documents precedence by the order of the aliases; pin the decisions made there.
    ranks = {n: match_key(n).rank for n in (  # type: ignore[union-attr]
        "kl/mean", "kl", "actor/reward_kl_penalty", "critic/kl", "actor/kl_loss", "train/kl")}
    assert sorted(ranks, key=ranks.__getitem__) == [
        "kl/mean", "kl", "actor/reward_kl_penalty", "critic/kl", "actor/kl_loss", "train/kl"]


# -- rollout vs trainer, staleness, dead groups: the names the newest stacks log ---------------
# Each name below is the one the framework's source writes (file and line in
# docs/snapshot-format.md#rollout-vs-trainer-staleness-and-dead-groups), as a record carries it.


def test_verl_rollout_correction_and_debug_metrics_map_onto_mismatch_keys() -> None:
    # verl/trainer/ppo/rollout_corr_helper.py prefixes every metric with rollout_corr/;
    # verl/utils/debug/metrics.py logs the training/rollout_* ones (calculate_log_probs=True).
    logged = {
        "rollout_corr/kl": 0.004, "rollout_corr/k3_kl": 0.003, "rollout_corr/chi2_token": 0.02,
        "rollout_corr/chi2_seq": 0.6, "rollout_corr/ppl_ratio": 1.01,
        "rollout_corr/rollout_is_mean": 0.99, "rollout_corr/rollout_is_min": 0.2,
        "rollout_corr/rollout_is_max": 1.9, "rollout_corr/rollout_is_eff_sample_size": 0.97,
        "training/rollout_probs_diff_mean": 0.01, "training/rollout_probs_diff_max": 0.8,
        "training/rollout_probs_diff_std": 0.03, "training/rollout_actor_probs_pearson_corr": 0.998,
    }
    rec = parse_record({"step": 7, "data": logged}, run="r", rank=0, mtime=0.0)
    assert rec.metrics == {
        "mismatch/kl": 0.004, "mismatch/k3_kl": 0.003, "mismatch/chi2_token": 0.02,
        "mismatch/chi2_seq": 0.6, "mismatch/ppl_ratio": 1.01, "mismatch/is_weight_mean": 0.99,
        "mismatch/is_weight_min": 0.2, "mismatch/is_weight_max": 1.9,
        "mismatch/is_ess_ratio": 0.97, "mismatch/prob_diff_mean": 0.01,
        "mismatch/prob_diff_max": 0.8, "mismatch/prob_diff_std": 0.03,
        "mismatch/prob_corr": 0.998,
    }
    assert rec.unknown == {}


@pytest.mark.parametrize(("name", "key"), [
    # verl's v1 trainer (verl/trainer/ppo/v1/trainer_base.py): how many policy versions behind the
    # current one a trajectory's newest weights are.
    ("training/off_policy/trajectory_staleness/mean", "staleness/mean"),
    ("training/off_policy/trajectory_staleness/max", "staleness/max"),
    # verl's fully_async trainer and rollouter: running totals, "last" under aggregation.
    ("fully_async/count/stale_trajectory_processed", "staleness/stale_trajectories"),
    ("fully_async/count/dropped_stale_samples", "staleness/dropped_samples"),
])
def test_verl_staleness_names_map_onto_staleness_keys(name: str, key: str) -> None:
    assert canonical_key(name) == key
    assert parse_record({"step": 3, "data": {name: 2.0}}, run="r", rank=0, mtime=0.0).metrics == {
        key: 2.0}


@pytest.mark.parametrize("prefix", ["", "train/"])
def test_trl_sampling_metrics_map_onto_mismatch_keys(prefix: str) -> None:
    # GRPOTrainer with use_vllm and vllm_importance_sampling_correction (the default) logs these;
    # Hugging Face's wandb integration adds train/.
    logged = {"sampling/sampling_logp_difference/mean": 0.012,
              "sampling/sampling_logp_difference/max": 3.1,
              "sampling/importance_sampling_ratio/min": 0.05,
              "sampling/importance_sampling_ratio/mean": 0.98,
              "sampling/importance_sampling_ratio/max": 2.9}
    assert metrics(**{prefix + k: v for k, v in logged.items()}) == {
        "mismatch/logprob_diff_mean": 0.012, "mismatch/logprob_diff_max": 3.1,
        "mismatch/is_weight_min": 0.05, "mismatch/is_weight_mean": 0.98,
        "mismatch/is_weight_max": 2.9}


def test_nemo_rl_train_prefixed_names_map_onto_their_keys() -> None:
    # NeMo-RL logs the loss function's metrics and the async buffer's age with prefix="train".
    rec = parse_record({"step": 12, "train/token_mult_prob_error": 1.004,
                        "train/gen_kl_error": 0.0007, "train/avg_trajectory_age": 1.5,
                        "train/policy_kl_error": 0.0008, "train/js_divergence_error": 0.0002},
                       run="r", rank=0, mtime=0.0)
    assert rec.metrics == {"mismatch/token_prob_error": 1.004, "mismatch/kl": 0.0007,
                           "staleness/mean": 1.5}
    # KL(trainer || rollout) and the Jensen-Shannon divergence: no canonical key of theirs.
    assert rec.unknown == {"train/policy_kl_error": 0.0008, "train/js_divergence_error": 0.0002}


def test_slime_logprob_difference_maps_with_its_train_prefix() -> None:
    # slime (and its fork MILES) report the loss's metrics as train/<name>.
    assert metrics(**{"train/train_rollout_logprob_abs_diff": 0.02}) == {
        "mismatch/logprob_diff_mean": 0.02}
    # Counts of zero-std groups per reward value, not fractions: no group/* key can take them.
    assert unknown(**{"rollout/zero_std/count_0.0": 12.0}) == {"rollout/zero_std/count_0.0": 12.0}


@pytest.mark.parametrize(("name", "key"), [
    # MILES logs the share of groups whose rewards are all 0 resp. all 1 under the rollout/
    # prefix; named "percentage", the values are fractions (0-1) since its merge.
    ("rollout/zero_std/all_zero_percentage", "group/all_wrong_frac"),
    ("rollout/zero_std/all_one_percentage", "group/all_right_frac"),
])
def test_dead_group_fractions_by_cause_map_onto_group_keys(name: str, key: str) -> None:
    assert canonical_key(name) == key
    assert metrics(**{name: 0.25}) == {key: 0.25}


@pytest.mark.parametrize("name", [
    "training/rollout_probs_diff_valid",  # a 0/1 flag: the diff metrics were computed
    "rollout_corr/rollout_is_std", "rollout_corr/log_ppl_abs_diff",  # no canonical key of theirs
    "rollout_corr/training_ppl", "rollout_corr/rollout_ppl",
    "fully_async/count/current_param_version",  # the policy version, not an age
])
def test_neighbouring_rollout_names_stay_unmapped(name: str) -> None:
    assert canonical_key(name) is None
    assert unknown(**{name: 0.5}) == {name: 0.5}


@pytest.mark.parametrize("name", [
    "reward/accuracy",  # EasyR1's accuracy term beside reward/format and reward/overall
    "reward/correctness_f", "reward/acc",  # loops that log their reward's terms
    "rewards/accuracy_reward/mean",  # TRL's accuracy reward function
    "rewards/correctness_reward_func", "rewards / correctness_reward_func",  # Unsloth's notebooks
    "mean_correct", "correctness", "train/accuracy", "is_correct",
])
def test_a_reward_term_that_names_correctness_is_the_sample_accuracy(name: str) -> None:
    hit = match_key(name)
    assert hit is not None and (hit.key, hit.how) == ("eval/sample_acc", "accuracy")
    assert metrics(**{name: 0.25}) == {"eval/sample_acc": 0.25}


@pytest.mark.parametrize(("name", "key"), [
    # another statistic of it, or a share of groups: never the batch's accuracy
    ("format_accuracy", None), ("accuracy_given_parseable", None), ("reward/std/acc", None),
    ("rewards/accuracy_reward/std", None), ("frac_all_correct", None),
    ("mixed_cuts/all_correct_frac", None), ("rewards/check_answer", None),
    # a held-out namespace wins: the accuracy of held-out prompts, not of the batch
    ("eval_accuracy", "eval/heldout_score"), ("val/acc", "eval/heldout_score"),
    ("gold_acc", "eval/heldout_score"),
])
def test_a_correctness_name_with_more_in_it_is_not_the_sample_accuracy(name: str,
                                                                       key: str | None) -> None:
    assert canonical_key(name) == key


def test_a_listed_accuracy_outranks_one_read_by_its_words() -> None:
    # ROLL's critic/correct/mean is listed; a record that also logs its reward's accuracy term
    # is read by the listed name, whichever comes first.
    for order in ({"reward/accuracy": 0.1, "critic/correct/mean": 0.4},
                  {"critic/correct/mean": 0.4, "reward/accuracy": 0.1}):
        assert metrics(**order)["eval/sample_acc"] == 0.4

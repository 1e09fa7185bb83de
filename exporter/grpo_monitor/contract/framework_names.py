"""The names each RL framework logs a signal under, read in its own source, and how to recognise it.

keys.py lists the names of the frameworks the contract grew up with (TRL, verl, OpenRLHF's and
slime's basics) beside each canonical key. This table adds, framework by framework, the names
read in the other frameworks' logging code, each with the file it is logged from, so that a
run of any of them is read without a key map and a reader can check each entry where it came
from. docs/frameworks.md is generated from it (tools/frameworks_doc.py).

Three kinds of entry:

* :data:`NAMES`: a name (or a glob, for names with a data-dependent segment such as prime-rl's
  ``train/agg/all/<agent>/reward/mean``) that stands for a canonical key, in that key's unit (a
  ``scale`` converts, e.g. a percent). Ranked after keys.py's own aliases.
* :data:`FALSE_FRIENDS`: names that look like a signal and are something else (a group-
  normalised reward, a cumulative wall clock, a perplexity where lower is better, a gold metric
  beside a proxy reward that is not the batch's sample accuracy). Never matched by the
  vocabulary, never proposed by ``check``; a user's key map may still send one where it belongs.
* :data:`FINGERPRINTS`: names only one framework logs, most specific first: the run's framework
  in ``check``, the armed table and the coverage card's hints.

What is deliberately absent: names that are counts or complements of a signal (slime's
``rollout/zero_std/count_*``, Tinker's ``frac_mixed``), per-sequence sums where the key is per
token (LLaMA-Factory's ``objective/kl``, Oat's ``train/kl3``), and names whose meaning the source
leaves open (AReaL's behaviour-policy weights mix engine mismatch and staleness).

Standard library only: the trainer side imports keys.py, which imports this.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FrameworkName:
    """``name`` (exact, or a glob with ``*``) stands for canonical ``key`` in ``framework``'s logs,
    logged from ``source`` (a path in its repository); ``scale`` converts to the key's unit."""

    name: str
    key: str
    framework: str
    source: str
    scale: float = 1.0
    note: str = ""

    @property
    def is_glob(self) -> bool:
        return "*" in self.name


_N = FrameworkName

NAMES: tuple[FrameworkName, ...] = (
    # -- OpenRLHF (openrlhf/trainer/ppo_trainer.py, trainer/ray/ppo_actor.py) -------------------
    _N("train/truncated", "response/clip_ratio", "openrlhf", "openrlhf/trainer/ppo_utils/experience.py",
       note="mean of the samples' truncation flags"),
    _N("train/vllm_kl", "mismatch/kl", "openrlhf", "openrlhf/trainer/ray/ppo_actor.py",
       note="vLLM's token log-probabilities against the trainer's"),
    # -- NeMo-RL (nemo_rl/algorithms/grpo.py, nemo_rl/experience/rollouts.py) --------------------
    _N("train/mean_gen_tokens_per_sample", "response/len_mean", "nemo-rl", "nemo_rl/experience/rollouts.py"),
    _N("train/max_gen_tokens_per_sample", "response/len_max", "nemo-rl", "nemo_rl/experience/rollouts.py"),
    _N("train/approx_entropy", "entropy/mean", "nemo-rl", "nemo_rl/algorithms/loss/loss_functions.py"),
    _N("train/kl_penalty", "kl/mean", "nemo-rl", "nemo_rl/algorithms/loss/loss_functions.py",
       note="the KL to the reference before its coefficient"),
    _N("train/baseline_reward/pct_0", "group/all_wrong_frac", "nemo-rl", "nemo_rl/algorithms/grpo.py",
       0.01, "a percent of the groups whose rewards are all 0"),
    _N("train/baseline_reward/pct_1", "group/all_right_frac", "nemo-rl", "nemo_rl/algorithms/grpo.py",
       0.01, "a percent of the groups whose rewards are all 1"),
    _N("timing/train/total_step_time", "perf/step_time_s", "nemo-rl", "nemo_rl/algorithms/grpo.py"),
    # -- AReaL (areal/trainer/ppo/actor.py, areal/engine/fsdp_engine.py) -------------------------
    _N("ppo_actor/task_reward/avg", "reward/mean", "areal", "areal/trainer/ppo/actor.py"),
    _N("ppo_actor/task_reward/min", "reward/min", "areal", "areal/trainer/ppo/actor.py"),
    _N("ppo_actor/task_reward/max", "reward/max", "areal", "areal/trainer/ppo/actor.py"),
    _N("ppo_actor/no_eos_ratios/avg", "response/clip_ratio", "areal", "areal/trainer/ppo/actor.py",
       note="the share of answers that reached the length limit"),
    _N("ppo_actor/update/entropy/avg", "entropy/mean", "areal", "areal/trainer/ppo/actor.py"),
    _N("ppo_actor/update/grad_norm", "grad/norm", "areal", "areal/engine/fsdp_engine.py"),
    _N("ppo_actor/update/lr", "train/lr", "areal", "areal/engine/fsdp_engine.py"),
    _N("ppo_actor/update/clip_ratio/avg", "policy/clip_frac", "areal", "areal/trainer/ppo/actor.py"),
    _N("eval-rollout/reward", "eval/heldout_score", "areal", "areal/infra/workflow_context.py"),
    # -- SkyRL (skyrl/train/trainer.py, skyrl/train/generators/utils.py) --------------------------
    _N("reward/avg_raw_reward", "reward/mean", "skyrl", "skyrl/train/trainer.py"),
    _N("generate/avg_num_tokens", "response/len_mean", "skyrl", "skyrl/train/generators/utils.py"),
    _N("generate/max_num_tokens", "response/len_max", "skyrl", "skyrl/train/generators/utils.py"),
    _N("policy/loss_metrics/clip_ratio", "policy/clip_frac", "skyrl",
       "skyrl/backends/skyrl_train/utils/ppo_utils.py"),
    _N("timing/step", "perf/step_time_s", "skyrl", "skyrl/train/trainer.py"),
    _N("trainer/tokens_per_second_per_gpu", "perf/tokens_per_s", "skyrl", "skyrl/train/trainer.py",
       note="per GPU"),
    _N("policy/rollout_train_logprobs_abs_diff_mean", "mismatch/logprob_diff_mean", "skyrl",
       "skyrl/train/trainer.py"),
    _N("policy/rollout_train_logprobs_abs_diff_max", "mismatch/logprob_diff_max", "skyrl",
       "skyrl/train/trainer.py"),
    # -- ROLL (roll/pipeline/rlvr/metrics_manager.py, rlvr_pipeline.py) ---------------------------
    _N("critic/correct/mean", "eval/sample_acc", "roll", "roll/pipeline/rlvr/metrics_manager.py",
       note="the training batch's accuracy, not a held-out one"),
    _N("group/all_correct_groups_ratio", "group/all_right_frac", "roll", "roll/pipeline/rlvr/metrics_manager.py"),
    _N("group/all_incorrect_groups_ratio", "group/all_wrong_frac", "roll", "roll/pipeline/rlvr/metrics_manager.py"),
    _N("token/response_length/mean", "response/len_mean", "roll", "roll/pipeline/rlvr/metrics_manager.py"),
    _N("token/response_length/max", "response/len_max", "roll", "roll/pipeline/rlvr/metrics_manager.py"),
    _N("critic/entropy/mean", "entropy/mean", "roll", "roll/pipeline/rlvr/metrics_manager.py"),
    _N("actor/ppo_ratio_clipfrac", "policy/clip_frac", "roll", "roll/pipeline/rlvr/actor_worker.py"),
    _N("val_correct/all/mean", "eval/heldout_score", "roll", "roll/pipeline/rlvr/rlvr_pipeline.py"),
    _N("time/step_total", "perf/step_time_s", "roll", "roll/pipeline/rlvr/rlvr_pipeline.py"),
    # -- slime (slime/ray/rollout.py, slime/backends/megatron_utils/model.py) ---------------------
    _N("rollout/raw_reward", "reward/mean", "slime", "slime/ray/rollout.py",
       note="the raw reward; rollout/rewards is the group-normalised one"),
    _N("train/lr-pg_0", "train/lr", "slime", "slime/backends/megatron_utils/model.py"),
    _N("perf/tokens_per_gpu_per_sec", "perf/tokens_per_s", "slime", "slime/ray/rollout_metrics.py",
       note="per GPU, rollout side"),
    # -- prime-rl (src/prime_rl/orchestrator/metrics.py, src/prime_rl/trainer/rl/train.py) --------
    # <agent> is the run's agent name; the ``all`` subset is every rollout (``effective`` only
    # the groups that train, never read).
    _N("train/agg/all/*/reward/mean", "reward/mean", "prime-rl", "src/prime_rl/orchestrator/metrics.py"),
    _N("train/agg/all/*/reward/min", "reward/min", "prime-rl", "src/prime_rl/orchestrator/metrics.py"),
    _N("train/agg/all/*/reward/max", "reward/max", "prime-rl", "src/prime_rl/orchestrator/metrics.py"),
    _N("train/agg/all/*/solved_none", "group/all_wrong_frac", "prime-rl", "src/prime_rl/orchestrator/metrics.py"),
    _N("train/agg/all/*/solved_all", "group/all_right_frac", "prime-rl", "src/prime_rl/orchestrator/metrics.py"),
    _N("train/agg/all/*/is_truncated/mean", "response/clip_ratio", "prime-rl", "src/prime_rl/orchestrator/metrics.py"),
    _N("train/agg/all/num_output_tokens/mean", "response/len_mean", "prime-rl", "src/prime_rl/orchestrator/metrics.py"),
    _N("train/agg/all/num_output_tokens/max", "response/len_max", "prime-rl", "src/prime_rl/orchestrator/metrics.py"),
    _N("entropy/all/mean", "entropy/mean", "prime-rl", "src/prime_rl/trainer/rl/train.py"),
    _N("optim/grad_norm", "grad/norm", "prime-rl", "src/prime_rl/trainer/rl/train.py"),
    _N("optim/lr", "train/lr", "prime-rl", "src/prime_rl/trainer/rl/train.py"),
    _N("off_policy/mean", "staleness/mean", "prime-rl", "src/prime_rl/orchestrator/orchestrator.py",
       note="the rollouts' age in steps"),
    _N("off_policy/max", "staleness/max", "prime-rl", "src/prime_rl/orchestrator/orchestrator.py"),
    _N("mismatch_kl/all/mean", "mismatch/kl", "prime-rl", "src/prime_rl/trainer/rl/train.py"),
    _N("eval/*/all/*/avg@*", "eval/heldout_score", "prime-rl", "src/prime_rl/orchestrator/metrics.py",
       note="the mean score over k samples per problem"),
    # -- verifiers (verifiers/rl/trainer/orchestrator.py) -------------------------------------
    _N("advantage/absmean", "adv/mean_abs", "verifiers", "verifiers/rl/trainer/orchestrator.py"),
    # -- EasyR1 (verl/trainer/ray_trainer.py of its fork) -------------------------------------
    _N("actor/kl_penalty", "kl/mean", "easyr1", "verl/trainer/ray_trainer.py", note="the KL in the reward"),
    _N("val/reward_score", "eval/heldout_score", "easyr1", "verl/trainer/ray_trainer.py"),
    # -- ms-swift (swift/trainers/rlhf_trainer/grpo_trainer.py, swift/trainers/patcher.py) --------
    _N("train_speed(s/it)", "perf/step_time_s", "ms-swift", "swift/trainers/patcher.py"),
    _N("rollout_correction/kl", "mismatch/kl", "ms-swift", "swift/trainers/rlhf_trainer/grpo_trainer.py"),
    _N("rollout_correction/k3_kl", "mismatch/k3_kl", "ms-swift", "swift/trainers/rlhf_trainer/grpo_trainer.py"),
    _N("rollout_correction/is_weight_mean", "mismatch/is_weight_mean", "ms-swift",
       "swift/trainers/rlhf_trainer/grpo_trainer.py"),
    _N("rollout_correction/chi2_token", "mismatch/chi2_token", "ms-swift",
       "swift/trainers/rlhf_trainer/grpo_trainer.py"),
    _N("rollout_correction/ppl_ratio", "mismatch/ppl_ratio", "ms-swift",
       "swift/trainers/rlhf_trainer/grpo_trainer.py"),
    # -- LLaMA-Factory (its PPO workflow logs TRL 0.9's PPOTrainer stats: trl/trainer/ppo_trainer.py)
    _N("ppo/mean_scores", "reward/mean", "llama-factory", "trl/trainer/ppo_trainer.py (v0.9.6)",
       note="the score before the KL penalty"),
    _N("ppo/std_scores", "reward/std", "llama-factory", "trl/trainer/ppo_trainer.py (v0.9.6)"),
    _N("env/reward_mean", "reward/mean", "llama-factory", "trl/trainer/ppo_trainer.py (v0.9.6)"),
    _N("env/reward_std", "reward/std", "llama-factory", "trl/trainer/ppo_trainer.py (v0.9.6)"),
    _N("tokens/responses_len_mean", "response/len_mean", "llama-factory", "trl/trainer/ppo_trainer.py (v0.9.6)"),
    _N("ppo/policy/entropy", "entropy/mean", "llama-factory", "trl/trainer/ppo_trainer.py (v0.9.6)"),
    _N("ppo/learning_rate", "train/lr", "llama-factory", "trl/trainer/ppo_trainer.py (v0.9.6)"),
    _N("ppo/loss/policy", "loss", "llama-factory", "trl/trainer/ppo_trainer.py (v0.9.6)"),
    _N("ppo/policy/clipfrac", "policy/clip_frac", "llama-factory", "trl/trainer/ppo_trainer.py (v0.9.6)"),
    _N("time/ppo/total", "perf/step_time_s", "llama-factory", "trl/trainer/ppo_trainer.py (v0.9.6)"),
    # -- ART (src/art/model.py, src/art/local/backend.py) -------------------------------------
    _N("reward/std_dev", "group/reward_std", "art", "src/art/model.py",
       note="the mean within-group spread, not the batch's"),
    _N("train/reward_std_dev", "group/reward_std", "art", "src/art/local/backend.py"),
    _N("loss/kl_policy_ref", "kl/mean", "art", "src/art/model.py"),
    _N("loss/grad_norm", "grad/norm", "art", "src/art/model.py"),
    _N("loss/learning_rate", "train/lr", "art", "src/art/model.py"),
    _N("loss/train", "loss", "art", "src/art/model.py"),
    # -- Oat (oat/learners/rl.py, oat/algorithms/ppo.py) --------------------------------------
    _N("actor/rewards_std_per_prompt", "group/reward_std", "oat", "oat/oracles/reward.py"),
    _N("actor/response_tok_len", "response/len_mean", "oat", "oat/algorithms/ppo.py"),
    _N("misc/lr", "train/lr", "oat", "oat/learners/rl.py"),
    _N("train/kl_sample_train_v1", "mismatch/kl", "oat", "oat/algorithms/ppo.py",
       note="sampler against learner, k1 estimator (can be negative)"),
    # -- rLLM (rllm/trainer/verl/agent_workflow_trainer.py, rllm/algorithms/advantage.py) ----------
    _N("batch/solve_none", "group/all_wrong_frac", "rllm", "rllm/trainer/verl/agent_workflow_trainer.py"),
    _N("batch/solve_all", "group/all_right_frac", "rllm", "rllm/trainer/verl/agent_workflow_trainer.py"),
    _N("batch/*/fractions/too_hard", "group/all_wrong_frac", "rllm", "rllm/algorithms/advantage.py"),
    _N("batch/*/fractions/too_easy", "group/all_right_frac", "rllm", "rllm/algorithms/advantage.py"),
    # -- Tinker cookbook (tinker_cookbook/rl/metric_util.py, rl/metrics.py, rl/train.py) ----------
    _N("env/all/reward/total", "reward/mean", "tinker", "tinker_cookbook/rl/metric_util.py",
       note="each episode's total over its turns, averaged over episodes"),
    _N("env/all/by_group/frac_all_good", "group/all_right_frac", "tinker", "tinker_cookbook/rl/metric_util.py"),
    _N("env/all/by_group/frac_all_bad", "group/all_wrong_frac", "tinker", "tinker_cookbook/rl/metric_util.py"),
    _N("optim/entropy", "entropy/mean", "tinker", "tinker_cookbook/rl/metrics.py",
       note="minus the sampled tokens' mean log-probability"),
    _N("kl_policy_base", "kl/mean", "tinker", "tinker_cookbook/rl/metrics.py"),
    _N("optim/kl_sample_train_v1", "mismatch/kl", "tinker", "tinker_cookbook/rl/metrics.py"),
    _N("time/total", "perf/step_time_s", "tinker", "tinker_cookbook/utils/trace.py"),
)


@dataclass(frozen=True)
class FalseFriend:
    """A name (or glob) that must never be read as the signal it resembles."""

    name: str
    framework: str
    why: str


_F = FalseFriend

FALSE_FRIENDS: tuple[FalseFriend, ...] = (
    _F("rollout/rewards", "slime", "the group-normalised reward, about 0: its raw reward is rollout/raw_reward"),
    _F("loss/kl_div", "art", "a KL whose reference the source does not establish"),
    _F("train/ppo_kl", "openrlhf", "the KL between the rollout policy and the updated one, not to the reference"),
    _F("actor/approxkl", "roll", "the old-vs-new policy KL"),
    _F("actor/policykl", "roll", "the old-vs-new policy KL"),
    _F("ppo/policy/approxkl", "llama-factory", "the old-vs-new policy KL"),
    _F("ppo/policy/policykl", "llama-factory", "the old-vs-new policy KL"),
    _F("ppo_actor/update/approx_kl/*", "areal", "the old-vs-new policy KL"),
    _F("objective/kl", "llama-factory", "the KL summed over a sequence, not per token"),
    _F("train/kl3", "oat", "the k3 KL summed over a sequence, not per token"),
    _F("ppo_actor/kl_rewards/*", "areal", "minus the KL coefficient times the KL"),
    _F("objective/entropy", "llama-factory", "the entropy summed over a sequence"),
    _F("entropy/threshold", "ms-swift", "a threshold the trainer sets, not the policy's entropy"),
    _F("*/frac_mixed", "tinker", "the complement of the zero-spread groups"),
    _F("*/pct_mixed", "nemo-rl", "a percent, the complement of the zero-spread groups"),
    _F("*/fractions/effective", "rllm", "the complement of the zero-spread groups"),
    _F("*perplexity*", "", "a perplexity: lower is better, the opposite of a score"),
    _F("*elapsed*", "", "a cumulative wall clock, not one step's time"),
    _F("time/wall_clock_sec", "art", "a cumulative wall clock, not one step's time"),
    _F("*completion_tokens", "", "a token count, not a length per answer or a throughput"),
    _F("_step_inferred", "", "a step number a log parser counted"),
    _F("*global_step", "", "a step counter"),
)


# Names only one framework logs, most specific first: a fork or a framework built on another
# logs much of its parent's names too, so its own names must be looked for before the parent's
# (EasyR1, ROLL and rLLM log verl's; ms-swift and Unsloth TRL's).
FINGERPRINTS: tuple[tuple[str, str], ...] = (
    ("openrlhf", "train/rollout/reward_mean"), ("openrlhf", "train/actor_grad_norm"),
    ("openrlhf", "train/vllm_kl"), ("openrlhf", "train/dynamic_filtering_pass_rate"),
    ("nemo-rl", "train/approx_entropy"), ("nemo-rl", "train/token_mult_prob_error"),
    ("nemo-rl", "train/mean_gen_tokens_per_sample"), ("nemo-rl", "timing/train/total_step_time"),
    ("areal", "ppo_actor/task_reward/avg"), ("areal", "ppo_actor/no_eos_ratios/avg"),
    ("skyrl", "reward/avg_raw_reward"), ("skyrl", "generate/avg_num_tokens"),
    ("skyrl", "policy/policy_entropy"),
    ("roll", "critic/entropy/mean"), ("roll", "group/all_correct_groups_ratio"),
    ("roll", "token/response_length/mean"), ("roll", "val_correct/all/mean"),
    ("slime", "rollout/raw_reward"), ("slime", "train/lr-pg_0"), ("slime", "rollout/response_len/median"),
    ("prime-rl", "entropy/all/mean"), ("prime-rl", "mismatch_kl/all/mean"), ("prime-rl", "off_policy/mean"),
    ("verifiers", "advantage/absmean"), ("verifiers", "tokens/masked_fraction"),
    ("easyr1", "actor/pg_clipfrac_higher"), ("easyr1", "val/reward_score"), ("easyr1", "actor/kl_penalty"),
    ("ms-swift", "num_turns"), ("ms-swift", "train_speed(s/it)"), ("ms-swift", "rollout_correction/kl"),
    ("llama-factory", "ppo/mean_scores"), ("llama-factory", "tokens/responses_len_mean"),
    ("art", "reward/std_dev"), ("art", "loss/kl_policy_ref"), ("art", "train/num_groups_trainable"),
    ("oat", "actor/response_tok_len"), ("oat", "train/kl3"), ("oat", "misc/lr"),
    ("rllm", "batch/solve_none"), ("rllm", "batch/solve_all"),
    ("tinker", "env/all/reward/total"), ("tinker", "env/all/by_group/frac_all_good"),
    ("tinker", "optim/kl_sample_train_v1"), ("tinker", "progress/done_frac"),
)

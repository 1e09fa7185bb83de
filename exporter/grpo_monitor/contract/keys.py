"""The canonical signal keys of snapshot contract v1, their aliases and their metric names.

This table is the single source of truth for three public interfaces: the keys a trainer may
write, the alias names of TRL / verl / OpenRLHF / NeMo-RL / slime that map onto them, and the
Prometheus series each key becomes. docs/metrics.md is generated from it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import lru_cache

from grpo_monitor.contract import framework_names, vocabulary


@dataclass(frozen=True)
class Signal:
    """One canonical key and the series it is exported as."""

    key: str
    metric: str
    help: str
    unit: str
    # Other names of the key, most trusted first: when a record carries several of them (and not
    # the canonical key itself), the first listed wins, whatever the record's key order.
    aliases: tuple[str, ...] = ()
    # Extra constant labels, e.g. {"quantile": "0.95"} for the quantile families.
    labels: tuple[tuple[str, str], ...] = field(default=())
    # Aliases logged in another unit: (name, factor to the canonical unit), e.g. older verl's
    # ``actor/lr(1e-4)``, the learning rate in units of 1e-4. They rank after ``aliases``.
    scaled: tuple[tuple[str, float], ...] = field(default=())


SIGNALS: tuple[Signal, ...] = (
    # Reward feedback (background.md#reward-feedback).
    Signal("reward/mean", "grpo_reward_mean", "Mean reward over the step's rollouts.", "reward",
           # rewards/mean, ...: a loop's plural namespace (TRL's rewards/<function>/mean are
           # the reward functions', left unmapped: KNOWN_UNMAPPED).
           ("reward_mean", "reward", "critic/score/mean", "rollout/reward_mean", "rewards/mean")),
    Signal("reward/std", "grpo_reward_std", "Standard deviation of the step's rewards.", "reward",
           # TRL before 0.22 (Aug 2025) logged the mean within-group std as reward_std, since
           # then the batch std; the name cannot tell them apart.
           ("reward_std", "rollout/reward_std", "critic/score/std", "rewards/std")),
    Signal("reward/min", "grpo_reward_min", "Smallest reward of the step.", "reward",
           ("reward_min", "critic/score/min", "rewards/min")),
    Signal("reward/max", "grpo_reward_max", "Largest reward of the step.", "reward",
           ("reward_max", "critic/score/max", "rewards/max")),
    Signal("reward/p25", "grpo_reward_quantile", "Reward quantiles of the step.", "reward",
           ("reward_p25", "reward_quantiles/25"), (("quantile", "0.25"),)),
    Signal("reward/p50", "grpo_reward_quantile", "Reward quantiles of the step.", "reward",
           ("reward/median", "reward_median", "reward_p50", "reward_quantiles/50"),
           (("quantile", "0.5"),)),
    Signal("reward/p75", "grpo_reward_quantile", "Reward quantiles of the step.", "reward",
           ("reward_p75", "reward_quantiles/75"), (("quantile", "0.75"),)),
    Signal("reward/p95", "grpo_reward_quantile", "Reward quantiles of the step.", "reward",
           ("reward_p95", "reward_quantiles/95"), (("quantile", "0.95"),)),
    Signal("group/reward_gap", "grpo_group_reward_gap",
           "Mean over prompt groups of the max - min reward within the group.", "reward",
           ("group_reward_gap",)),
    Signal("group/reward_std", "grpo_group_reward_std",
           "Mean over prompt groups of the reward standard deviation within the group.", "reward",
           ("group_reward_std",)),
    Signal("group/zero_std_frac", "grpo_group_zero_std_ratio",
           "Fraction of prompt groups whose rewards are all equal (zero advantage).", "ratio",
           ("frac_reward_zero_std", "group_zero_std_frac", "zero_std_frac", "zero_adv_frac")),
    Signal("adv/mean_abs", "grpo_advantage_abs_mean", "Mean absolute group-normalised advantage.",
           "advantage", ("advantage_mean_abs", "adv_abs_mean")),
    # Distribution stability (background.md#distribution-stability).
    # Only KL to the reference model. verl's actor/ppo_kl and OpenRLHF's ppo_kl are the KL
    # between the rollout policy and the updated one (the PPO step size) and stay unmapped.
    # verl logs the reference KL as actor/reward_kl_penalty (KL in the reward; critic/kl before
    # April 2025) or as actor/kl_loss (use_kl_loss; the value before its coefficient). The reward
    # penalty ranks first: it appears only when that KL is computed, while recent verl logs
    # actor/kl_loss as 0.0 even when use_kl_loss is off.
    Signal("kl/mean", "grpo_kl_mean", "Mean KL divergence of the policy to the reference model.",
           "nats", ("kl_mean", "kl", "actor/reward_kl_penalty", "critic/kl", "actor/kl_loss")),
    Signal("kl/p50", "grpo_kl_quantile", "Quantiles of the per-sequence KL to the reference.",
           "nats", ("kl_p50",), (("quantile", "0.5"),)),
    Signal("kl/p95", "grpo_kl_quantile", "Quantiles of the per-sequence KL to the reference.",
           "nats", ("kl_p95",), (("quantile", "0.95"),)),
    Signal("kl/p99", "grpo_kl_quantile", "Quantiles of the per-sequence KL to the reference.",
           "nats", ("kl_p99",), (("quantile", "0.99"),)),
    Signal("kl/max", "grpo_kl_max", "Largest per-sequence KL to the reference.", "nats",
           ("kl_max",)),
    # Policy behaviour (background.md#policy-behaviour).
    # verl before June 2025 logged the mean token entropy as actor/entropy_loss: the entropy
    # itself (positive; the loss subtracts coefficient x entropy), not a loss term; recent verl
    # logs the same value under that name next to actor/entropy, which ranks first. A bare
    # ``entropy_loss`` is left unmapped: OpenRLHF's is +entropy, Stable-Baselines3's -entropy.
    Signal("entropy/mean", "grpo_entropy_mean", "Mean token entropy of the policy.", "nats",
           ("entropy", "entropy_mean", "actor/entropy", "policy/entropy", "actor/entropy_loss",
            "token_entropy")),
    Signal("response/len_mean", "grpo_response_length_mean_tokens", "Mean response length.",
           # completion_length: TRL GRPO from Jan to Apr 2025 (and Unsloth notebooks of then).
           "tokens", ("response_len_mean", "completions/mean_length", "response_length/mean",
                      "response_length", "completion_length")),
    Signal("response/len_max", "grpo_response_length_max_tokens", "Longest response length.",
           "tokens", ("response_len_max", "completions/max_length", "response_length/max")),
    Signal("response/clip_ratio", "grpo_response_truncated_ratio",
           "Fraction of responses cut at the generation length limit.", "ratio",
           ("response_clip_ratio", "completions/clipped_ratio", "response_length/clip_ratio")),
    Signal("policy/clip_frac", "grpo_policy_clip_ratio",
           "Fraction of tokens whose probability ratio hit the PPO clip range.", "ratio",
           ("clip_frac", "clip_ratio/region_mean", "actor/pg_clipfrac", "ppo_clip_ratio", "clip_ratio")),
    # Dead groups by cause: a group whose answers are all wrong (the prompt is too hard) and one
    # whose answers are all right (too easy) both have zero advantage, with opposite fixes.
    Signal("group/all_wrong_frac", "grpo_group_all_wrong_ratio",
           "Fraction of prompt groups whose responses are all wrong (all minimum reward).", "ratio",
           # MILES logs fractions under a *_percentage name, with its rollout/ prefix.
           ("rollout/zero_std/all_zero_percentage",)),
    Signal("group/all_right_frac", "grpo_group_all_right_ratio",
           "Fraction of prompt groups whose responses are all right (all maximum reward).", "ratio",
           ("rollout/zero_std/all_one_percentage",)),
    # The covariance that drives entropy (arXiv 2505.22617): under a policy-gradient step the
    # token entropy changes by about -(step size) x Cov(log pi(a), A) over the batch's tokens.
    Signal("entropy/logp_adv_cov", "grpo_entropy_logprob_advantage_covariance",
           "Covariance of the sampled tokens' log-probability and their advantage over the step's "
           "response tokens; a large positive value drives entropy down.", "nats x advantage"),
    # Dr. GRPO's length bias (arXiv 2503.20783): per-response length normalisation lets wrong
    # answers grow longer.
    Signal("response/len_correct_mean", "grpo_response_length_correct_mean_tokens",
           "Mean length of the responses graded correct.", "tokens"),
    Signal("response/len_incorrect_mean", "grpo_response_length_incorrect_mean_tokens",
           "Mean length of the responses graded incorrect.", "tokens"),
    # Rollout vs trainer: the training-inference mismatch. The rollout engine (vLLM, SGLang) and
    # the trainer (FSDP, Megatron) compute the same policy's token probabilities with different
    # kernels and precisions; the gap biases the gradient. verl (rollout-correction,
    # training/rollout_probs_*), TRL (sampling/*, vLLM importance sampling), NeMo-RL (train/, via
    # the train/ prefix rule) and slime (train/ too) log it under their own names.
    Signal("mismatch/kl", "grpo_mismatch_kl",
           "KL from the rollout engine's token distribution to the trainer's, mean per token.",
           "nats", ("rollout_corr/kl", "gen_kl_error")),
    Signal("mismatch/k3_kl", "grpo_mismatch_k3_kl",
           "The same KL by the k3 estimator, mean per token.", "nats", ("rollout_corr/k3_kl",)),
    Signal("mismatch/logprob_diff_mean", "grpo_mismatch_logprob_abs_diff_mean",
           "Mean absolute difference of the rollout's and the trainer's token log-probabilities.",
           "nats", ("sampling/sampling_logp_difference/mean", "train_rollout_logprob_abs_diff")),
    Signal("mismatch/logprob_diff_max", "grpo_mismatch_logprob_abs_diff_max",
           "Largest absolute difference of the rollout's and the trainer's token log-probabilities.",
           "nats", ("sampling/sampling_logp_difference/max",)),
    Signal("mismatch/prob_diff_mean", "grpo_mismatch_prob_abs_diff_mean",
           "Mean absolute difference of the rollout's and the trainer's token probabilities.",
           "probability", ("training/rollout_probs_diff_mean",)),
    Signal("mismatch/prob_diff_max", "grpo_mismatch_prob_abs_diff_max",
           "Largest absolute difference of the rollout's and the trainer's token probabilities.",
           "probability", ("training/rollout_probs_diff_max",)),
    Signal("mismatch/prob_diff_std", "grpo_mismatch_prob_abs_diff_stddev",
           "Standard deviation of the absolute token-probability difference.", "probability",
           ("training/rollout_probs_diff_std",)),
    Signal("mismatch/prob_corr", "grpo_mismatch_prob_correlation",
           "Pearson correlation of the rollout's and the trainer's token probabilities.", "ratio",
           ("training/rollout_actor_probs_pearson_corr",)),
    Signal("mismatch/chi2_token", "grpo_mismatch_chi2_token",
           "Chi-square divergence per token, E[w^2] - 1 of the token importance weights.", "ratio",
           ("rollout_corr/chi2_token",)),
    Signal("mismatch/chi2_seq", "grpo_mismatch_chi2_sequence",
           "Chi-square divergence per sequence, E[W^2] - 1 of the sequence importance weights.",
           "ratio", ("rollout_corr/chi2_seq",)),
    Signal("mismatch/ppl_ratio", "grpo_mismatch_perplexity_ratio",
           "The trainer's perplexity of the responses over the rollout engine's.", "ratio",
           ("rollout_corr/ppl_ratio",)),
    # TRL's ratios are taken after its correction (per sequence in its default mode, a masked
    # sequence counting 0); verl's and NeMo-RL's (sampling_importance_ratio) per token.
    Signal("mismatch/is_weight_mean", "grpo_mismatch_is_weight_mean",
           "Mean importance weight, trainer probability over rollout probability (per token, or "
           "per sequence where the trainer weighs sequences).", "ratio",
           ("rollout_corr/rollout_is_mean", "sampling/importance_sampling_ratio/mean",
            "sampling_importance_ratio")),
    Signal("mismatch/is_weight_min", "grpo_mismatch_is_weight_min",
           "Smallest importance weight of the step.", "ratio",
           ("rollout_corr/rollout_is_min", "sampling/importance_sampling_ratio/min")),
    Signal("mismatch/is_weight_max", "grpo_mismatch_is_weight_max",
           "Largest importance weight of the step.", "ratio",
           ("rollout_corr/rollout_is_max", "sampling/importance_sampling_ratio/max")),
    Signal("mismatch/is_ess_ratio", "grpo_mismatch_is_effective_sample_ratio",
           "Effective sample size of the importance weights as a fraction of the tokens, "
           "(E w)^2 / E[w^2].", "ratio", ("rollout_corr/rollout_is_eff_sample_size",)),
    Signal("mismatch/token_prob_error", "grpo_mismatch_token_prob_error",
           "Mean multiplicative token-probability error, exp(|log p_train - log p_rollout|); 1 is "
           "no mismatch.", "ratio", ("token_mult_prob_error",)),
    # Async / off-policy staleness: how many policy versions old the trained trajectories are.
    Signal("staleness/mean", "grpo_staleness_mean_steps",
           "Mean age of the step's trajectories, in policy versions (steps).", "steps",
           ("training/off_policy/trajectory_staleness/mean", "avg_trajectory_age")),
    Signal("staleness/max", "grpo_staleness_max_steps",
           "Age of the step's oldest trajectory, in policy versions (steps).", "steps",
           ("training/off_policy/trajectory_staleness/max",)),
    Signal("staleness/stale_trajectories", "grpo_staleness_stale_trajectories",
           "Trajectories from an older policy version trained on so far (cumulative, as logged).",
           "trajectories", ("fully_async/count/stale_trajectory_processed",)),
    Signal("staleness/dropped_samples", "grpo_staleness_dropped_samples",
           "Samples dropped for being too stale so far (cumulative, as logged).", "samples",
           ("fully_async/count/dropped_stale_samples",)),
    # Training mechanics.
    # "Training Loss": the column Hugging Face's notebook progress table (Unsloth) shows.
    Signal("loss", "grpo_loss", "Policy loss.", "loss",
           ("actor/pg_loss", "policy_loss", "Training Loss")),
    Signal("grad/norm", "grpo_grad_norm", "Gradient norm before clipping.", "norm",
           # total_grad_norm: the global norm over all parameters, the one clipping reads.
           ("grad_norm", "grad/grad_norm", "actor/grad_norm", "actor_grad_norm", "total_grad_norm")),
    Signal("train/lr", "grpo_learning_rate", "Learning rate.", "rate",
           ("lr", "learning_rate", "actor/lr", "actor_lr"), scaled=(("actor/lr(1e-4)", 1e-4),)),
    Signal("eval/sample_acc", "grpo_sample_accuracy_ratio",
           "Fraction of sampled responses graded correct by a verifier.", "ratio",
           ("sample_acc", "eval/sample_accuracy")),
    # The held-out truth: a score on data the policy does not train on (a validation set, a gold
    # reward model), logged at its own sparse cadence. Besides these names, any name of a
    # held-out namespace that names a score is read as it (HELDOUT_PATTERNS below).
    Signal("eval/heldout_score", "grpo_heldout_score",
           "Score on held-out data (validation accuracy or reward), logged at its own cadence.",
           "score", ("heldout_score", "val_score", "eval_score")),
    # Cluster health from the trainer's side (background.md#cluster-health, background.md#throughput-drops).
    Signal("perf/step_time_s", "grpo_step_duration_seconds", "Wall time of one training step.",
           # timing/step_total: OpenRLHF. Older verl (timing/*, before Jan 2025) logged only the
           # phases of a step, never its total: no alias there.
           "seconds", ("step_time", "timing_s/step", "perf/time_per_step", "timing/step_total")),
    Signal("perf/samples_per_s", "grpo_throughput_samples_per_second", "Training throughput.",
           "samples/s", ("samples_per_sec", "samples_per_s")),
    Signal("perf/tokens_per_s", "grpo_throughput_tokens_per_second", "Training throughput.",
           "tokens/s", ("perf/throughput", "tokens_per_sec")),
    Signal("perf/comm_time_s", "grpo_communication_duration_seconds",
           "Time of the step spent in collective communication (all-reduce, all-gather).",
           "seconds", ("comm_time", "perf/comm_time", "timing_s/comm")),
    Signal("perf/memory_allocated_bytes", "grpo_memory_allocated_bytes",
           "Peak device memory the rank's process allocated during the step.", "bytes",
           ("memory_allocated_bytes", "perf/max_memory_allocated_bytes")),
)

SIGNALS_BY_KEY: dict[str, Signal] = {s.key: s for s in SIGNALS}

# alias -> canonical key, the alias's rank among its key's names (0 is the canonical key itself,
# which wins over every alias: see snapshot.normalize_metrics) and the factor to the key's unit.
ALIASES: dict[str, str] = {}
ALIAS_RANK: dict[str, int] = {}
ALIAS_SCALE: dict[str, float] = {}
for _s in SIGNALS:
    for _i, (_a, _f) in enumerate([(a, 1.0) for a in _s.aliases] + list(_s.scaled), start=1):
        if _a in ALIASES or _a in SIGNALS_BY_KEY:
            raise AssertionError(f"alias {_a!r} is ambiguous")
        ALIASES[_a] = _s.key
        ALIAS_RANK[_a] = _i
        if _f != 1.0:
            ALIAS_SCALE[_a] = _f

# The frameworks' own names (framework_names.NAMES), read in their source: after every name
# listed above, in the table's order; the globs among them are matched after the exact names.
_FRAMEWORK_RANK = 500
_FRAMEWORK_GLOBS: list[tuple[re.Pattern[str], framework_names.FrameworkName, int]] = []
for _i, _n in enumerate(framework_names.NAMES):
    if _n.key not in SIGNALS_BY_KEY:
        raise AssertionError(f"{_n.framework} name {_n.name!r}: no canonical key {_n.key!r}")
    if _n.is_glob:
        _FRAMEWORK_GLOBS.append((re.compile(fnmatch.translate(_n.name)), _n, _FRAMEWORK_RANK + _i))
        continue
    if _n.name in ALIASES or _n.name in SIGNALS_BY_KEY:
        raise AssertionError(f"alias {_n.name!r} is ambiguous")
    ALIASES[_n.name] = _n.key
    ALIAS_RANK[_n.name] = _FRAMEWORK_RANK + _i
    if _n.scale != 1.0:
        ALIAS_SCALE[_n.name] = _n.scale

# A prefixed name (train/kl) ranks after every bare name of its key.
_PREFIXED_RANK = 1000
# Hugging Face's notebook table shows "rewards / check_answer" for rewards/check_answer.
_SPACED_SLASH = re.compile(r"\s+/\s+")


# A held-out score is logged under names nobody can list: verl's val-core/<data source>/<reward
# key>/mean@<n> (one per data source), TRL's eval_<metric>, a loop's eval/accuracy. A name maps to
# eval/heldout_score when it lies in a held-out namespace (the patterns, best first: the first
# one a record carries wins) and names a score (HELDOUT_SCORE_WORDS) and no other statistic
# (HELDOUT_EXCLUDED_WORDS: a std, a length, a loss, a timing is no score).
# The gold, val and test namespaces are read with "_" as with "/" (a loop's gold_acc beside its
# proxy reward, val_accuracy, test_score), and AReaL's eval-rollout/ and ROLL's val_correct/ too.
HELDOUT_PATTERNS: tuple[str, ...] = (
    "val-core/*mean@1", "val-core/*", "val/test_score/*", "val-aux/*mean@1", "val/*", "eval/*",
    "eval_*", "validation/*", "validation_*", "valid/*", "val_*", "test/*", "test_*", "heldout/*",
    "held_out/*", "gold/*", "gold_*", "eval-rollout/*")
# pass@k for k > 1 (pass@8, pass_k, pass_at_8, OpenRLHF's _pass8) is the share of problems any of
# k samples solves: higher than the accuracy beside it, and no score of the policy's one answer.
_PASS_AT_K = re.compile(r"pass(?:@|_at_|_)?(?:k\b|[2-9]|[1-9][0-9])")
HELDOUT_SCORE_WORDS = frozenset({"acc", "accuracy", "score", "reward", "pass", "pass1", "correct",
                                 "correctness", "exact", "em", "success", "solve", "solved",
                                 "win", "f1", "test"})
HELDOUT_EXCLUDED_WORDS = frozenset({"std", "min", "max", "var", "loss", "len", "length", "time",
                                    "runtime", "second", "seconds", "kl", "entropy", "clip",
                                    "tokens", "count", "num", "best", "worst", "maj", "format"})
_HELDOUT_RANK = 2000  # after every listed name and every train/ name
# The batch's sample accuracy is logged as a term of the reward: EasyR1's reward/accuracy beside
# its reward/format and reward/overall, a loop's reward/correctness beside its proxy term, TRL's
# and Unsloth's accuracy or correctness reward function (rewards/accuracy_reward/mean,
# rewards/correctness_reward_func), a bare correctness or mean_correct. A name maps to
# eval/sample_acc when its words name correctness (SAMPLE_ACCURACY_WORDS) and otherwise only a
# reward's namespace, a mean or a function (SAMPLE_ACCURACY_FILLER; one-letter suffixes such as
# correctness_f name a term, not a statistic). Anything else beside the word makes it another
# statistic: format_accuracy, accuracy_given_parseable, all_correct_frac (a group share),
# reward/std/acc. Read in the function's own scale: Unsloth's pays 2.0 a right answer, so its
# accuracy reads 0-2; the cards that read it judge its trend and its stddev, not its level.
SAMPLE_ACCURACY_WORDS = frozenset({"acc", "accuracy", "correct", "correctness"})
SAMPLE_ACCURACY_FILLER = frozenset({"reward", "rewards", "func", "fn", "function", "mean", "avg",
                                    "train", "batch", "is"})
_SAMPLE_ACCURACY_RANK = 2500  # after the held-out names: eval_accuracy is a held-out score
_VOCABULARY_RANK = 3000  # after those and the held-out names
_QUALIFIED_RANK = 3500  # after those: a subset's value where the record has no plain one

# Names frameworks always log that the project leaves unmapped on purpose: other statistics of a
# mapped signal, counters, timings, per-reward-function scores. No warning, no automatic match.
KNOWN_UNMAPPED: tuple[str, ...] = (
    # TRL's GRPOTrainer
    "completions/min_length", "completions/*_terminated_length", "clip_ratio/low_*",
    "clip_ratio/high_*", "num_tokens", "epoch", "rewards/*", "rewards / *", "sampling/*",
    "total_flos", "train_runtime", "train_*_per_second", "train_loss", "eval_runtime",
    "eval_*_per_second", "eval_loss", "kl_coef", "beta",
    # verl
    "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/kl_coef", "actor/loss", "actor/perf/*",
    "critic/rewards/*", "critic/advantages/*", "critic/returns/*", "critic/values/*",
    "critic/vf_*", "critic/vpred_mean", "critic/kl_coeff", "critic/grad_norm", "critic/lr*",
    "global_seqlen/*", "prompt_length/*", "response_length/min",
    "response_length/std*", "response_length_non_aborted/*", "response/aborted_ratio", "timing_s/*",
    "timing_per_token_ms/*",
    "timing/*", "perf/*", "training/*", "val-aux/*",
    # the Tinker cookbook's and loops' progress counters (progress/done_frac, progress/batch,
    # progress/step): where a run is, never a timing or a rate
    "progress/*",
    # look-alikes whose meaning differs by framework: +entropy in OpenRLHF, -entropy in
    # Stable-Baselines3; OpenRLHF's KL between the rollout policy and the updated one
    "entropy_loss", "ppo_kl",
    # every framework's false friends (framework_names.FALSE_FRIENDS)
    *(f.name for f in framework_names.FALSE_FRIENDS),
)


@dataclass(frozen=True)
class KeyMatch:
    """How a logged name maps: its canonical key, rank among the key's names, unit factor, and
    by which rule (``listed``: the key or a listed alias; ``prefixed``: ``train/`` + one of
    those; ``heldout``: HELDOUT_PATTERNS; ``vocabulary``: vocabulary.auto_match; ``key_map``:
    the user's key map)."""

    key: str
    rank: int
    scale: float = 1.0
    how: str = "listed"


@lru_cache(maxsize=8192)  # every key of every record: a trainer logs the same few names
def match_key(name: str) -> KeyMatch | None:
    """The canonical key a logged name stands for, or None for an unknown name.

    Hugging Face's wandb integration prefixes the trainer's keys with ``train/``
    (``train/reward``, ``train/kl``); such a name maps like the bare one, ranked after it. Spaces
    around a ``/`` are ignored (``rewards / x`` is ``rewards/x``).
    """
    if "/" in name and " " in name:
        name = _SPACED_SLASH.sub("/", name)
    hit = _match_bare(name)
    if hit is None and name.startswith("train/"):
        bare = _match_bare(name[len("train/"):])
        if bare is not None:
            hit = KeyMatch(bare.key, _PREFIXED_RANK + bare.rank, bare.scale, "prefixed")
    if hit is None:
        hit = _match_glob(name)
    if hit is None and heldout_rank(name) is None and is_sample_accuracy(name):
        # Ahead of KNOWN_UNMAPPED: TRL's rewards/* are left unmapped, but not its accuracy.
        hit = KeyMatch("eval/sample_acc", _SAMPLE_ACCURACY_RANK, how="accuracy")
    if hit is None and not is_known_unmapped(name):
        rank = heldout_rank(name)
        if rank is not None:
            hit = KeyMatch("eval/heldout_score", _HELDOUT_RANK + rank, how="heldout")
        elif (key := vocabulary.auto_match(name, _FORMS)) is not None:
            hit = KeyMatch(key, _VOCABULARY_RANK, how="vocabulary")
        elif (plain := _unqualified(name)) is not None:
            hit = KeyMatch(plain.key, _QUALIFIED_RANK + plain.rank, plain.scale, "qualified")
    return hit


def _unqualified(name: str) -> KeyMatch | None:
    """A listed name with a subset's qualifier between its segments (a verl fork's
    ``actor/main_chain/entropy``, ``response_length/main_chain/mean``): read as the listed name
    when the qualifier names no statistic and no signal (``reward/std/mean`` is a mean of stds,
    never the reward's mean). It ranks after every other name, so a record that also logs the
    plain name is read by it."""
    parts = name.split("/")
    if len(parts) < 3:
        return None
    middle = set(vocabulary.words("/".join(parts[1:-1])))
    if middle & (vocabulary.STATISTICS | _SIGNAL_WORDS):
        return None
    return _match_bare(f"{parts[0]}/{parts[-1]}")


def _match_glob(name: str) -> KeyMatch | None:
    """A framework's name with a data-dependent segment (prime-rl's agent, rLLM's role)."""
    for pattern, entry, rank in _FRAMEWORK_GLOBS:
        if pattern.match(name):
            return KeyMatch(entry.key, rank, entry.scale, "framework")
    return None


def heldout_rank(name: str) -> int | None:
    """The rank of the first HELDOUT_PATTERNS pattern a held-out score's name matches; None for
    a name that is no held-out score."""
    lowered = name.lower()
    for rank, pattern in enumerate(HELDOUT_PATTERNS):
        if fnmatchcase(lowered, pattern):
            if _PASS_AT_K.search(lowered):
                return None
            ws = set(vocabulary.words(lowered)) - {"eval", "val", "core", "aux", "validation",
                                                   "valid", "heldout", "held", "out", "gold"}
            if ws & HELDOUT_SCORE_WORDS and not ws & HELDOUT_EXCLUDED_WORDS:
                return rank
            return None
    return None


def is_sample_accuracy(name: str) -> bool:
    """Whether a name is the batch's sample accuracy by its words (SAMPLE_ACCURACY_WORDS); a
    framework's false friend never is."""
    ws = {w for w in vocabulary.words(name) if len(w) > 1}
    return (bool(ws & SAMPLE_ACCURACY_WORDS) and ws <= SAMPLE_ACCURACY_WORDS | SAMPLE_ACCURACY_FILLER
            and _FALSE_FRIEND.match(name) is None)


@lru_cache(maxsize=8192)  # once per new name of a run: a flood of runs logs the same names
def is_known_unmapped(name: str) -> bool:
    """Whether a framework always logs ``name`` and the project leaves it unmapped on purpose."""
    return _KNOWN_UNMAPPED.match(name) is not None


_FALSE_FRIEND = re.compile("|".join(f"(?:{fnmatch.translate(f.name)})" for f in framework_names.FALSE_FRIENDS))
# KNOWN_UNMAPPED's patterns as one expression: one match per name, not one per pattern.
_KNOWN_UNMAPPED = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in KNOWN_UNMAPPED))


def _match_bare(name: str) -> KeyMatch | None:
    if name in SIGNALS_BY_KEY:
        return KeyMatch(name, 0)
    if name in ALIASES:
        return KeyMatch(ALIASES[name], ALIAS_RANK[name], ALIAS_SCALE.get(name, 1.0))
    return None


def canonical_key(name: str) -> str | None:
    """Return the canonical key for a canonical or alias name, or None for an unknown key."""
    hit = match_key(name)
    return None if hit is None else hit.key


# Every name a key is read under: the canonical keys and their aliases, for suggestions.
KNOWN_NAMES: tuple[str, ...] = (*SIGNALS_BY_KEY, *ALIASES)
# The forms of those names (vocabulary.py), for the automatic match and the proposals. Scaled
# aliases are left out: a name in another unit must say its scale in a key map.
_FORMS = vocabulary.index({s.key: (s.key, *s.aliases) for s in SIGNALS})
# Every word of a known name: a qualifier made of none of them is a subset's name.
_SIGNAL_WORDS = frozenset(w for n in KNOWN_NAMES for w in vocabulary.words(n))


def proposals(name: str) -> list[str]:
    """The canonical keys a name that maps to nothing may stand for (vocabulary.proposals)."""
    return [] if is_known_unmapped(name) else vocabulary.proposals(name, _FORMS)
# Words that name a statistic: two names that differ in one of these are two statistics of one
# signal (``completions/min_length`` next to ``completions/mean_length``), never a typo.
_STATISTICS = frozenset({"min", "max", "mean", "median", "std", "sum", "count", "total", "low",
                         "high", "lower", "upper", "avg", "var"})
_TOKENS = re.compile(r"[/_.\s-]+")


def _edits(a: str, b: str, limit: int) -> int:
    """Edits (insert, delete, substitute, swap two neighbours) from ``a`` to ``b``; any number
    over ``limit`` comes back as ``limit + 1``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], prev2[j - 2] + 1)
        if min(row) > limit:
            return limit + 1
        prev2, prev = prev, row
    return min(prev[-1], limit + 1)


def closest_names(name: str, n: int = 3) -> list[str]:
    """As _closest_names, cached: the same unknown names come back run after run, and each
    costs an edit distance to every known name (hostile input brings many)."""
    return list(_closest_names(name, n))


@lru_cache(maxsize=8192)
def _closest_names(name: str, n: int) -> tuple[str, ...]:
    """The known names (canonical keys and aliases) a name that maps to no signal was most likely
    meant to be: the nearest, within two edits (one for a name under 8 characters, none under 4)
    and not another statistic of the same signal. ``reward/meen`` -> ``reward/mean``,
    ``entorpy/mean`` -> ``entropy/mean``; ``completions/min_length`` (TRL's own) -> nothing."""
    limit = min(2, len(name) // 4)
    words = set(_TOKENS.split(name.lower()))
    found: list[tuple[int, str]] = []
    for known in KNOWN_NAMES:
        d = _edits(name, known, limit)
        if d <= limit and not (words - set(_TOKENS.split(known.lower()))) & _STATISTICS:
            found.append((d, known))
    found.sort()
    return tuple(known for d, known in found[:n] if d == found[0][0])


# Names only one framework logs. A run whose records carry one was written by it: the coverage
# card then says why a curve is missing and what to set (contract/cards.MISSING_CAUSES). A
# native record's own ``framework`` field wins, and verl's file logger shape says verl.
FRAMEWORK_MARKERS: dict[str, str] = {
    # TRL's GRPOTrainer (and Unsloth, built on it), since early 2025 and before.
    "completions/mean_length": "trl", "completions/clipped_ratio": "trl",
    "frac_reward_zero_std": "trl", "clip_ratio/region_mean": "trl", "completion_length": "trl",
    "Training Loss": "trl",
    # verl, logged through any of its loggers (console, file, wandb).
    "critic/score/mean": "verl", "actor/pg_loss": "verl", "response_length/mean": "verl",
    "timing_s/step": "verl", "actor/entropy": "verl",
}


def framework_of(names: Iterable[str]) -> str | None:
    """The framework ``names`` were logged by: the first of framework_names.FINGERPRINTS among
    them (a framework's own names, before those of the family it is built on), else the first
    family marker (FRAMEWORK_MARKERS: TRL, verl); None when none is there."""
    return framework_evidence(names)[0]


def framework_evidence(names: Iterable[str]) -> tuple[str | None, str | None]:
    """(framework, the name that says so), as framework_of; (None, None) when none does."""
    seen = set(names)
    for framework, name in framework_names.FINGERPRINTS:
        if name in seen:
            return framework, name
    for name in seen:
        if (framework := FRAMEWORK_MARKERS.get(name)) is not None:
            return framework, name
    return None, None

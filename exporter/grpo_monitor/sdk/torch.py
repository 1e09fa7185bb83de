"""GRPO training signals from a step's tensors, with one device-to-host transfer.

Every statistic is computed as a 0-d tensor on the input's device and the lot is copied to the
host by a single ``tolist()``: a per-metric ``.item()`` would stall a GPU training loop once per
metric. A statistic that a batch leaves undefined (the mean length of the correct responses when
none is correct, a correlation of constant values) is left out of the returned dict; that is
decided on the host from values carried in the same single copy, so it costs no extra transfer.
This module is the ``torch`` extra; ``import grpo_monitor`` never imports it.
"""

from __future__ import annotations

import functools

from grpo_monitor.extras import import_extra

# One line naming the torch extra, not a bare ModuleNotFoundError, when torch is missing.
import_extra("torch", "torch", "grpo_monitor.sdk.torch")
import torch  # noqa: E402

__all__ = ["grpo_stats"]

_REWARD_QUANTILES = (("reward/p25", 0.25), ("reward/p50", 0.5), ("reward/p75", 0.75),
                     ("reward/p95", 0.95))
_KL_QUANTILES = (("kl/p50", 0.5), ("kl/p95", 0.95), ("kl/p99", 0.99))
# Bound on a log importance weight before it is exponentiated (verl's SAFETY_BOUND): a token the
# rollout engine found far likelier than the trainer does gives a huge but finite weight, not an
# overflow to inf that would read as a broken run.
_LOG_WEIGHT_BOUND = 20.0


def _as_float(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(x, device=device).detach().to(torch.float32)


@torch.no_grad()
def grpo_stats(
    rewards: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    response_lengths: torch.Tensor | None = None,
    max_length: int | None = None,
    eps: float = 1e-4,
    logprobs: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    correct: torch.Tensor | None = None,
    trajectory_age: torch.Tensor | None = None,
) -> dict[str, float]:
    """Canonical snapshot keys for one GRPO step, as Python floats.

    Args:
        rewards: ``[num_prompts, G]``, one row per prompt group, G >= 2.
        kl: per-token KL to the reference, ``[num_prompts * G, T]``.
        entropy: per-token policy entropy, ``[num_prompts * G, T]``.
        mask: ``[num_prompts * G, T]``, 1 where the token belongs to the response; without it
            every token counts.
        response_lengths: ``[num_prompts * G]`` response lengths in tokens; defaults to
            ``mask.sum(-1)``.
        max_length: the generation length limit; gives ``response/clip_ratio``.
        eps: added to the group std in the advantage, as in TRL.
        logprobs: ``[num_prompts * G, T]``, the trainer's log-probability of each sampled token
            (the "old" log-probs it recomputes before the update).
        advantages: ``[num_prompts * G]`` (one per response) or ``[num_prompts * G, T]``; with
            ``logprobs`` gives ``entropy/logp_adv_cov``.
        rollout_logprobs: ``[num_prompts * G, T]``, the rollout engine's log-probability of the
            same tokens; with ``logprobs`` gives the ``mismatch/*`` keys.
        correct: ``[num_prompts, G]``, 1 (or True) where the response is graded correct; gives
            ``group/all_wrong_frac``, ``group/all_right_frac`` and, with response lengths,
            ``response/len_correct_mean`` and ``response/len_incorrect_mean``.
        trajectory_age: ``[num_prompts * G]``, how many policy versions older than the policy
            being updated each response's sampling policy is (0: on-policy); gives
            ``staleness/mean`` and ``staleness/max``.

    Definitions (TRL conventions where TRL has one):
        * ``reward/std`` and ``group/reward_std`` are unbiased standard deviations;
          ``group/*`` are means over prompt groups; ``group/zero_std_frac`` counts groups whose
          std is ``isclose`` to 0 (they contribute no gradient).
        * ``adv/mean_abs`` is the mean of ``|A|`` with the group-normalised advantage
          ``A = (r - mean_group(r)) / (std_group(r) + eps)`` (TRL's ``scale_rewards="group"``).
        * ``kl/mean`` and ``entropy/mean`` are means over all response tokens of the batch.
          ``kl/p50``, ``kl/p95``, ``kl/p99`` and ``kl/max`` are over per-sequence mean KL, so
          that a few samples with a very high KL show in the tail; a sequence with no response
          token counts as 0 there.
        * Quantiles interpolate linearly (``torch.quantile``).
        * ``entropy/logp_adv_cov``: the covariance of the sampled tokens' trainer log-probability
          and their advantage over the batch's response tokens, ``mean((lp - mean lp) * (A -
          mean A))`` (population covariance), the ``Cov(log pi, A)`` that drives entropy in
          arXiv 2505.22617: a policy-gradient step changes entropy by about minus the step size
          times it.
        * ``group/all_wrong_frac`` / ``group/all_right_frac``: the share of groups with no
          correct response (pass@G = 0: the prompt is beyond the policy) / with only correct
          responses (already solved). With binary rewards these are the groups dead at the
          lowest / highest reward, verl recipes' all-zero / all-one ratios; with partial credit
          an all-wrong group may still have some reward spread, but says the same of the prompt.
        * ``response/len_correct_mean`` / ``len_incorrect_mean``: mean length over the correct /
          incorrect responses; left out of the result when the step has no response of that
          class (a mean over nothing is no 0, and NaN would read as a broken run).
        * ``staleness/mean`` / ``max``: mean and largest ``trajectory_age``.
        * ``mismatch/*``, with ``d = rollout_lp - train_lp`` and the token importance weight
          ``w = exp(train_lp - rollout_lp)`` over response tokens (the rollout engine sampled
          the tokens, so token means estimate expectations under the rollout's distribution):
          ``kl = mean(d)``, the k1 estimate of KL(rollout || train), and ``k3_kl = mean(w - log
          w - 1)``, its k3 estimate (both verl's ``rollout_corr/kl``, ``k3_kl``);
          ``logprob_diff_mean`` / ``max`` are the mean / largest ``|d|`` (TRL's
          ``sampling/sampling_logp_difference``); ``prob_diff_mean`` / ``max`` / ``std`` (std
          unbiased) and ``prob_corr`` (Pearson) are over the token probabilities
          ``|exp(train_lp) - exp(rollout_lp)|`` (verl's ``training/rollout_probs_diff_*`` and
          ``rollout_actor_probs_pearson_corr``); ``is_weight_mean`` / ``min`` / ``max`` are
          over ``w`` (TRL's ``sampling/importance_sampling_ratio``, before truncation);
          ``is_ess_ratio = mean(w)^2 / mean(w^2)`` (verl's effective sample size, without its
          truncation); ``chi2_token = mean(w^2) - 1`` and ``chi2_seq = mean over responses of
          W^2 - 1`` with ``W = exp(sum of the response's log w)`` (verl); ``ppl_ratio`` is
          verl's: the mean over responses of the trainer's perplexity of the response over the
          rollout's, ``exp(mean_t(rollout_lp) - mean_t(train_lp))``; ``token_prob_error =
          mean(exp(|d|))`` (NeMo-RL's ``token_mult_prob_error``). ``log w`` is bounded to
          +-20 before it is exponentiated, as verl does. A response without tokens counts as
          ``W = 1`` and a perplexity ratio of 1; ``prob_corr`` is left out when either side's
          probabilities do not vary; every ``mismatch/*`` key is left out of a batch without
          response tokens.

    A NaN or infinite input is a training signal: it propagates into the statistics it touches
    instead of raising.
    """
    if rewards.dim() != 2 or rewards.shape[0] < 1 or rewards.shape[1] < 2:
        raise ValueError(
            f"rewards must be [num_prompts, G] with G >= 2, got {tuple(rewards.shape)}")
    if rollout_logprobs is not None and logprobs is None:
        raise ValueError("rollout_logprobs needs logprobs: the mismatch is between the two")
    device = rewards.device
    r = _as_float(rewards, device)
    flat = r.reshape(-1)
    keys: list[str] = []
    values: list[torch.Tensor] = []
    # Keys kept only where a 0-d condition holds, judged on the host after the one copy.
    conditional: list[tuple[str, int]] = []
    conditions: list[torch.Tensor] = []

    def condition(holds: torch.Tensor) -> int:
        # Made once and shared by index: the mismatch keys all hang on one "has tokens" test.
        conditions.append(holds.to(torch.float32))
        return len(conditions) - 1

    def put(key: str, value: torch.Tensor, when: int | None = None) -> None:
        keys.append(key)
        values.append(value)
        if when is not None:
            conditional.append((key, when))

    def put_quantiles(names: tuple[tuple[str, float], ...], x: torch.Tensor) -> None:
        q = torch.tensor([p for _, p in names], dtype=torch.float32, device=device)
        for (key, _), value in zip(names, torch.quantile(x, q).unbind()):
            put(key, value)

    put("reward/mean", flat.mean())
    put("reward/std", flat.std())
    put("reward/min", flat.min())
    put("reward/max", flat.max())
    put_quantiles(_REWARD_QUANTILES, flat)

    group_mean = r.mean(dim=1, keepdim=True)
    group_std = r.std(dim=1, keepdim=True)
    put("group/reward_gap", (r.amax(dim=1) - r.amin(dim=1)).mean())
    put("group/reward_std", group_std.mean())
    put("group/zero_std_frac",
        torch.isclose(group_std, torch.zeros_like(group_std)).to(torch.float32).mean())
    put("adv/mean_abs", ((r - group_mean) / (group_std + eps)).abs().mean())

    token_mask = None
    tokens_per_response = None
    if mask is not None:
        token_mask = torch.as_tensor(mask, device=device).detach().bool()
        # Made once: the per-token statistics below all count tokens per response.
        tokens_per_response = token_mask.sum(dim=-1)

    def per_token_input(name: str, t: torch.Tensor) -> torch.Tensor:
        x = _as_float(t, device)
        if x.dim() != 2 or (token_mask is not None and token_mask.shape != x.shape):
            shape = tuple(token_mask.shape) if token_mask is not None else tuple(x.shape)
            raise ValueError(f"{name} must be [batch, T] with a mask of the same shape, got "
                             f"{tuple(x.shape)} and mask {shape}")
        return x

    def fill_padding(x: torch.Tensor, value: float) -> torch.Tensor:
        # Fill, not multiply: padding may hold NaN or inf that is not part of any response. A
        # select is one pass over the tensor and needs no inverted mask; masked_fill is two.
        return x if token_mask is None else torch.where(token_mask, x, value)

    def token_counts(x: torch.Tensor) -> torch.Tensor:
        if tokens_per_response is not None:
            return tokens_per_response
        return torch.full(x.shape[:1], x.shape[1], dtype=torch.int64, device=device)

    for name, per_token in (("kl", kl), ("entropy", entropy)):
        if per_token is None:
            continue
        x = fill_padding(per_token_input(name, per_token), 0.0)
        per_seq_tokens = token_counts(x)
        put(f"{name}/mean", x.sum() / per_seq_tokens.sum())
        if name == "kl":
            # Boolean indexing would sync with the host; an empty response counts as 0 instead.
            per_seq = x.sum(dim=-1) / per_seq_tokens.clamp(min=1)
            put_quantiles(_KL_QUANTILES, per_seq)
            put("kl/max", per_seq.max())

    if logprobs is not None:
        train_lp = fill_padding(per_token_input("logprobs", logprobs), 0.0)
        seq_tokens = token_counts(train_lp).to(torch.float32)
        n_tokens = seq_tokens.sum()
        has_tokens = condition(n_tokens > 0)
        n = n_tokens.clamp(min=1)

        @functools.cache
        def token_weight() -> torch.Tensor:
            # Made only when needed, once: the per-response covariance needs none.
            assert token_mask is not None
            return token_mask.to(torch.float32)

        def on_tokens(x: torch.Tensor) -> torch.Tensor:
            # Zero on padding, for a tensor that is not already. The tensors derived below are
            # finite on padding, so a product does: much cheaper than a select on CPU, and what
            # these statistics have always been.
            return x if token_mask is None else x * token_weight()

        def token_mean(x: torch.Tensor) -> torch.Tensor:
            return on_tokens(x).sum() / n

        if advantages is not None:
            adv = _as_float(advantages, device)
            if adv.shape == train_lp.shape:
                adv = fill_padding(adv, 0.0)
                lp_c = train_lp - token_mean(train_lp)
                adv_c = adv - token_mean(adv)
                cov = token_mean(lp_c * adv_c)
            else:
                if adv.numel() != train_lp.shape[0]:
                    raise ValueError(f"advantages must be [batch] or [batch, T] like logprobs "
                                     f"{tuple(train_lp.shape)}, got {tuple(adv.shape)}")
                # One advantage per response: sum_t (lp_t - lp_mean) (A - A_mean) over a
                # response's tokens is (A - A_mean) (S - n lp_mean) with S its log-prob sum and n
                # its token count, so the covariance needs per-response sums, not a [batch, T]
                # advantage. A response without tokens adds nothing, a NaN advantage included.
                a = adv.reshape(-1).masked_fill(seq_tokens == 0, 0.0)
                lp_sums = train_lp.sum(dim=-1)
                lp_mean = lp_sums.sum() / n
                adv_mean = (a * seq_tokens).sum() / n
                cov = ((a - adv_mean) * (lp_sums - seq_tokens * lp_mean)).sum() / n
            put("entropy/logp_adv_cov", cov, has_tokens)

        if rollout_logprobs is not None:
            rollout_lp = fill_padding(per_token_input("rollout_logprobs", rollout_logprobs), 0.0)
            # On padding d = 0, so |d| = 0, log w = 0, w = 1 and w - log w - 1 = 0: a tensor that
            # is 0 there is summed as it is, the others are masked.
            d = rollout_lp - train_lp
            d_seq = d.sum(dim=-1)
            abs_d = d.abs()
            log_w = d.neg().clamp_(-_LOG_WEIGHT_BOUND, _LOG_WEIGHT_BOUND)
            w = log_w.exp()
            put("mismatch/kl", d_seq.sum() / n, has_tokens)
            put("mismatch/k3_kl", (w - log_w).sub_(1.0).sum() / n, has_tokens)
            put("mismatch/logprob_diff_mean", abs_d.sum() / n, has_tokens)
            put("mismatch/logprob_diff_max", abs_d.amax(), has_tokens)  # padding's 0 is no max
            p_train, p_rollout = train_lp.exp(), rollout_lp.exp()  # 1 on padding
            prob_diff = (p_train - p_rollout).abs_()  # 0 on padding
            prob_diff_mean = prob_diff.sum() / n
            put("mismatch/prob_diff_mean", prob_diff_mean, has_tokens)
            put("mismatch/prob_diff_max", prob_diff.amax(), has_tokens)
            put("mismatch/prob_diff_std",
                (on_tokens(prob_diff - prob_diff_mean).square_().sum()
                 / (n - 1).clamp(min=1)).sqrt(),
                has_tokens)
            pt_c = on_tokens(p_train - token_mean(p_train))
            pr_c = on_tokens(p_rollout - token_mean(p_rollout))
            var_product = pt_c.square().sum() * pr_c.square().sum()
            # != rather than >: a NaN input still reaches the key.
            put("mismatch/prob_corr", (pt_c * pr_c).sum() / var_product.clamp(min=1e-30).sqrt(),
                condition(var_product != 0))
            w_on_tokens = on_tokens(w)
            w_mean = w_on_tokens.sum() / n
            w_sq_mean = w_on_tokens.square().sum() / n
            put("mismatch/is_weight_mean", w_mean, has_tokens)
            put("mismatch/is_weight_min", fill_padding(w, float("inf")).amin(), has_tokens)
            put("mismatch/is_weight_max", w_on_tokens.amax(), has_tokens)
            put("mismatch/is_ess_ratio", w_mean ** 2 / w_sq_mean, has_tokens)
            put("mismatch/chi2_token", w_sq_mean - 1.0, has_tokens)
            seq_log_w = d_seq.neg().clamp(-_LOG_WEIGHT_BOUND, _LOG_WEIGHT_BOUND)
            put("mismatch/chi2_seq", (2.0 * seq_log_w).exp().mean() - 1.0, has_tokens)
            put("mismatch/ppl_ratio", (d_seq / seq_tokens.clamp(min=1)).exp().mean(), has_tokens)
            put("mismatch/token_prob_error",
                token_mean(abs_d.clamp(max=_LOG_WEIGHT_BOUND).exp_()), has_tokens)

    if response_lengths is None and tokens_per_response is not None:
        response_lengths = tokens_per_response
    lengths = None
    if response_lengths is not None:
        lengths = _as_float(response_lengths, device).reshape(-1)
        put("response/len_mean", lengths.mean())
        put("response/len_max", lengths.max())
        if max_length is not None:
            put("response/clip_ratio", (lengths >= max_length).to(torch.float32).mean())

    if correct is not None:
        c = _as_float(correct, device)
        if c.shape != r.shape:
            raise ValueError(f"correct must be [num_prompts, G] like rewards {tuple(r.shape)}, "
                             f"got {tuple(c.shape)}")
        right = c > 0.5
        put("group/all_wrong_frac", (~right.any(dim=1)).to(torch.float32).mean())
        put("group/all_right_frac", right.all(dim=1).to(torch.float32).mean())
        if lengths is not None:
            if lengths.numel() != c.numel():
                raise ValueError(f"{lengths.numel()} response lengths for {c.numel()} responses")
            right_f = right.reshape(-1).to(torch.float32)
            wrong_f = 1.0 - right_f
            n_right, n_wrong = right_f.sum(), wrong_f.sum()
            put("response/len_correct_mean", (lengths * right_f).sum() / n_right.clamp(min=1),
                condition(n_right > 0))
            put("response/len_incorrect_mean", (lengths * wrong_f).sum() / n_wrong.clamp(min=1),
                condition(n_wrong > 0))

    if trajectory_age is not None:
        age = _as_float(trajectory_age, device).reshape(-1)
        put("staleness/mean", age.mean())
        put("staleness/max", age.max())

    copied = torch.stack(values + conditions).tolist()
    stats = dict(zip(keys, copied[:len(keys)]))
    held = copied[len(keys):]
    for key, index in conditional:
        if held[index] == 0.0:
            del stats[key]
    return stats

"""GRPO training signals from a step's tensors, with one device-to-host transfer.

Every statistic is computed as a 0-d tensor on the input's device and the lot is copied to the
host by a single ``tolist()``: a per-metric ``.item()`` would stall a GPU training loop once per
metric. This module is the ``torch`` extra; ``import grpo_monitor`` never imports it.
"""

from __future__ import annotations

import torch

__all__ = ["grpo_stats"]

_REWARD_QUANTILES = (("reward/p25", 0.25), ("reward/p50", 0.5), ("reward/p75", 0.75),
                     ("reward/p95", 0.95))
_KL_QUANTILES = (("kl/p50", 0.5), ("kl/p95", 0.95), ("kl/p99", 0.99))


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

    A NaN or infinite input is a training signal: it propagates into the statistics it touches
    instead of raising.
    """
    if rewards.dim() != 2 or rewards.shape[0] < 1 or rewards.shape[1] < 2:
        raise ValueError(
            f"rewards must be [num_prompts, G] with G >= 2, got {tuple(rewards.shape)}")
    device = rewards.device
    r = _as_float(rewards, device)
    flat = r.reshape(-1)
    keys: list[str] = []
    values: list[torch.Tensor] = []

    def put(key: str, value: torch.Tensor) -> None:
        keys.append(key)
        values.append(value)

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
    if mask is not None:
        token_mask = torch.as_tensor(mask, device=device).detach().bool()
    for name, per_token in (("kl", kl), ("entropy", entropy)):
        if per_token is None:
            continue
        x = _as_float(per_token, device)
        m = token_mask if token_mask is not None else torch.ones_like(x, dtype=torch.bool)
        if x.dim() != 2 or m.shape != x.shape:
            raise ValueError(f"{name} must be [batch, T] with a mask of the same shape, got "
                             f"{tuple(x.shape)} and mask {tuple(m.shape)}")
        # Fill, not multiply: padding may hold NaN or inf that is not part of any response.
        x = x.masked_fill(~m, 0.0)
        per_seq_tokens = m.sum(dim=-1)
        put(f"{name}/mean", x.sum() / per_seq_tokens.sum())
        if name == "kl":
            # Boolean indexing would sync with the host; an empty response counts as 0 instead.
            per_seq = x.sum(dim=-1) / per_seq_tokens.clamp(min=1)
            put_quantiles(_KL_QUANTILES, per_seq)
            put("kl/max", per_seq.max())

    if response_lengths is None and token_mask is not None:
        response_lengths = token_mask.sum(dim=-1)
    if response_lengths is not None:
        lengths = _as_float(response_lengths, device).reshape(-1)
        put("response/len_mean", lengths.mean())
        put("response/len_max", lengths.max())
        if max_length is not None:
            put("response/clip_ratio", (lengths >= max_length).to(torch.float32).mean())

    return dict(zip(keys, torch.stack(values).tolist()))

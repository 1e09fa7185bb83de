"""grpo_stats on hand-computed batches, and its single device-to-host transfer."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from grpo_monitor.keys import SIGNALS_BY_KEY
from grpo_monitor.sdk.torch import grpo_stats

EPS = 1e-4
# Three prompt groups of G=4: a split group, a group with no spread, a group with one winner.
REWARDS = [[1.0, 0.0, 0.0, 1.0],
           [1.0, 1.0, 1.0, 1.0],
           [0.0, 0.0, 0.0, 2.0]]
# Two sequences of T=4. Row 0 has two response tokens followed by padding that holds garbage.
KL = [[0.1, 0.3, 9.0, float("nan")],
      [0.4, 0.4, 0.4, 1.2]]
ENTROPY = [[2.0, 1.0, float("inf"), 7.0],
           [0.5, 0.5, 0.5, 0.5]]
MASK = [[1, 1, 0, 0],
        [1, 1, 1, 1]]


def approx(x: float) -> object:
    return pytest.approx(x, rel=1e-5, abs=1e-6)


def test_reward_statistics() -> None:
    stats = grpo_stats(torch.tensor(REWARDS))
    flat = [x for row in REWARDS for x in row]
    assert stats["reward/mean"] == approx(8 / 12)
    assert stats["reward/std"] == approx(statistics.stdev(flat))  # unbiased
    assert stats["reward/std"] == approx(math.sqrt(14 / 33))
    assert (stats["reward/min"], stats["reward/max"]) == (0.0, 2.0)
    # Linear interpolation over the 12 sorted values (5 zeros, 6 ones, one 2) at q * 11.
    assert stats["reward/p25"] == approx(0.0)
    assert stats["reward/p50"] == approx(1.0)
    assert stats["reward/p75"] == approx(1.0)
    assert stats["reward/p95"] == approx(1.45)  # 10.45: between s[10]=1 and s[11]=2


def test_group_statistics_and_advantage() -> None:
    stats = grpo_stats(torch.tensor(REWARDS))
    std0, std1, std2 = math.sqrt(1 / 3), 0.0, 1.0
    assert stats["group/reward_gap"] == approx((1 + 0 + 2) / 3)
    assert stats["group/reward_std"] == approx((std0 + std1 + std2) / 3)
    assert stats["group/zero_std_frac"] == approx(1 / 3)
    # |A| per group: 0.5 / (std0 + eps) for all four; 0 for the flat group; 3 x 0.5 and 1.5 over
    # (1 + eps) for the winner group.
    expected = (4 * 0.5 / (std0 + EPS) + 0 + (3 * 0.5 + 1.5) / (std2 + EPS)) / 12
    assert stats["adv/mean_abs"] == approx(expected)


def test_zero_std_fraction_and_advantage_of_flat_groups() -> None:
    # Binary-exact values: a flat group of 0.3s has a float32 std of ~1e-8, not 0, which isclose
    # still counts as zero but which gives its advantages a ~1e-4 rounding noise.
    rewards = torch.tensor([[0.25] * 8, [0.0] * 8, [1.0] * 7 + [0.0], [0.75] * 8])
    stats = grpo_stats(rewards)
    assert stats["group/zero_std_frac"] == approx(3 / 4)
    # Only the third group has a spread; the flat groups add zeros to the mean over 32 values.
    spread = [1.0] * 7 + [0.0]
    std = statistics.stdev(spread)
    assert std == approx(math.sqrt(1 / 8))
    expected = sum(abs(x - 7 / 8) / (std + EPS) for x in spread) / 32
    assert stats["adv/mean_abs"] == approx(expected)


def test_eps_is_the_advantage_denominator_guard() -> None:
    stats = grpo_stats(torch.tensor([[0.0, 1e-3]]), eps=1.0)
    std = statistics.stdev([0.0, 1e-3])
    assert stats["adv/mean_abs"] == approx(0.5e-3 / (std + 1.0))


def test_masked_kl_entropy_and_lengths() -> None:
    stats = grpo_stats(torch.tensor(REWARDS), kl=torch.tensor(KL), entropy=torch.tensor(ENTROPY),
                       mask=torch.tensor(MASK), max_length=4)
    # Token mean over the 6 response tokens, not the mean of the per-sequence means (0.4).
    assert stats["kl/mean"] == approx((0.1 + 0.3 + 2.4) / 6)
    # Per-sequence means are [0.2, 0.6]; linear interpolation between them.
    assert stats["kl/max"] == approx(0.6)
    assert stats["kl/p50"] == approx(0.4)
    assert stats["kl/p95"] == approx(0.2 + 0.95 * 0.4)
    assert stats["kl/p99"] == approx(0.2 + 0.99 * 0.4)
    assert stats["entropy/mean"] == approx((2.0 + 1.0 + 4 * 0.5) / 6)
    assert stats["response/len_mean"] == approx(3.0)
    assert stats["response/len_max"] == approx(4.0)
    assert stats["response/clip_ratio"] == approx(0.5)


def test_kl_quantiles_match_torch_quantile_on_per_sequence_means() -> None:
    gen = torch.Generator().manual_seed(0)
    kl = torch.rand(64, 32, generator=gen) ** 4
    mask = (torch.arange(32) < torch.randint(1, 33, (64, 1), generator=gen)).int()
    stats = grpo_stats(torch.rand(16, 4, generator=gen), kl=kl, mask=mask)
    per_seq = (kl * mask).sum(-1) / mask.sum(-1)
    expected = torch.quantile(per_seq, torch.tensor([0.5, 0.95, 0.99])).tolist()
    assert [stats["kl/p50"], stats["kl/p95"], stats["kl/p99"]] == pytest.approx(expected)
    assert stats["kl/max"] == approx(per_seq.max().item())
    assert stats["kl/mean"] == approx(((kl * mask).sum() / mask.sum()).item())


def test_empty_response_counts_as_zero_kl_not_nan() -> None:
    kl = torch.tensor(KL + [[5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor(MASK + [[0, 0, 0, 0]])
    stats = grpo_stats(torch.tensor(REWARDS), kl=kl, mask=mask)
    assert stats["kl/mean"] == approx((0.1 + 0.3 + 2.4) / 6)
    assert stats["kl/max"] == approx(0.6)
    assert stats["kl/p50"] == approx(0.2)  # per-sequence [0.2, 0.6, 0.0]
    assert stats["response/len_mean"] == approx(2.0)


def test_explicit_lengths_and_no_mask() -> None:
    stats = grpo_stats(torch.tensor(REWARDS), kl=torch.tensor([[0.1, 0.3], [0.2, 0.2]]),
                       response_lengths=torch.tensor([10, 512, 300, 512]), max_length=512)
    assert stats["kl/mean"] == approx(0.2)  # no mask: every token counts
    assert stats["response/len_mean"] == approx((10 + 512 + 300 + 512) / 4)
    assert stats["response/len_max"] == approx(512.0)
    assert stats["response/clip_ratio"] == approx(0.5)


def test_returns_only_what_the_inputs_give_and_only_canonical_keys() -> None:
    rewards_only = grpo_stats(torch.tensor(REWARDS))
    assert not any(k.startswith(("kl/", "entropy/", "response/")) for k in rewards_only)
    full = grpo_stats(torch.tensor(REWARDS), kl=torch.tensor(KL), entropy=torch.tensor(ENTROPY),
                      mask=torch.tensor(MASK), max_length=4)
    assert set(full) <= set(SIGNALS_BY_KEY)
    assert len(full) == 21  # 8 reward, 4 group/adv, 5 kl, 1 entropy, 3 response
    assert all(type(v) is float for v in full.values())
    no_limit = grpo_stats(torch.tensor(REWARDS), mask=torch.tensor(MASK))
    assert "response/len_mean" in no_limit and "response/clip_ratio" not in no_limit


def test_exactly_one_device_to_host_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    rewards, kl, entropy, mask = (torch.tensor(REWARDS), torch.tensor(KL),
                                  torch.tensor(ENTROPY), torch.tensor(MASK))
    real_tolist = torch.Tensor.tolist
    tolist_calls: list[tuple[int, ...]] = []

    def counting_tolist(self: torch.Tensor) -> object:
        tolist_calls.append(tuple(self.shape))
        return real_tolist(self)

    def forbidden(self: torch.Tensor, *args: object, **kwargs: object) -> object:
        raise AssertionError("a per-value host transfer (item/float/bool/cpu/numpy)")

    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    for name in ("item", "cpu", "numpy", "__float__", "__int__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    stats = grpo_stats(rewards, kl=kl, entropy=entropy, mask=mask, max_length=4)
    monkeypatch.undo()
    assert tolist_calls == [(len(stats),)]


def test_bf16_inputs_with_grad() -> None:
    rewards = torch.tensor(REWARDS, dtype=torch.bfloat16, requires_grad=True)
    kl = torch.tensor(KL, dtype=torch.bfloat16, requires_grad=True)
    stats = grpo_stats(rewards, kl=kl, mask=torch.tensor(MASK, dtype=torch.bool))
    reference = grpo_stats(torch.tensor(REWARDS), kl=torch.tensor(KL), mask=torch.tensor(MASK))
    assert stats.keys() == reference.keys()
    # Rewards are exact in bf16; the KL values are rounded to 8 bits of mantissa.
    assert stats["reward/std"] == approx(reference["reward/std"])
    assert stats["adv/mean_abs"] == approx(reference["adv/mean_abs"])
    assert stats["kl/mean"] == pytest.approx(reference["kl/mean"], rel=1e-2)


def test_nan_reward_propagates_without_raising() -> None:
    rewards = torch.tensor(REWARDS)
    rewards[2, 3] = float("nan")
    stats = grpo_stats(rewards)
    for key in ("reward/mean", "reward/std", "reward/max", "reward/p95", "group/reward_gap",
                "group/reward_std", "adv/mean_abs"):
        assert math.isnan(stats[key]), key
    # The NaN group has no zero std, the flat group still has.
    assert stats["group/zero_std_frac"] == approx(1 / 3)


def test_wrong_reward_shape_is_a_caller_error() -> None:
    with pytest.raises(ValueError):
        grpo_stats(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError):
        grpo_stats(torch.tensor([[1.0], [0.0]]))
    with pytest.raises(ValueError):
        grpo_stats(torch.tensor(REWARDS), kl=torch.tensor(KL), mask=torch.tensor([[1, 1]]))

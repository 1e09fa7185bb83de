"""grpo_stats on hand-computed batches, and its single device-to-host transfer."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys

import pytest
import torch

from grpo_monitor.contract.keys import SIGNALS_BY_KEY
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
    # Every optional input at once, keys that may be left out included: still one copy.
    full = grpo_stats(torch.tensor(REWARDS_C), mask=torch.tensor(MASK), logprobs=torch.tensor(LP),
                      advantages=torch.tensor(ADV), rollout_logprobs=torch.tensor(RLP),
                      correct=torch.tensor(CORRECT), response_lengths=torch.tensor(LENGTHS),
                      trajectory_age=torch.tensor(AGE))
    monkeypatch.undo()
    assert tolist_calls[0] == (len(stats),)
    # The copy carries the values and the conditions of the keys that may be left out.
    assert len(tolist_calls) == 2 and tolist_calls[1][0] > len(full) > len(stats)


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


# The optional inputs. Two responses of T=4 (MASK: two, then four response tokens); the padding
# holds garbage that must not count.
LP = [[-1.0, -2.0, 7.0, float("nan")],
      [-0.5, -0.5, -1.0, -2.0]]
RLP = [[-1.5, -2.0, float("inf"), 0.0],
       [-0.5, -0.7, -1.0, -1.0]]
ADV = [1.0, -0.5]
# d = rollout - train on the six response tokens, and the importance weights w = exp(-d).
D = [-0.5, 0.0, 0.0, -0.2, 0.0, 1.0]
TRAIN_TOKENS = [-1.0, -2.0, -0.5, -0.5, -1.0, -2.0]
ROLLOUT_TOKENS = [-1.5, -2.0, -0.5, -0.7, -1.0, -1.0]
# Four groups of G=4: split, all right, all wrong, all wrong with partial credit that differs.
REWARDS_C = [[1.0, 0.0, 0.0, 1.0],
             [1.0, 1.0, 1.0, 1.0],
             [0.0, 0.0, 0.0, 0.0],
             [0.25, 0.0, 0.0, 0.0]]
CORRECT = [[1, 0, 0, 1],
           [1, 1, 1, 1],
           [0, 0, 0, 0],
           [0, 0, 0, 0]]
LENGTHS = [3, 5, 7, 3, 2, 2, 2, 4, 9, 9, 9, 9, 1, 6, 6, 6]
AGE = [0, 1, 1, 4]


def test_logprob_advantage_covariance() -> None:
    stats = grpo_stats(torch.tensor(REWARDS), logprobs=torch.tensor(LP),
                       advantages=torch.tensor(ADV), mask=torch.tensor(MASK))
    adv_tokens = [1.0, 1.0, -0.5, -0.5, -0.5, -0.5]  # each response's advantage on its tokens
    # Token means: log-prob -7/6, advantage 0; so the covariance is mean(lp * A) = -1/6.
    assert stats["entropy/logp_adv_cov"] == approx(-1 / 6)
    lp_mean = statistics.fmean(TRAIN_TOKENS)
    assert stats["entropy/logp_adv_cov"] == approx(
        sum((lp - lp_mean) * a for lp, a in zip(TRAIN_TOKENS, adv_tokens)) / 6)
    # A per-token advantage of the same values gives the same covariance.
    per_token = grpo_stats(torch.tensor(REWARDS), logprobs=torch.tensor(LP),
                           advantages=torch.tensor([[1.0] * 4, [-0.5] * 4]), mask=torch.tensor(MASK))
    assert per_token["entropy/logp_adv_cov"] == approx(-1 / 6)
    # Confident tokens with positive advantage: the covariance that collapses entropy is > 0.
    sharp = grpo_stats(torch.tensor(REWARDS), logprobs=torch.tensor([[-0.1, -0.1], [-3.0, -3.0]]),
                       advantages=torch.tensor([1.0, -1.0]))
    assert sharp["entropy/logp_adv_cov"] == approx(2.9 / 2)
    assert not any(k.startswith("mismatch/") for k in stats)


def _token_level_cov(lp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> float:
    """The covariance as first written: the advantage expanded over every token, centred there."""
    m = mask.to(torch.float32)
    n = m.sum()
    lp = lp.masked_fill(~mask, 0.0)
    a = adv.reshape(-1, 1).expand_as(lp).masked_fill(~mask, 0.0)
    lp_c = lp - (lp * m).sum() / n
    a_c = a - (a * m).sum() / n
    return ((lp_c * a_c * m).sum() / n).item()


@pytest.mark.parametrize("seed", range(5))
def test_per_response_covariance_matches_the_token_level_formula(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch, t = 48, 37
    mask = torch.arange(t) < torch.randint(0, t + 1, (batch, 1), generator=gen)
    mask[3] = False  # a response without tokens
    # Offsets away from 0 make the per-response sums cancel, where float32 rounding would show.
    lp = (-5.0 - 3.0 * torch.rand(batch, t, generator=gen)).masked_fill(~mask, float("nan"))
    per_response = torch.randn(batch, generator=gen) + 2.0
    # Correlated with each response's log-probs for a covariance well away from 0.
    per_response += (seed % 2) * lp.nan_to_num().sum(-1) / mask.sum(-1).clamp(min=1)
    expected = _token_level_cov(lp, per_response, mask)
    rewards = torch.rand(batch // 4, 4, generator=gen)
    for adv in (per_response, per_response.reshape(-1, 1),
                per_response.reshape(-1, 1).expand(batch, t).contiguous()):
        stats = grpo_stats(rewards, logprobs=lp, advantages=adv, mask=mask)
        assert stats["entropy/logp_adv_cov"] == pytest.approx(expected, rel=1e-4, abs=1e-5), \
            tuple(adv.shape)


def test_advantage_of_a_response_without_tokens_does_not_count() -> None:
    mask = torch.tensor(MASK + [[0, 0, 0, 0]])
    lp = torch.tensor(LP + [[-1.0, -1.0, -1.0, -1.0]])
    for bad in (float("nan"), float("inf")):
        stats = grpo_stats(torch.tensor(REWARDS), logprobs=lp, advantages=torch.tensor(ADV + [bad]),
                           mask=mask)
        assert stats["entropy/logp_adv_cov"] == approx(-1 / 6)


def test_rollout_training_mismatch() -> None:
    stats = grpo_stats(torch.tensor(REWARDS), logprobs=torch.tensor(LP),
                       rollout_logprobs=torch.tensor(RLP), mask=torch.tensor(MASK))
    w = [math.exp(-d) for d in D]
    assert stats["mismatch/kl"] == approx(0.3 / 6)
    assert stats["mismatch/k3_kl"] == approx(sum(x - math.log(x) - 1 for x in w) / 6)
    assert stats["mismatch/logprob_diff_mean"] == approx(1.7 / 6)
    assert stats["mismatch/logprob_diff_max"] == approx(1.0)
    p_train = [math.exp(x) for x in TRAIN_TOKENS]
    p_rollout = [math.exp(x) for x in ROLLOUT_TOKENS]
    prob_diff = [abs(a - b) for a, b in zip(p_train, p_rollout)]
    assert stats["mismatch/prob_diff_mean"] == approx(statistics.fmean(prob_diff))
    assert stats["mismatch/prob_diff_max"] == approx(math.exp(-1.0) - math.exp(-2.0))
    assert stats["mismatch/prob_diff_std"] == approx(statistics.stdev(prob_diff))
    assert stats["mismatch/prob_corr"] == approx(statistics.correlation(p_train, p_rollout))
    assert stats["mismatch/is_weight_mean"] == approx((math.exp(0.5) + 3 + math.exp(0.2) + math.exp(-1)) / 6)
    assert stats["mismatch/is_weight_min"] == approx(math.exp(-1.0))
    assert stats["mismatch/is_weight_max"] == approx(math.exp(0.5))
    w_sq_mean = statistics.fmean(x * x for x in w)
    assert stats["mismatch/is_ess_ratio"] == approx(statistics.fmean(w) ** 2 / w_sq_mean)
    assert stats["mismatch/chi2_token"] == approx(w_sq_mean - 1)
    # Sequence weights: row 0 sums log w = 0.5, row 1 = 0.2 - 1.0.
    assert stats["mismatch/chi2_seq"] == approx((math.exp(1.0) + math.exp(-1.6)) / 2 - 1)
    # Per response, the trainer's perplexity over the rollout's: exp(mean d); row means -0.25, 0.2.
    assert stats["mismatch/ppl_ratio"] == approx((math.exp(-0.25) + math.exp(0.2)) / 2)
    assert stats["mismatch/token_prob_error"] == approx(
        (math.exp(0.5) + 3 + math.exp(0.2) + math.exp(1.0)) / 6)
    assert all(math.isfinite(v) for v in stats.values())


def test_identical_logprobs_are_no_mismatch() -> None:
    stats = grpo_stats(torch.tensor(REWARDS), logprobs=torch.tensor(LP),
                       rollout_logprobs=torch.tensor(LP), mask=torch.tensor(MASK))
    expected = {"kl": 0.0, "k3_kl": 0.0, "logprob_diff_mean": 0.0, "logprob_diff_max": 0.0,
                "prob_diff_mean": 0.0, "prob_diff_max": 0.0, "prob_diff_std": 0.0,
                "prob_corr": 1.0, "is_weight_mean": 1.0, "is_weight_min": 1.0,
                "is_weight_max": 1.0, "is_ess_ratio": 1.0, "chi2_token": 0.0, "chi2_seq": 0.0,
                "ppl_ratio": 1.0, "token_prob_error": 1.0}
    assert {k: stats[f"mismatch/{k}"] for k in expected} == {k: approx(v) for k, v in expected.items()}


def test_huge_log_weights_stay_finite() -> None:
    # A token the rollout sampled at p ~ 1 that the trainer gives e^-200: the weight's log is
    # bounded at -20 / +20 (verl's bound), so nothing overflows to inf.
    stats = grpo_stats(torch.tensor(REWARDS), logprobs=torch.tensor([[-200.0, -0.1]]),
                       rollout_logprobs=torch.tensor([[-0.01, -300.0]]))
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert stats["mismatch/is_weight_min"] == approx(math.exp(-20.0))
    assert stats["mismatch/is_weight_max"] == approx(math.exp(20.0))
    assert stats["mismatch/kl"] == approx((199.99 - 299.9) / 2)


def test_undefined_mismatch_statistics_are_left_out() -> None:
    # Constant probabilities: no correlation to speak of; the rest is defined.
    flat = grpo_stats(torch.tensor(REWARDS), logprobs=torch.tensor([[-0.5, -0.5]]),
                      rollout_logprobs=torch.tensor([[-0.7, -0.7]]))
    assert "mismatch/prob_corr" not in flat and flat["mismatch/kl"] == approx(-0.2)
    # No response token at all: no mismatch key and no covariance.
    empty = grpo_stats(torch.tensor(REWARDS), logprobs=torch.tensor([[-0.5, -0.5]]),
                       rollout_logprobs=torch.tensor([[-0.7, -0.7]]), advantages=torch.tensor([1.0]),
                       mask=torch.tensor([[0, 0]]))
    assert not any(k.startswith(("mismatch/", "entropy/")) for k in empty), empty


def test_correctness_groups_and_lengths() -> None:
    stats = grpo_stats(torch.tensor(REWARDS_C), correct=torch.tensor(CORRECT),
                       response_lengths=torch.tensor(LENGTHS))
    # Group 1 is all right; groups 2 and 3 have no right answer, though group 3's partial credit
    # still differs (it is no zero-std group).
    assert stats["group/all_right_frac"] == approx(1 / 4)
    assert stats["group/all_wrong_frac"] == approx(2 / 4)
    assert stats["group/zero_std_frac"] == approx(2 / 4)
    # Correct: responses 0, 3 and 4-7 -> lengths 3, 3, 2, 2, 2, 4.
    assert stats["response/len_correct_mean"] == approx(16 / 6)
    assert stats["response/len_incorrect_mean"] == approx((5 + 7 + 36 + 1 + 18) / 10)
    # Booleans work as well as 0/1.
    as_bool = grpo_stats(torch.tensor(REWARDS_C), correct=torch.tensor(CORRECT).bool(),
                         response_lengths=torch.tensor(LENGTHS))
    assert as_bool == stats


def test_a_length_class_without_responses_is_left_out() -> None:
    none_right = grpo_stats(torch.tensor([[0.0, 0.0], [0.0, 0.0]]), correct=torch.zeros(2, 2),
                            response_lengths=torch.tensor([1, 2, 3, 4]))
    assert "response/len_correct_mean" not in none_right
    assert none_right["response/len_incorrect_mean"] == approx(2.5)
    assert none_right["group/all_wrong_frac"] == approx(1.0)
    all_right = grpo_stats(torch.tensor([[1.0, 1.0]]), correct=torch.ones(1, 2),
                           mask=torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert "response/len_incorrect_mean" not in all_right
    assert all_right["response/len_correct_mean"] == approx(1.5)
    assert all_right["group/all_right_frac"] == approx(1.0)
    # Without lengths: only the group shares.
    groups_only = grpo_stats(torch.tensor(REWARDS_C), correct=torch.tensor(CORRECT))
    assert not any(k.startswith("response/") for k in groups_only)


def test_staleness() -> None:
    stats = grpo_stats(torch.tensor(REWARDS), trajectory_age=torch.tensor(AGE))
    assert stats["staleness/mean"] == approx(1.5)
    assert stats["staleness/max"] == approx(4.0)


def test_all_optional_keys_are_canonical() -> None:
    stats = grpo_stats(torch.tensor(REWARDS_C), mask=torch.tensor(MASK), logprobs=torch.tensor(LP),
                       advantages=torch.tensor(ADV), rollout_logprobs=torch.tensor(RLP),
                       correct=torch.tensor(CORRECT), response_lengths=torch.tensor(LENGTHS),
                       trajectory_age=torch.tensor(AGE))
    assert set(stats) <= set(SIGNALS_BY_KEY)
    assert {k for k in stats if k.startswith("mismatch/")} == {
        k for k in SIGNALS_BY_KEY if k.startswith("mismatch/")}
    assert all(type(v) is float for v in stats.values())


def test_optional_input_errors_are_caller_errors() -> None:
    with pytest.raises(ValueError):  # a mismatch needs both sides
        grpo_stats(torch.tensor(REWARDS), rollout_logprobs=torch.tensor(RLP))
    with pytest.raises(ValueError):
        grpo_stats(torch.tensor(REWARDS), logprobs=torch.tensor(LP), advantages=torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError):
        grpo_stats(torch.tensor(REWARDS), correct=torch.tensor([[1, 0]]))
    with pytest.raises(ValueError):
        grpo_stats(torch.tensor(REWARDS_C), correct=torch.tensor(CORRECT), response_lengths=torch.tensor([1, 2]))


@pytest.mark.parametrize("module", ["grpo_monitor.sdk.torch", "grpo_monitor.sdk.checkpoint"])
def test_without_torch_the_import_says_which_extra_in_one_line(module: str) -> None:
    # torch blocked as a trainer's environment without it would have it: the error's one line
    # names the extra and the pip command for this installation, and chains no second traceback.
    code = f"import sys; sys.modules['torch'] = None\nimport {module}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ModuleNotFoundError: {module} needs torch, which a plain install "
                           "leaves out (the torch extra): pip install"), last
    assert "[torch]" in last and "During handling" not in proc.stderr

"""Every framework's names, read in its own source: each maps to the signal it stands for, the
false friends map to nothing and are never proposed, and a run of each framework is recognised.

The records below use the names each framework's logging code writes (contract/framework_names.py
cites the file; the frameworks already in keys.py are read by its own aliases). A record of each
framework carries the signals that framework logs by name among the reward, KL, entropy,
response length, grad norm and held-out score, plus false friends it logs beside them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_monitor.contract import framework_names
from grpo_monitor.contract.keys import framework_of, match_key, proposals
from grpo_monitor.contract.snapshot import normalize_metrics

# framework -> (its record: name -> the key it must be read as, or None: never a signal)
RECORDS: dict[str, dict[str, str | None]] = {
    "trl": {"reward": "reward/mean", "completions/mean_length": "response/len_mean",
            "entropy": "entropy/mean", "kl": "kl/mean", "grad_norm": "grad/norm",
            "eval_reward": "eval/heldout_score", "frac_reward_zero_std": "group/zero_std_frac"},
    "verl": {"critic/score/mean": "reward/mean", "response_length/mean": "response/len_mean",
             "actor/entropy": "entropy/mean", "actor/kl_loss": "kl/mean", "actor/grad_norm": "grad/norm",
             "val-core/openai/gsm8k/acc/mean@1": "eval/heldout_score", "actor/ppo_kl": None,
             "critic/rewards/mean": None, "val-core/openai/gsm8k/acc/best@4/mean": None},
    "openrlhf": {"train/rollout/reward_mean": "reward/mean", "train/response_length": "response/len_mean",
                 "train/entropy_loss": "entropy/mean", "train/kl": "kl/mean",
                 "train/actor_grad_norm": "grad/norm", "eval/eval_aime_pass1": "eval/heldout_score",
                 "eval/eval_aime_pass8": None, "train/ppo_kl": None, "train/truncated": "response/clip_ratio",
                 "train/vllm_kl": "mismatch/kl"},
    "nemo-rl": {"train/reward": "reward/mean", "train/mean_gen_tokens_per_sample": "response/len_mean",
                "train/approx_entropy": "entropy/mean", "train/kl_penalty": "kl/mean",
                "train/grad_norm": "grad/norm", "validation/accuracy": "eval/heldout_score",
                "validation/pass_k": None, "train/baseline_reward/pct_mixed": None},
    "areal": {"ppo_actor/task_reward/avg": "reward/mean", "ppo_actor/update/entropy/avg": "entropy/mean",
              "ppo_actor/update/grad_norm": "grad/norm", "eval-rollout/reward": "eval/heldout_score",
              "ppo_actor/kl_rewards/avg": None, "ppo_actor/update/approx_kl/avg": None},
    "skyrl": {"reward/avg_raw_reward": "reward/mean", "generate/avg_num_tokens": "response/len_mean",
              "policy/policy_entropy": "entropy/mean", "loss/avg_kl": "kl/mean",
              "policy/grad_norm": "grad/norm", "eval/all/avg_score": "eval/heldout_score",
              "eval/all/pass_at_8": None},
    "roll": {"critic/entropy/mean": "entropy/mean", "critic/score/mean": "reward/mean",
             "token/response_length/mean": "response/len_mean", "actor/kl_loss": "kl/mean",
             "actor_train/grad_norm": "grad/norm", "val_correct/all/mean": "eval/heldout_score",
             "actor/approxkl": None, "actor/policykl": None},
    "slime": {"rollout/raw_reward": "reward/mean", "rollout/response_len/mean": "response/len_mean",
              "train/entropy_loss": "entropy/mean", "train/kl_loss": "kl/mean",
              "train/grad_norm": "grad/norm", "rollout/rewards": None, "train/ppo_kl": None},
    "prime-rl": {"entropy/all/mean": "entropy/mean", "train/agg/all/solver/reward/mean": "reward/mean",
                 "train/agg/all/num_output_tokens/mean": "response/len_mean",
                 "optim/grad_norm": "grad/norm", "eval/gsm8k/all/solver/avg@8": "eval/heldout_score",
                 "eval/gsm8k/effective/solver/pass@8": None,
                 "train/agg/effective/solver/reward/mean": None},
    "verifiers": {"advantage/absmean": "adv/mean_abs", "reward": "reward/mean", "entropy": "entropy/mean",
                  "kl": "kl/mean", "grad_norm": "grad/norm", "eval_reward": "eval/heldout_score"},
    "easyr1": {"actor/pg_clipfrac_higher": None, "critic/score/mean": "reward/mean",
               "response_length/mean": "response/len_mean", "actor/entropy_loss": "entropy/mean",
               "actor/kl_loss": "kl/mean", "actor/grad_norm": "grad/norm",
               "val/reward_score": "eval/heldout_score"},
    "ms-swift": {"num_turns": None, "reward": "reward/mean", "completions/mean_length": "response/len_mean",
                 "entropy/mean": "entropy/mean", "kl": "kl/mean", "grad_norm": "grad/norm",
                 "eval_reward": "eval/heldout_score", "entropy/threshold": None,
                 "elapsed_time": None},
    "llama-factory": {"ppo/mean_scores": "reward/mean", "tokens/responses_len_mean": "response/len_mean",
                      "ppo/policy/entropy": "entropy/mean", "objective/kl": None,
                      "ppo/policy/approxkl": None, "objective/entropy": None},
    "art": {"reward/std_dev": "group/reward_std", "reward/mean": "reward/mean",
            "loss/kl_policy_ref": "kl/mean", "loss/grad_norm": "grad/norm", "val/reward": "eval/heldout_score",
            "loss/kl_div": None, "time/wall_clock_sec": None},
    "oat": {"actor/response_tok_len": "response/len_mean", "train/entropy": "entropy/mean",
            "eval/accuracy": "eval/heldout_score", "train/kl3": None},
    "rllm": {"batch/solve_none": "group/all_wrong_frac", "critic/score/mean": "reward/mean",
             "actor/entropy": "entropy/mean", "val/gsm8k/pass@1": "eval/heldout_score",
             "val/gsm8k/pass@8": None, "batch/solver/fractions/effective": None},
    "tinker": {"env/all/reward/total": "reward/mean", "optim/entropy": "entropy/mean",
               "kl_policy_base": "kl/mean", "test/env/all/reward/total": "eval/heldout_score",
               "env/all/by_group/frac_mixed": None, "optim/kl_sample_train_v1": "mismatch/kl"},
}
# The names that only look like a signal, as custom loops log them (the shared real runs among
# them): a count, a cumulative clock, a perplexity, a parser's step, old-vs-new KLs.
FALSE_FRIENDS = ("completion_tokens", "eval_completion_tokens", "elapsed_s", "elapsed_time",
                 "eval_perplexity", "_step_inferred", "train/ppo_kl", "rollout/rewards", "loss/kl_div",
                 "objective/kl", "train/kl3", "validation/pass_k", "eval/all/pass_at_8",
                 "val/gsm8k/pass@8", "env/all/by_group/frac_mixed", "train/global_step",
                 "progress/step", "progress/done_frac", "progress/batch")


@pytest.mark.parametrize("framework", sorted(RECORDS))
def test_a_record_of_each_framework_is_read_as_its_source_means(framework: str) -> None:
    record = {name: 0.5 for name in RECORDS[framework]}
    names: dict[str, str] = {}
    canonical, unknown = normalize_metrics(record, [], names)
    expected = {name: key for name, key in RECORDS[framework].items() if key is not None}
    assert {names[k]: k for k in canonical} == expected
    assert set(unknown) == {name for name, key in RECORDS[framework].items() if key is None}


@pytest.mark.parametrize("framework", sorted(RECORDS))
def test_each_framework_is_recognised_by_its_own_names(framework: str) -> None:
    assert framework_of(RECORDS[framework]) == framework


def test_every_framework_name_maps_to_its_key_and_no_false_friend_maps() -> None:
    for entry in framework_names.NAMES:
        name = entry.name.replace("*", "solver")  # a glob's data-dependent segment
        hit = match_key(name)
        assert hit is not None and hit.key == entry.key, entry
        assert hit.scale == entry.scale, entry
    for name in FALSE_FRIENDS:
        assert match_key(name) is None, name
        assert proposals(name) == [], name


def test_check_names_the_framework_and_proposes_no_false_friend(tmp_path: Path) -> None:
    # A hand-written loop beside slime's names: check says slime and why, maps the raw reward,
    # and proposes no key map line for a perplexity, a wall clock or a token count.
    run = tmp_path / "loop"
    run.mkdir()
    lines = [f'{{"step": {s}, "rollout/raw_reward": {0.1 * s}, "rollout/rewards": 0.0, '
             f'"eval_perplexity": 4.5, "elapsed_s": {30.0 * s}, "completion_tokens": 120}}'
             for s in range(1, 6)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    res = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "check", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert "written by slime (it logs rollout/raw_reward)" in res.stdout, res.stdout
    assert "rollout/raw_reward -> reward/mean" in res.stdout
    # A run that logs its mean reward alone is judged by the path made for it.
    assert re.search(r"GRPORewardCollapse\s+red\s+armed by: mean_only", res.stdout), res.stdout
    assert "a key map for the names" not in res.stdout, res.stdout

"""The real-runs harness reads every shared run, and the exporter understands what each logged.

What the cards should say about each run is asserted elsewhere, on top of tests/real_runs.py;
here: the collection is there, each run loads with its steps, its logged names map onto the
canonical keys they stand for (first record and whole run), the exporter's features cover
those keys after a play, and the harnesses' own pieces (writing, thinning, promtool's report)
do what they say.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from grpo_monitor.contract.snapshot import parse_record
from promtool_harness import Played, fired, parse_promtool_report
from real_runs import (
    STEP_SECONDS,
    T0,
    RealRunsMissing,
    load,
    main,
    play_real,
    run_names,
    runs_dir,
    split_runs,
    write_snapshots,
)

TRL_NEW = {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "policy/clip_frac",
           "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean",
           "reward/std", "train/lr"}
HELDOUT = "eval/heldout_score"
# A reward term that names correctness (reward/acc, correctness_reward_func, mean_correct).
ACC = "eval/sample_acc"
TRL_OLD = {"kl/mean", "loss", "response/len_mean", "reward/mean", "reward/std"}
VERL_2025 = {"entropy/mean", "grad/norm", "kl/mean", "loss", "perf/step_time_s", "perf/tokens_per_s",
             "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean",
             "reward/max", "reward/mean", "reward/min", "staleness/max", "staleness/mean", "train/lr"}
VERL = {"entropy/mean", "grad/norm", "kl/mean", "loss", "policy/clip_frac", "response/len_max",
        "response/len_mean", "reward/max", "reward/mean", "reward/min", "train/lr"}

# name -> (records, first step, last step, canonical keys over the run, of its first record)
RUNS: dict[str, tuple[int, int, int, set[str], set[str]]] = {
    # TRL GRPO, 2026 key set; step_time is logged.
    "memredteam-qwen25-3b-grpo-sparse-reward": (
        100, 1, 100, TRL_NEW | {"kl/mean", "perf/step_time_s"}, TRL_NEW | {"kl/mean", "perf/step_time_s"}),
    # TRL fork, beta 0 (no kl), logged every 10 steps.
    "trl-dapo-qwen25vl-3b-aokvqa-collapse": (49, 10, 490, TRL_NEW, TRL_NEW),
    # Unsloth's notebook table: "Training Loss" and completion_length (older TRL).
    "unsloth-llama32-3b-grpo-gsm8k-500": (
        500, 1, 500, {"kl/mean", "loss", "response/len_mean", "reward/mean", "reward/std"},
        {"kl/mean", "loss", "response/len_mean", "reward/mean", "reward/std"}),
    # Feb-2025 TRL trainer_state: completion_length, no entropy.
    "unslothgrpo-llama31-8b-gsm8k-250": (
        250, 1, 250, {ACC, "grad/norm", "kl/mean", "loss", "response/len_mean", "reward/mean", "reward/std", "train/lr"},
        {ACC, "grad/norm", "kl/mean", "loss", "response/len_mean", "reward/mean", "reward/std", "train/lr"}),
    # Mid-2025 verl: actor/kl_loss, actor/entropy, timing_s/step. Step 0 holds only the initial
    # validation score (val-core/openai/gsm8k/reward/mean@1): the held-out score.
    "verl-grpo-qwen2-7b-gsm8k-megatron-base": (
        106, 0, 105, VERL | {"perf/step_time_s", "perf/tokens_per_s", "response/clip_ratio", HELDOUT},
        {HELDOUT}),
    # Dec-2024 verl: critic/kl, actor/entropy_loss, actor/lr(1e-4); no step total, no clip ratio;
    # val/test_score/openai/gsm8k every few steps.
    "verl-ppo-qwen25-05b-gsm8k": (435, 0, 434, VERL | {HELDOUT}, VERL),
    # TRL 0.23 through Unsloth, logged every 10 steps; no KL (beta 0).
    "aaipl-gptoss20b-minesweeper-grpo-healthy": (50, 10, 500, TRL_NEW, TRL_NEW),
    # A verl fork's W&B export of 3 metrics, each under a subset's qualifier
    # (actor/main_chain/entropy, response_length/main_chain/mean) and val-core/GSM8K/reward/mean@1.
    "deepgrpo-qwen25-0.5b-gsm8k-verl-healthy": (
        2959, 0, 2958, {"entropy/mean", "response/len_mean", HELDOUT}, {HELDOUT}),
    # Feb-2025 TRL through Unsloth, every 10 steps.
    "gemma3-1b-gsm8k-unsloth-abdo-healthy": (25, 10, 250, TRL_OLD | {ACC, "grad/norm", "train/lr"},
                                             TRL_OLD | {ACC, "grad/norm", "train/lr"}),
    # verl's file logger (2025), with val-core/math500/reward/mean@4 every 10 steps and the
    # off-policy staleness; step 10 missing.
    "grpo-qwen3-1.7b-math-verl-klblowup": (71, 1, 72, VERL_2025 | {ACC, HELDOUT},
                                           VERL_2025 | {ACC}),
    "mixedcuts-qwen3-1.7b-math-verl-collapse": (61, 1, 61, VERL_2025 | {ACC, HELDOUT},
                                                VERL_2025 | {ACC}),
    # TRL console dicts: both completion_length and completions/mean_length; no entropy.
    "recall-qwen25-7b-l3-zero-std-dead": (72, 1, 72, (TRL_NEW - {"entropy/mean"}) | {"kl/mean"},
                                          (TRL_NEW - {"entropy/mean"}) | {"kl/mean"}),
    # A verl fork's W&B export of 2 metrics: actor/entropy and val-core/openai/gsm8k/acc/mean@1.
    "treerl-qwen25-0.5b-gsm8k-verl-entropy-explosion": (928, 0, 927, {"entropy/mean", HELDOUT},
                                                        {HELDOUT}),
    # Unsloth's notebook table, as the unsloth-llama32 run.
    "unsloth-llama31-8b-gsm8k-techtinker-healthy": (250, 1, 250, TRL_OLD | {ACC},
                                                    TRL_OLD | {ACC}),
    # The twenty-five runs that joined later, from frameworks and loops of their own. Of note:
    # OpenRLHF's bare `truncated` is the truncated share; a loop's `gold_acc` beside its proxy
    # reward is the held-out truth; `rollout_train_kl` is the rollout-vs-trainer mismatch, not
    # the KL to the reference; `eval/pass_at_1` is a held-out score; `eval_perplexity`,
    # `elapsed_s` and `completion_tokens` stay unmapped (false friends).
    "chaos-economy-llama32-grpo-curriculum": (50, 5, 250, {"grad/norm", "group/zero_std_frac", "kl/mean", "loss", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"},
        {"grad/norm", "group/zero_std_frac", "kl/mean", "loss", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"}),
    "nipsgrpo-qwen25-7b-rho03-seed42-collapse": (40, 5, 200, {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "mismatch/is_weight_max", "mismatch/is_weight_mean", "mismatch/is_weight_min", "mismatch/logprob_diff_max", "mismatch/logprob_diff_mean", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"},
        {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "mismatch/is_weight_max", "mismatch/is_weight_mean", "mismatch/is_weight_min", "mismatch/logprob_diff_max", "mismatch/logprob_diff_mean", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"}),
    "nipsgrpo-qwen25-7b-rho05-seed43-shortcollapse": (40, 5, 200, {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "mismatch/is_weight_max", "mismatch/is_weight_mean", "mismatch/is_weight_min", "mismatch/logprob_diff_max", "mismatch/logprob_diff_mean", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"},
        {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "mismatch/is_weight_max", "mismatch/is_weight_mean", "mismatch/is_weight_min", "mismatch/logprob_diff_max", "mismatch/logprob_diff_mean", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"}),
    "nipsgrpo-qwen25-7b-rho1-seed42-collapse": (40, 5, 200, {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "mismatch/is_weight_max", "mismatch/is_weight_mean", "mismatch/is_weight_min", "mismatch/logprob_diff_max", "mismatch/logprob_diff_mean", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"},
        {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "mismatch/is_weight_max", "mismatch/is_weight_mean", "mismatch/is_weight_min", "mismatch/logprob_diff_max", "mismatch/logprob_diff_mean", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"}),
    "nipsgrpo-qwen25-7b-rho1-seed43-collapse": (40, 5, 200, {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "mismatch/is_weight_max", "mismatch/is_weight_mean", "mismatch/is_weight_min", "mismatch/logprob_diff_max", "mismatch/logprob_diff_mean", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"},
        {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "mismatch/is_weight_max", "mismatch/is_weight_mean", "mismatch/is_weight_min", "mismatch/logprob_diff_max", "mismatch/logprob_diff_mean", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"}),
    "nipsgrpo-qwen25-7b-rho1-seed44-healthy": (40, 5, 200, {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "mismatch/is_weight_max", "mismatch/is_weight_mean", "mismatch/is_weight_min", "mismatch/logprob_diff_max", "mismatch/logprob_diff_mean", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"},
        {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "mismatch/is_weight_max", "mismatch/is_weight_mean", "mismatch/is_weight_min", "mismatch/logprob_diff_max", "mismatch/logprob_diff_mean", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"}),
    "nipsgrpo-qwen25-7b-rho3-seed42-healthy": (40, 5, 200, {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "mismatch/is_weight_max", "mismatch/is_weight_mean", "mismatch/is_weight_min", "mismatch/logprob_diff_max", "mismatch/logprob_diff_mean", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"},
        {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "mismatch/is_weight_max", "mismatch/is_weight_mean", "mismatch/is_weight_min", "mismatch/logprob_diff_max", "mismatch/logprob_diff_mean", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"}),
    "nipsgrpo-qwen35-9b-rho07-seed42-healthy": (40, 5, 200, {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"},
        {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"}),
    "nipsgrpo-qwen35-9b-rho07-seed44-collapse": (40, 5, 200, {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"},
        {"entropy/mean", "grad/norm", "group/zero_std_frac", "loss", "perf/step_time_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/mean", "reward/std", "train/lr"}),
    "openrlhf-gptoss120b-aime-grpo-a24-truncation-collapse": (16, 1, 17, {ACC, "loss", "response/clip_ratio", "response/len_mean", "reward/mean", "train/lr"},
        {ACC, "loss", "response/clip_ratio", "response/len_mean", "reward/mean", "train/lr"}),
    "rhdemo-qwen25-05b-imdb-sentiment-cap09-healthy": (101, 0, 100, {"eval/heldout_score", "grad/norm", "kl/mean", "loss", "reward/mean", "reward/std", "train/lr"},
        {"eval/heldout_score"}),
    "rhdemo-qwen25-05b-imdb-sentiment-kl01-healthy": (101, 0, 100, {"eval/heldout_score", "grad/norm", "kl/mean", "loss", "reward/mean", "reward/std", "train/lr"},
        {"eval/heldout_score"}),
    "rhdemo-qwen25-05b-imdb-sentiment-nokl-rewardhack": (101, 0, 100, {"eval/heldout_score", "grad/norm", "kl/mean", "loss", "reward/mean", "reward/std", "train/lr"},
        {"eval/heldout_score"}),
    "rlvr-experiments-qwen3-1.7b-gsm8k-sweep": (3801, 1, 214, {"entropy/mean", "kl/mean", "loss", "response/len_mean", "reward/mean"},
        {"entropy/mean", "kl/mean", "loss", "response/len_mean", "reward/mean"}),
    "rmoveropt-qwen25-05b-gsm8k-proxyrm-goodhart": (50, 10, 500, {"eval/heldout_score", "grad/norm", "group/zero_std_frac", "kl/mean", "loss", "response/len_mean", "reward/mean", "reward/std"},
        {"eval/heldout_score", "grad/norm", "group/zero_std_frac", "kl/mean", "loss", "response/len_mean", "reward/mean", "reward/std"}),
    "scratchgrpo-qwen25math-15b-lr1e-4-entropy-collapse": (14, 0, 13, {"entropy/mean", "eval/heldout_score", "response/len_mean"},
        {"entropy/mean", "eval/heldout_score", "response/len_mean"}),
    "scratchgrpo-qwen25math-15b-lr3e-5-healthy": (100, 0, 99, {"entropy/mean", "eval/heldout_score", "response/len_mean"},
        {"entropy/mean", "eval/heldout_score", "response/len_mean"}),
    "scratchgrpo-qwen25math-15b-nobaseline-length-collapse": (96, 0, 95, {"eval/heldout_score", "grad/norm", "response/len_mean"},
        {"eval/heldout_score", "grad/norm", "response/len_mean"}),
    "scratchgrpo-qwen25math-15b-reinforce-baseline-healthy": (100, 0, 99, {"eval/heldout_score", "grad/norm", "response/len_mean"},
        {"eval/heldout_score", "grad/norm", "response/len_mean"}),
    "tinker-qwen3-4b-code-rl-binary-flat-healthy": (101, 0, 100, {ACC, "eval/heldout_score", "reward/mean"},
        {ACC, "reward/mean"}),
    "tinker-rh-llama32-1b-leetcode-proxy": (52, 0, 44, {ACC, "entropy/mean", "perf/step_time_s", "reward/mean", "train/lr"},
        {ACC, "entropy/mean", "perf/step_time_s", "reward/mean", "train/lr"}),
    "trl-qwen25-15b-math-grpo-seed42-healthy": (32, 1, 32, {"entropy/mean", "grad/norm", "group/zero_std_frac", "policy/clip_frac", "response/clip_ratio", "response/len_mean", "reward/mean", "reward/std", "train/lr"},
        {"entropy/mean", "grad/norm", "group/zero_std_frac", "policy/clip_frac", "response/clip_ratio", "response/len_mean", "reward/mean", "reward/std", "train/lr"}),
    "verl-grpo-qwen2-7b-gsm8k-fsdp-offpolicy": (106, 0, 105, {"entropy/mean", "eval/heldout_score", "grad/norm", "kl/mean", "loss", "perf/step_time_s", "perf/tokens_per_s", "policy/clip_frac", "response/clip_ratio", "response/len_max", "response/len_mean", "reward/max", "reward/mean", "reward/min", "train/lr"},
        {"eval/heldout_score"}),
    "verl-ppo-gemma2-2b-gsm8k": (106, 0, 105, {"entropy/mean", "eval/heldout_score", "grad/norm", "kl/mean", "loss", "policy/clip_frac", "response/len_max", "response/len_mean", "reward/max", "reward/mean", "reward/min", "train/lr"},
        {"entropy/mean", "eval/heldout_score", "grad/norm", "kl/mean", "loss", "policy/clip_frac", "response/len_max", "response/len_mean", "reward/max", "reward/mean", "reward/min", "train/lr"}),
    "verl-qwen3-8b-dapomath-grpo-r1-healthy": (20, 1, 20, {"entropy/mean", "eval/heldout_score", "grad/norm", "group/all_wrong_frac", "group/zero_std_frac", "kl/mean", "loss", "mismatch/kl", "mismatch/prob_corr", "mismatch/prob_diff_max", "mismatch/prob_diff_mean", "policy/clip_frac", "response/len_max", "response/len_mean", "reward/max", "reward/mean", "reward/min", "reward/std", "staleness/max", "train/lr"},
        {"entropy/mean", "grad/norm", "group/all_wrong_frac", "group/zero_std_frac", "kl/mean", "loss", "mismatch/kl", "mismatch/prob_corr", "mismatch/prob_diff_max", "mismatch/prob_diff_mean", "policy/clip_frac", "response/len_max", "response/len_mean", "reward/max", "reward/mean", "reward/min", "reward/std", "staleness/max", "train/lr"}),
}
# Logs whose steps go back (a restart) or hold several runs (a sweep's `run` field): their steps
# are checked per run and between restarts.
RESTARTS = {"tinker-rh-llama32-1b-leetcode-proxy": 2}
SWEEPS = {"rlvr-experiments-qwen3-1.7b-gsm8k-sweep": 14}


def canonical(record: dict[str, object]) -> dict[str, float]:
    return parse_record(record, run="r", rank=0, mtime=0.0).metrics


def test_the_shared_collection_is_there() -> None:
    # Fails (never skips) without ../shared/real-runs or $GRPO_REAL_RUNS.
    assert runs_dir().is_dir()
    assert run_names() == sorted(RUNS)


def test_a_missing_collection_is_an_error_that_says_where(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    real = runs_dir()
    monkeypatch.setenv("GRPO_REAL_RUNS", str(tmp_path / "nowhere"))
    with pytest.raises(RealRunsMissing, match="nowhere.*GRPO_REAL_RUNS"):
        load("verl-ppo-qwen25-05b-gsm8k")
    monkeypatch.setenv("GRPO_REAL_RUNS", str(real))
    with pytest.raises(FileNotFoundError, match="no real run 'nope'"):
        load("nope")


@pytest.mark.parametrize("name", sorted(RUNS))
def test_run_loads_with_its_steps_and_canonical_keys(name: str) -> None:
    count, first, last, keys, first_keys = RUNS[name]
    records = load(name)
    steps = [r["step"] for r in records]
    assert (len(records), steps[0], steps[-1]) == (count, first, last)
    runs = split_runs(records, name)
    assert len(runs) == SWEEPS.get(name, 1)
    for recs in runs.values():
        steps = [r["step"] for r in recs]
        assert sum(b <= a for a, b in zip(steps, steps[1:])) == RESTARTS.get(name, 0)
    assert not any(k.startswith("_") for r in records for k in r)  # helper fields dropped
    assert set(canonical(records[0])) == first_keys
    assert set().union(*(canonical(r) for r in records)) == keys


def test_old_names_are_read_with_their_meaning_and_units() -> None:
    # The verl PPO run's first line: actor/entropy_loss 0.526 (the entropy), critic/kl -0.0,
    # actor/lr(1e-4) 0.01 (lr 1e-6), actor/ppo_kl 0.0 left generic.
    verl = canonical(load("verl-ppo-qwen25-05b-gsm8k")[0])
    assert verl["entropy/mean"] == 0.526 and verl["kl/mean"] == 0.0
    assert verl["train/lr"] == pytest.approx(1e-6)
    unsloth = canonical(load("unsloth-llama32-3b-grpo-gsm8k-500")[0])
    assert unsloth["response/len_mean"] == 242.4375 and unsloth["loss"] == 0.0
    grpo = canonical(load("verl-grpo-qwen2-7b-gsm8k-megatron-base")[1])
    assert grpo["kl/mean"] == pytest.approx(0.0021767416)  # actor/kl_loss, not actor/ppo_kl


@pytest.mark.parametrize("name", sorted(RUNS))
def test_play_feeds_every_canonical_key_to_the_step_windows(name: str) -> None:
    count, first, last, keys, _ = RUNS[name]
    played = play_real(name)
    if name in SWEEPS:  # the sweep's runs side by side: one scrape per step
        assert played.scrape_steps == sorted({r["step"] for r in load(name)})
    else:  # one scrape per logged step; two records of one step in a row are one step
        assert played.scrape_steps == [step for step, _ in itertools.groupby(r["step"] for r in load(name))]
    # A run of 50 steps or more has every key's 50-step extremes; a shorter one its 20-step
    # means (a performance key's only window is 50 steps long: none on a shorter run; the
    # held-out score, logged every few steps, is judged on its own points).
    long_enough = max(r["step"] for r in load(name)) - min(r["step"] for r in load(name)) >= 50
    family, window = ("grpo_window_max{", 'window_steps="50"') if long_enough else \
        ("grpo_window_mean{", 'window_steps="20"')
    windowed = {s.split('key="')[1].split('"')[0] for s in played.series
                if s.startswith(family) and window in s}
    if long_enough:
        assert windowed == keys
    else:
        assert windowed - {HELDOUT} == {k for k in keys if not k.startswith("perf/")} - {HELDOUT}


def test_write_snapshots_appends_flat_records_as_logged(tmp_path: Path) -> None:
    records = load("unslothgrpo-llama31-8b-gsm8k-250")[:12]
    path = write_snapshots(records[:6], tmp_path, "u", every=3)
    assert write_snapshots(records[6:], tmp_path, "u", every=3) == path
    assert path == tmp_path / "u" / "metrics.jsonl"
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert [ln["step"] for ln in lines] == [3, 6, 9, 12]
    for ln in lines:
        rec = next(r for r in records if r["step"] == ln["step"])
        assert ln == {**rec, "time": T0 + rec["step"] * STEP_SECONDS}


def test_thinned_play_is_logged_every_k_steps() -> None:
    played = play_real("unslothgrpo-llama31-8b-gsm8k-250", every=10)
    assert played.scrape_steps == list(range(10, 251, 10))
    coarse = play_real("unslothgrpo-llama31-8b-gsm8k-250", scrape_every_steps=25)
    assert coarse.scrape_steps == [24, *range(49, 250, 25), 250]


REPORT = '''Unit Testing:  t.json
  FAILED:
    expr: "group by (alertname, severity) (ALERTS{alertstate=\\"firing\\"})", time: 1h5m,
        exp: nil
        got: {alertname="A", severity="warning"} 1E+00, {alertname="B", severity="critical"} 1E+00
'''
EXPR = 'group by (alertname, severity) (ALERTS{alertstate="firing"})'


def test_promtool_report_is_parsed_strictly() -> None:
    assert parse_promtool_report(REPORT, 1, EXPR) == {65: {("A", "warning"), ("B", "critical")}}
    assert parse_promtool_report("Unit Testing:  t.json\n  SUCCESS\n", 0, EXPR) == {}
    for bad, rc in [(REPORT.replace("1E+00, {", "2E+00, {"), 1), (REPORT.replace("1h5m", "65s"), 1),
                    (REPORT.replace("exp: nil", 'exp: {a="b"}'), 1), (REPORT + "  surprise\n", 1),
                    ("Unit Testing:  t.json\n  FAILED:\n", 1), ("error loading rules\n", 1),
                    ("", 0), (REPORT, 2), (REPORT.replace('"firing', '"pending'), 1)]:
        with pytest.raises(ValueError):
            parse_promtool_report(bad, rc, EXPR)


def test_fired_reads_intervals_from_the_real_promtool(tmp_path: Path) -> None:
    # A NaN seen at steps 20 and 30 only: the red card fires at those scrapes and stops at the
    # next, where the series is gone (a staleness marker, as the real Prometheus writes).
    series = {'grpo_window_nonfinite{run="r",rank="0",key="loss",window_steps="50"}':
              ["_", "1", "2", "_", "_", "_", "3", "_"]}
    played = Played(series, [10, 20, 30, 40, 50, 60, 70, 80])
    assert fired(played, tmp_path) == {"GRPONonFiniteValues": [(20, 30), (70, 70)]}


def test_command_line_reads_a_folder_and_prints_the_run(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # Any folder holding a derived_steps.jsonl-style log, not only the shared runs' names.
    folder = tmp_path / "my-run"
    folder.mkdir()
    lines = [json.dumps(r) for r in load("trl-dapo-qwen25vl-3b-aokvqa-collapse")[:20]]
    (folder / "derived_steps.jsonl").write_text("\n".join(lines) + "\n")
    assert main([str(folder), "--every", "20"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "my-run: 10 records, steps 20..200 (every 20 step(s))"
    assert out[1].startswith("  10 scrapes, ")
    assert all(ln.startswith("  ") for ln in out[1:])

"""GRPOMonitorCallback: a real TRL GRPOTrainer run on a tiny model built in code, its snapshot
file, and a real exporter serving it; then the key mapping on hand-made logs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests

import trl  # noqa: F401  (the test extra installs it; a missing trl must fail, not skip)

from conftest import Running, value
from tiny_model import tiny_model_dir
from grpo_monitor.integrations.trl import (
    TRL_KEYS,
    TRL_NAMES,
    GRPOMonitorCallback,
    map_trl_logs,
    rollback_checkpoint,
)

RUN = "trl-test"
MAX_STEPS = 3
SAVE_STEPS = 2


# -- a real GRPOTrainer run --------------------------------------------------------------------


def _count_vowels(completions: list[str], **_: Any) -> list[float]:
    return [sum(c in "aeiou" for c in text) / 8 for text in completions]


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_trl_name_has_its_canonical_key() -> None:
    # keys.py's aliases are the translation; one it lost would leave TRL's name untranslated.
    assert list(TRL_KEYS) == list(TRL_NAMES)
    assert TRL_KEYS["kl"] == "kl/mean" and TRL_KEYS["reward"] == "reward/mean"


def test_grpo_trainer_run_is_exported(tmp_path: Path, snapshot_dir: Path, exporter: Running) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model_path, tokenizer = tiny_model_dir(tmp_path)
    dataset = Dataset.from_dict({"prompt": ["1+1=?", "2+3=?", "ab?", "cd?"] * 4})
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, max_steps=MAX_STEPS, logging_steps=1, report_to=[],
        use_cpu=True, beta=0.1, save_strategy="steps", save_steps=SAVE_STEPS, seed=0,
        disable_tqdm=True)
    monitor = GRPOMonitorCallback(snapshot_dir, run=RUN)
    trainer = GRPOTrainer(model=model_path, reward_funcs=_count_vowels, args=args,
                          train_dataset=dataset, processing_class=tokenizer, callbacks=[monitor])
    trainer.train()

    records = _read(snapshot_dir / RUN / "rank-0.jsonl")
    steps = [r for r in records if r["metrics"]]
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert [r["step"] for r in steps] == [h["step"] for h in logged] == list(range(1, MAX_STEPS + 1))
    for rec, log in zip(steps, logged):
        assert (rec["run"], rec["rank"], rec["world_size"]) == (RUN, 0, 1)
        m = rec["metrics"]
        for trl_key, key in TRL_KEYS.items():
            if trl_key == "clip_ratio":  # the Liger loss's name (use_liger_kernel): not this run's
                assert trl_key not in log and trl_key not in m
                continue
            assert m[key] == pytest.approx(log[trl_key]), key
            assert trl_key == key or trl_key not in m  # translated, not written twice
        assert m["rewards/_count_vowels/mean"] == pytest.approx(log["rewards/_count_vowels/mean"])
        assert "epoch" not in m and "step" not in m
    # Checkpoints at step 2 (save_steps) and at the end of training (step 3).
    events = [e for r in records for e in r.get("events", [])]
    # ... and the end of the run, marked by on_train_end: the last record.
    assert [(e["type"], e["step"]) for e in events] == [("checkpoint_save", 2),
                                                        ("checkpoint_save", 3), ("run_end", 3)]
    assert records[-1]["events"] == [events[-1]] and records[-1]["metrics"] == {}
    assert all(e["duration_s"] >= 0 for e in events[:2])
    assert monitor.writer is None  # closed at on_train_end

    lbl = {"run": RUN, "rank": "0"}
    exporter.wait_value("grpo_step", MAX_STEPS, **lbl)
    s = exporter.scrape()
    last = steps[-1]["metrics"]
    assert value(s, "grpo_reward_mean", **lbl) == pytest.approx(last["reward/mean"])
    assert value(s, "grpo_kl_mean", **lbl) == pytest.approx(last["kl/mean"])
    assert value(s, "grpo_entropy_mean", **lbl) == pytest.approx(last["entropy/mean"])
    assert value(s, "grpo_response_length_mean_tokens", **lbl) == pytest.approx(
        last["response/len_mean"])
    assert value(s, "grpo_step_duration_seconds", **lbl) == pytest.approx(last["perf/step_time_s"])
    assert value(s, "grpo_events_total", type="checkpoint_save", **lbl) == 2
    # The end mark is the file's last line: it may reach the store a batch after the last step.
    exporter.wait_value("grpo_run_ended", 1, run=RUN)  # the hung-run card stays quiet
    assert value(s, "grpo_metric_value", key="rewards/_count_vowels/mean", **lbl) == pytest.approx(
        last["rewards/_count_vowels/mean"])
    assert exporter.errors("invalid_value") == 0


def _infinite_for_one(completions: list[str], **_: Any) -> list[float]:
    # A reward model that returns inf for one sample (docs/background.md#nan-and-loss-spikes: a
    # reward model that returns NaN or an absurdly large value).
    return [math.inf if i == 0 else 0.5 for i, _ in enumerate(completions)]


def test_sick_grpo_trainer_run_raises_the_red_card(tmp_path: Path, snapshot_dir: Path,
                                                   exporter: Running) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from promtool_harness import Recorder, check_cards

    model_path, tokenizer = tiny_model_dir(tmp_path)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, max_steps=2, logging_steps=1, report_to=[], use_cpu=True,
        beta=0.1, save_strategy="no", seed=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model_path, reward_funcs=_infinite_for_one, args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["1+1=?", "ab?"] * 4}),
                          processing_class=tokenizer,
                          callbacks=[GRPOMonitorCallback(snapshot_dir, run="trl-sick")])
    trainer.train()
    exporter.wait_value("grpo_window_nonfinite", lambda v: v is not None and v >= 1,
                        run="trl-sick", rank="0", key="reward/mean", window_steps="50")
    # One scrape of the real exporter, evaluated by the real rules: the red card.
    recorder = Recorder(snapshot_dir)
    recorder.add(requests.get(f"{exporter.url}/metrics", timeout=5).text, step=2)
    check_cards(recorder.played(), [(0, {"GRPONonFiniteValues"})], tmp_path)


def test_red_card_stops_training_and_keeps_the_last_healthy_checkpoint(
        tmp_path: Path, snapshot_dir: Path) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpo_monitor.contract.control import ControlRecord, now_rfc3339, write_control
    from grpo_monitor.contract.run_layout import ROLLBACK_TARGET

    calls = {"n": 0}

    def reward_then_red_card(completions: list[str], **_: Any) -> list[float]:
        # The red card arrives while step 3 generates: checkpoints 1 and 2 are healthy.
        calls["n"] += 1
        if calls["n"] == 3:
            write_control(snapshot_dir, "trl-red", ControlRecord(
                state="paused", alertname="GRPONonFiniteValues", run="trl-red", step=3,
                onset=now_rfc3339(), fingerprint="f1", paused_at=now_rfc3339()))
        return [0.5] * len(completions)

    model_path, tokenizer = tiny_model_dir(tmp_path)
    out = tmp_path / "out"
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, max_steps=6, logging_steps=1, report_to=[], use_cpu=True,
        beta=0.0, save_strategy="steps", save_steps=1, save_total_limit=1, seed=0,
        disable_tqdm=True)
    trainer = GRPOTrainer(model=model_path, reward_funcs=reward_then_red_card, args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["1+1=?", "ab?"] * 8}),
                          processing_class=tokenizer,
                          callbacks=[GRPOMonitorCallback(snapshot_dir, run="trl-red")])
    trainer.train()
    # Stopped at the step of the red card (of 6), a checkpoint of it saved ...
    assert trainer.state.global_step == 3
    events = [(e["type"], e["step"]) for r in _read(snapshot_dir / "trl-red" / "rank-0.jsonl")
              for e in r.get("events", [])]
    # A run the red card stopped ended on purpose: on_train_end marks it (no hung-run card).
    assert events == [("checkpoint_save", 1), ("checkpoint_save", 2), ("checkpoint_save", 3),
                      ("run_end", 3)]
    # ... and, with save_total_limit=1, rotation kept the newest checkpoint from before the
    # card's onset (not the suspect checkpoint-3): the rollback target survives.
    rollback = json.loads((snapshot_dir / "trl-red" / ROLLBACK_TARGET).read_text())
    assert rollback["step"] == 2 and rollback["alertname"] == "GRPONonFiniteValues"
    assert Path(rollback["checkpoint"]).name == "checkpoint-2"
    assert (out / "checkpoint-2").is_dir()
    assert not (out / "checkpoint-1").exists()  # rotation still works for the rest

    # Relaunched before a person looked: refused. After `grpo-monitor resume`, the relaunch goes
    # on from the last healthy checkpoint without anyone typing a path.
    with pytest.raises(RuntimeError, match="still paused"):
        rollback_checkpoint(snapshot_dir, "trl-red")
    res = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "resume", "trl-red",
                          "--snapshot.dir", str(snapshot_dir)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    resume_from = rollback_checkpoint(snapshot_dir, "trl-red")
    assert resume_from == str(out / "checkpoint-2")
    trainer = GRPOTrainer(model=model_path, reward_funcs=reward_then_red_card, args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["1+1=?", "ab?"] * 8}),
                          processing_class=tokenizer,
                          callbacks=[GRPOMonitorCallback(snapshot_dir, run="trl-red")])
    trainer.train(resume_from_checkpoint=resume_from)
    assert trainer.state.global_step == 6
    steps = [r["step"] for r in _read(snapshot_dir / "trl-red" / "rank-0.jsonl") if r.get("metrics")]
    assert steps[-4:] == [3, 4, 5, 6]  # step 3 again, from checkpoint-2's weights


def test_two_processes_stop_at_one_step_when_one_folder_holds_the_card(tmp_path: Path) -> None:
    # torchrun, two processes, accelerate's gloo group; each process writes its own folder (two
    # "nodes"), and the record lands in process 1's folder only, while step 3 generates.
    from grpo_monitor.contract.run_layout import ROLLBACK_TARGET

    from gloo_job import clean_env

    from grpo_monitor.tools.stack import free_port

    tiny_model_dir(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
         str(Path(__file__).with_name("trl_ranks.py")), str(tmp_path)],
        env=clean_env(), capture_output=True, text=True, timeout=300, check=False)
    # A hung rank's threads, dumped by trl_ranks.py before it exits, are in its stderr.
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]
    for rank in (0, 1):
        assert json.loads((tmp_path / f"result-{rank}.json").read_text())["global_step"] == 3
        recs = _read(tmp_path / f"node-{rank}" / "trl-ranks" / f"rank-{rank}.jsonl")
        assert [(e["type"], e["step"]) for r in recs for e in r.get("events", [])][-2:] == [
            ("checkpoint_save", 3), ("run_end", 3)]
    # The main process knew the target without holding the record.
    rollback = json.loads((tmp_path / "node-0" / "trl-ranks" / ROLLBACK_TARGET).read_text())
    assert Path(rollback["checkpoint"]).name == "checkpoint-2"


# -- the callback on hand-made trainer state ---------------------------------------------------


def _args(tmp_path: Path, **kw: Any) -> SimpleNamespace:
    base = {"run_name": None, "output_dir": str(tmp_path / "out" / "my-run"), "process_index": 0,
            "world_size": 1}
    return SimpleNamespace(**{**base, **kw})


def _state(step: int, main: bool = True) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, is_world_process_zero=main)


TRL_LOGS = {
    "loss": 0.12, "grad_norm": 0.8, "learning_rate": 1e-6, "num_tokens": 52.0,
    "completions/mean_length": 310.0, "completions/min_length": 12.0,
    "completions/max_length": 512.0, "completions/clipped_ratio": 0.25,
    "rewards/accuracy_reward/mean": 0.4, "rewards/format_reward/mean": 0.9,
    "reward": 1.3, "reward_std": 0.5, "frac_reward_zero_std": 0.125, "kl": 0.02,
    "entropy": 1.1, "clip_ratio/low_mean": 0.01, "clip_ratio/region_mean": 0.03,
    "step_time": 4.5, "epoch": 0.25,
}


def test_key_mapping() -> None:
    assert map_trl_logs(TRL_LOGS) == {
        "loss": 0.12, "grad/norm": 0.8, "train/lr": 1e-6, "num_tokens": 52.0,
        "response/len_mean": 310.0, "completions/min_length": 12.0, "response/len_max": 512.0,
        "response/clip_ratio": 0.25, "rewards/accuracy_reward/mean": 0.4,
        "rewards/format_reward/mean": 0.9, "reward/mean": 1.3, "reward/std": 0.5,
        "group/zero_std_frac": 0.125, "kl/mean": 0.02, "entropy/mean": 1.1,
        "clip_ratio/low_mean": 0.01, "policy/clip_frac": 0.03, "perf/step_time_s": 4.5,
    }
    # None is TRL's "no valid value this step"; words and lists are no metrics; 0-d tensors are.
    import torch
    assert map_trl_logs({"kl": None, "note": "x", "hist": [1, 2], "grad_norm": torch.tensor(2.0),
                         "loss": True}) == {"grad/norm": 2.0, "loss": 1.0}
    # use_liger_kernel=True: the Liger GRPO loss logs its clip share as a bare clip_ratio, the
    # same signal as clip_ratio/region_mean.
    assert map_trl_logs({"clip_ratio": 0.07, "loss": 0.1}) == {"policy/clip_frac": 0.07, "loss": 0.1}


def test_callback_writes_main_process_logs_with_nan(tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    cb = GRPOMonitorCallback(snap)
    args = _args(tmp_path)
    cb.on_train_begin(args, _state(0), None)
    cb.on_log(args, _state(5), None, logs={**TRL_LOGS, "loss": float("nan"),
                                           "grad_norm": float("inf")})
    cb.on_save(args, _state(5), None)
    cb.on_log(args, _state(5), None, logs={"train_runtime": 3.0, "train_samples_per_second": 1.0,
                                           "train_loss": 0.1, "epoch": 1.0})  # the run summary
    cb.on_train_end(args, _state(5), None)
    cb.on_log(args, _state(6), None, logs=TRL_LOGS)  # after the end: reopens, never raises

    # run defaults to the name of output_dir
    recs = _read(snap / "my-run" / "rank-0.jsonl")
    assert [r["step"] for r in recs] == [5, 5, 5, 6]
    assert [e["type"] for e in recs[2]["events"]] == ["run_end"]  # on_train_end
    m = recs[0]["metrics"]
    assert math.isnan(m["loss"]) and m["grad/norm"] == math.inf
    assert m["reward/mean"] == 1.3 and m["rewards/accuracy_reward/mean"] == 0.4
    assert recs[1]["metrics"] == {}
    (event,) = recs[1]["events"]
    assert event["type"] == "checkpoint_save" and event["step"] == 5
    assert event["path"].endswith("checkpoint-5")
    # The file carries the JSON NaN / Infinity tokens the contract reads as signals.
    assert "NaN" in (snap / "my-run" / "rank-0.jsonl").read_text()


def test_run_name_from_args(tmp_path: Path) -> None:
    cb = GRPOMonitorCallback(tmp_path / "snap")
    args = _args(tmp_path, run_name="exp/42")
    cb.on_log(args, _state(1), None, logs={"reward": 0.5})
    cb.on_train_end(args, _state(1), None)
    assert _read(tmp_path / "snap" / "exp-42" / "rank-0.jsonl")[0]["metrics"] == {"reward/mean": 0.5}


def test_non_main_processes_write_nothing(tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    cb = GRPOMonitorCallback(snap, run="r")
    args = _args(tmp_path, process_index=3, world_size=4)
    cb.on_train_begin(args, _state(0, main=False), None)
    cb.on_log(args, _state(1, main=False), None, logs=TRL_LOGS)
    cb.on_save(args, _state(1, main=False), None)
    cb.on_train_end(args, _state(1, main=False), None)
    assert not snap.exists()


def test_per_rank_perf_writes_only_step_time(tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    cb = GRPOMonitorCallback(snap, run="r", per_rank_perf=True)
    args = _args(tmp_path, process_index=3, world_size=4)
    cb.on_train_begin(args, _state(0, main=False), None)
    cb.on_log(args, _state(1, main=False), None, logs=TRL_LOGS)
    cb.on_save(args, _state(1, main=False), None)
    cb.on_train_end(args, _state(1, main=False), None)
    recs = _read(snap / "r" / "rank-3.jsonl")
    assert (recs[0]["rank"], recs[0]["world_size"]) == (3, 4)
    assert recs[0]["metrics"] == {"perf/step_time_s": 4.5}
    assert recs[1]["events"][0]["type"] == "checkpoint_save"
    assert recs[2]["events"][0]["type"] == "run_end" and recs[2]["step"] == 1


def test_never_raises_into_training(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Broken(dict):
        def items(self):  # type: ignore[override]
            raise RuntimeError("boom")

    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the snapshot folder should be: the disk "fails"
    cb = GRPOMonitorCallback(blocker, run="r")
    args = _args(tmp_path)
    cb.on_train_begin(args, _state(0), None)
    cb.on_log(args, _state(1), None, logs=TRL_LOGS)
    cb.on_save(args, _state(1), None)
    cb.on_log(args, _state(2), None, logs=Broken(TRL_LOGS))
    cb.on_train_end(args, _state(2), None)
    # A run name that is no folder name is not the trainer's problem either.
    bad = GRPOMonitorCallback(tmp_path / "snap", run="a/b")
    bad.on_train_begin(args, _state(0), None)
    bad.on_log(args, _state(1), None, logs=TRL_LOGS)
    assert "TRL callback failed" in caplog.text


def test_importing_grpo_monitor_does_not_import_transformers() -> None:
    code = ("import grpo_monitor, grpo_monitor.integrations, sys; "
            "assert 'transformers' not in sys.modules and 'trl' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})


# -- rollout vs trainer: TRL's sampling/* metrics reach the exporter as they are logged -------

# What GRPOTrainer logs with use_vllm=True and vllm_importance_sampling_correction (the default),
# trl/trainer/grpo_trainer.py: the mean / max |log p_trainer - log p_vLLM| of the sampled tokens
# and the importance weights' min / mean / max. TRL logs no trajectory age: its GRPOTrainer is
# synchronous.
TRL_MISMATCH = {
    "sampling/sampling_logp_difference/mean": "grpo_mismatch_logprob_abs_diff_mean",
    "sampling/sampling_logp_difference/max": "grpo_mismatch_logprob_abs_diff_max",
    "sampling/importance_sampling_ratio/min": "grpo_mismatch_is_weight_min",
    "sampling/importance_sampling_ratio/mean": "grpo_mismatch_is_weight_mean",
    "sampling/importance_sampling_ratio/max": "grpo_mismatch_is_weight_max",
}


STEPS = 25  # past the 20-step window of the level card


def _vllm_logs(step: int) -> dict[str, float]:
    # The mismatch grows slowly over the run, as a drifting rollout engine's does.
    return {**TRL_LOGS, "sampling/sampling_logp_difference/mean": 0.01 + 0.001 * step,
            "sampling/sampling_logp_difference/max": 2.0 + 0.1 * step,
            "sampling/importance_sampling_ratio/min": 0.1, "sampling/importance_sampling_ratio/mean":
            1.0 - 0.01 * step, "sampling/importance_sampling_ratio/max": 2.5}


def test_vllm_mismatch_metrics_are_exported_without_a_mapping(snapshot_dir: Path,
                                                             exporter: Running) -> None:
    cb = GRPOMonitorCallback(snapshot_dir, run="trl-vllm")
    args = _args(snapshot_dir.parent)
    cb.on_train_begin(args, _state(0), None)
    for step in range(1, STEPS + 1):
        cb.on_log(args, _state(step), None, logs=_vllm_logs(step))
    cb.on_train_end(args, _state(STEPS), None)

    # The callback writes TRL's names as they are: the snapshot file describes TRL's run.
    last = _read(snapshot_dir / "trl-vllm" / "rank-0.jsonl")[-2]["metrics"]
    assert {k: last[k] for k in TRL_MISMATCH} == {k: _vllm_logs(STEPS)[k] for k in TRL_MISMATCH}

    lbl = {"run": "trl-vllm", "rank": "0"}
    exporter.wait_value("grpo_step", STEPS, **lbl)
    s = exporter.scrape()
    logged = _vllm_logs(STEPS)
    assert {series: value(s, series, **lbl) for series in TRL_MISMATCH.values()} == {
        series: pytest.approx(logged[name]) for name, series in TRL_MISMATCH.items()}
    for name in TRL_MISMATCH:  # mapped, so not exported a second time under TRL's name
        assert value(s, "grpo_metric_value", key=name, **lbl) is None, name
    # The canonical key gets the step-window features the mismatch cards read: over the last
    # 20 steps (6..25) the mean |log-prob difference| ran from 0.016 to 0.035.
    window = {**lbl, "key": "mismatch/logprob_diff_mean", "window_steps": "20"}
    p10, p90 = value(s, "grpo_window_p10", **window), value(s, "grpo_window_p90", **window)
    assert p10 is not None and p90 is not None
    assert 0.016 <= p10 < p90 <= 0.035

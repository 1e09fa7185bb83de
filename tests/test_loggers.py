"""Runs watched through the files their loggers already write (docs/loggers.md).

Each format is written by its own library (W&B offline, tensorboardX, MLflow, Trackio) in the
virtualenv ``make test`` makes for them (.venv-loggers), as a trainer writes it; a real exporter
reads the folder and is scraped over HTTP. The same values logged through the SDK give the same
signal series, and the hostile-folder guarantees hold for the new files.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from polling import wait_for

from conftest import ROOT, Running, Samples, parse_samples, value
from grpo_monitor.contract.logger_layout import logger_format, logger_run
from grpo_monitor.contract.logger_rows import as_snapshot_row, trainer_state_rows
from grpo_monitor.sdk.writer import SnapshotWriter
from grpo_monitor.tools.check import check

LOGGERS_PYTHON = ROOT / ".venv-loggers" / "bin" / "python"
WRITE_RUN = ROOT / "tests" / "loggers" / "write_run.py"
STEPS = 30
# Names as verl logs them; values a float32 holds to the digits written (TensorBoard's unit).
NAMES = ("critic/score/mean", "actor/entropy", "actor/kl_loss", "response_length/mean",
         "actor/grad_norm", "actor/pg_loss")


def records() -> list[dict[str, float]]:
    out = []
    for step in range(1, STEPS + 1):
        out.append({"step": step, "critic/score/mean": round(0.2 + 0.01 * step, 3),
                    "actor/entropy": round(0.9 - 0.005 * step, 3),
                    "actor/kl_loss": round(0.001 * step, 4),
                    "response_length/mean": float(200 + step),
                    "actor/grad_norm": round(1.5 - 0.01 * step, 3),
                    "actor/pg_loss": math.nan if step == 17 else round(0.05 * (-1) ** step, 3)})
    return out


def write_with_logger(fmt: str, out: Path, name: str, tmp_path: Path) -> None:
    assert LOGGERS_PYTHON.exists(), "run `make loggers-deps` (make test does) for .venv-loggers"
    feed = tmp_path / f"{fmt}-records.jsonl"
    feed.write_text("".join(json.dumps(r) + "\n" for r in records()))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    env |= {"HOME": str(tmp_path / "home"), "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
            "WANDB_DATA_DIR": str(tmp_path / "wandb-data"), "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run([str(LOGGERS_PYTHON), str(WRITE_RUN), fmt, str(out), name, str(feed)],
                          env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def write_with_sdk(root: Path, run: str) -> None:
    writer = SnapshotWriter(root, run)
    for rec in records():
        step = rec.pop("step")
        writer.log(rec, step)
    writer.close(end=False)  # a logger's file carries no end mark either


# Families that depend on when or how a record was written, not on its values.
_WRITE_DEPENDENT = ("timestamp", "seconds", "interval", "pace", "stale", "hung", "framework",
                    "snapshot", "info", "world", "records_read", "source")


def signals_of(samples: Samples, run: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for (name, labels), v in samples.items():
        d = dict(labels)
        if d.get("run") != run or any(w in name for w in _WRITE_DEPENDENT):
            continue
        d.pop("run")
        out[(name, frozenset(d.items()))] = v
    return out


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


@pytest.mark.parametrize("fmt", ["tensorboard", "wandb", "mlflow", "trackio"])
def test_a_loggers_run_is_served_as_the_sdk_serves_the_same_values(
        fmt: str, start_exporter, snapshot_dir: Path, tmp_path: Path) -> None:
    write_with_logger(fmt, snapshot_dir / "trainer-output", "logged-run", tmp_path)
    write_with_sdk(snapshot_dir, "sdk-run")
    exporter: Running = start_exporter()
    for run in ("logged-run", "sdk-run"):
        exporter.wait_value("grpo_run_logged_steps", STEPS, timeout=20, run=run)
    exporter.wait_value("grpo_reward_mean", 0.5, run="logged-run", rank="0")
    samples = exporter.scrape()
    logged, sdk = signals_of(samples, "logged-run"), signals_of(samples, "sdk-run")
    assert logged.keys() == sdk.keys(), (sorted(logged.keys() - sdk.keys())[:5],
                                          sorted(sdk.keys() - logged.keys())[:5])
    differ = [k for k in sdk if not same(logged[k], sdk[k])]
    assert not differ, [(k, logged[k], sdk[k]) for k in differ[:5]]
    assert value(samples, "grpo_nonfinite_values_total", run="logged-run", rank="0",
                 key="loss") == 1
    assert exporter.errors("unreadable_format") == 0 and exporter.errors("corrupt_record") == 0


def test_check_names_each_logger_and_the_runs_it_found(tmp_path: Path) -> None:
    out_dir = tmp_path / "outputs"
    write_with_logger("wandb", out_dir, "grpo-wandb", tmp_path)
    write_with_logger("tensorboard", out_dir, "grpo-tb", tmp_path)
    import io

    out, err = io.StringIO(), io.StringIO()
    assert check(out_dir, out, err) in (0, 1), err.getvalue()
    text = out.getvalue()
    assert "run grpo-wandb:" in text and "run grpo-tb:" in text
    assert "read from: W&B run file (wandb/offline-run-" in text
    assert "read from: TensorBoard event file (runs/grpo-tb/events.out.tfevents." in text
    assert "critic/score/mean -> reward/mean" in text
    assert "the red-card pause needs the trainer to check the gate" in text
    # W&B's own links (latest-run, debug logs) are neither followed nor errors.
    assert "symlink" not in text


@pytest.fixture(scope="module")
def event_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("tb")
    write_with_logger("tensorboard", where, "one", where)
    (found,) = (where / "runs" / "one").glob("events.out.tfevents.*")
    return found


def test_hostile_logger_files_are_counted_and_never_block(
        exporter: Running, snapshot_dir: Path, event_file: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    run = snapshot_dir / "hostile"
    run.mkdir()
    # A corrupt record in the middle: counted, the records around it served.
    data = bytearray(event_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (run / "events.out.tfevents.1.corrupt").write_bytes(bytes(data))
    exporter.wait_value("grpo_run_logged_steps", lambda v: v is not None and v >= STEPS - 2,
                        run="hostile")
    wait_for(lambda: exporter.errors("corrupt_record") >= 1)
    # No event file at all, under an event file's name: one unreadable_format, not an empty run.
    (snapshot_dir / "notb").mkdir()
    (snapshot_dir / "notb" / "events.out.tfevents.2.x").write_bytes(b"hello, world" * 10)
    wait_for(lambda: exporter.errors("unreadable_format") == 1)
    with (snapshot_dir / "notb" / "events.out.tfevents.2.x").open("ab") as fh:
        fh.write(b"hello, world")  # it grows: still the one file, counted once
    # A FIFO and a link under a logger's names: refused without opening, without blocking.
    os.mkfifo(snapshot_dir / "notb" / "run-fifo.wandb")
    outside = tmp_path / "outside.wandb"
    outside.write_bytes(event_file.read_bytes())
    os.symlink(outside, snapshot_dir / "notb" / "run-link.wandb")
    os.mkfifo(snapshot_dir / "notb" / "train_data_step3.jsonl")
    os.symlink(outside, snapshot_dir / "notb" / "train_data_step4.jsonl")
    wait_for(lambda: exporter.errors("not_regular") == 2 and exporter.errors("symlink") == 2)
    # A per-sample file whose row is longer than a turn's read: skipped to its end, counted once,
    # the rows after it read (a turn reads 64 MiB at least; here 4 KiB).
    from grpo_monitor.runtime.loggers import sources
    from grpo_monitor.runtime.loggers.sources import LoggerFiles

    monkeypatch.setattr(sources, "_WHOLE_RECORD_BYTES", 4096)

    rows: list[dict] = []
    errors: list[str] = []
    files = LoggerFiles(snapshot_dir, lambda _p, _r, row, _m: rows.append(row),
                        lambda _p, reason, _d: errors.append(reason))
    big = snapshot_dir / "notb" / "train_data_step7.jsonl"
    big.write_text(json.dumps({"rewards": [1.0], "token_ids": [list(range(2000))]}) + "\n"
                   + "not json\n" + json.dumps({"rewards": [0.0]}) + "\n")
    while files.process(big, "samples", 4096):
        pass
    files.flush_all()
    assert errors == ["oversized", "invalid_json"]
    assert rows == [{"step": 7, "reward/mean": 0.0, "reward/std": 0.0, "reward/min": 0.0,
                     "reward/max": 0.0}]
    # W&B's own links: not followed, not counted.
    (snapshot_dir / "w" / "wandb" / "run-1-abc").mkdir(parents=True)
    os.symlink("run-1-abc", snapshot_dir / "w" / "wandb" / "latest-run")
    os.symlink("run-1-abc/logs/debug.log", snapshot_dir / "w" / "wandb" / "debug.log")
    # Another program's database: none of ours, no error.
    import sqlite3

    with sqlite3.connect(snapshot_dir / "notb" / "cache.db") as db:
        db.execute("CREATE TABLE t (x)")
    # The exporter still reads on: a new snapshot run is served.
    SnapshotWriter(snapshot_dir, "after").log({"loss": 1.0}, 1)
    exporter.wait_value("grpo_loss", 1.0, run="after", rank="0")
    assert exporter.errors("unreadable_format") == 1
    assert exporter.errors("symlink") == 2 and exporter.errors("not_regular") == 2


def test_an_event_file_rewritten_from_its_start_is_read_again(
        exporter: Running, snapshot_dir: Path, event_file: Path) -> None:
    path = snapshot_dir / "again" / "events.out.tfevents.1.host"
    path.parent.mkdir()
    path.write_bytes(event_file.read_bytes())
    exporter.wait_value("grpo_run_logged_steps", STEPS, run="again")
    # A logger that starts over truncates its file: the shorter file's steps are the run now.
    data = event_file.read_bytes()
    cut = data.index(b"critic/score/mean", len(data) // 3)
    with path.open("r+b") as fh:
        fh.truncate(0)
    path.write_bytes(data[:cut - 40])
    exporter.wait_value("grpo_run_logged_steps", lambda v: v is not None and v < STEPS,
                        run="again")


def _event_records(data: bytes) -> list[tuple[int, bytes]]:
    """An event file's records (TFRecord framing: length, its CRC, data, its CRC) as (the step
    of the event, its bytes); the file-version record first, at step -1."""
    from grpo_monitor.runtime.loggers import tensorboard

    out, pos = [], 0
    while pos < len(data):
        end = pos + 16 + int.from_bytes(data[pos:pos + 8], "little")
        events, _, _ = tensorboard.read_events(data[pos:end], at_start=pos == 0)
        out.append((events[0].step if events else -1, data[pos:end]))
        pos = end
    return out


def test_a_run_two_loggers_write_is_read_from_one_of_them(
        exporter: Running, snapshot_dir: Path, event_file: Path) -> None:
    """ms-swift writes logging.jsonl and TensorBoard files of one run, both growing a step at a
    time: the run is read from its JSONL file alone, each step once (never going back)."""
    out = snapshot_dir / "swift-out" / "v1-20261205-090000"
    (out / "runs").mkdir(parents=True)
    jsonl, events = out / "logging.jsonl", out / "runs" / event_file.name
    records_ = _event_records(event_file.read_bytes())
    steps = 8
    for step in range(1, steps + 1):
        # Values of its own in the JSONL file: TensorBoard's (0.2 + 0.01 step) must never show.
        with jsonl.open("a") as fh:
            fh.write(json.dumps({"global_step/max_steps": f"{step}/{steps}",
                                 "reward": 0.5 + step, "loss": 0.1}) + "\n")
        with events.open("ab") as fh:
            fh.write(b"".join(r for at, r in records_ if at < step))
        records_ = [(at, r) for at, r in records_ if at >= step]
        exporter.wait_value("grpo_run_logged_steps", step, run="v1-20261205-090000")
        samples = exporter.scrape()
        assert value(samples, "grpo_reward_mean", run="v1-20261205-090000",
                     rank="0") == 0.5 + step
    # The TensorBoard file's last step, flushed once the file is quiet, changes nothing.
    exporter.wait_value("grpo_run_info", 1, run="v1-20261205-090000", framework="",
                        source="jsonl")
    samples = exporter.scrape()
    assert value(samples, "grpo_reward_mean", run="v1-20261205-090000", rank="0") == 0.5 + steps
    assert value(samples, "grpo_run_logged_steps", run="v1-20261205-090000") == steps


def test_framework_jsonl_rows_and_trainer_state_are_read_as_the_run_they_describe(
        exporter: Running, snapshot_dir: Path) -> None:
    swift = snapshot_dir / "out" / "v0-20261205-120000" / "logging.jsonl"
    swift.parent.mkdir(parents=True)
    swift.write_text("".join(json.dumps(
        {"loss": 0.1, "reward": 0.1 * s, "completions/mean_length": 100.0 + s,
         "global_step/max_steps": f"{s}/10", "percentage": f"{10 * s}%",
         "elapsed_time": f"{s}s"}) + "\n" for s in range(1, 5)))
    exporter.wait_value("grpo_reward_mean", 0.4, run="v0-20261205-120000", rank="0")
    # A Hugging Face run's checkpoints: each holds the whole log so far.
    hf = snapshot_dir / "hf" / "trl-out"
    for upto in (2, 4):
        ckpt = hf / f"checkpoint-{upto}"
        ckpt.mkdir(parents=True)
        history = [{"loss": 0.5, "reward": 0.1 * s, "step": s} for s in range(1, upto + 1)]
        history.append({"eval_reward": 0.3, "step": upto})
        (ckpt / "trainer_state.json").write_text(json.dumps(
            {"global_step": upto, "log_history": history}))
    exporter.wait_value("grpo_run_logged_steps", 4, run="trl-out")
    samples = exporter.scrape()
    assert value(samples, "grpo_reward_mean", run="trl-out", rank="0") == pytest.approx(0.4)
    assert value(samples, "grpo_heldout_score", run="trl-out", rank="0") == 0.3
    assert exporter.errors("invalid_value") == 0 and exporter.errors("invalid_record") == 0


def test_logger_names_and_rows() -> None:
    from pathlib import PurePath as P

    root = P("/data")
    assert logger_format("events.out.tfevents.1733400000.host.1.0") == "tensorboard"
    assert logger_format("run-9pmdakzy.wandb") == "wandb"
    assert logger_format("run-9pmdakzy.wandb.syncstate") is None
    assert logger_format("mlflow.db") == "mlflow" and logger_format("metrics.jsonl") == "jsonl"
    assert logger_format("train_data_step12.jsonl") == "samples"
    assert logger_format("val_data_step12.jsonl") is None  # validation samples: not read
    assert logger_run(P("/data/logs/exp_003/train_data_step1.jsonl"), root, "samples") == "exp_003"
    assert logger_run(P("/data/o/v1-x/runs/events.out.tfevents.1.h"), root, "tensorboard") == "v1-x"
    assert logger_run(P("/data/o/checkpoint-500/trainer_state.json"), root, "trainer_state") == "o"
    assert logger_run(P("/data/o/runs/Dec05_12-00-01_host/events.out.tfevents.1.h"), root,
                      "tensorboard") == "o"  # a Hugging Face Trainer's default logging folder
    assert logger_run(P("/data/prime/run-a/metrics.jsonl"), root, "jsonl") == "run-a"
    assert logger_run(P("/data/metrics.jsonl"), root, "jsonl") == "default"
    assert as_snapshot_row({"current_steps": 5, "loss": 1.0, "elapsed_time": "0:00:05"}) == \
        {"step": 5, "loss": 1.0}
    assert as_snapshot_row({"step": 3, "recorded_at": "2026-12-05T12:00:00+00:00", "r": "0.5"}) \
        == {"step": 3, "time": 1796472000.0, "r": "0.5"}
    assert as_snapshot_row({"no": "step"}) == {"no": "step"}  # for the parser to count
    assert trainer_state_rows({"log_history": [{"loss": 1, "step": 2}, {"eval_loss": 2, "step": 2},
                                               {"loss": 0.5, "step": 1}]}) == \
        [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 1, "eval_loss": 2}]


def _nemo_rl_samples(step: int, n: int = 8) -> tuple[str, list[float], list[float]]:
    """A NeMo-RL ``train_data_step<N>.jsonl`` as its logger writes it: a row a sample, each
    field the one-sample slice of a batch (a scalar as a one-element list, tokens as a list of
    one list); with the rewards and response lengths it holds."""
    rows, rewards, lengths = [], [], []
    for i in range(n):
        reward = 1.0 if (i + step) % 3 == 0 else 0.0
        length = 3 + (i % 4)
        mask = [0, 0] + [1] * length
        group_same = i < 4  # the first group's rewards all equal: its advantages all zero
        rows.append({"content": [f"answer {i}"], "rewards": [reward], "input_lengths": [len(mask)],
                     "token_ids": [list(range(len(mask)))], "token_loss_mask": [mask],
                     "sample_loss_mask": [1],
                     "advantages": [[0.0] * len(mask) if group_same else [0.0, 0.0] + [0.5] * length],
                     "generation_logprobs": [[-0.1] * len(mask)], "idx": i})
        rewards.append(reward)
        lengths.append(float(length))
    return "".join(json.dumps(r) + "\n" for r in rows), rewards, lengths


def test_nemo_rl_per_sample_files_are_read_as_their_steps_statistics(
        exporter: Running, snapshot_dir: Path, event_file: Path) -> None:
    import numpy as np

    logs = snapshot_dir / "nemo" / "logs" / "exp_001"
    logs.mkdir(parents=True)
    for step in (1, 2, 9, 10):  # step10 after step9, not by its name
        text, _, _ = _nemo_rl_samples(step)
        (logs / f"train_data_step{step}.jsonl").write_text(text)
        (logs / f"val_data_step{step}.jsonl").write_text(text)  # validation: not read
    exporter.wait_value("grpo_run_logged_steps", 4, run="exp_001")
    _, rewards, lengths = _nemo_rl_samples(10)
    samples = exporter.scrape()
    at = {"run": "exp_001", "rank": "0"}
    assert value(samples, "grpo_reward_mean", **at) == pytest.approx(np.mean(rewards))
    assert value(samples, "grpo_reward_std", **at) == pytest.approx(np.std(rewards))
    assert value(samples, "grpo_reward_max", **at) == max(rewards)
    assert value(samples, "grpo_reward_quantile", quantile="0.75", **at) == \
        pytest.approx(np.quantile(rewards, 0.75))
    assert value(samples, "grpo_response_length_mean_tokens", **at) == pytest.approx(np.mean(lengths))
    assert value(samples, "grpo_group_zero_std_ratio", **at) == 0.5
    assert exporter.errors("invalid_record") == 0 and exporter.errors("invalid_json") == 0
    # NeMo-RL's TensorBoard folder beside them: the run is read from it, its samples not opened.
    both = snapshot_dir / "nemo" / "logs" / "exp_002"
    (both / "tensorboard").mkdir(parents=True)
    shutil.copy(event_file, both / "tensorboard" / event_file.name)
    for step in range(1, 4):
        (both / f"train_data_step{step}.jsonl").write_text(_nemo_rl_samples(step)[0])
    exporter.wait_value("grpo_run_logged_steps", STEPS, run="exp_002")
    exporter.wait_value("grpo_run_info", 1, run="exp_002", framework="verl", source="tensorboard")
    assert value(exporter.scrape(), "grpo_reward_mean", run="exp_002", rank="0") == \
        pytest.approx(0.2 + 0.01 * STEPS)


def test_a_restart_reads_only_what_the_loggers_wrote_since(
        start_exporter, snapshot_dir: Path, event_file: Path, tmp_path: Path) -> None:
    """With ``--storage.path``, a logger's file is followed from where the saved state left it,
    as a snapshot file is: a restart reads what was written since, and serves what an exporter
    that read every file from its start serves."""
    write_with_logger("mlflow", snapshot_dir / "mlflow-out", "ml-run", tmp_path)
    events = _event_records(event_file.read_bytes())
    tb = snapshot_dir / "tb-out" / "tb-run" / event_file.name
    tb.parent.mkdir(parents=True)
    half = STEPS // 2
    tb.write_bytes(b"".join(r for at, r in events if at <= half))
    logs = snapshot_dir / "nemo" / "logs" / "exp_001"
    logs.mkdir(parents=True)
    for step in (1, 2, 3):
        (logs / f"train_data_step{step}.jsonl").write_text(_nemo_rl_samples(step)[0])

    def ingested(running: Running) -> float:
        samples = running.scrape()
        return sum(v for (name, _), v in samples.items() if name == "grpo_snapshots_ingested_total")

    state = {"storage_path": tmp_path / "state"}
    first = start_exporter(**state)
    first.wait_value("grpo_run_logged_steps", half, run="tb-run")
    first.wait_value("grpo_run_logged_steps", 3, run="exp_001")
    first.wait_value("grpo_run_logged_steps", STEPS, run="ml-run")
    assert ingested(first) == half + 3 + STEPS
    first.exporter.stop()  # a clean stop saves the state

    tb.open("ab").write(b"".join(r for at, r in events if at > half))
    (logs / "train_data_step4.jsonl").write_text(_nemo_rl_samples(4)[0])
    second = start_exporter(**state)
    assert value(second.scrape(), "grpo_exporter_state_restores_total", result="restored") == 1
    second.wait_value("grpo_run_logged_steps", STEPS, run="tb-run")
    second.wait_value("grpo_run_logged_steps", 4, run="exp_001")
    assert ingested(second) == (STEPS - half) + 1  # not one record read again
    fresh = start_exporter()
    fresh.wait_value("grpo_run_logged_steps", STEPS, run="tb-run")
    fresh.wait_value("grpo_run_logged_steps", 4, run="exp_001")
    fresh.wait_value("grpo_run_logged_steps", STEPS, run="ml-run")
    after, whole = second.scrape(), fresh.scrape()
    for run in ("tb-run", "exp_001", "ml-run"):
        assert signals_of(after, run) == signals_of(whole, run), run


def test_a_growing_wandb_file_read_in_slices_gives_every_row_once(tmp_path: Path) -> None:
    """wandb-core writes whole 32 KiB blocks while a run lives: any cut, read on later."""
    from grpo_monitor.runtime.loggers.wandb_file import read_records

    write_with_logger("wandb", tmp_path / "o", "sliced", tmp_path)
    (path,) = (tmp_path / "o" / "wandb").glob("offline-run-*/run-*.wandb")
    data = path.read_bytes()
    whole = read_records(data, at_start=True, offset=0)
    assert whole.run_name == "sliced" and [r["step"] for r in whole.rows] == list(range(1, STEPS + 1))
    rows, offset = [], 0
    for cut in range(97, len(data) + 97, 97):
        r = read_records(data[offset:cut], at_start=offset == 0, offset=offset)
        rows += r.rows
        offset += r.consumed
    assert rows == whole.rows and offset == len(data)
    shutil.rmtree(tmp_path / "o")


def test_report_reads_a_logger_runs_folder(tmp_path: Path) -> None:
    from grpo_monitor.tools.report.load import load_run

    write_with_logger("wandb", tmp_path / "o", "reported", tmp_path)
    (run_dir,) = (tmp_path / "o" / "wandb").glob("offline-run-*")
    data = load_run(run_dir)
    assert data.steps == list(range(1, STEPS + 1)) and data.bad_lines == 0
    last = records()[-1]
    assert data.train[STEPS]["reward/mean"] == last["critic/score/mean"]
    assert data.train[STEPS]["response/len_mean"] == last["response_length/mean"]
    assert math.isnan(data.train[17]["loss"])


def test_a_real_trl_run_reported_to_tensorboard_is_watched_without_a_callback(
        tmp_path: Path, snapshot_dir: Path, exporter: Running) -> None:
    """TRL's GRPOTrainer with report_to=["tensorboard"] and nothing of ours in the trainer."""
    from datasets import Dataset
    from tiny_model import tiny_model_dir
    from trl import GRPOConfig, GRPOTrainer

    model_path, tokenizer = tiny_model_dir(tmp_path)
    out = snapshot_dir / "trl-tb"
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=4,
        num_generations=4, max_completion_length=8, max_steps=4, logging_steps=1,
        report_to=["tensorboard"], use_cpu=True, beta=0.1, save_strategy="no", seed=0,
        disable_tqdm=True)
    trainer = GRPOTrainer(model=model_path, reward_funcs=lambda completions, **_: [
        sum(c in "aeiou" for c in text) / 8 for text in completions], args=args,
        train_dataset=Dataset.from_dict({"prompt": ["1+1=?", "2+3=?", "ab?", "cd?"] * 4}),
        processing_class=tokenizer)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert [h["step"] for h in logged] == [1, 2, 3, 4]
    exporter.wait_value("grpo_step", 4, timeout=20, run="trl-tb", rank="0")
    lbl = {"run": "trl-tb", "rank": "0"}
    exporter.wait_value("grpo_reward_mean", lambda v: v is not None and math.isclose(
        v, logged[-1]["reward"], rel_tol=1e-6, abs_tol=1e-7), **lbl)
    s = exporter.scrape()
    for metric, name in (("grpo_kl_mean", "kl"), ("grpo_entropy_mean", "entropy"),
                         ("grpo_response_length_mean_tokens", "completions/mean_length")):
        assert value(s, metric, **lbl) == pytest.approx(logged[-1][name], rel=1e-6, abs=1e-7)
    assert exporter.errors("corrupt_record") == 0 and exporter.errors("unreadable_format") == 0


def test_csv_tables_a_w_and_b_export_a_sweep_and_a_loops_log(
        exporter: Running, snapshot_dir: Path) -> None:
    """W&B's Export CSV gives one file per panel: merged by step into the run it names."""
    run = snapshot_dir / "exports"
    run.mkdir()
    (run / "entropy.csv").write_text('"Step","grpo-a - actor/entropy","grpo-a - actor/entropy__MIN",'
                                     '"grpo-a - actor/entropy__MAX"\n' + "".join(
                                         f'"{s}","{0.5 - s / 100}","0","1"\n' for s in range(1, 11)))
    (run / "reward.csv").write_text('"Step","grpo-a - critic/score/mean"\n' + "".join(
        f'"{s}","{s / 10}"\n' for s in range(0, 11, 2)))
    # Someone else's CSV in the same folder: no step column, none of ours, no error.
    (run / "prompts.csv").write_text("prompt,answer\n1+1,2\n")
    exporter.wait_value("grpo_run_logged_steps", 11, run="grpo-a")
    s = exporter.scrape()
    assert value(s, "grpo_entropy_mean", run="grpo-a", rank="0") == pytest.approx(0.4)
    assert value(s, "grpo_reward_mean", run="grpo-a", rank="0") == pytest.approx(1.0)
    # A long table of a sweep: one run per name.
    (snapshot_dir / "sweep").mkdir()
    (snapshot_dir / "sweep" / "sweep.csv").write_text("run_name,metric,step,value\n" + "".join(
        f"lr-{lr},actor/entropy,{s},{lr * s}\n" for lr in (1, 2) for s in range(1, 6)))
    exporter.wait_value("grpo_entropy_mean", 10.0, run="lr-2", rank="0")
    # A loop's own log, growing a row at a time: each new row is a step.
    log = snapshot_dir / "loop" / "training_metrics.csv"
    log.parent.mkdir()
    log.write_text("global_step,wall_iso,reward_mean\n1,2026-12-05T12:00:00,0.1\n")
    exporter.wait_value("grpo_reward_mean", 0.1, run="loop", rank="0")
    with log.open("a") as fh:
        fh.write("2,2026-12-05T12:00:30,0.2\n")
    exporter.wait_value("grpo_reward_mean", 0.2, run="loop", rank="0")
    assert value(exporter.scrape(), "grpo_run_logged_steps", run="loop") == 2
    assert exporter.errors("invalid_value") == 0 and exporter.errors("invalid_record") == 0


def test_csv_table_shapes() -> None:
    from grpo_monitor.contract.logger_rows import csv_table

    assert csv_table("prompt,answer\n1+1,2\n") is None
    assert csv_table('"Step","r - a/b","r - a/b__MIN"\n"3","0.5","0.1"\n') == {"r": {3: {"a/b": 0.5}}}
    assert csv_table("metric,step,value\nloss,2,0.5\nloss,x,1\n") == {None: {2: {"loss": 0.5}}}
    assert csv_table("update,note,reward\n1,warmup,0.5\n2,,\n") == {None: {1: {"reward": 0.5}}}


def test_every_red_card_says_when_nothing_pauses_its_run() -> None:
    """A run read from a logger's files has no gate: each red card's description says so
    (grpo_run_info{source}; prometheus/tests/grpo-loggers.test.yml renders one)."""
    import yaml

    rules = yaml.safe_load((ROOT / "prometheus" / "rules" / "grpo-alerts.yml").read_text())
    red = [r for g in rules["groups"] for r in g["rules"]
           if r.get("labels", {}).get("severity") == "critical"]
    assert red and all("docs/loggers.md#pausing" in r["annotations"]["description"]
                       and 'source!~\\"|snapshots\\"' in r["annotations"]["description"]
                       for r in red), [r["alert"] for r in red]


def test_a_logger_file_is_read_a_budget_at_a_time_and_a_torn_tail_waits_for_its_change(
        tmp_path: Path, event_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_monitor.runtime.health import ExporterHealth
    from grpo_monitor.runtime.ingest import Ingestor
    from grpo_monitor.runtime.loggers import sources
    from grpo_monitor.runtime.store import RunStore

    monkeypatch.setattr(sources, "_WHOLE_RECORD_BYTES", 512)  # a turn reads 64 MiB at least

    path = tmp_path / "r" / "events.out.tfevents.1.h"
    path.parent.mkdir()
    data = event_file.read_bytes()
    path.write_bytes(data[:-7])  # the last record torn: its writer has not flushed the rest
    ingest = Ingestor(tmp_path, RunStore(), ExporterHealth())
    turns = 0
    ingest.process(path, budget=512)
    while ingest.unfinished:
        turns += 1
        for p in list(ingest.unfinished):
            ingest.process(p, budget=512)
    assert turns >= 3 and not ingest.unfinished  # in slices, and no turn for the torn record

    def loss() -> float | None:
        ingest.loggers.flush_all()
        ingest.store.flush()
        samples = parse_samples("".join(ingest.store.render()))
        return value(samples, "grpo_loss", run="r", rank="0")

    assert loss() == -0.05 and ingest.store.max_step("r") == STEPS  # step 30's loss is torn
    path.write_bytes(data)  # the rest lands
    ingest.process(path, budget=512)
    assert not ingest.unfinished and loss() == 0.05


def test_a_nemo_rl_step_whose_file_turns_quiet_after_a_later_one_keeps_the_later(
        tmp_path: Path) -> None:
    """Step 9's file read after step 10's (their events came apart): the run holds both steps,
    step 10's record last, as if read in step order."""
    from grpo_monitor.runtime.health import ExporterHealth
    from grpo_monitor.runtime.ingest import Ingestor
    from grpo_monitor.runtime.store import RunStore

    logs = tmp_path / "exp_001"
    logs.mkdir()
    ingest = Ingestor(tmp_path, RunStore(), ExporterHealth())
    for step in (1, 2, 10, 9):
        path = logs / f"train_data_step{step}.jsonl"
        path.write_text(_nemo_rl_samples(step)[0])
        ingest.process(path)
        ingest.loggers.flush_all()
    ingest.store.flush()
    samples = parse_samples("".join(ingest.store.render()))
    _, rewards, _ = _nemo_rl_samples(10)
    assert value(samples, "grpo_run_logged_steps", run="exp_001") == 4
    assert value(samples, "grpo_step", run="exp_001", rank="0") == 10
    assert value(samples, "grpo_reward_mean", run="exp_001", rank="0") == pytest.approx(
        sum(rewards) / len(rewards))

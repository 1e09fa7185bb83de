"""A run's timeline through a running exporter: a rollback mark and a resume from an older
checkpoint, a run folder renamed, a run folder deleted and re-created; each compared with a fresh
exporter reading only what stands, and across the saved state."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import Running, Samples, value
from grpo_monitor.runtime.app import Exporter
from grpo_monitor.runtime.config import ExporterConfig
from polling import wait_for

COUNTERS = ("grpo_nonfinite_total", "grpo_events_total")


def record(step: int, run: str, reward: float, rank: int = 0, **extra: Any) -> dict[str, Any]:
    return {"run": run, "rank": rank, "world_size": 1, "step": step, "time": 1764400000.0 + step,
            "metrics": {"reward/mean": reward, "reward/std": 0.2, "kl/mean": 0.01 + step * 1e-4,
                        "entropy/mean": 1.0},
            **extra}


def write(path: Path, records: list[dict[str, Any]], mode: str = "a") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode) as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in records))


def run_series(samples: Samples, run: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(name, labels): v for (name, labels), v in samples.items()
            if ("run", run) in labels and name not in COUNTERS
            and not name.startswith("grpo_exporter_") and name != "grpo_run_last_write_timestamp_seconds"
            and name != "grpo_last_snapshot_timestamp_seconds"}


def same_as_fresh(running: Running, fresh_dir: Path, run: str, step: int) -> None:
    """The running exporter serves for ``run`` what a fresh exporter on ``fresh_dir`` (the
    surviving records alone) serves, NaN for NaN."""
    exporter = Exporter(ExporterConfig(snapshot_dir=fresh_dir, listen_address="127.0.0.1:0")).start()
    try:
        wait_for(exporter.watcher.ready.is_set)
        fresh = Running(exporter)
        fresh.wait_value("grpo_step", step, run=run, rank="0")
        want = run_series(fresh.scrape(), run)
    finally:
        exporter.stop()
    running.wait_value("grpo_step", step, run=run, rank="0")
    got = run_series(running.scrape(), run)
    assert got.keys() == want.keys(), sorted(map(str, got.keys() ^ want.keys()))[:6]
    differ = [k for k in want if not (got[k] == want[k] or (got[k] != got[k] and want[k] != want[k]))]
    assert not differ, [(k, got[k], want[k]) for k in differ[:6]]


def test_a_rolled_back_run_is_served_as_its_surviving_steps(
        start_exporter: Callable[..., Running], snapshot_dir: Path, tmp_path: Path) -> None:
    """Healthy to 44, the reward collapses from 45, paused at 69, rolled back to the step-20
    checkpoint, healthy again to 150: the running exporter (with a saved state, restarted in the
    middle) serves what a fresh one serves from steps 1..20 and 21..150 of the second pass."""
    state = tmp_path / "state"
    running = start_exporter(storage_path=state)
    path = snapshot_dir / "rb" / "rank-0.jsonl"
    first = [record(s, "rb", 0.8 if s < 45 else 0.05) for s in range(1, 70)]
    write(path, first)
    running.wait_value("grpo_step", 69, run="rb", rank="0")
    mark = {"run": "rb", "rank": 0, "step": 20, "metrics": {},
            "events": [{"type": "rollback", "from_step": 70, "to_step": 20}]}
    write(path, [mark])
    running.wait_value("grpo_step", 20, run="rb", rank="0")  # undone at the mark
    running.wait_value("grpo_run_logged_steps", 20, run="rb")
    second = [record(s, "rb", 0.8) for s in range(21, 151)]
    write(path, second[:60])
    running.wait_value("grpo_step", 80, run="rb", rank="0")
    running.exporter.stop()
    running = start_exporter(storage_path=state)  # restarted from its saved state
    write(path, second[60:])
    fresh_dir = tmp_path / "fresh"
    write(fresh_dir / "rb" / "rank-0.jsonl", first[:20] + second)
    same_as_fresh(running, fresh_dir, "rb", 150)
    assert value(running.scrape(), "grpo_run_logged_steps", run="rb") == 150


def test_a_crash_resume_from_an_older_checkpoint_counts_each_step_once(
        start_exporter: Callable[..., Running], snapshot_dir: Path, tmp_path: Path) -> None:
    running = start_exporter()
    path = snapshot_dir / "cr" / "rank-0.jsonl"
    write(path, [record(s, "cr", 0.5 + s / 1000) for s in range(1, 261)])
    running.wait_value("grpo_step", 260, run="cr", rank="0")
    resumed = [record(s, "cr", 0.7) for s in range(216, 331)]
    write(path, resumed)
    fresh_dir = tmp_path / "fresh"
    write(fresh_dir / "cr" / "rank-0.jsonl",
          [record(s, "cr", 0.5 + s / 1000) for s in range(1, 216)] + resumed)
    same_as_fresh(running, fresh_dir, "cr", 330)
    assert value(running.scrape(), "grpo_run_logged_steps", run="cr") == 330


def test_a_renamed_run_folder_is_served_under_its_new_name(
        exporter: Running, snapshot_dir: Path) -> None:
    write(snapshot_dir / "done" / "rank-0.jsonl", [record(s, "done", 0.6) for s in range(1, 31)])
    exporter.wait_value("grpo_step", 30, run="done", rank="0")
    (snapshot_dir / "done").rename(snapshot_dir / "done-renamed")
    exporter.wait_value("grpo_step", 30, run="done-renamed", rank="0")
    exporter.wait_value("grpo_run_logged_steps", 30, run="done-renamed")
    wait_for(lambda: value(exporter.scrape(), "grpo_step", run="done", rank="0") is None,
             timeout=10, what="the old name gone")


def test_a_re_created_run_folder_is_a_new_run(exporter: Running, snapshot_dir: Path) -> None:
    """The old run had two ranks and a collapsed reward; the new one, in a folder re-created
    under the same name, has one rank and logs from step 1: nothing of the old one stays."""
    folder = snapshot_dir / "again"
    for rank in (0, 1):
        write(folder / f"rank-{rank}.jsonl",
              [record(s, "again", 0.9 if s < 100 else 0.0, rank=rank) for s in range(1, 201)])
    exporter.wait_value("grpo_step", 200, run="again", rank="1")
    shutil.rmtree(folder)
    write(folder / "rank-0.jsonl", [record(s, "again", 0.3) for s in range(1, 41)])
    exporter.wait_value("grpo_run_logged_steps", 40, run="again")
    wait_for(lambda: value(exporter.scrape(), "grpo_step", run="again", rank="1") is None,
             timeout=10, what="the old run's rank 1 gone")
    s = exporter.scrape()
    assert value(s, "grpo_step", run="again", rank="0") == 40
    assert value(s, "grpo_run_window_mean_max", run="again", rank="0", key="reward/mean",
                 window_steps="20") == pytest.approx(0.3)


def test_a_folder_renamed_or_re_created_while_the_exporter_was_down(
        start_exporter: Callable[..., Running], snapshot_dir: Path, tmp_path: Path) -> None:
    """A restart from the saved state: the renamed folder is served under its new name only, the
    re-created one as a new run (the old run's rank 1 gone)."""
    state = tmp_path / "state"
    running = start_exporter(storage_path=state)
    write(snapshot_dir / "moved" / "rank-0.jsonl", [record(s, "moved", 0.6) for s in range(1, 31)])
    for rank in (0, 1):
        write(snapshot_dir / "redo" / f"rank-{rank}.jsonl",
              [record(s, "redo", 0.9, rank=rank) for s in range(1, 101)])
    running.wait_value("grpo_step", 100, run="redo", rank="1")
    running.wait_value("grpo_step", 30, run="moved", rank="0")
    running.exporter.stop()
    (snapshot_dir / "moved").rename(snapshot_dir / "moved-later")
    shutil.rmtree(snapshot_dir / "redo")
    write(snapshot_dir / "redo" / "rank-0.jsonl", [record(s, "redo", 0.2) for s in range(1, 21)])
    running = start_exporter(storage_path=state)
    running.wait_value("grpo_step", 30, run="moved-later", rank="0")
    running.wait_value("grpo_run_logged_steps", 20, run="redo")
    s = running.scrape()
    assert value(s, "grpo_step", run="moved", rank="0") is None
    assert value(s, "grpo_step", run="redo", rank="1") is None
    assert value(s, "grpo_step", run="redo", rank="0") == 20


def test_a_file_server_whose_clock_lags_does_not_silence_a_live_run(tmp_path: Path) -> None:
    """Files whose mtime is 20 minutes behind: bytes a read finds past the previous read were
    written after it, so a run that goes on writing is dated no earlier than that read (its
    run's last write, and its records' time when they carry none)."""
    import os
    import time

    from grpo_monitor.runtime.health import ExporterHealth
    from grpo_monitor.runtime.ingest import Ingestor
    from grpo_monitor.runtime.store import RunStore

    root = tmp_path / "snaps"
    path = root / "lag" / "rank-0.jsonl"
    store = RunStore()
    ingestor = Ingestor(root, store, ExporterHealth())
    lag = 20 * 60
    looked = []
    for step in range(1, 4):
        rec = record(step, "lag", 0.5)
        del rec["time"]  # the record's time is the file's, as for a logger that writes none
        write(path, [rec])
        os.utime(path, (time.time() - lag, time.time() - lag))
        looked.append(time.time())
        ingestor.process(path)
    (run,) = store.runs()
    assert run.last_write >= looked[-2]  # the third record came after the second look
    assert run.ranks[0].time >= looked[-2]

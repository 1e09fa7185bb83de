"""Fuzzing the control and re-baseline files: any bytes, JSON of any shape, almost-valid records.

Properties: ``read_control`` returns a record or None, or raises ValueError and nothing else;
the SDK (``SnapshotWriter.should_pause``, ``PauseGate.agree`` and ``check``) never raises, since
it must never stop training; the exporter's ingest applies a ``.grpo-baseline.json`` request or
counts it; ``grpo-monitor rebaseline``'s look for the newest step never raises. Then the
findings, one plain test each.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz_strategies import (dates, encode, fuzz, json_object, json_text, lines, mostly, names, steps,
                             string_literal)
from hypothesis import given
from hypothesis import strategies as st

from grpo_monitor.contract.control import MAX_CONTROL_BYTES, ControlRecord, read_control
from grpo_monitor.contract.run_layout import PAUSE_RECORD, REBASELINE_REQUEST
from grpo_monitor.contract.snapshot import MAX_INT
from grpo_monitor.runtime.health import ExporterHealth
from grpo_monitor.runtime.ingest import Ingestor
from grpo_monitor.runtime.rebaseline import RebaselineRequest, newest_step
from grpo_monitor.runtime.store import RunStore
from grpo_monitor.sdk.pause import GroupState, PauseGate, ResumeDecision
from grpo_monitor.sdk.writer import SnapshotWriter

def control_records(state: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A control record's JSON, its fields usually of the right type."""
    return st.fixed_dictionaries(
        {"state": state},
        optional={"version": mostly(st.sampled_from(("1", "2"))),
                  "alertname": mostly(names.map(string_literal)),
                  "run": mostly(names.map(string_literal)), "step": steps,
                  "fingerprint": mostly(names.map(string_literal)),
                  **{k: mostly(dates.map(string_literal))
                     for k in ("onset", "healthy_before", "paused_at", "resumed_at")},
                  "rollback": mostly(st.sampled_from(("last_healthy", "step", "none")).map(string_literal)),
                  "rollback_to": steps},
    ).map(json_object)


paused_or_running = control_records(st.sampled_from(("paused", "running")).map(string_literal))
rebaseline_requests = st.fixed_dictionaries(
    {"at_step": steps, "steps": steps}, optional={"extra": json_text}).map(json_object)
# What a control file may hold: almost-valid records above all, any JSON, any line, any bytes.
# (The map keeps one_of from flattening the many kinds of line into as many equal choices.)
contents = st.one_of(
    control_records(mostly(st.sampled_from(("paused", "running", "PAUSED")).map(string_literal))).map(encode),
    st.one_of(json_text.map(encode), lines).map(bytes))

_serial = itertools.count()


def run_dir(root: Path) -> tuple[str, Path]:
    run = f"run-{next(_serial)}"
    (root / run).mkdir()
    return run, root / run


@fuzz(400)
@given(data=contents)
def test_read_control_gives_a_record_none_or_value_error(tmp_path: Path, data: bytes) -> None:
    run, folder = run_dir(tmp_path)
    (folder / PAUSE_RECORD).write_bytes(data)
    try:
        record = read_control(tmp_path, run)
    except ValueError:
        return
    assert isinstance(record, ControlRecord)


class Resume:
    """PauseGate's sleep: while the gate waits, a person resumes (the record goes away)."""

    def __init__(self, path: Path) -> None:
        self.path, self.calls = path, 0

    def __call__(self, _seconds: float) -> None:
        self.calls += 1
        assert self.calls < 5, "the gate kept waiting after the resume"
        self.path.unlink(missing_ok=True)


def check_sdk(root: Path, data: bytes, step: int) -> None:
    """A rank's view of a control record holding ``data``: none of it raises, a paused record
    holds the gate until the resume, and the gate then says where to go on from."""
    writer = SnapshotWriter(root, f"run-{next(_serial)}", rank=0, world_size=1)
    try:
        writer.log({"loss": 0.5}, step, events=[{"type": "checkpoint_save", "path": "ckpt"}])
        path = Path(writer.control_path)
        path.write_bytes(data)
        assert writer.should_pause() in (True, False)
        gate = PauseGate(writer, group=False, poll_interval=0.01, sleep=Resume(path))
        state = gate.agree()
        assert isinstance(state, GroupState) and all(isinstance(t, float) for t in state)
        decision = gate.check(step)
        assert decision is None or isinstance(decision, ResumeDecision)
        assert (decision is not None) == state.paused
    finally:
        writer.close(end=False)


@fuzz(300)
@given(data=paused_or_running.map(encode), step=st.integers(0, 10**6))
def test_the_sdk_never_raises_on_an_almost_valid_record(tmp_path: Path, data: bytes,
                                                         step: int) -> None:
    check_sdk(tmp_path, data, step)


@fuzz(100)
@given(data=contents)
def test_the_sdk_never_raises_on_any_control_file(tmp_path: Path, data: bytes) -> None:
    check_sdk(tmp_path, data, 7)


@pytest.fixture(scope="module")
def ingest(tmp_path_factory: pytest.TempPathFactory) -> Ingestor:
    """The exporter's ingest, with its store and health, as app.py builds them."""
    return Ingestor(tmp_path_factory.mktemp("snapshots"), RunStore(), ExporterHealth())


def counted(ingest: Ingestor) -> float:
    registry = ingest.health.registry
    return sum(registry.get_sample_value("grpo_snapshot_errors_total", {"reason": r}) or 0.0
               for r in ("invalid_control", "read_error"))


@fuzz(150)
@given(data=st.one_of(rebaseline_requests.map(encode), contents))
def test_a_rebaseline_request_is_applied_or_counted(ingest: Ingestor, data: bytes) -> None:
    run, folder = run_dir(ingest.root)
    path = folder / REBASELINE_REQUEST
    path.write_bytes(data)
    before = counted(ingest)
    ingest.process(path)
    try:
        RebaselineRequest.model_validate_json(data)
        usable = True
    except ValueError:
        usable = False
    assert counted(ingest) - before == (0 if usable else 1)
    ingest.process(path)  # the same content again: applied or counted once, not twice
    assert counted(ingest) - before == (0 if usable else 1)


@fuzz(100)
@given(files=st.lists(st.lists(lines, max_size=4), min_size=1, max_size=3))
def test_the_newest_step_of_any_run_folder(tmp_path: Path, files: list[list[bytes]]) -> None:
    _, folder = run_dir(tmp_path)
    for i, ls in enumerate(files):
        (folder / f"rank-{i}.jsonl").write_bytes(b"\n".join(ls))
    step = newest_step(folder)
    assert step is None or 0 <= step <= MAX_INT


# -- findings, one example each ---------------------------------------------------------------


def test_a_folder_in_place_of_the_control_record(tmp_path: Path) -> None:
    # read_control raised IsADirectoryError, and `grpo-monitor resume` printed a traceback.
    (tmp_path / "run" / PAUSE_RECORD).mkdir(parents=True)
    with pytest.raises(ValueError, match="cannot read"):
        read_control(tmp_path, "run")
    res = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "resume", "run",
                          "--snapshot.dir", str(tmp_path)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "bad control record" in res.stderr and "Traceback" not in res.stderr
    writer = SnapshotWriter(tmp_path, "run", rank=0, world_size=1)
    assert writer.should_pause() is False  # the SDK: not paused, warned once
    writer.close(end=False)


def test_a_huge_control_record_is_not_read_whole(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / PAUSE_RECORD).write_bytes(
        b'{"state": "paused"' + b" " * MAX_CONTROL_BYTES + b"}")
    with pytest.raises(ValueError, match="over"):
        read_control(tmp_path, "run")
    writer = SnapshotWriter(tmp_path, "run", rank=0, world_size=1)
    assert writer.should_pause() is False
    writer.close(end=False)


@pytest.mark.parametrize("record", [
    # The calendar's ends: datetime.timestamp() raised OverflowError out of PauseGate.check.
    b'{"state": "paused", "paused_at": "0001-01-01T00:00:00+14:00"}',
    b'{"state": "paused", "healthy_before": "9999-12-31T23:59:59-14:00"}',
    # float(10**400) raised OverflowError when the resume's rollback step was read.
    b'{"state": "paused", "rollback": "step", "rollback_to": 1' + b"0" * 400 + b"}",
    # The writer's mark could not encode these (orjson: a 64-bit integer, UTF-8, 255 levels):
    # mark(), which never raises, raised out of the gate. The mark is written without them.
    b'{"state": "paused", "alertname": 1' + b"0" * 400 + b"}",
    b'{"state": "paused", "alertname": "\\ud800"}',
    b'{"state": "paused", "alertname": ' + b"[" * 300 + b"]" * 300 + b"}",
], ids=["paused-at-year-1", "healthy-before-year-9999", "rollback-to-10e400",
        "alertname-10e400", "alertname-surrogate", "alertname-deep"])
def test_the_gate_waits_and_resumes_whatever_the_record_says(tmp_path: Path, record: bytes) -> None:
    writer = SnapshotWriter(tmp_path, "run", rank=0, world_size=1)
    writer.log({"loss": 0.5}, 3)
    path = Path(writer.control_path)
    path.write_bytes(record)
    gate = PauseGate(writer, group=False, sleep=Resume(path))
    decision = gate.check(3)
    writer.close(end=False)
    assert decision is not None and decision.paused_at_step == 3 and decision.rollback_step is None
    marks = [json.loads(line).get("events", [{}])[0].get("type")
             for line in Path(writer.path).read_text().splitlines()]
    assert marks == [None, "paused", "resumed"]  # the step, then the marks a waiting run writes


def test_a_folder_named_like_the_rebaseline_request(ingest: Ingestor) -> None:
    run, folder = run_dir(ingest.root)
    (folder / REBASELINE_REQUEST).mkdir()
    before = counted(ingest)
    ingest.rescan()  # a scan lists files only: nothing to read, nothing to count
    assert counted(ingest) == before
    ingest.process(folder / REBASELINE_REQUEST)  # as a watcher's event would name it
    assert counted(ingest) == before + 1


def test_a_huge_rebaseline_request_is_counted_not_read_whole(ingest: Ingestor) -> None:
    run, folder = run_dir(ingest.root)
    (folder / REBASELINE_REQUEST).write_bytes(b'{"at_step": 1, "steps": 1' + b" " * (1 << 20) + b"}")
    before = counted(ingest)
    ingest.process(folder / REBASELINE_REQUEST)
    assert counted(ingest) == before + 1


def test_the_newest_step_skips_lines_nested_beyond_the_recursion_limit(tmp_path: Path) -> None:
    # json.loads raised RecursionError out of `grpo-monitor rebaseline`.
    # (It reads the files' last 64 KiB: 5000 levels, deep enough, fit in there.)
    (tmp_path / "rank-0.jsonl").write_bytes(b'{"step": 41}\n' + b"[" * 5000 + b"]" * 5000)
    assert newest_step(tmp_path) == 41
    (tmp_path / "rank-0.jsonl").write_bytes(b'{"step": 41}\n{"step": true}\n{"step": 1' + b"0" * 30 + b"}")
    assert newest_step(tmp_path) == 41  # neither a boolean nor 10**30 is a step


def test_a_record_that_says_running_is_not_paused(tmp_path: Path) -> None:
    # Its pause time ahead of its resume time (the clocks of the exporter's node and of the
    # one `resume` ran on disagree) kept the gate paused although the record said running.
    writer = SnapshotWriter(tmp_path, "run", rank=0, world_size=1)
    Path(writer.control_path).write_text(
        '{"state": "running", "paused_at": "2999-01-01T00:00:00Z", '
        '"resumed_at": "2025-01-01T00:00:00Z"}')
    gate = PauseGate(writer, group=False)
    assert writer.should_pause() is False and gate.agree().paused is False
    writer.close(end=False)

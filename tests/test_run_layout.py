"""The run layout: one run-name rule, a run's files in the order written, the control files'
names, and that the trainer side and the exporter side use the same ones."""

from __future__ import annotations

import ast
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo_monitor
from grpo_monitor.contract import run_layout, safe_io
from grpo_monitor.contract.control import ControlRecord, control_path, write_control
from grpo_monitor.runtime.health import ExporterHealth
from grpo_monitor.runtime.ingest import Ingestor
from grpo_monitor.runtime.rebaseline import newest_step, request_rebaseline
from grpo_monitor.runtime.replay import find_samples, replay_http
from grpo_monitor.contract.run_layout import (
    DEFAULT_RUN,
    MAX_RUN_NAME_BYTES,
    PAUSE_RECORD,
    REBASELINE_REQUEST,
    ROLLBACK_TARGET,
    check_run_name,
    is_run_name,
    is_snapshot_path,
    rank_file,
    rotation_of,
    run_files,
    run_name_from,
    segment_file,
    write_control_file,
)
from grpo_monitor.contract.snapshot import RecordError, parse_record
from grpo_monitor.sdk.pause import PauseGate
from grpo_monitor.sdk.writer import SnapshotWriter

VALID = ["exp-42", "a", "with space", "x" * MAX_RUN_NAME_BYTES, "ünï-çødé", "日本" * 42,
         "a.b", "a..b", "trailing.", "-", "default"]
# Each with the reason the rule gives.
INVALID = {
    "": "empty", ".": "starts with", "..": "starts with", ".hidden": "starts with",
    "a/b": "holds", "../x": "starts with", "a\\b": "holds", "a\0b": "holds",
    "x" * (MAX_RUN_NAME_BYTES + 1): "over 255 bytes", "日" * 86: "over 255 bytes",
    "bad-\udcff": "not UTF-8",
}


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- the run-name rule ------------------------------------------------------------------------


@pytest.mark.parametrize("run", VALID)
def test_a_valid_name_passes(run: str) -> None:
    assert is_run_name(run) and check_run_name(run) == run


@pytest.mark.parametrize(("run", "reason"), INVALID.items(), ids=repr)
def test_an_invalid_name_says_why(run: str, reason: str) -> None:
    assert not is_run_name(run)
    with pytest.raises(ValueError, match=f"plain folder name \\({reason}"):
        check_run_name(run)


@pytest.mark.parametrize("run", [None, 42, b"exp"])
def test_only_text_names_a_run(run: object) -> None:
    assert not is_run_name(run)


@pytest.mark.parametrize("run", [*VALID, *INVALID])
def test_writer_pause_record_replay_and_rebaseline_share_the_rule(tmp_path: Path, run: str) -> None:
    valid = is_run_name(run)
    snapshot_dir = tmp_path / "snapshots"
    snapshot_dir.mkdir()
    # The trainer's writer.
    if valid:
        with SnapshotWriter(snapshot_dir, run, rank=0, world_size=1) as writer:
            writer.log({"loss": 1.0}, 1)
        # The exporter's parser takes every record the writer writes under the name.
        for record in lines_of(snapshot_dir / run / rank_file(0)):
            assert parse_record(record, run=run, rank=0, mtime=0.0).run == run
    else:
        with pytest.raises(ValueError, match="plain folder name"):
            SnapshotWriter(snapshot_dir, run, rank=0, world_size=1)
        # A record that claims the name is refused, as the writer refuses to write it.
        with pytest.raises(RecordError, match="plain folder name"):
            parse_record({"run": run, "step": 1, "metrics": {}}, run=DEFAULT_RUN, rank=0, mtime=0.0)
    # The pause record (the exporter's webhook, `grpo-monitor resume`).
    if valid:
        assert control_path(snapshot_dir, run) == snapshot_dir / run / PAUSE_RECORD
    else:
        with pytest.raises(ValueError, match="plain folder name"):
            control_path(snapshot_dir, run)
    # Replay over HTTP: a valid name without samples is 404, an invalid one 400.
    assert replay_http(snapshot_dir, {"run": [run]}, "*/*")[0] == (404 if valid else 400)
    # `grpo-monitor rebaseline`: a valid name finds the run's newest step.
    if valid:
        assert request_rebaseline(snapshot_dir, run, steps=10, at_step=None)[1] == 1
    else:
        with pytest.raises(ValueError, match="plain folder name"):
            request_rebaseline(snapshot_dir, run, steps=10, at_step=None)
    # Nothing was made outside the snapshot folder.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshots"]


@pytest.mark.parametrize(("text", "name"), [
    ("exp/42", "exp-42"), ("a\\b//c", "a-b-c"), ("  spaced  ", "spaced"), (".hidden", "hidden"),
    ("..", DEFAULT_RUN), (".", DEFAULT_RUN), ("", DEFAULT_RUN), ("/", "-"),
    ("x" * 300, "x" * 128), ("日" * 128, "日" * 85), ("a\udcffb", "a?b"), ("nul\0x", "nul-x"),
])
def test_a_name_made_from_any_text(text: str, name: str) -> None:
    assert run_name_from(text) == name


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.text())
def test_a_name_made_from_any_text_is_valid(text: str) -> None:
    assert is_run_name(run_name_from(text))


# -- a run's files in the order they were written ---------------------------------------------


def test_names_of_a_rank_file_and_its_segments_agree() -> None:
    assert rank_file(3) == "rank-3.jsonl"
    assert segment_file(3, 7) == "rank-3.000007.jsonl"
    assert rotation_of(rank_file(3)) == ("rank-3", None)
    assert rotation_of(segment_file(3, 7)) == ("rank-3", 7)
    assert rotation_of(segment_file(3, 1234567)) == ("rank-3", 1234567)


def test_rotated_segments_come_in_the_order_written_whatever_their_times(tmp_path: Path) -> None:
    for rank in (0, 1):
        with SnapshotWriter(tmp_path, "r", rank=rank, world_size=2, max_bytes=600,
                            keep_segments=1000) as w:
            for step in range(60):
                assert w.log({"reward/mean": step / 7}, step)
    run_dir = tmp_path / "r"
    files = run_files(run_dir)
    # A copy, or a coarse clock, reorders modification times: the newest file looks oldest.
    for age, path in enumerate(files):
        os.utime(path, (1e9 - age, 1e9 - age))
    assert run_files(run_dir) == files
    for rank in (0, 1):
        mine = [p for p in files if p.name.startswith(f"rank-{rank}.")]
        assert len(mine) > 10
        assert mine[-1].name == rank_file(rank)
        assert [rotation_of(p.name)[1] for p in mine[:-1]] == list(range(1, len(mine)))
        steps = [r["step"] for p in mine for r in lines_of(p) if r["metrics"]]
        assert steps == list(range(60))


def test_segments_sort_by_number_not_by_name(tmp_path: Path) -> None:
    for name in ("rank-0.jsonl", "rank-0.9.jsonl", "rank-0.10.jsonl", "rank-0.json",
                 "rank-1.000002.jsonl", "rank-1.000001.jsonl", "sub/rank-0.jsonl",
                 "sub/rank-0.000001.jsonl", "metrics.json"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("{}\n")
    assert [p.relative_to(tmp_path).as_posix() for p in run_files(tmp_path)] == [
        "metrics.json", "rank-0.9.jsonl", "rank-0.10.jsonl", "rank-0.json", "rank-0.jsonl",
        "rank-1.000001.jsonl", "rank-1.000002.jsonl", "sub/rank-0.000001.jsonl", "sub/rank-0.jsonl"]


def test_dot_folders_dotfiles_and_other_files_are_skipped(tmp_path: Path) -> None:
    kept = ["rank-0.jsonl", "node-1/rank-1.jsonl", "metrics.json"]
    skipped = [".report/rank-0.jsonl", ".trash/deep/rank-0.jsonl", ".rank-0.jsonl",
               PAUSE_RECORD, REBASELINE_REQUEST, ROLLBACK_TARGET, f"{PAUSE_RECORD}.x.tmp",
               "notes.txt", "rank-0.jsonl.tmp", "node-1/.old.jsonl"]
    for name in kept + skipped:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text('{"step": 1}\n')
    (tmp_path / "folder.jsonl").mkdir()  # a folder is no file, whatever its name
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "rank-9.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")  # links to folders are not followed
    assert sorted(p.relative_to(tmp_path).as_posix() for p in run_files(tmp_path)) == sorted(
        kept + ["elsewhere/rank-9.jsonl"])
    assert [p.name for p in run_files(tmp_path, nested=False)] == ["metrics.json", "rank-0.jsonl"]
    for name in kept:
        assert is_snapshot_path(tmp_path / name, tmp_path)
    for name in skipped:
        assert not is_snapshot_path(tmp_path / name, tmp_path)
    assert run_files(tmp_path / "missing") == []


def test_rebaseline_looks_for_the_newest_step_outside_dot_folders(tmp_path: Path) -> None:
    (tmp_path / "rank-0.jsonl").write_text('{"step": 41}\n')
    # A report's output, an older run set aside, a dotfile: none of them is the run's history.
    (tmp_path / ".old").mkdir()
    (tmp_path / ".old" / "rank-0.jsonl").write_text('{"step": 9000}\n')
    (tmp_path / ".rank-0.jsonl").write_text('{"step": 9001}\n')
    assert newest_step(tmp_path) == 41


def test_replay_reads_segments_in_the_order_written_not_by_time(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    record = {"step": 5, "rank": 0, "metrics": {}}
    # The same step logged twice (a run resumed from a checkpoint): the later one is the truth.
    (run_dir / segment_file(0, 1)).write_text(json.dumps(
        {**record, "samples": [{"prompt": "before", "responses": [{"text": "a", "reward": 0}]}]}) + "\n")
    (run_dir / rank_file(0)).write_text(json.dumps(
        {**record, "samples": [{"prompt": "after", "responses": [{"text": "b", "reward": 1}]}]}) + "\n")
    os.utime(run_dir / segment_file(0, 1), (2e9, 2e9))  # the older segment looks newer
    found = find_samples(tmp_path, "r", 5)
    assert found is not None and [s.prompt for s in found[1]] == ["after"]


def test_the_writer_prunes_only_segments_it_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "rank-0.5.jsonl").write_text('{"step": -1}\n')  # read as history, not the SDK's
    with SnapshotWriter(tmp_path, "r", rank=0, max_bytes=400, keep_segments=1) as w:
        for step in range(40):
            w.log({"reward/mean": 0.5}, step)
    assert (run_dir / "rank-0.5.jsonl").exists()
    own = [p.name for p in run_files(run_dir) if p.name not in ("rank-0.5.jsonl", rank_file(0))]
    # It rotated many times, and kept its newest segment alone.
    assert len(own) == 1 and own[0] == segment_file(0, rotation_of(own[0])[1] or 0)
    assert (rotation_of(own[0])[1] or 0) > 5


# -- control files: one name each, the same on both sides -------------------------------------


def test_the_pause_record_the_exporter_writes_is_the_one_the_sdk_reads(tmp_path: Path) -> None:
    writer = SnapshotWriter(tmp_path, "r", rank=0, world_size=1)
    gate = PauseGate(writer, group=False)
    assert Path(writer.control_path) == control_path(tmp_path, "r") == tmp_path / "r" / PAUSE_RECORD
    assert Path(gate.watcher.path) == tmp_path / "r" / PAUSE_RECORD
    assert not writer.should_pause()
    write_control(tmp_path, "r", ControlRecord(state="paused", alertname="X"))
    assert writer.should_pause() and gate.paused()
    writer.close(end=False)


class _Store:
    """What the ingest asks of its store for a re-baseline request."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int, int]] = []

    def rebaseline(self, run: str, at_step: int, steps: int) -> None:
        self.asked.append((run, at_step, steps))


def test_the_rebaseline_request_the_command_writes_is_the_one_the_ingest_applies(tmp_path: Path) -> None:
    with SnapshotWriter(tmp_path, "r", rank=0, world_size=1) as w:
        for step in range(30):
            w.log({"reward/mean": 0.5}, step)
    path, at_step = request_rebaseline(tmp_path, "r", steps=10, at_step=None)
    assert path == tmp_path / "r" / REBASELINE_REQUEST and at_step == 29
    store = _Store()
    ingest = Ingestor(tmp_path, store, ExporterHealth())  # type: ignore[arg-type]
    assert path in [p for p, _ in ingest.scan()]
    ingest.process(path)
    assert store.asked == [("r", 29, 10)]


def test_the_rollback_target_the_callback_writes_is_the_one_it_reads(tmp_path: Path) -> None:
    from grpo_monitor.integrations.trl import rollback_checkpoint, write_rollback

    (tmp_path / "r").mkdir()
    write_rollback(str(tmp_path), "r", 20, "/ckpt/checkpoint-20", "GRPOKLBlowup", 1.7e9)
    assert json.loads((tmp_path / "r" / ROLLBACK_TARGET).read_text())["step"] == 20
    write_control(tmp_path, "r", ControlRecord(state="running", rollback="last_healthy"))
    assert rollback_checkpoint(tmp_path, "r") == "/ckpt/checkpoint-20"


def test_control_files_are_written_whole_readable_and_leave_no_scratch(tmp_path: Path) -> None:
    target = tmp_path / PAUSE_RECORD
    write_control_file(target, b"old\n")
    write_control_file(target, b"new\n")
    assert target.read_bytes() == b"new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == [PAUSE_RECORD]


def _string_constants(path: Path) -> list[str]:
    """The string literals of a module that may be a path: docstrings and other prose (text
    with spaces: a help text, a metric's description) may name a file, code may not."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docstrings and " " not in node.value]


def test_control_file_names_are_spelt_in_the_run_layout_alone() -> None:
    package = Path(grpo_monitor.__file__).parent
    names = (PAUSE_RECORD, REBASELINE_REQUEST, ROLLBACK_TARGET)
    # The names are public (trainers, operators and older SDKs read and write these files):
    # the one place outside run_layout that spells them, so that a rename cannot go unseen.
    assert names == (".grpo-control.json", ".grpo-baseline.json", ".grpo-rollback.json")
    spelt = {path.relative_to(package).as_posix()
             for path in package.rglob("*.py")
             for text in _string_constants(path) if any(name in text for name in names)}
    assert spelt == {"contract/run_layout.py"}


def test_the_sdk_side_of_the_layout_is_standard_library_only() -> None:
    # The SDK imports them inside the trainer's process, which must stay light: run_layout and
    # the safe opening it writes its control files with import the standard library, and each
    # other, alone.
    own = {"grpo_monitor.contract.run_layout", "grpo_monitor.contract.safe_io"}
    for module in (run_layout, safe_io):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}
        foreign = {name for name in imported - own if name.split(".")[0] not in sys.stdlib_module_names}
        assert foreign <= {"__future__"}, (module.__name__, foreign)


@pytest.mark.parametrize("name, appended", [("rank-0.jsonl", True), ("rank-0.000003.jsonl", True),
                                            ("rank-0.json", False), ("state.json", False)])
def test_appended_files_are_the_jsonl_ones(name: str, appended: bool) -> None:
    assert run_layout.is_appended(Path("run") / name) is appended
    assert run_layout.is_appended(f"run/{name}") is appended

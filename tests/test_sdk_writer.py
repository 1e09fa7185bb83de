"""SnapshotWriter against real files: whole JSON lines, rank discovery, rotation, disk errors."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch

from grpo_monitor import SnapshotWriter
from grpo_monitor.contract.run_layout import rank_file, rotation_of, run_files

RANK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


@pytest.fixture(autouse=True)
def _clean_rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in RANK_ENV:
        monkeypatch.delenv(name, raising=False)


def is_run_end(record: dict) -> bool:
    return record.get("metrics") == {} and [e["type"] for e in record.get("events", [])] == ["run_end"]


def read_records(path: Path, *, with_end: bool = False) -> list[dict]:
    """The records in ``path``; without the run_end record close() appends, unless asked."""
    text = path.read_text()
    assert text.endswith("\n")
    records = [json.loads(line) for line in text.splitlines()]
    return records if with_end else [r for r in records if not is_run_end(r)]


def open_fds_to(path: str | Path) -> int:
    target = os.path.realpath(path)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                count += 1
        except OSError:
            pass
    return count


def step_files(run_dir: Path, rank: int = 0) -> list[Path]:
    """The rank's files in the order they were written, as the exporter reads them: rotated
    segments oldest first, then the live file."""
    base, _ = rotation_of(rank_file(rank))
    return [p for p in run_files(run_dir, nested=False) if rotation_of(p.name)[0] == base]


# -- record format ---------------------------------------------------------------------------


def test_record_has_contract_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    before = time.time()
    with SnapshotWriter(tmp_path, "exp-42", rank=3, world_size=8) as w:
        assert w.log({"reward/mean": 0.41, "kl/mean": 0.03}, 1200,
                     by_type={"hard": {"reward/mean": 0.1}},
                     samples=[{"prompt": "1+1=?", "prompt_type": "easy",
                               "responses": [{"text": "2", "reward": 1.0, "length": 1}]}],
                     events=[{"type": "checkpoint_save", "duration_s": 41.0}])
        assert w.log({"reward/mean": 0.5}, 1201)
    after = time.time()

    path = tmp_path / "exp-42" / "rank-3.jsonl"
    assert w.path == str(path)
    first, second = read_records(path)
    assert list(first) == ["run", "rank", "world_size", "host", "local_rank", "gpu", "gpu_uuid",
                           "step", "time", "metrics", "by_type", "samples", "events"]
    assert first["gpu"] == "6" and first["gpu_uuid"] is None  # LOCAL_RANK 2 of the visible 4..7
    assert first["run"] == "exp-42" and first["rank"] == 3 and first["world_size"] == 8
    assert first["host"] == socket.gethostname() and first["local_rank"] == 2
    assert first["step"] == 1200 and before <= first["time"] <= after
    assert first["metrics"] == {"reward/mean": 0.41, "kl/mean": 0.03}
    assert first["by_type"] == {"hard": {"reward/mean": 0.1}}
    assert first["samples"][0]["responses"] == [{"text": "2", "reward": 1.0, "length": 1}]
    assert first["events"] == [{"type": "checkpoint_save", "duration_s": 41.0}]
    # Optional sections are absent, not null, when not given.
    assert set(second) == {"run", "rank", "world_size", "host", "local_rank", "gpu", "gpu_uuid", "step", "time",
                           "metrics"}
    assert second["step"] == 1201 and second["time"] >= first["time"]


def test_rank_and_world_size_from_environment(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    w = SnapshotWriter(tmp_path, "r")
    assert (w.rank, w.world_size, w.local_rank) == (0, 1, None)
    w.close()

    monkeypatch.setenv("LOCAL_RANK", "3")
    w = SnapshotWriter(tmp_path, "r")
    assert (w.rank, w.world_size, w.local_rank) == (3, 1, 3)
    w.close()

    monkeypatch.setenv("RANK", "11")
    monkeypatch.setenv("WORLD_SIZE", "16")
    with SnapshotWriter(tmp_path, "r") as w:
        assert (w.rank, w.world_size, w.local_rank) == (11, 16, 3)
        w.log({"x": 1.0}, 0)
    (record,) = read_records(tmp_path / "r" / "rank-11.jsonl")
    assert (record["rank"], record["world_size"], record["local_rank"]) == (11, 16, 3)

    # Explicit arguments win over the environment.
    with SnapshotWriter(tmp_path, "r", rank=1, world_size=2) as w:
        assert (w.rank, w.world_size) == (1, 2)


def test_rank_from_initialised_torch_distributed(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    initialised = {"value": True}
    fake_dist = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: initialised["value"],
        get_rank=lambda: 6, get_world_size=lambda: 32)
    monkeypatch.setitem(sys.modules, "torch.distributed", fake_dist)

    with SnapshotWriter(tmp_path, "r") as w:
        assert (w.rank, w.world_size) == (6, 32)
    with SnapshotWriter(tmp_path, "r", rank=0) as w:
        assert (w.rank, w.world_size) == (0, 32)
    initialised["value"] = False
    with SnapshotWriter(tmp_path, "r") as w:
        assert (w.rank, w.world_size) == (1, 2)


def test_bad_arguments_raise_at_construction(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for run in ("", "..", "a/b"):
        with pytest.raises(ValueError):
            SnapshotWriter(tmp_path, run)
    with pytest.raises(ValueError):
        SnapshotWriter(tmp_path, "r", max_bytes=0)
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK"):
        SnapshotWriter(tmp_path, "r")


def test_importing_the_package_does_not_import_torch() -> None:
    code = ("import grpo_monitor, sys; "
            "assert 'torch' not in sys.modules and 'torch.distributed' not in sys.modules; "
            "grpo_monitor.SnapshotWriter")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- values ----------------------------------------------------------------------------------


def test_non_finite_values_are_written_as_json_tokens(tmp_path: Path) -> None:
    with SnapshotWriter(tmp_path, "r", rank=0) as w:
        assert w.log({"loss": float("nan"), "grad/norm": float("inf"),
                      "adv/mean_abs": float("-inf"), "reward/mean": 0.5}, 7)
    raw = (tmp_path / "r" / "rank-0.jsonl").read_text()
    assert '"loss":NaN' in raw and '"grad/norm":Infinity' in raw
    assert '"adv/mean_abs":-Infinity' in raw
    (record,) = read_records(tmp_path / "r" / "rank-0.jsonl")
    metrics = record["metrics"]
    assert math.isnan(metrics["loss"])
    assert metrics["grad/norm"] == math.inf and metrics["adv/mean_abs"] == -math.inf
    assert w.dropped_records == 0


def test_torch_scalars_and_mapping_views(tmp_path: Path) -> None:
    with SnapshotWriter(tmp_path, "r", rank=0) as w:
        assert w.log(types.MappingProxyType({
            "reward/mean": torch.tensor(0.25),
            "kl/mean": torch.tensor(0.5, dtype=torch.bfloat16),
            "response/len_max": torch.tensor(512),
            "loss": torch.tensor(float("nan")),
            "grad/norm": torch.tensor(1.5, requires_grad=True) * 2,
        }), torch.tensor(9), by_type={"hard": {"reward/mean": torch.tensor(-1.0)}})
    (record,) = read_records(tmp_path / "r" / "rank-0.jsonl")
    m = record["metrics"]
    assert m["reward/mean"] == 0.25 and m["kl/mean"] == 0.5 and m["grad/norm"] == 3.0
    assert m["response/len_max"] == 512 and isinstance(m["response/len_max"], int)
    assert math.isnan(m["loss"])
    assert record["step"] == 9 and record["by_type"] == {"hard": {"reward/mean": -1.0}}


def test_numpy_scalars(tmp_path: Path) -> None:
    import numpy as np
    with SnapshotWriter(tmp_path, "r", rank=0) as w:
        assert w.log({"a": np.float32(0.25), "b": np.int64(7), "c": np.float64(1.5),
                      "d": np.float32("nan"), "e": np.bool_(True)}, np.int64(3))
    (record,) = read_records(tmp_path / "r" / "rank-0.jsonl")
    m = record["metrics"]
    assert (m["a"], m["b"], m["c"], m["e"]) == (0.25, 7, 1.5, True)
    assert math.isnan(m["d"]) and record["step"] == 3


def test_unencodable_value_is_dropped_with_one_warning(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="grpo_monitor.sdk")
    with SnapshotWriter(tmp_path, "r", rank=0) as w:
        assert w.log({"a": 1.0}, 0)
        assert not w.log({"a": object()}, 1)
        assert not w.log({"a": torch.zeros(3)}, 2)  # .item() of a 3-element tensor fails
        assert not w.log({"a": 1.0}, 3, samples=[{"text": b"bytes"}])
        assert w.log({"a": 2.0}, 4)
    assert (w.dropped_records, w.write_errors) == (3, 0)
    assert len([r for r in caplog.records if r.name == "grpo_monitor.sdk"]) == 1
    assert [r["step"] for r in read_records(tmp_path / "r" / "rank-0.jsonl")] == [0, 4]


# -- rotation --------------------------------------------------------------------------------


def test_rotation_keeps_every_record_exactly_once(tmp_path: Path) -> None:
    max_bytes = 2000
    with SnapshotWriter(tmp_path, "r", rank=0, max_bytes=max_bytes, keep_segments=1000) as w:
        for step in range(300):
            assert w.log({"reward/mean": step / 7, "kl/mean": 0.01}, step)
    run_dir = tmp_path / "r"
    files = step_files(run_dir)
    names = [p.name for p in files]
    assert len(names) > 10
    assert names[:3] == ["rank-0.000001.jsonl", "rank-0.000002.jsonl", "rank-0.000003.jsonl"]
    assert names[-2] == f"rank-0.{len(names) - 1:06d}.jsonl"
    assert all(p.stat().st_size <= max_bytes for p in files)
    steps = [r["step"] for p in files for r in read_records(p)]
    assert steps == list(range(300))


def test_rotation_prunes_oldest_segments(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    # Another rank's segments and an older run's segment of this rank: numbering continues
    # after the highest one on disk and other ranks are left alone.
    (run_dir / "rank-0.000041.jsonl").write_text('{"step": -1}\n')
    (run_dir / "rank-1.000001.jsonl").write_text('{"step": 0}\n')
    with SnapshotWriter(tmp_path, "r", rank=0, max_bytes=1500, keep_segments=3) as w:
        for step in range(400):
            assert w.log({"reward/mean": step / 3}, step)
    files = step_files(run_dir)
    assert files[-1].name == rank_file(0)
    seqs = [seq for p in files[:-1] if (seq := rotation_of(p.name)[1]) is not None]
    assert len(seqs) == len(files) - 1 == 3
    assert seqs == list(range(seqs[0], seqs[0] + 3)) and seqs[0] > 42
    assert (run_dir / "rank-1.000001.jsonl").exists()
    steps = [r["step"] for p in step_files(run_dir) for r in read_records(p)]
    # The kept history is the newest, contiguous, without duplicates.
    assert steps == list(range(steps[0], 400)) and steps[0] > 0


def test_keep_segments_zero_keeps_only_the_live_file(tmp_path: Path) -> None:
    with SnapshotWriter(tmp_path, "r", rank=0, max_bytes=1000, keep_segments=0) as w:
        for step in range(100):
            assert w.log({"x": 1.0}, step)
    assert [p.name for p in (tmp_path / "r").iterdir()] == ["rank-0.jsonl"]
    assert read_records(tmp_path / "r" / "rank-0.jsonl")[-1]["step"] == 99


# -- disk errors -----------------------------------------------------------------------------


def _advance_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: real() + seconds)


def test_unwritable_dir_never_raises_warns_once_and_recovers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="grpo_monitor.sdk")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    w = SnapshotWriter(blocker / "snapshots", "r", rank=0)  # mkdir fails: ENOTDIR
    assert w.write_errors == 1
    assert not w.log({"x": 1.0}, 0)
    errors_after_first_retry = w.write_errors
    # Within the retry interval no syscall is attempted, the record is only counted.
    for step in range(1, 50):
        assert not w.log({"x": 1.0}, step)
    assert w.write_errors == errors_after_first_retry <= 2
    assert w.dropped_records == 50
    assert len(caplog.records) == 1 and "not-a-dir" in caplog.records[0].getMessage()

    blocker.unlink()
    blocker.mkdir()
    assert not w.log({"x": 1.0}, 50)  # still throttled
    _advance_clock(monkeypatch, 5)
    assert w.log({"x": 2.0}, 51)
    w.close()
    assert [r["step"] for r in read_records(blocker / "snapshots" / "r" / "rank-0.jsonl")] == [51]
    assert len(caplog.records) == 1


def test_failing_write_is_counted_and_recovered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="grpo_monitor.sdk")
    w = SnapshotWriter(tmp_path, "r", rank=0)
    assert w.log({"x": 0.0}, 0)

    def no_space(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "write", no_space)
        assert not w.log({"x": 1.0}, 1)
        _advance_clock(m, 5)
        assert not w.log({"x": 2.0}, 2)
    assert (w.write_errors, w.dropped_records) == (2, 2)
    assert len(caplog.records) == 1
    _advance_clock(monkeypatch, 10)
    assert w.log({"x": 3.0}, 3)
    w.close()
    assert [r["step"] for r in read_records(tmp_path / "r" / "rank-0.jsonl")] == [0, 3]


def test_write_cut_short_leaves_one_bad_line_not_two(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    w = SnapshotWriter(tmp_path, "r", rank=0)
    assert w.log({"x": 0.0}, 0)
    real_write = os.write
    calls = {"n": 0}

    def half_then_full_disk(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    def broken_truncate(fd: int, length: int) -> None:  # the fragment cannot be taken back
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr(os, "write", half_then_full_disk)
        m.setattr(os, "ftruncate", broken_truncate)
        assert not w.log({"x": 1.0}, 1)
    _advance_clock(monkeypatch, 5)
    assert w.log({"x": 2.0}, 2)
    w.close(end=False)  # the raw lines only
    lines = (tmp_path / "r" / "rank-0.jsonl").read_text().splitlines()
    assert len(lines) == 3
    assert json.loads(lines[0])["step"] == 0 and json.loads(lines[2])["step"] == 2
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[1])


def test_short_write_is_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write

    def at_most_100_bytes(fd: int, data: bytes) -> int:
        return real_write(fd, data[:100])

    with SnapshotWriter(tmp_path, "r", rank=0) as w:
        monkeypatch.setattr(os, "write", at_most_100_bytes)
        assert w.log({f"k{i}": i / 3 for i in range(20)}, 0)
    monkeypatch.undo()
    (record,) = read_records(tmp_path / "r" / "rank-0.jsonl")
    assert record["metrics"]["k19"] == 19 / 3


def test_restart_after_crash_mid_line_starts_a_new_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "rank-0.jsonl").write_text('{"step": 0}\n{"step": 1, "metr')
    with SnapshotWriter(tmp_path, "r", rank=0) as w:
        assert w.log({"x": 1.0}, 2)
    lines = (run_dir / "rank-0.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[2])["step"] == 2
    assert is_run_end(json.loads(lines[3]))


# -- lifecycle -------------------------------------------------------------------------------


def test_context_manager_and_del_close_the_file(tmp_path: Path) -> None:
    with SnapshotWriter(tmp_path, "r", rank=0) as w:
        assert w.log({"x": 1.0}, 0)
        assert open_fds_to(w.path) == 1
    assert open_fds_to(w.path) == 0
    assert not w.log({"x": 1.0}, 1)  # closed: dropped, not reopened
    assert w.dropped_records == 1 and open_fds_to(w.path) == 0
    w.close()  # idempotent

    w2 = SnapshotWriter(tmp_path, "r", rank=1)
    path = w2.path
    assert open_fds_to(path) == 1
    del w2
    assert open_fds_to(path) == 0


def test_close_marks_the_end_of_the_run_once(tmp_path: Path) -> None:
    w = SnapshotWriter(tmp_path, "r", rank=2, world_size=4)
    assert w.log({"x": 1.0}, 7) and w.log({"x": 1.0}, 8)
    w.close()
    w.close()  # a second close writes no second end
    *steps, end = read_records(tmp_path / "r" / "rank-2.jsonl", with_end=True)
    assert [r["step"] for r in steps] == [7, 8]
    # A record of the contract like any other: the rank's envelope, no metrics, one event.
    assert is_run_end(end) and end["step"] == 8 and (end["rank"], end["world_size"]) == (2, 4)
    assert end["events"][0]["step"] == 8 and end["events"][0]["time"] == end["time"] >= steps[-1]["time"]

    # The step can be given (a trainer that logged every 10th step knows its last one).
    w = SnapshotWriter(tmp_path, "s", rank=0)
    assert w.log({"x": 1.0}, 90)
    w.close(step=99)
    assert read_records(tmp_path / "s" / "rank-0.jsonl", with_end=True)[-1]["step"] == 99


def test_no_end_without_a_step_or_on_the_error_path(tmp_path: Path) -> None:
    SnapshotWriter(tmp_path, "empty", rank=0).close()  # logged nothing: no run to end
    assert (tmp_path / "empty" / "rank-0.jsonl").read_text() == ""

    w = SnapshotWriter(tmp_path, "failed", rank=0)
    assert w.log({"x": 1.0}, 3)
    w.close(end=False)
    assert not any(map(is_run_end, read_records(tmp_path / "failed" / "rank-0.jsonl", with_end=True)))


@pytest.mark.parametrize(("exc", "ended"), [
    (None, True), (KeyboardInterrupt(), True), (SystemExit(0), True), (SystemExit(None), True),
    (SystemExit(2), False), (RuntimeError("NCCL error"), False), (ValueError("nan"), False)],
    ids=["clean", "ctrl-c", "exit-0", "exit-none", "exit-2", "crash", "value-error"])
def test_context_manager_ends_the_run_only_on_a_clean_exit(
        tmp_path: Path, exc: BaseException | None, ended: bool) -> None:
    with contextlib.suppress(BaseException):
        with SnapshotWriter(tmp_path, "r", rank=0) as w:
            assert w.log({"x": 1.0}, 5)
            if exc is not None:
                raise exc
    records = read_records(tmp_path / "r" / "rank-0.jsonl", with_end=True)
    assert [is_run_end(r) for r in records] == ([False, True] if ended else [False])
    assert not w.log({"x": 1.0}, 6)  # closed either way


def test_one_write_call_per_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    buffers: list[bytes] = []

    def recording_write(fd: int, data: bytes) -> int:
        buffers.append(bytes(data))
        return real_write(fd, data)

    with SnapshotWriter(tmp_path, "r", rank=0) as w:
        monkeypatch.setattr(os, "write", recording_write)
        for step in range(5):
            assert w.log({"x": float(step)}, step, events=[{"kind": "e" * 5000}])
        monkeypatch.undo()
    assert len(buffers) == 5
    assert all(b.endswith(b"}\n") and b.count(b"\n") == 1 for b in buffers)


def test_concurrent_reader_only_sees_whole_records(tmp_path: Path) -> None:
    n_records = 2000
    writer = SnapshotWriter(tmp_path, "r", rank=0)
    path = Path(writer.path)
    done = threading.Event()
    seen: list[int] = []
    bad: list[str] = []

    def tail() -> None:
        buf = b""
        with open(path, "rb") as f:
            while True:
                finished = done.is_set()  # read after checking, so the last bytes are seen
                chunk = f.read(65536)
                if not chunk and finished:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    try:
                        seen.append(json.loads(line)["step"])
                    except ValueError:
                        bad.append(line[:80].decode(errors="replace"))
        if buf:
            bad.append("trailing partial line: " + buf[:80].decode(errors="replace"))

    reader = threading.Thread(target=tail)
    reader.start()
    # Big lines (several pages) so that a split write would be visible to the reader.
    samples = [{"prompt": "p" * 3000, "response": "r" * 6000, "reward": 1.0}]
    for step in range(n_records):
        assert writer.log({"reward/mean": step / 11}, step, samples=samples)
    writer.close(end=False)  # the logged records only
    done.set()
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert bad == []
    assert seen == list(range(n_records))


def test_records_are_identical_without_orjson(tmp_path: Path) -> None:
    """The json fallback (orjson missing) writes the same records, NaN tokens included."""
    code = (
        "import sys, json\n"
        "if sys.argv[2] == 'json': sys.modules['orjson'] = None\n"
        "from grpo_monitor import SnapshotWriter\n"
        "w = SnapshotWriter(sys.argv[1] + '/' + sys.argv[2], 'r', rank=0, world_size=1)\n"
        "w.log({'a': 0.1234567890123, 'b': float('nan'), 'c': float('-inf'), 'd': 3}, 7,\n"
        "      by_type={'hard': {'a': 1e-300}}, events=[{'type': 'x'}])\n"
        "w.close(end=False)\n")
    for mode in ("orjson", "json"):
        subprocess.run([sys.executable, "-c", code, str(tmp_path), mode], check=True, timeout=60)
    lines = {m: (tmp_path / m / "r" / "rank-0.jsonl").read_text() for m in ("orjson", "json")}
    records = {m: json.loads(text) for m, text in lines.items()}
    for rec in records.values():
        rec.pop("time")
        assert math.isnan(rec["metrics"].pop("b"))
        assert rec["metrics"]["c"] == -math.inf
    assert records["orjson"] == records["json"]
    assert "NaN" in lines["orjson"] and "-Infinity" in lines["orjson"]


@pytest.mark.parametrize("placed", ["fifo", "link"])
def test_a_fifo_or_a_link_at_the_ranks_file_neither_hangs_nor_leads_the_records_away(
        placed: str, tmp_path: Path) -> None:
    # The snapshot folder is shared: what another user places at rank-0.jsonl must not hang
    # the training loop (a FIFO) nor carry its records elsewhere (a link). The records are
    # dropped and counted, as on a broken disk.
    run = tmp_path / "snap" / "r"
    run.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("")
    if placed == "fifo":
        os.mkfifo(run / "rank-0.jsonl")
    else:
        os.symlink(elsewhere, run / "rank-0.jsonl")
    writer = SnapshotWriter(tmp_path / "snap", "r", rank=0, world_size=1)
    for step in range(2000):  # past a pipe's 64 KiB buffer, were it written to
        assert not writer.log({"loss": 0.1}, step)
    writer.close()
    assert writer.write_errors >= 1 and writer.dropped_records >= 2000
    assert elsewhere.read_text() == ""


def test_an_unknown_key_warning_made_an_error_costs_no_record(tmp_path: Path) -> None:
    """Under -W error (a user's test suite) the warning is raised, after the record is written:
    the record is on disk and not counted as dropped."""
    import warnings

    from grpo_monitor.sdk.writer import UnknownKeyWarning

    w = SnapshotWriter(tmp_path, "strict", rank=0, world_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UnknownKeyWarning):
            w.log({"reward/meen": 1.0}, 1)
        assert w.log({"reward/meen": 2.0}, 2)  # once per key
    w.close(end=False)
    assert w.dropped_records == 0
    steps = [json.loads(line)["step"] for line in (tmp_path / "strict" / "rank-0.jsonl").read_text().splitlines()]
    assert steps == [1, 2]

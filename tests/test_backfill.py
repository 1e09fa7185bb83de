"""A first start in bounded time: a start-up without a saved state reads a long file's head (the
baseline) and tail (the windows), is ready, and reads the middles after (backfill.py). Until a
run's history is read whole its series are those of a whole read, but for the families that need
every record (exposition.WHOLE_HISTORY), which wait; from then on every series and every counter
is the whole read's, line for line. Real files, written through the SDK; the ingest thread's
steps driven one by one where the order matters, a real exporter scraped over HTTP for the rest."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pytest
import requests
from conftest import Running, Samples, parse_samples, value
from polling import wait_for

from grpo_monitor.runtime import backfill as backfill_module
from grpo_monitor.runtime import exposition as ex
from grpo_monitor.runtime import ingest as ingest_module
from grpo_monitor.runtime.health import ExporterHealth
from grpo_monitor.runtime.ingest import DEFAULT_MAX_LINE_BYTES, MIN_MIDDLE_BYTES, Ingestor
from grpo_monitor.runtime.saved_state import StateFile
from grpo_monitor.runtime.store import RunStore
from grpo_monitor.sdk.writer import SnapshotWriter
from grpo_monitor.tools import simulate

RANKS = 2
STEPS = 1_500
# Any first read is large enough for heads and tails (--snapshot.backfill-above-bytes); both
# ranks' files (rank 0 logs every training key, rank 1 its perf keys alone) have a middle longer
# than ingest.MIN_MIDDLE_BYTES to leave to the backfill.
ABOVE_BYTES = 1


def _lines(source: Path, rank: int) -> list[bytes]:
    return (source / "job" / f"rank-{rank}.jsonl").read_bytes().splitlines(keepends=True)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A healthy job of STEPS steps and RANKS ranks, as the SDK writes it, to build files from."""
    root = tmp_path_factory.mktemp("source")
    writers = [SnapshotWriter(root, "job", rank=r, world_size=RANKS) for r in range(RANKS)]
    simulate.write_steps(writers, simulate.generate("healthy", steps=STEPS, ranks=RANKS,
                                                    start_time=1.7e9))
    for w in writers:
        w.close(end=False)
    return root


def _nan(line: bytes, key: str) -> bytes:
    record = json.loads(line)
    record["metrics"][key] = math.nan
    return json.dumps(record).encode() + b"\n"


def write_job(source: Path, snapshots: Path, upto: int = STEPS) -> dict[int, list[bytes]]:
    """The job's files up to step ``upto``, with what a real history holds in its middle: a
    rollback (steps 600 to 900 logged again), a NaN, a line that is no JSON and a record that is
    none; and a bad line in the head and one in the tail, which the start-up itself reads."""
    files = {}
    for rank in range(RANKS):
        lines = _lines(source, rank)[:upto]
        key = "entropy/mean" if rank == 0 else "perf/step_time_s"
        middle = [*lines[200:900], b"{not json\n", b'{"step": "x"}\n', *lines[599:700],
                  _nan(lines[700], key), *lines[701:upto - 450]]
        files[rank] = [*lines[:20], b"[1, 2]\n", *lines[20:200], *middle, *lines[upto - 450:upto - 5],
                       b"{torn\n", *lines[upto - 5:]]
        (snapshots / "job").mkdir(parents=True, exist_ok=True)
        (snapshots / "job" / f"rank-{rank}.jsonl").write_bytes(b"".join(files[rank]))
    return files


def read(snapshots: Path, above_bytes: int, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
         tails: bool = True) -> tuple[Ingestor, ExporterHealth]:
    """A start-up replay, as the watcher runs it: long files at their head and tail when
    it reads more than ``above_bytes`` (a rank of perf signals alone at its tail), and the
    backfill set up for their runs; then (``tails``) the tails left for after ready."""
    health = ExporterHealth()
    ingestor = Ingestor(snapshots, RunStore(), health, backfill_above_bytes=above_bytes,
                        max_line_bytes=max_line_bytes)
    ingestor.start_up = True
    ingestor.rescan()
    ingestor.start_up = ingestor.skip_middles = False
    ingestor.backfill = backfill_module.start(ingestor)
    if tails:
        assert not ingestor.read_deferred(None)
    return ingestor, health


def series(ingestor: Ingestor) -> list[str]:
    ingestor.store.flush()
    return [line for line in "".join(ingestor.store.render()).splitlines() if '{run="' in line]


def counters(health: ExporterHealth) -> dict[str, float]:
    samples = health_samples(health)
    return {f"{name}{dict(labels)}": v for (name, labels), v in samples.items()
            if name in ("grpo_snapshots_ingested_total", "grpo_snapshot_errors_total")}


def family(line: str) -> str:
    return re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line)[0]  # type: ignore[index]


def finish(ingestor: Ingestor) -> int:
    """Turns of the backfill until it has read everything; how many it took."""
    turns = 0
    while ingestor.backfill is not None:
        turns += 1
        if not ingestor.backfill.turn(0.05):
            ingestor.backfill = None
        assert turns < 10_000
    return turns


def test_head_and_tail_first_then_the_whole_read(source: Path, tmp_path: Path) -> None:
    snapshots = tmp_path / "snapshots"
    write_job(source, snapshots)
    whole, whole_health = read(snapshots, 0)
    assert whole.backfill is None
    expected = series(whole)

    quick, health = read(snapshots, ABOVE_BYTES, tails=False)
    assert quick.backfill is not None and quick.backfill.run_names() == {"job"}
    assert quick.partial_runs() == {"job"}
    # Ready: rank 0 (every training key) read at its head and tail; rank 1 (its perf keys
    # alone) not yet, its tail next, its head with the backfill; which the backfill waits for.
    assert {line.split('rank="')[1].split('"')[0] for line in series(quick) if 'rank="' in line} == {"0"}
    assert list(quick.deferred) == [snapshots / "job" / "rank-1.jsonl"]
    backfill_module.note_progress(quick)
    assert value(health_samples(health), "grpo_exporter_deferred_tail_files") == 1
    assert quick.backfill.turn(10.0) and quick.backfill.backlog_bytes() > 0
    assert not quick.read_deferred(None)
    gaps = {quick.path_of(fb.state.inode).name: fb.gap for fb in quick.backfill.runs["job"].files}
    assert all(gap is not None and gap[1] - gap[0] >= MIN_MIDDLE_BYTES for gap in gaps.values()), gaps
    # Rank 0 (every training key) at its head and tail; rank 1 (its perf keys alone) at its tail
    # alone, its head left to the backfill with its middle (ingest._tail_first).
    assert gaps["rank-0.jsonl"][0] > 0 and gaps["rank-1.jsonl"][0] == 0, gaps
    assert quick.store.headless_ranks() == {"job": {1}}
    ingested = counters(health)["grpo_snapshots_ingested_total{'shape': 'native'}"]
    assert ingested < 0.5 * counters(whole_health)["grpo_snapshots_ingested_total{'shape': 'native'}"]

    # Served at once: every series of a whole read but the families that need every record, and
    # rank 1's that need its head, and those not at all (nothing approximate).
    served = series(quick)
    assert set(served) <= set(expected), sorted(set(served) - set(expected))[:5]
    whole_history = {f.removesuffix("_total") for f in ex.WHOLE_HISTORY} | ex.WHOLE_HISTORY
    missing = {rank: {family(line) for line in set(expected) - set(served) if f'rank="{rank}"' in line}
               for rank in range(RANKS)}
    assert missing[0] and missing[0] <= whole_history, missing[0]
    assert {"grpo_baseline_mean", "grpo_baseline_ready"} <= missing[1] <= whole_history | ex.NEEDS_HEAD, \
        missing[1]
    for name in ("grpo_baseline_mean", "grpo_window_mean", "grpo_window_p10", "grpo_initial_mean",
                 "grpo_window_growth_ratio", "grpo_records_median", "grpo_first_records_median"):
        assert any(family(line) == name for line in served), name
    # The exporter says what it withholds, and for how many runs and ranks.
    backfill_module.note_progress(quick)
    partial = health_samples(health)
    assert value(partial, "grpo_exporter_deferred_tail_files") == 0
    assert value(partial, "grpo_exporter_partial_runs") == 1
    assert value(partial, "grpo_exporter_partial_ranks") == 1
    withheld = {dict(labels)["family"]: v for (name, labels), v in partial.items()
                if name == "grpo_exporter_partial_families"}
    assert withheld == dict.fromkeys(ex.WHOLE_HISTORY | ex.NEEDS_HEAD, 1.0)
    # Rank 0's head's bad line and both tails' were read; the middles' (and rank 1's head's)
    # wait for the backfill.
    errors = counters(health)
    assert errors["grpo_snapshot_errors_total{'reason': 'invalid_record'}"] == 1
    assert errors["grpo_snapshot_errors_total{'reason': 'invalid_json'}"] == RANKS

    assert finish(quick) > 1
    assert quick.partial_runs() == set() and quick.store.headless_ranks() == {}
    assert series(quick) == expected
    assert counters(health) == counters(whole_health)
    assert counters(health)["grpo_snapshot_errors_total{'reason': 'invalid_json'}"] == 2 * RANKS
    backfill_module.note_progress(quick)
    partial = health_samples(health)
    assert value(partial, "grpo_exporter_partial_ranks") == 0
    assert not [name for name, _ in partial if name == "grpo_exporter_partial_families"]


def health_samples(health: ExporterHealth) -> Samples:
    from prometheus_client import generate_latest

    return parse_samples(generate_latest(health.registry).decode())


@pytest.mark.parametrize("extra", [
    {"metrics": {"entropy/mean": 1.0}}, {"metrics": {"my/custom": 1.0}},
    {"by_type": {"math": {"reward/mean": 0.5}}}, {"by_type": {}}],
    ids=["training-key", "unknown-key", "prompt-types", "no-prompt-types-yet"])
def test_a_rank_that_logs_a_training_signal_is_read_at_its_head(source: Path, tmp_path: Path,
                                                                 extra: dict[str, dict]) -> None:
    """A rank is read at its tail alone only when its first record and every record of its
    tail hold performance signals alone: one training key, unknown key or prompt type in its
    tail, and its head is read first as rank 0's. A record with an object field (an empty
    by_type) next to ones with prompt types is parsed, not judged by its names alone."""
    snapshots = tmp_path / "snapshots"
    files = write_job(source, snapshots)
    lines = files[1]
    if not extra.get("by_type", True):  # an empty by_type in every tail record, then one with types
        for i in range(len(lines) - 40, len(lines)):
            if lines[i].startswith(b'{"run"'):
                record = json.loads(lines[i])
                record["by_type"] = {}
                lines[i] = json.dumps(record).encode() + b"\n"
        extra = {"by_type": {"math": {"reward/mean": 0.5}}}
    record = json.loads(lines[-3])
    for field, values in extra.items():
        record.setdefault(field, {}).update(values)
    lines[-3] = json.dumps(record).encode() + b"\n"
    (snapshots / "job" / "rank-1.jsonl").write_bytes(b"".join(lines))
    quick, _ = read(snapshots, ABOVE_BYTES)
    assert quick.backfill is not None
    gaps = {quick.path_of(fb.state.inode).name: fb.gap for fb in quick.backfill.runs["job"].files}
    assert gaps["rank-1.jsonl"] is not None and gaps["rank-1.jsonl"][0] > 0, gaps
    assert quick.store.headless_ranks() == {}
    assert any(line.startswith("grpo_baseline_mean{") and 'rank="1"' in line for line in series(quick))


def test_records_written_during_the_backfill(source: Path, tmp_path: Path) -> None:
    """The trainer goes on while the backfill reads: what the live read takes before the backfill
    reaches its file is read by the backfill, what it takes after is applied to both."""
    snapshots = tmp_path / "snapshots"
    write_job(source, snapshots, upto=1_300)
    quick, health = read(snapshots, ABOVE_BYTES)
    assert quick.backfill is not None
    more = {rank: _lines(source, rank)[1_300:] for rank in range(RANKS)}
    step = 0
    while quick.backfill is not None or step < 200:
        for rank in range(RANKS):
            path = snapshots / "job" / f"rank-{rank}.jsonl"
            with path.open("ab") as fh:
                fh.writelines(more[rank][step:step + 5])
            quick.process(path)
        step += 5
        if quick.backfill is not None and not quick.backfill.turn(0.002):
            quick.backfill = None
    whole, whole_health = read(snapshots, 0)
    assert quick.partial_runs() == set()
    assert series(quick) == series(whole)
    assert counters(health) == counters(whole_health)


def test_a_saved_state_leaves_a_partial_run_out(source: Path, tmp_path: Path) -> None:
    """A state saved while the backfill reads keeps neither the run nor its files: a restart
    reads them again rather than keep counters of part of a run as if whole."""
    snapshots = tmp_path / "snapshots"
    write_job(source, snapshots)
    quick, _ = read(snapshots, ABOVE_BYTES)
    state = StateFile(tmp_path / "state", snapshots)
    state.save(quick.store, quick)
    result, saved = state.load()
    assert result == "restored" and saved is not None
    assert saved.runs == {} and saved.files == {}
    restarted = Ingestor(snapshots, RunStore(), ExporterHealth(), backfill_above_bytes=ABOVE_BYTES)
    restarted.restore(saved.files, saved.controls)
    restarted.start_up = True
    restarted.rescan()
    assert restarted.gaps, "a restart before the backfill ended reads heads and tails again"
    finish(quick)
    state.save(quick.store, quick)
    result, saved = state.load()
    assert result == "restored" and saved is not None
    assert set(saved.runs) == {"job"} and len(saved.files) == RANKS
    # A run the state holds is read on from its offsets, never at a head and tail.
    (snapshots / "job" / "rank-2.jsonl").write_bytes((snapshots / "job" / "rank-1.jsonl").read_bytes())
    restarted = Ingestor(snapshots, RunStore(), ExporterHealth(), backfill_above_bytes=ABOVE_BYTES)
    restarted.restore(saved.files, saved.controls)
    restarted.start_up = True
    restarted.rescan()
    assert restarted.gaps == {}


# -- races with the backfill: the files change while it reads them ----------------------------
# The backfill stepped a bounded amount (its clock ticks once a look, its chunks are small), the
# files changed, the live read told (or not yet), and the backfill then run to its end: the run is
# no longer partial and its series are those of a fresh read of the files as they are then.

LINE = 16 << 10  # --snapshot.max-line-bytes of these tests: a chunk of the backfill is twice it
CHUNK = 16 << 10  # and at least this: a file's middle is read in dozens of chunks


class Ticks:
    """The backfill's clock: each look at it is a tick, so a turn of ``n`` seconds reads about
    ``n`` chunks, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def stepped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backfill's turns read by the tick, not by the clock; and a live read of a file (the
    backfill has one look at a file it finds changed) is never cut by its time, whose next turn
    would date the rest of the file's records by the time of the read before (ingest._dated) on
    a machine slow enough."""
    monkeypatch.setattr(backfill_module, "time", Ticks())
    monkeypatch.setattr(backfill_module, "READ_CHUNK", CHUNK)
    monkeypatch.setattr(ingest_module, "READ_TURN_SECONDS", math.inf)


def step(ingestor: Ingestor, chunks: int) -> None:
    """A turn of the backfill that reads about ``chunks`` chunks."""
    assert ingestor.backfill is not None
    if not ingestor.backfill.turn(chunks):
        ingestor.backfill = None


def live_read(ingestor: Ingestor, *paths: Path) -> None:
    """The live read of ``paths``, as on their events: each read to its end."""
    for path in paths:
        ingestor.process(path, budget=None)


def settle(ingestor: Ingestor) -> None:
    """The watcher's loop, without its thread: the files whose turn ran out read on, and a turn
    of the backfill, until the backfill is done (polled, with a deadline); then no run is
    partial (what grpo_exporter_partial_runs reports)."""

    def done() -> bool:
        for path in list(ingestor.unfinished):
            ingestor.process(path)
        ingestor.read_deferred(None)
        if ingestor.backfill is not None:
            step(ingestor, 1_000)
        return ingestor.backfill is None and not ingestor.unfinished

    wait_for(done, timeout=120, interval=0, what="the backfill done")
    assert ingestor.partial_runs() == set()


def assert_fresh(ingestor: Ingestor, snapshots: Path) -> list[str]:
    """Every run's series are those of a fresh read of the files as they are now."""
    whole, _ = read(snapshots, 0, LINE)
    expected = series(whole)
    served = series(ingestor)
    assert served == expected, (sorted(set(served) - set(expected))[:4],
                                sorted(set(expected) - set(served))[:4])
    assert {family(line) for line in served} & ex.WHOLE_HISTORY  # published, not only hidden
    return served


def progress(ingestor: Ingestor) -> list[tuple[int, int, bool]]:
    """(bytes read, the live offset, caught up) of each file of the run ``job``'s backfill."""
    assert ingestor.backfill is not None
    return [(fb.read_to, fb.state.offset, fb.caught_up) for fb in ingestor.backfill.runs["job"].files]


def stand(quick: Ingestor, which: str, rank_0_read_in: int) -> None:
    """Step the backfill to the middle of rank 0's file ("being read"), or past it into rank 1's
    (``rank_0_read_in`` chunks: rank 0's read whole, rank 1's begun)."""
    if which == "being read":
        step(quick, 20)
        assert 0 < progress(quick)[0][0] < progress(quick)[0][1], progress(quick)
    else:
        step(quick, rank_0_read_in)
        (_, _, caught0), (read1, offset1, _) = progress(quick)
        assert caught0 and 0 < read1 < offset1, progress(quick)


def first_start(source: Path, snapshots: Path,
                upto: int = STEPS) -> tuple[Ingestor, dict[int, list[bytes]]]:
    """A first start on the job's files up to step ``upto``: the backfill set up, not begun."""
    files = write_job(source, snapshots, upto)
    quick, _ = read(snapshots, ABOVE_BYTES, LINE)
    assert quick.backfill is not None and quick.partial_runs() == {"job"}
    return quick, files


@pytest.mark.parametrize("which, live_read_first", [
    ("being read", True), ("being read", False), ("read already", True), ("copytruncate", True)],
    ids=["mid-read-live-read-first", "mid-read-backfill-first", "caught-up", "copytruncate"])
def test_a_file_truncated_in_place_during_the_backfill(source: Path, tmp_path: Path, stepped: None,
                                                       which: str, live_read_first: bool) -> None:
    """Truncated in place (verl's log when a run resumes), below where the backfill had read it
    or after it had read it whole; or emptied, and written on with the rank's next steps
    (logrotate's copytruncate, whose copy is no snapshot): the live read reads it again from its
    start, and the backfill reads the run again from its files as they are now."""
    snapshots = tmp_path / "snapshots"
    upto = 1_300 if which == "copytruncate" else STEPS
    quick, files = first_start(source, snapshots, upto)
    path = snapshots / "job" / "rank-0.jsonl"
    if which == "being read":
        step(quick, 20)
        (read0, offset0, caught0), (read1, _, _) = progress(quick)
        assert 0 < read0 < offset0 and not caught0 and read1 == 0, progress(quick)
        keep = b"".join(files[0][:250])
        assert len(keep) < read0  # fewer bytes than the backfill has read of it
    else:
        step(quick, 105 if which == "read already" else 95)
        (_, _, caught0), (read1, offset1, _) = progress(quick)
        assert caught0 and 0 < read1 < offset1, progress(quick)  # rank 0's records teed now
        keep = b"".join(files[0][:1_000]) if which == "read already" else b""
    inode = path.stat().st_ino
    os.truncate(path, len(keep))
    if which == "copytruncate":
        with path.open("ab") as fh:
            fh.writelines(_lines(source, 0)[upto:])
    assert path.stat().st_ino == inode
    if live_read_first:
        live_read(quick, path)
    settle(quick)
    assert_fresh(quick, snapshots)


def test_a_file_rewritten_during_the_backfill(source: Path, tmp_path: Path, stepped: None) -> None:
    """Rewritten in place, shorter, before the backfill reaches it and before the live read
    looked at it again: the backfill finds it changed, the live read reads it again from its
    start, and the run is read again."""
    snapshots = tmp_path / "snapshots"
    quick, files = first_start(source, snapshots)
    step(quick, 20)
    (snapshots / "job" / "rank-1.jsonl").write_bytes(b"".join(files[1][:100]))
    settle(quick)
    assert_fresh(quick, snapshots)


@pytest.mark.parametrize("via", ["outside", "inside"])
@pytest.mark.parametrize("which", ["being read", "read already"])
def test_both_files_of_a_run_replaced_by_rename_during_the_backfill(
        source: Path, tmp_path: Path, stepped: None, which: str, via: str) -> None:
    """The run starts over: each rank's file is replaced by a rename of a new one, written
    outside the snapshot folder or under another snapshot name in the run folder (which the
    live read reads too), while the backfill reads rank 0's file or after it read it. The live
    read reads each new file from its first byte, and the store starts the run over. Then it
    is read whole again, from the new files."""
    snapshots = tmp_path / "snapshots"
    quick, _ = first_start(source, snapshots)
    new = write_job(source, tmp_path / "new", upto=1_000)  # a re-run, 1,000 steps so far
    assert new[0] != (snapshots / "job" / "rank-0.jsonl").read_bytes()
    stand(quick, which, rank_0_read_in=105)
    for rank in range(RANKS):
        path = snapshots / "job" / f"rank-{rank}.jsonl"
        written = tmp_path / "new" / "job" / f"rank-{rank}.jsonl"
        if via == "outside":
            os.replace(written, path)
            live_read(quick, path)
        else:
            written = written.rename(snapshots / "job" / f"rank-{rank}.next.jsonl")
            live_read(quick, written)
            os.replace(written, path)
            quick.moved(written, path)
        if quick.backfill is not None:
            step(quick, 3)
    settle(quick)
    assert_fresh(quick, snapshots)


@pytest.mark.parametrize("how, which, live_read_first", [
    ("sdk", "being read", True), ("sdk", "being read", False),
    ("logrotate", "read already", True), ("logrotate", "being read", False)],
    ids=["sdk-live-read-first", "sdk-backfill-first", "logrotate-caught-up",
         "logrotate-backfill-first"])
def test_a_file_rotated_during_the_backfill(source: Path, tmp_path: Path, stepped: None, how: str,
                                            which: str, live_read_first: bool,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """Rotated while the backfill reads it, or after it read it, the rank's next records in a
    new rank-0.jsonl. The SDK's way (renamed rank-0.1.jsonl, a snapshot name): the backfill reads
    on in the renamed file, then the new one, in the rank's order, whether the live read saw
    the rename first or not, and does not read the run again for it. logrotate's (renamed
    rank-0.jsonl.1, which the live read reads to its end and forgets, and which a start-up does
    not read): the run is read again, from the files a start-up reads."""
    snapshots = tmp_path / "snapshots"
    quick, _ = first_start(source, snapshots, upto=1_300)
    stand(quick, which, rank_0_read_in=95)
    path = snapshots / "job" / "rank-0.jsonl"
    segment = snapshots / "job" / ("rank-0.1.jsonl" if how == "sdk" else "rank-0.jsonl.1")
    os.rename(path, segment)
    path.write_bytes(b"".join(_lines(source, 0)[1_300:]))
    if live_read_first:
        quick.moved(path, segment)
        live_read(quick, path)
    with caplog.at_level(logging.INFO, "grpo_monitor.runtime.backfill"):
        settle(quick)
    assert_fresh(quick, snapshots)
    assert "run job: its history is read whole" in caplog.text
    if how == "sdk":
        assert quick.path_of(segment.stat().st_ino) == segment
        assert "reading it again" not in caplog.text
    else:
        assert quick.path_of(segment.stat().st_ino) is None
        assert "reading it again" in caplog.text


@pytest.mark.parametrize("change, live_read_first", [
    ("rotated", True), ("rotated", False), ("truncated", True), ("truncated", False)])
def test_a_file_changed_before_its_tail_is_read(source: Path, tmp_path: Path, stepped: None,
                                                change: str, live_read_first: bool) -> None:
    """Ready, and rank 1's file (perf signals alone: its tail left for after ready) rotated the
    SDK's way or truncated in place before that tail is read, the live read told at once or
    not: once settled, the run is a fresh read's."""
    snapshots = tmp_path / "snapshots"
    write_job(source, snapshots, upto=1_300)
    quick, _ = read(snapshots, ABOVE_BYTES, LINE, tails=False)
    path = snapshots / "job" / "rank-1.jsonl"
    assert list(quick.deferred) == [path]
    if change == "rotated":
        segment = snapshots / "job" / "rank-1.1.jsonl"
        os.rename(path, segment)
        path.write_bytes(b"".join(_lines(source, 1)[1_300:]))
        if live_read_first:
            quick.moved(path, segment)
    else:
        path.write_bytes(b"".join(_lines(source, 1)[:100]))
    if live_read_first:
        live_read(quick, path)
    settle(quick)
    assert_fresh(quick, snapshots)


@pytest.mark.parametrize("how", ["events", "rescan"])
def test_a_run_folder_renamed_during_the_backfill(source: Path, tmp_path: Path, stepped: None,
                                                  how: str) -> None:
    """A renamed run folder is another run, read from its files' first bytes under the new name;
    the old name is forgotten, not left partial, and nothing is swapped into either."""
    snapshots = tmp_path / "snapshots"
    quick, _ = first_start(source, snapshots)
    step(quick, 20)
    os.rename(snapshots / "job", snapshots / "job-2")
    if how == "events":  # what the watcher makes of a folder's rename
        quick.deleted(snapshots / "job")
        quick.scan_folder(snapshots / "job-2")
    else:  # the events missed: the next rescan
        quick.rescan()
    settle(quick)
    served = assert_fresh(quick, snapshots)
    assert not any('run="job"' in line for line in served)


def test_a_run_that_starts_over_during_the_backfill(source: Path, tmp_path: Path,
                                                    stepped: None) -> None:
    """A re-run under the same name appends to the files (the SDK opens them to append): its
    first step, before the rank's newest, makes the store start the run over. The backfill had
    read rank 0 whole (its records are teed since) and was reading rank 1; the re-run writes
    rank 1's file first, then rank 0's, which a fresh read now takes last. The run is read again
    from its files, in that order, as a fresh read of them would."""
    snapshots = tmp_path / "snapshots"
    quick, _ = first_start(source, snapshots)
    step(quick, 105)
    (_, _, caught0), (read1, offset1, _) = progress(quick)
    assert caught0 and 0 < read1 < offset1, progress(quick)
    live_run = quick.store.run_state("job")
    paths = [snapshots / "job" / f"rank-{rank}.jsonl" for rank in range(RANKS)]
    for rank in (1, 0):
        with paths[rank].open("ab") as fh:
            fh.writelines(_lines(source, rank)[:300])
        live_read(quick, paths[rank])
    earlier = paths[0].stat().st_mtime_ns - 1_000_000_000
    os.utime(paths[1], ns=(earlier, earlier))  # whatever the clock's tick, rank 0's file is newer
    assert quick.store.run_state("job") is not live_run  # the store started it over
    settle(quick)
    assert_fresh(quick, snapshots)


def test_a_run_expired_while_partial(source: Path, tmp_path: Path, stepped: None) -> None:
    """A partial run that expires leaves the partial set; when its files are written again it is
    a new run, as it would be without the backfill: the backfill does not swap the old history
    into it."""
    snapshots = tmp_path / "snapshots"
    quick, _ = first_start(source, snapshots)
    step(quick, 20)
    assert quick.store.expire(time.time() + 10 * 365 * 86400.0, 1.0) == ["job"]
    assert quick.partial_runs() == set()
    path = snapshots / "job" / "rank-0.jsonl"
    with path.open("ab") as fh:
        fh.writelines(_lines(source, 0)[-3:])
    live_read(quick, path)
    again = quick.store.run_state("job")
    assert again is not None and quick.partial_runs() == set()
    settle(quick)
    assert quick.store.run_state("job") is again


def test_a_file_the_backfill_cannot_read(source: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    """A file that cannot be read (an I/O error, not a race) leaves its run as the heads and tails
    gave it, with the families that need every record still unpublished: never half of a run as
    if whole."""
    snapshots = tmp_path / "snapshots"
    write_job(source, snapshots)
    quick, _ = read(snapshots, ABOVE_BYTES)
    real = backfill_module.open_regular

    def refuse(root: Path, path: Path) -> BinaryIO:
        if path.name == "rank-1.jsonl":
            raise PermissionError(13, "Permission denied", str(path))
        return real(root, path)

    monkeypatch.setattr(backfill_module, "open_regular", refuse)
    with caplog.at_level(logging.WARNING, "grpo_monitor.runtime.backfill"):
        finish(quick)
    assert "cannot read a file" in caplog.text
    assert quick.backfill is None and quick.partial_runs() == {"job"}
    served = {family(line) for line in series(quick)}
    assert not served & ex.WHOLE_HISTORY, served & ex.WHOLE_HISTORY
    assert "grpo_window_mean" in served
    # Nor saved as if whole: a restart reads the run again.
    state = StateFile(tmp_path / "state", snapshots)
    state.save(quick.store, quick)
    assert state.load()[1].runs == {}  # type: ignore[union-attr]


def test_a_run_folder_deleted_during_the_backfill(source: Path, tmp_path: Path) -> None:
    """A run whose folder goes while the backfill reads it is forgotten by both; a folder made
    again under its name is a new run, read as it comes, not swapped for the old one's."""
    snapshots = tmp_path / "snapshots"
    write_job(source, snapshots)
    quick, _ = read(snapshots, ABOVE_BYTES)
    for path in (snapshots / "job").iterdir():
        path.unlink()
    (snapshots / "job").rmdir()
    quick.run_folder_gone(snapshots / "job")
    assert quick.backfill is not None and quick.backfill.run_names() == set()
    assert quick.partial_runs() == set() and series(quick) == []


def test_short_files_are_read_whole(source: Path, tmp_path: Path) -> None:
    """A first read of no more than --snapshot.backfill-above-bytes reads every file before
    ready: no backfill."""
    snapshots = tmp_path / "snapshots"
    write_job(source, snapshots)
    size = sum(p.stat().st_size for p in (snapshots / "job").iterdir())
    quick, _ = read(snapshots, size)
    assert quick.backfill is None and quick.gaps == {}
    quick, _ = read(snapshots, size - 1)
    assert quick.backfill is not None


def test_the_exporter_is_ready_before_the_history_is_read(
        source: Path, snapshot_dir: Path, start_exporter: Callable[..., Running],
        caplog: pytest.LogCaptureFixture) -> None:
    """A real exporter: ready, its backfill gauges at 0 once the run is read whole, and then the
    same run series as an exporter that read every file before it was ready."""
    write_job(source, snapshot_dir)
    settings = {"gpu_collector": False, "run_timeout": 10 * 365 * 86400.0}  # the job is old
    with caplog.at_level(logging.INFO, "grpo_monitor.runtime.backfill"):
        quick = start_exporter(backfill_above_bytes=ABOVE_BYTES, **settings)
        quick.wait_value("grpo_exporter_partial_runs", 0, timeout=60)
        assert value(quick.scrape(), "grpo_exporter_backfill_bytes") == 0
    assert "run job: its history is read whole" in caplog.text
    whole = start_exporter(backfill_above_bytes=0, **settings)

    def run_series(running: Running) -> list[str]:
        text = requests.get(f"{running.url}/metrics", timeout=10).text
        return [line for line in text.splitlines() if '{run="' in line]

    wait_for(lambda: run_series(quick) == run_series(whole), timeout=10,
             what="the same run series", diagnose=lambda: str(
                 sorted(set(run_series(quick)) ^ set(run_series(whole)))[:6]))

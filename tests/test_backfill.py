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
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from conftest import Running, parse_samples, value
from polling import wait_for

from grpo_monitor.runtime import backfill as backfill_module
from grpo_monitor.runtime import exposition as ex
from grpo_monitor.runtime.health import ExporterHealth
from grpo_monitor.runtime.ingest import MIN_MIDDLE_BYTES, Ingestor
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


def read(snapshots: Path, above_bytes: int) -> tuple[Ingestor, ExporterHealth]:
    """A start-up replay, as the watcher runs it: long files at their head and tail when
    it reads more than ``above_bytes``, and the backfill set up for their runs."""
    health = ExporterHealth()
    ingestor = Ingestor(snapshots, RunStore(), health, backfill_above_bytes=above_bytes)
    ingestor.start_up = True
    ingestor.rescan()
    ingestor.start_up = ingestor.skip_middles = False
    ingestor.backfill = backfill_module.start(ingestor)
    return ingestor, health


def series(ingestor: Ingestor) -> list[str]:
    ingestor.store.flush()
    return [line for line in "".join(ingestor.store.render()).splitlines() if '{run="' in line]


def counters(health: ExporterHealth) -> dict[str, float]:
    from prometheus_client import generate_latest

    samples = parse_samples(generate_latest(health.registry).decode())
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

    quick, health = read(snapshots, ABOVE_BYTES)
    assert quick.backfill is not None and quick.backfill.run_names() == {"job"}
    assert quick.partial_runs() == {"job"}
    gaps = {fb.state.inode: fb.gap for fb in quick.backfill.runs["job"].files}
    assert all(gap is not None and gap[1] - gap[0] >= MIN_MIDDLE_BYTES for gap in gaps.values()), gaps
    ingested = counters(health)["grpo_snapshots_ingested_total{'shape': 'native'}"]
    assert ingested < 0.5 * counters(whole_health)["grpo_snapshots_ingested_total{'shape': 'native'}"]

    # Served at once: every series of a whole read but the families that need every record, and
    # those not at all (nothing approximate).
    served = series(quick)
    assert set(served) <= set(expected), sorted(set(served) - set(expected))[:5]
    missing = {family(line) for line in set(expected) - set(served)}
    assert missing and missing <= {f.removesuffix("_total") for f in ex.WHOLE_HISTORY} | ex.WHOLE_HISTORY, missing
    for name in ("grpo_baseline_mean", "grpo_window_mean", "grpo_window_p10", "grpo_initial_mean",
                 "grpo_window_growth_ratio", "grpo_records_median", "grpo_first_records_median"):
        assert any(family(line) == name for line in served), name
    # The head's bad line and the tail's were read; the middle's wait for the backfill.
    errors = counters(health)
    assert errors["grpo_snapshot_errors_total{'reason': 'invalid_record'}"] == RANKS
    assert errors["grpo_snapshot_errors_total{'reason': 'invalid_json'}"] == RANKS

    assert finish(quick) > 1
    assert quick.partial_runs() == set()
    assert series(quick) == expected
    assert counters(health) == counters(whole_health)
    assert counters(health)["grpo_snapshot_errors_total{'reason': 'invalid_json'}"] == 2 * RANKS


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


def test_a_file_rewritten_during_the_backfill(source: Path, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """A file the backfill cannot follow leaves its run as the heads and tails gave it, with the
    families that need every record still unpublished: never half of a run as if whole."""
    snapshots = tmp_path / "snapshots"
    files = write_job(source, snapshots)
    quick, _ = read(snapshots, ABOVE_BYTES)
    (snapshots / "job" / "rank-1.jsonl").write_bytes(b"".join(files[1][:100]))
    with caplog.at_level(logging.WARNING, "grpo_monitor.runtime.backfill"):
        finish(quick)
    assert "cannot follow a file" in caplog.text
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

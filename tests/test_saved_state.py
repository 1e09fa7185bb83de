"""The saved state (--storage.path): a restarted exporter serves what it served before, reading
only what was written since; a state that is not this exporter's own, whole and current is
counted and every file read instead. Real exporters on real files, scraped over HTTP; one
`serve` process killed with SIGKILL."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import Running, value
from polling import wait_for
from processes import start_listening

from grpo_monitor.runtime.health import ExporterHealth
from grpo_monitor.runtime.ingest import Ingestor
from grpo_monitor.runtime.saved_state import (FILE_NAME, FORMAT, LEGACY_FILE_NAMES, MAGIC, MAX_PAYLOAD_BYTES,
                                              RESTORE_RESULTS, StateFile)
from grpo_monitor.runtime.state_codec import SCHEMA
from grpo_monitor.runtime.store import Limits, RunStore
from grpo_monitor.sdk.writer import SnapshotWriter
from grpo_monitor.tools import simulate
from grpo_monitor.tools.stack import Child

RANKS = 4


def run_families(running: Running) -> str:
    """Every series of a run in a scrape (a `run` label), in order: not the exporter's own
    process and health series, which start again at zero with any process."""
    text = requests.get(f"{running.url}/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if '{run="' in line]
    assert len(lines) > 100, text[-2000:]
    return "\n".join(lines)


def ingested(running: Running) -> float:
    return value(running.scrape(), "grpo_snapshots_ingested_total", shape="native") or 0.0


def restores(running: Running) -> dict[str, float]:
    s = running.scrape()
    return {r: value(s, "grpo_exporter_state_restores_total", result=r) or 0.0 for r in RESTORE_RESULTS}


class Job:
    """A live healthy job of RANKS ranks; write(a, b) logs steps a..b-1 of its 600."""

    def __init__(self, snapshot_dir: Path, **writer: object) -> None:
        self.writers = [SnapshotWriter(snapshot_dir, "job", rank=r, world_size=RANKS, **writer)  # type: ignore[arg-type]
                        for r in range(RANKS)]
        self.steps = list(simulate.generate("healthy", steps=600, ranks=RANKS))
        self.records = 0

    def write(self, first: int, end: int) -> None:
        written = simulate.write_steps(self.writers, self.steps[first - 1:end - 1])
        self.records += sum(written.records.values())


def caught_up(running: Running, records: float) -> None:
    wait_for(lambda: ingested(running) >= records, timeout=30, what=f"{records} records ingested")
    running.exporter.store.flush()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


def test_a_restart_serves_what_it_served_and_reads_only_what_is_new(
        snapshot_dir: Path, state_dir: Path, start_exporter: Callable[..., Running]) -> None:
    # Small segments: the SDK rotates the files while the exporter is down, too.
    job = Job(snapshot_dir, max_bytes=256 * 1024)
    job.write(1, 301)
    first = start_exporter(storage_path=state_dir)
    assert restores(first)["missing"] == 1
    caught_up(first, job.records)
    before = run_families(first)
    first_files = first.scrape()
    first.exporter.stop()  # a clean stop saves the state
    assert (state_dir / FILE_NAME).stat().st_mode & 0o777 == 0o600
    assert state_dir.stat().st_mode & 0o777 == 0o700

    second = start_exporter(storage_path=state_dir)
    assert restores(second) == {**dict.fromkeys(RESTORE_RESULTS, 0.0), "restored": 1.0}
    # Ready with every series as it was, and not one old record read again.
    assert ingested(second) == 0
    assert value(second.scrape(), "grpo_snapshot_files") == value(first_files, "grpo_snapshot_files") > 0
    assert run_families(second) == before

    # The trainer goes on (rotating its files); it is followed from where it was, and the series
    # are those of an exporter that read every file from the start.
    already = job.records
    job.write(301, 601)
    caught_up(second, job.records - already)
    assert ingested(second) == job.records - already
    assert len(list(snapshot_dir.glob("job/rank-0*.jsonl"))) > 2, "the SDK never rotated"
    fresh = start_exporter()
    caught_up(fresh, job.records)
    assert run_families(second) == run_families(fresh)


def test_written_while_it_was_down_is_read_at_the_restart(
        snapshot_dir: Path, state_dir: Path, start_exporter: Callable[..., Running]) -> None:
    job = Job(snapshot_dir, max_bytes=256 * 1024)
    job.write(1, 251)
    first = start_exporter(storage_path=state_dir)
    caught_up(first, job.records)
    first.exporter.stop()
    already = job.records
    job.write(251, 451)  # the exporter is down: an upgrade, a reboot
    second = start_exporter(storage_path=state_dir)
    assert restores(second)["restored"] == 1
    assert ingested(second) == job.records - already  # read at the start-up, before ready
    fresh = start_exporter()
    caught_up(fresh, job.records)
    second.exporter.store.flush()
    assert run_families(second) == run_families(fresh)


def _tamper_header(path: Path, **changes: object) -> None:
    """The header's keys changed as ``changes`` says; one given None is removed."""
    data = path.read_bytes()
    head = data[len(MAGIC):].split(b"\n", 1)
    meta = json.loads(head[0])
    meta.update(changes)
    meta = {key: value for key, value in meta.items() if value is not None}
    path.write_bytes(MAGIC + json.dumps(meta).encode() + b"\n" + head[1])


@pytest.mark.parametrize("damage, result", [
    (lambda p: p.write_bytes(p.read_bytes()[:-100]), "corrupt"),  # cut short
    (lambda p: p.write_bytes(p.read_bytes()[:-1] + bytes([p.read_bytes()[-1] ^ 1])), "corrupt"),  # a flipped bit
    (lambda p: p.write_bytes(b"not a state\n"), "corrupt"),
    # The package's version does not set a state aside (its schema does): the next release
    # restarts on it, reading nothing again.
    (lambda p: _tamper_header(p, version="0.0.1"), "restored"),
    # A release before "payload_bytes" stated no size: its state is restored all the same.
    (lambda p: _tamper_header(p, payload_bytes=None), "restored"),
    (lambda p: _tamper_header(p, schema=SCHEMA + 1), "stale"),  # a newer release's objects
    (lambda p: _tamper_header(p, format=FORMAT + 1), "stale"),  # a newer release's layout
    (lambda p: _tamper_header(p, root="/elsewhere"), "stale"),
    (lambda p: p.chmod(0o666), "refused"),  # another user could have written it
    (lambda p: (p.unlink(), p.symlink_to(p.parent / "elsewhere")), "refused"),
], ids=["cut-short", "flipped-bit", "not-a-state", "another-release", "no-payload-size", "newer-schema", "newer-format", "other-folder", "world-writable", "link"])
def test_a_state_is_used_when_it_is_this_exporters_else_counted_and_every_file_read(
        snapshot_dir: Path, state_dir: Path, start_exporter: Callable[..., Running],
        damage: Callable[[Path], object], result: str) -> None:
    job = Job(snapshot_dir)
    job.write(1, 101)
    first = start_exporter(storage_path=state_dir)
    caught_up(first, job.records)
    before = run_families(first)
    first.exporter.stop()
    damage(state_dir / FILE_NAME)
    second = start_exporter(storage_path=state_dir)
    assert restores(second) == {**dict.fromkeys(RESTORE_RESULTS, 0.0), result: 1.0}
    read_again = 0 if result == "restored" else job.records  # else every record read again
    caught_up(second, read_again)
    assert ingested(second) == read_again
    assert run_families(second) == before


KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BOUNDED = 1 * MiB  # what a refusal before the payload may hold: the capped reads, a log line


def saved_state(snapshot_dir: Path, state_dir: Path) -> StateFile:
    """A state this release saved of a small live job; its head (magic, header, digest lines)
    is what a genuine state file starts with."""
    Job(snapshot_dir).write(1, 21)
    store = RunStore()
    ingestor = Ingestor(snapshot_dir, store, ExporterHealth())
    ingestor.rescan()
    store.flush()
    state = StateFile(state_dir, snapshot_dir)
    state.save(store, ingestor)
    return state


def head_of(path: Path) -> bytes:
    """The lines before the payload."""
    data = path.read_bytes()
    return data[:len(b"".join(data.split(b"\n", 3)[:3])) + 3]


def grown_to(path: Path, size: int) -> None:
    """``path`` cut to its head, then ``size`` bytes long: sparse, no disk spent."""
    head = head_of(path)
    with path.open("r+b") as fh:
        fh.truncate(len(head))
        fh.truncate(size)


def load_measured(state: StateFile) -> tuple[str, int]:
    """A new exporter's load of ``state``'s file: its result, and the most memory it held at
    once (tracemalloc's peak)."""
    fresh = StateFile(state.directory, Path(state.root), state.settings)
    started = not tracemalloc.is_tracing()
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        result, _ = fresh.load()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        if started:
            tracemalloc.stop()


@pytest.mark.parametrize("header, size, result, why", [
    # This release's header states the payload's size: 1 GiB is not it.
    ({}, GiB, "corrupt", "where the header says"),
    # An earlier release's header states none: the limit still holds, before any payload byte.
    ({"payload_bytes": None}, MAX_PAYLOAD_BYTES + 64 * KiB, "corrupt", f"above the limit of {MAX_PAYLOAD_BYTES}"),
    # Set aside by its header alone: not one byte more is read.
    ({"root": "/elsewhere"}, GiB, "stale", "saved by version"),
], ids=["wrong-size", "over-the-limit", "other-folder"])
def test_a_big_file_behind_a_genuine_head_is_refused_before_its_payload_is_read(
        snapshot_dir: Path, state_dir: Path, caplog: pytest.LogCaptureFixture,
        header: dict[str, object], size: int, result: str, why: str) -> None:
    state = saved_state(snapshot_dir, state_dir)
    _tamper_header(state.path, **header)
    grown_to(state.path, size)
    assert state.path.stat().st_size == size
    caplog.set_level(logging.INFO, logger="grpo_monitor.runtime.saved_state")
    loaded, peak = load_measured(state)
    assert loaded == result
    assert peak < BOUNDED
    assert why in caplog.text


def test_a_header_line_that_never_ends_is_refused_after_a_bounded_read(
        snapshot_dir: Path, state_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = saved_state(snapshot_dir, state_dir)
    state.path.write_bytes(MAGIC + b"{" + b" " * (10 * MiB))
    result, peak = load_measured(state)
    assert result == "corrupt"
    assert peak < BOUNDED
    assert "no header line of at most" in caplog.text


def test_a_payload_of_another_checksum_is_corrupt_and_held_once(
        snapshot_dir: Path, state_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The payload is read whole to be checked, but into one buffer: a file of the header's
    size whose checksum fails costs its payload once, not a copy more."""
    state = saved_state(snapshot_dir, state_dir)
    assert load_measured(state)[0] == "restored"  # as saved: what follows is the checksum's doing
    payload = 64 * MiB
    _tamper_header(state.path, payload_bytes=payload)
    grown_to(state.path, len(head_of(state.path)) + payload)
    result, peak = load_measured(state)
    assert result == "corrupt"
    assert peak < payload + BOUNDED
    assert "a wrong checksum" in caplog.text


def test_a_state_of_the_pickle_format_is_set_aside_once(
        snapshot_dir: Path, state_dir: Path, start_exporter: Callable[..., Running]) -> None:
    """The releases before the versioned format pickled their classes: such a state is counted
    stale, removed, and every file read; the next start restores this release's own state."""
    job = Job(snapshot_dir)
    job.write(1, 51)
    state_dir.mkdir(mode=0o700)
    legacy = state_dir / LEGACY_FILE_NAMES[0]
    legacy.write_bytes(b"grpo-monitor exporter state\n{}\n")
    legacy.chmod(0o600)
    first = start_exporter(storage_path=state_dir)
    assert restores(first)["stale"] == 1
    caught_up(first, job.records)
    assert not legacy.exists()
    first.exporter.stop()
    assert restores(start_exporter(storage_path=state_dir))["restored"] == 1


def test_a_save_that_fails_is_counted_and_the_exporter_goes_on(
        snapshot_dir: Path, tmp_path: Path, start_exporter: Callable[..., Running]) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    job = Job(snapshot_dir)
    job.write(1, 11)
    running = start_exporter(storage_path=blocked / "state", storage_save_interval=0.1)
    running.wait_value("grpo_exporter_state_save_errors_total", lambda v: (v or 0) >= 1)
    job.write(11, 21)
    running.wait_value("grpo_step", 20, run="job", rank="0")


def test_a_state_folder_in_the_snapshot_folder_is_refused(snapshot_dir: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "serve", "--snapshot.dir",
                          str(snapshot_dir), "--storage.path", str(snapshot_dir / "state"),
                          "--web.listen-address", "127.0.0.1:0"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "lies in the snapshot folder" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_a_killed_exporter_restarts_from_its_last_periodic_save(
        snapshot_dir: Path, state_dir: Path, tmp_path: Path) -> None:
    """SIGKILL (an OOM kill): no clean stop; the periodic save is what the restart has."""
    from contextlib import ExitStack

    job = Job(snapshot_dir)
    job.write(1, 201)

    def serve(stack: ExitStack) -> tuple[Child, str]:
        child, port = start_listening(stack, "serve", lambda port: [
            sys.executable, "-m", "grpo_monitor.cli", "serve", "--snapshot.dir", str(snapshot_dir),
            "--storage.path", str(state_dir), "--storage.save-interval", "200ms",
            "--web.listen-address", f"127.0.0.1:{port}", "--no-collector.gpu"], tmp_path)
        return child, f"http://127.0.0.1:{port}"

    def metric(url: str, line_start: str) -> float | None:
        text = requests.get(f"{url}/metrics", timeout=5).text
        return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)), None)

    with ExitStack() as stack:
        child, url = serve(stack)
        wait_for(lambda: metric(url, 'grpo_step{run="job",rank="0"}') == 200, timeout=30, what="step 200 served")
        first = metric(url, "grpo_exporter_state_saves_total ") or 0.0
        wait_for(lambda: (metric(url, "grpo_exporter_state_saves_total ") or 0.0) >= first + 1,
                 timeout=30, what="a save after step 200 was served")
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait(timeout=10)
    already = job.records
    job.write(201, 221)
    with ExitStack() as stack:
        _, url = serve(stack)
        assert metric(url, 'grpo_exporter_state_restores_total{result="restored"}') == 1.0
        wait_for(lambda: metric(url, 'grpo_step{run="job",rank="0"}') == 220, timeout=30, what="step 220 served")
        assert metric(url, 'grpo_snapshots_ingested_total{shape="native"}') == job.records - already


def test_a_state_saved_under_other_flags_is_set_aside_and_crashed_saves_leave_nothing(
        snapshot_dir: Path, state_dir: Path, start_exporter: Callable[..., Running]) -> None:
    """A changed --signals.baseline-steps applies to every run: the state saved under the old
    one is stale, and every file is read again under the new. Temporary files of saves a crash
    cut short are removed at the next start."""
    job = Job(snapshot_dir)
    job.write(1, 101)
    first = start_exporter(storage_path=state_dir)
    caught_up(first, job.records)
    first.exporter.stop()
    leftovers = [state_dir / f".{FILE_NAME}.{n:08x}.tmp" for n in range(3)]
    for path in leftovers:
        path.write_bytes(b"half a state")
    other = start_exporter(storage_path=state_dir,
                           limits=Limits(baseline_steps=50))
    assert restores(other)["stale"] == 1
    caught_up(other, job.records)
    assert not any(p.exists() for p in leftovers)
    assert value(other.scrape(), "grpo_baseline_ready", run="job", rank="0") == 1  # 50 steps
    other.exporter.stop()
    same = start_exporter(storage_path=state_dir, limits=Limits(baseline_steps=50))
    assert restores(same)["restored"] == 1


def test_a_save_takes_no_lock_and_an_idle_exporter_writes_nothing(tmp_path: Path) -> None:
    """The save pickles on the ingest thread, the only one that changes the store, without the
    store's lock: with the lock held (as a scrape holds it) a save still completes. A save with
    nothing changed since the last writes nothing; one after a new record writes again."""
    import threading

    from grpo_monitor.runtime.health import ExporterHealth
    from grpo_monitor.runtime.ingest import Ingestor
    from grpo_monitor.runtime.saved_state import StateFile
    from grpo_monitor.runtime.store import RunStore
    from grpo_monitor.runtime.watch import SnapshotWatcher

    root = tmp_path / "snaps"
    job = Job(root)
    job.write(1, 51)
    store = RunStore()
    health = ExporterHealth()
    ingestor = Ingestor(root, store, health)
    ingestor.rescan()
    store.flush()
    state = StateFile(tmp_path / "state", root)
    watcher = SnapshotWatcher(ingestor, state=state)

    done = threading.Event()
    with store.locked():  # a scrape rendering meanwhile
        threading.Thread(target=lambda: (watcher._save(), done.set()), daemon=True).start()
        wait_for(done.is_set, timeout=60, what="a save while the store's lock is held")
    saves = value(parse_registry(health), "grpo_exporter_state_saves_total")
    written = state.path.stat().st_mtime_ns
    watcher._save()  # nothing changed
    assert value(parse_registry(health), "grpo_exporter_state_saves_total") == saves == 1
    assert state.path.stat().st_mtime_ns == written
    job.write(51, 52)
    ingestor.rescan()
    watcher._save()
    assert value(parse_registry(health), "grpo_exporter_state_saves_total") == 2


def parse_registry(health: Any) -> Any:
    from prometheus_client import generate_latest

    from conftest import parse_samples

    return parse_samples(generate_latest(health.registry).decode())

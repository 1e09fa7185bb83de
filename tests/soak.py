"""A soak of the ingest path on real processes: many ranks writing for a long time, rotation
included, while the real Prometheus scrapes the exporter.

    writer processes (SnapshotWriter, RANKS ranks at RATE records/s each, rotating) ─┐
                                                                                      ▼
    snapshot folder ──inotify──▶ exporter (grpo-monitor serve, a subprocess) ◀── Prometheus (1 s)
                                        ▲
    this process: every few seconds its RSS (/proc/PID/status), a timed GET of /metrics

Shared by tests/test_soak.py (short) and bench/bench_soak.py (long; it puts tests/ on
sys.path), which check the same properties (``problems``); the benchmark adds the memory slope.

The ranks: ``grpo_monitor.tools.simulate``'s healthy run (rank 0 logs every training key, its
``by_type`` breakdown and the perf keys; every other rank its perf keys; a ``checkpoint_save``
event every 500 steps), one record per step, spread over a few writer processes (this file run
as a script) that each pace their ranks at RATE steps per second on the wall clock. Every record
also carries one ``soak_record`` event: ``grpo_events_total{type="soak_record"}`` is then the
number of records the exporter applied for that rank, the per-rank count to compare with what
its writer wrote. Each rank's ``max_bytes`` is sized from its own record so that every rank
rotates about ``rotations`` times in the run, and ``keep_segments`` is small enough that old
segments are deleted: the exporter must follow renames and forget deleted files.

Everything listens on 127.0.0.1 on ports picked by binding to port 0; configs, TSDB, logs and
the snapshot folder live in one working folder.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from grpo_monitor.runtime.health import ERROR_REASONS
from grpo_monitor.sdk.writer import SnapshotWriter
from grpo_monitor.tools.simulate import Step, generate, write_steps
from grpo_monitor.tools.stack import Child
from polling import wait_for
from processes import log_tail, start_child, start_listening
from prometheus_harness import prometheus_config, start_prometheus

RUN = "soak"
COUNT_EVENT = "soak_record"  # one per record: the exporter's per-rank record count
SCENARIO = "healthy"
WRITER_START_DELAY_S = 3.0  # the writer processes import and open their files meanwhile
DRAIN_TIMEOUT_S = 120.0  # after the writers end, until the exporter has ingested everything
INGESTED = 'grpo_snapshots_ingested_total{shape="native"}'  # as the exporter exposes it
SEGMENT_RE = re.compile(r"^rank-(\d+)(?:\.(\d{6,}))?\.jsonl$")
# The exporter's own series the sampler keeps (the rest of a scrape is the run's).
HEALTH_PREFIXES = (b"grpo_snapshot", b"grpo_exporter_internal_errors_total",
                   b"process_resident_memory_bytes", b"process_cpu_seconds_total")


@dataclass(frozen=True)
class SoakConfig:
    ranks: int = 64
    rate_hz: float = 10.0  # records per second per rank
    duration_s: float = 600.0
    writer_processes: int = 4
    sample_interval_s: float = 2.0
    rotations: int = 5  # each rank's max_bytes is sized to rotate about this often in the run
    keep_segments: int = 2  # fewer than ``rotations``: old segments are deleted during the run
    scrape_interval: str = "1s"
    seed: int = 0

    @property
    def records_per_rank(self) -> int:
        return max(1, round(self.duration_s * self.rate_hz))


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the writers' start
    vmrss_bytes: int  # the exporter's VmRSS from /proc/PID/status
    get_s: float | None  # our own GET of /metrics, whole body read; None if it failed
    health: dict[str, float]  # the exporter's own series, keyed by name{labels} as exposed


@dataclass(frozen=True)
class RankWritten:
    rank: int
    records: int  # log() calls that reached the file
    last_step: int
    dropped_records: int
    write_errors: int


@dataclass
class SoakResult:
    config: SoakConfig
    start_at: float  # unix time the writers' schedule started
    writers_done_s: float  # seconds after start_at when the last writer closed its files
    drained_s: float  # seconds after start_at when every record was ingested
    written: list[RankWritten]
    max_lateness_s: float  # how far the most delayed writer fell behind its schedule
    samples: list[Sample]
    final: dict[tuple[str, frozenset[tuple[str, str]]], float]  # last scrape, parsed
    files_on_disk: int
    rotations: dict[int, int]  # rank -> highest segment number on disk (= rotations)
    prometheus_scrapes: list[tuple[float, float, float]]  # (t, up, scrape_duration_seconds)
    alerts_fired: list[str]
    exporter_alive: bool
    exporter_log: str = ""
    max_bytes: dict[int, int] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float | None:
        return self.final.get((name, frozenset(labels.items())))


# --- the writer processes ------------------------------------------------------------------


def writer_main(argv: Sequence[str] | None = None) -> int:
    """One writer process: ranks [--first-rank, --last-rank] of the run, paced on the wall clock."""
    ap = argparse.ArgumentParser(description=writer_main.__doc__)
    ap.add_argument("--snapshot-dir", required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--first-rank", type=int, required=True)
    ap.add_argument("--last-rank", type=int, required=True)
    ap.add_argument("--records", type=int, required=True, help="records per rank")
    ap.add_argument("--rate", type=float, required=True, help="records per second per rank")
    ap.add_argument("--start-at", type=float, required=True, help="unix time of step 1")
    ap.add_argument("--rotations", type=int, required=True)
    ap.add_argument("--keep-segments", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report", required=True, help="JSON file for what each rank wrote")
    args = ap.parse_args(argv)
    own = range(args.first_rank, args.last_rank + 1)

    steps = generate(SCENARIO, steps=args.records, ranks=args.world_size,
                     step_seconds=1 / args.rate, seed=args.seed)
    first = next(steps)
    max_bytes = {r: _max_bytes(first, r, args.world_size, args.records, args.rotations)
                 for r in own}
    writers = {r: SnapshotWriter(args.snapshot_dir, RUN, rank=r, world_size=args.world_size,
                                 max_bytes=max_bytes[r], keep_segments=args.keep_segments)
               for r in own}
    lateness = 0.0

    def pace(st: Step) -> None:
        # Pacing on a schedule, not on the previous write: a late step is written at once and
        # the next ones catch up, so that every rank writes exactly --records records.
        nonlocal lateness
        delay = args.start_at + (st.step - 1) / args.rate - time.time()
        if delay > 0:
            time.sleep(delay)
        else:
            lateness = max(lateness, -delay)

    # Stamped with the wall clock, as a live trainer's records are.
    done = write_steps(writers, itertools.chain([first], steps), wall_clock=True, before=pace,
                       record=lambda rec: replace(rec, events=_with_count_event(rec.events)))
    written = {r: done.records.get(r, 0) for r in own}
    last_step = {r: done.last_step.get(r, 0) for r in own}
    for writer in writers.values():
        writer.close()  # the clean end: a run_end mark per rank
    Path(args.report).write_text(json.dumps({
        "finished_at": time.time(),
        "max_lateness_s": lateness,
        "max_bytes": max_bytes,
        "ranks": [{"rank": r, "records": written[r], "last_step": last_step[r],
                   "dropped_records": writers[r].dropped_records,
                   "write_errors": writers[r].write_errors} for r in own],
    }))
    return 0


def _with_count_event(events: list[dict[str, object]] | None) -> list[dict[str, object]]:
    return [*(events or []), {"type": COUNT_EVENT}]


def _max_bytes(first: Step, rank: int, world_size: int, records: int, rotations: int) -> int:
    """A max_bytes that makes ``rank`` rotate about ``rotations`` times in ``records`` records:
    its first record, written by a real SnapshotWriter to a scratch folder, gives the size."""
    rec = next(r for r in first.records if r.rank == rank)
    with tempfile.TemporaryDirectory(prefix="grpo-soak-probe-") as tmp:
        with SnapshotWriter(tmp, RUN, rank=rank, world_size=world_size) as probe:
            probe.log(rec.metrics, first.step, by_type=rec.by_type,
                      events=_with_count_event(rec.events))
            size = os.path.getsize(probe.path)
    return max(size, size * records // (rotations + 1))


# --- the harness ---------------------------------------------------------------------------


def run_soak(config: SoakConfig, workdir: Path,
             progress: Callable[[str], None] | None = None) -> SoakResult:
    """Run the soak in ``workdir``; every process it starts is stopped before it returns."""
    say = progress or (lambda _msg: None)
    snapshots = workdir / "snapshots"
    snapshots.mkdir(parents=True)
    with ExitStack() as stack:
        exporter, port = start_listening(stack, "exporter", lambda port: [
            sys.executable, "-m", "grpo_monitor.cli", "serve", "--snapshot.dir", str(snapshots),
            "--web.listen-address", f"127.0.0.1:{port}", "--no-collector.gpu"], workdir)
        exporter_url = f"http://127.0.0.1:{port}"
        prom_config = prometheus_config(f"127.0.0.1:{port}", "127.0.0.1:9", config.scrape_interval)
        # No Alertmanager here: the rules are evaluated (their load is part of the soak), and
        # what fires is read back from Prometheus' ALERTS series.
        prom_config.pop("alerting")
        job = prom_config["scrape_configs"][0]["job_name"]
        _, prom_url = start_prometheus(stack, workdir, prom_config)
        wait_for(lambda: _query(prom_url, f'up{{job="{job}"}} == 1'), 30,
                 what="Prometheus scraping the exporter")
        say(f"exporter {exporter_url} (pid {exporter.proc.pid}), prometheus {prom_url}")

        start_at = time.time() + WRITER_START_DELAY_S
        writers = _start_writers(stack, config, workdir, snapshots, start_at)
        say(f"{len(writers)} writer processes, {config.ranks} ranks x {config.rate_hz:g}/s "
            f"for {config.duration_s:g} s")
        session = requests.Session()
        session.headers["Accept-Encoding"] = "identity"
        stack.callback(session.close)
        samples: list[Sample] = []

        def sample() -> Sample:
            s = _sample(session, exporter_url, exporter, start_at)
            samples.append(s)
            return s

        next_tick = time.monotonic()
        writers_deadline = start_at + config.duration_s + DRAIN_TIMEOUT_S
        while any(w.alive() for w, _ in writers):
            if not exporter.alive():
                raise AssertionError(f"the exporter exited:\n{log_tail(exporter)}")
            if time.time() > writers_deadline:
                raise AssertionError("writer processes still running long after their schedule")
            s = sample()
            if len(samples) % 15 == 1:
                say(f"t={s.t:6.1f}s rss={s.vmrss_bytes / 2**20:.1f} MiB "
                    f"ingested={s.health.get(INGESTED, 0):.0f}")
            next_tick += config.sample_interval_s
            # The sampling period, cut short when the last writer ends: the drain starts then.
            while time.monotonic() < next_tick and any(w.alive() for w, _ in writers):
                time.sleep(min(0.1, max(0.0, next_tick - time.monotonic())))
        written, finished_at, lateness, max_bytes = _read_reports(writers)
        writers_done_s = finished_at - start_at

        # Everything written (records + one run_end mark per rank) must arrive.
        expected = sum(w.records for w in written) + len(written)
        try:
            wait_for(lambda: sample().health.get(INGESTED, 0) >= expected, DRAIN_TIMEOUT_S,
                     interval=0.5, what=f"{expected} records ingested")
        except AssertionError:
            pass  # problems() reports the shortfall, rank by rank
        drained_s = time.time() - start_at
        final = _scrape(session, exporter_url)
        scrapes = _prometheus_scrapes(prom_url, job, start_at)
        alerts = _alerts_fired(prom_url, start_at)
        files, rotations = _disk(snapshots)
        return SoakResult(config, start_at, writers_done_s, drained_s, written, lateness, samples,
                          final, files, rotations, scrapes, alerts, exporter.alive(),
                          log_tail(exporter, 20), max_bytes)


def _start_writers(stack: ExitStack, config: SoakConfig, workdir: Path, snapshots: Path,
                   start_at: float) -> list[tuple[Child, Path]]:
    procs = max(1, min(config.writer_processes, config.ranks))
    bounds = [round(i * config.ranks / procs) for i in range(procs + 1)]
    out = []
    for i in range(procs):
        report = workdir / f"writer-{i}.json"
        proc = start_child(stack, f"writer-{i}", [
            sys.executable, __file__, "--snapshot-dir", str(snapshots),
            "--world-size", str(config.ranks), "--first-rank", str(bounds[i]),
            "--last-rank", str(bounds[i + 1] - 1), "--records", str(config.records_per_rank),
            "--rate", str(config.rate_hz), "--start-at", repr(start_at),
            "--rotations", str(config.rotations), "--keep-segments", str(config.keep_segments),
            "--seed", str(config.seed), "--report", str(report)], workdir)
        out.append((proc, report))
    return out


def _read_reports(writers: list[tuple[Child, Path]]
                  ) -> tuple[list[RankWritten], float, float, dict[int, int]]:
    """What each rank wrote, when the last writer finished, its worst lateness, the max_bytes."""
    written: list[RankWritten] = []
    finished_at = lateness = 0.0
    max_bytes: dict[int, int] = {}
    for proc, report in writers:
        if proc.proc.returncode != 0 or not report.exists():
            raise AssertionError(f"{proc.name} exited with {proc.proc.returncode}:\n"
                                 f"{log_tail(proc)}")
        doc = json.loads(report.read_text())
        finished_at = max(finished_at, doc["finished_at"])
        lateness = max(lateness, doc["max_lateness_s"])
        max_bytes.update({int(r): b for r, b in doc["max_bytes"].items()})
        written += [RankWritten(**r) for r in doc["ranks"]]
    return sorted(written, key=lambda w: w.rank), finished_at, lateness, max_bytes


def _vmrss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def _sample(session: requests.Session, url: str, exporter: Child, start_at: float) -> Sample:
    t = time.time() - start_at
    rss = _vmrss_bytes(exporter.proc.pid)
    t0 = time.perf_counter()
    try:
        resp = session.get(f"{url}/metrics", timeout=10)
        body = resp.content
        resp.raise_for_status()
    except requests.RequestException:
        return Sample(t, rss, None, {})
    return Sample(t, rss, time.perf_counter() - t0, _health(body))


def _health(body: bytes) -> dict[str, float]:
    """The exporter's own series of a scrape body: {"name{labels}": value}."""
    out: dict[str, float] = {}
    for line in body.split(b"\n"):
        if line.startswith(HEALTH_PREFIXES):
            series, _, value = line.decode().rpartition(" ")
            out[series] = float(value)
    return out


def _scrape(session: requests.Session, url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    resp = session.get(f"{url}/metrics", timeout=30)
    resp.raise_for_status()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(resp.text) for s in fam.samples}


def _query(prom_url: str, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"query": promql}
    if at is not None:
        params["time"] = at
    resp = requests.get(f"{prom_url}/api/v1/query", params=params, timeout=30)
    resp.raise_for_status()
    return resp.json()["data"]["result"]


def _prometheus_scrapes(prom_url: str, job: str, start_at: float) -> list[tuple[float, float, float]]:
    """Every scrape of the exporter since ``start_at``, as Prometheus recorded it: (seconds since
    start_at, up, scrape_duration_seconds), from the raw samples of a range selector."""
    now = time.time()
    window = f"{math.ceil(now - start_at) + 1}s"
    series: dict[str, dict[float, float]] = {}
    for name in ("up", "scrape_duration_seconds"):
        result = _query(prom_url, f'{name}{{job="{job}"}}[{window}]', at=now)
        series[name] = {float(ts): float(v) for r in result for ts, v in r["values"]}
    return sorted((ts - start_at, up, series["scrape_duration_seconds"].get(ts, math.nan))
                  for ts, up in series["up"].items() if ts >= start_at)


def _alerts_fired(prom_url: str, start_at: float) -> list[str]:
    window = f"{math.ceil(time.time() - start_at) + 1}s"
    result = _query(prom_url, f'max_over_time(ALERTS{{alertstate="firing"}}[{window}])')
    return sorted({r["metric"].get("alertname", "?") for r in result})


def _disk(snapshots: Path) -> tuple[int, dict[int, int]]:
    """The snapshot files on disk, and each rank's highest segment number (its rotations)."""
    files = 0
    rotations: dict[int, int] = {}
    for path in (snapshots / RUN).iterdir():
        match = SEGMENT_RE.match(path.name)
        if match is None:
            continue
        files += 1
        rank = int(match.group(1))
        rotations[rank] = max(rotations.get(rank, 0), int(match.group(2) or 0))
    return files, rotations


# --- what must hold ------------------------------------------------------------------------


def problems(result: SoakResult) -> list[str]:
    """Every property the soak checks, short or long, as a list of what failed (empty: all
    held): every record written was ingested, rank by rank; no error counted; the exporter
    follows no more files than are on disk; and the harness did what it claims (rotation with
    deletions, a real Prometheus scraping)."""
    c = result.config
    out: list[str] = []
    if not result.exporter_alive:
        out.append(f"the exporter exited:\n{result.exporter_log}")
    if [w.rank for w in result.written] != list(range(c.ranks)):
        out.append(f"writers reported ranks {[w.rank for w in result.written]}")
    for w in result.written:
        if (w.records, w.last_step, w.dropped_records, w.write_errors) != (
                c.records_per_rank, c.records_per_rank, 0, 0):
            out.append(f"rank {w.rank}: the writer wrote {w.records} of {c.records_per_rank} "
                       f"records, up to step {w.last_step} (dropped {w.dropped_records}, write "
                       f"errors {w.write_errors})")
        labels = {"run": RUN, "rank": str(w.rank)}
        got = (result.value("grpo_events_total", **labels, type=COUNT_EVENT),
               result.value("grpo_step", **labels),
               result.value("grpo_events_total", **labels, type="run_end"))
        if got != (w.records, w.last_step, 1):
            out.append(f"rank {w.rank}: the exporter applied {got[0]} records up to step {got[1]} "
                       f"with {got[2]} run_end, the writer wrote {w.records} up to step "
                       f"{w.last_step} and one run_end")
    expected = sum(w.records for w in result.written) + len(result.written)
    ingested = result.value("grpo_snapshots_ingested_total", shape="native")
    if ingested != expected:
        out.append(f"grpo_snapshots_ingested_total = {ingested}, expected {expected} "
                   f"(records + one run_end per rank)")
    if result.value("grpo_run_ended", run=RUN) != 1:
        out.append(f"grpo_run_ended = {result.value('grpo_run_ended', run=RUN)} after every "
                   "rank closed")
    for reason in ERROR_REASONS:
        n = result.value("grpo_snapshot_errors_total", reason=reason)
        if n != 0:
            out.append(f'grpo_snapshot_errors_total{{reason="{reason}"}} = {n}')
    if result.value("grpo_exporter_internal_errors_total") != 0:
        out.append(f"grpo_exporter_internal_errors_total = "
                   f"{result.value('grpo_exporter_internal_errors_total')}")

    # Files: once the writers are done the exporter follows exactly what is on disk (deleted
    # segments forgotten); during the run never more than each rank's current file and kept
    # segments, plus one of each rank in flight between a rename and the delete that follows.
    tracked = result.value("grpo_snapshot_files")
    if tracked != result.files_on_disk:
        out.append(f"grpo_snapshot_files = {tracked}, {result.files_on_disk} files on disk")
    bound = c.ranks * (c.keep_segments + 2)
    most = max((s.health.get("grpo_snapshot_files", 0) for s in result.samples), default=0)
    if most > bound:
        out.append(f"grpo_snapshot_files reached {most} during the run, bound {bound}")
    for rank in range(c.ranks):
        rotated = result.rotations.get(rank, 0)
        if rotated <= c.keep_segments:
            out.append(f"rank {rank} rotated {rotated} times: no segment was deleted "
                       f"(keep_segments={c.keep_segments}); the soak did not exercise deletion")
    if not any(up == 1 for _, up, _ in result.prometheus_scrapes):
        out.append("Prometheus recorded no successful scrape of the exporter during the run")
    return out


if __name__ == "__main__":
    sys.exit(writer_main())

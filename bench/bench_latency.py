"""Latency from a snapshot record written to disk to its step being visible in /metrics.

Usage: python bench/bench_latency.py [--out PATH] [-n N] [--poll-n N] [--poll-interval S]
       [--max-gap-ms MS] [--poll-max-gap-ms MS] [--seed N] [--no-keepalive]

Method. An Exporter runs in this process on a fresh temporary folder (listen 127.0.0.1:0). A
SnapshotWriter (run "bench", rank 0) logs records carrying every canonical key of
``grpo_monitor.contract.keys.SIGNALS`` (random floats) with increasing steps, one at a time:

  t0 = perf_counter() right before writer.log(); then /metrics is scraped over real HTTP
  (requests, one keep-alive Session, ``Accept-Encoding: identity``) back to back, with no sleep,
  until ``grpo_step{run="bench",rank="0"}`` equals the step just written; t1 = perf_counter()
  when the scrape that shows it has been read. latency = t1 - t0.

The next record is written only after the previous one was seen, after a random gap of 0-20 ms
(seeded) so that file events do not coalesce artificially. A few warm-up records are not
counted. The resolution is bounded by the duration of one scrape (the value may land just after
a scrape started), so every scrape is timed too and reported next to the latencies.

Two cases: the default inotify observer, and the polling observer (``poll=True``,
``poll_interval=0.1``), for which a latency of up to about one poll interval is expected. In
the polling case the gap is drawn from 0 to one poll interval instead (``--poll-max-gap-ms``):
since each record is written right after the previous one was seen, i.e. right after a poll, a
0-20 ms gap would phase-lock the writes to the poll cycle and measure nearly a full interval
every time instead of a uniformly random phase.

``--no-keepalive`` (a diagnostic, off by default) opens a new TCP connection per scrape instead,
which separates the exporter's ingest latency from the cost of its keep-alive responses.

The exporter shares this process (and its GIL) with the polling client; on a 2-core machine that puts the client, the HTTP server thread, the watchdog thread
and the ingest thread on the same interpreter, so the numbers are an upper bound on what a
separate exporter process would show.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

from grpo_monitor.contract.keys import SIGNALS
from grpo_monitor.runtime.app import Exporter
from grpo_monitor.runtime.config import ExporterConfig
from grpo_monitor.sdk.writer import SnapshotWriter
from results_io import machine, write_result

RUN = "bench"
SERIES = b'\ngrpo_step{run="bench",rank="0"} '
WARMUP = 10
SEE_TIMEOUT_S = 5.0  # one record not seen within this counts as a miss
TARGET_P99_MS = 100.0


def _pct(sorted_ms: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_ms:
        return float("nan")
    k = max(0, min(len(sorted_ms) - 1, int(round(q * len(sorted_ms) + 0.5)) - 1))
    return sorted_ms[k]


def _summary(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {
        "n": len(s),
        "min_ms": s[0] if s else float("nan"),
        "p50_ms": statistics.median(s) if s else float("nan"),
        "p90_ms": _pct(s, 0.90),
        "p99_ms": _pct(s, 0.99),
        "max_ms": s[-1] if s else float("nan"),
        "mean_ms": statistics.fmean(s) if s else float("nan"),
    }


def _step_in(body: bytes) -> int | None:
    i = body.find(SERIES)  # grpo_step comes after its HELP/TYPE lines, so after a newline
    if i < 0:
        return None
    start = i + len(SERIES)
    end = body.find(b"\n", start)
    return int(body[start:end])


def _fs_type(path: str) -> str:
    """The filesystem type of the mount that holds ``path`` (from /proc/mounts)."""
    best, kind = "", "unknown"
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3:
                    mnt = parts[1]
                    if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                        best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def run_case(name: str, *, n: int, seed: int, max_gap_ms: float, poll: bool,
             poll_interval: float, keepalive: bool = True) -> dict[str, object]:
    rng = random.Random(seed)
    keys = [s.key for s in SIGNALS]
    tmp = tempfile.mkdtemp(prefix="grpo-bench-latency-")
    exporter: Exporter | None = None
    writer: SnapshotWriter | None = None
    session = requests.Session()
    session.headers["Accept-Encoding"] = "identity"
    latencies: list[float] = []
    scrapes: list[float] = []
    polls_per_record: list[int] = []
    misses = 0
    try:
        cfg = ExporterConfig(snapshot_dir=Path(tmp), listen_address="127.0.0.1:0",
                             poll=poll, poll_interval=poll_interval)
        exporter = Exporter(cfg).start()
        if not exporter.watcher.ready.wait(10):
            raise RuntimeError("exporter not ready after 10 s")
        url = exporter.url + "/metrics"
        writer = SnapshotWriter(tmp, RUN, rank=0, world_size=1)
        for i in range(WARMUP + n):
            step = i + 1
            metrics = {k: rng.random() * 10 ** rng.randint(-4, 3) for k in keys}
            time.sleep(rng.uniform(0.0, max_gap_ms) / 1000)
            t0 = time.perf_counter()
            if not writer.log(metrics, step):
                raise RuntimeError(f"writer dropped the record of step {step}")
            polls = 0
            seen_at = None
            while True:
                s0 = time.perf_counter()
                r = session.get(url) if keepalive else requests.get(url, headers=session.headers)
                body = r.content
                s1 = time.perf_counter()
                polls += 1
                if i >= WARMUP:
                    scrapes.append((s1 - s0) * 1000)
                r.raise_for_status()
                if _step_in(body) == step:
                    seen_at = s1
                    break
                if s1 - t0 > SEE_TIMEOUT_S:
                    break
            if i < WARMUP:
                continue
            if seen_at is None:
                misses += 1
            else:
                latencies.append((seen_at - t0) * 1000)
                polls_per_record.append(polls)
        return {
            "case": name,
            "observer": "polling" if poll else "inotify",
            "poll_interval_s": poll_interval if poll else None,
            "http": "keep-alive session" if keepalive else "new connection per scrape",
            "n": n,
            "warmup": WARMUP,
            "max_gap_ms": max_gap_ms,
            "missed": misses,
            "latency": _summary(latencies),
            "scrape": _summary(scrapes),
            "scrape_body_bytes": len(body),
            "scrapes_per_record_median": statistics.median(polls_per_record) if polls_per_record else None,
            "filesystem": _fs_type(tmp),
        }
    finally:
        session.close()
        if writer is not None:
            writer.close()
        if exporter is not None:
            exporter.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _print(r: dict) -> None:
    lat, scr = r["latency"], r["scrape"]
    print(f"{r['case']:>22}: latency p50 {lat['p50_ms']:6.1f}  p90 {lat['p90_ms']:6.1f}  "
          f"p99 {lat['p99_ms']:6.1f}  max {lat['max_ms']:6.1f} ms  (n={lat['n']}, missed {r['missed']})")
    print(f"{'':>22}  one scrape ({r['scrape_body_bytes']} B): p50 {scr['p50_ms']:.2f}  "
          f"p99 {scr['p99_ms']:.2f}  max {scr['max_ms']:.2f} ms; "
          f"{r['scrapes_per_record_median']} scrapes per record (median)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "latency.json")
    parser.add_argument("-n", type=int, default=300, help="timed records, inotify observer")
    parser.add_argument("--poll-n", type=int, default=300, help="timed records, polling observer "
                        "(0 skips the case)")
    parser.add_argument("--poll-interval", type=float, default=0.1, help="polling observer interval, s")
    parser.add_argument("--max-gap-ms", type=float, default=20.0, help="random gap between records, "
                        "uniform in [0, this]")
    parser.add_argument("--poll-max-gap-ms", type=float, default=None, help="random gap in the "
                        "polling case (default: one poll interval)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-keepalive", action="store_true", help="diagnostic: a new TCP "
                        "connection per scrape instead of one keep-alive session")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    cases = [run_case("inotify", n=args.n, seed=args.seed, max_gap_ms=args.max_gap_ms,
                      poll=False, poll_interval=1.0, keepalive=not args.no_keepalive)]
    _print(cases[-1])
    poll_gap_ms = args.poll_max_gap_ms
    if poll_gap_ms is None:
        poll_gap_ms = args.poll_interval * 1000
    if args.poll_n > 0:
        cases.append(run_case(f"polling {args.poll_interval:g}s", n=args.poll_n, seed=args.seed + 1,
                              max_gap_ms=poll_gap_ms, poll=True,
                              poll_interval=args.poll_interval, keepalive=not args.no_keepalive))
        _print(cases[-1])
    p99 = cases[0]["latency"]["p99_ms"]  # type: ignore[index]
    result = {
        "benchmark": "snapshot write -> visible in /metrics",
        "keys_per_record": len(SIGNALS),
        "seed": args.seed,
        "keepalive": not args.no_keepalive,
        "cases": cases,
        "target": {"inotify_p99_ms": TARGET_P99_MS, "met": p99 <= TARGET_P99_MS},
        **machine(),
        "wall_s": round(time.perf_counter() - started, 1),
        "time": time.time(),
    }
    print(f"inotify p99 {p99:.1f} ms vs target {TARGET_P99_MS:.0f} ms: "
          f"{'met' if result['target']['met'] else 'MISSED'}")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

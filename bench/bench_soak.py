"""A soak: many ranks writing through SnapshotWriter for minutes, rotation included, while the real
Prometheus scrapes the exporter every second; is every record ingested, and is memory flat?

Usage: python bench/bench_soak.py [--out PATH] [--duration S] [--ranks N] [--rate HZ]
       [--writer-processes N] [--sample-interval S] [--rotations N] [--keep-segments N]
       [--seed N]

Method (the harness is tests/soak.py, shared with tests/test_soak.py, which runs it short):
- the exporter runs as `python -m grpo_monitor.cli serve --snapshot.dir DIR --web.listen-address
  127.0.0.1:PORT --no-collector.gpu`, a subprocess; `prometheus` scrapes it every second (the
  committed prometheus.yml and rule files, intervals 1 s, no Alertmanager);
- --ranks ranks (default 64) write grpo_monitor.tools.simulate's healthy run through the real
  SnapshotWriter, --rate records/s each (default 10) for --duration seconds (default 600): rank 0
  every training key, its by_type breakdown and the perf keys, the others their perf keys. A
  rank is no process of its own (64 would swamp 2 cores): each of --writer-processes processes
  (default 4) paces its ranks on the wall clock, one step at a time, and writes a late step at
  once, so each rank writes exactly duration x rate records, steps 1..N. Each rank's max_bytes is sized from its own
  record so that it rotates about --rotations times (default 5), keeping --keep-segments
  segments (default 2): old segments are deleted while the exporter follows them;
- every --sample-interval seconds (default 2): the exporter's VmRSS (/proc/PID/status), one
  timed GET of /metrics (keep-alive, identity, whole body read) and the exporter's own series
  in it (process_resident_memory_bytes, process_cpu_seconds_total, the error counters,
  grpo_snapshot_files);
- at the end, from Prometheus: every scrape of the run (the raw samples of `up` and
  `scrape_duration_seconds` over a range selector), and the alerts that fired.

What it asserts (exit status 1 if any fails, the result file written anyway):
- tests/soak.py's problems(): every record each rank wrote applied exactly once, up to its last
  step, its end marked; no grpo_snapshot_errors_total, no grpo_exporter_internal_errors_total;
  grpo_snapshot_files equal to the files on disk at the end and bounded during the run;
- memory flat after the warm-up (the first 20% of the run): the least-squares slope of VmRSS
  over time, from the warm-up to the writers' end, times 3600, at most TARGET_GROWTH_MIB_H.
Reported, not asserted: the scrape latency (p50/p99, Prometheus' and ours) in the first and
the last fifth of the run, scrapes that failed, the exporter's CPU, the alerts that fired.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from soak import SoakConfig, SoakResult, problems, run_soak  # noqa: E402

from results_io import machine, summary_us, write_result  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "soak.json"
WARMUP_FRACTION = 0.2
# The exporter's state is bounded (400 steps of history per key and rank, one file state per
# file on disk), so after the warm-up its RSS should not trend. 10 MiB/h leaves room for the
# allocator's noise over a few minutes of samples; a leak of one small object per record
# (64 ranks x 10/s = 2.3M records/h) is far above it.
TARGET_GROWTH_MIB_H = 10.0
MIB = 2**20


def slope_per_s(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over t."""
    if len(points) < 2:
        return float("nan")
    mt = statistics.fmean(t for t, _ in points)
    my = statistics.fmean(y for _, y in points)
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / var if var else float("nan")


def _fifths(points: list[tuple[float, float]], duration: float) -> dict[str, Any]:
    """summary_us of the seconds in ``points`` (t, seconds) in the first and last fifth."""
    def pick(lo: float, hi: float) -> dict[str, Any]:
        ns = [int(s * 1e9) for t, s in points if lo <= t < hi and s == s]
        return {"n": len(ns), **(summary_us(ns) if ns else {})}
    return {"first_fifth": pick(0.0, duration / 5), "last_fifth": pick(duration * 4 / 5, duration)}


def summarise(result: SoakResult, found: list[str]) -> dict[str, Any]:
    c = result.config
    during = [s for s in result.samples if 0 <= s.t <= result.writers_done_s]
    warm = [s for s in during if s.t >= WARMUP_FRACTION * c.duration_s]
    rss_growth = slope_per_s([(s.t, s.vmrss_bytes) for s in warm]) * 3600 / MIB
    own_rss = [(s.t, s.health["process_resident_memory_bytes"]) for s in warm
               if "process_resident_memory_bytes" in s.health]
    own_growth = slope_per_s(own_rss) * 3600 / MIB
    cpu = [(s.t, s.health["process_cpu_seconds_total"]) for s in during
           if "process_cpu_seconds_total" in s.health]
    written = sum(w.records for w in result.written)
    ingested = result.value("grpo_snapshots_ingested_total", shape="native")
    scrapes = result.prometheus_scrapes
    memory_met = rss_growth <= TARGET_GROWTH_MIB_H
    return {
        "benchmark": "soak: ranks writing through SnapshotWriter with rotation, the exporter "
                     "a subprocess scraped by Prometheus every second",
        "ranks": c.ranks,
        "rate_hz_per_rank": c.rate_hz,
        "duration_s": c.duration_s,
        "writer_processes": c.writer_processes,
        "records_per_rank": c.records_per_rank,
        "max_bytes": {"rank_0": result.max_bytes.get(0),
                      "other_ranks_median": statistics.median(
                          b for r, b in result.max_bytes.items() if r != 0) if c.ranks > 1 else None},
        "keep_segments": c.keep_segments,
        "rotations_per_rank": {"min": min(result.rotations.values(), default=0),
                               "max": max(result.rotations.values(), default=0)},
        "ingest": {
            "records_written": written,
            "expected_ingested": written + len(result.written),  # + one run_end mark per rank
            "grpo_snapshots_ingested_total": ingested,
            "writers_max_lateness_s": round(result.max_lateness_s, 3),
            "writers_done_s": round(result.writers_done_s, 1),
            "all_ingested_s": round(result.drained_s, 1),
        },
        "memory": {
            "warmup_s": WARMUP_FRACTION * c.duration_s,
            "samples_after_warmup": len(warm),
            "vmrss_mib": {
                "first": during[0].vmrss_bytes / MIB if during else None,
                "after_warmup": warm[0].vmrss_bytes / MIB if warm else None,
                "end": during[-1].vmrss_bytes / MIB if during else None,
                "max": max(s.vmrss_bytes for s in during) / MIB if during else None,
            },
            "vmrss_growth_mib_per_hour": round(rss_growth, 2),
            "process_resident_memory_growth_mib_per_hour": round(own_growth, 2),
            "target_growth_mib_per_hour": TARGET_GROWTH_MIB_H,
            "met": memory_met,
            "vmrss_samples_mib": [[round(s.t, 1), round(s.vmrss_bytes / MIB, 2)] for s in during],
        },
        "scrape": {
            "prometheus_scrape_duration": _fifths([(t, d) for t, up, d in scrapes if up == 1],
                                                  c.duration_s),
            "own_get": _fifths([(s.t, s.get_s) for s in during if s.get_s is not None],
                               c.duration_s),
            "prometheus_scrapes": len(scrapes),
            "prometheus_failed_scrapes": sum(1 for _, up, _ in scrapes if up != 1),
        },
        "exporter_cpu_cores": round((cpu[-1][1] - cpu[0][1]) / (cpu[-1][0] - cpu[0][0]), 3)
        if len(cpu) > 1 and cpu[-1][0] > cpu[0][0] else None,
        "files": {"tracked_at_end": result.value("grpo_snapshot_files"),
                  "on_disk_at_end": result.files_on_disk,
                  "max_tracked": max((s.health.get("grpo_snapshot_files", 0) for s in during),
                                     default=None)},
        "errors_counted": {series: v for series, v in result.samples[-1].health.items()
                           if "error" in series and v} if result.samples else None,
        "alerts_fired": result.alerts_fired,
        "problems": found,
        "passed": not found and memory_met,
    }


def _print(r: dict[str, Any]) -> None:
    ing, mem, scr = r["ingest"], r["memory"], r["scrape"]
    print(f"{r['ranks']} ranks x {r['rate_hz_per_rank']:g}/s for {r['duration_s']:g} s: "
          f"{ing['records_written']} records written, grpo_snapshots_ingested_total "
          f"{ing['grpo_snapshots_ingested_total']} (expected {ing['expected_ingested']}); "
          f"rotations per rank {r['rotations_per_rank']['min']}-{r['rotations_per_rank']['max']}")
    v = mem["vmrss_mib"]
    print(f"  RSS {v['first']:.1f} -> {v['after_warmup']:.1f} (after warm-up) -> {v['end']:.1f} MiB"
          f" (max {v['max']:.1f}); growth after warm-up {mem['vmrss_growth_mib_per_hour']:+.2f} MiB/h"
          f" (own gauge {mem['process_resident_memory_growth_mib_per_hour']:+.2f}), target "
          f"<= {mem['target_growth_mib_per_hour']:g}: {'met' if mem['met'] else 'MISSED'}")
    for label, fifths in (("Prometheus scrape_duration", scr["prometheus_scrape_duration"]),
                          ("own GET /metrics", scr["own_get"])):
        parts = [f"{name.replace('_', ' ')} p50 {f['median_us'] / 1000:.1f} p99 "
                 f"{f['p99_us'] / 1000:.1f} ms (n={f['n']})"
                 for name, f in fifths.items() if f["n"]]
        print(f"  {label}: " + "; ".join(parts))
    print(f"  {scr['prometheus_scrapes']} Prometheus scrapes, {scr['prometheus_failed_scrapes']} "
          f"failed; exporter CPU {r['exporter_cpu_cores']} cores; files tracked "
          f"{r['files']['tracked_at_end']} / on disk {r['files']['on_disk_at_end']} (max "
          f"{r['files']['max_tracked']}); alerts fired: {r['alerts_fired'] or 'none'}")
    for p in r["problems"]:
        print(f"  PROBLEM: {p}")


def main(argv: list[str] | None = None) -> int:
    d = SoakConfig()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--duration", type=float, default=d.duration_s, help="seconds of writing")
    ap.add_argument("--ranks", type=int, default=d.ranks)
    ap.add_argument("--rate", type=float, default=d.rate_hz, help="records per second per rank")
    ap.add_argument("--writer-processes", type=int, default=d.writer_processes)
    ap.add_argument("--sample-interval", type=float, default=d.sample_interval_s)
    ap.add_argument("--rotations", type=int, default=d.rotations,
                    help="about how often each rank rotates in the run")
    ap.add_argument("--keep-segments", type=int, default=d.keep_segments)
    ap.add_argument("--seed", type=int, default=d.seed)
    args = ap.parse_args(argv)
    config = SoakConfig(ranks=args.ranks, rate_hz=args.rate, duration_s=args.duration,
                        writer_processes=args.writer_processes,
                        sample_interval_s=args.sample_interval, rotations=args.rotations,
                        keep_segments=args.keep_segments, seed=args.seed)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="grpo-bench-soak-") as tmp:
        result = run_soak(config, Path(tmp), progress=lambda msg: print(msg, flush=True))
    found = problems(result)
    report = {**summarise(result, found), **machine(),
              "wall_s": round(time.perf_counter() - started, 1), "time": time.time()}
    _print(report)
    write_result(args.out, report)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

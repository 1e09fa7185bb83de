"""Per-call cost of SnapshotWriter.log() for a 30-key float dict, next to json.dumps alone.

Usage: python bench/bench_writer.py [--out PATH] [-n N]

log() runs once per training step in every rank, so its cost must stay in the tens of
microseconds. json.dumps of the same dict is the floor the writer cannot beat; the gap between
the two is the writer's own overhead (line assembly, the lock, one os.write).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from grpo_monitor import SnapshotWriter
from results_io import machine, write_result

WARMUP = 2000


def _metrics() -> dict[str, float]:
    # Values as they come out of Tensor.tolist() of float32 statistics: full 17-digit reprs,
    # which is what makes float formatting the dominant cost.
    rng = random.Random(0)
    return {f"signal/{i:02d}": rng.random() * 10**rng.randint(-4, 3) for i in range(30)}


def _time_calls(fn: Callable[[int], object], n: int) -> list[int]:
    for i in range(WARMUP):
        fn(i)
    out = [0] * n
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        fn(i)
        out[i] = clock() - t0
    return out


def _summary(ns: list[int]) -> dict[str, float]:
    s = sorted(ns)

    def pick(q: float) -> float:
        return s[min(int(q * len(s)), len(s) - 1)] / 1000

    return {"median_us": statistics.median(s) / 1000, "p90_us": pick(0.90),
            "p99_us": pick(0.99), "mean_us": statistics.fmean(s) / 1000}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "writer.json")
    parser.add_argument("-n", type=int, default=20000, help="timed calls per case")
    args = parser.parse_args(argv)

    metrics = _metrics()
    with tempfile.TemporaryDirectory() as tmp:
        with SnapshotWriter(tmp, "bench", rank=0, world_size=1) as writer:
            log_ns = _time_calls(lambda step: writer.log(metrics, step), args.n)
            assert writer.dropped_records == 0, "the benchmark must not measure dropped records"
            line_bytes = os.path.getsize(writer.path) // (WARMUP + args.n)
    dumps_ns = _time_calls(lambda _: json.dumps(metrics), args.n)

    result = {
        "case": "SnapshotWriter.log, 30 float metrics",
        "n": args.n,
        "warmup": WARMUP,
        "line_bytes": line_bytes,
        "log": _summary(log_ns),
        "json_dumps": _summary(dumps_ns),
        **machine(),
        "time": time.time(),
    }
    for name in ("log", "json_dumps"):
        r = result[name]
        print(f"{name:>10}: median {r['median_us']:.1f} us  p90 {r['p90_us']:.1f} us  "
              f"p99 {r['p99_us']:.1f} us")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

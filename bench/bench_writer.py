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
import sys
import tempfile
import time
from pathlib import Path

from grpo_monitor import SnapshotWriter
from results_io import machine, summary_us, time_calls, write_result

WARMUP = 2000


def _metrics() -> dict[str, float]:
    # Values as they come out of Tensor.tolist() of float32 statistics: full 17-digit reprs,
    # which is what makes float formatting the dominant cost.
    rng = random.Random(0)
    return {f"signal/{i:02d}": rng.random() * 10**rng.randint(-4, 3) for i in range(30)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "writer.json")
    parser.add_argument("-n", type=int, default=20000, help="timed calls per case")
    args = parser.parse_args(argv)

    metrics = _metrics()
    with tempfile.TemporaryDirectory() as tmp:
        with SnapshotWriter(tmp, "bench", rank=0, world_size=1) as writer:
            log_ns = time_calls(lambda step: writer.log(metrics, step), args.n, WARMUP)
            assert writer.dropped_records == 0, "the benchmark must not measure dropped records"
            line_bytes = os.path.getsize(writer.path) // (WARMUP + args.n)
    dumps_ns = time_calls(lambda _: json.dumps(metrics), args.n, WARMUP)

    result = {
        "case": "SnapshotWriter.log, 30 float metrics",
        "n": args.n,
        "warmup": WARMUP,
        "line_bytes": line_bytes,
        "log": summary_us(log_ns),
        "json_dumps": summary_us(dumps_ns),
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

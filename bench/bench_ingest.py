"""Records per second per core through the exporter's ingest: read, parse, validate, features and
pre-render, in one thread.

Usage: python bench/bench_ingest.py [--ranks 64] [--steps 500] [-n 3] [--out PATH]

Method. A healthy simulated job (tools/simulate.py, seed 0) is written through the real
SnapshotWriter into a temporary folder, twice: "perf", ranks 1..--ranks alone (4 perf keys a
record: what every rank but rank 0 logs, the bulk of a large job's records), and "training",
rank 0 alone for the same steps (every training key and its perf keys, by prompt type: ~45
keys a record). For each, a fresh RunStore and Ingestor (no watcher, no HTTP) run one rescan,
the start-up replay, and a store flush (the pre-render), timed with perf_counter(); the best of
-n runs is kept, records / seconds reported. One thread: this is the rate of one core.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_io import machine, write_result  # noqa: E402

from grpo_monitor.runtime.health import ExporterHealth  # noqa: E402
from grpo_monitor.runtime.ingest import Ingestor  # noqa: E402
from grpo_monitor.runtime.store import RunStore  # noqa: E402
from grpo_monitor.sdk.writer import SnapshotWriter  # noqa: E402
from grpo_monitor.tools import simulate  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "ingest.json"


def write(folder: Path, ranks: range, world: int, steps: int) -> int:
    writers = {r: SnapshotWriter(folder, "bench", rank=r, world_size=world) for r in ranks}
    written = simulate.write_steps(writers, simulate.generate("healthy", steps=steps, ranks=world))
    for w in writers.values():
        w.close(end=False)
    return sum(written.records.values())


def rate(folder: Path, records: int, n: int) -> float:
    best = float("inf")
    for _ in range(n):
        store = RunStore()
        ingestor = Ingestor(folder.resolve(), store, ExporterHealth())
        t0 = time.perf_counter()
        ingestor.rescan()
        store.flush()
        best = min(best, time.perf_counter() - t0)
    return records / best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    out: dict[str, object] = {"source": "bench/bench_ingest.py", "ranks": args.ranks, "steps": args.steps}
    with tempfile.TemporaryDirectory(prefix="grpo-ingest-bench-") as tmp:
        for kind, ranks in (("perf", range(1, args.ranks + 1)), ("training", range(0, 1))):
            folder = Path(tmp) / kind
            records = write(folder, ranks, args.ranks + 1, args.steps)
            per_s = rate(folder, records, args.n)
            out[kind] = {"records": records, "records_per_s": round(per_s)}
            print(f"{kind:>8}: {records:>7,} records, {per_s:>9,.0f} records/s on one core", flush=True)
    write_result(args.out, {**out, "machine": machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

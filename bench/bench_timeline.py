"""What a run's timeline costs (docs/signals.md#a-runs-timeline): the store's memory, which keeps
each key's history for a rewind, and the time of one rewind.

Usage: python bench/bench_timeline.py [--out PATH]

Method. A healthy simulated job (tools/simulate.py, seed 0) is written through SnapshotWriter:
64 ranks x 500 steps (every rank's perf keys, rank 0's ~45 training keys) and rank 0 alone x
2,000 steps. A fresh RunStore and Ingestor replay each folder under tracemalloc; the memory they
hold after the replay and a flush is reported. Then rank 0 of the 2,000-step run rolls back
(a rollback mark to step 1,950, then the next step), 20 times over on copies of the store's
rank: the median time of the rewind itself is reported.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_io import machine, write_result  # noqa: E402

from grpo_monitor.runtime.health import ExporterHealth  # noqa: E402
from grpo_monitor.runtime.ingest import Ingestor  # noqa: E402
from grpo_monitor.runtime.store import RunStore  # noqa: E402
from grpo_monitor.sdk.writer import SnapshotWriter  # noqa: E402
from grpo_monitor.tools.simulate import generate, write_steps  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "timeline.json"


def replayed(ranks: int, steps: int) -> tuple[RunStore, float]:
    """The store after replaying a written job, and the MiB it and the ingest hold."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        writers = [SnapshotWriter(root, "job", rank=r, world_size=ranks) for r in range(ranks)]
        write_steps(writers, generate("healthy", steps=steps, ranks=ranks, step_seconds=1.0))
        for w in writers:
            w.close()
        tracemalloc.start()
        store = RunStore()
        ingestor = Ingestor(root, store, ExporterHealth())
        ingestor.rescan()
        store.flush()
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return store, held / 2**20


def rewind_ms(store: RunStore, keep_through: int, n: int = 20) -> float:
    rank = store.runs()[0].ranks[0]
    times = []
    for _ in range(n):
        copied = copy.deepcopy(rank)
        t0 = time.perf_counter()
        copied.rewind(keep_through)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    _, job_mib = replayed(64, 500)
    store, rank0_mib = replayed(1, 2000)
    ms = rewind_ms(store, 1950)
    print(f"store + ingest after the replay: 64 ranks x 500 steps {job_mib:.1f} MiB; "
          f"rank 0 x 2,000 steps {rank0_mib:.1f} MiB")
    print(f"one rewind of rank 0 (2,000 steps, ~45 keys) by 50 steps: {ms:.2f} ms")
    write_result(args.out, {"machine": machine(), "job_64x500_mib": round(job_mib, 2),
                            "rank0_2000_mib": round(rank0_mib, 2), "rewind_ms": round(ms, 3)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

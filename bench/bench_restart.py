"""A restart of the exporter with a saved state (--storage.path) against one that reads every file.

Usage: python bench/bench_restart.py [--jobs 64x400,64x4000] [--out PATH]

Method. For each job RANKSxSTEPS:
1. A healthy simulated job (tools/simulate.py, seed 0) is written through the real
   SnapshotWriter, live (no run end): rank 0 logs every training key, every rank its perf keys.
2. An Exporter with --storage.path on an empty state folder starts (no saved state: it reads
   every record, as every start-up did before saved states). ``full_read_s``: perf_counter()
   from start() to the watcher's ready event (/-/ready turns 200 then), the replay included.
3. A clean stop saves the state: ``save_s`` (the save alone, the exporter's
   grpo_exporter_state_last_save_duration_seconds) and ``state_mib``.
4. A second Exporter on the same folders starts: ``restart_s``, start() to ready. Its run
   series (every exposition line with a run label) are compared with the first exporter's:
   ``same_exposition``.
The time of a restart follows the saved state's size, which is bounded (400 steps of history
per key, the baseline, counters): flat in steps, linear in ranks.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from results_io import machine, write_result  # noqa: E402

from grpo_monitor.runtime.app import Exporter  # noqa: E402
from grpo_monitor.runtime.config import ExporterConfig  # noqa: E402
from grpo_monitor.sdk.writer import SnapshotWriter  # noqa: E402
from grpo_monitor.tools import simulate  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "restart.json"


def write_job(snapshots: Path, ranks: int, steps: int) -> int:
    writers = [SnapshotWriter(snapshots, "bench", rank=r, world_size=ranks) for r in range(ranks)]
    start = time.time() - steps * 5.0
    written = simulate.write_steps(writers, simulate.generate("healthy", steps=steps, ranks=ranks,
                                                              start_time=start))
    for w in writers:
        w.close(end=False)
    return sum(written.records.values())


def run_series(exporter: Exporter) -> list[str]:
    exporter.store.flush()
    return [line for line in "".join(exporter.store.render()).splitlines() if '{run="' in line]


def timed_start(config: ExporterConfig) -> tuple[Exporter, float]:
    t0 = time.perf_counter()
    exporter = Exporter(config).start()
    if not exporter.watcher.ready.wait(3600):
        raise RuntimeError("exporter not ready after an hour")
    return exporter, time.perf_counter() - t0


def measure(ranks: int, steps: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="grpo-restart-bench-") as tmp:
        snapshots, state = Path(tmp) / "snapshots", Path(tmp) / "state"
        snapshots.mkdir()
        records = write_job(snapshots, ranks, steps)
        config = ExporterConfig(snapshot_dir=snapshots, listen_address="127.0.0.1:0", storage_path=state,
                                gpu_collector=False, storage_save_interval=1e9)
        first, full_read_s = timed_start(config)
        before = run_series(first)
        first.stop()
        reg = first.health.registry
        save_s = reg.get_sample_value("grpo_exporter_state_last_save_duration_seconds")
        state_bytes = reg.get_sample_value("grpo_exporter_state_bytes")
        second, restart_s = timed_start(config)
        restored = second.health.registry.get_sample_value("grpo_exporter_state_restores_total",
                                                           {"result": "restored"})
        after = run_series(second)
        second.stop()
    return {"ranks": ranks, "steps": steps, "records": records, "series": len(before),
            "full_read_s": round(full_read_s, 2), "restart_s": round(restart_s, 2),
            "save_s": round(save_s or 0.0, 3), "state_mib": round((state_bytes or 0) / 2**20, 1),
            "restored": restored == 1, "same_exposition": before == after}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="64x400,64x4000",
                    help="comma-separated RANKSxSTEPS (default 64x400,64x4000, what make bench runs; "
                         "the docs' table: 64x400,1024x400,64x4000,64x20000,1024x2000,4096x400)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    results = []
    for job in args.jobs.split(","):
        ranks, steps = (int(x) for x in job.split("x"))
        r = measure(ranks, steps)
        results.append(r)
        print(f"{ranks:>5} ranks x {steps:>6} steps ({r['records']:>9,} records, {r['series']:>7,} series): "
              f"full read {r['full_read_s']} s, restart {r['restart_s']} s (save {r['save_s']} s, "
              f"{r['state_mib']} MiB), same exposition: {r['same_exposition']}", flush=True)
    write_result(args.out, {"source": "bench/bench_restart.py", "jobs": results, "machine": machine()})
    return 0 if all(r["restored"] and r["same_exposition"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

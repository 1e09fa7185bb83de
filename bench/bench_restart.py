"""A restart of the exporter with a saved state (--storage.path), and the first start of the next
release on it, against a first start that reads every file.

Usage: python bench/bench_restart.py [--jobs 64x400,64x4000] [--keep DIR] [--whole]
                                     [--first-start-only] [--out PATH]

Method. For each job RANKSxSTEPS:
1. A healthy simulated job (tools/simulate.py, seed 0) is written through the real
   SnapshotWriter, live (no run end): rank 0 logs every training key, every rank its perf keys
   (``disk_mib``: its files' size). --keep DIR keeps the jobs there and reuses those written.
2. An Exporter with --storage.path on an empty state folder starts (no saved state: it reads
   each file's head and tail, and the middles after ready: the backfill). ``first_start_s``:
   perf_counter() from start() to the watcher's ready event (/-/ready turns 200 then);
   ``every_rank_s``: to the last tail a first start leaves for after ready read (the ranks of
   perf signals alone: grpo_exporter_deferred_tail_files 0), when every rank is served;
   ``history_s``: from start() to the backfill's end (grpo_exporter_partial_runs 0), when every
   series is the whole read's. With --whole, an exporter that reads every file before ready
   (--snapshot.backfill-above-bytes 0) starts too: ``whole_start_s``, and its run series compared
   with the first's once that one's backfill is done: ``same_as_whole``.
3. A clean stop saves the state: ``save_s`` (the save alone, the exporter's
   grpo_exporter_state_last_save_duration_seconds) and ``state_mib``.
4. A second Exporter on the same folders starts: ``restart_s``, start() to ready. Its run
   series (every exposition line with a run label) are compared with the first exporter's:
   ``same_exposition``.
5. The next release: a copy of the installed package with a comment added to every module the
   state holds objects of and another version number, in a new process, starts on the same
   folders: ``upgrade_restart_s``, start() to ready (the process's own start-up not counted),
   and its run series compared with the first exporter's: ``upgrade_same_exposition``.
With --first-start-only, step 2 ends once every rank is served (``first_start_s``,
``every_rank_s``): no backfill, no restart
(a 20,000-step job's backfill takes a whole read: 7 to 20 minutes at 1,024 ranks, by machine).
A restart costs the saved state's size, which is bounded (800 to 1,200 values of history per
key, the baseline, counters): flat in steps, linear in ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from polling import wait_for  # noqa: E402
from results_io import machine, write_result  # noqa: E402

import grpo_monitor  # noqa: E402
from grpo_monitor.runtime.app import Exporter  # noqa: E402
from grpo_monitor.runtime.config import ExporterConfig  # noqa: E402
from grpo_monitor.sdk.writer import SnapshotWriter  # noqa: E402
from grpo_monitor.tools import simulate  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "restart.json"
FIRST_START_OUT = DEFAULT_OUT.with_name("first_start.json")  # --first-start-only


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


def drained(exporter: Exporter, gauge: str, timeout: float, what: str) -> None:
    """Wait until the exporter's own ``gauge`` reads 0: the first start's deferred tails
    (grpo_exporter_deferred_tail_files: every rank served) or its backfill
    (grpo_exporter_partial_runs: every run read whole)."""
    wait_for(lambda: exporter.health.registry.get_sample_value(gauge) == 0, timeout=timeout,
             interval=0.02, what=what)


# The next release's start, in its own process: its package first on the path.
UPGRADED_START = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import grpo_monitor
from grpo_monitor.runtime.app import Exporter
from grpo_monitor.runtime.config import ExporterConfig
assert grpo_monitor.__file__.startswith(sys.argv[1]), grpo_monitor.__file__
config = ExporterConfig(snapshot_dir=Path(sys.argv[2]), listen_address="127.0.0.1:0", gpu_collector=False,
                        storage_path=Path(sys.argv[3]), storage_save_interval=1e9, run_timeout=30 * 86400)
t0 = time.perf_counter()
exporter = Exporter(config).start()
assert exporter.watcher.ready.wait(3600)
ready_s = time.perf_counter() - t0
exporter.store.flush()
lines = [l for l in "".join(exporter.store.render()).splitlines() if '{run="' in l]
restored = exporter.health.registry.get_sample_value("grpo_exporter_state_restores_total", {"result": "restored"})
exporter.stop()
Path(sys.argv[4]).write_text(json.dumps({"ready_s": ready_s, "restored": restored, "lines": lines}))
"""


def next_release(into: Path) -> Path:
    """A copy of the installed package as the next release would be: another version, and a
    change to each module whose classes the state holds."""
    from grpo_monitor.runtime import state_codec

    package = into / "grpo_monitor"
    shutil.copytree(Path(grpo_monitor.__file__).parent, package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = package / "__init__.py"
    init.write_text(init.read_text().replace(f'"{grpo_monitor.__version__}"',
                                             f'"{grpo_monitor.__version__}.next"'))
    for module in {c.cls.__module__ for c in state_codec.CLASSES}:
        path = into / (module.replace(".", "/") + ".py")
        path.write_text(path.read_text() + "\n# the next release\n")
    return into


def upgraded_start(snapshots: Path, state: Path, work: Path) -> dict[str, object]:
    release = next_release(work / "next-release")
    out = work / "upgraded.json"
    subprocess.run([sys.executable, "-c", UPGRADED_START, str(release), str(snapshots), str(state), str(out)],
                   check=True)
    return json.loads(out.read_text())


def disk_mib(folder: Path) -> float:
    return round(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20, 1)


def first_start(ranks: int, steps: int, keep: Path | None) -> dict[str, object]:
    """Step 2 alone: start() to ready with no saved state, then a stop."""
    with tempfile.TemporaryDirectory(prefix="grpo-restart-bench-") as tmp:
        snapshots, records = written_job(keep or Path(tmp), ranks, steps)
        t0 = time.perf_counter()
        exporter, first_start_s = timed_start(bench_config(snapshots, Path(tmp) / "state"))
        drained(exporter, "grpo_exporter_deferred_tail_files", 3600, "every rank served")
        tails_s = time.perf_counter() - t0
        exporter.stop()
        return {"ranks": ranks, "steps": steps, "records": records, "disk_mib": disk_mib(snapshots),
                "first_start_s": round(first_start_s, 2), "every_rank_s": round(tails_s, 2)}


def written_job(folder: Path, ranks: int, steps: int) -> tuple[Path, int]:
    """The job's snapshot folder and its records' count, written unless kept from before."""
    job = folder / f"{ranks}x{steps}"
    snapshots, written = job / "snapshots", job / "records"
    if not written.exists():
        snapshots.mkdir(parents=True, exist_ok=True)
        written.write_text(str(write_job(snapshots, ranks, steps)))
    return snapshots, int(written.read_text())


def bench_config(snapshots: Path, state: Path) -> ExporterConfig:
    return ExporterConfig(snapshot_dir=snapshots, listen_address="127.0.0.1:0", storage_path=state,
                          gpu_collector=False, storage_save_interval=1e9, run_timeout=30 * 86400)


def measure(ranks: int, steps: int, keep: Path | None, whole: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="grpo-restart-bench-") as tmp:
        snapshots, records = written_job(keep or Path(tmp), ranks, steps)
        state = Path(tmp) / "state"
        config = bench_config(snapshots, state)
        t0 = time.perf_counter()
        first, first_start_s = timed_start(config)
        drained(first, "grpo_exporter_deferred_tail_files", 3600, "every rank served")
        every_rank_s = time.perf_counter() - t0
        drained(first, "grpo_exporter_partial_runs", 4 * 3600, "every run read whole")
        history_s = time.perf_counter() - t0
        before = run_series(first)
        first.stop()
        compared: dict[str, object] = {}
        if whole:
            reader, whole_start_s = timed_start(dataclasses.replace(config, storage_path=None,
                                                                    backfill_above_bytes=0))
            compared = {"whole_start_s": round(whole_start_s, 2), "same_as_whole": run_series(reader) == before}
            reader.stop()
            del reader
        reg = first.health.registry
        save_s = reg.get_sample_value("grpo_exporter_state_last_save_duration_seconds")
        state_bytes = reg.get_sample_value("grpo_exporter_state_bytes")
        del first, reg  # a restart is a new process: the first exporter's objects go first
        gc.collect()
        second, restart_s = timed_start(config)
        restored = second.health.registry.get_sample_value("grpo_exporter_state_restores_total",
                                                           {"result": "restored"})
        after = run_series(second)
        second.stop()
        upgraded = upgraded_start(snapshots, state, Path(tmp))
        disk = disk_mib(snapshots)
    return {"ranks": ranks, "steps": steps, "records": records, "disk_mib": disk,
            "series": len(before), "first_start_s": round(first_start_s, 2),
            "every_rank_s": round(every_rank_s, 2), "history_s": round(history_s, 1),
            **compared, "restart_s": round(restart_s, 2),
            "upgrade_restart_s": round(float(upgraded["ready_s"]), 2),  # type: ignore[arg-type]
            "save_s": round(save_s or 0.0, 3), "state_mib": round((state_bytes or 0) / 2**20, 1),
            "restored": restored == 1 and upgraded["restored"] == 1, "same_exposition": before == after,
            "upgrade_same_exposition": upgraded["lines"] == before}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="64x400,64x4000",
                    help="comma-separated RANKSxSTEPS (default 64x400,64x4000, what make bench runs; "
                         "the docs' table: 64x400,1024x400,4096x400,64x20000,1024x20000)")
    ap.add_argument("--keep", type=Path, help="keep the jobs here, and reuse those written")
    ap.add_argument("--whole", action="store_true",
                    help="also time a start-up that reads every file before ready, and compare")
    ap.add_argument("--first-start-only", action="store_true",
                    help="time the first start alone, to ready (no backfill, no restart)")
    ap.add_argument("--out", type=Path, help="where the results go (default results/restart.json, "
                                             "or results/first_start.json with --first-start-only)")
    args = ap.parse_args(argv)
    results = []
    for job in args.jobs.split(","):
        ranks, steps = (int(x) for x in job.split("x"))
        if args.first_start_only:
            r = first_start(ranks, steps, args.keep)
            results.append(r)
            print(f"{ranks:>5} ranks x {steps:>6} steps ({r['records']:>9,} records, {r['disk_mib']} MiB): "
                  f"first start {r['first_start_s']} s, every rank {r['every_rank_s']} s", flush=True)
            continue
        r = measure(ranks, steps, args.keep, args.whole)
        results.append(r)
        print(f"{ranks:>5} ranks x {steps:>6} steps ({r['records']:>9,} records, {r['disk_mib']} MiB, "
              f"{r['series']:>7,} series): first start {r['first_start_s']} s (every rank {r['every_rank_s']} s, "
              f"history read {r['history_s']} s"
              + (f", every file before ready {r['whole_start_s']} s, same: {r['same_as_whole']}" if args.whole else "")
              + f"), restart {r['restart_s']} s, "
              f"after an upgrade {r['upgrade_restart_s']} s (save {r['save_s']} s, {r['state_mib']} MiB), "
              f"same exposition: {r['same_exposition']}, {r['upgrade_same_exposition']}", flush=True)
    out = args.out or (FIRST_START_OUT if args.first_start_only else DEFAULT_OUT)
    write_result(out, {"source": "bench/bench_restart.py", "jobs": results, "machine": machine()})
    return 0 if args.first_start_only or all(r["restored"] and r["same_exposition"] and r["upgrade_same_exposition"]
                    and r.get("same_as_whole", True) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

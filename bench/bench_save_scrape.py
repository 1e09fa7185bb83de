"""How long a scrape waits while the exporter saves its state (--storage.path).

Usage: python bench/bench_save_scrape.py [--ranks 4096] [--steps 400] [-n 40] [--keep DIR] [--out PATH]

Method.
1. A healthy simulated job of --ranks ranks and --steps steps is written through the real
   SnapshotWriter (bench_restart.write_job), or found in --keep DIR from an earlier run, and a
   real Exporter with --storage.path reads it (or restores its saved state there).
2. Scrapes of /metrics over HTTP from another process, one after the other, -n of them: first with no save running
   (``idle``), then while another thread saves the whole state again and again (``saving``):
   each save forgets the encodings it kept, so it encodes every rank, as after a step of a live
   job in which every rank logged. (The exporter saves on its ingest thread; nothing is written
   to the job here, so the ingest thread is idle and the store holds still, as it does while the
   ingest thread saves.)
3. Each scrape's wall time, from the request to the last byte; per phase the median and the
   maximum, and the longest wait a save added: the ``saving`` maximum less the ``idle`` median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_restart import write_job
from results_io import machine, write_result

from grpo_monitor.runtime.app import Exporter
from grpo_monitor.runtime.config import ExporterConfig

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "save_scrape.json"


# The scraper runs in a process of its own, as Prometheus does: a client thread in the
# exporter's process would compete for its interpreter lock and be counted as the save's doing.
SCRAPER = """
import json, sys, time, urllib.request
out = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    with urllib.request.urlopen(sys.argv[1], timeout=60) as response:
        assert response.read()
    out.append(time.perf_counter() - t0)
print(json.dumps(out))
"""


def scrapes(url: str, n: int) -> list[float]:
    """Wall time of ``n`` scrapes of ``url``, one after the other, from another process."""
    done = subprocess.run([sys.executable, "-c", SCRAPER, url, str(n)], capture_output=True, text=True,
                          check=True, timeout=3600)
    return list(json.loads(done.stdout))


def measure(ranks: int, steps: int, n: int, keep: Path | None) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="grpo-save-scrape-") as tmp:
        work = (keep or Path(tmp)) / f"{ranks}x{steps}"
        snapshots, done = work / "snapshots", work / "written"
        if not done.exists():
            snapshots.mkdir(parents=True, exist_ok=True)
            write_job(snapshots, ranks, steps)
            done.touch()
        config = ExporterConfig(snapshot_dir=snapshots, listen_address="127.0.0.1:0", gpu_collector=False,
                                storage_path=work / "state", storage_save_interval=1e9,
                                run_timeout=30 * 86400)
        with Exporter(config) as exporter:
            if not exporter.watcher.ready.wait(3600):
                raise RuntimeError("exporter not ready after an hour")
            url = f"{exporter.url}/metrics"
            idle = scrapes(url, n)
            state, store, ingestor = exporter.watcher.state, exporter.store, exporter.watcher.ingestor
            assert state is not None
            stop, saves = threading.Event(), []

            def save_again_and_again() -> None:
                while not stop.is_set():
                    state._encoded.clear()  # every rank encoded again: the worst case
                    t0 = time.perf_counter()
                    state.save(store, ingestor)
                    saves.append(time.perf_counter() - t0)

            saver = threading.Thread(target=save_again_and_again, daemon=True)
            saver.start()
            saving = scrapes(url, n)
            stop.set()
            saver.join()
    return {"ranks": ranks, "steps": steps, "scrapes": n, "saves": len(saves),
            "save_s_median": round(statistics.median(saves), 3),
            "idle_ms": {"median": round(statistics.median(idle) * 1000, 1), "max": round(max(idle) * 1000, 1)},
            "saving_ms": {"median": round(statistics.median(saving) * 1000, 1),
                          "max": round(max(saving) * 1000, 1)},
            "longest_wait_for_a_save_ms": round((max(saving) - statistics.median(idle)) * 1000, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4096,
                    help="job size (default 4096, the docs' figure; make bench runs 1024)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("-n", type=int, default=40, help="scrapes per phase (default 40)")
    ap.add_argument("--keep", type=Path, help="keep the job and the exporter's state here, and use those there")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    r = measure(args.ranks, args.steps, args.n, args.keep)
    print(f"{r['ranks']} ranks x {r['steps']} steps: {r['saves']} saves of {r['save_s_median']} s; scrapes idle "
          f"{r['idle_ms']}, while saving {r['saving_ms']}; longest wait for a save "
          f"{r['longest_wait_for_a_save_ms']} ms", flush=True)
    write_result(args.out, {"source": "bench/bench_save_scrape.py", "result": r, "machine": machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

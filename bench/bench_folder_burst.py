"""How long new run folders take to appear in /metrics: a burst of them, one among many already
there, and a burst that overflows inotify's event queue.

Usage: python bench/bench_folder_burst.py [--out PATH] [--sizes 1000,10000] [--present 10000]
       [--trials 10] [--overflow 1000] [--timeout S]

Method. The exporter runs as ``python -m grpo_monitor.cli serve --no-collector.gpu`` (a
subprocess; its defaults otherwise, so the periodic rescan stays at 30 s and anything served
sooner came through file events or an overflow's rescan), on a fresh folder under tempfile's
directory. A run folder is made as a trainer makes one: ``mkdir``, then ``rank-0.jsonl`` holding
one record (a step and one canonical key), written and closed. ``/metrics`` is fetched back to
every 0.25 s over a new connection each time (``Accept-Encoding: identity``) and its
``grpo_step`` series are counted with ``bytes.count`` (parsing 10^4 runs at every poll would
cost more than what is measured); the time of a poll is when its body has been read, so the
resolution is 0.25 s plus one scrape. (Scraping back to back instead measures mostly the
scrapes: each holds the store while it joins thousands of runs.) The exporter's VmRSS is read
at the end of each case.

1. **burst**: N run folders made back to back on a running exporter (each ``--sizes``); the time
   from the first ``mkdir`` to the first scrape that shows all N, with the time the writes
   themselves took beside it.
2. **many present**: ``--present`` run folders there before the exporter starts (replayed before
   ``/-/ready``; the replay's duration is reported), then one new run folder at a time,
   ``--trials`` times: from its ``mkdir`` to the scrape that shows it.
3. **overflow**: the exporter stopped (SIGSTOP) while 9,000 files are made in a watched folder
   (two events each, past the kernel's 16,384-event queue) and then ``--overflow`` run folders,
   whose events the full queue drops; the time from SIGCONT to all of them shown.

Each case gives up after ``--timeout`` seconds and reports how many it saw by then. The exporter
is started with ``--metrics.max-runs`` above what the case makes when it has the flag, so the
same script measures an exporter without it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from grpo_monitor.tools.stack import free_port
from results_io import machine, write_result

STEP = b"\ngrpo_step{"
NOISE_FILES = 9000  # x2 events (create, close-after-write) > max_queued_events (16384)
POLL_S = 0.25


def record(i: int) -> bytes:
    return b'{"step": 1, "metrics": {"loss": %d.5}}\n' % (i % 10)


def make_runs(root: Path, names: range, prefix: str = "run") -> float:
    """Make the run folders; the seconds it took."""
    t0 = time.perf_counter()
    for i in names:
        folder = root / f"{prefix}-{i}"
        folder.mkdir()
        (folder / "rank-0.jsonl").write_bytes(record(i))
    return time.perf_counter() - t0


class Serve:
    """``grpo-monitor serve`` in a process of its own, default flags (``max_runs``: raised, where
    the release has the flag), scraped over HTTP; bench_abuse.py builds on it too."""

    def __init__(self, snapshot_dir: Path, log: Path, max_runs: int | None = None) -> None:
        argv = [sys.executable, "-m", "grpo_monitor.cli", "serve", "--snapshot.dir", str(snapshot_dir),
                "--no-collector.gpu"]
        if max_runs is not None:
            help_text = subprocess.run([*argv[:4], "--help"], capture_output=True, text=True).stdout
            if "--metrics.max-runs" in help_text:
                argv += ["--metrics.max-runs", str(max_runs)]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
        self.log = log.open("wb")
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen([*argv, "--web.listen-address", f"127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.session = requests.Session()
        self.session.headers["Accept-Encoding"] = "identity"

    def wait_ready(self, timeout: float) -> float:
        """Seconds from the start until /-/ready answers 200."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exporter exited with {self.proc.returncode}")
            try:
                if requests.get(f"{self.url}/-/ready", timeout=5).status_code == 200:
                    return time.perf_counter() - self.t0
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"exporter not ready after {timeout} s")

    def runs_shown(self) -> tuple[int, float]:
        """(grpo_step series in one scrape, seconds the scrape took)."""
        t0 = time.perf_counter()
        body = requests.get(f"{self.url}/metrics", timeout=60,
                            headers={"Accept-Encoding": "identity"}).content
        return body.count(STEP), time.perf_counter() - t0

    def wait_shown(self, n: int, since: float, timeout: float) -> dict[str, Any]:
        """Poll until ``n`` runs are shown: seconds from ``since`` (perf_counter), or how many by
        the deadline."""
        scrapes: list[float] = []
        shown = 0
        deadline = since + timeout
        while time.perf_counter() < deadline:
            shown, took = self.runs_shown()
            scrapes.append(took)
            if shown >= n:
                return {"seconds": time.perf_counter() - since, "shown": shown,
                        "scrapes": len(scrapes), "scrape_median_s": statistics.median(scrapes),
                        "rss_mib": self.rss_mib()}
            time.sleep(POLL_S)
        return {"seconds": None, "shown": shown, "gave_up_after_s": timeout,
                "scrape_median_s": statistics.median(scrapes) if scrapes else None}

    def rss_mib(self) -> float | None:
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        return kib / 1024

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def burst(tmp: Path, n: int, timeout: float) -> dict[str, Any]:
    snapshots = tmp / f"burst-{n}"
    snapshots.mkdir()
    serve = Serve(snapshots, tmp / f"burst-{n}.log", n + 10)
    try:
        serve.wait_ready(60)
        t0 = time.perf_counter()
        writes = make_runs(snapshots, range(n))
        result = serve.wait_shown(n, t0, timeout)
        return {"runs": n, "writes_s": writes, **result}
    finally:
        serve.stop()


def many_present(tmp: Path, present: int, trials: int, timeout: float) -> dict[str, Any]:
    snapshots = tmp / f"present-{present}"
    snapshots.mkdir()
    make_runs(snapshots, range(present))
    serve = Serve(snapshots, tmp / f"present-{present}.log", present + trials + 10)
    try:
        replay = serve.wait_ready(600)
        serve.wait_shown(present, time.perf_counter(), timeout)
        seconds: list[float] = []
        for i in range(trials):
            t0 = time.perf_counter()
            make_runs(snapshots, range(i, i + 1), prefix="new")
            result = serve.wait_shown(present + i + 1, t0, timeout)
            if result["seconds"] is None:
                return {"present": present, "replay_s": replay, "seconds": seconds,
                        "gave_up": result}
            seconds.append(result["seconds"])
        return {"present": present, "replay_s": replay, "trials": trials, "seconds": seconds,
                "median_s": statistics.median(seconds), "max_s": max(seconds),
                "scrape_median_s": result["scrape_median_s"]}
    finally:
        serve.stop()


def overflow(tmp: Path, n: int, timeout: float) -> dict[str, Any]:
    snapshots = tmp / f"overflow-{n}"
    noise = snapshots / "noise"
    noise.mkdir(parents=True)
    serve = Serve(snapshots, tmp / f"overflow-{n}.log", n + 10)
    try:
        serve.wait_ready(60)
        os.kill(serve.proc.pid, signal.SIGSTOP)
        for i in range(NOISE_FILES):
            os.close(os.open(noise / f"n{i}", os.O_CREAT | os.O_WRONLY))
        writes = make_runs(snapshots, range(n))
        t0 = time.perf_counter()
        os.kill(serve.proc.pid, signal.SIGCONT)
        result = serve.wait_shown(n, t0, timeout)
        overflowed = "Inotify queue overflowed" in Path(serve.log.name).read_text(errors="replace")
        return {"runs": n, "writes_s": writes, "overflow_logged": overflowed, **result}
    finally:
        serve.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "folder_burst.json")
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--present", type=int, default=10_000)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--overflow", type=int, default=1000)
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="grpo-bench-burst-"))
    result: dict[str, Any] = {"machine": machine(), "bursts": []}
    try:
        for n in (int(x) for x in args.sizes.split(",") if x):
            print(f"burst of {n} new run folders ...", flush=True)
            result["bursts"].append(burst(tmp, n, args.timeout))
            print(f"  {result['bursts'][-1]}", flush=True)
        if args.present:
            print(f"one new run folder among {args.present} ...", flush=True)
            result["many_present"] = many_present(tmp, args.present, args.trials, args.timeout)
            print(f"  {result['many_present']}", flush=True)
        if args.overflow:
            print(f"{args.overflow} new run folders behind an inotify overflow ...", flush=True)
            result["overflow"] = overflow(tmp, args.overflow, args.timeout)
            print(f"  {result['overflow']}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_result(args.out, result)


if __name__ == "__main__":
    main()

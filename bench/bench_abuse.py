"""One run's abuse stays its own: while one run folder is abused, how soon is another run's NaN
served, how large does the exporter grow, and is every reject counted?

Usage: python bench/bench_abuse.py [--out PATH] [--abuses quiet,rewinds,key_map,heldout,clock]
       [--scale 1.0] [--key-map-seconds 30] [--timeout S]

Method. For each case a fresh ``grpo-monitor serve --no-collector.gpu`` (a subprocess, default
flags otherwise) watches a fresh folder under tempfile's directory. In it a healthy run,
``victim``, is written through ``SnapshotWriter`` (one record of four canonical keys every
0.1 s) by this process; the abuse is written into another run folder by a second process
(``multiprocessing``), as fast as it can unless said otherwise:

- **quiet**: no abuse (the reference).
- **rewinds**: 1,200 ordinary steps (every key's history full), then 10,000 records whose step
  goes back every record (a sawtooth: 1,700, 1,699, ... 1,201, 1,700, ...), then 5,000 steps each
  followed by a rollback mark that undoes it (``SnapshotWriter.mark("rollback", from_step=...,
  to_step=...)``); every 100th mark is malformed (``to_step`` after ``from_step``).
- **key_map**: the run's ``.grpo-keys.toml`` replaced (``os.replace``) 100 times a second for
  ``--key-map-seconds``, alternating two valid maps of ~1,400 lines (62 KiB, just under the
  64 KiB limit) that map the run's names differently, while the run logs 200 records a second
  under those names; then a 1 MiB key map, then one nested 20,000 deep (each followed by a
  record, so the run reads it).
- **heldout**: 100,000 records of a held-out score (``eval/heldout_score``) and the training
  reward: 100,000 held-out points.
- **clock**: 20,000 records whose ``time`` jumps an hour ahead and an hour behind on every
  record, and every 100th a raw line whose ``time`` is a word.
- **repeats**: 100,000 records of one step (step 5: inside the baseline period and the initial
  steps), each with a NaN loss: a step logged again and again.

``--scale`` multiplies the abuses' record counts. While the abuse is written and until the
exporter has read all of it (its last record, a step of its own, served as ``grpo_step``), the
victim logs a NaN loss every ~2 s (at least 3 times): the latency is from that ``log()``'s
return to the first scrape (every 20 ms, over a new connection) whose
``grpo_nonfinite_values_total{run="victim"}`` counts it. The exporter's VmRSS is sampled every
0.2 s and its VmHWM read at the end (one exporter per case: the high-water mark is the case's).
Rejects are ``grpo_snapshot_errors_total{reason}`` at the end, against what the case wrote bad
on purpose; ``grpo_snapshots_ingested_total`` against the records written. ``caught_up_s``: from
the abuser's last write to its last record served: what the abuse cost its own run;
``exporter_cpu_s``: the exporter's CPU time over the case (``/proc/<pid>/stat``).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_folder_burst import Serve as FolderServe  # noqa: E402
from results_io import machine, write_result  # noqa: E402

from grpo_monitor.sdk.writer import SnapshotWriter  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "abuse.json"
ABUSES = ("quiet", "rewinds", "key_map", "heldout", "clock", "repeats")
FINAL_STEP = 10_000_000  # the abuser's last record: served as its grpo_step once all is read
POLL_S = 0.02
NAN_EVERY_S = 2.0
VICTIM_EVERY_S = 0.1
METRIC = re.compile(rb"^(grpo_[a-z_]+)\{([^}]*)\} (\S+)$", re.M)


def healthy(step: int) -> dict[str, float]:
    return {"loss": 0.5 + 0.01 * math.sin(step), "reward/mean": 0.3 + 0.001 * (step % 50),
            "kl/mean": 0.01 + 0.0001 * (step % 7), "entropy/mean": 1.2 - 0.001 * (step % 11)}


# -- the abusers (a process of their own) -------------------------------------------------------


def abuse_rewinds(root: Path, scale: float, done: Any) -> dict[str, int]:
    w = SnapshotWriter(root, "storm", rank=0, world_size=1, warn_unknown_keys=False)
    written = bad_marks = 0
    for step in range(1, 1201):
        w.log(healthy(step), step=step)
        written += 1
    for i in range(int(10_000 * scale)):  # a step older than the newest, every record
        step = 1700 - i % 500
        w.log(healthy(step), step=step)
        written += 1
    for i in range(int(5_000 * scale)):  # a step, then a rollback mark that undoes it
        step = 1701 + i
        w.log(healthy(step), step=step)
        if i % 100 == 99:
            w.mark("rollback", from_step=step, to_step=step + 5)  # malformed: counted
            bad_marks += 1
        else:
            w.mark("rollback", from_step=step, to_step=step - 1)
        written += 2
    done.set()
    w.log(healthy(FINAL_STEP), step=FINAL_STEP)
    w.close(end=False)
    return {"records": written + 1, "expected_rejects": {"invalid_events": bad_marks}}


def key_map_text(variant: int, lines: int) -> str:
    target = ("kl/mean", "entropy/mean")
    head = [f'"my_kl" = "{target[variant]}"', f'"my_entropy" = "{target[1 - variant]}"',
            '"my_reward" = { key = "reward/mean", scale = 0.5 }']
    filler = [f'"unused/name_{variant}_{i:05d}" = "response/len_mean"' for i in range(lines)]
    return "\n".join(head + filler) + "\n"


def abuse_key_map(root: Path, scale: float, done: Any, seconds: float) -> dict[str, Any]:
    folder = root / "keymap"
    folder.mkdir(parents=True, exist_ok=True)
    texts = [key_map_text(v, 1400).encode() for v in (0, 1)]
    tmp, target = folder / ".keys.tmp", folder / ".grpo-keys.toml"
    w = SnapshotWriter(root, "keymap", rank=0, world_size=1, warn_unknown_keys=False)
    written = rewrites = step = 0
    t0 = time.monotonic()
    next_map = next_record = t0
    while (now := time.monotonic()) < t0 + seconds:
        if now >= next_map:
            tmp.write_bytes(texts[rewrites % 2])
            os.replace(tmp, target)
            rewrites += 1
            next_map += 0.01
        if now >= next_record:
            step += 1
            w.log({"my_kl": 0.01, "my_entropy": 1.0, "my_reward": 0.4, "loss": 0.5}, step=step)
            written += 1
            next_record += 0.005
        time.sleep(max(0.0, min(next_map, next_record) - time.monotonic()))
    # A key map over the 64 KiB limit, then one nested deeper than a parser's stack: each read at
    # the run's next record, and refused (invalid_key_map).
    bad = [b'"x" = "' + b"a" * (1 << 20) + b'"\n', b"x = " + b"[" * 20_000 + b"]" * 20_000 + b"\n"]
    for text in bad:
        tmp.write_bytes(text)
        os.replace(tmp, target)
        time.sleep(0.5)  # the exporter reads the map at the run's next record after the change
        step += 1
        w.log({"my_kl": 0.01, "loss": 0.5}, step=step)
        written += 1
        time.sleep(0.5)
    done.set()
    w.log(healthy(FINAL_STEP), step=FINAL_STEP)
    w.close(end=False)
    return {"records": written + 1, "key_map_rewrites": rewrites, "key_map_bytes": len(texts[0]),
            "expected_rejects": {"invalid_key_map": len(bad)}}


def abuse_heldout(root: Path, scale: float, done: Any) -> dict[str, Any]:
    w = SnapshotWriter(root, "heldout", rank=0, world_size=1, warn_unknown_keys=False)
    n = int(100_000 * scale)
    for step in range(1, n + 1):
        w.log({"eval/heldout_score": 0.5 + 0.2 * math.sin(step / 1000) + 0.01 * math.sin(step),
               "reward/mean": 0.3 + 0.1 * math.sin(step / 700)}, step=step)
    done.set()
    w.log(healthy(FINAL_STEP), step=FINAL_STEP)
    w.close(end=False)
    return {"records": n + 1, "heldout_points": n, "expected_rejects": {}}


def abuse_clock(root: Path, scale: float, done: Any) -> dict[str, Any]:
    w = SnapshotWriter(root, "clock", rank=0, world_size=1, warn_unknown_keys=False)
    n = int(20_000 * scale)
    bad = 0
    start = time.time()
    with open(w.path, "ab", buffering=0) as raw:
        for step in range(1, n + 1):
            if step % 100 == 0:  # a word for a time: costs the time, not the record
                raw.write(b'{"step": %d, "time": "an hour ago", "metrics": {"loss": 0.5}}\n' % step)
                bad += 1
                continue
            w.log(healthy(step), step=step, timestamp=start + step * 0.01 + (3600 if step % 2 else -3600))
    done.set()
    w.log(healthy(FINAL_STEP), step=FINAL_STEP)
    w.close(end=False)
    return {"records": n + 1, "expected_rejects": {"invalid_time": bad}}


def abuse_repeats(root: Path, scale: float, done: Any) -> dict[str, Any]:
    w = SnapshotWriter(root, "repeats", rank=0, world_size=1, warn_unknown_keys=False)
    for step in range(1, 5):
        w.log(healthy(step), step=step)
    n = int(100_000 * scale)
    for i in range(n):
        w.log({**healthy(i), "loss": math.nan}, step=5)
    done.set()
    w.log(healthy(FINAL_STEP), step=FINAL_STEP)
    w.close(end=False)
    return {"records": n + 5, "expected_rejects": {}}


def abuser(kind: str, root: str, scale: float, key_map_seconds: float, done: Any, out: Any) -> None:
    path = Path(root)
    t0 = time.perf_counter()
    if kind == "rewinds":
        result = abuse_rewinds(path, scale, done)
    elif kind == "key_map":
        result = abuse_key_map(path, scale, done, key_map_seconds)
    elif kind == "heldout":
        result = abuse_heldout(path, scale, done)
    elif kind == "clock":
        result = abuse_clock(path, scale, done)
    elif kind == "repeats":
        result = abuse_repeats(path, scale, done)
    else:
        raise ValueError(kind)
    result["write_s"] = time.perf_counter() - t0
    out.put(result)


# -- the exporter -----------------------------------------------------------------------------


class Serve(FolderServe):
    """The exporter as bench_folder_burst.py runs it, with its RSS sampled while it works."""

    def __init__(self, snapshot_dir: Path, log: Path) -> None:
        super().__init__(snapshot_dir, log)
        self.log_path = log
        self.rss_peak_kib = 0
        self._sampling = threading.Event()
        self._sampler: threading.Thread | None = None

    def scrape(self) -> dict[tuple[str, str], float]:
        """(family, labels) -> value of the few families the bench reads."""
        body = requests.get(f"{self.url}/metrics", timeout=30,
                            headers={"Accept-Encoding": "identity"}).content
        out: dict[tuple[str, str], float] = {}
        for m in METRIC.finditer(body):
            name = m.group(1).decode()
            if name in ("grpo_nonfinite_values_total", "grpo_step", "grpo_snapshot_errors_total",
                        "grpo_snapshots_ingested_total", "grpo_run_step_interval_seconds",
                        "grpo_run_log_interval_seconds") or name.startswith("grpo_heldout_"):
                out[name, m.group(2).decode()] = float(m.group(3))
        return out

    def status(self) -> dict[str, int]:
        try:
            text = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return {}
        return {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()
                if line.startswith(("VmRSS:", "VmHWM:"))}

    def cpu_s(self) -> float:
        """CPU seconds the exporter has used (user + system), from /proc/<pid>/stat."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return math.nan
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def start_sampling(self) -> None:
        def sample() -> None:
            while not self._sampling.is_set():
                self.rss_peak_kib = max(self.rss_peak_kib, self.status().get("VmRSS", 0))
                self._sampling.wait(0.2)

        self._sampler = threading.Thread(target=sample, daemon=True)
        self._sampler.start()

    def stop(self) -> None:
        self._sampling.set()
        super().stop()


def victim_nans(scraped: dict[tuple[str, str], float]) -> float:
    return sum(v for (name, labels), v in scraped.items()
               if name == "grpo_nonfinite_values_total" and 'run="victim"' in labels)


def step_of(scraped: dict[tuple[str, str], float], run: str) -> float | None:
    return scraped.get(("grpo_step", f'run="{run}",rank="0"'))


def by_label(scraped: dict[tuple[str, str], float], family: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (name, labels), v in scraped.items():
        if name == family:
            m = re.search(rf'{label}="([^"]*)"', labels)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


def one_case(tmp: Path, kind: str, scale: float, key_map_seconds: float, timeout: float) -> dict[str, Any]:
    root = tmp / kind
    root.mkdir()
    serve = Serve(root, tmp / f"{kind}.log")
    ctx = multiprocessing.get_context("spawn")
    done, results = ctx.Event(), ctx.Queue()
    proc = None
    victim = SnapshotWriter(root, "victim", rank=0, world_size=1, warn_unknown_keys=False)
    vstep = 0
    latencies: list[float] = []
    missed = 0
    try:
        serve.wait_ready(60)
        rss_ready = serve.status().get("VmRSS", 0)
        serve.start_sampling()
        for _ in range(20):  # the victim exists and is served before the abuse starts
            vstep += 1
            victim.log(healthy(vstep), step=vstep)
        deadline = time.monotonic() + 30
        while step_of(serve.scrape(), "victim") != vstep and time.monotonic() < deadline:
            time.sleep(POLL_S)
        t_start, cpu_start = time.perf_counter(), serve.cpu_s()
        if kind != "quiet":
            proc = ctx.Process(target=abuser, args=(kind, str(root), scale, key_map_seconds, done, results))
            proc.start()
        abuser_result: dict[str, Any] = {}
        run_name = {"rewinds": "storm"}.get(kind, kind.replace("_", ""))
        state: dict[str, float | None] = {"written": None, "caught_up": None}

        def watch(scraped: dict[tuple[str, str], float] | None = None) -> None:
            """Note when the abuser finished writing and when its last record was served."""
            now = time.perf_counter()
            if state["written"] is None and proc is not None and done.is_set():
                state["written"] = now
            if state["caught_up"] is None and proc is not None:
                scraped = scraped if scraped is not None else serve.scrape()
                if step_of(scraped, run_name) == FINAL_STEP:
                    state["caught_up"] = now

        case_deadline = time.monotonic() + timeout
        while time.monotonic() < case_deadline:
            # A few healthy steps, then a NaN whose latency is measured.
            next_nan = time.monotonic() + NAN_EVERY_S
            while time.monotonic() < next_nan:
                vstep += 1
                victim.log(healthy(vstep), step=vstep)
                time.sleep(VICTIM_EVERY_S)
                watch()
            before = victim_nans(serve.scrape())
            vstep += 1
            victim.log({**healthy(vstep), "loss": math.nan}, step=vstep)
            t_nan = time.perf_counter()
            seen = None
            nan_deadline = time.monotonic() + 60
            while time.monotonic() < nan_deadline:
                scraped = serve.scrape()
                if victim_nans(scraped) > before:
                    seen = time.perf_counter() - t_nan
                    break
                watch(scraped)
                time.sleep(POLL_S)
            if seen is None:
                missed += 1
            else:
                latencies.append(seen)
            watch()
            finished = proc is None or (state["caught_up"] is not None and not proc.is_alive())
            if finished and len(latencies) + missed >= 3:
                break
        if proc is not None:
            proc.join(60)
            abuser_result = results.get(timeout=10) if not results.empty() else {}
        final = serve.scrape()
        rss = serve.status()
        cpu = serve.cpu_s() - cpu_start
        errors = {k: int(v) for k, v in by_label(final, "grpo_snapshot_errors_total", "reason").items() if v}
        ingested = int(sum(by_label(final, "grpo_snapshots_ingested_total", "shape").values()))
        result: dict[str, Any] = {
            "abuse": kind,
            "victim_nan_latency_s": {
                "n": len(latencies), "missed": missed,
                "p50": statistics.median(latencies) if latencies else None,
                "max": max(latencies) if latencies else None, "all": [round(x, 4) for x in latencies]},
            "rss_mib": {"ready": round(rss_ready / 1024, 1), "peak_sampled": round(serve.rss_peak_kib / 1024, 1),
                        "hwm": round(rss.get("VmHWM", 0) / 1024, 1), "end": round(rss.get("VmRSS", 0) / 1024, 1)},
            "rejects": errors,
            "ingested": ingested,
            "victim_records": vstep,
            "abuser": abuser_result,
            "caught_up_s": (None if state["caught_up"] is None or state["written"] is None
                            else round(max(0.0, state["caught_up"] - state["written"]), 2)),
            "case_s": round(time.perf_counter() - t_start, 1),
            "exporter_cpu_s": round(cpu, 1),
        }
        if kind == "heldout":
            result["heldout_series"] = {name: v for (name, labels), v in final.items()
                                        if name.startswith("grpo_heldout_") and 'run="heldout"' in labels}
        if kind == "clock":
            result["clock_run_intervals_s"] = {
                name: v for (name, labels), v in final.items()
                if name in ("grpo_run_step_interval_seconds", "grpo_run_log_interval_seconds")
                and 'run="clock"' in labels}
        if kind == "key_map":
            log_text = serve.log_path.read_text(errors="replace")
            result["key_map_reads_logged"] = log_text.count("run keymap: key map")
        expected = abuser_result.get("expected_rejects", {})
        result["rejects_as_expected"] = all(errors.get(k, 0) == v for k, v in expected.items())
        return result
    finally:
        victim.close(end=False)
        if proc is not None and proc.is_alive():
            proc.terminate()
            proc.join(10)
        serve.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--abuses", default=",".join(ABUSES))
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the abuses' record counts")
    ap.add_argument("--key-map-seconds", type=float, default=30.0)
    ap.add_argument("--timeout", type=float, default=300.0, help="per case")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="grpo-bench-abuse-"))
    result: dict[str, Any] = {"source": "bench/bench_abuse.py", "machine": machine(),
                              "scale": args.scale, "key_map_seconds": args.key_map_seconds, "cases": []}
    try:
        for kind in args.abuses.split(","):
            print(f"{kind} ...", flush=True)
            case = one_case(tmp, kind, args.scale, args.key_map_seconds, args.timeout)
            print(f"  {case}", flush=True)
            result["cases"].append(case)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

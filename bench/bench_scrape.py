"""One /metrics scrape of 1024 ranks x every canonical signal, with node_exporter beside it.

Usage: python bench/bench_scrape.py [--out PATH] [--ranks N] [--keys K] [-n N] [--node-n N]

Method.
1. A temporary snapshot folder gets ``<dir>/bench/rank-<N>.jsonl`` for N in 0..ranks-1, each one
   native record (run "bench", world_size = ranks) with every canonical key of
   ``grpo_monitor.contract.keys.SIGNALS`` (or, with --keys K, the catalog's first K: as many keys
   as an earlier release had, for a comparison at the same size) set to a random float
   (seeded), written directly as JSON lines.
2. Cold start: perf_counter() right before ``Exporter(config).start()`` to the moment the
   watcher is ready and ``grpo_snapshots_ingested_total`` (read in-process from the health
   registry every 2 ms) has reached the number of ranks: the replay (parse + pre-render) of
   every record.
3. In-process render: ``"".join(exporter.store.render())`` timed directly, median over -n runs,
   and ``exporter.metrics()`` (that join plus the exporter's own health families, encoded).
4. HTTP: -n scrapes of /metrics, each a fresh ``requests.get`` (a new TCP connection) with
   ``Accept-Encoding: identity``, timed from before the request to the whole body read; then
   the same with ``Accept-Encoding: gzip`` (time includes the client's decompression). Three
   untimed warm-up scrapes first. Series = non-empty, non-comment lines of the body. Also
   -n identity scrapes on one kept-alive requests.Session, the way Prometheus scrapes.
5. node_exporter: the run families of one scrape body (every line whose metric name, or whose
   HELP/TYPE name, is one of the per-run families) are written to ``bench.prom`` in a temporary
   folder; ``prometheus-node-exporter --collector.disable-defaults --collector.textfile
   --collector.textfile.directory=DIR`` serves it on a free local port; after it answers, the
   same scrape loop runs --node-n times. Its series count (all, and grpo_* alone) and
   ``--version`` are recorded. It is killed in a finally block.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from polling import wait_for  # noqa: E402

from grpo_monitor.contract.keys import SIGNALS  # noqa: E402
from grpo_monitor.runtime import exposition as ex  # noqa: E402
from grpo_monitor.runtime.app import Exporter  # noqa: E402
from grpo_monitor.runtime.config import ExporterConfig  # noqa: E402
from grpo_monitor.tools.stack import free_port  # noqa: E402
from results_io import machine, write_result  # noqa: E402

RUN = "bench"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
WARMUP = 3
TARGET_SCRAPE_MS = 50.0
RUN_FAMILIES = frozenset(f.name for f in (*ex.RANK_FAMILIES, *ex.RUN_FAMILIES))


def _pct(sorted_ms: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    k = max(0, min(len(sorted_ms) - 1, int(round(q * len(sorted_ms) + 0.5)) - 1))
    return sorted_ms[k]


def _summary(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {"n": len(s), "min_ms": s[0], "median_ms": statistics.median(s), "p90_ms": _pct(s, 0.9),
            "max_ms": s[-1], "mean_ms": statistics.fmean(s)}


def _series(body: bytes) -> list[bytes]:
    return [ln for ln in body.split(b"\n") if ln and not ln.startswith(b"#")]


def _name(line: str) -> str:
    if line.startswith("# HELP ") or line.startswith("# TYPE "):
        return line.split(" ", 3)[2]
    cut = len(line)
    for sep in ("{", " "):
        i = line.find(sep)
        if 0 <= i < cut:
            cut = i
    return line[:cut]


def fill(root: Path, ranks: int, seed: int, n_keys: int | None = None) -> int:
    """Write one record with every canonical key (or the first ``n_keys``) per rank; the bytes
    written."""
    rng = random.Random(seed)
    keys = [s.key for s in SIGNALS][:n_keys]
    now = time.time()
    run_dir = root / RUN
    run_dir.mkdir(parents=True)
    total = 0
    for rank in range(ranks):
        rec = {"run": RUN, "rank": rank, "world_size": ranks, "step": 100, "time": now,
               "metrics": {k: rng.random() * 10 ** rng.randint(-4, 3) for k in keys}}
        data = (json.dumps(rec) + "\n").encode()
        (run_dir / f"rank-{rank}.jsonl").write_bytes(data)
        total += len(data)
    return total


def time_scrapes(url: str, n: int, encoding: str,
                 session: requests.Session | None = None) -> tuple[list[float], bytes, int]:
    """n scrapes, each on a new connection unless a session is given; (times in ms, last body,
    bytes on the wire)."""
    headers = {"Accept-Encoding": encoding}
    get = session.get if session is not None else requests.get
    times: list[float] = []
    body, wire = b"", 0
    for i in range(WARMUP + n):
        t0 = time.perf_counter()
        r = get(url, headers=headers, timeout=30)
        body = r.content
        t1 = time.perf_counter()
        r.raise_for_status()
        if encoding == "gzip" and r.headers.get("Content-Encoding") != "gzip":
            raise RuntimeError(f"{url} did not gzip the body")
        wire = int(r.headers.get("Content-Length", len(body)))
        if i >= WARMUP:
            times.append((t1 - t0) * 1000)
    return times, body, wire


def bench_exporter(root: Path, ranks: int, n: int) -> tuple[dict[str, object], bytes]:
    cfg = ExporterConfig(snapshot_dir=root, listen_address="127.0.0.1:0")
    exporter: Exporter | None = None
    try:
        t0 = time.perf_counter()
        exporter = Exporter(cfg).start()
        if not exporter.watcher.ready.wait(120):
            raise RuntimeError("exporter not ready after 120 s")
        t_ready = time.perf_counter()
        reg = exporter.health.registry
        # Polled every 2 ms: the poll's period bounds how late the cold start is measured.
        wait_for(lambda: (reg.get_sample_value("grpo_snapshots_ingested_total",
                                               {"shape": "native"}) or 0) >= ranks,
                 timeout=120, interval=0.002, what="every rank ingested")
        t_all = time.perf_counter()

        render_ms, metrics_ms = [], []
        for _ in range(n):
            a = time.perf_counter()
            "".join(exporter.store.render())
            b = time.perf_counter()
            exporter.metrics()
            c = time.perf_counter()
            render_ms.append((b - a) * 1000)
            metrics_ms.append((c - b) * 1000)

        url = exporter.url + "/metrics"
        plain_ms, body, plain_wire = time_scrapes(url, n, "identity")
        gzip_ms, gz_body, gzip_wire = time_scrapes(url, n, "gzip")
        with requests.Session() as session:  # as Prometheus scrapes: one kept-alive connection
            keep_ms, _, _ = time_scrapes(url, n, "identity", session)
        series = _series(body)
        run_series = [ln for ln in series if _name(ln.decode()) in RUN_FAMILIES]
        result = {
            "cold_start": {"ready_ms": (t_ready - t0) * 1000, "all_ingested_ms": (t_all - t0) * 1000},
            "store_render_join": _summary(render_ms),
            "exporter_metrics_call": _summary(metrics_ms),
            "http_identity": {**_summary(plain_ms), "bytes": plain_wire},
            "http_gzip": {**_summary(gzip_ms), "bytes_on_wire": gzip_wire, "bytes_decoded": len(gz_body)},
            "http_identity_keepalive": _summary(keep_ms),
            "series": len(series),
            "run_family_series": len(run_series),
            "body_bytes": len(body),
        }
        return result, body
    finally:
        if exporter is not None:
            exporter.stop()


def to_textfile(body: bytes) -> str:
    """The run families of a scrape body, with their HELP/TYPE lines."""
    keep = [ln for ln in body.decode().split("\n") if ln and _name(ln) in RUN_FAMILIES]
    return "\n".join(keep) + "\n"


def bench_node_exporter(text: str, n: int) -> dict[str, object]:
    version = subprocess.run([NODE_EXPORTER, "--version"], capture_output=True, text=True,
                             timeout=10)
    version_line = (version.stdout + version.stderr).strip().splitlines()[0]
    tmp = tempfile.mkdtemp(prefix="grpo-bench-textfile-")
    proc: subprocess.Popen[bytes] | None = None
    log_path = Path(tmp) / "node_exporter.log"
    try:
        prom_dir = Path(tmp) / "textfile"
        prom_dir.mkdir()
        (prom_dir / "bench.prom").write_text(text)
        port = free_port()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile",
                 f"--collector.textfile.directory={prom_dir}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/metrics"
        node = proc

        def serving() -> bool:
            # An exited node_exporter will never serve: fail now, with its log.
            if node.poll() is not None:
                raise RuntimeError(f"node_exporter exited {node.returncode}: {log_path.read_text()[-2000:]}")
            return requests.get(url, headers={"Accept-Encoding": "identity"}, timeout=5).ok

        wait_for(serving, timeout=20, interval=0.05, what="node_exporter serving /metrics",
                 diagnose=lambda: log_path.read_text()[-2000:])
        times, body, wire = time_scrapes(url, n, "identity")
        series = _series(body)
        grpo = [ln for ln in series if ln.startswith(b"grpo_")]
        # Families typed summary without _sum/_count get them added (as 0) by node_exporter.
        summaries = {f.name.encode() for f in ex.RANK_FAMILIES if f.type == "summary"}
        added = [ln for ln in grpo
                 if ln.split(b"{", 1)[0].removesuffix(b"_sum").removesuffix(b"_count") in summaries
                 and (ln.split(b"{", 1)[0].endswith(b"_sum") or ln.split(b"{", 1)[0].endswith(b"_count"))]
        scrape_error = [ln.decode() for ln in series if ln.startswith(b"node_textfile_scrape_error")]
        return {
            "version": version_line,
            "http_identity": {**_summary(times), "bytes": wire},
            "series": len(series),
            "grpo_series": len(grpo),
            "grpo_summary_sum_count_added": len(added),
            "textfile_scrape_error": scrape_error,
            "prom_file_series": len(_series(text.encode())),
            "prom_file_bytes": len(text.encode()),
        }
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "scrape.json")
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--keys", type=int, default=len(SIGNALS),
                        help="canonical keys per record, the first K of the catalog (default: all)")
    parser.add_argument("-n", type=int, default=50, help="timed exporter scrapes (and renders)")
    parser.add_argument("--node-n", type=int, default=20, help="timed node_exporter scrapes (0 skips)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="grpo-bench-scrape-")
    try:
        root = Path(tmp)
        t = time.perf_counter()
        written = fill(root, args.ranks, args.seed, args.keys)
        fill_ms = (time.perf_counter() - t) * 1000
        ours, body = bench_exporter(root, args.ranks, args.n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    node = bench_node_exporter(to_textfile(body), args.node_n) if args.node_n > 0 else None

    med = ours["http_identity"]["median_ms"]  # type: ignore[index]
    result = {
        "benchmark": "one /metrics scrape of N ranks x every canonical signal",
        "ranks": args.ranks,
        "keys_per_record": min(args.keys, len(SIGNALS)),
        "seed": args.seed,
        "snapshot_bytes": written,
        "fill_ms": fill_ms,
        "exporter": ours,
        "node_exporter_textfile": node,
        "target": {"scrape_median_ms": TARGET_SCRAPE_MS, "met": med <= TARGET_SCRAPE_MS},
        **machine(),
        "wall_s": round(time.perf_counter() - started, 1),
        "time": time.time(),
    }

    cold, rj, mc = ours["cold_start"], ours["store_render_join"], ours["exporter_metrics_call"]
    print(f"{args.ranks} ranks x {min(args.keys, len(SIGNALS))} keys: {ours['series']} series "
          f"({ours['run_family_series']} in run families), {ours['body_bytes']} B")
    print(f"  cold start: ready {cold['ready_ms']:.0f} ms, all ingested {cold['all_ingested_ms']:.0f} ms")
    print(f"  store.render()+join: median {rj['median_ms']:.2f} ms; exporter.metrics(): "
          f"median {mc['median_ms']:.2f} ms")
    for label in ("http_identity", "http_gzip", "http_identity_keepalive"):
        r = ours[label]
        size = r.get("bytes", r.get("bytes_on_wire", ours["body_bytes"]))
        print(f"  exporter {label:>23}: median {r['median_ms']:6.1f}  p90 {r['p90_ms']:6.1f}  "
              f"max {r['max_ms']:6.1f} ms  ({size} B)")
    if node:
        r = node["http_identity"]
        print(f"  node_exporter textfile (identity): median {r['median_ms']:6.1f}  p90 {r['p90_ms']:6.1f}  "
              f"max {r['max_ms']:6.1f} ms  ({node['series']} series, {node['grpo_series']} grpo_* of "
              f"which {node['grpo_summary_sum_count_added']} _sum/_count it adds; {node['version']})")
    print(f"scrape median {med:.1f} ms vs target {TARGET_SCRAPE_MS:.0f} ms: "
          f"{'met' if result['target']['met'] else 'MISSED'}")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

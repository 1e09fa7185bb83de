"""What the committed rules cost Prometheus (and VictoriaMetrics) at 64 to 16,384 ranks.

Usage: python bench/bench_rules.py [--ranks 64,1024] [--steps 400] [-n 5] [--interval 5s]
                                   [--job real|widened] [--keep DIR]
                                   [--prometheus-dir DIR] [--engine prometheus,victoriametrics]
                                   [--out PATH]

Method.
1. A healthy simulated job (tools/simulate.py, seed 0) of N ranks and --steps steps is written
   through the real SnapshotWriter, live (the writers close without marking the run's end), its
   last record at the time of writing; rank 0 logs every training key, every rank its perf
   keys. An Exporter reads the folder and renders its exposition once. --keep DIR keeps the job
   and the exporter's saved state there, so that a second measurement (rules changed, say)
   restarts on them in seconds instead of writing and reading the job again.
2. --job widened (the older method, cheaper): a 4-rank job instead, its exposition widened to N
   ranks: rank 0's series once, rank 1's for every rank 1 to N-1 (ranks 2 and 3 dropped),
   grpo_world_size set to N. It approximates the series set of an N-rank job; ranks of a real
   job differ in their values (and the rules' outputs with them).
3. A local HTTP server serves the body at /metrics; the real `prometheus` runs the committed
   prometheus.yml of --prometheus-dir (its rule files; scrape and evaluation --interval; the
   Alertmanager target a closed port) against it. Once Prometheus holds every rank's grpo_step,
   two evaluations of every group are let pass, then ``prometheus_rule_group_last_duration_seconds``
   of each group is read from Prometheus's /metrics after each of its next -n evaluations
   (``prometheus_rule_group_iterations_total`` moved); then each rule's last evaluation time
   (/api/v1/rules), the ten costliest kept.
4. Per size: series, body size, the median of each group's evaluation time, and their sum (the
   groups evaluate concurrently, each in its own goroutine, so the sum is the CPU they take per
   interval, not the wall time of one). --prometheus-dir of an older checkout measures the rules
   before a change on the same machine. Also the engine's resident memory (VmRSS) and the
   scrape's duration (scrape_duration_seconds).
5. --engine victoriametrics: the same body scraped by vmagent into victoria-metrics, the rules
   evaluated by vmalert with the flags `stack up --stack.engine=victoriametrics` runs; each
   group's mean evaluation time over -n evaluations (vmalert_iteration_duration_seconds), and
   the memory of the three processes together.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import yaml  # noqa: E402
from polling import wait_for  # noqa: E402
from processes import start_listening  # noqa: E402
from prometheus_harness import ExpositionServer, prometheus_config, start_prometheus  # noqa: E402
from results_io import machine, write_result  # noqa: E402
from victoria_harness import group_counters  # noqa: E402

from grpo_monitor.runtime.app import Exporter  # noqa: E402
from grpo_monitor.runtime.config import ExporterConfig, parse_duration  # noqa: E402
from grpo_monitor.sdk.writer import SnapshotWriter  # noqa: E402
from grpo_monitor.tools import simulate  # noqa: E402
from grpo_monitor.tools import victoriametrics as vm  # noqa: E402
from grpo_monitor.tools.stack import Child  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "rules.json"
RUN = "bench"
TEMPLATE_RANKS = 4
STEP_SECONDS = 5.0
_RANK = re.compile(r'rank="(\d+)"')
_SAMPLE = re.compile(r'^prometheus_rule_group_(last_duration_seconds|iterations_total)\{rule_group="([^"]+)"\} (\S+)$')


def job_exposition(ranks: int, steps: int, keep: Path | None = None) -> str:
    """The exposition of a live, healthy ``ranks``-rank job of ``steps`` steps (kept in ``keep``
    with the exporter's saved state, and read from there when it holds one already)."""
    with tempfile.TemporaryDirectory(prefix="grpo-rules-bench-") as tmp:
        work = (keep or Path(tmp)) / f"{ranks}x{steps}"
        snapshots, done = work / "snapshots", work / "written"
        if not done.exists():
            snapshots.mkdir(parents=True, exist_ok=True)
            writers = [SnapshotWriter(snapshots, RUN, rank=r, world_size=ranks) for r in range(ranks)]
            start = time.time() - steps * STEP_SECONDS
            simulate.write_steps(writers, simulate.generate("healthy", steps=steps, ranks=ranks,
                                                            step_seconds=STEP_SECONDS, start_time=start))
            for w in writers:
                w.close(end=False)
            done.touch()
        config = ExporterConfig(snapshot_dir=snapshots, listen_address="127.0.0.1:0", gpu_collector=False,
                                storage_path=work / "state", storage_save_interval=1e9,
                                run_timeout=30 * 86400)  # a kept job stays served, however old
        with Exporter(config) as exporter:
            wait_for(exporter.watcher.ready.is_set, timeout=3600, interval=0.05, what="the job read")
            # A first start is ready before its backfill: every series once the job is read whole.
            wait_for(lambda: exporter.health.registry.get_sample_value("grpo_exporter_partial_runs") == 0,
                     timeout=3600, interval=0.05, what="the job read whole")
            exporter.store.flush()
            return "".join(exporter.store.render())


def widen(body: str, ranks: int) -> str:
    """``body`` with rank 1's series repeated for ranks 1..ranks-1 (see the module's step 2)."""
    out: list[str] = []
    for line in body.splitlines():
        m = _RANK.search(line) if not line.startswith("#") else None
        if m is None or m.group(1) == "0":
            if line.startswith("grpo_world_size{"):
                line = line.rsplit(" ", 1)[0] + f" {ranks}"
            out.append(line)
        elif m.group(1) == "1":
            head, tail = line[:m.start()], line[m.end():]
            if tail.startswith("}") and head.startswith("grpo_world_size{"):
                tail = tail.rsplit(" ", 1)[0] + f" {ranks}"
            out.extend(f'{head}rank="{r}"{tail}' for r in range(1, ranks))
    return "\n".join(out) + "\n"


def rule_groups(prom_url: str) -> dict[str, tuple[float, float]]:
    """{group: (iterations, last duration in seconds)} from Prometheus's own /metrics."""
    text = requests.get(f"{prom_url}/metrics", timeout=10).text
    seen: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            seen.setdefault(m.group(2).rsplit(";", 1)[-1], {})[m.group(1)] = float(m.group(3))
    return {g: (v["iterations_total"], v["last_duration_seconds"]) for g, v in seen.items()
            if "iterations_total" in v and "last_duration_seconds" in v}


def rss_mib(*children: Child) -> float:
    """The resident memory of the engine's processes, summed (VmRSS)."""
    total = 0
    for child in children:
        for line in Path(f"/proc/{child.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return round(total / 1024, 1)


def scrape_seconds(query_url: str) -> float:
    r = requests.get(f"{query_url}/api/v1/query", params={"query": "max(scrape_duration_seconds)"}, timeout=30)
    result = r.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def measure_victoriametrics(target: str, ranks: int, prometheus_dir: Path, interval: str,
                            n: int, tmp: Path) -> dict[str, object]:
    """vmagent scraping ``target`` into victoria-metrics, vmalert evaluating prometheus_dir's
    rules: each group's mean evaluation time over its next ``n`` evaluations
    (vmalert_iteration_duration_seconds' sum and count), memory and scrape time."""
    with ExitStack() as stack:
        prometheus = prometheus_config(target, "127.0.0.1:1", interval,
                                       source=prometheus_dir / "prometheus.yml")
        server, port = start_listening(stack, "victoria-metrics", lambda p: vm.server_argv(
            vm.SERVER_BIN, tmp / "vm-data", p), tmp)
        store = f"http://127.0.0.1:{port}"
        scrape_yml = tmp / "vmagent.yml"
        scrape_yml.write_text(yaml.safe_dump(vm.scrape_config(prometheus)))
        agent, _ = start_listening(stack, "vmagent", lambda p: vm.agent_argv(
            vm.AGENT_BIN, scrape_yml, tmp / "vmagent-data", p, store), tmp)
        ruler, ruler_port = start_listening(stack, "vmalert", lambda p: vm.ruler_argv(
            vm.RULER_BIN, prometheus, p, store, "http://127.0.0.1:1"), tmp)
        ruler_url = f"http://127.0.0.1:{ruler_port}"
        _wait_ranks(store, ranks, "VictoriaMetrics")

        def totals() -> dict[str, tuple[float, float]]:
            text = requests.get(f"{ruler_url}/metrics", timeout=30).text
            count = group_counters(text, "vmalert_iteration_duration_seconds_count")
            total = group_counters(text, "vmalert_iteration_duration_seconds_sum")
            return {g: (count[g], total.get(g, 0.0)) for g in count}

        start = totals()
        wait_for(lambda: all(totals()[g][0] >= c + 2 for g, (c, _) in start.items()),
                 timeout=300, interval=0.2, what="two evaluations of every group")
        first = totals()
        wait_for(lambda: all(totals()[g][0] >= c + n for g, (c, _) in first.items()),
                 timeout=60 + 3 * n * parse_duration(interval), interval=0.2,
                 what=f"{n} evaluations of every group")
        last = totals()
        groups = {g: round((last[g][1] - s) / (last[g][0] - c) * 1000, 2)
                  for g, (c, s) in sorted(first.items())}
        return {"group_mean_ms": groups, "all_groups_ms": round(sum(groups.values()), 1),
                "rss_mib": rss_mib(server, agent, ruler), "scrape_s": round(scrape_seconds(store), 3)}


def _wait_ranks(query_url: str, ranks: int, engine: str) -> None:
    def ranks_scraped() -> bool:
        r = requests.get(f"{query_url}/api/v1/query", params={"query": "count(grpo_step)"}, timeout=30)
        result = r.json()["data"]["result"]
        return bool(result) and int(float(result[0]["value"][1])) == ranks

    wait_for(ranks_scraped, timeout=600, interval=0.5, what=f"{engine} holding {ranks} ranks")


def measure(body: str, ranks: int, prometheus_dir: Path, interval: str, n: int,
            engines: Sequence[str] = ("prometheus",)) -> dict[str, object]:
    server = ExpositionServer(body.encode())
    series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    result: dict[str, object] = {"ranks": ranks, "series": series,
                                 "body_mib": round(len(body.encode()) / 2**20, 2)}
    try:
        if "prometheus" in engines:
            result.update(measure_prometheus(server.target, ranks, prometheus_dir, interval, n))
        if "victoriametrics" in engines:
            with tempfile.TemporaryDirectory(prefix="grpo-rules-vm-") as tmp:
                result["victoriametrics"] = measure_victoriametrics(
                    server.target, ranks, prometheus_dir, interval, n, Path(tmp))
    finally:
        server.close()
    return result


def measure_prometheus(target: str, ranks: int, prometheus_dir: Path, interval: str, n: int
                       ) -> dict[str, object]:
    """Prometheus scraping ``target`` and evaluating prometheus_dir's rules: each group's median
    evaluation time over its next ``n`` evaluations, the costliest rules, memory, scrape time."""
    with tempfile.TemporaryDirectory(prefix="grpo-rules-prom-") as tmp, ExitStack() as stack:
        config = prometheus_config(target, "127.0.0.1:1", interval,
                                   source=prometheus_dir / "prometheus.yml")
        prom, prom_url = start_prometheus(stack, Path(tmp), config)
        _wait_ranks(prom_url, ranks, "Prometheus")
        start = rule_groups(prom_url)
        wait_for(lambda: all(rule_groups(prom_url)[g][0] >= it + 2 for g, (it, _) in start.items()),
                 timeout=300, interval=0.2, what="two evaluations of every group")
        durations: dict[str, list[float]] = {g: [] for g in start}
        last = rule_groups(prom_url)

        def sampled() -> bool:
            nonlocal last
            now = rule_groups(prom_url)
            for g, (it, d) in now.items():
                if it > last[g][0] and len(durations[g]) < n:
                    durations[g].append(d)
            last = now
            return all(len(v) >= n for v in durations.values())

        wait_for(sampled, timeout=60 + 3 * n * parse_duration(interval), interval=0.1, what=f"{n} evaluations of every group")
        # Where the time goes: each rule's own last evaluation time, the costliest first.
        rules = requests.get(f"{prom_url}/api/v1/rules", timeout=30).json()["data"]["groups"]
        costliest = sorted(((r.get("name"), r.get("evaluationTime", 0.0) * 1000) for g in rules for r in g["rules"]),
                           key=lambda nr: -nr[1])[:10]
        memory, scrape = rss_mib(prom), round(scrape_seconds(prom_url), 3)
    groups = {g: round(statistics.median(v) * 1000, 2) for g, v in sorted(durations.items())}
    return {"group_median_ms": groups, "all_groups_ms": round(sum(groups.values()), 1),
            "costliest_rules_ms": [[name, round(ms, 2)] for name, ms in costliest],
            "rss_mib": memory, "scrape_s": scrape}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="64,1024", help="comma-separated job sizes (default 64,1024, what "
                    "make bench runs; the docs' table adds 4096)")
    ap.add_argument("--steps", type=int, default=400, help="steps of the job (default 400)")
    ap.add_argument("-n", type=int, default=5, help="evaluations of each group measured (default 5)")
    ap.add_argument("--interval", default="5s", help="scrape and evaluation interval (default 5s)")
    ap.add_argument("--job", choices=("real", "widened"), default="real",
                    help="an N-rank job written and read (default), or a 4-rank one's exposition widened")
    ap.add_argument("--keep", type=Path, help="keep the jobs and the exporter's saved state here, "
                    "and use those already there")
    ap.add_argument("--prometheus-dir", type=Path, default=REPO / "prometheus",
                    help="the prometheus/ folder whose prometheus.yml and rules are measured")
    ap.add_argument("--engine", default="prometheus",
                    help="comma-separated engines measured: prometheus, victoriametrics (vmagent + "
                    "victoria-metrics + vmalert, the flags `stack up --stack.engine` runs)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    engines = args.engine.split(",")

    template = job_exposition(TEMPLATE_RANKS, args.steps) if args.job == "widened" else ""
    sizes = []
    for ranks in (int(r) for r in args.ranks.split(",")):
        body = widen(template, ranks) if args.job == "widened" else job_exposition(ranks, args.steps, args.keep)
        result = measure(body, ranks, args.prometheus_dir.resolve(), args.interval, args.n, engines)
        sizes.append(result)
        print(f"{ranks:>5} ranks: {result['series']:>7} series, {result['body_mib']:>5} MiB", flush=True)
        for engine, r in (("prometheus", result), ("victoriametrics", result.get("victoriametrics"))):
            if engine in engines and isinstance(r, dict):
                times = r.get("group_median_ms") or r["group_mean_ms"]
                slowest = sorted(times.items(), key=lambda kv: -kv[1])[:3]
                print(f"      {engine}: all groups {r['all_groups_ms']} ms (slowest: "
                      f"{', '.join(f'{g} {ms} ms' for g, ms in slowest)}), {r['rss_mib']} MiB, "
                      f"scrape {r['scrape_s']} s", flush=True)
    write_result(args.out, {"source": "bench/bench_rules.py", "job": args.job, "steps": args.steps,
                            "interval": args.interval, "engines": engines,
                            "evaluations": args.n, "prometheus_dir": str(args.prometheus_dir),
                            "sizes": sizes, "machine": machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

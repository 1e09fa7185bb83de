"""Latency of the red-card path: a NaN loss written to a snapshot -> the webhook POST.

Usage: python bench/bench_alert_latency.py [--out PATH] [-n N] [--interval DURATION] [--seed N]

Method. The same stack as tests/test_alerting_e2e.py (helpers in tests/prometheus_harness.py):
an Exporter in this process on a temporary snapshot folder, the real `prometheus` (scrape and evaluation
interval --interval, default 1s; the committed rule files) and `prometheus-alertmanager` (the
committed prometheus/alertmanager.yml, webhook pointed at a listener in this process) on
loopback ports. After Prometheus has scraped the exporter once and found Alertmanager, each
trial appends one record with a NaN loss for a new run (bench-1, bench-2, ...), so each trial
opens a fresh alert group and waits the red route's full group_wait:

  t0 = time.monotonic() right before the write; t1 = time.monotonic() when the listener has
  read the request line of the first firing POST carrying GRPONonFiniteValues for that run.
  latency = t1 - t0.

Trials are spaced by a random gap (seeded, 0 to 2 intervals) so that the writes fall at random
phases of the scrape and evaluation cycles, whose offsets Prometheus picks itself.

Target: scrape_interval + evaluation_interval + group_wait + 2 s, i.e. the worst phase of both
cycles plus the red route's group_wait plus 2 s for the exporter, the sends and the webhook
(9 s at 1 s / 1 s / 5 s). The expected median is about group_wait + one interval.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from prometheus_harness import alert_stack, latency_report, write_nonfinite_loss  # noqa: E402

from grpo_monitor.runtime.app import Exporter  # noqa: E402
from grpo_monitor.runtime.config import ExporterConfig  # noqa: E402
from results_io import machine, write_result

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "alert_latency.json"
TRIAL_TIMEOUT_S = 60.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("-n", type=int, default=5, help="trials (default 5)")
    ap.add_argument("--interval", default="1s",
                    help="Prometheus scrape and evaluation interval (default 1s)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)

    with tempfile.TemporaryDirectory(prefix="grpo-alert-bench-") as tmp:
        snapshots = Path(tmp) / "snapshots"
        snapshots.mkdir()
        config = ExporterConfig(snapshot_dir=snapshots, listen_address="127.0.0.1:0")
        with Exporter(config) as exporter:
            exporter.watcher.ready.wait(10)
            with alert_stack(Path(tmp) / "alerting", exporter.url, args.interval) as stack:
                stack.wait_scraping()
                latencies: list[float] = []
                for i in range(1, args.n + 1):
                    time.sleep(rng.uniform(0, 2 * stack.interval_s))
                    run = f"bench-{i}"
                    t0 = write_nonfinite_loss(snapshots, run)
                    post, _ = stack.wait_post(TRIAL_TIMEOUT_S, alertname="GRPONonFiniteValues",
                                              run=run)
                    latencies.append(post.arrived - t0)
                    print(f"trial {i}: {latencies[-1]:.3f} s", flush=True)
                report = latency_report(
                    latencies, stack.interval_s, stack.group_wait_s,
                    source="bench/bench_alert_latency.py", seed=args.seed,
                    machine=machine())

    write_result(args.out, report)
    print(f"median {report['median_s']} s, max {report['max_s']} s, target "
          f"{report['target_s']} s (scrape {report['scrape_interval_s']:g} s + evaluation "
          f"{report['evaluation_interval_s']:g} s + group_wait {report['group_wait_s']:g} s + 2 s)"
          f" -> {'OK' if report['max_within_target'] else 'OVER TARGET'}; wrote {args.out}")
    return 0 if report["max_within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""False positives of the red cards, the blow-up card first, over every healthy run the suite has.

Usage: python bench/bench_cards.py [--out PATH] [--demo-seeds S ...] [--demo-steps N] [--no-demo]

A red card pauses training, so one on a healthy run costs a person's night. This script plays
every healthy run through the exporter's ingest and store and the committed rules in the real
promtool (tests/promtool_harness.py, one scrape per logged step), and counts, per red card, the
runs it fired on and at which steps:

* the shared real runs that are healthy (their labels in bench_real_runs.LABELS), as logged (a
  sweep's runs side by side);
* the synthetic healthy run (``simulate --scenario healthy``, 3000 steps) logged every step,
  every 5th and every 10th, and the healthy part of every sick scenario shaped otherwise from
  its first step (its steps before the onset; the others' are a prefix of the healthy run);
* the demo's tiny real trainer, healthy, on ``--demo-seeds`` (5 seeds of ``--demo-steps`` 600).

Sick runs are not counted: a red card there is the point. Writes bench/results/cards.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import real_runs  # noqa: E402
from promtool_harness import Played, alerts, fired_at, intervals, play  # noqa: E402
from results_io import machine, write_result  # noqa: E402
from bench_real_runs import LABELS  # noqa: E402

from grpo_monitor.tools.simulate import SCENARIOS  # noqa: E402

# The training red cards: the ones a replay can judge. GRPORunHung reads the files' modification
# times and GRPOGPUXidError NVML's events, which a replay does not have (tests/test_run_hung.py
# and tests/test_gpu_collector.py prove those two).
RED = sorted({r["alert"] for r in alerts("grpo-alerts.yml") if r["labels"]["severity"] == "critical"})


def healthy_runs(demo_seeds: list[int], demo_steps: int) -> Iterator[tuple[str, Played]]:
    for name in sorted(n for n, label in LABELS.items() if label.verdict == "healthy"):
        yield f"real/{name}", real_runs.play_real(name)
    for every in (1, 5, 10):
        yield f"simulate/healthy every {every}", play("healthy", scrape_every=1, log_every=every)
    # A sick scenario runs the healthy generator up to its onset: its healthy part is a prefix of
    # the run above, unless the scenario shapes the run from its first step.
    for name, sc in SCENARIOS.items():
        if sc.shape is None or sc.onset <= 25:
            continue
        for every in (1, 5):
            yield (f"simulate/{name}[:{sc.onset}] every {every}",
                   play(name, scrape_every=1, steps=sc.onset - 1, log_every=every))
    if demo_seeds:
        from grpo_monitor.tools.train_demo import Config
        from test_train_demo import train_recorded  # the tests' own recorder of the demo

        for seed in demo_seeds:
            with tempfile.TemporaryDirectory() as tmp:
                _, played = train_recorded(Config(step_seconds=0.0, snapshot_dir=Path(tmp),
                                                  run=f"seed{seed}", steps=demo_steps, seed=seed),
                                           scrape_every=1)
            yield f"train-demo seed {seed} ({demo_steps} steps)", played


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cards.json")
    parser.add_argument("--demo-seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    parser.add_argument("--demo-steps", type=int, default=600)
    parser.add_argument("--no-demo", action="store_true")
    args = parser.parse_args(argv)
    seeds = [] if args.no_demo else args.demo_seeds
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, played in healthy_runs(seeds, args.demo_steps):
            at = fired_at(played, Path(tmp))
            spans = intervals(played.scrape_steps, at)
            red = {a: s for a, s in spans.items() if a in RED}
            runs.append({"run": label, "logged_steps": len(played.scrape_steps),
                         "red_cards": {a: [list(x) for x in s] for a, s in red.items()}})
            print(f"{label:<60} {len(played.scrape_steps):>5} steps  red: "
                  f"{', '.join(red) or 'none'}", flush=True)
    per_card = {card: [r["run"] for r in runs if card in r["red_cards"]] for card in RED}
    result = {"machine": machine(), "healthy_runs": len(runs),
              "logged_steps": sum(r["logged_steps"] for r in runs),
              "false_positive_runs": {c: len(v) for c, v in per_card.items()},
              "fired_on": {c: v for c, v in per_card.items() if v}, "runs": runs}
    print(f"{len(runs)} healthy runs, {result['logged_steps']} logged steps; runs with a red card: "
          + ", ".join(f"{c} {n}" for c, n in result["false_positive_runs"].items()))
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Forecast error of the entropy-reward law R = -a*exp(H) + b, fitted on a run's early steps.

Usage: python bench/bench_forecast.py [--real-runs DIR] [--out PATH] [--demo-dir DIR]
                                      [--demo-steps N] [--demo-seeds S ...] [--no-demo]

The law (arXiv 2505.22617) says a policy trades entropy H for reward R along one curve; the
exporter fits it online (grpo_forecast_*) and GRPORewardCeilingNear reads its ceiling b - a. This
script measures how well a fit on a run's first steps predicts the run's later reward.

Method. For every run, the steps that logged both entropy/mean and reward/mean (names mapped as
the exporter maps them: grpo_monitor.contract.snapshot.parse_record) are averaged in 10-step blocks
(grpo_monitor.runtime.forecast.block_means, the exporter's blocks). For each cut -- 25% and 50% of
the run's blocks (not of its steps: the cut of score_forecast and of the report's first half),
and the fixed cuts 50 and 100 steps, rounded down to a block boundary --
grpo_monitor.runtime.forecast.score_forecast fits the blocks before the cut with fit_law, predicts
each later block's reward from that block's *observed* mean entropy -- the law's claim is the
exchange rate, not when the entropy will fall -- and scores the later blocks as the report's
entropy-reward section scores its second half (mae, mae_pct, persistence); forecast_r2, RMSE,
bias and the ceiling against the best reward are this script's own:

  mae          mean |predicted - observed| block reward
  mae_pct      mae / (max - min of the run's block rewards), in %
  forecast_r2  1 - SSE / SST on the later blocks (SST around their own mean): below 0 means the
               later blocks' mean predicts them better than the law
  persistence  mae of the naive forecast "the reward stays at the last fitted block's"
  ceiling      b - a (the reward at H = 0) against the best 20-step mean reward of the whole run

A cut is skipped when fewer than forecast.MIN_BLOCKS blocks precede it (the exporter does not
publish such a fit either) or fewer than 2 blocks follow it; a later block whose entropy is past
exp()'s range is not scored, as in the report.

Runs: the train demo (grpo_monitor.tools.train_demo, real GRPO on the CPU), healthy for --demo-steps
(600) steps per seed (the first 300 steps of each are, exactly, the 300-step run of that seed:
the loop is deterministic and nothing in it depends on the run's length), and the entropy
collapse of docs/train-demo.md (--group-size 2 --temperature 0.15 from step 200, 300 steps); and
every run of the shared collection that logs entropy (--real-runs; by default the one the tests
read, tests/real_runs.py: $GRPO_REAL_RUNS, else ../shared/real-runs beside the repository). The
demo's snapshots are kept in --demo-dir when given, and a run found there complete is read
instead of trained again.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import real_runs  # noqa: E402

from grpo_monitor.contract.snapshot import parse_record  # noqa: E402
from grpo_monitor.runtime.forecast import (  # noqa: E402
    BLOCK_STEPS,
    MIN_BLOCKS,
    block_means,
    score_forecast,
)
from results_io import machine, write_result  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "forecast.json"
FRACTIONS = (0.25, 0.5)
FIXED_CUTS = (50, 100)
BEST_WINDOW = 20  # steps of the best observed mean reward the ceiling is compared with
MIN_REST_BLOCKS = 2
ENTROPY, REWARD = "entropy/mean", "reward/mean"


@dataclass
class Run:
    name: str
    source: str  # "train-demo" or "real"
    what: str
    steps: list[int]  # steps that logged both a finite entropy and a finite reward, ascending
    entropy: list[float]
    reward: list[float]


# -- the runs ------------------------------------------------------------------------------------


def _points(name: str, source: str, what: str,
            records: Sequence[tuple[int, dict[str, float]]]) -> Run:
    by_step: dict[int, tuple[float, float]] = {}
    for step, metrics in records:
        h, r = metrics.get(ENTROPY), metrics.get(REWARD)
        if h is not None and r is not None and math.isfinite(h) and math.isfinite(r):
            by_step[step] = (h, r)  # a step logged twice: the later record, as the exporter
    steps = sorted(by_step)
    return Run(name, source, what, steps, [by_step[s][0] for s in steps],
               [by_step[s][1] for s in steps])


def shared_runs(folder: Path | None) -> tuple[list[Run], list[dict[str, str]]]:
    """Every run of the collection (``folder``, else real_runs.runs_dir(): $GRPO_REAL_RUNS or
    ../shared/real-runs) that logged entropy and reward, and the others with why."""
    if folder is None:
        try:
            paths = [real_runs.steps_file(name) for name in real_runs.run_names()]
        except real_runs.RealRunsMissing as exc:
            raise SystemExit(f"{exc} Or pass them with --real-runs.") from None
    elif folder.is_dir():
        paths = sorted(folder.glob(f"*/{real_runs.STEPS_FILE}"))
    else:
        raise SystemExit(f"{folder} is not a folder: pass the shared real runs with --real-runs")
    runs: list[Run] = []
    skipped: list[dict[str, str]] = []
    for path in paths:
        name = path.parent.name
        records = []
        for raw in real_runs.load(path):
            rec = parse_record(raw, run=name, rank=0, mtime=0.0)
            records.append((rec.step, rec.metrics))
        run = _points(name, "real", _framework(path.parent), records)
        if len(run.steps) < 2:
            logs_entropy = any(ENTROPY in m for _, m in records)
            skipped.append({"run": name, "why": "fewer than 2 steps with entropy and reward"
                            if logs_entropy else "logs no entropy"})
        else:
            runs.append(run)
    return runs, skipped


def _framework(folder: Path) -> str:
    """The collection's own description of the run's trainer: the ``| framework | ... |`` row of
    its PROVENANCE.md."""
    prov = folder / "PROVENANCE.md"
    if prov.is_file():
        for line in prov.read_text(encoding="utf-8").splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2 and cells[0].lower() == "framework":
                return " | ".join(cells[1:])
    return ""


def _demo_configs(steps: int, seeds: Sequence[int]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for seed in seeds:
        yield f"demo-healthy-s{seed}", f"healthy, seed {seed}", {"steps": steps, "seed": seed}
    yield ("demo-entropy-collapse", "--group-size 2 --temperature 0.15 from step 200, seed 0",
           {"steps": 300, "seed": 0, "onset": 200, "sick_group_size": 2, "sick_temperature": 0.15})


def _read_demo(path: Path) -> list[tuple[int, dict[str, float]]]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            rec = parse_record(json.loads(line), run="demo", rank=0, mtime=0.0)
            if rec.metrics:
                out.append((rec.step, rec.metrics))
    return out


def demo_runs(folder: Path, steps: int, seeds: Sequence[int]) -> list[Run]:
    from grpo_monitor.tools.train_demo import Config, train

    runs: list[Run] = []
    for name, what, kw in _demo_configs(steps, seeds):
        path = folder / name / "rank-0.jsonl"
        records = _read_demo(path) if path.is_file() else []
        if not records or records[-1][0] < kw["steps"]:
            if path.parent.is_dir():
                for old in path.parent.glob("*.jsonl"):
                    old.unlink()
            print(f"training {name} ({what}, {kw['steps']} steps) ...", flush=True)
            train(Config(snapshot_dir=folder, run=name, **kw))
            records = _read_demo(path)
        records = [(s, m) for s, m in records if s <= kw["steps"]]
        runs.append(_points(name, "train-demo", what, records))
        if kw["steps"] >= 600 and "onset" not in kw:
            # The first 300 steps of a healthy run are that seed's 300-step run, step for step.
            runs.append(_points(f"{name}-300", "train-demo", f"{what}, its first 300 steps",
                                [(s, m) for s, m in records if s <= 300]))
    return runs


# -- the measurement -----------------------------------------------------------------------------


def best_window_mean(steps: Sequence[int], values: Sequence[float], window: int) -> float | None:
    """The highest mean of the logged values over a window of ``window`` steps (s - window, s],
    over every logged step s at least ``window`` steps into the run."""
    best = None
    for i, s in enumerate(steps):
        if s - window + 1 < steps[0]:
            continue
        chunk = [v for t, v in zip(steps[: i + 1], values[: i + 1]) if t > s - window]
        m = sum(chunk) / len(chunk)
        best = m if best is None else max(best, m)
    return best


def cuts(last_step: int, blocks: Sequence[int]) -> list[tuple[str, int]]:
    """(label, blocks fitted) of every cut, each cut listed once. A fraction f of the run is
    int(f * len(blocks)) of its blocks, the cut of score_forecast and of the report's first
    half; a fixed cut of N steps fits the blocks before step N rounded down to a block."""
    out: list[tuple[str, int]] = []
    for f in FRACTIONS:
        out.append((f"{round(f * 100)}%", int(f * len(blocks))))
    for n in FIXED_CUTS:
        if n < last_step:
            out.append((f"{n} steps", sum(1 for b in blocks if b < n // BLOCK_STEPS)))
    seen: set[int] = set()
    unique = []
    for label, k in out:
        if k not in seen:
            seen.add(k)
            unique.append((label, k))
    return unique


def measure(run: Run) -> dict[str, Any]:
    h_blocks = block_means(run.steps, run.entropy)
    r_blocks = block_means(run.steps, run.reward)
    blocks = sorted(h_blocks)
    rewards = [r_blocks[b] for b in blocks]
    best = best_window_mean(run.steps, run.reward, BEST_WINDOW)
    result: dict[str, Any] = {
        "run": run.name, "source": run.source, "what": run.what, "last_step": run.steps[-1],
        "logged_steps": len(run.steps), "blocks": len(blocks),
        "entropy_first_block": h_blocks[blocks[0]], "entropy_last_block": h_blocks[blocks[-1]],
        "reward_first_block": rewards[0], "reward_last_block": rewards[-1],
        "reward_block_range": max(rewards) - min(rewards), "best_20_step_mean_reward": best,
        "cuts": [],
    }
    for label, k in cuts(run.steps[-1], blocks):
        score = score_forecast(h_blocks, r_blocks, k)
        fit_b, rest_b = score.fit_blocks, score.forecast_blocks
        # The first step not fitted: every fitted step is below it.
        until = (fit_b[-1] + 1) * BLOCK_STEPS if fit_b else blocks[0] * BLOCK_STEPS
        row: dict[str, Any] = {"cut": label, "fit_until_step": until, "fit_blocks": len(fit_b),
                               "forecast_blocks": len(rest_b)}
        result["cuts"].append(row)
        if len(fit_b) < MIN_BLOCKS or len(rest_b) < MIN_REST_BLOCKS:
            row["skipped"] = (
                f"{len(fit_b)} blocks to fit (< {MIN_BLOCKS})" if len(fit_b) < MIN_BLOCKS
                else f"{len(rest_b)} blocks to forecast (< {MIN_REST_BLOCKS})")
            continue
        fit = score.fit
        if fit is None:
            row["skipped"] = "no fit: the entropy did not vary over the fitted blocks"
            continue
        if len(score.scored) < MIN_REST_BLOCKS:
            row["skipped"] = (f"{len(score.scored)} blocks with an entropy exp() can take "
                              f"(< {MIN_REST_BLOCKS})")
            continue
        # The extras of this benchmark, over the same scored blocks as the MAE.
        errors = score.errors
        observed = [r_blocks[b] for b in score.scored]
        mean_obs = statistics.fmean(observed)
        sst = sum((o - mean_obs) ** 2 for o in observed)
        sse = sum(e * e for e in errors)
        row.update({
            "a": fit.a, "b": fit.b, "fit_r2": fit.r_squared, "ceiling": fit.ceiling,
            "ceiling_minus_best_20_step": None if best is None else fit.ceiling - best,
            "mae": score.mae, "rmse": math.sqrt(sse / len(errors)),
            "mae_pct_of_range": score.mae_pct_of_range,
            "bias": statistics.fmean(errors),
            "forecast_r2": 1 - sse / sst if sst > 0 else None,
            "persistence_mae": score.flat_mae,
            # How far the forecast extrapolates the fitted curve: the entropies it was fitted
            # on against the ones it predicts at.
            "fit_entropy_range": [min(h_blocks[b] for b in fit_b),
                                  max(h_blocks[b] for b in fit_b)],
            "forecast_entropy_range": [min(h_blocks[b] for b in score.scored),
                                       max(h_blocks[b] for b in score.scored)],
        })
    return result


def _line(run: dict[str, Any], cut: dict[str, Any]) -> str:
    if "mae" not in cut:
        return f"skipped: {cut['skipped']}"
    pct = cut["mae_pct_of_range"]
    r2 = cut["forecast_r2"]
    return (f"MAE {cut['mae']:.4f} ({'-' if pct is None else f'{pct:.0f}%'} of range), "
            f"persistence {cut['persistence_mae']:.4f}, fit R2 {cut['fit_r2']:.2f}, forecast R2 "
            f"{'-' if r2 is None else f'{r2:.2f}'}, ceiling {cut['ceiling']:.3f} vs best 20-step "
            f"{run['best_20_step_mean_reward']:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--real-runs", type=Path, default=None,
                    help="the shared real runs (default: $GRPO_REAL_RUNS, else ../shared/real-runs "
                         "beside the repo)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--demo-dir", type=Path, default=None,
                    help="keep the train demo's snapshots here and reuse complete ones")
    ap.add_argument("--demo-steps", type=int, default=600,
                    help="healthy demo run length (default 600)")
    ap.add_argument("--demo-seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--no-demo", action="store_true", help="only the real runs")
    args = ap.parse_args(argv)

    runs, skipped = shared_runs(args.real_runs)
    if not args.no_demo:
        if args.demo_dir is not None:
            args.demo_dir.mkdir(parents=True, exist_ok=True)
            runs = demo_runs(args.demo_dir, args.demo_steps, args.demo_seeds) + runs
        else:
            with tempfile.TemporaryDirectory(prefix="grpo-forecast-bench-") as tmp:
                runs = demo_runs(Path(tmp), args.demo_steps, args.demo_seeds) + runs
    results = [measure(r) for r in runs]
    for r in results:
        for c in r["cuts"]:
            print(f"{r['run']:44s} {c['cut']:>9s}  {_line(r, c)}")
    write_result(args.out, {
        "bench": "forecast", **machine(), "block_steps": BLOCK_STEPS, "min_blocks": MIN_BLOCKS,
        "best_window_steps": BEST_WINDOW, "runs": results, "skipped_runs": skipped})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Records per second per core for each logger's files, beside the snapshot JSONL path.

Usage: python bench/bench_loggers.py [--steps 3000] [-n 3] [--out PATH]

Method. One run of --steps steps, 24 keys a step (verl's names, the values of the simulated
healthy run's rank 0), is written five ways: through the SDK (a snapshot file), and through
each logger's own library in .venv-loggers (`make loggers-deps`; tests/loggers/write_run.py):
tensorboardX, W&B offline, MLflow's SQLite store, Trackio. For each, a fresh RunStore and
Ingestor (no watcher, no HTTP) run one rescan -- the first start's read: decode, parse,
validate, features -- and a store flush (the pre-render), timed with perf_counter(); the best
of -n runs is kept, steps / seconds reported. One thread: the rate of one core.

NeMo-RL's per-sample files (no library writes them but NeMo-RL, which needs GPUs): --sample-steps
files ``train_data_step<N>.jsonl`` of --samples rows each, as its logger writes them (a row a
sample: text, reward, input length, --tokens token ids, loss mask, advantages, two rows of
log-probabilities), read the same way; steps per second, and samples per second.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_io import machine, write_result  # noqa: E402

from grpo_monitor.runtime.health import ExporterHealth  # noqa: E402
from grpo_monitor.runtime.ingest import Ingestor  # noqa: E402
from grpo_monitor.runtime.store import RunStore  # noqa: E402
from grpo_monitor.sdk.writer import SnapshotWriter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOGGERS_PYTHON = ROOT / ".venv-loggers" / "bin" / "python"
WRITE_RUN = ROOT / "tests" / "loggers" / "write_run.py"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "loggers.json"
KEYS = 24


def rows(steps: int) -> list[dict[str, float]]:
    names = ["critic/score/mean", "actor/entropy", "actor/kl_loss", "response_length/mean",
             "actor/grad_norm", "actor/pg_loss", "critic/score/std", "critic/score/max",
             "critic/score/min", "response_length/max", "response_length/clip_ratio",
             "actor/pg_clipfrac", "actor/ppo_kl", "actor/lr", "perf/throughput",
             "timing_s/step", "timing_s/gen", "timing_s/update_actor", "critic/advantages/mean",
             "critic/advantages/max", "critic/advantages/min", "critic/returns/mean",
             "response_length/min", "prompt_length/mean"]
    return [{"step": s, **{n: round(0.5 + 0.001 * ((s * 7 + i) % 97), 4)
                           for i, n in enumerate(names[:KEYS])}} for s in range(1, steps + 1)]


def write(folder: Path, fmt: str, records: list[dict[str, float]]) -> None:
    if fmt == "snapshots":
        writer = SnapshotWriter(folder, "bench")
        for rec in records:
            writer.log({k: v for k, v in rec.items() if k != "step"}, rec["step"])
        writer.close(end=False)
        return
    feed = folder.with_suffix(".records.jsonl")
    feed.write_text("".join(json.dumps(r) + "\n" for r in records))
    subprocess.run([str(LOGGERS_PYTHON), str(WRITE_RUN), fmt, str(folder), "bench", str(feed)],
                   check=True, capture_output=True, timeout=1800,
                   env={"HOME": str(folder.parent / "home"), "PATH": "/usr/bin:/bin",
                        "HF_HOME": str(folder.parent / "hf")})


def write_samples(folder: Path, steps: int, samples: int, tokens: int) -> None:
    """NeMo-RL's ``log_batched_dict_as_jsonl`` output: each field the one-sample slice of its
    batch (a scalar as a one-element list, a sequence as a list of one list)."""
    logs = folder / "logs" / "exp_001"
    logs.mkdir(parents=True)
    ids = list(range(tokens))
    for step in range(1, steps + 1):
        with (logs / f"train_data_step{step}.jsonl").open("w") as fh:
            for i in range(samples):
                reward = float((i * 7 + step) % 3 == 0)
                fh.write(json.dumps({
                    "content": [f"a response of sample {i}"], "rewards": [reward],
                    "input_lengths": [tokens], "token_ids": [ids],
                    "token_loss_mask": [[0] * 64 + [1] * (tokens - 64)], "sample_loss_mask": [1],
                    "advantages": [[reward - 0.33] * tokens],
                    "generation_logprobs": [[-0.25] * tokens], "prev_logprobs": [[-0.25] * tokens],
                    "idx": i}) + "\n")


def rate(folder: Path, steps: int, n: int) -> tuple[float, int]:
    best, served = float("inf"), 0
    for _ in range(n):
        store = RunStore()
        ingestor = Ingestor(folder.resolve(), store, ExporterHealth())
        t0 = time.perf_counter()
        ingestor.rescan()
        ingestor.loggers.flush_all()
        store.flush()
        best = min(best, time.perf_counter() - t0)
        served = max((r.ranks[0].logged_steps for r in store.runs() if 0 in r.ranks), default=0)
    return steps / best, served


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--sample-steps", type=int, default=100)
    ap.add_argument("--samples", type=int, default=256, help="a NeMo-RL step's samples")
    ap.add_argument("--tokens", type=int, default=1024, help="each sample's tokens")
    args = ap.parse_args(argv)
    if not LOGGERS_PYTHON.exists():
        print("bench_loggers: needs .venv-loggers (make loggers-deps)", file=sys.stderr)
        return 2
    records = rows(args.steps)
    out: dict[str, object] = {"source": "bench/bench_loggers.py", "steps": args.steps,
                              "keys": KEYS}
    with tempfile.TemporaryDirectory(prefix="grpo-loggers-bench-") as tmp:
        for fmt in ("snapshots", "tensorboard", "wandb", "mlflow", "trackio"):
            folder = Path(tmp) / fmt
            folder.mkdir()
            t0 = time.perf_counter()
            write(folder, fmt, [dict(r) for r in records])
            wrote_s = time.perf_counter() - t0
            size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
            per_s, served = rate(folder, args.steps, args.n)
            out[fmt] = {"steps_per_s": round(per_s), "steps_served": served, "bytes": size,
                        "write_s": round(wrote_s, 1)}
            print(f"{fmt:>11}: {per_s:>8,.0f} steps/s on one core ({served} of {args.steps} "
                  f"served, {size / 1e6:.1f} MB on disk, written in {wrote_s:.1f} s)", flush=True)
        folder = Path(tmp) / "samples"
        t0 = time.perf_counter()
        write_samples(folder, args.sample_steps, args.samples, args.tokens)
        wrote_s = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        per_s, served = rate(folder, args.sample_steps, args.n)
        out["samples"] = {"steps_per_s": round(per_s, 1), "samples_per_s": round(per_s * args.samples),
                          "steps_served": served, "bytes": size, "write_s": round(wrote_s, 1),
                          "steps": args.sample_steps, "samples_a_step": args.samples,
                          "tokens": args.tokens}
        print(f"NeMo-RL samples: {per_s:,.1f} steps/s on one core ({per_s * args.samples:,.0f} "
              f"samples/s of {args.tokens} tokens; {served} of {args.sample_steps} served, "
              f"{size / 1e6:.1f} MB on disk)", flush=True)
    write_result(args.out, {**out, "machine": machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""examples/plain_pytorch.py's training step, with a logging fault, for tests/test_fleet.py.

    python tests/fleet_trainer.py --snapshot-dir DIR --run RUN --steps N \
        [--step-seconds S] [--stop-logging-rank R ...] [--stop-logging-at STEP]

Every rank runs the example's step (its synthetic rollout, grpo_stats, and the all-reduces that
combine the shards' statistics), under the launcher's torch.distributed environment. A rank
named by --stop-logging-rank writes no snapshot from step --stop-logging-at on, yet keeps
joining the collectives: the job goes on, and only the monitoring can tell that the rank went
silent (GRPORankStalled). --step-seconds gives every step a fixed floor, so that a test can
watch the run advance at a known pace.

The example is imported by path and reused, not changed; it has no fault flags on purpose.
Every other flag is the example's own (--run, --steps, --seed, ...).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import torch.distributed as dist
from grpo_monitor import SnapshotWriter
from grpo_monitor.sdk.torch import grpo_stats

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plain_pytorch.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("plain_pytorch", EXAMPLE)
    assert spec is not None and spec.loader is not None, EXAMPLE
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: Sequence[str] | None = None) -> None:
    plain = load_example()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    p.add_argument("--stop-logging-rank", type=int, action="append", default=[],
                   help="a rank that stops writing snapshots (repeatable)")
    p.add_argument("--stop-logging-at", type=int, default=1,
                   help="the first step those ranks do not write")
    p.add_argument("--step-seconds", type=float, default=0.0, help="sleep after each step")
    ours, rest = p.parse_known_args(argv)
    args = plain.parse_args(rest)  # the example's flags; an unknown one fails there

    device = plain.setup_distributed()
    rank = dist.get_rank() if dist.is_initialized() else 0
    silent = rank in ours.stop_logging_rank
    writer = SnapshotWriter(args.snapshot_dir, args.run)
    samples_per_rank = args.prompts_per_rank * args.group_size
    try:
        for step in range(1, args.steps + 1):
            start = time.perf_counter()
            shard = plain.synthetic_rollout(step, args, rank, device)
            stats = grpo_stats(shard["rewards"], kl=shard["kl"], entropy=shard["entropy"],
                               mask=shard["mask"], max_length=args.max_new_tokens)
            compute_s = time.perf_counter() - start
            comm_start = time.perf_counter()
            # A silent rank still takes part: without it the others would block here.
            stats = plain.combine_across_ranks(stats, device)
            comm_s = time.perf_counter() - comm_start
            if not (silent and step >= ours.stop_logging_at):
                metrics = {"perf/step_time_s": compute_s,
                           "perf/samples_per_s": samples_per_rank / compute_s,
                           "perf/comm_time_s": comm_s}
                if rank == 0:
                    metrics |= stats | {"train/lr": args.lr}
                writer.log(metrics, step)
            time.sleep(ours.step_seconds)
        # A silent rank's logging is broken: it does not mark the end either.
        writer.close(end=not silent)
    finally:
        writer.close(end=False)  # after an exception: a crash is no clean end
        if dist.is_initialized():
            if sys.exc_info()[0] is None:
                dist.barrier()  # leave together (examples/plain_pytorch.py says why)
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Without finalizing, as the example does (plain_pytorch.leave says why).
    load_example().leave(int(os.environ.get("WORLD_SIZE", "1")) > 1)

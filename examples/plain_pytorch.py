"""A GRPO-style training loop in plain PyTorch that feeds grpo-monitor.

    torchrun --nproc_per_node 2 examples/plain_pytorch.py --snapshot-dir /data/snapshots --steps 20
    python examples/plain_pytorch.py --snapshot-dir /data/snapshots --steps 20    # one process

Every rank rolls out its shard of the prompts and computes that shard's statistics with
``grpo_stats``; the shards' statistics are combined with two small all-reduces, and then
  * rank 0 logs the training signals (reward, KL, entropy, length, loss, grad norm, lr),
  * every rank logs its own performance signals (step time, samples/s, communication time),
so that a straggling rank shows in ``grpo_step_duration_seconds{rank="N"}``.

Rewards, KL, entropy and lengths are synthetic here (no model is needed to run it); the
comments marked ``REAL:`` say what a trainer puts there.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from grpo_monitor import SnapshotWriter
from grpo_monitor.sdk.torch import grpo_stats

# How shard statistics combine into whole-batch ones (shards are the same size): maxima and
# minima exactly, with a MAX all-reduce; every other key as the mean over the shards, which is
# exact for means and fractions and a close estimate for standard deviations and quantiles.
_MAX_KEYS = frozenset({"reward/max", "kl/max", "response/len_max"})
_MIN_KEYS = frozenset({"reward/min"})


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--snapshot-dir", required=True, help="the folder the exporter watches")
    p.add_argument("--run", default="plain-pytorch", help="run name: <snapshot-dir>/<run>/")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts-per-rank", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8, help="G: responses per prompt")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (0: never)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def setup_distributed() -> torch.device:
    """Join the process group when launched by torchrun (or any launcher that sets WORLD_SIZE)."""
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
        return device
    dist.init_process_group("gloo")  # reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    return torch.device("cpu")


def synthetic_rollout(step: int, args: argparse.Namespace, rank: int,
                      device: torch.device) -> dict[str, torch.Tensor]:
    """One shard's rollout: G responses per prompt, their rewards and per-token signals."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + rank * 10_007 + step)
    n_prompts, group, t_max = args.prompts_per_rank, args.group_size, args.max_new_tokens
    progress = step / max(args.steps, 1)

    # REAL: responses = policy.generate(prompts, num_return_sequences=G, max_new_tokens=T)
    lengths = torch.randint(t_max // 8, t_max + 1, (n_prompts * group,), generator=g)
    mask = torch.arange(t_max) < lengths[:, None]                    # 1 on response tokens
    # REAL: rewards = reward_fn(prompts, responses).view(n_prompts, G)
    rewards = torch.bernoulli(torch.full((n_prompts, group), 0.3 + 0.4 * progress), generator=g)
    # REAL: per-token KL to the reference model, e.g. k3 = exp(ref - logp) - (ref - logp) - 1
    kl = (0.02 + 0.03 * progress) * torch.rand(n_prompts * group, t_max, generator=g) * 2
    # REAL: entropy = -(softmax(logits) * log_softmax(logits)).sum(-1)
    entropy = (1.2 - 0.4 * progress) * torch.rand(n_prompts * group, t_max, generator=g) * 2
    out = {"rewards": rewards, "kl": kl, "entropy": entropy, "mask": mask}
    return {k: v.to(device) for k, v in out.items()}


def combine_across_ranks(stats: dict[str, float], device: torch.device) -> dict[str, float]:
    """Whole-batch statistics from every rank's shard statistics (see _MAX_KEYS)."""
    if not dist.is_initialized():
        return stats
    keys = sorted(stats)
    mean = torch.tensor([stats[k] for k in keys], dtype=torch.float64, device=device)
    extreme = torch.tensor([-stats[k] if k in _MIN_KEYS else stats[k] for k in keys],
                           dtype=torch.float64, device=device)
    dist.all_reduce(mean, op=dist.ReduceOp.SUM)
    dist.all_reduce(extreme, op=dist.ReduceOp.MAX)
    mean /= dist.get_world_size()
    out = {}
    for key, avg, ext in zip(keys, mean.tolist(), extreme.tolist()):
        out[key] = -ext if key in _MIN_KEYS else ext if key in _MAX_KEYS else avg
    return out


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    joined_here = not dist.is_initialized()
    device = setup_distributed()
    rank = dist.get_rank() if dist.is_initialized() else 0
    # rank and world_size come from torch.distributed (else RANK / WORLD_SIZE, else 0 and 1).
    writer = SnapshotWriter(args.snapshot_dir, args.run)
    samples_per_rank = args.prompts_per_rank * args.group_size
    try:
        for step in range(1, args.steps + 1):
            start = time.perf_counter()
            shard = synthetic_rollout(step, args, rank, device)
            stats = grpo_stats(shard["rewards"], kl=shard["kl"], entropy=shard["entropy"],
                               mask=shard["mask"], max_length=args.max_new_tokens)
            # REAL: loss = grpo_loss(...); loss.backward()
            #       grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            #       (its return value is the norm *before* clipping: log that one)
            #       optimizer.step(); scheduler.step()
            loss = 0.05 * math.cos(step / 3) - 0.01
            grad_norm = 0.5 + 0.2 * math.sin(step / 5)
            compute_s = time.perf_counter() - start   # this rank's own work, before it waits

            comm_start = time.perf_counter()
            stats = combine_across_ranks(stats, device)
            comm_s = time.perf_counter() - comm_start

            saved = args.save_every > 0 and step % args.save_every == 0
            # REAL: if saved: save_checkpoint(...)  -- its step time is left out of the cards

            metrics = {"perf/step_time_s": compute_s,
                       "perf/samples_per_s": samples_per_rank / compute_s,
                       "perf/comm_time_s": comm_s}
            if device.type == "cuda":
                metrics["perf/memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
            if rank == 0:
                metrics |= stats | {"loss": loss, "grad/norm": grad_norm, "train/lr": args.lr}
            writer.log(metrics, step, events=[{"type": "checkpoint_save"}] if saved else None)
        # The clean end: a run_end event tells the exporter that the silence from here on is
        # no hang (the GRPORunHung red card).
        writer.close()
    finally:
        # On an exception this closes without the end mark (after the clean close above it
        # does nothing): a crashed rank must look like one that stopped, not like one that
        # finished. A bare close() here would mark every crash as a clean end.
        writer.close(end=False)
        if joined_here and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A GRPO-style training loop in plain PyTorch that feeds grpo-monitor.

    torchrun --nproc_per_node 2 examples/plain_pytorch.py --snapshot-dir /data/snapshots --steps 20
    python examples/plain_pytorch.py --snapshot-dir /data/snapshots --steps 20    # one process

Every rank rolls out its shard of the prompts and computes that shard's statistics with
``grpo_stats``; the shards' statistics are combined with two small all-reduces, and then
  * rank 0 logs the training signals (reward, KL, entropy, length, loss, grad norm, lr),
  * every rank logs its own performance signals (step time, samples/s, communication time),
so that a straggling rank shows in ``grpo_step_duration_seconds{rank="N"}``.

Every rank passes the same step boundary through ``PauseGate``: a red card pauses all ranks at
one step, whichever node's exporter got it, and they wait without a collective outstanding.
After ``grpo-monitor resume RUN`` they go on together from the last healthy checkpoint (model,
optimizer, scheduler, RNG streams and step restored in place), unless the person chose
``--no-rollback`` or ``--rollback-to STEP``. ``--inject-nan-at STEP`` makes rank 0 log a NaN
loss once at that step, to watch the whole loop (card, pause, resume, rollback).

Rewards, KL, entropy and lengths are synthetic here (no model is needed to run it); the
comments marked ``REAL:`` say what a trainer puts there.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from grpo_monitor import SnapshotWriter
from grpo_monitor.sdk.checkpoint import load_training_state, save_rng_state, save_training_state
from grpo_monitor.sdk.pause import PauseGate
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
    p.add_argument("--checkpoint-dir", default=None,
                   help="where checkpoints go (default: checkpoints/<run>); outside the "
                        "snapshot folder, which the exporter reads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-time-s", type=float, default=0.0,
                   help="extra seconds of synthetic compute per step (a slower, more real pace)")
    p.add_argument("--dist-timeout-s", type=float, default=600.0,
                   help="torch.distributed collective timeout (PyTorch's default: 10 minutes)")
    p.add_argument("--pause-poll-s", type=float, default=1.0,
                   help="while paused, how often the ranks agree whether to go on; keep it well "
                        "under --dist-timeout-s")
    p.add_argument("--inject-nan-at", type=int, default=None, metavar="STEP",
                   help="rank 0 logs a NaN loss once at this step (to see the red-card loop)")
    return p.parse_args(argv)


def setup_distributed(timeout_s: float = 600.0) -> torch.device:
    """Join the process group when launched by torchrun (or any launcher that sets WORLD_SIZE)."""
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return torch.device("cpu")
    timeout = timedelta(seconds=timeout_s)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout)
        return device
    # reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    dist.init_process_group("gloo", timeout=timeout)
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


class Policy(torch.nn.Module):
    """A stand-in for the policy, so that a rollback has real state to restore. REAL: your model."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def train_step(model: Policy, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler, device: torch.device) -> tuple[float, float]:
    """One optimizer step on a toy objective, gradients averaged over the ranks as DDP does.
    REAL: loss = grpo_loss(logp, old_logp, ref_logp, advantages); loss.backward()."""
    x = torch.randn(32, 16, device=device)
    loss = (model(x) - 1.0).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    if dist.is_initialized():
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
    # clip_grad_norm_ returns the norm before clipping: that is the one to log
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0))
    optimizer.step()
    scheduler.step()
    return float(loss.detach()), grad_norm


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    joined_here = not dist.is_initialized()
    device = setup_distributed(args.dist_timeout_s)
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.manual_seed(args.seed + rank)
    model = Policy().to(device)
    if dist.is_initialized():  # every rank starts from rank 0's weights, as DDP does
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))
    ckpt_dir = args.checkpoint_dir or os.path.join("checkpoints", args.run)
    # rank and world_size come from torch.distributed (else RANK / WORLD_SIZE, else 0 and 1).
    writer = SnapshotWriter(args.snapshot_dir, args.run)
    gate = PauseGate(writer, poll_interval=args.pause_poll_s)
    samples_per_rank = args.prompts_per_rank * args.group_size
    nan_injected = False
    try:
        step = 1
        while step <= args.steps:
            # The step boundary: every rank asks the same question at the same point. Paused,
            # all ranks wait here together; resumed, they all get the same decision.
            decision = gate.check(step)
            if decision is not None and decision.rollback_path is not None:
                last, _ = load_training_state(decision.rollback_path, model=model,
                                              optimizer=optimizer, scheduler=scheduler,
                                              rank=rank, map_location=device)
                writer.log({}, last, events=[{"type": "rollback", "from_step": step,
                                              "to_step": last}])
                step = last + 1
                continue
            start = time.perf_counter()
            shard = synthetic_rollout(step, args, rank, device)
            stats = grpo_stats(shard["rewards"], kl=shard["kl"], entropy=shard["entropy"],
                               mask=shard["mask"], max_length=args.max_new_tokens)
            loss, grad_norm = train_step(model, optimizer, scheduler, device)
            if args.step_time_s:
                time.sleep(args.step_time_s)  # synthetic compute
            compute_s = time.perf_counter() - start   # this rank's own work, before it waits

            comm_start = time.perf_counter()
            stats = combine_across_ranks(stats, device)
            comm_s = time.perf_counter() - comm_start

            events = None
            if args.save_every > 0 and step % args.save_every == 0:
                # With DDP the ranks hold the same weights: rank 0 saves them, the others learn
                # the path from it on a rollback. Its step time is left out of the cards.
                path = os.path.join(ckpt_dir, f"step-{step:07d}.pt")
                if rank == 0:
                    save_training_state(path, step=step, model=model, optimizer=optimizer,
                                        scheduler=scheduler)
                else:  # each rank draws its own samples: its random streams are its own
                    save_rng_state(path, rank)
                events = [{"type": "checkpoint_save", **({"path": path} if rank == 0 else {})}]

            metrics = {"perf/step_time_s": compute_s,
                       "perf/samples_per_s": samples_per_rank / compute_s,
                       "perf/comm_time_s": comm_s}
            if device.type == "cuda":
                metrics["perf/memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
            if rank == 0:
                if args.inject_nan_at == step and not nan_injected:
                    nan_injected, loss = True, math.nan
                metrics |= stats | {"loss": loss, "grad/norm": grad_norm,
                                    "train/lr": scheduler.get_last_lr()[0]}
            writer.log(metrics, step, events=events)
            step += 1
        # The clean end: a run_end event tells the exporter that the silence from here on is
        # no hang (the GRPORunHung red card).
        writer.close()
    finally:
        # On an exception this closes without the end mark (after the clean close above it
        # does nothing): a crashed rank must look like one that stopped, not like one that
        # finished. A bare close() here would mark every crash as a clean end.
        writer.close(end=False)
        if joined_here and dist.is_initialized():
            # Leave together: a rank that tears its connections down while a peer still uses
            # them can abort that peer at exit (gloo).
            if sys.exc_info()[0] is None:
                dist.barrier()
            dist.destroy_process_group()


def leave(joined: bool) -> None:
    """End the process. A rank that joined a process group leaves without finalizing the
    interpreter: Gloo's worker threads release a finished collective's tensors on their own
    time, and a release that comes while the interpreter shuts down needs the GIL it no longer
    gives, which aborts the rank ("terminate called without an active exception", exit -6)
    after every step ran, about one run in three on a busy machine. Everything is written and
    closed by then: only the finalizers are skipped."""
    if not joined:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    leave(int(os.environ.get("WORLD_SIZE", "1")) > 1)

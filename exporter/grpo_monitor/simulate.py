"""Synthetic GRPO runs written through the real SDK, for the demo and the tests.

A healthy run, shaped as the seeds describe one (seed 000 §2.1-§2.3, table §3.3): reward rises
and its std settles, KL climbs fast then flattens, entropy falls 30-60% and levels off, response
length stays within ±15%, grad norm oscillates in a band, and a checkpoint is saved every so
often (a longer step, as seed §4.5 warns).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from grpo_monitor.sdk.writer import SnapshotWriter

CHECKPOINT_EVERY = 500
PROMPT_TYPES = ("easy", "medium", "hard")


@dataclass
class StepRecord:
    step: int
    metrics: dict[str, float]
    by_type: dict[str, dict[str, float]]
    events: list[dict[str, object]]


def healthy_run(steps: int, *, seed: int = 0, step_seconds: float = 5.0) -> Iterator[StepRecord]:
    """Rank 0's training signals of a healthy run, step by step."""
    rng = random.Random(seed)
    for step in range(1, steps + 1):
        progress = 1 - math.exp(-step / 800)  # fast early learning that flattens
        reward = 0.2 + 0.5 * progress + rng.gauss(0, 0.02)
        reward_std = 0.25 + 0.05 * (1 - math.exp(-step / 150)) + rng.gauss(0, 0.005)
        kl = 0.3 * (1 - math.exp(-step / 300)) + abs(rng.gauss(0, 0.005))
        entropy = 1.5 * (0.55 + 0.45 * math.exp(-step / 600)) * (1 + rng.gauss(0, 0.01))
        length = 300 * (1 + 0.05 * math.sin(step / 200)) + rng.gauss(0, 6)
        checkpoint = step % CHECKPOINT_EVERY == 0
        metrics = {
            "reward/mean": reward,
            "reward/std": reward_std,
            "reward/min": reward - 2.2 * reward_std,
            "reward/max": min(1.0, reward + 2.2 * reward_std),
            "reward/p25": reward - 0.67 * reward_std,
            "reward/p50": reward + rng.gauss(0, 0.01),
            "reward/p75": reward + 0.67 * reward_std,
            "reward/p95": reward + 1.6 * reward_std,
            "group/reward_gap": 1.2 * reward_std + rng.gauss(0, 0.01),
            "group/reward_std": 0.8 * reward_std,
            "group/zero_std_frac": max(0.0, 0.08 + rng.gauss(0, 0.02)),
            "adv/mean_abs": 0.78 + rng.gauss(0, 0.02),
            "kl/mean": kl,
            "kl/p95": kl * 2.2,
            "kl/max": kl * 3.5 * (1 + abs(rng.gauss(0, 0.1))),
            "entropy/mean": entropy,
            "response/len_mean": length,
            "response/len_max": 1024 if step % 7 else 900,
            "response/clip_ratio": max(0.0, 0.02 + rng.gauss(0, 0.005)),
            "policy/clip_frac": max(0.0, 0.05 + rng.gauss(0, 0.01)),
            "loss": rng.gauss(0, 0.05) - 0.01 * progress,
            "grad/norm": 0.9 + 0.1 * math.sin(step / 13) + abs(rng.gauss(0, 0.05)),
            "train/lr": 1e-6 * min(1.0, step / 50),
            "eval/sample_acc": 0.25 + 0.45 * progress + rng.gauss(0, 0.02),
            "perf/step_time_s": step_seconds * (1 + rng.gauss(0, 0.03)) + (step_seconds * 4 if checkpoint else 0),
            "perf/samples_per_s": 64 / step_seconds * (1 + rng.gauss(0, 0.03)),
        }
        by_type = {
            t: {"reward/mean": reward + offset, "reward/std": reward_std}
            for t, offset in zip(PROMPT_TYPES, (0.15, 0.0, -0.15))
        }
        events: list[dict[str, object]] = (
            [{"type": "checkpoint_save", "step": step, "duration_s": step_seconds * 4}] if checkpoint else [])
        yield StepRecord(step, metrics, by_type, events)


def write_run(
    snapshot_dir: Path,
    run: str,
    steps: int,
    *,
    ranks: int = 1,
    step_seconds: float = 5.0,
    realtime: bool = False,
    seed: int = 0,
) -> None:
    """Write a healthy run: rank 0 with the training signals, every rank with its performance.

    ``realtime`` sleeps ``step_seconds`` between steps (the demo); otherwise it writes as fast as
    the disk allows (tests).
    """
    writers = [SnapshotWriter(snapshot_dir, run, rank=r, world_size=ranks) for r in range(ranks)]
    try:
        for rec in healthy_run(steps, seed=seed, step_seconds=step_seconds):
            for rank, writer in enumerate(writers):
                if rank == 0:
                    writer.log(rec.metrics, rec.step, by_type=rec.by_type, events=rec.events or None)
                else:
                    perf = {k: v for k, v in rec.metrics.items() if k.startswith("perf/")}
                    writer.log(perf, rec.step)
            if realtime:
                time.sleep(step_seconds)
    finally:
        for writer in writers:
            writer.close()

"""A run's timeline: after a rollback, a resume or a step logged again, every series the store
serves for the run equals what a store fed only the surviving records serves
(docs/signals.md#a-runs-timeline). Counters (NaNs seen, events) keep counting, as counters do.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from timeline_reference import series_lines, surviving

from grpo_monitor.contract.snapshot import parse_record
from grpo_monitor.runtime import exposition as ex
from grpo_monitor.runtime.store import Limits, RunStore

RUN = "timeline"
TRAINING = ("reward/mean", "reward/std", "kl/mean", "entropy/mean", "response_length/mean",
            "loss/policy", "grad_norm", "response_length/clip_ratio")


def served(records: list[dict[str, Any]], limits: Limits) -> dict[str, set[str]]:
    store = RunStore(limits)
    for rec in records:  # the file's mtime is that of the last write, undone or not
        store.apply(parse_record(rec, run=RUN, rank=rec.get("rank", 0), mtime=5000.0), wrote_at=5000.0)
    families: dict[str, set[str]] = {}
    for family, line in series_lines(store):
        families.setdefault(family, set()).add(line)
    return families


def step_record(step: int, rank: int, rng: random.Random, phase: float) -> dict[str, Any]:
    """One step: training keys on rank 0 (a drift of ``phase``), performance keys on every rank,
    sometimes a NaN, a checkpoint save, a held-out point or a prompt type's reward."""
    metrics: dict[str, float] = {"perf/step_time_s": 1.0 + rng.random() * 0.1 + phase}
    events: list[dict[str, Any]] = []
    if rank == 0:
        for i, key in enumerate(TRAINING):
            metrics[key] = 0.5 + 0.1 * i + phase * (i + 1) + rng.gauss(0, 0.05)
        if rng.random() < 0.02:
            metrics["loss/policy"] = math.nan
        if step % 10 == 0:
            metrics["eval/heldout_score"] = 0.6 - phase + rng.gauss(0, 0.01)
    if step % 25 == 0:
        events.append({"type": "checkpoint_save", "duration_s": 3.0})
    rec: dict[str, Any] = {"step": step, "rank": rank, "time": 1000.0 + step, "metrics": metrics,
                           "events": events}
    if rank == 0 and step % 3:
        rec["by_type"] = {"math": {"reward/mean": 0.4 + phase + rng.gauss(0, 0.02)}}
    return rec


def timeline(seed: int, ranks: int = 2) -> list[dict[str, Any]]:
    """A run of a few hundred steps with rewinds: resumes from an earlier step (a crash), rollback
    marks followed by the steps after them, a step logged again; logging every step or every
    few steps."""
    rng = random.Random(seed)
    every = rng.choice((1, 1, 2, 5))
    records: list[dict[str, Any]] = []
    step, phase = 0, 0.0
    for _ in range(rng.randint(3, 6)):
        for _ in range(rng.randint(20, 160) // every):
            step += every
            phase += rng.gauss(0, 0.01)
            records += [step_record(step, r, rng, phase) for r in range(ranks)]
        kind = rng.choice(("resume", "rollback", "again"))
        back = max(0, step - every * rng.randint(1, 60))
        if kind == "rollback":
            records += [{"step": back, "rank": r, "metrics": {},
                         "events": [{"type": "rollback", "from_step": step + 1, "to_step": back}]}
                        for r in range(ranks)]
            step = back
        elif kind == "resume":
            step = back  # the next step logged is older than the newest
        else:
            records.append(step_record(step, 0, rng, phase))  # the newest step logged again
        phase = rng.gauss(0, 0.05)
    for _ in range(rng.randint(5, 80)):
        step += every
        records += [step_record(step, r, rng, phase) for r in range(ranks)]
    return records


LIMITS = Limits(baseline_steps=60, initial_steps=10)


def assert_same(records: list[dict[str, Any]], limits: Limits = LIMITS) -> None:
    got, want = served(records, limits), served(surviving(records), limits)
    assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())
    for family in want:
        assert got[family] == want[family], (family, sorted(got[family] ^ want[family])[:6])


@pytest.mark.parametrize("seed", range(40))
def test_every_series_after_rewinds_is_that_of_the_surviving_records(seed: int) -> None:
    assert_same(timeline(seed))


def test_a_rollback_inside_the_baseline_re_forms_it() -> None:
    """The issue's run: sick from step 45, paused at 69, rolled back to the step-20 checkpoint,
    healthy to step 280. Its baseline, working level and logged steps are those of steps 1..280
    as the second pass logged them; the first pass's sick values are nowhere."""
    rng = random.Random(7)
    records = [step_record(s, 0, rng, 0.0 if s < 45 else -0.4) for s in range(1, 70)]
    records.append({"step": 20, "metrics": {},
                    "events": [{"type": "rollback", "from_step": 70, "to_step": 20}]})
    records += [step_record(s, 0, rng, 0.0) for s in range(21, 281)]
    assert_same(records, Limits())
    lines = served(records, Limits())
    assert lines[ex.RUN_LOGGED_STEPS.name] == {f'{ex.RUN_LOGGED_STEPS.name}{{run="{RUN}"}} 280'}


def test_a_resume_from_an_older_checkpoint_counts_each_step_once() -> None:
    """A crash after step 260, resumed from the step-215 checkpoint, on to 330: 330 steps."""
    rng = random.Random(3)
    records = [step_record(s, 0, rng, 0.0) for s in (*range(1, 261), *range(216, 331))]
    assert_same(records, Limits())
    lines = served(records, Limits())
    assert lines[ex.RUN_LOGGED_STEPS.name] == {f'{ex.RUN_LOGGED_STEPS.name}{{run="{RUN}"}} 330'}


def test_a_rewind_before_the_first_step_leaves_nothing_of_the_old_steps() -> None:
    rng = random.Random(5)
    records = [step_record(s, 0, rng, 0.3) for s in range(10, 200)]
    records += [step_record(s, 0, rng, 0.0) for s in range(1, 50)]
    assert_same(records, Limits())

"""Re-baselining a run (seed 000 §3.3): a control file next to the run's snapshots.

``grpo-monitor rebaseline`` writes ``<snapshot_dir>/<run>/.grpo-baseline.json`` =
``{"at_step": S, "steps": N}``: each rank's N steps up to step S become its new baseline. The
file stays, so an exporter that restarts and replays the run re-applies it when the replay
reaches step S — the baseline survives the restart.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, PositiveInt

from grpo_monitor.snapshot import MAX_INT, Count, decode_record

CONTROL_NAME = ".grpo-baseline.json"
_TAIL_BYTES = 1 << 16


class RebaselineRequest(BaseModel):
    at_step: Count
    steps: PositiveInt


def newest_step(run_dir: Path) -> int | None:
    """The highest step in the last lines of the run's *.jsonl files."""
    best: int | None = None
    for path in run_dir.rglob("*.jsonl"):
        try:
            with open(path, "rb") as fh:
                fh.seek(max(0, path.stat().st_size - _TAIL_BYTES))
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in reversed(lines):
            try:
                record = decode_record(line)
                step = record.get("step", record.get("_step"))
            except (ValueError, AttributeError):  # not JSON (a RecordError), not an object
                continue
            if isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= MAX_INT:
                best = step if best is None else max(best, step)
                break
    return best


def request_rebaseline(snapshot_dir: Path, run: str, *, steps: int, at_step: int | None) -> tuple[Path, int]:
    """Write the run's control file atomically; return its path and the step it applies at."""
    run_dir = snapshot_dir / run
    if not run_dir.is_dir():
        raise ValueError(f"no run folder {run_dir}")
    if at_step is None:
        at_step = newest_step(run_dir)
        if at_step is None:
            raise ValueError(f"no step found in {run_dir}/*.jsonl; pass --at-step")
    req = RebaselineRequest(at_step=at_step, steps=steps)
    path = run_dir / CONTROL_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(req.model_dump_json() + "\n")
    os.replace(tmp, path)
    return path, at_step

"""Re-baselining a run (background.md#thresholds): a control file next to the run's snapshots.

``grpo-monitor rebaseline`` writes ``{"at_step": S, "steps": N}`` to
``<snapshot_dir>/<run>/.grpo-baseline.json`` (run_layout.REBASELINE_REQUEST): each rank's N
steps up to step S become its new baseline. The file stays, so an exporter that restarts and
replays the run re-applies it when the replay reaches step S — the baseline survives the
restart. The run's files are read, and the request written, through safe_io: a linked run
folder is refused, a link or FIFO among the files is skipped (and named) unread, one in the
request's place replaced.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pydantic import BaseModel, PositiveInt

from grpo_monitor.contract.run_layout import (
    REBASELINE_REQUEST,
    folder_name,
    is_appended,
    run_files,
    write_control_file,
)
from grpo_monitor.contract.safe_io import Refused, is_plain_folder, open_regular, printable
from grpo_monitor.contract.snapshot import MAX_INT, Count, decode_record

log = logging.getLogger("grpo_monitor.runtime.rebaseline")

_TAIL_BYTES = 1 << 16


class RebaselineRequest(BaseModel):
    at_step: Count
    steps: PositiveInt


def newest_step(run_dir: Path) -> int | None:
    """The highest step in the last lines of the run's *.jsonl files (run_layout.run_files)."""
    best: int | None = None
    for path in run_files(run_dir):
        if not is_appended(path):  # a *.json file is one record, its step not in a last line
            continue
        try:
            with open_regular(run_dir, path) as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - _TAIL_BYTES))
                lines = fh.read(_TAIL_BYTES).splitlines()
        except Refused as exc:
            log.warning("%s: %s, not read", printable(path), exc.what)
            continue
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
    """Write the run's re-baseline request atomically; return its path and the step it applies
    at. ValueError for a run name that names no run folder, or a run without steps."""
    run_dir = Path(snapshot_dir) / folder_name(run)
    try:
        if not is_plain_folder(snapshot_dir, run_dir):
            raise ValueError(f"no run folder {run_dir}")
    except Refused as exc:
        raise ValueError(f"{run_dir}: {exc.what}, never followed; the exporter does not read "
                         "it either") from None
    if at_step is None:
        at_step = newest_step(run_dir)
        if at_step is None:
            raise ValueError(f"no step found in {run_dir}/*.jsonl; pass --at-step")
    req = RebaselineRequest(at_step=at_step, steps=steps)
    path = run_dir / REBASELINE_REQUEST
    try:
        write_control_file(path, (req.model_dump_json() + "\n").encode(), root=snapshot_dir)
    except Refused as exc:  # the run folder became a link meanwhile
        raise ValueError(f"{run_dir}: {exc.what}, never followed") from None
    return path, at_step

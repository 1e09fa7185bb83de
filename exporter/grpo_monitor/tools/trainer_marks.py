"""What a run's trainer said about a pause, read from the tails of its snapshot files.

A resume record asks; the trainer decides. PauseGate marks the pause (``paused``) and the resume
(``resumed``) in every rank's file, and a trainer that loads a checkpoint logs a rollback mark
(``{"type": "rollback", "from_step": 70, "to_step": 20}``). So ``resume`` and ``stack up`` say
a rollback only once a rank has logged one, and otherwise that the trainer went on where it
stopped. Only the last TAIL_BYTES of each rank's live file are read, through safe_io (no link
followed, no FIFO opened), so a look costs the same at step 100 and 100,000.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_monitor.contract.run_layout import rotation_of, run_files
from grpo_monitor.contract.safe_io import open_regular
from grpo_monitor.contract.snapshot import ROLLBACK, RecordError, decode_record, identity_from_path

TAIL_BYTES = 64 << 10


@dataclass(frozen=True)
class TrainerAnswer:
    """What the trainer did after its newest resume mark: rolled back to ``to_step``, or went
    on (``to_step`` None) at ``step``."""

    rank: int
    step: int
    to_step: int | None


def _live_files(run_dir: Path) -> Iterator[Path]:
    for path in run_files(run_dir):
        if path.name.endswith(".jsonl") and rotation_of(path.name)[1] is None:
            yield path  # a rotated segment is history


def file_sizes(run_dir: Path) -> dict[Path, int]:
    """Each live snapshot file's size now: what trainer_answer(since=...) leaves out."""
    sizes = {}
    for path in _live_files(run_dir):
        try:
            sizes[path] = os.lstat(path).st_size
        except OSError:
            continue
    return sizes


def _tail(run_dir: Path, since: dict[Path, int] | None = None
          ) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(rank, its complete records in the last TAIL_BYTES) of each live snapshot file; with
    ``since``, only the records that end past the size it gives for the file."""
    for path in _live_files(run_dir):
        try:
            with open_regular(run_dir, path) as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(max(0, size - TAIL_BYTES))
                tail = fh.read(TAIL_BYTES)
        except OSError:  # gone, unreadable, or refused (a link, a FIFO)
            continue
        start = max(0, size - TAIL_BYTES)
        skip = (since or {}).get(path, 0)
        lines = tail.split(b"\n")
        offsets, end = [], start
        for line in lines:
            end += len(line) + 1
            offsets.append(end)
        records = []
        for i, line in enumerate(lines[:-1]):  # whole lines only
            if (i == 0 and start > 0) or offsets[i] <= skip:
                continue
            try:
                rec = decode_record(line)
            except RecordError:
                continue
            if isinstance(rec, dict):
                records.append(rec)
        yield identity_from_path(path, run_dir.parent)[1], records


def _events(rec: dict[str, Any]) -> list[dict[str, Any]]:
    events = rec.get("events")
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def ranks_waiting(run_dir: Path) -> list[int]:
    """The ranks whose snapshot file here ends with a ``paused`` mark: PauseGate holds them (it
    marks the pause in every rank's file, so a node whose folder lacks the card's record still
    knows)."""
    return sorted({rank for rank, records in _tail(run_dir)
                   if records and any(e.get("type") == "paused" for e in _events(records[-1]))})


def trainer_answer(run_dir: Path, since: dict[Path, int] | None = None) -> TrainerAnswer | None:
    """The lowest rank's answer to its newest resume (written past ``since``, file_sizes() of
    before the pause or the resume): its rollback mark, or the first step it logged after the
    resume without one; None while no rank has answered (or none resumed)."""
    for rank, records in sorted(_tail(run_dir, since), key=lambda item: item[0]):
        resumed = max((i for i, rec in enumerate(records)
                       if any(e.get("type") == "resumed" for e in _events(rec))), default=None)
        if resumed is None:
            continue
        for rec in records[resumed + 1:]:
            back = next((e for e in _events(rec) if e.get("type") == ROLLBACK), None)
            step = _int(rec.get("step"))
            if back is not None and _int(back.get("to_step")) is not None:
                return TrainerAnswer(rank, step if step is not None else 0, _int(back["to_step"]))
            if rec.get("metrics") and step is not None:
                return TrainerAnswer(rank, step, None)
    return None

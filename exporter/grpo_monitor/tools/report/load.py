"""A run's records, read back: every snapshot file of the run folder, in the order it was written.

Rank 0's records give the training signals, one set per step: when a step is logged twice, the
latest record wins (by its ``time``, then by the order the files were written in). Every rank
gives its ``perf/*`` signals, and its events (checkpoint saves). A run's timeline is the one the
exporter judges (docs/signals.md#a-runs-timeline): a rollback mark undoes the steps after its
``to_step``, a step older than the rank's newest the steps from it on; the undone steps are left
out and listed (``RunData.undone``). Lines that are not a record are skipped and counted. Files are opened through safe_io, the run folder being the tree: a link,
FIFO or device among them is skipped unread, and named on stderr.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from grpo_monitor.contract.logger_layout import READER_FORMATS, logger_format
from grpo_monitor.contract.logger_rows import as_snapshot_row, log_rows
from grpo_monitor.contract.run_layout import is_appended, is_hidden, run_files, run_label
from grpo_monitor.contract.safe_io import Refused, lines, open_regular, printable, walk
from grpo_monitor.contract.snapshot import (
    RecordError,
    Snapshot,
    Timeline,
    decode_record,
    identity_from_path,
    parse_record,
)
from grpo_monitor.runtime.ingest import DEFAULT_MAX_FILE_BYTES as MAX_FILE_BYTES
from grpo_monitor.runtime.ingest import DEFAULT_MAX_LINE_BYTES as MAX_LINE_BYTES
from grpo_monitor.runtime.loggers.sources import read_file

log = logging.getLogger("grpo_monitor.report")


@dataclass
class RunData:
    run: str
    path: Path
    records: int = 0
    bad_lines: int = 0
    refused: list[Path] = field(default_factory=list)  # links, FIFOs, devices: not read
    # rank 0's training signals: step -> canonical key -> value (latest record per step wins)
    train: dict[int, dict[str, float]] = field(default_factory=dict)
    by_type: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)
    # per rank: step -> perf key -> value
    perf: dict[int, dict[int, dict[str, float]]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    # Rank 0's undone spans, in the order they were undone: (first undone step, last undone
    # step, the step the run went back to).
    undone: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return sorted(self.train)

    def series(self, key: str) -> np.ndarray:
        """``key``'s value at each logged step of rank 0, NaN where that step did not log it."""
        return np.array([self.train[s].get(key, math.nan) for s in self.steps], dtype=float)

    def has(self, key: str) -> bool:
        return any(key in m for m in self.train.values())


def load_run(run_dir: Path | str) -> RunData:
    """Every record of the run folder (all ranks, rotated segments, *.json), bad lines skipped;
    and of the loggers' files below it (docs/loggers.md): a W&B run folder, a TensorBoard log
    folder, a folder with a framework's JSONL file or a trainer's checkpoints is a run too."""
    run_dir = Path(run_dir)
    # The name goes into UTF-8 files: one that is not UTF-8 on disk is written escaped.
    reader = _Reader(RunData(run=run_label(run_dir.name), path=run_dir))
    for path in run_files(run_dir):
        run, rank = identity_from_path(path, run_dir.parent)
        try:
            fh = open_regular(run_dir, path)
        except Refused as exc:
            reader.refused(path, exc)
            continue
        except OSError:
            continue
        with fh:
            reader.file(fh, path, run, rank)
    _logger_files(run_dir, reader)
    return reader.data


def _logger_files(run_dir: Path, reader: _Reader) -> None:
    """The W&B run files, TensorBoard event files and databases below ``run_dir``, oldest
    first; their runs are reported as one (say so when they are several)."""
    found: list[tuple[float, Path, str]] = []
    for folder, entries in walk(run_dir, descend=lambda name: not is_hidden(name)):
        for entry in entries:
            fmt = logger_format(entry.name)
            if fmt in READER_FORMATS and entry.is_file(follow_symlinks=False):
                found.append((entry.stat(follow_symlinks=False).st_mtime, folder / entry.name, fmt))
    names: set[str] = set()
    for mtime, path, fmt in sorted(found):
        try:
            rows, problems = read_file(run_dir, path, fmt)
        except Refused as exc:
            reader.refused(path, exc)
            continue
        except OSError:
            continue
        for problem in problems:
            log.warning("%s: %s", printable(path), printable(problem))
        reader.data.bad_lines += sum(not p.startswith("unreadable_format") for p in problems)
        for run, row in rows:
            names.add(run)
            try:
                snap = parse_record(row, run=run, rank=0, mtime=mtime)
            except RecordError:
                reader.data.bad_lines += 1
                continue
            reader.record(snap, True)
    if len(names) > 1:
        log.warning("%s holds %d logger runs (%s): reported as one; give one run's folder",
                    printable(run_dir), len(names), ", ".join(sorted(names)))


class _Reader:
    """The records of a run's files, in the order written, into RunData."""

    def __init__(self, data: RunData) -> None:
        self.data = data
        self.latest: dict[int, tuple[float, int]] = {}  # step -> (time, order) of the record kept
        self.timeline = Timeline()
        self.order = 0

    def refused(self, path: Path, exc: Refused) -> None:
        """A link, FIFO or device where a file of the run would be read: skipped, named."""
        self.data.refused.append(path)
        log.warning("%s: %s, not read", printable(path), exc.what)

    def file(self, fh: BinaryIO, path: Path, run: str, rank: int) -> None:
        """One file, streamed: memory stays bounded whatever it holds (a line over
        MAX_LINE_BYTES, or a *.json over MAX_FILE_BYTES, is a bad line, skipped)."""
        mtime = os.fstat(fh.fileno()).st_mtime
        appended = is_appended(path)
        if appended:
            raws: Iterable[bytes | None] = (line for _, line in lines(fh, MAX_LINE_BYTES, last=True))
        else:
            whole = fh.read(MAX_FILE_BYTES + 1)
            raws = [None if len(whole) > MAX_FILE_BYTES else whole]
        fmt = logger_format(path.name)
        for raw in raws:
            if raw is not None and not raw.strip():
                continue
            try:
                if raw is None:
                    raise RecordError("oversized", "over the size read")
                obj = decode_record(raw)
                objs = obj if isinstance(obj, list) and not appended else [obj]
                if fmt == "jsonl":  # a framework's own row (contract/logger_rows.py)
                    objs = [as_snapshot_row(o) for o in objs]
                elif not appended and (rows := log_rows(obj)) is not None:
                    objs = rows  # a whole log in one document (trainer_state.json)
                snaps = [parse_record(o, run=run, rank=rank, mtime=mtime) for o in objs]
            except RecordError:
                self.data.bad_lines += 1
                continue
            for snap in snaps:
                self.record(snap, appended)

    def rewind(self, rank: int, keep_through: int) -> None:
        """The rank's steps after ``keep_through`` are undone (docs/signals.md#a-runs-timeline)."""
        perf = self.data.perf.get(rank, {})
        for step in [s for s in perf if s > keep_through]:
            del perf[step]
        if rank != 0:
            return
        gone = [s for s in self.data.train if s > keep_through]
        if gone:
            self.data.undone.append((min(gone), max(gone), keep_through))
        for step in gone:
            del self.data.train[step]
            self.data.by_type.pop(step, None)
            self.latest.pop(step, None)

    def record(self, snap: Snapshot, appended: bool) -> None:
        data = self.data
        self.order += 1
        data.records += 1
        # A *.json file holds its latest record only: its steps say nothing of a timeline.
        step_record = appended and bool(snap.metrics or snap.unknown or snap.by_type)
        keep = self.timeline.undone_after(snap.rank, snap.step, step_record, snap.events)
        if keep is not None:
            self.rewind(snap.rank, keep)
        perf = {k: v for k, v in snap.metrics.items() if k.startswith("perf/")}
        if perf:
            data.perf.setdefault(snap.rank, {}).setdefault(snap.step, {}).update(perf)
        for ev in snap.events:
            data.events.append({"step": snap.step if ev.step is None else ev.step,
                                "rank": snap.rank, "type": ev.type})
        train = {k: v for k, v in snap.metrics.items() if not k.startswith("perf/")}
        if snap.rank != 0 or not (train or snap.by_type):
            return
        key = (snap.time, self.order)
        if snap.step in self.latest and self.latest[snap.step] > key:
            return
        self.latest[snap.step] = key
        data.train[snap.step] = train
        if snap.by_type:
            data.by_type[snap.step] = snap.by_type
        else:
            data.by_type.pop(snap.step, None)

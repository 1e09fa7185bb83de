"""A run's records, read back as the exporter reads them: its ingest (runtime/ingest.py) reads the
run folder -- every rank, rotated segments, *.json, the run's key map, the loggers' files below
it, one source a run -- and hands each record its store takes to the report.

Rank 0's records give the training signals, one set per step: when a step is logged twice, the
latest record wins (by its ``time``, then by the order the files were read in). Every rank
gives its ``perf/*`` signals, and its events (checkpoint saves). A run's timeline is the one the
exporter judges (docs/signals.md#a-runs-timeline): a rollback mark undoes the steps after its
``to_step``, a step older than the rank's newest the steps from it on; the undone steps are left
out and listed (``RunData.undone``). What the ingest could not use is counted (bad lines); a
link, FIFO or device among the files is skipped unread, and named on stderr.
"""

from __future__ import annotations

import logging
import math
from array import array
from bisect import bisect_right, insort
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from grpo_monitor.contract.logger_layout import READER_FORMATS, logger_format
from grpo_monitor.contract.run_layout import is_appended, run_label
from grpo_monitor.contract.safe_io import NOT_REGULAR, SYMLINK, printable
from grpo_monitor.contract.snapshot import Snapshot, Timeline
from grpo_monitor.runtime.health import ExporterHealth
from grpo_monitor.runtime.ingest import Ingestor
from grpo_monitor.runtime.store import RunStore
from grpo_monitor.tools.report.declared import PERF_READINGS, take, take_any, take_types

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
    # rank 0's features a declared card branch compares, as the exporter's store had them just
    # after each logged step (declared.take): step -> the values of declared.READINGS
    readings: dict[int, array] = field(default_factory=dict)
    # each rank's performance features as they stood after each of its performance records
    # (declared.PERF_READINGS): rank -> step -> values
    perf_readings: dict[int, dict[int, array]] = field(default_factory=dict)
    # rank 0's prompt types' features (declared.TYPE_READINGS) after each of its logged steps:
    # step -> prompt type -> values
    type_readings: dict[int, dict[str, array]] = field(default_factory=dict)
    # rank 0's readings of any key (declared.ANY_READINGS: its NaN / Inf counts), of the keys that
    # had one, after each of its logged steps: step -> key -> values
    any_readings: dict[int, dict[str, array]] = field(default_factory=dict)

    @property
    def steps(self) -> list[int]:
        return sorted(self.train)

    def series(self, key: str) -> np.ndarray:
        """``key``'s value at each logged step of rank 0, NaN where that step did not log it."""
        return np.array([self.train[s].get(key, math.nan) for s in self.steps], dtype=float)

    def has(self, key: str) -> bool:
        return any(key in m for m in self.train.values())


def load_run(run_dir: Path | str) -> RunData:
    """Every record of the run folder, read as the exporter reads it (its ingest: all ranks,
    rotated segments, *.json, the run's key map, the loggers' files below it with one source a
    run, docs/loggers.md): a W&B run folder, a TensorBoard log folder, a folder with a
    framework's JSONL file or a trainer's checkpoints is a run too. Bad lines are skipped and
    counted; links, FIFOs and devices are not read, and named."""
    run_dir = Path(run_dir)
    where = run_dir.absolute()  # "." or "run": the ingest's root must be a folder above it
    # The name goes into UTF-8 files: one that is not UTF-8 on disk is written escaped.
    store = RunStore()
    reader = _Reader(RunData(run=run_label(where.name), path=run_dir), store)
    ingestor = Ingestor(where.parent, store, _Problems(reader))
    ingestor.on_record = reader.taken
    ingestor.scan_folder(where)  # the start-up replay's way: oldest first, to the end
    ingestor.loggers.flush_all()
    if len(reader.runs) > 1:
        log.warning("%s holds %d runs (%s): reported as one; give one run's folder",
                    printable(run_dir), len(reader.runs), ", ".join(sorted(reader.runs)))
    return reader.data


class _Problems(ExporterHealth):
    """The ingest's counts of what it could not use, as the report tells them: links, FIFOs and
    devices named (not read), bad records counted, an unreadable logger file logged."""

    def __init__(self, reader: _Reader) -> None:
        super().__init__()
        self.reader = reader

    def error(self, path: Path, reason: str, detail: str) -> None:
        # Counted here, not logged line by line as the exporter's log does: the report says
        # how many lines it skipped.
        if reason in (SYMLINK, NOT_REGULAR):
            self.reader.refused(path, detail)
        elif reason != "unreadable_format":
            self.reader.data.bad_lines += 1


class _Reader:
    """The records of a run's files, in the order written, into RunData."""

    def __init__(self, data: RunData, store: RunStore) -> None:
        self.runs: dict[str, str] = {}  # the runs read, and the source each is read from
        self.store = store
        self._start(data)

    def _start(self, data: RunData) -> None:
        self.data = data
        self.latest: dict[int, tuple[float, int]] = {}  # step -> (time, order) of the record kept
        # The steps of data.train and of each rank's data.perf, ascending: a rewind cuts their
        # end by bisection instead of scanning every step, so that rewinds cost what they undo
        # and a run that rolls back at every record is read in time linear in its records.
        self.train_steps: list[int] = []
        self.perf_steps: dict[int, list[int]] = {}
        self.timeline = Timeline()
        self.order = 0

    def refused(self, path: Path, what: str) -> None:
        """A link, FIFO or device where a file of the run would be read: skipped, named."""
        self.data.refused.append(path)
        log.warning("%s: %s, not read", printable(path), printable(what))

    def taken(self, path: Path, snap: Snapshot) -> None:
        """A record the exporter's store took (Ingestor.on_record). A run read from a better
        source from now on (docs/loggers.md#one-run-one-source) is built again from it."""
        source = self.runs.setdefault(snap.run, snap.source)
        if source != snap.source:
            self.runs[snap.run] = snap.source
            kept = self.data
            self._start(RunData(run=kept.run, path=kept.path, bad_lines=kept.bad_lines,
                                refused=kept.refused))
        self.record(snap, is_appended(path) or logger_format(path.name) in READER_FORMATS)

    def rewind(self, rank: int, keep_through: int) -> None:
        """The rank's steps after ``keep_through`` are undone (docs/signals.md#a-runs-timeline)."""
        perf = self.data.perf.get(rank, {})
        perf_readings = self.data.perf_readings.get(rank, {})
        for step in _cut(self.perf_steps.get(rank, []), keep_through):
            del perf[step]
            perf_readings.pop(step, None)
        if rank != 0:
            return
        gone = _cut(self.train_steps, keep_through)
        if gone:
            self.data.undone.append((gone[0], gone[-1], keep_through))
        for step in gone:
            del self.data.train[step]
            self.data.readings.pop(step, None)
            self.data.type_readings.pop(step, None)
            self.data.any_readings.pop(step, None)
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
            by_step = data.perf.setdefault(snap.rank, {})
            if snap.step not in by_step:
                _add(self.perf_steps.setdefault(snap.rank, []), snap.step)
            by_step.setdefault(snap.step, {}).update(perf)
            if (run := self.store.run_state(snap.run)) is not None and snap.rank in run.ranks:
                data.perf_readings.setdefault(snap.rank, {})[snap.step] = take(
                    run.ranks[snap.rank].signals, PERF_READINGS)
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
        if snap.step not in data.train:
            _add(self.train_steps, snap.step)
        data.train[snap.step] = train
        if (run := self.store.run_state(snap.run)) is not None and 0 in run.ranks:
            data.readings[snap.step] = take(run.ranks[0].signals)
            if run.ranks[0].type_signals:
                data.type_readings[snap.step] = take_types(run.ranks[0].type_signals)
            if bad := take_any(run.ranks[0].signals):
                data.any_readings[snap.step] = bad
            else:
                data.any_readings.pop(snap.step, None)
        if snap.by_type:
            data.by_type[snap.step] = snap.by_type
        else:
            data.by_type.pop(snap.step, None)


def _add(steps: list[int], step: int) -> None:
    """A step new to its dict, into the ascending ``steps``: at the end, unless a *.json file's
    record (which undoes nothing) logged an older step."""
    if not steps or step > steps[-1]:
        steps.append(step)
    else:
        insort(steps, step)


def _cut(steps: list[int], keep_through: int) -> list[int]:
    """The steps after ``keep_through``, ascending, taken off the end of ``steps``."""
    at = bisect_right(steps, keep_through)
    gone = steps[at:]
    del steps[at:]
    return gone

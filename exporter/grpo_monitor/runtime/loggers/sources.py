"""Follow the files other loggers write: what each appended since the last read, as records.

The ingest thread hands every W&B run file, TensorBoard event file, MLflow or Trackio database
and NeMo-RL per-sample file it finds below the snapshot folder to ``LoggerFiles.process``, as it hands snapshot
files to its own reader; the records come back through ``apply`` as flat snapshot records
(``{"step", "time", <name>: value}``) of a run, and go through the same parser, key maps,
vocabulary and store as a snapshot's. The guarantees of the snapshot folder hold here too:

* every file is opened through ``contract/safe_io`` (no link followed, nothing but a regular
  file opened, never a FIFO); a database is opened read-only, by the path just checked;
* a turn reads at most ``budget`` bytes of a file, the rest at its next turn (``more``);
* a file rewritten from its start (a shorter file, other first bytes, another inode under the
  name) is read again from its first byte: its steps go back, which the store reads as a
  resume, or a new run when they start over;
* a record whose checksum fails is counted (``corrupt_record``) and skipped; a file of a format
  or version the reader does not know is counted once (``unreadable_format``), never read as an
  empty run.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from grpo_monitor.contract.logger_layout import logger_run, sample_file_step
from grpo_monitor.contract.logger_rows import CsvTable, StepSamples, csv_table
from grpo_monitor.contract.safe_io import open_regular
from grpo_monitor.contract.snapshot import RecordError, decode_record
from grpo_monitor.runtime.loggers import databases, tensorboard, wandb_file

__all__ = ["LoggedFile", "LoggerFiles"]

# What apply() receives: the file, the run, one flat record, the time its bytes were read at.
Apply = Callable[[Path, str, dict[str, Any], float], None]
Error = Callable[[Path, str, str], None]
# Whether the ingest wants a run's rows from a format (a run two loggers write is read from one:
# contract/logger_layout.py's SOURCE_PRECEDENCE); asked before a per-sample file is read.
Wanted = Callable[[str, str], bool]
# First bytes kept of a file: a rewrite in place to the same or a larger size is told by them.
_HEAD_BYTES = 64
# The most a turn reads of a W&B or TensorBoard file is at least one record of the longest either
# reader takes (a longer one is no such file, or a corrupt record).
_WHOLE_RECORD_BYTES = max(tensorboard.MAX_RECORD_BYTES, wandb_file.MAX_RECORD_BYTES) + (64 << 10)
# NeMo-RL steps of a run kept to apply again after one that comes late: a step's file turns quiet
# a tick or two after the next, not dozens.
SAMPLE_STEPS_KEPT = 64
# A CSV table is read whole at each change: an export or a loop's log, far below this.
MAX_CSV_BYTES = 16 << 20
# Its header line, read first to tell a table of metrics from any other CSV.
_CSV_HEADER_BYTES = 64 << 10


@dataclass
class LoggedFile:
    """What the reader knows of one logger file."""

    fmt: str
    inode: int = 0
    offset: int = 0
    head: bytes = b""
    run: str = ""
    unreadable: bool = False  # counted once, until the file changes from its start
    # The newest step's scalars, held until a later step shows it is whole (a writer logs a
    # step's scalars one event each, and may flush between them); a per-sample file's samples,
    # until the file is quiet (NeMo-RL writes it whole, once).
    pending: tensorboard.Event | StepSamples | None = None
    # A database's rows read so far; a per-sample file's "skip_line" (inside a row longer than a
    # turn); in a saved state, a TensorBoard file's "held" step (saved()).
    cursor: dict[str, Any] = field(default_factory=dict)
    mtime: float = 0.0  # the file's, when it last grew
    seen_pending: bool = False  # the pending step was there at the last rescan already


@dataclass
class CsvFolder:
    """The CSV tables of one folder, merged into runs by ``settle``."""

    tables: dict[Path, CsvTable] = field(default_factory=dict)
    mtimes: dict[Path, float] = field(default_factory=dict)
    applied: dict[str, int] = field(default_factory=dict)  # run -> last step applied
    rewritten: bool = False
    dirty: bool = False


class LoggerFiles:
    """Every logger file the ingest has found, and how far each was read."""

    def __init__(self, root: Path, apply: Apply, error: Error,
                 wanted: Wanted = lambda _run, _fmt: True) -> None:
        self.root = root
        self.apply = apply
        self.error = error
        self.wanted = wanted
        self.files: dict[Path, LoggedFile] = {}
        # run -> step -> (file, record, mtime) of its newest NeMo-RL steps applied: a step that
        # comes late is applied before them again (_apply_sample_step).
        self._sample_steps: dict[str, dict[int, tuple[Path, dict[str, Any], float]]] = {}
        self.csv_folders: dict[Path, CsvFolder] = {}

    def saved(self) -> dict[Path, LoggedFile]:
        """What a saved state keeps of the files (runtime/saved_state.py): where each was read
        to, with a TensorBoard step held back (in its ``cursor``, as ``held``). A per-sample
        file whose step is not applied yet, and the CSV tables, are read again from their start
        after a restart (a step's file, a table: read whole at each change anyway)."""
        out: dict[Path, LoggedFile] = {}
        for path, state in self.files.items():
            if state.fmt == "csv" or isinstance(state.pending, StepSamples):
                continue
            if isinstance(state.pending, tensorboard.Event):
                held = state.pending
                state = replace(state, cursor={"held": [held.step, held.wall_time, held.scalars]})
            out[path] = state
        return out

    def restore(self, files: dict[Path, LoggedFile]) -> None:
        """Follow ``files`` from where a saved state left them (``saved``)."""
        self.files = dict(files)
        for state in self.files.values():
            held = state.cursor.pop("held", None) if state.fmt == "tensorboard" else None
            if held is not None:
                state.pending = tensorboard.Event(int(held[0]), held[1], dict(held[2]))

    def forget(self, path: Path) -> None:
        self.files.pop(path, None)
        self._csv_gone(path)

    def process(self, path: Path, fmt: str, budget: int | None) -> bool:
        """Read what is new in ``path``; True when ``budget`` left some of it for later."""
        if fmt in ("mlflow", "trackio"):
            return self._database(path, fmt, budget)
        if fmt == "csv":
            self._csv(path)
            return False
        try:
            fh = open_regular(self.root, path)  # Refused (a link, a FIFO): the caller counts it
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            self.files.pop(path, None)
            return False
        with fh:
            st = os.fstat(fh.fileno())
            state = self.files.get(path)
            if state is None or state.inode != st.st_ino:
                state = self.files[path] = LoggedFile(fmt, inode=st.st_ino)
            head = fh.read(_HEAD_BYTES)
            if st.st_size < state.offset or (state.head and head[:len(state.head)] != state.head):
                # Rewritten from its start (a logger that truncates on restart): read it again.
                state.offset, state.pending, state.unreadable = 0, None, False
                state.cursor = {}
            state.head = head
            if fmt == "samples" and state.offset == 0 and not self._samples_wanted(path, state):
                state.offset = st.st_size  # a run read from its logger: not read, not counted
            if state.unreadable or st.st_size == state.offset:
                if st.st_size == state.offset:
                    self._flush(path, state)
                return False
            state.mtime, state.seen_pending = st.st_mtime, False
            fh.seek(state.offset)
            left = st.st_size - state.offset
            if budget is not None:
                # Never less than one record: a turn that reads less than its first record
                # would consume nothing, and come back to it forever.
                budget = max(budget, _WHOLE_RECORD_BYTES)
            cut = budget is not None and left > budget  # the rest waits for the next turn
            data = fh.read(budget if cut else left)
            if fmt == "tensorboard":
                self._tensorboard(path, state, data, st.st_mtime)
            elif fmt == "samples":
                self._samples(path, state, data, cut)
            else:
                self._wandb(path, state, data, st.st_mtime)
            # A record not whole yet at the end (a block W&B is still filling) is no reason to
            # come back before the file changes.
            return cut and not state.unreadable

    # -- per format ---------------------------------------------------------------------------

    def _unreadable(self, path: Path, state: LoggedFile, why: str) -> None:
        state.unreadable = True
        self.error(path, "unreadable_format", why)

    def _tensorboard(self, path: Path, state: LoggedFile, data: bytes, mtime: float) -> None:
        if not state.run:
            state.run = logger_run(path, self.root, "tensorboard")
        try:
            events, used, corrupt = tensorboard.read_events(data, at_start=state.offset == 0)
        except tensorboard.FormatError as exc:
            self._unreadable(path, state, f"no TensorBoard event file: {exc}")
            return
        for _ in range(corrupt):
            self.error(path, "corrupt_record", "an event whose checksum or encoding is wrong")
        state.offset += used
        steps = list(tensorboard.by_step(([state.pending] if state.pending else []) + events))
        state.pending = steps.pop() if steps else None
        for event in steps:
            self._apply_event(path, state, event, mtime)

    def _samples_wanted(self, path: Path, state: LoggedFile) -> bool:
        if not state.run:
            state.run = logger_run(path, self.root, "samples")
        return self.wanted(state.run, "samples")

    def _samples(self, path: Path, state: LoggedFile, data: bytes, cut: bool) -> None:
        """NeMo-RL's ``train_data_step<N>.jsonl``: a JSON row a sample, folded into the step's
        record (contract/logger_rows.py's StepSamples), applied once the file is quiet."""
        if not isinstance(state.pending, StepSamples):
            state.pending = StepSamples()
        start = 0
        if state.cursor.pop("skip_line", False):  # the rest of a line longer than a turn reads
            start = data.find(b"\n") + 1
            if start == 0:
                state.offset += len(data)
                state.cursor["skip_line"] = True
                return
        end = data.rfind(b"\n") + 1
        if end <= start:
            if cut:  # one line longer than a turn's budget: skipped to its end, counted
                self.error(path, "oversized", f"a per-sample row longer than {len(data)} bytes")
                state.offset += len(data)
                state.cursor["skip_line"] = True
            return
        for line in data[start:end].split(b"\n"):
            if not line.strip():
                continue
            try:
                row = decode_record(line)
            except RecordError as exc:
                self.error(path, exc.reason, str(exc))
                continue
            if not state.pending.add(row):
                self.error(path, "invalid_record", "a per-sample row that is no JSON object")
        state.offset += end

    def _flush(self, path: Path, state: LoggedFile) -> None:
        """The file did not grow since the last read: its newest step is whole."""
        if state.pending is None:
            return
        pending, state.pending = state.pending, None
        if isinstance(pending, StepSamples):
            step = sample_file_step(path.name)
            if pending.samples and step is not None:
                self._apply_sample_step(path, state.run, pending.row(step), state.mtime)
        else:
            self._apply_event(path, state, pending, state.mtime)

    def _apply_sample_step(self, path: Path, run: str, row: dict[str, Any], mtime: float) -> None:
        """One NeMo-RL step's record. Its files are written in step order, but a file may turn
        quiet after a later one (they land within one tick of each other, or their events come
        apart): a step older than the run's newest is applied, then the newer steps again after
        it, so that the run is as if read in step order (the store rewinds to the older step)."""
        applied = self._sample_steps.setdefault(run, {})
        applied[row["step"]] = (path, row, mtime)
        for step in sorted(s for s in applied if s >= row["step"]):
            where, record, when = applied[step]
            self.apply(where, run, record, when)
        while len(applied) > SAMPLE_STEPS_KEPT:
            del applied[min(applied)]

    @staticmethod
    def _in_step_order(items: list[tuple[Path, LoggedFile]]) -> list[tuple[Path, LoggedFile]]:
        """Per-sample files by their step (step10 after step9), the others as found."""
        return sorted(items, key=lambda item: sample_file_step(item[0].name) or 0)

    def flush_all(self) -> None:
        """Every file's newest step, as whole: for a tool that reads a folder once."""
        self.settle()
        for path, state in self._in_step_order(list(self.files.items())):
            self._flush(path, state)

    def flush_idle(self) -> None:
        """At each of the watcher's ticks: the newest step of every file that has not grown
        since the last tick is whole (no event, no read: the file is quiet)."""
        quiet = [(path, state) for path, state in self.files.items()
                 if state.pending is not None and state.seen_pending]
        for path, state in self._in_step_order(quiet):
            self._flush(path, state)
        for state in self.files.values():
            state.seen_pending = state.pending is not None

    def _apply_event(self, path: Path, state: LoggedFile, event: tensorboard.Event,
                     mtime: float) -> None:
        row: dict[str, Any] = {"step": event.step}
        if event.wall_time is not None:
            row["time"] = event.wall_time
        row.update(event.scalars)
        self.apply(path, state.run, row, mtime)

    def _wandb(self, path: Path, state: LoggedFile, data: bytes, mtime: float) -> None:
        if not state.run:
            state.run = logger_run(path, self.root, "wandb")
        try:
            read = wandb_file.read_records(data, at_start=state.offset == 0,
                                           offset=state.offset)
        except wandb_file.FormatError as exc:
            self._unreadable(path, state, f"no W&B run file: {exc}")
            return
        for _ in range(read.corrupt):
            self.error(path, "corrupt_record", "a W&B record whose checksum or encoding is wrong")
        state.offset += read.consumed
        if read.run_name:
            state.run = read.run_name
        for row in read.rows:
            self.apply(path, state.run, row, mtime)

    def _csv(self, path: Path) -> None:
        """A CSV table of metrics (contract/logger_rows.py), read whole: its folder's tables are
        merged by run and step at the next ``settle`` (W&B exports one file per panel)."""
        try:
            fh = open_regular(self.root, path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            self._csv_gone(path)
            return
        with fh:
            st = os.fstat(fh.fileno())
            state = self.files.get(path)
            if state is None or state.inode != st.st_ino:
                state = self.files[path] = LoggedFile("csv", inode=st.st_ino)
            header = fh.readline(_CSV_HEADER_BYTES)
            if state.mtime == st.st_mtime and state.offset == st.st_size:
                return  # read already, unchanged
            grew = bool(state.head) and st.st_size >= state.offset and header == state.head
            state.head, state.offset, state.mtime = header, st.st_size, st.st_mtime
            if csv_table(header.decode("utf-8", "replace")) is None:
                state.unreadable = True  # a CSV of something else (a data set): none of ours
                self._csv_gone(path)
                return
            state.unreadable = False
            if st.st_size > MAX_CSV_BYTES:
                self.error(path, "oversized", f"a CSV table of {st.st_size} bytes > {MAX_CSV_BYTES}")
                self._csv_gone(path)
                return
            table = csv_table((header + fh.read(MAX_CSV_BYTES)).decode("utf-8", "replace"))
        folder = self.csv_folders.setdefault(path.parent, CsvFolder())
        folder.tables[path] = table or {}
        folder.mtimes[path] = st.st_mtime
        folder.rewritten |= not grew
        folder.dirty = True

    def _csv_gone(self, path: Path) -> None:
        folder = self.csv_folders.get(path.parent)
        if folder is not None and folder.tables.pop(path, None) is not None:
            folder.rewritten = folder.dirty = True

    def settle(self) -> None:
        """Apply what the CSV tables read since the last call add, merged by run and step: all
        of a run again when a table appeared, went or was rewritten (its steps go back: the
        store builds the run anew), else the steps past those applied (a table that grew)."""
        for where, folder in self.csv_folders.items():
            if not folder.dirty:
                continue
            folder.dirty = False
            full, folder.rewritten = folder.rewritten, False
            merged: dict[str, dict[int, dict[str, float]]] = {}
            for path in sorted(folder.tables):
                for run, steps in folder.tables[path].items():
                    name = run or logger_run(path, self.root, "csv")
                    into = merged.setdefault(name, {})
                    for step, values in steps.items():
                        into.setdefault(step, {}).update(values)
            if not folder.tables:
                continue
            source = min(folder.tables)  # the file named as the rows' source
            mtime = max(folder.mtimes.get(p, 0.0) for p in folder.tables)
            for run, steps in merged.items():
                done = -1 if full else folder.applied.get(run, -1)
                for step in sorted(s for s in steps if s > done):
                    self.apply(source, run, {"step": step, **steps[step]}, mtime)
                if steps:
                    folder.applied[run] = max(steps)

    def _database(self, path: Path, fmt: str, budget: int | None) -> bool:
        state = self.files.get(path)
        if state is None:
            state = self.files[path] = LoggedFile(fmt)
        try:
            # Checked, not opened: SQLite opens by name, read-only (safe_io refuses a link or
            # a FIFO under that name before SQLite looks at it).
            open_regular(self.root, path).close()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            self.files.pop(path, None)
            return False
        try:
            read = databases.read_new(path, state.cursor, limit=None if budget is None else
                                      max(budget // 64, 1000))
        except databases.NotALoggerDatabase:
            state.unreadable = True  # another program's database: none of ours, no error
            return False
        except databases.FormatError as exc:
            if not state.unreadable:
                self._unreadable(path, state, str(exc))
            return False
        except OSError as exc:
            self.error(path, "read_error", os.strerror(exc.errno or errno.EIO))
            return False
        state.fmt, state.unreadable = read.fmt, False
        state.cursor = read.cursor
        mtime = os.stat(path, follow_symlinks=False).st_mtime
        for run, row in read.rows:
            state.run = run
            self.apply(path, run, row, mtime)
        return read.more


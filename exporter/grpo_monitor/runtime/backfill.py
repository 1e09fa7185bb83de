"""The backfill: the history a first start skipped, read after ready and swapped in run by run.

A first start reads long files at their head and tail (ingest.py's _skip_middle). The backfill
then reads each such run's files whole again, on the ingest thread between event batches, into a
store of its own, and serves that run in place of the partial one once it has caught up with the
files (docs/scaling.md#first-start).

A partial run's windows, baselines and levels are exact from the start; what needs every record
(its counters, ranges, streaks, held-out best, the entropy-reward law, the logged steps) is
exact from the swap on. The swap is the run a whole first read would have built: the files are
read in the start-up's order, each up to the offset the live read has reached, and every record
the live read takes after that is applied to both stores ("teed"). Problems of the skipped bytes
are counted when the backfill reads them, those of the head and tail once, by the live read.

A file the backfill cannot follow (gone, truncated, rewritten) leaves its run partial, with a
log line, until the next start-up: a saved state leaves a partial run out, so that start-up reads
it again.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from grpo_monitor.contract.run_layout import is_appended, run_label
from grpo_monitor.contract.safe_io import open_regular, printable
from grpo_monitor.contract.snapshot import Snapshot
from grpo_monitor.runtime.ingest import (
    JSON_WHITESPACE,
    READ_CHUNK,
    FileState,
    Ingestor,
    run_folder_of,
)
from grpo_monitor.runtime.store import RunStore

log = logging.getLogger("grpo_monitor.runtime.backfill")


@dataclass
class FileBackfill:
    state: FileState  # the live read's, which a rename carries along: its offset is the goal
    gap: tuple[int, int] | None  # the bytes the start-up skipped: their problems are counted here
    read_to: int = 0  # bytes applied to the run's own store
    skipping: bool = False  # inside an over-long line, dropping bytes until a newline
    caught_up: bool = False  # read to the live offset: the live read's records are teed from now


@dataclass
class RunBackfill:
    name: str
    folder: str
    files: list[FileBackfill]
    store: RunStore
    by_inode: dict[int, FileBackfill] = field(default_factory=dict)


class Backfill:
    """The runs a first start read in part, and the whole read of each, one at a time."""

    def __init__(self, ingestor: Ingestor) -> None:
        self.ingestor = ingestor
        self.runs: dict[str, RunBackfill] = {}
        gaps = ingestor.gaps
        folders: dict[str, list[FileState]] = {}
        for path, state in ingestor.files.items():  # the start-up's order: a rank's oldest first
            if (folder := run_folder_of(path, ingestor.root)) is not None:
                folders.setdefault(folder, []).append(state)
        for folder, states in folders.items():
            if not any(state.inode in gaps for state in states):
                continue
            run_name = run_label(folder)
            files = [FileBackfill(state, gaps.get(state.inode)) for state in states]
            backfill = RunBackfill(run_name, folder, files, RunStore(ingestor.store.limits),
                                   {f.state.inode: f for f in files})
            live = ingestor.store.run_state(run_name)
            if live is not None and live.rebaseline is not None:
                backfill.store.rebaseline(run_name, *live.rebaseline)
            self.runs[run_name] = backfill
        ingestor.gaps = {}

    def run_names(self) -> set[str]:
        return set(self.runs)

    def backlog_bytes(self) -> int:
        """Bytes the backfill has yet to read: what the live read has, less what it applied."""
        return sum(max(0, f.state.offset - f.read_to) for run in self.runs.values()
                   for f in run.files if not f.caught_up)

    # -- the live read's side (ingest thread) --------------------------------------------------

    def tee(self, inode: int, path: Path, snap: Snapshot, wrote_at: float) -> None:
        """A record the live read applied: the run's own store takes it too, once it has read
        its file up to there. A file new to the run since the start-up (a new rank, a rotation's
        new segment) is read by the live read from its first byte: it is teed whole."""
        run = self.runs.get(snap.run)
        if run is None:
            return
        fb = run.by_inode.get(inode)
        if fb is None:
            if run_folder_of(path, self.ingestor.root) != run.folder:
                return
            fb = run.by_inode[inode] = FileBackfill(FileState(inode=inode), None, caught_up=True)
            run.files.append(fb)
        if fb.caught_up:
            run.store.apply(snap, wrote_at=wrote_at)

    def forget(self, run_name: str) -> None:
        """The run's folder was deleted or renamed: what is read of it now is a new run."""
        self.runs.pop(run_name, None)

    def rebaselined(self, run_name: str, at_step: int, steps: int) -> None:
        if (run := self.runs.get(run_name)) is not None:
            run.store.rebaseline(run_name, at_step, steps)

    # -- the backfill's own turns (ingest thread, between event batches) ----------------------

    def turn(self, seconds: float) -> bool:
        """Read for about ``seconds``; whether anything is left to read."""
        deadline = time.monotonic() + seconds
        while self.runs and time.monotonic() < deadline:
            run = next(iter(self.runs.values()))
            if self.ingestor.store.run_state(run.name) is None:  # expired, its folder deleted
                del self.runs[run.name]
                continue
            pending = next((f for f in run.files if not f.caught_up), None)
            if pending is None:
                self._swap(run)
            elif not self._read(run, pending, deadline):
                log.warning("run %s: the backfill cannot follow a file any more (gone, truncated or "
                            "rewritten); the run stays as its files' heads and tails gave it, without "
                            "the series that need every record, until the next start-up", run.name)
                del self.runs[run.name]
        return bool(self.runs)

    def _swap(self, run: RunBackfill) -> None:
        del self.runs[run.name]
        whole = run.store.run_state(run.name)
        if whole is not None and self.ingestor.store.adopt(whole):
            log.info("run %s: its history is read whole; every series is exact from now on", run.name)

    def _read(self, run: RunBackfill, fb: FileBackfill, deadline: float) -> bool:
        """Apply the file's next bytes up to the live offset to the run's own store; False when
        the file cannot be followed."""
        state = fb.state
        path = self.ingestor.path_of(state.inode)
        if path is None or state.offset < fb.read_to:
            return False
        try:
            with open_regular(self.ingestor.root, path) as fh:
                st = os.fstat(fh.fileno())
                if st.st_ino != state.inode or st.st_size < state.offset:
                    return False
                if not is_appended(path):  # a *.json snapshot: its content now
                    data = fh.read(self.ingestor.max_file_bytes + 1)
                    if len(data) <= self.ingestor.max_file_bytes:
                        self._apply(run, path, data, st.st_mtime, whole_file=True)
                    fb.caught_up = True
                    return True
                # A chunk holds a whole line of the longest length read.
                size = max(READ_CHUNK, 2 * self.ingestor.max_line_bytes)
                while fb.read_to < state.offset and time.monotonic() < deadline:
                    fh.seek(fb.read_to)
                    chunk = fh.read(min(size, state.offset - fb.read_to))
                    if not chunk:
                        return False
                    final = fb.read_to + len(chunk) >= state.offset
                    self._lines(run, fb, path, chunk, st.st_mtime, final)
        except (OSError, ValueError) as exc:
            log.debug("backfill of %s: %s", printable(path), exc)
            return False
        fb.caught_up = fb.read_to >= state.offset
        return True

    def _lines(self, run: RunBackfill, fb: FileBackfill, path: Path, chunk: bytes, mtime: float,
               final: bool) -> None:
        """Apply the whole lines of ``chunk`` (read at ``fb.read_to``); a line cut by the chunk's
        end is read again with the next. An over-long line is skipped as the live read skips it;
        at the live offset one still being skipped is left to the live read."""
        limit = self.ingestor.max_line_bytes
        pos = 0
        while True:
            nl = chunk.find(b"\n", pos)
            if nl < 0:
                rest = len(chunk) - pos
                if rest > limit and not fb.skipping:  # too long to apply: dropped to its newline
                    self._count(fb, fb.read_to + pos, path, "oversized", f"line over {limit} bytes")
                    fb.skipping = True
                # Read on past what no line can use (being skipped, or the live read's line
                # still being skipped at its offset), else from the cut line's start.
                fb.read_to += len(chunk) if fb.skipping or final else pos
                return
            line, at = chunk[pos:nl], fb.read_to + pos
            pos = nl + 1
            if fb.skipping:  # the tail of an over-long line
                fb.skipping = False
            elif len(line) > limit:
                self._count(fb, at, path, "oversized", f"line of {len(line)} bytes > {limit}")
            elif line.strip(JSON_WHITESPACE):
                self._apply(run, path, line, mtime, counted=self._in_gap(fb, at))

    @staticmethod
    def _in_gap(fb: FileBackfill, at: int) -> bool:
        return fb.gap is not None and fb.gap[0] <= at < fb.gap[1]

    def _count(self, fb: FileBackfill, at: int, path: Path, reason: str, detail: str) -> None:
        if self._in_gap(fb, at):
            self.ingestor.error(path, reason, detail)

    def _apply(self, run: RunBackfill, path: Path, raw: bytes, mtime: float, *,
               whole_file: bool = False, counted: bool = False) -> None:
        snap = self.ingestor.parse(path, raw, mtime, whole_file, count=counted)
        if snap is not None and run.store.apply(snap, wrote_at=mtime) and counted:
            self.ingestor.health.ingested_by_shape[snap.shape].inc()


def start(ingestor: Ingestor) -> Backfill | None:
    """The backfill of the files the start-up replay read in part; None when it read them all."""
    if not ingestor.gaps:
        return None
    backfill = Backfill(ingestor)
    ingestor.store.mark_partial(backfill.run_names())
    return backfill if backfill.runs else None


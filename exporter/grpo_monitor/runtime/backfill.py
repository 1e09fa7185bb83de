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

Files change while the backfill reads them, and once they settle the run is what a fresh read
of them gives, never left partial:

- A file renamed within its run folder (the SDK's rotation, rank-0.jsonl to rank-0.1.jsonl) is
  read on under its new name: the live read's state, which the backfill shares, goes with it. A
  file new to the run (a new rank, a rotation's new file) is read after the run's files before
  it, teed from its first byte if those are read already (ingest calls followed).
- The run is read again from the start, from its files as the live read follows them now, in a
  start-up's order (the oldest first), at the backfill's next turn, when: the live read reads a
  file of it again from its first byte (truncated or rewritten in place; ingest calls
  started_over); a file of it is no longer followed as it was read (deleted, another file
  renamed over it, renamed to a name that is no snapshot such as logrotate's rank-0.jsonl.1, or
  out of the folder); or a record makes the store start the run over (a re-run under the same
  name). A file the backfill finds changed before the live read saw it is looked at by the live
  read first, as at its event. What the backfill counted of the skipped bytes is not counted
  again.
- A run forgotten (its folder deleted or renamed: a renamed folder is a new run, read from its
  files' first bytes under the new name) or expired while partial leaves the partial set
  (store.forget_run, store.expire), and the backfill drops it: a run of its name that comes back
  is a new one, not swapped for the old history.

Only a file that cannot be read at all (an I/O error, a permission) leaves its run partial, with a
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
from grpo_monitor.contract.safe_io import Refused, open_regular, printable
from grpo_monitor.contract.snapshot import Snapshot
from grpo_monitor.runtime.ingest import (
    JSON_WHITESPACE,
    READ_CHUNK,
    FileState,
    Ingestor,
    run_folder_of,
)
from grpo_monitor.runtime.store import RunState, RunStore

log = logging.getLogger("grpo_monitor.runtime.backfill")

# What a read of a file by the backfill came to (Backfill._read).
READ = "read"  # its next bytes, up to the live offset or the turn's end
CHANGED = "changed"  # not the file the live read follows, or not where: the live read looks again
FAILED = "failed"  # it cannot be read (an I/O error, a permission)


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
    # The live store's run when this read began: another one there is the run started over (or
    # forgotten and made again).
    live: RunState | None = None
    rebaseline: tuple[int, int] | None = None  # the run's re-baseline request, for a read again
    # A file of the run was read again from its start, or left it: read again at the next turn.
    stale: bool = False
    # Files the live read started over in place: it counts their problems, the read again none.
    reset: set[int] = field(default_factory=set)


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
            live = ingestor.store.run_state(run_name)
            files = [FileBackfill(state, gaps.get(state.inode)) for state in states]
            self._begin(run_name, folder, files, live.rebaseline if live is not None else None)
        ingestor.gaps = {}

    def _begin(self, name: str, folder: str, files: list[FileBackfill],
               rebaseline: tuple[int, int] | None) -> None:
        run = RunBackfill(name, folder, files, RunStore(self.ingestor.store.limits),
                          {f.state.inode: f for f in files}, self.ingestor.store.run_state(name),
                          rebaseline)
        if rebaseline is not None:
            run.store.rebaseline(name, *rebaseline)
        self.runs[name] = run  # in its place: a run read again is read on first

    def _run_of(self, path: Path) -> RunBackfill | None:
        """The run being read that ``path`` lies in, unless it is to be read again anyway."""
        folder = run_folder_of(path, self.ingestor.root)
        run = self.runs.get(run_label(folder)) if folder is not None else None
        return run if run is not None and run.folder == folder and not run.stale else None

    def run_names(self) -> set[str]:
        return set(self.runs)

    def backlog_bytes(self) -> int:
        """Bytes the backfill has yet to read: what the live read has, less what it applied."""
        return sum(max(0, f.state.offset - f.read_to) for run in self.runs.values()
                   for f in run.files if not f.caught_up)

    # -- the live read's side (ingest thread) --------------------------------------------------

    def tee(self, inode: int, path: Path, snap: Snapshot, wrote_at: float) -> None:
        """A record the live read applied: the run's own store takes it too, once it has read
        its file up to there. Every file the live read follows in the run's folder is the run's
        (followed); one it reads without following it (a logrotate segment that came and went
        while it lagged, read whole and forgotten) a start-up would not read: left out."""
        run = self.runs.get(snap.run)
        if run is None or run.stale:
            return
        fb = run.by_inode.get(inode)
        if fb is not None and fb.caught_up:
            run.store.apply(snap, wrote_at=wrote_at)

    def followed(self, path: Path, state: FileState) -> None:
        """The live read follows a file under ``path`` now (new, renamed, or found again by its
        inode). One new to a run being read is read after the run's files before it: teed from
        its first byte when those are read already and the live read reads it from its start,
        else read by the backfill up to the live offset."""
        run = self._run_of(path)
        if run is None:
            return
        known = run.by_inode.get(state.inode)
        if known is not None:
            if known.state is not state:  # another file with a gone one's inode number
                run.stale = True
            return
        whole = state.offset == 0 and all(f.caught_up for f in run.files)
        fb = run.by_inode[state.inode] = FileBackfill(state, None, caught_up=whole)
        run.files.append(fb)

    def started_over(self, path: Path, inode: int) -> None:
        """The live read reads the file ``inode`` under ``path`` again from its first byte
        (truncated or rewritten in place): its run is read again from its files as they are
        now, at the next turn."""
        run = self._run_of(path)
        if run is not None:
            run.stale = True
            run.reset.add(inode)

    def forget(self, run_name: str) -> None:
        """The run's folder was deleted or renamed: what is read of it now is a new run."""
        self.runs.pop(run_name, None)

    def rebaselined(self, run_name: str, at_step: int, steps: int) -> None:
        if (run := self.runs.get(run_name)) is not None:
            run.rebaseline = (at_step, steps)
            run.store.rebaseline(run_name, at_step, steps)

    # -- the backfill's own turns (ingest thread, between event batches) ----------------------

    def turn(self, seconds: float) -> bool:
        """Read for about ``seconds``; whether anything is left to read."""
        if self.ingestor.deferred:  # the start-up's tails first: the backfill tees their records
            return True
        deadline = time.monotonic() + seconds
        store = self.ingestor.store
        while self.runs and time.monotonic() < deadline:
            run = next(iter(self.runs.values()))
            live = store.run_state(run.name)
            if live is not run.live and (live is None or run.name not in store.partial_runs()):
                # Expired or forgotten (its folder deleted or renamed, another logger's files
                # read for it): a run of its name now is a new one, read as it comes.
                del self.runs[run.name]
                continue
            if run.stale or live is not run.live:  # a file read again, or the run started over
                self._restart(run)
                continue
            pending = next((f for f in run.files if not f.caught_up), None)
            if pending is None:
                if any(self._where(run, f) is None for f in run.files):
                    run.stale = True  # a file left the run since it was read
                else:
                    self._swap(run)
                continue
            outcome = self._read(run, pending, deadline)
            if outcome == CHANGED:
                self._look_again(run, pending)
            elif outcome == FAILED:
                self._give_up(run, "cannot read a file")
        return bool(self.runs)

    def _restart(self, run: RunBackfill) -> None:
        """Read the run again from the start, from its files as the live read follows them now,
        in a start-up's order (the oldest first, as ingest's scan lists them). What was counted
        of the bytes the start-up skipped is not counted again."""
        root = self.ingestor.root
        found: list[tuple[float, str, FileState]] = []
        for path, state in self.ingestor.files.items():
            if run_folder_of(path, root) != run.folder:
                continue
            try:
                mtime = os.lstat(path).st_mtime
            except OSError:
                mtime = 0.0  # gone meanwhile: the live read will find out
            found.append((mtime, str(path), state))
        found.sort(key=lambda f: f[:2])
        files = []
        for _, _, state in found:
            gap = None
            old = run.by_inode.get(state.inode)
            if old is not None and old.state is state and old.gap is not None \
                    and state.inode not in run.reset:
                start = max(old.gap[0], old.read_to)
                gap = (start, old.gap[1]) if start < old.gap[1] else None
            files.append(FileBackfill(state, gap))
        log.info("run %s: its files changed while the backfill read them (truncated, rewritten, "
                 "replaced, rotated away or the run started over); reading it again from its files "
                 "as they are now", run.name)
        self._begin(run.name, run.folder, files, run.rebaseline)

    def _where(self, run: RunBackfill, fb: FileBackfill) -> Path | None:
        """The name the live read follows the file under, as the state the backfill reads up
        to; None when it left the run: gone, renamed to a name that is no snapshot or out of the
        run's folder, or another file renamed over it."""
        path = self.ingestor.path_of(fb.state.inode)
        if path is None or self.ingestor.files.get(path) is not fb.state \
                or run_folder_of(path, self.ingestor.root) != run.folder:
            return None
        return path

    def _look_again(self, run: RunBackfill, fb: FileBackfill) -> None:
        """The backfill found a file other than the live read follows it: the live read looks at
        it now (as at its event), and a truncation or rewrite it finds has the run read again
        (started_over); so does a file that left the run. One renamed within the run (a rotation
        the live read had not seen yet) is read on under its new name. One still where it was
        (changed and put back between two looks): given up."""
        before = self.ingestor.path_of(fb.state.inode)
        if before is not None:
            self.ingestor.process(before)
        if self.runs.get(run.name) is not run or run.stale:
            return
        after = self._where(run, fb)
        if after is None or fb.state.offset < fb.read_to:
            run.stale = True  # read again, without it
        elif after == before:
            self._give_up(run, "cannot follow a file")

    def _give_up(self, run: RunBackfill, what: str) -> None:
        log.warning("run %s: the backfill %s; the run stays as its files' heads and tails gave "
                    "it, without the series that need every record, until the next start-up",
                    run.name, what)
        del self.runs[run.name]

    def _swap(self, run: RunBackfill) -> None:
        del self.runs[run.name]
        whole = run.store.run_state(run.name)
        if whole is None:  # its files gone, or none a record: it stays as read until it expires
            log.warning("run %s: the backfill found no record in its files (deleted meanwhile?); "
                        "the run stays as its files' heads and tails gave it until it expires",
                        run.name)
        elif self.ingestor.store.adopt(whole):
            log.info("run %s: its history is read whole; every series is exact from now on", run.name)

    def _read(self, run: RunBackfill, fb: FileBackfill, deadline: float) -> str:
        """Apply the file's next bytes up to the live offset to the run's own store: READ;
        CHANGED when it is not the file the live read follows (gone, renamed, replaced, or
        shorter: truncated or rewritten), FAILED when it cannot be read."""
        state = fb.state
        path = self._where(run, fb)
        if path is None or state.offset < fb.read_to:
            return CHANGED
        try:
            with open_regular(self.ingestor.root, path) as fh:
                st = os.fstat(fh.fileno())
                if st.st_ino != state.inode or st.st_size < state.offset:
                    return CHANGED
                if not is_appended(path):  # a *.json snapshot: its content now
                    data = fh.read(self.ingestor.max_file_bytes + 1)
                    if len(data) <= self.ingestor.max_file_bytes:
                        self._apply(run, path, data, st.st_mtime, whole_file=True)
                    fb.caught_up = True
                    return READ
                # A chunk holds a whole line of the longest length read.
                size = max(READ_CHUNK, 2 * self.ingestor.max_line_bytes)
                while fb.read_to < state.offset and time.monotonic() < deadline:
                    fh.seek(fb.read_to)
                    chunk = fh.read(min(size, state.offset - fb.read_to))
                    if not chunk:
                        return CHANGED
                    final = fb.read_to + len(chunk) >= state.offset
                    self._lines(run, fb, path, chunk, st.st_mtime, final)
        except (FileNotFoundError, NotADirectoryError, Refused) as exc:  # renamed, deleted, a link
            log.debug("backfill of %s: %s", printable(path), exc)
            return CHANGED
        except (OSError, ValueError) as exc:
            log.debug("backfill of %s: %s", printable(path), exc)
            return FAILED
        fb.caught_up = fb.read_to >= state.offset
        return READ

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
    ingestor.store.mark_partial({name: ingestor.headless.get(name, set())
                                 for name in backfill.run_names()})
    ingestor.headless = {}
    return backfill if backfill.runs else None


def note_progress(ingestor: Ingestor) -> None:
    """The backfill's progress in the exporter's health series: the runs and ranks served in
    part, the families withheld from them, the bytes left to read."""
    health, filling = ingestor.health, ingestor.backfill
    partial, headless = ingestor.partial_runs(), ingestor.store.headless_ranks()
    health.partial_runs.set(len(partial))
    health.partial_ranks.set(sum(len(ranks) for ranks in headless.values()))
    health.note_withheld(len(partial), len(headless))
    health.backfill_bytes.set(filling.backlog_bytes() if filling is not None else 0)
    health.deferred_files.set(len(ingestor.deferred))

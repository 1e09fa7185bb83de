"""Reading snapshot files: tail *.jsonl incrementally, re-read *.json on change.

Everything here runs on the one ingest thread, so the per-file state needs no locks. The state
is keyed by path and remembers the inode, so that a rotation by rename continues at the same
offset under the new name instead of reading the segment twice, in whatever order the rename,
the new file and their events reach the exporter; a file renamed to a name that is no snapshot
(logrotate's ``rank-0.jsonl.1``) is read to its end before it is forgotten.

Every file is opened through contract/safe_io: a link, FIFO, socket or device in the tree is
refused without blocking, counted once per path (``symlink``, ``not_regular``) and never read.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import os
import re
import stat
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from grpo_monitor.contract.run_layout import (
    MAX_CONTROL_BYTES,
    REBASELINE_REQUEST,
    SNAPSHOT_SUFFIXES,
    is_appended,
    is_hidden,
    is_not_snapshot,
    is_snapshot_path,
    rotation_of,
    run_label,
)
from grpo_monitor.contract.safe_io import SYMLINK, Refused, open_regular, printable, read_regular, walk
from grpo_monitor.contract.snapshot import (
    RecordError,
    Snapshot,
    decode_record,
    identity_from_path,
    parse_record,
)
from grpo_monitor.contract.logger_layout import (
    READER_FORMATS, SOURCE_PRECEDENCE, is_logger_link, logger_format,
)
from grpo_monitor.contract.logger_rows import as_snapshot_row, log_rows
from grpo_monitor.contract.key_map import KEY_MAP_FILE, MAX_KEY_MAP_BYTES, KeyMap, KeyMapError
from grpo_monitor.runtime.loggers.sources import LoggerFiles
from grpo_monitor.runtime.rebaseline import RebaselineRequest
from grpo_monitor.runtime.signals import PERF_REACH, is_perf
from grpo_monitor.runtime.store import RunStore

if TYPE_CHECKING:
    from grpo_monitor.runtime.backfill import Backfill
    from grpo_monitor.runtime.health import ExporterHealth

log = logging.getLogger("grpo_monitor.runtime.ingest")

READ_CHUNK = 4 << 20
# Bytes one file gets per turn when an event asks for it: a file that grows faster than it can be
# read (or a huge one appended at once) is read on at the next turn, after the other files' events,
# so it cannot hold up the ingest of every other run. History (the start-up replay, a rotation's
# older segments) is read whole, in order.
READ_BUDGET = 64 << 20
# And at most this long: a file of heavy records (hundreds of keys each, new runs) is read on at
# the next turn too, so that a NaN appended to another run is served within about this much.
READ_TURN_SECONDS = 0.2
# The largest *.json snapshot and the longest *.jsonl line read (--snapshot.max-file-bytes,
# --snapshot.max-line-bytes); larger ones are counted as oversized and skipped, so a runaway
# writer cannot make the exporter hold an unbounded record in memory.
DEFAULT_MAX_FILE_BYTES = 16 << 20
DEFAULT_MAX_LINE_BYTES = 1 << 20
TAIL_CHECK = 64
# JSON's own whitespace: a line of nothing else is no record (and no error). b"".strip() would
# also drop \x0b and \x0c, which JSON does not allow: such a line is counted as invalid_json.
JSON_WHITESPACE = b" \t\r"
# How far a file system's timestamps may trail our clock: a coarse tick, or a second or two on
# some network file systems. So a *.json file's unchanged (size, mtime) says its content is
# unchanged only when that mtime is older than our last read by more than this (a rewrite within
# one tick keeps both), and a file changed less than this before a scan began may have changed
# during it.
CLOCK_SLACK_NS = 2_000_000_000
# Listings of a folder while its writers rotate, to find where a rotated file went (_catch_up).
CATCH_UP_LISTINGS = 3
# A first start that finds more than this to read (--snapshot.backfill-above-bytes) reads each
# long file at its head and tail and leaves its middle to the backfill (_skip_middle): below it,
# a whole read costs seconds (64 MiB: 5 to 25 s on one core, by the records' size), and every
# series is whole from ready.
DEFAULT_BACKFILL_ABOVE_BYTES = 64 << 20
# The least middle of a file worth skipping: small, since a start-up reads up to this much more
# of every file (16 KiB of perf records: ~5 ms; 1,024 ranks: ~5 s); a perf rank's file has one
# from ~300 steps on, rank 0's (every training key) from ~610.
MIN_MIDDLE_BYTES = 16 << 10
# The head of a file read at a first start ends once its rank's baseline is complete, or after
# this many times the baseline's steps in records (a rank whose records never complete one: the
# file is then read whole).
HEAD_RECORDS_PER_BASELINE_STEP = 4
# The first read of a file's head, doubled at each read after it up to READ_CHUNK: a 200-step
# baseline of perf records is ~60 KiB, of every training key ~350 KiB.
HEAD_CHUNK = 64 << 10
# Bytes read at a guessed start of a file's tail to find the first whole line there (more for a
# longer line), and how close to the last line that reaches back far enough the tail starts: a
# dozen perf records.
PROBE_BYTES = 4 << 10
# Formats named per run in Ingestor.sources (a run is written by one or two loggers).
MAX_SOURCES_NAMED = 8
# A source's rank among those that may feed one run (contract/logger_layout.py): lower wins.
_PRECEDENCE = {fmt: i for i, fmt in enumerate(SOURCE_PRECEDENCE)}

# The fewest seconds between two reads of one run's key map file.
KEY_MAP_MIN_INTERVAL_S = 1.0
# Hidden files the scan hands to process(): a run's re-baseline request and key map.
_CONTROL_NAMES = frozenset({REBASELINE_REQUEST, KEY_MAP_FILE})


def _rank(source: str) -> int:
    """A source's place in SOURCE_PRECEDENCE: lower wins; one it does not list, last."""
    return _PRECEDENCE.get(source, len(_PRECEDENCE))


def _dated(mtime: float, written_after: float) -> float:
    """When bytes a read found past the previous read were written: their file's mtime, unless
    it is older than that previous read by more than a file system's coarse timestamps explain
    (CLOCK_SLACK_NS): a file server whose clock lags. Then the previous read's time, which the
    bytes surely followed."""
    return mtime if mtime >= written_after - CLOCK_SLACK_NS / 1e9 else written_after


@dataclass
class FileState:
    inode: int
    # The snapshot name it was last followed under: its run and rank once it is renamed away.
    name: Path = Path()
    # *.jsonl: bytes consumed, up to the last newline (or the end of an oversized line's bytes
    # skipped). A line still waiting for its newline is not consumed: it is read again from the
    # file each time, so its writer may finish it, or take back a torn one, without confusing us.
    offset: int = 0
    tail: bytes = b""  # *.jsonl: the last bytes before offset, to notice a rewrite in place
    skipping: bool = False  # *.jsonl: inside an oversized line, dropping bytes until a newline
    signature: tuple[int, int] = (0, 0)  # *.json: (size, mtime_ns) last looked at
    read_ns: int = 0  # when it was last read (our clock)
    digest: bytes = b""  # *.json: hash of the content last looked at
    # The inode of its run folder when it was first followed: another one under the same name
    # is a folder deleted and re-created (maybe while the exporter was down): a new run.
    folder_inode: int = 0


@functools.lru_cache(maxsize=1 << 16)
def run_folder_of(path: Path, root: Path) -> str | None:
    """Cached: asked for every record (its run's key map), and pathlib's relative_to was a tenth
    of a start-up's time at 2,048 ranks."""
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else None


@dataclass
class FolderListing:
    """One listing of a run folder, for catching up rotations (Ingestor._catch_up)."""

    segments: dict[str, list[tuple[int, str, int]]]  # base -> (seq, path, inode) of <base>.<seq>.jsonl
    files: dict[int, str]  # inode -> path of each regular file that is no segment


def _under(path: Path, folders: set[Path]) -> bool:
    """Whether ``path`` is one of ``folders`` or lies in one (a few parents, set lookups)."""
    return path in folders or any(parent in folders for parent in path.parents)


class Ingestor:
    def __init__(
        self,
        root: Path,
        store: RunStore,
        health: ExporterHealth,
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        key_map: KeyMap | None = None,
        backfill_above_bytes: int = 0,
    ) -> None:
        self.root = root
        # --snapshot.key-map's names, for every run; a run folder's .grpo-keys.toml goes on top.
        self.key_map = key_map
        # run folder name -> its key map over the flag's (None: neither has one), read at the
        # run's first record and again whenever its file changes.
        self._run_key_maps: dict[str, KeyMap | None] = {}
        # run folder -> (its key map file's SHA-256, the map it gave, when it was read): a map
        # is parsed (and a bad one counted) once per change of its text, read once a second at
        # most.
        self._key_map_reads: dict[str, tuple[bytes, KeyMap | None, float]] = {}
        # The last step applied of each run read from whole logs in one JSON document
        # (trainer_state.json, one a checkpoint: _log_rows).
        self._logged_upto: dict[str, int] = {}
        self.store = store
        self.health = health
        self.max_file_bytes = max_file_bytes
        self.max_line_bytes = max_line_bytes
        self.files: dict[Path, FileState] = {}
        self._inodes: dict[int, Path] = {}  # inode -> path in self.files, to find renames
        # path -> lstat signature when a rescan last looked, so that a rescan re-reads (and
        # re-counts the errors of) only what changed since.
        self._seen: dict[Path, tuple[int, ...]] = {}
        # control file -> content last looked at: applied, or counted once as unusable (a
        # watcher reports one write as several events)
        self._controls: dict[Path, bytes] = {}
        # inode -> state of a file whose name now holds another file, or no file, and whose new
        # name is not known yet (a move out of its folder, a deletion): a later name adopts it.
        # Dropped at the next rescan's end, which has read every file there is.
        self._detached: dict[int, FileState] = {}
        # Names whose file went away (renamed, gone): the next file under one is a rotation's
        # new file, read after what came before it (see _read).
        self._vacated: set[Path] = set()
        # Name a followed file left for a name that is no snapshot (logrotate's rank-0.jsonl.1)
        # -> (that name, its state). Read to its end when it went, and once more before the
        # file that takes the name is read (its writer may append until it reopens); then
        # forgotten, at the latest at the next rescan's end.
        self._retired: dict[Path, tuple[Path, FileState]] = {}
        # Inodes of files read to their end and forgotten since the last rescan: never read again
        # as a missed rotation (_missed_rotations), however soon after the next one comes.
        self._finished: set[int] = set()
        self._unreadable: set[Path] = set()  # folders the last scan could not list
        # Run folder -> its listing, kept for the length of one rescan (_listing).
        self._listings: dict[Path, FolderListing] | None = None
        self._listed_ns = 0  # when the last scan began (our clock)
        # Snapshot files whose last read failed: counted once, not at each of the events a
        # writer keeps making, until a read succeeds again.
        self._failing: set[Path] = set()
        # Paths refused (safe_io: a link, a FIFO, ...) -> the reason counted: counted once per
        # path, until it is read or gone.
        self._refused: dict[Path, str] = {}
        # Files whose READ_BUDGET ran out with bytes left: the watcher reads them on next turn.
        self.unfinished: dict[Path, None] = {}
        # A start-up replay (start_up, set by the watcher) that finds more than this many bytes
        # of runs no saved state holds reads their long files at their head and tail only
        # (skip_middles, _skip_middle); 0: every file whole.
        self.backfill_above_bytes = backfill_above_bytes
        self.start_up = False
        self.skip_middles = False
        # The runs a saved state held files of: read whole from where it left them, since a
        # backfill of one would lack what the state holds of segments deleted since.
        self.restored_runs: set[str] = set()
        # inode -> (start, end): the bytes of a file the start-up replay skipped, for the backfill.
        self.gaps: dict[int, tuple[int, int]] = {}
        # run -> the ranks the start-up replay left to their tails alone (_tail_first): their
        # head's families wait for the backfill with the run's whole-history ones.
        self.headless: dict[str, set[int]] = {}
        # Those ranks' files, their tails read after ready (read_deferred), oldest first.
        self.deferred: dict[Path, None] = {}
        # At a start-up that skips middles: the (run, rank) of each name that is the only
        # snapshot file of its rank, which alone may be left to its tail (_tail_first).
        self._lone_files: set[tuple[str, int]] = set()
        # The run-by-run read of those middles (backfill.py), once the replay is done; None when
        # nothing is left to read.
        self.backfill: Backfill | None = None
        # W&B run files, TensorBoard event files, MLflow and Trackio databases below the root:
        # read by readers of their own, their records parsed and applied as a snapshot's.
        self.loggers = LoggerFiles(root, self._logged_row, self.error, self._wants)
        # run -> the formats it was read from -> the first file of each: kept for a tool that
        # asks (check sets it to {}), not by a long-running exporter.
        self.sources: dict[str, dict[str, Path]] | None = None
        # Each record the store took, with the file it came from: for a tool that reads a run as
        # the exporter does (report), not by a long-running exporter.
        self.on_record: Callable[[Path, Snapshot], None] | None = None

    # -- a saved state (saved_state.py) ------------------------------------------------------

    def saved_controls(self) -> dict[Path, bytes]:
        return self._controls

    def partial_runs(self) -> set[str]:
        """Runs served from their files' heads and tails (while the backfill reads the rest, or
        after it gave up on one): a saved state leaves them and their files out, so that a
        restart reads them again."""
        return self.store.partial_runs()

    def saved_files(self) -> dict[Path, FileState]:
        """The files a saved state keeps: every file followed but those of partial runs."""
        partial = self.partial_runs()
        if not partial:
            return self.files
        return {path: state for path, state in self.files.items()
                if identity_from_path(path, self.root)[0] not in partial}

    def path_of(self, inode: int) -> Path | None:
        """The name the file ``inode`` is followed under now (a rotation renames it)."""
        return self._inodes.get(inode)

    def saved_mark(self) -> int:
        """A hash of what a saved state keeps of the ingest (each file's place, the control
        files): equal marks, nothing to save again."""
        return hash((tuple((p, st.inode, st.offset, st.signature, st.digest, st.skipping)
                           for p, st in self.files.items()),
                     tuple((p, st.inode, st.offset, st.pending is None)
                           for p, st in self.loggers.files.items()),
                     tuple(self._controls.items())))

    def restore(self, files: dict[Path, FileState], controls: dict[Path, bytes]) -> None:
        """Follow ``files`` from where a saved state left them: the next rescan reads each from
        its offset (a file that changed hands since is found by its inode, as after a lag), and
        forgets those gone."""
        self.files = dict(files)
        self.restored_runs = {identity_from_path(path, self.root)[0] for path in self.files}
        self._inodes = {state.inode: path for path, state in self.files.items()}
        self._controls = dict(controls)
        self._seen = {path: () for path in self.files}  # unlike any listing: each is looked at
        self.health.files.set(len(self.files))

    # -- bookkeeping -------------------------------------------------------------------------

    def error(self, path: Path, reason: str, detail: str) -> None:
        """Count an error; log it once per (file, reason)."""
        self.health.error(path, reason, detail)

    def _read_error(self, path: Path, detail: str) -> None:
        if path not in self._failing:
            self._failing.add(path)
            self.error(path, "read_error", detail)

    def _refuse(self, path: Path, exc: Refused) -> None:
        if self._refused.get(path) != exc.reason:
            self._refused[path] = exc.reason
            self.error(path, exc.reason, exc.what)

    def _track(self, path: Path, state: FileState) -> None:
        state.name = path
        if not state.folder_inode and (folder := self._run_folder_path(path)) is not None:
            with contextlib.suppress(OSError):
                state.folder_inode = os.lstat(folder).st_ino
        self.files[path] = state
        self._inodes[state.inode] = path
        self.health.files.set(len(self.files))
        if self.backfill is not None:  # a file new to a run it reads is read in the run's order
            self.backfill.followed(path, state)

    def _untrack(self, path: Path) -> FileState | None:
        state = self.files.pop(path, None)
        if state is not None and self._inodes.get(state.inode) == path:
            del self._inodes[state.inode]
        self.health.files.set(len(self.files))
        return state

    @staticmethod
    def _holds(path: Path, inode: int) -> bool:
        """Whether ``path`` is (still) the file ``inode`` (itself, not a link to it)."""
        try:
            return os.lstat(path).st_ino == inode
        except OSError:
            return False

    def _detach(self, path: Path) -> None:
        state = self._untrack(path)
        if state is not None:
            self._detached[state.inode] = state
            self._vacated.add(path)

    def _drop(self, gone: set[Path]) -> None:
        """Forget the bookkeeping of the paths ``gone``, and of everything in them."""
        for table in (self._refused, self._retired, self.unfinished):
            for p in [p for p in table if _under(p, gone)]:
                del table[p]
        self._failing = {p for p in self._failing if not _under(p, gone)}

    def forget(self, path: Path) -> None:
        """A file or folder is gone: drop its state (its runs stay until they expire)."""
        if path in self.files:
            self._untrack(path)
        else:
            for p in [p for p in self.files if _under(p, {path})]:
                self._untrack(p)
        self._drop({path})
        if path == self.root:
            self._detached.clear()
            self._vacated.clear()

    def run_folder_gone(self, folder: Path) -> None:
        """A run folder was deleted or renamed (docs/snapshot-format.md#a-new-run-or-a-renamed-one):
        its run leaves the store, and whatever the folder holds now (re-created under the same
        name, maybe already read in part) is read from its start as a new run. A renamed
        folder's files are read from their start under the new name (moved(): a "folder" event)
        rather than followed by their inodes, since the run's name changed with the folder's.
        A live run's folder is not deleted or renamed while it writes, so a run is never split:
        the whole folder is read again, as one run."""
        gone = {folder}
        for p in [p for p in self.files if _under(p, gone)]:
            self._untrack(p)
        for inode in [i for i, st in self._detached.items() if _under(st.name, gone)]:
            del self._detached[inode]
        self._drop(gone)
        self._vacated = {p for p in self._vacated if not _under(p, gone)}
        self._seen = {p: sig for p, sig in self._seen.items() if not _under(p, gone)}
        run = run_label(folder.name)
        self._run_key_maps.pop(run, None)
        self._key_map_reads.pop(run, None)
        if self.backfill is not None:
            self.backfill.forget(run)
        if self.store.forget_run(run):
            log.info("run %s: its folder was deleted or renamed; a folder of that name is read "
                     "again as a new run", run)
        if self._visible(folder) and not folder.is_symlink() and folder.is_dir():
            self.scan_folder(folder)

    def _run_folder_path(self, path: Path) -> Path | None:
        """The run folder ``path`` lies in; None for a file directly in the snapshot folder."""
        parts = path.relative_to(self.root).parts if path.is_relative_to(self.root) else ()
        return self.root / parts[0] if len(parts) > 1 else None

    def _run_folders_gone(self) -> list[Path]:
        """The run folders of files followed that are gone from the snapshot folder, or another
        folder now (deleted and re-created)."""
        folders: dict[Path, int] = {}
        for path, state in self.files.items():
            if (folder := self._run_folder_path(path)) is not None:
                folders.setdefault(folder, state.folder_inode)
        gone = []
        for folder, inode in folders.items():
            try:
                now = os.lstat(folder).st_ino
            except OSError:
                gone.append(folder)
                continue
            if inode and now != inode:
                gone.append(folder)
        return gone

    def deleted(self, *paths: Path) -> None:
        """Delete events. One may be older than a file created since under the same name (and
        already read): only the state of what is gone is dropped. A batch of them costs one
        pass over the files followed, however many there are (a burst of deleted folders)."""
        # A run folder: its run goes, and a folder re-created there is new. (An event says the
        # folder itself was deleted, whatever became of the snapshot folder since: an unmounted
        # or moved-away snapshot folder sends none, and what was read stays served.)
        for p in paths:
            if p.parent == self.root and not is_snapshot_path(p, self.root) and not is_hidden(p.name):
                self.run_folder_gone(p)
        gone = set(paths)
        candidates = ([p for p in paths if p in self.files] if all(p in self.files for p in paths)
                      else [p for p in self.files if _under(p, gone)])
        for p in candidates:
            if not self._holds(p, self.files[p].inode):
                self._untrack(p)
                self._vacated.add(p)
        for name in [n for n, (where, _) in self._retired.items() if where in gone]:
            del self._retired[name]
        for table in (self._refused, self.unfinished):
            for p in [p for p in table if _under(p, gone)]:
                del table[p]
        for p in [p for p in self.loggers.files if _under(p, gone) and not p.exists()]:
            self.loggers.forget(p)  # a CSV table gone takes its part of its folder's runs

    def moved(self, src: Path, dest: Path) -> None:
        """A rename: keep reading where we were, under the new name. The event may be late:
        ``src`` may have been read again since as the new file a rotation put there (the
        renamed file was then found by its inode, see _catch_up), and ``dest`` may hold
        another file by now. Only a state whose file ``dest`` holds moves there. A file renamed
        to a name that is no snapshot (logrotate's ``rank-0.jsonl.1``, a hidden folder) is read
        to its end, as the file it was, before it is forgotten; one moved out of the snapshot
        folder is no longer read."""
        state = self.files.get(src)
        if state is None:
            self._vacated.add(src)  # a file we never saw left: the next one there is new
        elif not dest.is_relative_to(self.root):
            self._untrack(src)
            self._vacated.add(src)
        elif self._holds(dest, state.inode):
            self._untrack(src)
            self._vacated.add(src)
            if is_snapshot_path(dest, self.root):
                self._untrack(dest)
                self._track(dest, state)
            elif is_appended(src):
                self._finish(dest, state)
                self._retired[src] = (dest, state)
        self._refused.pop(src, None)
        self.process(dest, history=False)  # a rotated segment has no older segments of its own

    def scan(self, top: Path | None = None) -> list[tuple[Path, os.stat_result | None]]:
        """Every snapshot file (and re-baseline request) under ``top`` (default: the root), oldest
        first, so a replay ends on the newest; with what ``lstat`` said of it when listed (None if
        it could not be looked at). Links are not followed: a link under another name (a linked
        run folder) is counted here (``symlink``), one under a snapshot name is listed, for
        process() to count. A folder
        that cannot be listed is counted as a read_error once, until it can be listed again."""
        top = top or self.root
        found: list[tuple[float, str, Path, os.stat_result | None]] = []
        unreadable: set[Path] = set()
        self._listed_ns = time.time_ns()

        def walk_error(folder: Path, exc: OSError) -> None:
            if exc.errno == errno.ENOENT:  # gone while we walked: nothing left to read
                return
            unreadable.add(folder)
            if folder not in self._unreadable:
                self.error(folder, "read_error", os.strerror(exc.errno or errno.EIO))

        if not self._visible(top) or (is_logger_link(top.parent, top.name) and top.is_symlink()):
            # In a dot folder (a writer's scratch space), outside the tree, or a logger's own
            # link to a folder it keeps anyway (W&B's latest-run).
            return []
        try:
            for folder, entries in walk(self.root, top, descend=lambda n: not is_hidden(n),
                                        onerror=walk_error):
                # The folders walked are no dot folders: a name decides (no Path made for the
                # names that are no snapshot, the most of a large tree).
                for entry in entries:
                    name = entry.name
                    if is_hidden(name) and name not in _CONTROL_NAMES:
                        continue
                    if (not name.endswith(SNAPSHOT_SUFFIXES) or is_not_snapshot(name)) \
                            and name not in _CONTROL_NAMES \
                            and logger_format(name) not in READER_FORMATS:
                        if entry.is_symlink() and not is_logger_link(folder, name):
                            self._refuse(folder / name, Refused(folder / name, SYMLINK,
                                                                "a symbolic link"))
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        continue  # a folder of that name: walked into, not read
                    try:
                        st: os.stat_result | None = entry.stat(follow_symlinks=False)
                    except OSError:
                        st = None  # process() will count why
                    path = folder / name
                    found.append((st.st_mtime if st else 0.0, str(path), path, st))
        except Refused as exc:  # ``top`` itself is a link
            self._refuse(top, exc)
        # Oldest first; NeMo-RL's per-sample files last, so that a run its logger writes too is
        # known to be read from that logger before they are opened (_wants).
        found.sort(key=lambda f: (logger_format(f[2].name) == "samples", f[0], f[1]))
        if top == self.root:
            self._unreadable = unreadable
        else:
            self._unreadable |= unreadable
        return [(p, st) for _, _, p, st in found]

    def _visible(self, path: Path) -> bool:
        """Whether ``path`` is the root or lies below it, in no dot folder and no dotfile."""
        return path == self.root or (path.is_relative_to(self.root) and not any(
            is_hidden(part) for part in path.relative_to(self.root).parts))

    def _link(self, path: Path) -> None:
        """Count a link in the tree under a name that is no snapshot (a linked run folder, say):
        never followed, not even to see what it points to (a stat could hang on a dead mount)."""
        try:
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                return
        except OSError:
            return
        self._refuse(path, Refused(path, SYMLINK, "a symbolic link"))

    def rescan(self) -> None:
        """Process every file whose metadata changed since the last rescan: the safety net for
        events a watcher missed, and the start-up replay."""
        current: dict[Path, tuple[int, ...]] = {}
        for folder in self._run_folders_gone() if self.root.is_dir() else ():
            self.run_folder_gone(folder)  # deleted or renamed, unseen by the watcher
        detached_before = list(self._detached)
        self._listings = {}
        try:
            self._scan_all(current)
        finally:
            self._listings = None
        gone: set[Path] = set()
        for path in self._seen.keys() - current.keys():
            if _under(path, self._unreadable):
                # Not gone, only hidden for now: read on where we were once it can be listed.
                current[path] = self._seen[path]
                continue
            self._untrack(path)
            gone.add(path)
        self._drop(gone)
        for inode in detached_before:  # not under any name this rescan read: gone
            self._detached.pop(inode, None)
        # A writer had a rescan interval to reopen its file: what it left behind is finished.
        retired, self._retired = self._retired, {}
        for where, state in retired.values():
            self._finish(where, state)
        self._finished.clear()
        self._vacated &= current.keys()
        self._seen = current
        self.loggers.settle()

    def _scan_all(self, current: dict[Path, tuple[int, ...]]) -> None:
        listed = self.scan()
        if self.start_up:
            # A first start of more than --snapshot.backfill-above-bytes: heads and tails first.
            unread = sum(st.st_size for path, st in listed if st is not None and path not in self.files
                         and identity_from_path(path, self.root)[0] not in self.restored_runs)
            self.skip_middles = 0 < self.backfill_above_bytes < unread
            if self.skip_middles:
                ranks = Counter(identity_from_path(path, self.root) for path, st in listed
                                if st is not None and is_appended(path))
                self._lone_files = {identity for identity, files in ranks.items() if files == 1}
        for path, st in listed:
            sig = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode) if st is not None else ()
            current[path] = sig
            if self._seen.get(path) != sig:
                # Oldest first, the scan reads each name's history in order. A file renamed
                # since it was listed (a rotation during a long replay) is found by its inode
                # and finished before what took its name; so is one gone before it was looked at.
                self.process(path, st.st_ino if st is not None else None, history=st is None,
                             budget=None)

    def scan_folder(self, folder: Path) -> set[Path]:
        """A folder that appeared (made, or moved in): read the files it holds, which may have
        landed before the watcher watched it, oldest first; the files read. A folder moved
        within the tree keeps its files' offsets: each is found by its inode."""
        read: set[Path] = set()
        for path, st in self.scan(folder):
            self.process(path, st.st_ino if st is not None else None, history=st is None,
                         budget=None)
            read.add(path)
        self.loggers.settle()
        return read

    # -- reading -----------------------------------------------------------------------------

    def process(self, path: Path, listed_inode: int | None = None, *, history: bool = True,
                budget: int | None = READ_BUDGET) -> None:
        """Read whatever is new in ``path``; safe to call for any path, any number of times.
        ``listed_inode``: the file a scan found under this name. ``history``: a ``*.jsonl``
        name new to us may have rotated before we saw it (an exporter that lags, started late
        on a folder it was told of, or missed events): its older segments are read first.
        ``budget``: bytes to read at most now (None: all); the rest waits in ``unfinished``."""
        self.unfinished.pop(path, None)
        if path.name == REBASELINE_REQUEST:
            self._control(path)
            return
        if path.name == KEY_MAP_FILE:
            self._run_key_maps.pop(self._run_folder(path) or "", None)  # read at its next record
            self._refused.pop(path, None)
            return
        if (fmt := logger_format(path.name)) in READER_FORMATS:
            if self._visible(path):
                self._logger_file(path, fmt, budget)
            return
        if not is_snapshot_path(path, self.root):
            if self._visible(path) and not is_logger_link(path.parent, path.name):
                self._link(path)
            return
        try:
            # The file read is the one opened: a name may change hands (a rotation) at any
            # moment, so its inode is taken from the open file, not from the name.
            fh = open_regular(self.root, path)
        except Refused as exc:
            self._detach(path)  # whatever we followed under this name went away
            self._refuse(path, exc)
            return
        except (FileNotFoundError, NotADirectoryError):
            # Renamed again (its move event is queued) or deleted: kept aside for the name it
            # may have now.
            self._detach(path)
            return
        except IsADirectoryError:
            return  # a folder of that name: walked into, not read
        except OSError as exc:
            self._read_error(path, os.strerror(exc.errno or errno.EIO))
            return
        with fh:
            try:
                st = os.fstat(fh.fileno())
                self._read(path, fh, st, listed_inode, history, budget)
            except OSError as exc:
                self._read_error(path, os.strerror(exc.errno or errno.EIO))
                return
        self._failing.discard(path)
        self._refused.pop(path, None)

    def _logger_file(self, path: Path, fmt: str, budget: int | None) -> None:
        """A W&B run file, TensorBoard event file or database (runtime/loggers)."""
        try:
            if self.loggers.process(path, fmt, budget):
                self.unfinished[path] = None
        except Refused as exc:
            self.loggers.forget(path)
            self._refuse(path, exc)
            return
        except OSError as exc:
            self._read_error(path, os.strerror(exc.errno or errno.EIO))
            return
        self._failing.discard(path)
        self._refused.pop(path, None)

    def _logged_row(self, path: Path, run: str, row: dict[str, object], mtime: float) -> None:
        snap = self.parse_object(path, row, mtime, run=run)
        if snap is not None:
            self._apply(path, snap, mtime, None)

    def _read(self, path: Path, fh: BinaryIO, st: os.stat_result, listed_inode: int | None,
              history: bool, budget: int | None) -> None:
        state = self.files.get(path)
        previous = None  # the file this name held before, when we followed it
        known = state.inode if state is not None else listed_inode
        if known is not None and known != st.st_ino:
            # The name holds another file than the one we knew under it: that one was renamed
            # (a rotation whose move event is still queued, or one since a scan listed it) or
            # deleted. Its state waits, detached, for its new name.
            previous = state
            self._detach(path)
            self._vacated.add(path)
            state = None
        if state is None:
            state = self._adopt(st.st_ino)
            # A listing made while files are renamed need not hold the ones renamed during it:
            # a file changed since a scan began may have older segments that scan missed.
            changed_since_listed = (listed_inode is not None
                                    and st.st_ctime_ns >= self._listed_ns - CLOCK_SLACK_NS)
            if (state is None and is_appended(path)
                    and (history or changed_since_listed or path in self._vacated)):
                # A new file under a name whose file went away (a rotation), or a name new to
                # us: what came before it is read first, so that a rank's records are applied
                # in the order they were written.
                self._catch_up(path, st.st_ino, previous)
            if state is None and self._followed_elsewhere(path, st.st_ino):
                return  # renamed while we looked, and read under its new name meanwhile
            self._vacated.discard(path)
            state = state or FileState(inode=st.st_ino)
            self._track(path, state)
        if not is_appended(path):
            self._reread(path, state, st, fh)
        elif budget is None and self._may_skip_middle(path, state, st):
            self._skip_middle(path, state, st, fh)
        else:
            self._tail(path, state, st, fh, budget)

    def _control(self, path: Path) -> None:
        """A run's re-baseline request (grpo-monitor rebaseline)."""
        try:
            data = read_regular(self.root, path, MAX_CONTROL_BYTES)
        except FileNotFoundError:
            self._controls.pop(path, None)
            return
        except Refused as exc:
            self._controls.pop(path, None)
            self._refuse(path, exc)
            return
        except OSError as exc:  # a folder of that name, a permission
            self.error(path, "read_error", os.strerror(exc.errno or errno.EIO))
            return
        self._refused.pop(path, None)
        if self._controls.get(path) == data:
            return
        self._controls[path] = data
        if len(data) > MAX_CONTROL_BYTES:
            self.error(path, "invalid_control", f"over {MAX_CONTROL_BYTES} bytes")
            return
        try:
            req = RebaselineRequest.model_validate_json(data)
        except ValueError as exc:
            self.error(path, "invalid_control", str(exc).splitlines()[0])
            return
        run, _ = identity_from_path(path, self.root)
        if self.store.rebaseline(run, req.at_step, req.steps) is False:
            self.error(path, "run_limit", self._run_limit())
            return
        if self.backfill is not None:
            self.backfill.rebaselined(run, req.at_step, req.steps)
        log.info("run %s: re-baseline on the %d steps up to step %d", run, req.steps, req.at_step)

    def _run_limit(self) -> str:
        return f"{self.store.limits.max_runs} runs exported already (--metrics.max-runs)"

    def _adopt(self, inode: int) -> FileState | None:
        """The state of a file we know under another name (a rename we did not see)."""
        state = self._detached.pop(inode, None)
        if state is not None:
            return state
        other = self._inodes.get(inode)
        if other is None or self._holds(other, inode):
            return None
        self._vacated.add(other)
        return self._untrack(other)

    def _followed_elsewhere(self, path: Path, inode: int) -> bool:
        other = self._inodes.get(inode)
        return other is not None and other != path and self._holds(other, inode)

    def _catch_up(self, name: Path, inode: int, previous: FileState | None = None) -> None:
        """Read what came before the file ``inode`` opened under ``name``, in the order it was
        written. ``previous``: the state of the file ``name`` held before, when we followed it.

        1. That file, wherever it went in its folder, found by its inode whatever its new name:
           under another snapshot name it is followed there; under a name that is none
           (logrotate's ``rank-0.jsonl.1``) it is read to its end and forgotten.
        2. Files rotated logrotate's way (``<name>.<N>``, the oldest the highest N; ``.gz`` and
           the like are not read) that we never saw, written since we last read ``previous``:
           rotations that came and went while we lagged, read whole, oldest first.
        3. The older segments of ``name``'s rotation the SDK's way (``<base>.jsonl`` renamed to
           ``<base>.<seq>.jsonl``, the sequence growing) that we do not follow yet, in sequence
           order: the file that was ``name`` goes on where it was, and a segment that came and
           went while we were not looking is read whole. Those existed before ``inode`` did,
           so every listing holds them. A listing made while the writer goes on rotating may
           also hold newer segments, and miss the new name of ``inode`` itself: then it is made
           again.

        A file renamed to another folder waits, detached, for its move event or a rescan."""
        retired = self._retired.pop(name, None)
        if retired is not None:  # its move event came: it is read once more, then forgotten
            previous = retired[1]
            self._finish(*retired)
        base, seq = rotation_of(name.name)
        for attempt in range(CATCH_UP_LISTINGS):
            unseen: list[tuple[int, Path, int]] = []
            try:
                listing = self._listing(name.parent, fresh=attempt > 0)
            except OSError:
                return
            renamed = [(Path(where), i) for i in list(self._detached) if (where := listing.files.get(i))]
            for other_seq, where, candidate_inode in listing.segments.get(base, ()):
                if seq is not None and other_seq >= seq:
                    continue
                candidate = Path(where)
                if candidate in self.files:
                    if candidate in self.unfinished:  # history is read whole, in order
                        unseen.append((other_seq, candidate, candidate_inode))
                    continue
                if candidate in self._vacated or not is_snapshot_path(candidate, self.root):
                    continue
                unseen.append((other_seq, candidate, candidate_inode))
            for candidate, candidate_inode in renamed:
                if is_snapshot_path(candidate, self.root):
                    self.process(candidate, candidate_inode, history=False, budget=None)
                elif (state := self._detached.pop(candidate_inode, None)) is not None:
                    self._finish(candidate, state)
            if previous is not None:
                self._missed_rotations(name, previous.read_ns, {inode, previous.inode})
                previous = None  # read: a listing made again skips them
            unseen.sort()
            if seq is None and not self._holds(name, inode):
                # ``inode`` was renamed too, so newer segments may be listed: stop at it.
                cut = next((i for i, u in enumerate(unseen) if u[2] == inode), None)
                if cut is None:
                    continue
                unseen = unseen[: cut + 1]
            for _, candidate, candidate_inode in unseen:
                self.process(candidate, candidate_inode, history=False, budget=None)
            return

    def _listing(self, folder: Path, fresh: bool) -> FolderListing:
        """``folder``'s files by rotation and by inode: listed once per rescan (a rescan catches
        up every file of a folder, and listing a folder of 4,096 ranks' files for each of them
        would cost the square of their count), or now when ``fresh`` or outside a rescan."""
        cache = self._listings
        if cache is not None and not fresh and (kept := cache.get(folder)) is not None:
            return kept
        listing = FolderListing({}, {})
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    inode = entry.inode()
                    base, seq = rotation_of(entry.name)
                    if seq is not None:
                        listing.segments.setdefault(base, []).append((seq, entry.path, inode))
                    elif entry.is_file(follow_symlinks=False):
                        listing.files[inode] = entry.path
                except OSError:
                    continue
        if cache is not None:
            cache[folder] = listing
        return listing

    def _missed_rotations(self, name: Path, since_ns: int, skip: set[int]) -> None:
        """Read whole, oldest first, the files rotated logrotate's way from ``name``
        (``<name>.<N>``, the oldest the highest N; a compressed ``.gz`` is not read) that we
        never followed and that were written since ``since_ns``, when we last read the file
        that was ``name``: rotations that came and went while we lagged. ``skip``: the inodes
        of the file now under ``name`` and of the one before it."""
        pattern = re.compile(re.escape(name.name) + r"\.([0-9]+)")
        missed: list[tuple[int, Path, int]] = []
        try:
            with os.scandir(name.parent) as entries:
                for entry in entries:
                    if not (m := pattern.fullmatch(entry.name)):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if (stat.S_ISREG(st.st_mode) and st.st_ino not in skip
                            and st.st_ino not in self._inodes and st.st_ino not in self._detached
                            and st.st_ino not in self._finished
                            and st.st_mtime_ns >= since_ns - CLOCK_SLACK_NS):
                        missed.append((-int(m[1]), Path(entry.path), st.st_ino))
        except OSError:
            return
        for _, where, inode in sorted(missed):
            self._finish(where, FileState(inode=inode, name=name))

    def _finish(self, where: Path, state: FileState) -> None:
        """Read a file renamed to a name that is no snapshot to its end, as the file it was
        (``state.name``: its run, rank and offset). Nothing when ``where`` holds another file
        by now, or lies outside the snapshot folder."""
        if not is_appended(state.name):
            return
        try:
            with open_regular(self.root, where) as fh:
                st = os.fstat(fh.fileno())
                if st.st_ino == state.inode:
                    self._tail(state.name, state, st, fh, None)
                    self._finished.add(state.inode)
        except (OSError, ValueError):  # gone too, no regular file, not in the tree
            return

    def _tail(self, path: Path, state: FileState, st: os.stat_result, fh: BinaryIO,
              budget: int | None, stop: Callable[[], bool] | None = None) -> None:
        """Read on from the file's offset: to its end, or ``budget`` bytes, or up to the record
        after which ``stop()`` says enough (a first start's head, _skip_middle)."""
        if st.st_size < state.offset or not self._same_prefix(fh, state):
            # Truncated or rewritten in place (size alone cannot tell a rewrite to the same
            # length): start again from the top. Or a new file that took a deleted one's inode
            # number: what rotated away meanwhile comes first.
            if state.offset:
                self._missed_rotations(path, state.read_ns, {state.inode})
                if self.backfill is not None:  # a run it reads is read again from its files
                    self.backfill.started_over(path, state.inode)
            state.offset, state.skipping, state.tail = 0, False, b""
        fh.seek(state.offset)
        deadline = time.monotonic() + READ_TURN_SECONDS if budget is not None else None
        # Bytes past what the last read saw were written after it, whatever their mtime says: a
        # file server whose clock lags must not make a live run look silent (or expire it).
        written_after = state.read_ns / 1e9
        state.read_ns = time.time_ns()
        unfinished = b""  # after the last newline: read again next time, never consumed
        left = budget
        # A head (``stop``) is a few hundred lines of a file that may be gigabytes: read in
        # chunks that start small and double, not in READ_CHUNKs of which most would be copied
        # twice and dropped (at 1,024 ranks, 4 GiB read for 60 MiB of heads).
        chunk_size = HEAD_CHUNK if stop is not None else READ_CHUNK
        while True:
            # What the file holds past the offset, and some: a read of READ_CHUNK would allocate
            # that much for a file's one new line.
            want = max(min(chunk_size, st.st_size - fh.tell() + (64 << 10)), 64 << 10)
            chunk_size = min(2 * chunk_size, READ_CHUNK)
            if left is not None:
                want = min(want, left)
            chunk = fh.read(want)
            if not chunk:
                return
            data = unfinished + chunk
            end = data.rfind(b"\n") + 1
            unfinished = data[end:]
            if end:
                # A record without a time of its own takes the file's mtime once its bytes are
                # read: a write can land between the look at the file and the read.
                mtime = _dated(os.fstat(fh.fileno()).st_mtime, written_after)
                done = self._lines(path, state, data[: end - 1], mtime, deadline, stop)
                self._consume(state, data[:done])
                if done < end:  # its time is up: the rest is read at its next turn
                    if stop is None:
                        self.unfinished[path] = None
                    return
            if len(unfinished) > self.max_line_bytes:
                if not state.skipping:
                    self.error(path, "oversized", f"line over {self.max_line_bytes} bytes")
                self._consume(state, unfinished)
                unfinished, state.skipping = b"", True
            if len(chunk) < want:  # a short read of a regular file: its end, for now
                return
            if left is not None:
                left -= len(chunk)
                if left <= 0:
                    self.unfinished[path] = None  # its turn is over; the others' events first
                    return

    @staticmethod
    def _consume(state: FileState, data: bytes) -> None:
        state.offset += len(data)
        state.tail = (state.tail + data[-TAIL_CHECK:])[-TAIL_CHECK:]

    @staticmethod
    def _same_prefix(fh: BinaryIO, state: FileState) -> bool:
        if not state.tail:
            return True
        fh.seek(state.offset - len(state.tail))
        return fh.read(len(state.tail)) == state.tail

    def _lines(self, path: Path, state: FileState, lines: bytes, mtime: float,
               deadline: float | None = None, stop: Callable[[], bool] | None = None) -> int:
        """Whole lines, without the last one's newline; the bytes handled, newlines included:
        all of them, or those up to the line after which ``deadline`` (monotonic) passed or
        ``stop()`` said enough."""
        pos, size = 0, len(lines)
        while True:
            nl = lines.find(b"\n", pos)
            end = size if nl < 0 else nl
            line = lines[pos:end]
            pos = end + 1
            if state.skipping:  # the tail of an oversized line
                state.skipping = False
            elif len(line) > self.max_line_bytes:
                self.error(path, "oversized", f"line of {len(line)} bytes > {self.max_line_bytes}")
            elif line.strip(JSON_WHITESPACE):
                self._record(path, line, mtime, inode=state.inode)
            if nl < 0:
                return pos
            if deadline is not None and time.monotonic() > deadline:
                return pos
            if stop is not None and stop():
                return pos

    def _reread(self, path: Path, state: FileState, st: os.stat_result, fh: BinaryIO) -> None:
        signature = (st.st_size, st.st_mtime_ns)
        changed = signature != state.signature
        if not changed and st.st_mtime_ns < state.read_ns - CLOCK_SLACK_NS:
            return
        written_after = state.read_ns / 1e9  # as in _tail: a change since the last look is newer
        state.signature, state.read_ns = signature, time.time_ns()
        if st.st_size > self.max_file_bytes:
            if changed:
                self.error(path, "oversized", f"{st.st_size} bytes > {self.max_file_bytes}")
            return
        data = fh.read(self.max_file_bytes + 1)
        digest = hashlib.blake2b(data, digest_size=16).digest()
        if digest == state.digest:  # looked at already: a touch, a rewrite with the same content
            return
        state.digest = digest
        # A *.json file that stops mid-document is most likely still being written: counted as
        # incomplete, and read again on its next change.
        mtime = _dated(st.st_mtime, written_after)
        try:
            obj = decode_record(data, whole_file=True)
        except RecordError as exc:
            self.error(path, exc.reason, str(exc))
            return
        rows = log_rows(obj)
        if rows is not None:
            self._log_rows(path, rows, mtime, state.inode)
            return
        snap = self.parse_object(path, obj, mtime)
        if snap is not None:
            self._apply(path, snap, mtime, state.inode)

    def _log_rows(self, path: Path, rows: list[dict[str, Any]], mtime: float, inode: int) -> None:
        """A whole log in one JSON document (a Hugging Face checkpoint's ``trainer_state.json``,
        a loop's list of step rows), saved again as it grows: only the steps past what the run's
        earlier documents gave are applied, so that a new checkpoint adds its steps and an old
        one (read late) adds none."""
        if not rows:
            self.error(path, "invalid_record", "a log with no step in its entries")
            return
        run = identity_from_path(path, self.root)[0]
        done = self._logged_upto.get(run, -1)
        for row in rows:
            if row["step"] <= done:
                continue
            snap = self.parse_object(path, row, mtime)
            if snap is not None and self._apply(path, snap, mtime, inode):
                self._logged_upto[run] = row["step"]

    def _run_folder(self, path: Path) -> str | None:
        """The name of the run folder ``path`` lies in; None for a file at the root."""
        return run_folder_of(path, self.root)

    def key_map_for(self, path: Path) -> KeyMap | None:
        """The key map of the run ``path`` belongs to: its folder's .grpo-keys.toml over the
        flag's. A file that cannot be used is counted (invalid_key_map) and the flag's map
        applies alone."""
        folder = self._run_folder(path)
        if folder is None:
            return self.key_map
        if folder in self._run_key_maps:
            return self._run_key_maps[folder]
        last = self._key_map_reads.get(folder)
        now = time.monotonic()
        if last is not None and last[0] and now - last[2] < KEY_MAP_MIN_INTERVAL_S:
            # A map file changed again within the second: the map read last serves until then
            # (one rewritten a hundred times a second costs the run a read a second, not a
            # parse a record), and the file is looked at by the first record after it. A map
            # that appears where there was none is read at once.
            return last[1]
        where = self.root / folder / KEY_MAP_FILE
        found = self.key_map
        digest = b""
        try:
            data = read_regular(self.root, where, MAX_KEY_MAP_BYTES + 1)
            digest = hashlib.sha256(data).digest()
            if last is not None and last[0] == digest:
                found = last[1]  # the same text: neither parsed nor counted again
            else:
                if len(data) > MAX_KEY_MAP_BYTES:
                    raise KeyMapError(f"over {MAX_KEY_MAP_BYTES} bytes")
                found = KeyMap.parse(data, str(where)).over(self.key_map)
                log.info("run %s: key map %s, %d names", folder, where, len(found.names))
        except FileNotFoundError:
            pass
        except Refused as exc:
            self._refuse(where, exc)
        except KeyMapError as exc:
            self.error(where, "invalid_key_map", str(exc))
        except OSError as exc:  # a folder of that name, a permission
            self.error(where, "read_error", os.strerror(exc.errno or errno.EIO))
        self._run_key_maps[folder] = found
        self._key_map_reads[folder] = (digest, found, now)
        return found

    def parse(self, path: Path, raw: bytes, mtime: float, whole_file: bool = False,
              count: bool = True) -> Snapshot | None:
        """One record of ``path`` as the run it belongs to; None when it is none. ``count``:
        count its problems (the backfill counts only those of the bytes the start-up skipped)."""
        try:
            obj = decode_record(raw, whole_file=whole_file)
        except RecordError as exc:
            if count:
                self.error(path, exc.reason, str(exc))
            return None
        return self.parse_object(path, obj, mtime, count)

    def parse_object(self, path: Path, obj: object, mtime: float, count: bool = True,
                     run: str | None = None) -> Snapshot | None:
        """One decoded record of ``path`` as the run it belongs to (``parse``'s second half):
        a framework's JSONL row is read as the flat record it stands for. ``run``: the run a
        logger's own metadata names (a W&B run name), over the one the path implies."""
        path_run, rank = identity_from_path(path, self.root)
        run = run or path_run
        if logger_format(path.name) == "jsonl":
            obj = as_snapshot_row(obj)
        try:
            snap = parse_record(obj, run=run, rank=rank, mtime=mtime,
                                key_map=self.key_map_for(path))
        except RecordError as exc:
            if count:
                self.error(path, exc.reason, str(exc))
            return None
        snap.source = logger_format(path.name) or "snapshots"
        for reason, detail in snap.problems if count else ():
            self.error(path, reason, detail)
        if snap.run != run and path.parent != self.root:
            # A run is its folder (where its pause record goes): a renamed folder is the new name.
            snap.run = run
        return snap

    def _record(self, path: Path, raw: bytes, mtime: float, whole_file: bool = False,
                inode: int | None = None) -> bool:
        snap = self.parse(path, raw, mtime, whole_file)
        if snap is None:
            return False
        return self._apply(path, snap, mtime, inode)

    def _apply(self, path: Path, snap: Snapshot, mtime: float, inode: int | None) -> bool:
        if self.sources is not None and len(self.sources.get(snap.run, ())) < MAX_SOURCES_NAMED:
            self.sources.setdefault(snap.run, {}).setdefault(snap.source, path)
        if not self._from_its_source(snap):
            return False
        if self.store.apply(snap, wrote_at=mtime) is False:
            self.error(path, "run_limit", self._run_limit())
            return False
        self.health.ingested_by_shape[snap.shape].inc()
        if self.backfill is not None and inode is not None:
            self.backfill.tee(inode, path, snap, mtime)
        if self.on_record is not None:
            self.on_record(path, snap)
        return True

    def _from_its_source(self, snap: Snapshot) -> bool:
        """Whether ``snap`` comes from the source its run is read from: a run that two loggers
        write (SOURCE_PRECEDENCE) is read from the first of them only, else each step would come
        twice and the run's steps go back at each. A better source than the run's is read from
        its first record on: the run is built again from it."""
        source = self._source_of(snap.run)
        if source in (None, snap.source):
            return True
        if _rank(snap.source) >= _rank(source):
            return False  # check names the files left out (sources)
        log.info("run %s: read from its %s files from now on, no longer from its %s files",
                 printable(snap.run), snap.source, source)
        self.store.forget_run(snap.run)
        return True

    def _wants(self, run_name: str, fmt: str) -> bool:
        """Whether rows of ``fmt`` would be read into the run ``run_name`` (_from_its_source):
        asked before a costly file is read (a NeMo-RL step's samples, token ids and all)."""
        source = self._source_of(run_name)
        return source is None or _rank(fmt) <= _rank(source)

    def _source_of(self, run_name: str) -> str | None:
        """The source the run is read from; None while it has none (not read yet, or a state
        saved before sources were kept)."""
        run = self.store.run_state(run_name)
        return run.source if run is not None and run.source else None

    # -- a first start: a long file's head and tail (the backfill reads its middle) ----------

    def _may_skip_middle(self, path: Path, state: FileState, st: os.stat_result) -> bool:
        """Whether a start-up replay may read this file at its head and tail: one of a run
        folder, new to us, and long enough to have a middle. Not a file directly in the snapshot
        folder (its records may name any run), nor one of a run a saved state holds (a whole
        read of the run would lack what the state holds of segments deleted since)."""
        if not (self.skip_middles and state.offset == 0 and st.st_size > MIN_MIDDLE_BYTES):
            return False
        return run_folder_of(path, self.root) is not None and \
            identity_from_path(path, self.root)[0] not in self.restored_runs

    def _skip_middle(self, path: Path, state: FileState, st: os.stat_result, fh: BinaryIO) -> None:
        """Read a file new to a first start at its head and its tail, and leave the bytes
        between to the backfill (backfill.py), which reads them after /-/ready: a start-up's
        time then follows the ranks, not the steps run (docs/scaling.md#first-start).

        The head: the records up to the end of the rank's baseline period (its baseline and
        initial values, as a whole read has them). The tail: the records of the last steps
        its series read (RankSignals.reach: every window, the levels), found by the step of a
        few lines decoded at guessed places. A middle of fewer than MIN_MIDDLE_BYTES is read at
        once instead (_may_skip_middle says which files may be read so)."""
        if self._tail_first(path, state, st, fh):
            return
        run, rank = identity_from_path(path, self.root)
        most = HEAD_RECORDS_PER_BASELINE_STEP * self.store.limits.baseline_steps
        seen = [0]

        def head_read() -> bool:
            seen[0] += 1
            return seen[0] >= most or self.store.baseline_read(run, rank)

        read_ns = state.read_ns  # the tail's bytes are as old as the head's: dated alike (_dated)
        self._tail(path, state, st, fh, None, stop=head_read)
        head_end, state.read_ns = state.offset, read_ns
        if self.store.baseline_read(run, rank) and not state.skipping:
            start = self._tail_start(path, fh, st.st_size, head_end, self.store.reach(run, rank))
            if start - head_end >= MIN_MIDDLE_BYTES:
                fh.seek(start - TAIL_CHECK)
                state.tail = fh.read(TAIL_CHECK)
                state.offset = start
                self.gaps[state.inode] = (head_end, start)
        self._tail(path, state, st, fh, None)

    def _tail_first(self, path: Path, state: FileState, st: os.stat_result, fh: BinaryIO) -> bool:
        """Leave the file of a rank that logs performance signals only to its tail, read after
        ready (read_deferred), and its head to the backfill with its middle; False (nothing
        done) for any other file.

        Why: at a first start of a wide job (thousands of ranks, a few hundred steps each) the
        ranks of performance signals are nearly every record read: ready would wait for all of
        them. What the cards judge first is the training signals, which rank 0 logs (read at
        its head and tail before ready); the stalled rank, the straggler and the hung run read
        the other ranks' newest steps, read right after; their baselines and first records
        come with the backfill, their families (exposition.NEEDS_HEAD) withheld until then
        (store.mark_partial).

        Whether a rank logs performance signals only is read from its first record and every
        record of the tail: one record with anything else (a training signal, a sample, a key
        outside the canonical set) and the file is read at head and tail instead. Events are
        no signal: a checkpoint's on every rank is read in the tail as before. Only the one
        file of its rank: a rank's rotated files are read in order, head to tail. A rank that
        logged a training signal in its middle alone is left to its tail all the same: that
        signal's series are absent until the swap, never approximate."""
        identity = identity_from_path(path, self.root)
        if identity not in self._lone_files:
            return False
        size = st.st_size
        start = self._tail_start(path, fh, size, 0, PERF_REACH)
        if start < MIN_MIDDLE_BYTES:
            return False
        first = self._perf_rank(path, fh, 0, min(size, PROBE_BYTES), most=1)
        if first is None or self._perf_rank(path, fh, start, size) != first:
            return False
        fh.seek(start - TAIL_CHECK)
        state.tail = fh.read(TAIL_CHECK)
        state.offset = start
        self.gaps[state.inode] = (0, start)
        self.headless.setdefault(identity[0], set()).add(first)
        self.deferred[path] = None
        return True

    def read_deferred(self, seconds: float | None) -> bool:
        """Read the tails a start-up left for after ready (_tail_first), for about ``seconds``
        (None: all), each file's tail whole; whether any is left."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while self.deferred and (deadline is None or time.monotonic() < deadline):
            path = next(iter(self.deferred))
            del self.deferred[path]
            self.process(path, budget=None)
        return bool(self.deferred)

    def _perf_rank(self, path: Path, fh: BinaryIO, begin: int, end: int, most: int = 0) -> int | None:
        """The rank of the whole lines in [begin, end) (the first ``most`` of them, when set)
        if each is a record of that one rank's performance signals alone; else None. A record
        with the names of one found so already is not parsed again (_names): a rank writes the
        same keys at every step, and parsing every line twice was most of a wide start's time."""
        fh.seek(begin)
        lines = fh.read(end - begin).split(b"\n")[:-1]  # the last has no newline yet
        ranks: set[int] = set()
        checked: list[tuple[object, ...]] = []
        for line in lines[:most] if most else lines:
            try:
                obj = decode_record(line)
            except RecordError:
                continue  # no record: it holds no signal either (the live read counts it)
            if (names := _names(obj)) is not None and names in checked:
                continue
            if (snap := self.parse_object(path, obj, 0.0, count=False)) is None:
                continue
            if not snap.metrics or not all(is_perf(key) for key in snap.metrics) \
                    or snap.unknown or snap.by_type or snap.by_type_unknown or snap.samples:
                return None
            ranks.add(snap.rank)
            if names is not None:
                checked.append(names)
        return ranks.pop() if len(ranks) == 1 else None

    def _tail_start(self, path: Path, fh: BinaryIO, size: int, head_end: int, reach: int) -> int:
        """Where the tail of the last ``reach`` steps begins: the start of a line whose step is
        at least ``reach`` before the newest line's, within PROBE_BYTES of the last such line;
        ``head_end`` when the tail reaches back to the head."""
        newest = self._step_before(path, fh, size, head_end)
        if newest is None:
            return head_end
        enough, back = head_end, PROBE_BYTES
        while size - back > head_end:  # double the guess until it reaches back far enough
            found = self._step_after(path, fh, size - back, size)
            if found is not None and found[1] <= newest - reach:
                enough = found[0]
                break
            back *= 2
        if enough == head_end:
            return head_end
        # Then bisect between enough and the guess before, which was not back far enough.
        late = size - back // 2 if back > PROBE_BYTES else size
        while late - enough > PROBE_BYTES:
            middle = (enough + late) // 2
            found = self._step_after(path, fh, middle, size)
            if found is not None and found[0] < late and found[1] <= newest - reach:
                enough = found[0]
            else:
                late = middle
        return enough

    def _step_after(self, path: Path, fh: BinaryIO, pos: int, size: int) -> tuple[int, int] | None:
        """(start, step) of the first whole line that starts after ``pos``; None when there is
        none within a line's length or it holds no record."""
        want = PROBE_BYTES
        while True:
            fh.seek(pos - 1)
            data = fh.read(min(size - pos + 1, want))
            first = data.find(b"\n") + 1
            end = data.find(b"\n", first) if first else -1
            if end >= 0:
                snap = self.parse(path, data[first:end], 0.0, count=False)
                return (pos - 1 + first, snap.step) if snap is not None else None
            if len(data) < want or want > self.max_line_bytes:
                return None
            want *= 4

    def _step_before(self, path: Path, fh: BinaryIO, size: int, head_end: int) -> int | None:
        """The step of the file's last whole line (one still being written has no newline)."""
        want = PROBE_BYTES
        while True:
            start = max(head_end, size - want)
            fh.seek(start)
            data = fh.read(size - start)
            end = data.rfind(b"\n")
            begin = data.rfind(b"\n", 0, max(end, 0)) + 1
            if end >= 0 and (begin > 0 or start == head_end):
                snap = self.parse(path, data[begin:end], 0.0, count=False)
                return snap.step if snap is not None else None
            if start == head_end or want > self.max_line_bytes:
                return None
            want *= 4


def _names(obj: object) -> tuple[object, ...] | None:
    """What decides which signals a record holds: its field names, its metrics' names and its
    rank (events aside, which carry none). Two records with equal names hold the same signals or
    fewer (a null value, one that is no number); None where that does not follow from the names:
    a metric or a field whose value is an object or a list (prompt types, samples, nesting)."""
    if not isinstance(obj, dict):
        return None
    metrics = obj.get("metrics")
    if isinstance(metrics, dict) and any(isinstance(v, dict) for v in metrics.values()):
        return None
    if any(isinstance(v, (dict, list)) for k, v in obj.items() if k not in ("metrics", "events")):
        return None
    return (obj.keys() - {"events"}, metrics.keys() if isinstance(metrics, dict) else None,
            obj.get("rank"))

"""Reading snapshot files: tail *.jsonl incrementally, re-read *.json on change.

Everything here runs on the one ingest thread, so the per-file state needs no locks. The state
is keyed by path and remembers the inode, so that a rotation by rename (the SDK's) continues at
the same offset under the new name instead of reading the segment twice.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from grpo_monitor.health import ExporterHealth
from grpo_monitor.rebaseline import CONTROL_NAME, RebaselineRequest
from grpo_monitor.snapshot import RecordError, identity_from_path, parse_record
from grpo_monitor.store import RunStore

log = logging.getLogger("grpo_monitor.ingest")

SUFFIXES = (".jsonl", ".json")
READ_CHUNK = 4 << 20
TAIL_CHECK = 64


@dataclass
class FileState:
    inode: int
    offset: int = 0  # *.jsonl: bytes consumed, up to the last newline
    partial: bytes = b""  # *.jsonl: a line still waiting for its newline
    tail: bytes = b""  # *.jsonl: the last bytes before offset, to notice a rewrite in place
    skipping: bool = False  # *.jsonl: inside an oversized line, dropping bytes until a newline
    signature: tuple[int, int] = (0, 0)  # *.json: (size, mtime_ns) last looked at
    digest: bytes = b""  # *.json: hash of the content last ingested


def is_snapshot_path(path: Path, root: Path) -> bool:
    """Dotfiles, dot-folders and *.tmp are a writer's scratch space, never snapshots."""
    if path.suffix not in SUFFIXES:
        return False
    try:
        rel = path.relative_to(root)
    except ValueError:
        return False
    return not any(part.startswith(".") for part in rel.parts)


class Ingestor:
    def __init__(
        self,
        root: Path,
        store: RunStore,
        health: ExporterHealth,
        *,
        max_file_bytes: int = 16 << 20,
        max_line_bytes: int = 1 << 20,
    ) -> None:
        self.root = root
        self.store = store
        self.health = health
        self.max_file_bytes = max_file_bytes
        self.max_line_bytes = max_line_bytes
        self.files: dict[Path, FileState] = {}
        self._inodes: dict[int, Path] = {}  # inode -> path in self.files, to find renames
        self._logged: set[tuple[Path, str]] = set()
        # path -> lstat signature when a rescan last looked, so that a rescan re-reads (and
        # re-counts the errors of) only what changed since.
        self._seen: dict[Path, tuple[int, ...]] = {}
        self._controls: dict[Path, bytes] = {}  # control file -> content last applied

    # -- bookkeeping -------------------------------------------------------------------------

    def error(self, path: Path, reason: str, detail: str) -> None:
        """Count an error; log it once per (file, reason)."""
        self.health.errors.labels(reason).inc()
        if (path, reason) not in self._logged:
            self._logged.add((path, reason))
            log.warning("%s: %s (%s); further %s errors for this file are only counted",
                        path, reason, detail, reason)

    def _track(self, path: Path, state: FileState) -> None:
        self.files[path] = state
        self._inodes[state.inode] = path
        self.health.files.set(len(self.files))

    def _untrack(self, path: Path) -> FileState | None:
        state = self.files.pop(path, None)
        if state is not None and self._inodes.get(state.inode) == path:
            del self._inodes[state.inode]
        self.health.files.set(len(self.files))
        return state

    def forget(self, path: Path) -> None:
        """A file or folder was deleted: drop its state (its runs stay until they expire)."""
        for p in [p for p in self.files if p == path or path in p.parents]:
            self._untrack(p)

    def moved(self, src: Path, dest: Path) -> None:
        """A rename: keep reading where we were, under the new name."""
        state = self._untrack(src)
        if state is not None and is_snapshot_path(dest, self.root):
            self._track(dest, state)
        self.process(dest)

    def scan(self) -> list[Path]:
        """Every snapshot file under the root, oldest first, so a replay ends on the newest."""
        found: list[tuple[float, str, Path]] = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in filenames:
                path = Path(dirpath, name)
                if not (is_snapshot_path(path, self.root) or name == CONTROL_NAME):
                    continue
                try:
                    mtime = path.stat().st_mtime
                except OSError:
                    mtime = 0.0  # process() will count why
                found.append((mtime, str(path), path))
        found.sort()
        return [p for _, _, p in found]

    def rescan(self) -> None:
        """Process every file whose metadata changed since the last rescan: the safety net for
        events a watcher missed, and the start-up replay."""
        current: dict[Path, tuple[int, ...]] = {}
        for path in self.scan():
            try:
                st = path.lstat()
                sig = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
            except OSError:
                sig = ()
            current[path] = sig
            if self._seen.get(path) != sig:
                self.process(path)
        for gone in self._seen.keys() - current.keys():
            self.forget(gone)
        self._seen = current

    # -- reading -----------------------------------------------------------------------------

    def process(self, path: Path) -> None:
        """Read whatever is new in ``path``; safe to call for any path, any number of times."""
        if path.name == CONTROL_NAME:
            self._control(path)
            return
        if not is_snapshot_path(path, self.root):
            return
        try:
            st = path.stat()
        except FileNotFoundError:
            if not path.is_symlink():
                self.forget(path)
                return
            self.error(path, "read_error", "dangling symlink")
            return
        except OSError as exc:
            self.error(path, "read_error", os.strerror(exc.errno or errno.EIO))
            return
        if not os.path.isfile(path):
            return
        state = self.files.get(path)
        if state is None or state.inode != st.st_ino:
            self._untrack(path)
            state = self._adopt(st.st_ino) or FileState(inode=st.st_ino)
            self._track(path, state)
        try:
            if path.suffix == ".jsonl":
                self._tail(path, state, st)
            else:
                self._reread(path, state, st)
        except OSError as exc:
            self.error(path, "read_error", os.strerror(exc.errno or errno.EIO))

    def _control(self, path: Path) -> None:
        """A run's re-baseline request (grpo-monitor rebaseline)."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self._controls.pop(path, None)
            return
        except OSError as exc:
            self.error(path, "read_error", os.strerror(exc.errno or errno.EIO))
            return
        if self._controls.get(path) == data:
            return
        try:
            req = RebaselineRequest.model_validate_json(data)
        except ValueError as exc:
            self.error(path, "invalid_control", str(exc).splitlines()[0])
            return
        self._controls[path] = data
        run, _ = identity_from_path(path, self.root)
        log.info("run %s: re-baseline on the %d steps up to step %d", run, req.steps, req.at_step)
        self.store.rebaseline(run, req.at_step, req.steps)

    def _adopt(self, inode: int) -> FileState | None:
        """The state of a file we know under another name (a rename we did not see)."""
        other = self._inodes.get(inode)
        if other is None or other.exists():
            return None
        return self._untrack(other)

    def _tail(self, path: Path, state: FileState, st: os.stat_result) -> None:
        with open(path, "rb") as fh:
            if st.st_size < state.offset or not self._same_prefix(fh, state):
                # Truncated or rewritten in place (size alone cannot tell a rewrite to the same
                # length): start again from the top.
                state.offset, state.partial, state.skipping, state.tail = 0, b"", False, b""
            fh.seek(state.offset)
            while chunk := fh.read(READ_CHUNK):
                state.offset += len(chunk)
                state.tail = (state.tail + chunk)[-TAIL_CHECK:]
                self._lines(path, state, chunk, st.st_mtime)

    @staticmethod
    def _same_prefix(fh, state: FileState) -> bool:  # type: ignore[no-untyped-def]
        if not state.tail:
            return True
        fh.seek(state.offset - len(state.tail))
        return fh.read(len(state.tail)) == state.tail

    def _lines(self, path: Path, state: FileState, chunk: bytes, mtime: float) -> None:
        data = state.partial + chunk
        lines = data.split(b"\n")
        state.partial = lines.pop()
        for line in lines:
            if state.skipping:  # the tail of an oversized line
                state.skipping = False
                continue
            if len(line) > self.max_line_bytes:
                self.error(path, "oversized", f"line of {len(line)} bytes > {self.max_line_bytes}")
                continue
            if line.strip():
                self._record(path, line, mtime)
        if len(state.partial) > self.max_line_bytes:
            self.error(path, "oversized", f"line over {self.max_line_bytes} bytes")
            state.partial, state.skipping = b"", True

    def _reread(self, path: Path, state: FileState, st: os.stat_result) -> None:
        signature = (st.st_size, st.st_mtime_ns)
        if signature == state.signature:
            return
        state.signature = signature
        if st.st_size > self.max_file_bytes:
            self.error(path, "oversized", f"{st.st_size} bytes > {self.max_file_bytes}")
            return
        with open(path, "rb") as fh:
            data = fh.read(self.max_file_bytes + 1)
        digest = hashlib.blake2b(data, digest_size=16).digest()
        if digest == state.digest:  # a touch or a rewrite with the same content
            return
        if self._record(path, data, st.st_mtime):
            state.digest = digest

    def _record(self, path: Path, raw: bytes, mtime: float) -> bool:
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            # A *.json file that stops mid-document is most likely still being written; it is
            # read again on its next change.
            reason = "incomplete" if exc.pos >= len(exc.doc.rstrip()) else "invalid_json"
            self.error(path, reason, f"{exc.msg} at byte {exc.pos}")
            return False
        except ValueError as exc:  # not UTF-8
            self.error(path, "invalid_json", str(exc)[:80])
            return False
        run, rank = identity_from_path(path, self.root)
        try:
            snap = parse_record(obj, run=run, rank=rank, mtime=mtime)
        except RecordError as exc:
            self.error(path, exc.reason, str(exc))
            return False
        for reason, detail in snap.problems:
            self.error(path, reason, detail)
        self.store.apply(snap, wrote_at=mtime)
        self.health.ingested.labels(snap.shape).inc()
        return True

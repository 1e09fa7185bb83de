"""The exporter's derived state, saved beside it (``--storage.path``): a restart reads only what
the trainers wrote since, instead of every record ever written, and so does the next release.

What is saved is what the start-up replay would rebuild from the files: every run's store state
(each rank's step histories, baselines, initial values, counters) and the ingest's place in each
file (inode, offset), a logger's file's too (runtime/loggers/sources.py: its offset or database
rows, a TensorBoard step held back). Restored, the start-up rescan reads each file from where the saved state
left it, so the exporter serves the series it served before the restart (the exporter's own
``grpo_exporter_*`` counters start again from zero, as any process's counters do), and a
restart takes the same time at step 2,000 or 20,000 (the histories stop growing at about step
1,200).

The file (docs/state-format.md): a magic line, a JSON header line (the layout's ``format``, the
objects' ``schema``, the snapshot folder, the settings, the payload's size), the payload's SHA-256,
then the payload: MessagePack documents (state_codec.py), the ingest's first, then each run
followed by its ranks.
A release reads the states of every schema it has a migration from, so an upgrade restarts as
fast as a restart. A save encodes again only the ranks changed since the last one
(a rank's encoding is kept until it changes), on the ingest thread, without the store's lock:
a scrape never waits for it.

Loaded only when it is what this exporter wrote: a regular file owned by its user and writable by
no one else, of a format and schema this code reads, for this snapshot folder and these settings,
with its checksum right. A load is bounded before the file is believed: the magic and the header
are read with capped reads, a state set aside by its header is not read further, and the payload
is read only when the header's size is the file's and under MAX_PAYLOAD_BYTES, into one buffer of
that size while its checksum is computed; so a file whose head is not a state's, or whose size
is not its header's, costs a few KiB whatever its size. It is decoded whole into new objects
before any is used, so a state that fails half-way is not half-applied. Anything else is counted
(``grpo_exporter_state_restores_total{result}``) and the start-up reads every file, as without a
saved state.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from grpo_monitor import __version__
from grpo_monitor.contract.safe_io import Refused, open_regular, printable, replace_file
from grpo_monitor.runtime import state_codec
from grpo_monitor.runtime.ingest import FileState
from grpo_monitor.runtime.loggers.sources import LoggedFile
from grpo_monitor.runtime.store import RankState, RunState

if TYPE_CHECKING:
    from grpo_monitor.runtime.ingest import Ingestor
    from grpo_monitor.runtime.store import RunStore

log = logging.getLogger(__name__)

FILE_NAME = "exporter-state.msgpack"
# The states of releases before the versioned format: a pickle of their classes, which no other
# code can read. Set aside (removed) at the first start of this release, which reads every file.
LEGACY_FILE_NAMES = ("exporter-state.pickle",)
# The file's layout (the lines before the payload, the payload's documents in order); the
# objects inside have their own schema (state_codec.SCHEMA).
# A header may lack "payload_bytes" (a key added, not a new layout): the states of the releases
# before it are restored, as an upgrade must restore them, their cost bounded by
# MAX_PAYLOAD_BYTES alone.
FORMAT = 2
MAGIC = b"grpo-monitor exporter state\n"
# Far above any header written (the settings are a few flags): a longer line is no header.
MAX_HEADER_BYTES = 64 * 1024
DIGEST_LINE_BYTES = len(hashlib.sha256().hexdigest()) + 1
# No flag bounds a state (the ranks of a run are the trainer's), so a constant: a rank's state
# stops growing at about 90 KiB (88.9 MiB at 1,024 ranks x 20,000 steps, docs/benchmarks.md), so
# 1 GiB is some 11,000 ranks, nearly three times the 4,096 of the largest job measured on one
# exporter, and its restore would take 3 to 4.5 GiB. A state above it is refused (logged), which
# costs a full read; the limit is all that bounds a header without "payload_bytes".
MAX_PAYLOAD_BYTES = 1 << 30
READ_CHUNK_BYTES = 1 << 20  # the payload is hashed as it is read, a chunk at a time
RESTORE_RESULTS: dict[str, str] = {
    "restored": "the saved state was loaded; only what was written since is read",
    "missing": "no saved state (the first start, or --storage.path is new)",
    "stale": "not for this exporter: a newer release's (a format or schema this one does not "
             "read), a release's before the versioned format, another snapshot folder's, or saved "
             "under other settings (--signals.baseline-steps, --metrics.max-runs, a key map...)",
    "corrupt": "unreadable: cut short, a wrong checksum, or not a state file",
    "refused": "not a regular file owned by this user and writable by no one else",
}


@dataclass
class Saved:
    """What a restore hands back: the store's runs and the ingest's file states."""

    runs: dict[str, RunState]
    files: dict[Path, FileState]
    controls: dict[Path, bytes]
    loggers: dict[Path, LoggedFile] = field(default_factory=dict)  # loggers' files (loggers/)


class StateFile:
    """The saved state of one exporter in ``directory`` (made 0700 if missing)."""

    def __init__(self, directory: Path, snapshot_root: Path,
                 settings: dict[str, Any] | None = None) -> None:
        """``settings``: what shaped the state besides the code (the limits, the baseline's
        length, the key map): a state saved under others is set aside, as a stale one is, so a
        changed flag applies to every run."""
        self.directory = directory
        self.path = directory / FILE_NAME
        self.root = str(snapshot_root)
        self.settings = json.loads(json.dumps(settings or {}, sort_keys=True, default=str))
        # (run, rank) -> (the rank, its encoding as last saved): reused while it is unchanged.
        self._encoded: dict[tuple[str, int], tuple[RankState, bytes]] = {}
        self.encoded_last = 0  # ranks encoded by the last save (the others' encoding was kept)

    def save(self, store: RunStore, ingestor: Ingestor) -> int:
        """Write the state of ``store`` and ``ingestor``; the bytes written. Called on the ingest
        thread, the only one that changes either: nothing moves while it encodes, and it takes
        no lock, so a scrape meanwhile is served at once. Encodes again only the ranks changed
        since the last save (their series re-rendered since, or waiting to be)."""
        changed = store.take_unsaved()
        try:
            return self._write(store, ingestor, changed)
        except BaseException:
            store.untake_unsaved(changed)  # saved next time
            raise

    def _write(self, store: RunStore, ingestor: Ingestor, changed: set[tuple[str, int]]) -> int:
        pack = state_codec.pack
        parts = [pack({"files": ingestor.saved_files(), "controls": ingestor.saved_controls(),
                       "loggers": ingestor.loggers.saved()})]
        encoded: dict[tuple[str, int], tuple[RankState, bytes]] = {}
        digest = hashlib.sha256(parts[0])
        # A run read in part at a first start (backfill.py) is left out with its files: a
        # restart reads it again, rather than keep its partial counters as if whole.
        partial = ingestor.partial_runs()
        runs = {name: run for name, run in store.saved_runs().items() if name not in partial}
        for name, run in runs.items():
            parts.append(pack([run, len(run.ranks)]))
            digest.update(parts[-1])
            for rank_id, rank in run.ranks.items():
                key = (name, rank_id)
                kept = self._encoded.get(key)
                if kept is None or kept[0] is not rank or key in changed:
                    kept = (rank, pack(rank))
                encoded[key] = kept
                parts.append(kept[1])
                digest.update(kept[1])
        payload_bytes = sum(map(len, parts))
        header = json.dumps({"format": FORMAT, "schema": state_codec.SCHEMA, "version": __version__,
                             "root": self.root, "settings": self.settings, "runs": len(runs),
                             "ranks": len(encoded), "saved_at": time.time(),
                             "payload_bytes": payload_bytes}).encode()
        head = b"".join((MAGIC, header, b"\n", digest.hexdigest().encode(), b"\n"))
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        replace_file(self.directory, self.path, [head, *parts], mode=0o600)  # never joined: 170 MiB at 4,096 ranks
        self.encoded_last = sum(1 for key, kept in encoded.items() if self._encoded.get(key) is not kept)
        self._encoded = encoded
        return len(head) + payload_bytes

    def remove_leftovers(self) -> int:
        """Remove the temporary files of saves that a crash cut short (safe_io.replace_file's
        ``.exporter-state.msgpack.<random>.tmp``, this user's regular files only), and the states
        of releases before the versioned format; how many. Called at start-up, before any save of
        this exporter."""
        prefixes = tuple(f".{name}." for name in (FILE_NAME, *LEGACY_FILE_NAMES))
        removed = 0
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return 0
        for entry in entries:
            if not ((entry.name.startswith(prefixes) and entry.name.endswith(".tmp"))
                    or entry.name in LEGACY_FILE_NAMES):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                    os.unlink(entry.path)
                    removed += 1
            except OSError:
                continue
        if removed:
            log.info("%s: removed %d temporary file(s) of saves cut short, or states of an earlier "
                     "release's format", printable(self.directory), removed)
        return removed

    def load(self) -> tuple[str, Saved | None]:
        """(result, state): one of RESTORE_RESULTS, and the state when it is "restored"."""
        legacy = any((self.directory / name).is_file() for name in LEGACY_FILE_NAMES)
        self.remove_leftovers()
        try:
            with open_regular(self.directory, self.path) as fh:  # no link, nothing but a file
                st = os.fstat(fh.fileno())
                own = st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
                if own:
                    return self._load_own(fh, st.st_size)
        except FileNotFoundError:
            if legacy:
                log.info("%s: a state saved before the versioned state format, which this release "
                         "cannot read; reading every snapshot file once", printable(self.directory))
                return "stale", None
            return "missing", None
        except Refused:
            pass  # a link, or no regular file: refused below, as a file of another user is
        except NotAState as exc:
            log.warning("%s: not a whole state file (%s); reading every snapshot file",
                        printable(self.path), exc)
            return "corrupt", None
        except OSError as exc:
            log.warning("%s: %s; reading every snapshot file", printable(self.path), exc.strerror)
            return "corrupt", None
        log.warning("%s: not a regular file of this user writable by no one else; not loaded, "
                    "reading every snapshot file", printable(self.path))
        return "refused", None

    def _load_own(self, fh: BinaryIO, file_bytes: int) -> tuple[str, Saved | None]:
        """Load the state open in ``fh`` (``file_bytes`` long, by its fstat), each part read only
        once what comes before it holds: NotAState for a file that is no whole state."""
        meta = read_header(fh)
        layout = (meta["format"], meta["root"], meta.get("settings", {}))
        if layout != (FORMAT, self.root, self.settings):
            # Before the digest line: a newer format's lines after the header are not ours to read.
            log.info("%s: saved by version %s (format %s) for %s under %s; reading every snapshot file",
                     printable(self.path), meta.get("version"), meta["format"],
                     printable(str(meta["root"])), "these settings" if layout[2] == self.settings
                     else f"other settings ({layout[2]})")
            return "stale", None
        try:
            decoder = state_codec.Decoder(meta["schema"])  # a newer schema's payload is not read
        except state_codec.UnusableState as exc:
            return self._set_aside(meta, exc)
        payload = read_payload(fh, meta, file_bytes)
        collecting = gc.isenabled()
        gc.disable()  # a million objects made in a row: each collection would walk them all again
        try:
            saved = self._decode(decoder, payload)
        except state_codec.UnusableState as exc:  # a class or a value a newer release wrote
            return self._set_aside(meta, exc)
        except Exception as exc:  # the checksum held, so this is a bug, not the disk: say which
            log.warning("%s: cannot be loaded (%s: %s); reading every snapshot file", printable(self.path),
                        type(exc).__name__, exc)
            return "corrupt", None
        finally:
            if collecting:
                gc.enable()
        log.info("%s: state of %d runs saved %.0f s ago by version %s restored; reading what was "
                 "written since", printable(self.path), len(saved.runs), time.time() - meta["saved_at"],
                 meta.get("version"))
        return "restored", saved

    def _set_aside(self, meta: dict[str, Any], why: state_codec.UnusableState) -> tuple[str, None]:
        log.info("%s: saved by version %s: %s; reading every snapshot file", printable(self.path),
                 meta.get("version"), why)
        return "stale", None

    @staticmethod
    def _decode(decoder: state_codec.Decoder, payload: bytes | memoryview) -> Saved:
        """The whole payload, as new objects (none is used before all are decoded)."""
        documents = decoder.stream(payload)
        ingest = next(documents)
        files, controls = ingest["files"], ingest["controls"]
        if not all(isinstance(p, Path) and isinstance(f, FileState) for p, f in files.items()):
            raise ValueError("the ingest's files are not file states")
        loggers = ingest.get("loggers", {})  # a state saved before loggers' files were read: none
        if not all(isinstance(p, Path) and isinstance(f, LoggedFile) for p, f in loggers.items()):
            raise ValueError("the loggers' files are not logger file states")
        runs: dict[str, RunState] = {}
        for run, count in documents:
            if not isinstance(run, RunState):
                raise ValueError(f"a {type(run).__name__} where a run should be")
            ranks = [next(documents) for _ in range(count)]
            if not all(isinstance(r, RankState) and r.run == run.name for r in ranks):
                raise ValueError(f"run {run.name!r}: its ranks are not rank states of it")
            run.ranks = {r.rank: r for r in ranks}
            runs[run.name] = run
        return Saved(runs, files, dict(controls), dict(loggers))


class NotAState(Exception):
    """The file is no whole state file; the message says what gave it away."""


def read_header(fh: BinaryIO) -> dict[str, Any]:
    """The header of the state open in ``fh`` at its start, which is left after the header line;
    NotAState for a wrong magic line or a header line that is too long, cut short or not one.
    Reads at most len(MAGIC) + MAX_HEADER_BYTES + 1 bytes, whatever the file's size."""
    if fh.read(len(MAGIC)) != MAGIC:
        raise NotAState("no magic line")
    line = fh.readline(MAX_HEADER_BYTES + 1)
    if not line.endswith(b"\n"):
        raise NotAState(f"no header line of at most {MAX_HEADER_BYTES} bytes")
    try:
        meta = json.loads(line)
        meta["schema"] = int(meta["schema"])
    except (ValueError, TypeError, KeyError, OverflowError) as exc:  # OverflowError: a schema of 1e400
        raise NotAState(f"a header that is not one ({type(exc).__name__}: {exc})") from None
    declared = meta.get("payload_bytes", 0)
    if not ({"format", "root", "saved_at"} <= meta.keys() and isinstance(meta["saved_at"], (int, float))
            and type(declared) is int and declared >= 0):
        raise NotAState("a header without its keys")
    return meta


def read_payload(fh: BinaryIO, meta: dict[str, Any], file_bytes: int) -> memoryview:
    """The payload of the state open in ``fh`` just after its header line, its checksum checked;
    NotAState for a digest line that is not one, a payload that is not the header's size, over
    MAX_PAYLOAD_BYTES, cut short while read or of another checksum. Nothing of the payload is
    read before its size is known good, and it is read once, into one buffer of that size."""
    digest_line = fh.read(DIGEST_LINE_BYTES)
    if not digest_line.endswith(b"\n"):
        raise NotAState("no digest line")
    size = file_bytes - fh.tell()
    # A state saved before "payload_bytes" says nothing: the rest of the file is its payload.
    declared = meta.get("payload_bytes", size)
    if size != declared:
        raise NotAState(f"a payload of {size} bytes where the header says {declared}")
    if size > MAX_PAYLOAD_BYTES:
        raise NotAState(f"a payload of {size} bytes, above the limit of {MAX_PAYLOAD_BYTES} (MAX_PAYLOAD_BYTES)")
    payload = memoryview(bytearray(size))
    digest = hashlib.sha256()
    done = 0
    while done < size:
        got = fh.readinto(payload[done:done + READ_CHUNK_BYTES])
        if not got:
            raise NotAState(f"cut short while read, at {done} of {size} payload bytes")
        digest.update(payload[done:done + got])
        done += got
    if digest.hexdigest().encode() != digest_line[:-1]:
        raise NotAState("a wrong checksum")
    return payload

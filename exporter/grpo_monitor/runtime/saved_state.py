"""The exporter's derived state, saved beside it (``--storage.path``): a restart reads only what
the trainers wrote since, instead of every record ever written, and so does the next release.

What is saved is what the start-up replay would rebuild from the files: every run's store state
(each rank's step histories, baselines, initial values, counters) and the ingest's place in each
file (inode, offset). Restored, the start-up rescan reads each file from where the saved state
left it, so the exporter serves the series it served before the restart (the exporter's own
``grpo_exporter_*`` counters start again from zero, as any process's counters do), and a
restart takes the same time at step 2,000 or 20,000 (the histories stop growing at about step
1,200).

The file (docs/state-format.md): a magic line, a JSON header line (the layout's ``format``, the
objects' ``schema``, the snapshot folder, the settings), the payload's SHA-256, then the payload:
MessagePack documents (state_codec.py), the ingest's first, then each run followed by its ranks.
A release reads the states of every schema it has a migration from, so an upgrade restarts as
fast as a restart. A save encodes again only the ranks changed since the last one
(a rank's encoding is kept until it changes), on the ingest thread, without the store's lock:
a scrape never waits for it.

Loaded only when it is what this exporter wrote: a regular file owned by its user and writable by
no one else, of a format and schema this code reads, for this snapshot folder and these settings,
with its checksum right. It is decoded whole into new objects before any is used, so a state
that fails half-way is not half-applied. Anything else is counted
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_monitor import __version__
from grpo_monitor.contract.safe_io import Refused, open_regular, printable, replace_file
from grpo_monitor.runtime import state_codec
from grpo_monitor.runtime.ingest import FileState
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
FORMAT = 2
MAGIC = b"grpo-monitor exporter state\n"
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
        parts = [pack({"files": ingestor.saved_files(), "controls": ingestor.saved_controls()})]
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
        header = json.dumps({"format": FORMAT, "schema": state_codec.SCHEMA, "version": __version__,
                             "root": self.root, "settings": self.settings, "runs": len(runs),
                             "ranks": len(encoded), "saved_at": time.time()}).encode()
        head = b"".join((MAGIC, header, b"\n", digest.hexdigest().encode(), b"\n"))
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        replace_file(self.directory, self.path, [head, *parts], mode=0o600)  # never joined: 170 MiB at 4,096 ranks
        self.encoded_last = sum(1 for key, kept in encoded.items() if self._encoded.get(key) is not kept)
        self._encoded = encoded
        return len(head) + sum(map(len, parts))

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
                data = fh.read() if own else b""
        except FileNotFoundError:
            if legacy:
                log.info("%s: a state saved before the versioned state format, which this release "
                         "cannot read; reading every snapshot file once", printable(self.directory))
                return "stale", None
            return "missing", None
        except Refused:
            own = False
        except OSError as exc:
            log.warning("%s: %s; reading every snapshot file", printable(self.path), exc.strerror)
            return "corrupt", None
        if not own:
            log.warning("%s: not a regular file of this user writable by no one else; not loaded, "
                        "reading every snapshot file", printable(self.path))
            return "refused", None
        # Offsets, not partition(): each partition would copy the rest (100 MiB at 1,024 ranks).
        ends = [data.find(b"\n")]
        for _ in range(2):
            ends.append(data.find(b"\n", ends[-1] + 1) if ends[-1] >= 0 else -1)
        if ends[-1] < 0:
            ends = [len(data)] * 3
        magic, header = data[:ends[0]], data[ends[0] + 1:ends[1]]
        digest, payload = data[ends[1] + 1:ends[2]], memoryview(data)[ends[2] + 1:]
        try:
            meta = json.loads(header)
            schema = int(meta["schema"])
            layout = (meta["format"], meta["root"], meta.get("settings", {}))
        except (ValueError, TypeError, KeyError):
            layout = None
        if magic + b"\n" != MAGIC or layout is None or hashlib.sha256(payload).hexdigest().encode() != digest:
            log.warning("%s: not a whole state file; reading every snapshot file", printable(self.path))
            return "corrupt", None
        if layout != (FORMAT, self.root, self.settings):
            log.info("%s: saved by version %s (format %s) for %s under %s; reading every snapshot file",
                     printable(self.path), meta.get("version"), meta["format"],
                     printable(str(meta["root"])), "these settings" if layout[2] == self.settings
                     else f"other settings ({layout[2]})")
            return "stale", None
        collecting = gc.isenabled()
        gc.disable()  # a million objects made in a row: each collection would walk them all again
        try:
            saved = self._decode(state_codec.Decoder(schema), payload)
        except state_codec.UnusableState as exc:  # a newer release's
            log.info("%s: saved by version %s: %s; reading every snapshot file", printable(self.path),
                     meta.get("version"), exc)
            return "stale", None
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

    @staticmethod
    def _decode(decoder: state_codec.Decoder, payload: bytes | memoryview) -> Saved:
        """The whole payload, as new objects (none is used before all are decoded)."""
        documents = decoder.stream(payload)
        ingest = next(documents)
        files, controls = ingest["files"], ingest["controls"]
        if not all(isinstance(p, Path) and isinstance(f, FileState) for p, f in files.items()):
            raise ValueError("the ingest's files are not file states")
        runs: dict[str, RunState] = {}
        for run, count in documents:
            if not isinstance(run, RunState):
                raise ValueError(f"a {type(run).__name__} where a run should be")
            ranks = [next(documents) for _ in range(count)]
            if not all(isinstance(r, RankState) and r.run == run.name for r in ranks):
                raise ValueError(f"run {run.name!r}: its ranks are not rank states of it")
            run.ranks = {r.rank: r for r in ranks}
            runs[run.name] = run
        return Saved(runs, files, dict(controls))

"""The exporter's derived state, saved beside it (``--storage.path``): a restart reads only what
the trainers wrote since, instead of every record ever written.

What is saved is what the start-up replay would rebuild from the files: every run's store state
(each rank's step histories, baselines, initial values, counters and pre-rendered series) and
the ingest's place in each file (inode, offset). Restored, the start-up rescan reads each file
from where the saved state left it, so the exporter serves the series it served before the
restart (the exporter's own ``grpo_exporter_*`` counters start again from zero, as any
process's counters do), and a restart takes the same time at step 400 or 20,000.

The trade-off, against reading only each file's first steps and last window: that would
rebuild the windows and the baseline, but not the counters (events, records, non-finite
values) nor the run-level ranges, which depend on every record. A saved state gives them all
back exactly, and costs a write of the state per --storage.save-interval: 22 MiB at 1,024
ranks, whatever the runs' length (docs/scaling.md).

Saved by the ingest thread between two batches of events (so the files' offsets and the store
agree), under the store's lock for the pickling only; written by safe_io.replace_file (a
temporary file, flushed, renamed), so a crash leaves the previous state or the new one. Loaded only when it is what this
exporter wrote: a regular file owned by its user and writable by no one else (a pickle runs
code when loaded, so a state file another user could write would be their code), with the
format, version and snapshot folder of this exporter, and its checksum right. Anything else
is counted (``grpo_exporter_state_restores_total{result}``) and the start-up reads every
file, as without a saved state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_monitor import __version__
from grpo_monitor.contract.safe_io import Refused, open_regular, printable, replace_file

if TYPE_CHECKING:
    from grpo_monitor.runtime.ingest import Ingestor
    from grpo_monitor.runtime.store import RunStore

log = logging.getLogger(__name__)

FILE_NAME = "exporter-state.pickle"
FORMAT = 1
# The modules whose classes a state pickles. A state saved by other code than theirs is stale
# (a class may have gained a field its pickle lacks) and the files are read again: the package
# version alone is not bumped by every change.
PICKLED_MODULES = ("store", "signals", "forecast", "ingest")


def code_fingerprint() -> str:
    """A hash of the source of PICKLED_MODULES, as installed."""
    digest = hashlib.sha256()
    for name in PICKLED_MODULES:
        digest.update((Path(__file__).parent / f"{name}.py").read_bytes())
    return digest.hexdigest()[:16]
MAGIC = b"grpo-monitor exporter state\n"
RESTORE_RESULTS: dict[str, str] = {
    "restored": "the saved state was loaded; only what was written since is read",
    "missing": "no saved state (the first start, or --storage.path is new)",
    "stale": "saved by other code (another version, or a change to the classes it holds), for "
             "another snapshot folder, or under other settings (--signals.baseline-steps, "
             "--metrics.max-runs, a key map...)",
    "corrupt": "unreadable: cut short, a wrong checksum, or not a state file",
    "refused": "not a regular file owned by this user and writable by no one else",
}


@dataclass
class Saved:
    """What a restore hands back: the store's runs and the ingest's file states."""

    runs: dict[str, Any]
    dirty: set[tuple[str, int]]  # ranks changed since their series were last rendered
    files: dict[Path, Any]
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
        self.code = code_fingerprint()
        self.settings = json.loads(json.dumps(settings or {}, sort_keys=True, default=str))

    def save(self, store: RunStore, ingestor: Ingestor) -> int:
        """Write the state of ``store`` (a RunStore) and ``ingestor`` (an Ingestor); the bytes
        written. Called on the ingest thread, the only one that changes either: nothing moves
        while it pickles, and it takes no lock, so a scrape meanwhile is served at once."""
        runs, dirty = store.saved_runs()
        payload = pickle.dumps({"runs": runs, "dirty": dirty, "files": ingestor.files,
                                "controls": ingestor.saved_controls()},
                               protocol=pickle.HIGHEST_PROTOCOL)
        header = json.dumps({"format": FORMAT, "version": __version__, "code": self.code,
                             "root": self.root, "settings": self.settings,
                             "saved_at": time.time()}).encode()
        data = MAGIC + header + b"\n" + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        replace_file(self.directory, self.path, data, mode=0o600)
        return len(data)

    def remove_leftovers(self) -> int:
        """Remove the temporary files of saves that a crash cut short (safe_io.replace_file's
        ``.exporter-state.pickle.<random>.tmp``, this user's regular files only); how many. Called
        at start-up, before any save of this exporter."""
        prefix = f".{FILE_NAME}."
        removed = 0
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return 0
        for entry in entries:
            if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                    os.unlink(entry.path)
                    removed += 1
            except OSError:
                continue
        if removed:
            log.info("%s: removed %d temporary file(s) of saves cut short", printable(self.directory),
                     removed)
        return removed

    def load(self) -> tuple[str, Saved | None]:
        """(result, state): one of RESTORE_RESULTS, and the state when it is "restored"."""
        self.remove_leftovers()
        try:
            with open_regular(self.directory, self.path) as fh:  # no link, nothing but a file
                st = os.fstat(fh.fileno())
                own = st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
                data = fh.read() if own else b""
        except FileNotFoundError:
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
        magic, _, rest = data.partition(b"\n")
        header, _, rest = rest.partition(b"\n")
        digest, _, payload = rest.partition(b"\n")
        try:
            meta = json.loads(header)
            stale = ((meta["format"], meta["version"], meta["code"], meta["root"],
                      meta.get("settings", {}))
                     != (FORMAT, __version__, self.code, self.root, self.settings))
        except (ValueError, TypeError, KeyError):
            stale = None
        if magic + b"\n" != MAGIC or stale is None or hashlib.sha256(payload).hexdigest().encode() != digest:
            log.warning("%s: not a whole state file; reading every snapshot file", printable(self.path))
            return "corrupt", None
        if stale:
            # Checked before unpickling: another version's classes may have another shape.
            log.info("%s: saved by version %s for %s under %s; reading every snapshot file",
                     printable(self.path), meta["version"], printable(str(meta["root"])),
                     "these settings" if meta.get("settings", {}) == self.settings else
                     f"other settings ({meta.get('settings')})")
            return "stale", None
        try:
            state = pickle.loads(payload)
            saved = Saved(state["runs"], state["dirty"], state["files"], state["controls"])
        except Exception as exc:  # the checksum held, so this is a bug, not the disk: say which
            log.warning("%s: cannot be loaded (%s: %s); reading every snapshot file", printable(self.path),
                        type(exc).__name__, exc)
            return "corrupt", None
        log.info("%s: state of %d runs saved %.0f s ago restored; reading what was written since",
                 printable(self.path), len(saved.runs), time.time() - meta["saved_at"])
        return "restored", saved

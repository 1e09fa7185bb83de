"""The exporter's own health series, on a private prometheus-client registry."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from grpo_monitor import __version__
from grpo_monitor.contract.safe_io import NOT_REGULAR, SYMLINK, printable
from grpo_monitor.runtime.exposition import NEEDS_HEAD, WHOLE_HISTORY
from grpo_monitor.runtime.saved_state import RESTORE_RESULTS

log = logging.getLogger("grpo_monitor.runtime.ingest")
# Paths named in the log at most once per reason: beyond this many, only counted (a folder
# holding a million bad names must not grow the exporter without bound).
MAX_LOGGED_PATHS = 10_000

# Why input could not be used (the `reason` label), what happened, and what is kept of it.
# Every reason is pre-declared at 0 so that `increase(grpo_snapshot_errors_total[5m])` works
# from the first error on.
ERROR_REASONS: dict[str, tuple[str, str]] = {
    "read_error": ("open/stat/read failed: permissions, a symlink loop, an I/O error",
                   "nothing; read again when the file changes"),
    "oversized": ("a `*.json` file over `--snapshot.max-file-bytes`, or a `*.jsonl` line over "
                  "`--snapshot.max-line-bytes`", "the other lines"),
    "invalid_json": ("not JSON (nested deeper than the parser's recursion limit included), or not "
                     "UTF-8", "the other lines"),
    "incomplete": ("a `*.json` file that ends mid-document (most likely still being written)",
                   "nothing yet; read again on its next change"),
    "invalid_record": ("JSON, but not a usable record: not an object, no integer `step` from 0 to "
                       "2^53, a wrong type in the envelope", "the other lines"),
    "invalid_value": ("one metric value that is not a number (a list, a word)", "the rest of the record"),
    "invalid_key": ("an empty or over-long (> 200 characters) metric key, or one that is no Unicode "
                    "text (a lone surrogate escape, `\\ud800`)", "the rest of the record"),
    "invalid_samples": ("a malformed `samples` list", "the record's metrics"),
    "invalid_events": ("a malformed `events` list, or a rollback mark whose `to_step` is no step "
                       "at or before its `from_step` (that mark undoes nothing)",
                       "the record's metrics (and its other events)"),
    "invalid_time": ("a record's `time` (or `_timestamp`, `timestamp`) that is no finite number",
                     "the record, timed by its file's modification time"),
    "invalid_by_type": ("a malformed `by_type` map", "the record's metrics"),
    "invalid_control": ("a malformed `.grpo-baseline.json` re-baseline request", "the current baseline"),
    "invalid_key_map": ("a run folder's `.grpo-keys.toml` that is no key map (bad TOML, a name "
                        "mapped to no canonical key, a bad scale); once per change",
                        "the run's records, read with `--snapshot.key-map`'s names alone"),
    SYMLINK: ("a symbolic link in the snapshot folder, to a file or a folder, wherever it points "
              "(never followed: docs/security.md); once per path",
              "nothing of it; the rest of the tree"),
    NOT_REGULAR: ("a FIFO, socket or device where a snapshot or control file would be read "
                  "(never opened for reading, never waited on); once per path",
                  "nothing of it; the rest of the tree"),
    "unreadable_format": ("a logger's file the exporter cannot read: a W&B run file or TensorBoard "
                          "event file of an unknown version, a database whose tables are no "
                          "MLflow or Trackio schema it knows; once per file",
                          "nothing of it; `check` names the file and why"),
    "corrupt_record": ("a record of a W&B run file or TensorBoard event file whose checksum or "
                       "encoding is wrong", "the records before and after it"),
    "run_limit": ("a record of a new run while `--metrics.max-runs` runs are exported",
                  "the runs already exported; the run is taken once another expires"),
    "dir_missing": ("the snapshot folder disappeared (counted once per disappearance)",
                    "everything read so far; the folder is watched again when it returns"),
}
SHAPES: tuple[str, ...] = ("native", "verl", "flat")


# grpo_card_pauses_total{result}
PAUSE_RESULTS = ("paused", "unchanged", "permission_denied", "refused", "write_error")


class ExporterHealth:
    def __init__(self) -> None:
        # *_created series double the exporter's own series for no use in PromQL; node_exporter
        # and most Go exporters do not expose them either.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        Info("grpo_exporter_build", "grpo-monitor build information.", registry=self.registry).info(
            {"version": __version__})
        self.ingested = Counter(
            "grpo_snapshots_ingested", "Snapshot records ingested, by record shape.", ["shape"],
            registry=self.registry)
        self.errors = Counter(
            "grpo_snapshot_errors", "Snapshot input that could not be used (in part or whole), by reason.",
            ["reason"], registry=self.registry)
        self.files = Gauge(
            "grpo_snapshot_files", "Snapshot files the exporter is following.", registry=self.registry)
        self.runs = Gauge(
            "grpo_runs", "Runs currently exported (not expired).", registry=self.registry)
        self.ready = Gauge(
            "grpo_exporter_ready", "1 once the snapshots already on disk at start-up are replayed.",
            registry=self.registry)
        self.internal_errors = Counter(
            "grpo_exporter_internal_errors", "Unexpected errors in the ingest thread (each logged "
            "with its traceback); the thread goes on. Any is a bug.", registry=self.registry)
        self.overflows = Counter(
            "grpo_snapshot_event_overflows", "Times the kernel's inotify queue overflowed and file "
            "events were lost (a burst of writes, an exporter that lagged); each starts a full "
            "rescan of the snapshot folder at once.", registry=self.registry)
        self.expired = Counter(
            "grpo_runs_expired", "Runs dropped from /metrics after no snapshot for --snapshot.run-timeout.",
            registry=self.registry)
        # The saved state (--storage.path, saved_state.py).
        self.state_restores = Counter(
            "grpo_exporter_state_restores", "Start-ups by what became of the saved state "
            "(--storage.path): restored, or missing, stale, corrupt or refused and every snapshot "
            "file read instead.", ["result"], registry=self.registry)
        self.state_saves = Counter(
            "grpo_exporter_state_saves", "Saved states written to --storage.path.", registry=self.registry)
        self.state_save_errors = Counter(
            "grpo_exporter_state_save_errors", "Saved states that could not be written (each logged); "
            "the previous one stays.", registry=self.registry)
        self.state_bytes = Gauge(
            "grpo_exporter_state_bytes", "Size of the last saved state.", registry=self.registry)
        self.state_save_seconds = Gauge(
            "grpo_exporter_state_last_save_duration_seconds", "Time the last save took, its encoding "
            "included.", registry=self.registry)
        # A first start's backfill (backfill.py): the runs read at their files' heads and tails.
        self.partial_runs = Gauge(
            "grpo_exporter_partial_runs", "Runs served from their files' heads and tails (a first "
            "start without a saved state, --snapshot.backfill-above-bytes): the series that need "
            "every record are published for a run once the backfill has read it whole.",
            registry=self.registry)
        self.backfill_bytes = Gauge(
            "grpo_exporter_backfill_bytes", "Bytes of history the backfill has yet to read.",
            registry=self.registry)
        self.deferred_files = Gauge(
            "grpo_exporter_deferred_tail_files", "Files of ranks that log performance signals "
            "only whose newest steps a first start reads after ready (their ranks are served "
            "once read); the backfill begins after them.", registry=self.registry)
        self.partial_ranks = Gauge(
            "grpo_exporter_partial_ranks", "Ranks of partial runs served from their files' tails "
            "alone (ranks that log performance signals only): their baseline, initial-value and "
            "first-records series are published once the backfill has read them whole.",
            registry=self.registry)
        # A series per family only while it is withheld: 26 series on every exporter for a
        # moment after a first start would be most of its own series the rest of the time.
        self.partial_families = Gauge(
            "grpo_exporter_partial_families", "Runs whose series of this family the exporter "
            "withholds until the backfill has read them whole (grpo_exporter_partial_runs, "
            "grpo_exporter_partial_ranks); a family is listed while it is withheld.", ["family"],
            registry=self.registry)
        self._withheld: set[str] = set()
        # Each red card's pause of one run (card_pause.py), whichever way it came (the webhook,
        # the Alertmanager poll): one run's failure never stops another's.
        self.pauses = Counter(
            "grpo_card_pauses", "Red cards applied to a run of this node, by result: paused, "
            "unchanged (paused already, or this firing was resumed), or the write's failure: "
            "permission_denied, refused (a link or a non-folder on the way), write_error.",
            ["result"], registry=self.registry)
        for result in PAUSE_RESULTS:
            self.pauses.labels(result)
        # The children, looked up once: labels() per record is a tenth of a perf record's ingest.
        self.ingested_by_shape = {shape: self.ingested.labels(shape) for shape in SHAPES}
        for result in RESTORE_RESULTS:
            self.state_restores.labels(result)
        for reason in ERROR_REASONS:
            self.errors.labels(reason)
        # (path, reason) already named in the log; the ingest thread, the webhook's and the
        # Alertmanager poll's threads all count here.
        self._logged: set[tuple[Path, str]] = set()
        self._logged_lock = threading.Lock()

    def note_withheld(self, runs: int, headless_runs: int) -> None:
        """grpo_exporter_partial_families: the exposition.WHOLE_HISTORY families withheld for
        ``runs`` runs, the exposition.NEEDS_HEAD ones for ``headless_runs``."""
        for name in sorted(WHOLE_HISTORY | NEEDS_HEAD):
            count = headless_runs if name in NEEDS_HEAD else runs
            if count:
                self.partial_families.labels(name).set(count)
                self._withheld.add(name)
            elif name in self._withheld:
                self.partial_families.remove(name)
                self._withheld.discard(name)

    def error(self, path: Path, reason: str, detail: str) -> None:
        """Count input that could not be used (``reason``: one of ERROR_REASONS); name it in the
        log once per (path, reason)."""
        self.errors.labels(reason).inc()
        with self._logged_lock:
            first = (path, reason) not in self._logged and len(self._logged) < MAX_LOGGED_PATHS
            if first:
                self._logged.add((path, reason))
        if first:
            log.warning("%s: %s (%s); further %s errors for this file are only counted",
                        printable(path), reason, printable(detail), reason)

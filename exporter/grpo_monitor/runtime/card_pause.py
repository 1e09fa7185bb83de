"""A red card becomes its run's pause record.

The one rule both ways of hearing about a card share (Alertmanager's webhook, webhook.py, and
asking Alertmanager, alertmanager_poll.py).

For every FIRING alert with ``severity="critical"`` and a ``run`` label naming a run this
exporter reads (a folder of the snapshot folder: ``run_folder``), the run's control record
(``<snapshot_dir>/<run>/.grpo-control.json``, control.py) is set to ``paused``.
Idempotent: Alertmanager re-sends a firing group (group_interval, repeat_interval, retries) and
a poll sees the same card again and again. The same alert (fingerprint and startsAt) again
changes nothing, neither for a paused run (the first onset is kept) nor for a run someone
resumed while the card still fires. A new firing (another fingerprint, or the same one with a
new startsAt) pauses again. A resolved card never resumes a run: a person does.

No lock is held while a record is read or written: the run folder is the user's, and a read or
write there may take long (a slow or hung file system). A run whose record is being written
is claimed for that write; another card for it meanwhile is left to that write (it pauses the
run already). A link, FIFO or device in the record's place is never read (safe_io): counted in
``grpo_snapshot_errors_total``, and replaced by the pause record.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections import deque
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from grpo_monitor.contract.control import (
    ControlRecord,
    RefusedControl,
    control_path,
    now_rfc3339,
    read_control,
    write_control,
)
from grpo_monitor.contract.safe_io import Refused
from grpo_monitor.runtime.health import ExporterHealth
from grpo_monitor.runtime.store import RunStore

log = logging.getLogger("grpo_monitor.pause")

# Beyond the scrape pace: the sick record's way into a scrape (inotify, parse) and clock skew
# between the trainer's host and Prometheus'.
DETECTION_SLACK_S = 1.0


class ScrapePace:
    """When Prometheus scrapes this exporter: the longest of the recent gaps between scrapes
    (longest, not typical: an HA pair of Prometheus servers halves the typical gap)."""

    def __init__(self, keep: int = 8) -> None:
        self._times: deque[float] = deque(maxlen=keep)

    def seen(self) -> None:
        self._times.append(time.monotonic())

    def interval(self) -> float | None:
        t = list(self._times)
        return max(b - a for a, b in zip(t, t[1:])) if len(t) >= 2 else None


def healthy_before(onset: str, scrape_interval: float | None) -> str | None:
    """The newest moment the card's data was surely not there yet: its onset (the evaluation
    that found the sickness) less one scrape interval (the sick record reached Prometheus at
    most one scrape before) and one evaluation interval (taken as long as a scrape interval,
    as in the committed configs), and the slack above. A checkpoint saved before it predates
    what the card saw; one saved between it and the onset may hold the sick step."""
    try:
        t = datetime.fromisoformat(onset.replace("Z", "+00:00")).timestamp()
        t -= 2 * (scrape_interval or 0.0) + DETECTION_SLACK_S
        stamp = datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")
    except (ValueError, OverflowError, OSError):  # not a date; a date at the calendar's ends
        return None
    return stamp.replace("+00:00", "Z")


def run_folder(snapshot_dir: Path, run: str) -> Path | None:
    """The run's folder when this exporter reads one: a folder (not a link: the ingest does not
    follow links) directly in the snapshot folder, named by a valid run name (which is never a
    dot folder: the ingest skips those; run_layout.run_name_problem).

    Only such a run gets a pause record. Not "a run /metrics exports now" (RunStore): the store
    knows no run while it replays the folder after a restart, forgets one after
    --snapshot.run-timeout, and knows runs by the name in their records, while the trainer reads
    its pause record from the folder of its run name. A card for a run without a folder here
    is another node's (a fleet), stale, or forged: its record would create a folder no trainer
    reads, or write through a link to anywhere."""
    try:
        folder = control_path(snapshot_dir, run).parent
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return None
    except (ValueError, OSError):  # not a plain folder name (or not encodable); no such folder
        return None
    return folder


class CardPauser:
    def __init__(self, snapshot_dir: Path, store: RunStore,
                 scrape_pace: ScrapePace | None = None, health: ExporterHealth | None = None) -> None:
        self.snapshot_dir = snapshot_dir
        self.store = store
        self.scrape_pace = scrape_pace or ScrapePace()
        self.health = health  # counts what it refuses to read; None: logged only
        # Runs whose record a thread is reading and writing now: one read-modify-write of a
        # run's record at a time, without a lock held across the file system's time.
        self._writing: set[str] = set()
        self._claims = threading.Lock()  # guards _writing alone

    def apply_all(self, alerts: list[Any]) -> tuple[list[str], dict[str, str]]:
        """Each alert on its own: (the runs paused, run -> why its pause could not be written).
        A run whose folder the exporter cannot write never delays or drops another's pause."""
        paused: list[str] = []
        failed: dict[str, str] = {}
        for alert in alerts:
            if not isinstance(alert, dict):
                continue
            try:
                run = self.apply(alert)
            except OSError as exc:
                labels = alert.get("labels") if isinstance(alert.get("labels"), dict) else {}
                run = str(labels.get("run"))
                reason = ("refused" if isinstance(exc, Refused) else "permission_denied"
                          if isinstance(exc, PermissionError) else "write_error")
                self._count(reason)
                log.error("red card for run %s: cannot write its pause record: %s (the exporter, "
                          "uid %d, needs write access to the run folder: docs/pause.md); other "
                          "runs' pauses go on", run, exc, os.getuid())
                failed[run] = reason
                continue
            if run is not None:
                paused.append(run)
        return paused, failed

    def _count(self, result: str) -> None:
        if self.health is not None:
            self.health.pauses.labels(result).inc()

    def apply(self, alert: dict[str, Any]) -> str | None:
        """Pause the alert's run if it is a red card that has not paused it yet; the run's name
        when it did. Only a run with a folder here (``run_folder``): a fleet's exporter hears
        of every card, and pauses the runs whose ranks it serves. Raises OSError when the record
        cannot be written (apply_all counts it)."""
        labels = alert.get("labels") if isinstance(alert.get("labels"), dict) else {}
        run = labels.get("run")
        if (alert.get("status") != "firing" or labels.get("severity") != "critical"
                or not isinstance(run, str)):
            return None
        if run_folder(self.snapshot_dir, run) is None:
            # Debug only: every exporter of a fleet hears every other node's cards, each poll.
            log.debug("red card for run %r: no run folder here, ignored", run)
            return None
        fingerprint = str(alert.get("fingerprint") or "")
        onset = str(alert.get("startsAt") or "")
        alertname = str(labels.get("alertname") or "")
        with self._claims:
            if run in self._writing:
                log.debug("red card for run %s: its record is being written already", run)
                return None
            self._writing.add(run)
        try:
            record = self._pause(run, alertname, fingerprint, onset)
        finally:
            with self._claims:
                self._writing.discard(run)
        if record is None:
            self._count("unchanged")
            return None
        self._count("paused")
        log.warning("red card %s: run %s paused at step %s", alertname, run, record.step)
        return run

    def _pause(self, run: str, alertname: str, fingerprint: str, onset: str) -> ControlRecord | None:
        """The run's record read, and replaced by a pause unless it holds one (or this firing's
        resume); the record written, or None."""
        try:
            current = read_control(self.snapshot_dir, run)
        except RefusedControl as exc:
            if self.health is not None:
                self.health.error(exc.path, exc.reason, f"{exc}; replaced by the pause record")
            else:
                log.warning("run %s: %s; replacing it", run, exc)
            current = None
        except ValueError as exc:
            log.warning("run %s: unusable control record (%s), replacing it", run, exc)
            current = None
        if current is not None and current.state == "paused":
            return None  # already paused: keep the first card's record
        if current is not None and current.fingerprint == fingerprint and current.onset == onset:
            return None  # the same firing again, after someone resumed: their call stands
        record = ControlRecord(
            state="paused", alertname=alertname, run=run, step=self.store.max_step(run),
            onset=onset or None, fingerprint=fingerprint or None, paused_at=now_rfc3339(),
            healthy_before=healthy_before(onset, self.scrape_pace.interval()) if onset else None)
        write_control(self.snapshot_dir, run, record)
        return record

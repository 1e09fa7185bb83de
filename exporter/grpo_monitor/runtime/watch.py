"""File events in, ingestion on one thread out.

watchdog's observer (inotify, or polling where inotify is silent, as on NFS) only enqueues
paths; a single worker thread reads them, so file state needs no locks and a burst of events for
one file costs one read. A new folder costs a look at that folder alone, however many the
snapshot folder holds. A periodic rescan catches anything an observer missed; an overflow of the
kernel's event queue (a burst, a lagging exporter) starts one at once; and the worker notices
the snapshot folder being deleted and re-created (inotify watches die with it) and an observer
that died.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileAttribEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from grpo_monitor.contract.safe_io import printable
from grpo_monitor.runtime import backfill
from grpo_monitor.runtime.ingest import READ_TURN_SECONDS, Ingestor
from grpo_monitor.runtime.saved_state import StateFile

log = logging.getLogger("grpo_monitor.runtime.watch")

_RESCAN = ("rescan",)
# watchdog reports an overflow of the kernel's inotify queue (events lost) in its log alone.
_OVERFLOW_LOGGER = "watchdog.observers.inotify_c"
_OVERFLOW_MESSAGE = "Inotify queue overflowed"
# Without a filter watchdog also reports every open and close-without-write, including the
# exporter's own reads: twice the events, for nothing.
# FileAttribEvent: a chmod may make a file that could not be read readable (its content is
# unchanged, so no other event comes).
_EVENTS = [FileCreatedEvent, FileModifiedEvent, FileMovedEvent, FileDeletedEvent, FileClosedEvent,
           FileAttribEvent, DirCreatedEvent, DirMovedEvent, DirDeletedEvent]


class _Enqueue(FileSystemEventHandler):
    def __init__(self, q: queue.SimpleQueue[tuple]) -> None:
        self.q = q

    def on_any_event(self, event: FileSystemEvent) -> None:
        kind = event.event_type
        src = Path(str(event.src_path))
        if event.is_directory:
            if kind == "created":  # files may have landed before the watch did
                self.q.put(("folder", src))
            elif kind == "moved":  # a renamed run folder is another run: read anew
                self.q.put(("deleted", src))
                self.q.put(("folder", Path(str(event.dest_path))))
            elif kind == "deleted":
                self.q.put(("deleted", src))
        elif kind == "moved":
            self.q.put(("moved", src, Path(str(event.dest_path))))
        elif kind == "deleted":
            self.q.put(("deleted", src))
        elif kind in ("created", "modified", "closed", "attrib"):
            self.q.put(("changed", src))


class _Overflows(logging.Handler):
    """watchdog's report of an inotify queue overflow, as a rescan request: events were lost, so
    only a look at every file finds what they said."""

    def __init__(self, q: queue.SimpleQueue[tuple]) -> None:
        super().__init__(logging.WARNING)
        self.q = q

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(_OVERFLOW_MESSAGE):
            self.q.put(("overflow",))


class SnapshotWatcher:
    def __init__(
        self,
        ingestor: Ingestor,
        *,
        poll: bool = False,
        poll_interval: float = 1.0,
        rescan_interval: float = 30.0,
        run_timeout: float = 3600.0,
        tick: float = 0.5,
        state: StateFile | None = None,
        save_interval: float = 60.0,
    ) -> None:
        self.ingestor = ingestor
        self.state = state
        self.save_interval = save_interval
        self._saved_mark: tuple[int, int] | None = None  # what the last save held (_save)
        self.root = ingestor.root
        self.poll = poll
        self.poll_interval = poll_interval
        self.rescan_interval = rescan_interval
        self.run_timeout = run_timeout
        self.tick = tick
        self.ready = threading.Event()
        self._q: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._observer: BaseObserver | None = None
        self._root_inode: int | None = -1  # -1: not looked yet; None: missing
        self._thread = threading.Thread(target=self._run, name="grpo-ingest", daemon=True)
        self._overflows = _Overflows(self._q)

    def start(self) -> None:
        overflow_log = logging.getLogger(_OVERFLOW_LOGGER)
        overflow_log.addHandler(self._overflows)
        if not overflow_log.isEnabledFor(logging.WARNING):  # a quieter --log.level must not hide it
            overflow_log.setLevel(logging.WARNING)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._q.put(("stop",))
        self._thread.join(timeout)
        self._unwatch()
        if self.state is not None and self.ready.is_set() and not self._thread.is_alive():
            self._save()  # the thread that moves the offsets has ended: this is its last state
        logging.getLogger(_OVERFLOW_LOGGER).removeHandler(self._overflows)

    # -- the worker --------------------------------------------------------------------------

    def _run(self) -> None:
        if self.state is not None:
            self._safe(self._restore)
        self._check_root()
        # Replay what is already on disk (since the saved state): a large first read at each long
        # file's head and tail, its middle after ready (backfill.py).
        self.ingestor.start_up = True
        # Without the cyclic collector meanwhile: the replay makes millions of objects that all
        # live on (each rank's histories), so every collection of the oldest generation walks
        # all made so far for nothing (4,096 ranks' start-up read: 15.2 s with it, 12.4 s without).
        # Reference counting still frees what the replay drops.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._safe(self.ingestor.rescan)
        finally:
            self.ingestor.start_up = self.ingestor.skip_middles = False
            if collecting:
                gc.enable()
        self.ingestor.backfill = self._safe(backfill.start, self.ingestor)
        self._note_backfill()
        self._safe(self.ingestor.store.flush)
        self.ingestor.health.ready.set(1)
        self.ready.set()
        next_rescan = time.monotonic() + self.rescan_interval
        next_tick = time.monotonic() + self.tick
        next_save = time.monotonic() + self.save_interval
        while not self._stop.is_set():
            # Reset each turn: a tick with no event must not handle the previous batch again.
            batch: list[tuple] = []
            unfinished = list(self.ingestor.unfinished)  # files whose turn ran out: read on
            filling = self.ingestor.backfill is not None
            deferred = bool(self.ingestor.deferred)
            try:
                batch.append(self._q.get(timeout=0 if unfinished or filling or deferred else self.tick))
                while True:  # drain: a burst of events for one file costs one read
                    batch.append(self._q.get_nowait())
            except queue.Empty:
                pass
            if batch or unfinished:
                self._handle(batch)
                self._read_changed(dict.fromkeys(p for p in unfinished if p in self.ingestor.unfinished))
                self._safe(self.ingestor.loggers.settle)  # CSV tables: their folder's, merged
                self._safe(self.ingestor.store.flush)
            if deferred:  # a first start's tails, left for after ready: in turns, as the backfill
                self._safe(self.ingestor.read_deferred, READ_TURN_SECONDS)
                self._safe(self.ingestor.store.flush)
                self._note_backfill()
            if filling:  # a turn of the backfill after each batch (it waits for those tails)
                self._safe(self._backfill_turn)
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + self.tick
                self._safe(self._maintain)
            if now >= next_rescan and self._root_inode not in (None, -1):
                next_rescan = now + self.rescan_interval
                self._safe(self.ingestor.rescan)
                self._safe(self.ingestor.store.flush)
            # Between batches: the offsets saved are those the store has (a file whose turn ran
            # out mid-read has the offset of the records it gave the store).
            if self.state is not None and now >= next_save:
                next_save = now + self.save_interval
                self._safe(self._save)

    def _backfill_turn(self) -> None:
        filling = self.ingestor.backfill
        assert filling is not None
        try:
            more = filling.turn(READ_TURN_SECONDS)
        except Exception:
            more = False  # a bug: counted and logged by _safe, and not met again every turn
            raise
        finally:
            if not more:
                self.ingestor.backfill = None
            self._note_backfill()
        self.ingestor.store.flush()

    def _note_backfill(self) -> None:
        backfill.note_progress(self.ingestor)

    def _restore(self) -> None:
        assert self.state is not None
        result, saved = self.state.load()
        self.ingestor.health.state_restores.labels(result).inc()
        if saved is not None:
            self.ingestor.store.restore(saved.runs)
            self.ingestor.restore(saved.files, saved.controls)
            self.ingestor.loggers.restore(saved.loggers)

    def _save(self) -> None:
        """Save the state, unless nothing changed since the last save (an idle exporter writes
        nothing)."""
        assert self.state is not None
        mark = (self.ingestor.store.generation, self.ingestor.saved_mark())
        if mark == self._saved_mark:
            return
        health = self.ingestor.health
        t0 = time.perf_counter()
        try:
            size = self.state.save(self.ingestor.store, self.ingestor)
        except OSError as exc:
            health.state_save_errors.inc()
            log.warning("cannot save the exporter's state to %s: %s", printable(self.state.path),
                        exc.strerror or exc)
            return
        self._saved_mark = mark
        health.state_saves.inc()
        health.state_bytes.set(size)
        health.state_save_seconds.set(time.perf_counter() - t0)

    def _handle(self, batch: list[tuple]) -> None:
        # Events apply in the order they came; reads of changed files (and new folders) wait
        # until a move or delete needs them done, so each file is read once a batch. A rescan
        # reads every file: one at the batch's end stands for all the batch asked for.
        changed: dict[Path, None] = {}  # ordered set
        folders: dict[Path, None] = {}
        deleted: list[Path] = []
        rescan = False

        def read() -> None:
            if deleted:
                self._safe(self.ingestor.deleted, *deleted)
                deleted.clear()
            for folder in folders:
                # The files it read are read past the events queued for them so far.
                for path in self._safe(self.ingestor.scan_folder, folder) or ():
                    changed.pop(path, None)
            folders.clear()
            self._read_changed(changed)

        for item in batch:
            kind = item[0]
            if kind == "changed":
                if deleted:
                    read()
                changed[item[1]] = None
            elif kind == "folder":
                if deleted:
                    read()
                folders[item[1]] = None
            elif kind == "moved":
                read()
                self._safe(self.ingestor.moved, item[1], item[2])
            elif kind == "deleted":
                if changed or folders:
                    read()
                deleted.append(item[1])  # consecutive deletes: one pass over the files
            elif kind == "overflow":
                self.ingestor.health.overflows.inc()
                log.warning("inotify's event queue overflowed: events were lost; rescanning %s "
                            "now", self.root)
                rescan = True
            elif kind == "rescan":
                rescan = True
        read()
        if rescan:
            self._safe(self.ingestor.rescan)

    def _read_changed(self, changed: dict[Path, None]) -> None:
        for path in changed:
            self._safe(self.ingestor.process, path)
        changed.clear()

    def _safe(self, fn, *args):  # type: ignore[no-untyped-def]
        # The worker must outlive any surprise: one bad file must not stop ingestion.
        try:
            return fn(*args)
        except Exception:
            self.ingestor.health.internal_errors.inc()
            log.exception("unexpected error in %s%s", getattr(fn, "__name__", fn), args)

    def _maintain(self) -> None:
        self._check_root()
        self._check_observer()
        # A logger file quiet since the last tick: its newest step is whole (runtime/loggers).
        self.ingestor.loggers.flush_idle()
        self.ingestor.store.flush()
        health = self.ingestor.health
        gone = self.ingestor.store.expire(time.time(), self.run_timeout)
        if gone:
            health.expired.inc(len(gone))
            log.info("runs expired after %.0f s without a snapshot: %s", self.run_timeout, ", ".join(gone))
        health.runs.set(self.ingestor.store.run_count())

    # -- the snapshot folder and its observer ------------------------------------------------

    def _check_root(self) -> None:
        try:
            inode = self.root.stat().st_ino if self.root.is_dir() else None
        except OSError:
            inode = None
        if inode == self._root_inode:
            return
        if inode is None:
            log.warning("snapshot folder %s is missing; serving what was read, waiting for it", self.root)
            self.ingestor.health.errors.labels("dir_missing").inc()
            self._unwatch()
            self.ingestor.forget(self.root)
        else:
            if self._root_inode not in (None, -1):
                log.info("snapshot folder %s was re-created; reading it again", self.root)
                self.ingestor.forget(self.root)
            self._watch()
            if self._root_inode != -1:  # at start-up the replay that follows is the rescan
                self._q.put(_RESCAN)
        self._root_inode = inode

    def _check_observer(self) -> None:
        """An observer whose thread died (an error in watchdog) sees nothing more: armed again,
        and the folder rescanned for what it missed."""
        observer = self._observer
        if observer is None or (observer.is_alive() and all(e.is_alive() for e in observer.emitters)):
            return
        log.warning("the file watcher of %s stopped; watching again and rescanning", self.root)
        self._watch()
        self._q.put(_RESCAN)

    def _watch(self) -> None:
        self._unwatch()
        observer = PollingObserver(timeout=self.poll_interval) if self.poll else Observer()
        observer.schedule(_Enqueue(self._q), str(self.root), recursive=True, event_filter=_EVENTS)
        observer.start()
        self._observer = observer

    def _unwatch(self) -> None:
        if self._observer is not None:
            try:
                self._observer.stop()
                self._observer.join(timeout=5)
            except Exception:  # an observer whose folder vanished can fail on stop
                log.debug("observer stop failed", exc_info=True)
            self._observer = None

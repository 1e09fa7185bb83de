"""Append a trainer rank's training signals to a JSONL snapshot file (snapshot contract v1).

Why it is shaped this way:

* Whole lines. Each record is encoded to one buffer, newline included, and appended with a
  single ``os.write`` on an ``O_APPEND`` descriptor: a reader that parses only newline-terminated
  lines (as the exporter does) never sees half a record, records never interleave, and the
  trainer never has to coordinate with the exporter.
* Cheap. ``log()`` runs inside the training loop on every step, so the constant part of the
  line (run, rank, host) is encoded once and only the step's values go through ``json``.
* Never raise. A full or broken disk must not kill a week-long run: disk errors and values the
  encoder cannot handle are counted (``write_errors``, ``dropped_records``), warned about once,
  and the file is reopened on a later ``log()`` once the disk is back. The part of a record a
  full disk had room for is truncated away: no torn line is left for the exporter.
* An end that says so. ``close()`` appends a ``run_end`` event: the exporter then knows the run
  finished, and that its silence is no hang (the GRPORunHung red card). A run that dies without
  it (a crash, a kill, a hung collective) simply stops writing, which is what the card looks
  for. So ``close()`` is for the clean path only; the context manager and ``close(end=False)``
  leave the end unmarked when an exception is on its way out.
* Named keys. A key that maps to no signal the cards read (``reward/meen``) is warned about
  once, with the names it most likely meant (``UnknownKeyWarning``; ``warn_unknown_keys=False``
  turns it off). A step whose keys were all seen before costs one set check.
* Bounded. Past ``max_bytes`` the file is renamed to a numbered segment that keeps the
  ``rank-<N>`` prefix and ``.jsonl`` suffix, so the exporter still reads it as history, and only
  the newest ``keep_segments`` segments are kept.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import stat
import sys
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from grpo_monitor.contract.key_map import KeyMap, KeyMapLike, as_key_map
from grpo_monitor.contract.keys import closest_names, is_known_unmapped, match_key
from grpo_monitor.contract.run_layout import (
    check_run_name,
    rank_file,
    rotation_of,
    segment_file,
)
from grpo_monitor.sdk.pause import Checkpoint, ControlWatcher

__all__ = ["SnapshotWriter", "UnknownKeyWarning"]

_log = logging.getLogger("grpo_monitor.sdk")


class UnknownKeyWarning(UserWarning):
    """A logged key maps to no signal the cards read: exported generically, judged by none."""


# A broken disk is retried at most this often, so that it costs no syscall storm per step.
_RETRY_INTERVAL_S = 1.0
# O_RDWR, not O_WRONLY: _open reads the last byte of an existing file. O_NOFOLLOW, O_NONBLOCK: the
# snapshot folder is shared, and a link or a FIFO placed at the rank's file must neither lead the
# records elsewhere nor hang the training loop (a FIFO opens at once, and is then refused).
_OPEN_FLAGS = (os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
               | getattr(os, "O_CLOEXEC", 0))


def _to_json_value(value: Any) -> Any:
    # numpy scalars and 0-d tensors have .item(); Mapping views are not dicts to the C encoder.
    item = getattr(value, "item", None)
    if item is not None:
        return item()
    if isinstance(value, Mapping):
        return dict(value)
    return float(value)


# allow_nan stays on: NaN / Infinity are training signals and the contract accepts the tokens.
_encode_json = json.JSONEncoder(separators=(",", ":"), default=_to_json_value).encode

try:
    import orjson

    _ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS

    def _encode(value: Any) -> bytes:
        # orjson formats floats ~15x faster than json (shortest round-trip, lossless), but
        # writes NaN / Infinity as null; a null in its output sends the value down the json
        # path, which writes the tokens the contract reads as signals.
        data = orjson.dumps(value, default=_to_json_value, option=_ORJSON_OPTIONS)
        return _encode_json(value).encode() if b"null" in data else data
except ImportError:  # orjson is a dependency, but the SDK must not break without it

    def _encode(value: Any) -> bytes:
        return _encode_json(value).encode()


def _dist_rank_and_world_size() -> tuple[int, int] | None:
    # Only consult torch.distributed when the trainer already imported it: importing the SDK
    # must never pull in torch.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _gpu_identity(local_rank: int | None) -> tuple[str | None, str | None]:
    """The physical GPU index (as NVML numbers it) and UUID this rank trains on, when known.

    torch is consulted only when the trainer already imported it; otherwise LOCAL_RANK maps
    through CUDA_VISIBLE_DEVICES, the usual one-GPU-per-rank placement. Without either sign of
    a GPU (a CPU-only run) nothing is guessed.
    """
    torch = sys.modules.get("torch")
    uuid = None
    device = None
    try:
        if torch is not None and torch.cuda.is_available():
            device = torch.cuda.current_device() if torch.cuda.is_initialized() else local_rank
            if torch.cuda.is_initialized():
                raw = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
                uuid = (raw if raw.startswith("GPU-") else f"GPU-{raw}") if raw else None
    except Exception:  # noqa: BLE001 -- identity is a nicety; never fail the trainer for it
        pass
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if device is None and visible:
        device = local_rank if local_rank is not None else 0
    if device is None:
        return None, uuid
    if visible and device < len(visible):
        gpu = visible[device]
        if gpu.startswith("GPU-"):  # CUDA_VISIBLE_DEVICES may name GPUs by UUID
            return None, uuid or gpu
        return gpu, uuid
    return str(device), uuid


def _env_int(*names: str) -> int | None:
    for name in names:
        raw = os.environ.get(name)
        if raw is not None and raw.strip():
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
    return None


class SnapshotWriter:
    """Append one JSON record per ``log()`` call to ``<snapshot_dir>/<run>/rank-<N>.jsonl``.

    ``rank`` / ``world_size`` default to ``torch.distributed`` when it is imported and
    initialised, else to the ``RANK`` (then ``LOCAL_RANK``) and ``WORLD_SIZE`` environment
    variables, else 0 and 1. Disk errors never raise: see ``write_errors`` and
    ``dropped_records``.
    """

    def __init__(
        self,
        snapshot_dir: str | os.PathLike[str],
        run: str,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        max_bytes: int = 64 * 2**20,
        keep_segments: int = 16,
        framework: str | None = None,
        warn_unknown_keys: bool = True,
        key_map: KeyMapLike = None,
    ) -> None:
        check_run_name(run)
        # The user's names for the canonical keys (contract/key_map.py: a KeyMap, the mapping of
        # its lines, or the path of its TOML file): a mapped name is written as its key.
        self.key_map: KeyMap | None = as_key_map(key_map) or None
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        if keep_segments < 0:
            raise ValueError(f"keep_segments must be >= 0, got {keep_segments}")

        dist = _dist_rank_and_world_size() if rank is None or world_size is None else None
        if rank is None:
            env_rank = _env_int("RANK", "LOCAL_RANK")
            rank = dist[0] if dist else (env_rank if env_rank is not None else 0)
        if world_size is None:
            env_world = _env_int("WORLD_SIZE")
            world_size = dist[1] if dist else (env_world if env_world is not None else 1)

        self.run: str = run
        self.rank: int = int(rank)
        self.world_size: int = int(world_size)
        self.local_rank: int | None = _env_int("LOCAL_RANK")
        self.host: str = socket.gethostname()
        # Which GPU: joins a straggling rank with its GPU's NVML series (grpo_rank_info).
        self.gpu, self.gpu_uuid = _gpu_identity(self.local_rank)
        self.dir: str = os.path.join(os.fspath(snapshot_dir), run)
        self.path: str = os.path.join(self.dir, rank_file(self.rank))
        self.max_bytes: int = max_bytes
        self.keep_segments: int = keep_segments
        self.write_errors: int = 0
        self.dropped_records: int = 0

        header = _encode({
            "run": self.run, "rank": self.rank, "world_size": self.world_size,
            "host": self.host, "local_rank": self.local_rank, "gpu": self.gpu,
            "gpu_uuid": self.gpu_uuid, **({"framework": framework} if framework else {}),
        })
        self._prefix: bytes = header[:-1] + b',"step":'
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        # Set while the file ends in a fragment without newline (a write cut short): the next
        # record then starts with "\n", so only the fragment is unreadable, not that record too.
        self._torn = False
        self._retry_at = 0.0
        self._seq = 0
        self._last_step: int | None = None  # the newest step log() wrote: run_end's step
        self._closed = False
        self._warned_disk = False
        self._warned_value = False
        # The metric keys already looked up: an unknown one is warned about once.
        self._seen_keys: set[str] | None = set() if warn_unknown_keys else None
        # The run's control record (red-card pause, exporter's webhook): see should_pause().
        self._control = ControlWatcher(self.dir)
        self.control_path: str = self._control.path
        # The checkpoint_save events logged: a red card's rollback candidates (PauseGate).
        self.checkpoints: list[Checkpoint] = []
        with self._lock:
            self._open()

    # -- public surface ---------------------------------------------------------------------

    def log(
        self,
        metrics: Mapping[str, float],
        step: int,
        *,
        by_type: Mapping[str, Mapping[str, float]] | None = None,
        samples: Sequence[Mapping[str, Any]] | None = None,
        events: Sequence[Mapping[str, Any]] | None = None,
        timestamp: float | None = None,
    ) -> bool:
        """Append one record; return whether it reached the file. Never raises.

        ``timestamp`` (unix seconds) is the record's ``time``; default now. Replays and
        simulations pass their own clock so a run is judged on its steps' times.
        """
        try:
            if self.key_map is not None:
                metrics = self._mapped(metrics)
            now = time.time() if timestamp is None else float(timestamp)
            parts = [self._prefix, b"%d" % int(step), b',"time":%r,"metrics":' % now,
                     _encode(metrics)]
            if by_type is not None:
                parts += (b',"by_type":', _encode(by_type))
            if samples is not None:
                parts += (b',"samples":', _encode(samples))
            if events is not None:
                parts += (b',"events":', _encode(events))
            parts.append(b"}\n")
            data = b"".join(parts)
            step = int(step)
            if events is not None:
                self._note_checkpoints(events, step, now)
        # The default hook calls the caller's .item() / float(): anything may come out of it,
        # and a bad value is no reason to stop training.
        except Exception as exc:  # noqa: BLE001
            self.dropped_records += 1
            if not self._warned_value:
                self._warned_value = True
                _log.warning("grpo_monitor: dropped a record of %s that cannot be encoded as "
                             "JSON (%r); further ones are dropped silently", self.path, exc)
            return False
        with self._lock:
            if self._closed:
                self.dropped_records += 1
                return False
            self._last_step = step if self._last_step is None else max(self._last_step, step)
            written = self._append(data)
        # After the write: under -W error the warning is raised, and must not cost the record.
        if self._seen_keys is not None and not self._seen_keys.issuperset(metrics):
            self._warn_unknown(metrics)
        return written

    def _mapped(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """The record's metrics under the key map's names (a scaled one converted)."""
        assert self.key_map is not None
        out: dict[str, Any] = {}
        for name, value in metrics.items():
            target = self.key_map.get(name) if isinstance(name, str) else None
            if target is None or target.key is None:
                out.setdefault(name, value)
                continue
            out[target.key] = value if target.scale == 1.0 else float(value) * target.scale
        return out

    def _warn_unknown(self, metrics: Mapping[str, Any]) -> None:
        assert self._seen_keys is not None
        for name in metrics:
            if name in self._seen_keys:
                continue
            self._seen_keys.add(name)
            # A known name, one a framework always logs and the project leaves unmapped on
            # purpose, or one the key map says is no signal: nothing to warn about.
            if not isinstance(name, str) or match_key(name) is not None or is_known_unmapped(name):
                continue
            if self.key_map is not None and self.key_map.get(name) is not None:
                continue
            close = closest_names(name)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            warnings.warn(f"grpo_monitor: {name!r} maps to no signal the cards read (it is exported "
                          f"as grpo_metric_value){hint}", UnknownKeyWarning, stacklevel=3)

    def should_pause(self) -> bool:
        """True while a red card holds this run paused (``<dir>/.grpo-control.json`` says
        ``"state": "paused"``), as this process sees it. Cheap enough for every step: one
        ``os.stat``; the file is read again only when its (mtime_ns, size, inode) changed. Never
        raises: an unreadable or malformed record counts as not paused (warned once). A job of
        several processes uses ``PauseGate`` instead: every rank then stops at the same step."""
        record = self._control.read()
        return record is not None and record.get("state") == "paused"

    def wait_if_paused(self, poll_interval: float = 1.0, log: bool = True) -> dict[str, Any] | None:
        """Block while the run is paused; None at once when it is not. After ``grpo-monitor
        resume`` returns the control record (its ``rollback_to``: a step, or None). For one
        process; a job of several uses ``PauseGate``, which also finds the last healthy
        checkpoint."""
        if not self.should_pause():
            return None
        rec = self._control.record or {}
        if log:
            _log.warning("training paused by red card %s at step %s; run `grpo-monitor resume %s` "
                         "to continue", rec.get("alertname"), rec.get("step"), self.run)
        self.mark("paused", alertname=rec.get("alertname"))
        while self.should_pause():
            time.sleep(poll_interval)
        self.mark("resumed")
        if log:
            _log.warning("training resumed (rollback_to=%s)", (self._control.record or {}).get("rollback_to"))
        record = self._control.record
        return dict(record) if record is not None else {"state": "running"}

    def mark(self, event_type: str, **fields: Any) -> None:
        """Append a record that is one event and no metrics, at the newest step logged: the
        exporter reads it as a mark of the run's state (``paused`` / ``resumed``: a run that
        waits on purpose writes nothing, and must not look hung). Never raises."""
        with self._lock:
            try:
                self._mark(event_type, **fields)
            except Exception as exc:  # noqa: BLE001 -- fields from a control record may be anything
                # A field the encoder refuses (10**400, a lone surrogate) costs the field, not
                # the mark: without the mark the waiting run would look hung.
                if not self._warned_value:
                    self._warned_value = True
                    _log.warning("grpo_monitor: a %s mark of %s is written without its fields, "
                                 "which cannot be encoded as JSON (%r)", event_type, self.path, exc)
                try:
                    self._mark(event_type)
                except Exception:  # noqa: BLE001 -- a step beyond 64 bits: no mark at all
                    self.dropped_records += 1

    def _note_checkpoints(self, events: Sequence[Mapping[str, Any]], step: int, now: float) -> None:
        for event in events:
            if isinstance(event, Mapping) and event.get("type") == "checkpoint_save":
                path = event.get("path")
                at = event.get("step", step)
                self.checkpoints.append(Checkpoint(int(at) if isinstance(at, int) else step,
                                                   path if isinstance(path, str) else None, now))

    def close(self, *, end: bool = True, step: int | None = None) -> None:
        """Close the file; later ``log()`` calls are dropped. A second call does nothing.

        ``end=True`` (the default) first appends a record whose ``events`` hold
        ``{"type": "run_end"}``, at ``step`` (default: the newest step logged): the run
        finished, and the exporter stops expecting records from it (no GRPORunHung card). Skipped
        when this writer logged nothing. ``end=False`` closes without it: for the error path,
        where the run did not finish. Note that a bare ``close()`` in a ``finally`` block marks
        a crashed run as ended; use ``with SnapshotWriter(...)`` (which passes ``end=False``
        when an exception leaves the block) or ``close(end=False)`` in an ``except``.
        """
        with self._lock:
            if self._closed:
                return
            if end:
                self._mark("run_end", step)
            self._closed = True
            self._close_fd()

    def _mark(self, event_type: str, step: int | None = None, **fields: Any) -> None:
        """Append a record that is one event and no metrics (called with the lock held): the
        exporter reads it as a mark of the run's state, not as a step. Nothing before the first
        step (no run to mark yet) or after close()."""
        last = self._last_step if step is None else int(step)
        if last is None or self._closed:
            return
        now = time.time()
        event = _encode([{"type": event_type, "step": last, "time": now,
                          **{k: v for k, v in fields.items() if v is not None}}])
        self._append(b"".join((self._prefix, b"%d" % last, b',"time":%r,"metrics":{}' % now,
                               b',"events":', event, b"}\n")))

    def __enter__(self) -> SnapshotWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # A clean exit ends the run; so do Ctrl-C and sys.exit(0): a person or the program
        # chose to stop, and a red "hung" card minutes later would page someone for nothing.
        # Any other exception is a crash: the end stays unmarked, and the silence is a card.
        clean = (exc_type is None or issubclass(exc_type, KeyboardInterrupt)
                 or (isinstance(exc, SystemExit) and exc.code in (None, 0)))
        self.close(end=clean)

    def __del__(self) -> None:
        # __init__ may have failed before the descriptor existed.
        if getattr(self, "_fd", None) is not None:
            self._close_fd()

    # -- internals (called with the lock held) ----------------------------------------------

    def _append(self, data: bytes) -> bool:
        if self._fd is None and (self._closed or not self._reopen()):
            self.dropped_records += 1
            return False
        if self._size and self._size + len(data) > self.max_bytes and not self._rotate():
            self.dropped_records += 1
            return False
        fd = self._fd
        assert fd is not None  # _reopen() / _rotate() returned True
        if self._torn:
            data = b"\n" + data
        written = 0
        try:
            # A regular file takes the whole buffer in one write unless the disk fills up or a
            # signal lands; finish the line then rather than leave a fragment.
            while written < len(data):
                written += os.write(fd, data[written:])
        except OSError as exc:
            # A full disk takes the bytes that fit in the file's last block and refuses the
            # rest: take them back, so that a reader only ever sees whole records. Should that
            # fail too, the next record starts on a new line and only the fragment is lost.
            if written and not self._take_back(fd, written):
                self._size += written
                self._torn = True
            self._fail(exc)
            self.dropped_records += 1
            return False
        self._size += written
        self._torn = False
        return True

    @staticmethod
    def _take_back(fd: int, written: int) -> bool:
        """Truncate the last ``written`` bytes (ours: one writer per file, O_APPEND)."""
        try:
            os.ftruncate(fd, os.fstat(fd).st_size - written)
        except OSError:
            return False
        return True

    def _reopen(self) -> bool:
        if time.monotonic() < self._retry_at:
            return False
        return self._open()

    def _open(self) -> bool:
        try:
            os.makedirs(self.dir, exist_ok=True)
            fd = os.open(self.path, _OPEN_FLAGS, 0o644)
        except OSError as exc:
            self._fail(exc)
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, f"{self.path} is no regular file (a FIFO, socket or "
                              "device placed there); nothing is written to it")
            size = st.st_size
            # A previous process may have died mid-line; do not glue our first record onto it.
            self._torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        except OSError as exc:
            os.close(fd)
            self._fail(exc)
            return False
        self._fd, self._size = fd, size
        return True

    def _rotate(self) -> bool:
        self._close_fd()
        try:
            segments = self._segments()
            # Continue after the highest segment on disk, or in memory when keep_segments=0
            # left none there: a name is never reused while an exporter may still track it.
            self._seq = max(self._seq, segments[-1][0] if segments else 0) + 1
            name = segment_file(self.rank, self._seq)
            os.rename(self.path, os.path.join(self.dir, name))
            segments.append((self._seq, name))
            for _, old in segments[: max(len(segments) - self.keep_segments, 0)]:
                try:
                    os.unlink(os.path.join(self.dir, old))
                except FileNotFoundError:
                    pass
        except OSError as exc:
            self._fail(exc)
            return False
        return self._open()

    def _segments(self) -> list[tuple[int, str]]:
        found = []
        with os.scandir(self.dir) as entries:
            for entry in entries:
                _, seq = rotation_of(entry.name)
                # Only the names this writer gives: pruning never deletes another program's file.
                if seq is not None and entry.name == segment_file(self.rank, seq):
                    found.append((seq, entry.name))
        found.sort()
        return found

    def _fail(self, exc: OSError) -> None:
        self.write_errors += 1
        self._close_fd()
        self._retry_at = time.monotonic() + _RETRY_INTERVAL_S
        if not self._warned_disk:
            self._warned_disk = True
            _log.warning("grpo_monitor: cannot write snapshots to %s (%s); records are dropped "
                         "and counted, and the file is retried at most every %.0f s",
                         self.path, exc, _RETRY_INTERVAL_S)

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

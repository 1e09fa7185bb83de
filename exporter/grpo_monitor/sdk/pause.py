"""One red-card pause for every rank of a training job, decided at a step boundary.

A red card reaches a run as its control record, ``<snapshot_dir>/<run>/.grpo-control.json``
(control.py), written by the exporter of the node whose webhook got the card, and lifted by
``grpo-monitor resume``. Reading that file is not enough for a job that spans processes:

* with node-local snapshot folders, only the ranks of one node see the record;
* even on one node, ranks read it at slightly different moments, so some would stop at step k
  while others enter the collectives of step k+1 and wait there, until the process group's
  timeout (10 minutes by default, 30 in TRL) kills the job: worse than not pausing.

So the decision travels through the job's own process group. At every step boundary each rank
reads its local record (one ``os.stat``) and the ranks take the element-wise maximum of three
numbers with one tiny all-reduce: the newest pause, the newest resume and the moment before
which checkpoints are healthy, as unix times (0 where a rank has no record). The group is paused while its newest pause is newer
than its newest resume. Every rank gets the same answer at the same step, whichever node's
record says it, and a ``resume`` written on any node (newer than every pause) resumes them all.

A paused group holds no collective open: every rank sleeps ``poll_interval`` and then joins the
same tiny all-reduce again, so each collective completes within about ``poll_interval``,
however long a person takes to look. ``poll_interval`` must stay well under the group's
timeout.

On resume the group also agrees on where to go on from (``ResumeDecision``): by default the last
healthy checkpoint, the newest one saved before the card's data existed (the record's
``healthy_before``: the card's onset less its detection time); ``resume --rollback-to STEP``
names another; ``resume --no-rollback`` goes on from where it stopped. The trainer restores it
in place (``grpo_monitor.sdk.checkpoint``, or its framework's own loader).

torch is never imported here: the collective is used only when the trainer has initialised
``torch.distributed`` itself (or passes ``group``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from grpo_monitor.contract.run_layout import MAX_CONTROL_BYTES, PAUSE_RECORD
from grpo_monitor.contract.safe_io import read_regular

if TYPE_CHECKING:
    from grpo_monitor.sdk.writer import SnapshotWriter

__all__ = ["Checkpoint", "ControlWatcher", "GroupState", "PauseGate", "ResumeDecision",
           "rollback_mode"]

_log = logging.getLogger("grpo_monitor.sdk")


# The resume record's rollback choice, as one number so that it can ride the all-reduce.
_ROLLBACK_NONE = -2.0
_ROLLBACK_LAST_HEALTHY = -1.0


class GroupState(NamedTuple):
    """What the ranks agreed on: the newest pause and resume anywhere, and the moment before
    which checkpoints are healthy (unix seconds, 0 where no rank knows)."""

    paused_at: float
    resumed_at: float
    healthy_before: float

    @property
    def paused(self) -> bool:
        return self.paused_at > self.resumed_at


class Checkpoint(NamedTuple):
    step: int
    path: str | None
    time: float  # unix seconds when it was saved: compared with healthy_before


def _unix(rfc3339: Any) -> float | None:
    if not isinstance(rfc3339, str) or not rfc3339:
        return None
    try:
        return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):  # not a date; a date at the calendar's ends
        return None


def rollback_mode(record: dict[str, Any]) -> float:
    """A resume record's rollback choice as a number: a step (>= 0), or the two modes above.
    Records written before ``rollback`` existed carry only ``rollback_to``: a step, or nothing
    (they asked for no rollback)."""
    mode = record.get("rollback")
    step = record.get("rollback_to")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        step = None  # no step a checkpoint was saved at
    if mode == "step" or (mode is None and step is not None):
        try:
            return _ROLLBACK_NONE if step is None else float(step)
        except OverflowError:  # 10**400 steps: none was saved there either
            return _ROLLBACK_NONE
    if mode == "none" or mode is None:
        return _ROLLBACK_NONE
    return _ROLLBACK_LAST_HEALTHY


class ControlWatcher:
    """A run's control record, read again only when the file changed (one ``os.lstat`` per call).
    Never raises, never blocks: an unreadable or malformed record counts as none (warned once),
    and so does a link, FIFO or device in its place, which is never opened for reading
    (safe_io: a FIFO there must not hang the training job)."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.path: str = os.path.join(run_dir, PAUSE_RECORD)
        self.record: dict[str, Any] | None = None
        self.mtime: float = 0.0
        self._sig: tuple[int, int, int] | None = None
        self._times: tuple[tuple[int, int, int] | None, tuple[float, float, float, float]] | None = None
        self._warned = False

    def read(self) -> dict[str, Any] | None:
        try:
            try:
                st = os.lstat(self.path)
            except FileNotFoundError:
                self._sig, self.record = None, None
                return None
            sig = (st.st_mtime_ns, st.st_size, st.st_ino)
            if sig != self._sig:
                data = read_regular(self.run_dir, self.path, MAX_CONTROL_BYTES)
                if len(data) > MAX_CONTROL_BYTES:
                    raise ValueError(f"over {MAX_CONTROL_BYTES} bytes")
                record = json.loads(data)
                if not isinstance(record, dict):
                    raise ValueError("control record is not a JSON object")
                self._sig, self.record, self.mtime = sig, record, st.st_mtime
            return self.record
        except Exception as exc:  # noqa: BLE001 (the training loop must never see it)
            if not self._warned:
                _log.warning("cannot read the control record %s (%s); treating the run as not "
                             "paused", self.path, exc)
                self._warned = True
            self._sig, self.record = None, None
            return None

    def times(self) -> tuple[float, float, float, float]:
        """(newest pause, newest resume, healthy before, rollback choice) of the local record, unix
        seconds, 0 for what it does not say. A record without its time stamp (written by hand)
        dates from its file's modification time."""
        record = self.read()
        if record is None:
            return 0.0, 0.0, 0.0, _ROLLBACK_NONE
        if self._times is None or self._times[0] != self._sig:  # parse once per change
            try:
                times = self._parse_times(record)
            except Exception as exc:  # noqa: BLE001 (the training loop must never see it)
                if not self._warned:
                    _log.warning("cannot read the control record %s (%s); treating the run as "
                                 "not paused", self.path, exc)
                    self._warned = True
                times = (0.0, 0.0, 0.0, _ROLLBACK_NONE)
            self._times = (self._sig, times)
        return self._times[1]

    def _parse_times(self, record: dict[str, Any]) -> tuple[float, float, float, float]:
        paused = _unix(record.get("paused_at"))
        resumed = _unix(record.get("resumed_at"))
        state = record.get("state")
        if state == "paused":
            paused = paused or self.mtime
            # a record that says paused is newer than any resume it still carries
            resumed = min(resumed or 0.0, paused - 1e-3)
        elif state == "running":
            # and one that says running is newer than the pause it still carries (a paused_at
            # ahead of the clock that wrote the resume must not keep the run paused)
            resumed = max(resumed or self.mtime, (paused or 0.0) + 1e-3)
        else:
            return 0.0, 0.0, 0.0, _ROLLBACK_NONE
        # The last healthy checkpoint is the newest saved before the card's data existed: the
        # exporter dates that (healthy_before); a record without it falls back to the onset.
        healthy = (_unix(record.get("healthy_before")) or _unix(record.get("onset"))
                   or paused or 0.0)
        return paused or 0.0, resumed or 0.0, healthy, rollback_mode(record)


class _Group:
    """The element-wise maximum over the ranks of a torch.distributed group; the identity for
    a process on its own."""

    def __init__(self, group: Any) -> None:
        dist = sys.modules.get("torch.distributed")
        self.dist = None
        if group is not False and dist is not None and dist.is_available() and dist.is_initialized():
            self.dist = dist
        self.group = None if group in (None, False) else group
        self.rank, self.size = 0, 1
        if self.dist is not None:
            self.rank = self.dist.get_rank(self.group)
            self.size = self.dist.get_world_size(self.group)
            import torch

            backend = str(self.dist.get_backend(self.group)).lower()
            self.device = (torch.device("cuda", torch.cuda.current_device())
                           if "nccl" in backend else torch.device("cpu"))
            self._torch = torch
        if self.size <= 1:
            self.dist = None

    def max(self, values: Sequence[float]) -> list[float]:
        if self.dist is None:
            return list(values)
        t = self._torch.tensor(values, dtype=self._torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.group)
        return t.tolist()

    def share(self, obj: Any, src_rank: int) -> Any:
        """``obj`` of the group's rank ``src_rank``, on every rank (rare: once per resume)."""
        if self.dist is None:
            return obj
        box = [obj]
        src = src_rank if self.group is None else self.dist.get_global_rank(self.group, src_rank)
        self.dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]


@dataclass(frozen=True)
class ResumeDecision:
    """What a paused group agreed on when a person resumed it."""

    record: dict[str, Any]  # the newest control record this rank sees ({} on a rank that has none)
    paused_at_step: int  # the step boundary at which every rank stopped
    rollback_step: int | None  # go on from this step's checkpoint; None: go on from here
    rollback_path: str | None  # that checkpoint's path, as the rank that saved it logged it
    waited_s: float = 0.0

    @property
    def rollback_to(self) -> int | None:  # the name the control record and wait_if_paused use
        return self.rollback_step


@dataclass
class PauseGate:
    """Call ``check(step)`` on every rank, at the same point of every step.

    ``writer``: the rank's ``SnapshotWriter`` (its run folder holds the control record; its
    ``checkpoint_save`` events are the rollback candidates; it marks the pause in the snapshots
    so that a waiting run does not look hung). Without a writer pass ``run_dir``, and report
    saves with ``checkpoint_saved``. ``group``: a torch.distributed process group (default: the
    whole job once ``torch.distributed`` is initialised; ``False`` for none). ``every``: decide
    only at steps divisible by it (cheaper; every rank must count steps alike).
    """

    writer: SnapshotWriter | None = None
    run_dir: str | None = None
    group: Any = None
    poll_interval: float = 1.0
    every: int = 1
    saves: list[Checkpoint] = field(default_factory=list)
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        if self.writer is None and self.run_dir is None:
            raise ValueError("PauseGate needs a writer or a run_dir")
        if self.every < 1 or self.poll_interval <= 0:
            raise ValueError("every must be >= 1 and poll_interval > 0")
        self.watcher = ControlWatcher(self.run_dir or self.writer.dir)  # type: ignore[union-attr]
        self._group: _Group | None = None

    # -- public surface ---------------------------------------------------------------------

    def checkpoint_saved(self, step: int, path: str | None = None, when: float | None = None) -> None:
        """Note a checkpoint (a writer's ``checkpoint_save`` events are noted by themselves)."""
        self.saves.append(Checkpoint(int(step), path, time.time() if when is None else when))

    def agree(self) -> GroupState:
        """The group's state now, without waiting (a collective: call it on every rank). For
        trainers that stop rather than wait (``GRPOMonitorCallback(on_red_card="stop")``)."""
        if self._group is None:  # the process group exists only once the trainer made it
            self._group = _Group(self.group)
        return GroupState(*self._group.max(list(self.watcher.times()[:3])))

    def paused(self) -> bool:
        return self.agree().paused

    def last_healthy(self, before: float) -> Checkpoint | None:
        """The newest checkpoint this rank noted before ``before`` (unix seconds)."""
        healthy = [c for c in self._checkpoints() if c.time < before]
        return healthy[-1] if healthy else None

    def check(self, step: int) -> ResumeDecision | None:
        """None when the run goes on (the usual case: one stat and one tiny all-reduce). While a
        red card holds the run, block on every rank until a person resumes it, then return
        what they agreed on."""
        if step % self.every:
            return None
        state = self.agree()
        if not state.paused:
            return None
        return self._wait(int(step), state.healthy_before)

    # -- internals ---------------------------------------------------------------------------

    def _wait(self, step: int, healthy_before: float) -> ResumeDecision:
        record = dict(self.watcher.record or {})
        started = time.monotonic()
        group = self._group
        assert group is not None
        if record:  # the ranks that hold the record say so; the others wait quietly
            _log.warning("training paused by red card %s at step %d; run `grpo-monitor resume %s` "
                         "to continue", record.get("alertname"), step, record.get("run") or
                         os.path.basename(os.path.dirname(self.watcher.path)))
        if self.writer is not None:
            self.writer.mark("paused", alertname=record.get("alertname"))
        while True:
            self.sleep(self.poll_interval)
            state = self.agree()
            healthy_before = max(healthy_before, state.healthy_before)
            if not state.paused:
                break
        if self.writer is not None:
            self.writer.mark("resumed")
        record = dict(self.watcher.record or {})
        target_step, path = self._rollback(state.resumed_at, healthy_before)
        if group.rank == 0 or record:
            _log.warning("training resumed at step %d (%s)", step,
                         f"rolling back to the checkpoint of step {target_step}"
                         if target_step is not None else "no rollback")
        return ResumeDecision(record, step, target_step, path, time.monotonic() - started)

    def _checkpoints(self) -> list[Checkpoint]:
        own = self.writer.checkpoints if self.writer is not None else []
        return sorted([*own, *self.saves], key=lambda c: (c.time, c.step))

    def _rollback(self, resumed_at: float, healthy_before: float) -> tuple[int | None, str | None]:
        group = self._group
        assert group is not None
        # The choice of the newest resume record, wherever it lies: ranks that hold an older
        # record (or none) offer -inf to the maximum.
        _, local_resumed, _, local_mode = self.watcher.times()
        mine = local_mode if local_resumed >= resumed_at and local_resumed > 0 else -math.inf
        mode = group.max([mine])[0]
        saves = self._checkpoints()
        if mode == _ROLLBACK_NONE or mode == -math.inf:
            candidate = -1.0
        elif mode == _ROLLBACK_LAST_HEALTHY:
            healthy = self.last_healthy(healthy_before)
            candidate = float(healthy.step) if healthy else -1.0
        else:
            candidate = mode  # the step a person named: every rank agrees on it already
        step = group.max([candidate])[0]
        if step < 0:
            if mode == _ROLLBACK_LAST_HEALTHY and group.rank == 0:
                _log.warning("no checkpoint was saved before the red card's onset: nothing to roll "
                             "back to; going on from here")
            return None, None
        target = int(step)
        paths = [c.path for c in saves if c.step == target and c.path]
        # The rank that saved it tells the others where it lies (with DDP only rank 0 saves).
        holder = group.max([float(group.rank) if paths else -1.0])[0]
        path = group.share(paths[-1] if paths else None, int(holder)) if holder >= 0 else None
        return target, path

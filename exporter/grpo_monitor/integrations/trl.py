"""Feed a TRL ``GRPOTrainer`` run into grpo-monitor: a ``transformers.TrainerCallback``.

    from grpo_monitor.integrations.trl import GRPOMonitorCallback

    trainer = GRPOTrainer(..., callbacks=[GRPOMonitorCallback("/data/snapshots")])

Every ``on_log`` of the world's main process becomes one record of
``<snapshot_dir>/<run>/rank-0.jsonl`` at ``state.global_step``. TRL's keys whose meaning is
clear are written under their canonical names (``reward`` -> ``reward/mean``, ``kl`` ->
``kl/mean``, ...: ``TRL_KEYS``, translated by grpo_monitor.contract.keys), so the files describe
themselves; every other numeric key (per reward function ``rewards/<name>/mean``,
``clip_ratio/low_mean``, ...) is written as it is, and the exporter maps or exports it
generically. A checkpoint save is logged as a ``checkpoint_save`` event. Nothing here ever
raises into training.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from transformers import (
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from grpo_monitor.contract.control import read_control
from grpo_monitor.contract.keys import canonical_key
from grpo_monitor.contract.run_layout import (
    MAX_CONTROL_BYTES,
    ROLLBACK_TARGET,
    run_name_from,
    write_control_file,
)
from grpo_monitor.contract.safe_io import read_regular
from grpo_monitor.sdk.pause import PauseGate, rollback_mode
from grpo_monitor.sdk.writer import SnapshotWriter

__all__ = ["TRL_KEYS", "TRL_NAMES", "GRPOMonitorCallback", "map_trl_logs", "rollback_checkpoint"]

_log = logging.getLogger("grpo_monitor.integrations.trl")


# The names a TRL GRPOTrainer (and the transformers Trainer under it) logs at every step whose
# meaning is clear. Only these are renamed in the file; other names (vLLM's sampling/*, per reward
# function rewards/*) are written as TRL logged them, so the file describes TRL's run.
TRL_NAMES: tuple[str, ...] = (
    "reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "completions/mean_length",
    "completions/max_length", "completions/clipped_ratio", "clip_ratio/region_mean", "step_time",
    "grad_norm", "learning_rate", "loss",
    # use_liger_kernel=True: the Liger GRPO loss logs the clipped share as one bare clip_ratio.
    "clip_ratio")
# The canonical key each becomes: keys.py's translation, the exporter's. A name keys.py stopped
# knowing would be written as TRL logged it (a test checks that none is), never an import error
# in the user's training job.
TRL_KEYS: dict[str, str] = {name: key for name in TRL_NAMES if (key := canonical_key(name)) is not None}
# Bookkeeping of the Trainer, not training signals.
_SKIP = frozenset({"epoch", "step", "total_flos"})
# The Trainer's last on_log is a summary of the whole run, not a step.
_SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second"})
_PERF_KEY = "perf/step_time_s"


def _number(value: Any) -> float | None:
    """A log value as a float, or None when it is no number (a string, a list, None)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    item = getattr(value, "item", None)  # 0-d tensors, numpy scalars
    if item is not None:
        try:
            out = item()
        except Exception:  # noqa: BLE001 -- a tensor with several elements, or a broken one
            return None
        return float(out) if isinstance(out, (int, float)) else None
    return None


def map_trl_logs(logs: Mapping[str, Any]) -> dict[str, float]:
    """TRL's ``on_log`` dict as snapshot metrics: the names of ``TRL_KEYS`` under their
    canonical keys, other numeric names as they are (the exporter maps those keys.py knows when
    it reads them); non-numeric values and ``None`` (TRL's "no valid value this step") are left
    out. NaN and +-Inf pass through: they are signals."""
    out: dict[str, float] = {}
    passthrough: dict[str, float] = {}
    for name, raw in logs.items():
        if not isinstance(name, str) or name in _SKIP:
            continue
        number = _number(raw)
        if number is None:
            continue
        key = TRL_KEYS.get(name)
        if key is None:
            passthrough[name] = number
        else:
            out[key] = number
    for name, number in passthrough.items():
        out.setdefault(name, number)  # a translated key wins over a same-named raw one
    return out


def _run_name(args: TrainingArguments) -> str:
    return run_name_from(str(getattr(args, "run_name", None) or os.path.basename(
        os.path.normpath(str(getattr(args, "output_dir", None) or "")))))


def write_rollback(snapshot_dir: str, run: str, step: int, path: str, alertname: str | None,
                   healthy_before: float) -> None:
    """``<run>/.grpo-rollback.json``: where to roll back to after this red card (atomic)."""
    when = datetime.fromtimestamp(healthy_before, timezone.utc).isoformat(timespec="milliseconds")
    write_control_file(Path(snapshot_dir) / run / ROLLBACK_TARGET, (json.dumps(
        {"step": step, "checkpoint": path, "alertname": alertname,
         "healthy_before": when.replace("+00:00", "Z")}) + "\n").encode())


def rollback_checkpoint(snapshot_dir: str | os.PathLike[str], run: str) -> str | None:
    """The checkpoint a relaunched run goes on from, after a red card stopped it and a person
    ran ``grpo-monitor resume``: pass it to ``trainer.train(resume_from_checkpoint=...)``.

    The last healthy checkpoint by default, the one of ``resume --rollback-to STEP``, or None
    (``--no-rollback``, or no card ever stopped the run: resume as you normally would). A run
    still paused raises ``RuntimeError``: a person has not looked yet."""
    record = read_control(snapshot_dir, run)
    if record is None:
        return None
    if record.state == "paused":
        raise RuntimeError(f"run {run!r} is still paused by red card {record.alertname}; run "
                           f"`grpo-monitor resume {run}` first")
    mode = rollback_mode(record.model_dump())
    try:
        # safe_io: a FIFO or a link in its place is refused (an OSError), never waited on.
        saved = json.loads(read_regular(snapshot_dir, Path(snapshot_dir) / run / ROLLBACK_TARGET,
                                        MAX_CONTROL_BYTES))
    except FileNotFoundError:
        saved = None
    if mode < 0:  # "none", or the last healthy checkpoint
        return saved["checkpoint"] if saved and mode != -2 else None
    if saved is None:
        raise RuntimeError(f"run {run!r}: no checkpoint folder known to find step {int(mode)} in")
    return os.path.join(os.path.dirname(saved["checkpoint"]), f"checkpoint-{int(mode)}")


class GRPOMonitorCallback(TrainerCallback):
    """Write a TRL (or any ``transformers.Trainer``) run's logs as grpo-monitor snapshots.

    ``run`` defaults to ``args.run_name``, else the name of ``args.output_dir``. Only the
    world's main process writes its logs (TRL gathers the signals across processes before it
    logs). With ``per_rank_perf=True`` every other process writes its own step time to its own
    ``rank-<N>.jsonl``, which lets the exporter spot a straggling or stalled rank.
    """

    def __init__(self, snapshot_dir: str | os.PathLike[str], run: str | None = None, *,
                 per_rank_perf: bool = False, on_red_card: str = "stop",
                 pause_poll_interval: float = 1.0) -> None:
        if on_red_card not in ("stop", "wait", "ignore"):
            raise ValueError(f"on_red_card must be 'stop', 'wait' or 'ignore', not {on_red_card!r}")
        self.snapshot_dir = os.fspath(snapshot_dir)
        self.run = run
        self.per_rank_perf = per_rank_perf
        self.on_red_card = on_red_card
        self.writer: SnapshotWriter | None = None
        self.pause_poll_interval = pause_poll_interval
        self.gate: PauseGate | None = None  # made at the first step: the run's name is known then
        self._mark = time.time()  # end of the last step / log: a save's duration starts there
        self._warned = False

    # -- transformers callback events -------------------------------------------------------

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        self._guard(self._open, args, state)

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        self._mark = time.time()
        if self.on_red_card != "ignore":
            self._guard(self._check_red_card, args, state, control)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self._guard(self._on_log, args, state, logs)
        self._mark = time.time()

    def on_evaluate(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        self._mark = time.time()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        self._guard(self._on_save, args, state)

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        # transformers calls this only when train() returns, never when it raises: the
        # run_end written here is a clean end (a red card's "stop" included: the run stopped
        # on purpose). A crash leaves the end unmarked, and its silence raises GRPORunHung.
        self._guard(self.close, True, int(state.global_step))

    # -- internals ---------------------------------------------------------------------------

    def close(self, end: bool = False, step: int | None = None) -> None:
        """Close the snapshot file; a later training opens it again. ``end``: mark the run as
        finished (a ``run_end`` event at ``step``), as ``on_train_end`` does."""
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close(end=end, step=step)

    def _writes(self, state: TrainerState) -> bool:
        return bool(state.is_world_process_zero) or self.per_rank_perf

    def _open(self, args: TrainingArguments, state: TrainerState) -> SnapshotWriter | None:
        if self.writer is None and self._writes(state):
            # framework: the exporter's coverage card says why a TRL run lacks a curve. TRL's
            # own names are no typos of the user's: the exporter and `grpo-monitor check` name
            # the ones that map to no signal.
            self.writer = SnapshotWriter(
                self.snapshot_dir, self.run or _run_name(args),
                rank=int(getattr(args, "process_index", 0) or 0),
                world_size=int(getattr(args, "world_size", 1) or 1),
                framework="trl", warn_unknown_keys=False)
            if getattr(args, "beta", None) == 0 and state.is_world_process_zero:
                _log.warning("grpo_monitor: beta is 0 (GRPOConfig's default), so TRL logs no KL and "
                             "no KL card can fire on this run (GRPOSignalMissing says so); set "
                             "beta > 0 to log kl and anchor the policy")
        return self.writer

    def _on_log(self, args: TrainingArguments, state: TrainerState,
                logs: Mapping[str, Any] | None) -> None:
        if not logs or not self._writes(state) or _SUMMARY_KEYS.intersection(logs):
            return
        metrics = map_trl_logs(logs)
        if not state.is_world_process_zero:
            metrics = {k: v for k, v in metrics.items() if k == _PERF_KEY}
        writer = self._open(args, state)
        if metrics and writer is not None:
            writer.log(metrics, int(state.global_step))

    def _on_save(self, args: TrainingArguments, state: TrainerState) -> None:
        # Every process notes the save: any of them may have to name the rollback target.
        ckpt = getattr(args, "output_dir", None)
        self._gate(args).checkpoint_saved(
            int(state.global_step),
            os.path.join(str(ckpt), f"checkpoint-{state.global_step}") if ckpt else None)
        writer = self._open(args, state)
        if writer is None:
            return
        now = time.time()
        step = int(state.global_step)
        event = {"type": "checkpoint_save", "step": step, "time": now,
                 "duration_s": round(max(now - self._mark, 0.0), 3)}
        ckpt = getattr(args, "output_dir", None)
        if ckpt:
            event["path"] = os.path.join(str(ckpt), f"checkpoint-{step}")
        writer.log({}, step, events=[event], timestamp=now)

    def _gate(self, args: TrainingArguments) -> PauseGate:
        if self.gate is None:
            self.gate = PauseGate(run_dir=os.path.join(self.snapshot_dir, self.run or _run_name(args)),
                                  poll_interval=self.pause_poll_interval)
        return self.gate

    def last_healthy_checkpoint(self, before: float) -> tuple[int, str] | None:
        """The newest checkpoint saved before ``before`` (unix seconds; the control record's
        ``healthy_before``, else the card's onset)."""
        found = self.gate.last_healthy(before) if self.gate is not None else None
        return (found.step, found.path) if found is not None and found.path else None

    def _check_red_card(self, args: TrainingArguments, state: TrainerState,
                        control: TrainerControl) -> None:
        # Every process asks at the same step, and the answer is the same on all of them (one
        # tiny all-reduce through accelerate's process group): all stop at this step, or none.
        gate = self._gate(args)
        run = self.run or _run_name(args)
        group = gate.agree()
        if not group.paused:
            return
        # A process whose folder lacks the record learnt of the card from another one.
        alertname = (gate.watcher.record or {}).get("alertname") or "(seen on another process)"
        target = self.last_healthy_checkpoint(group.healthy_before)
        if target is not None:
            # transformers never rotates away state.best_model_checkpoint (save_total_limit):
            # pointing it at the rollback target keeps the last healthy checkpoint on disk.
            state.best_model_checkpoint = target[1]
            if state.is_world_process_zero:
                write_rollback(self.snapshot_dir, run, target[0], target[1], alertname, group.healthy_before)
        if self.on_red_card == "stop" or state.is_world_process_zero:
            _log.warning("grpo_monitor: red card %s for run %s at step %s; last healthy checkpoint: "
                         "%s; %s", alertname, run, state.global_step,
                         target[1] if target else "none", "saving and stopping"
                         if self.on_red_card == "stop" else "waiting for `grpo-monitor resume`")
        if self.on_red_card == "stop":
            control.should_save = True
            control.should_training_stop = True
            return
        if self.writer is not None:
            self.writer.mark("paused", alertname=alertname)
        decision = gate.check(int(state.global_step))  # waits, every process together
        if self.writer is not None:
            self.writer.mark("resumed")
        if decision is not None and decision.rollback_step is not None:
            # transformers cannot rewind its loop (data order, epoch, step) in place: stop here
            # without saving the sick weights; the relaunch goes on from the chosen checkpoint,
            # rollback_checkpoint(snapshot_dir, run) tells it which.
            control.should_training_stop = True

    def _guard(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 -- monitoring must never stop training
            if not self._warned:
                self._warned = True
                _log.warning("grpo_monitor: the TRL callback failed (%r); training goes on, "
                             "further failures are not reported", exc, exc_info=True)
            return None


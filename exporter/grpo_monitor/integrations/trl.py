"""Feed a TRL ``GRPOTrainer`` run into grpo-monitor: a ``transformers.TrainerCallback``.

    from grpo_monitor.integrations.trl import GRPOMonitorCallback

    trainer = GRPOTrainer(..., callbacks=[GRPOMonitorCallback("/data/snapshots")])

Every ``on_log`` of the world's main process becomes one record of
``<snapshot_dir>/<run>/rank-0.jsonl`` at ``state.global_step``. TRL's keys whose meaning is
clear are written under their canonical names (``reward`` -> ``reward/mean``, ``kl`` ->
``kl/mean``, ...), so the files describe themselves; every other numeric key (per reward
function ``rewards/<name>/mean``, ``clip_ratio/low_mean``, ...) is written as it is and exported
generically. A checkpoint save is logged as a ``checkpoint_save`` event. Nothing here ever
raises into training.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import (
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from grpo_monitor.control import ControlRecord, control_path, read_control
from grpo_monitor.sdk.writer import SnapshotWriter

ROLLBACK_FILE = ".grpo-rollback.json"  # the last healthy checkpoint, once a red card fired

__all__ = ["TRL_KEYS", "GRPOMonitorCallback", "map_trl_logs"]

_log = logging.getLogger("grpo_monitor.integrations.trl")

# TRL GRPOTrainer / transformers Trainer log key -> canonical key (grpo_monitor.keys). Only
# keys whose meaning is the canonical one; the rest are written as they are.
TRL_KEYS: dict[str, str] = {
    "reward": "reward/mean",
    "reward_std": "reward/std",
    "frac_reward_zero_std": "group/zero_std_frac",
    "kl": "kl/mean",
    "entropy": "entropy/mean",
    "completions/mean_length": "response/len_mean",
    "completions/max_length": "response/len_max",
    "completions/clipped_ratio": "response/clip_ratio",
    "clip_ratio/region_mean": "policy/clip_frac",
    "step_time": "perf/step_time_s",
    "grad_norm": "grad/norm",
    "learning_rate": "train/lr",
    "loss": "loss",
}
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
    """TRL's ``on_log`` dict as snapshot metrics: canonical keys where the meaning is clear,
    other numeric keys as they are; non-numeric values and ``None`` (TRL's "no valid value this
    step") are left out. NaN and +-Inf pass through: they are signals."""
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
    name = getattr(args, "run_name", None) or os.path.basename(
        os.path.normpath(str(getattr(args, "output_dir", None) or ""))) or "default"
    name = re.sub(r"[/\\]+", "-", str(name)).strip()
    if name in ("", ".", ".."):
        name = "default"
    return name[:128]


def _parse_time(rfc3339: str) -> float | None:
    from datetime import datetime

    try:
        return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def write_rollback(snapshot_dir: str, run: str, step: int, path: str, record: ControlRecord) -> None:
    """``<run>/.grpo-rollback.json``: where to roll back to after this red card (atomic)."""
    target = Path(snapshot_dir) / run / ROLLBACK_FILE
    tmp = target.with_name(ROLLBACK_FILE + ".tmp")
    tmp.write_text(json.dumps({"step": step, "checkpoint": path, "alertname": record.alertname,
                               "onset": record.onset, "fingerprint": record.fingerprint}) + "\n")
    os.replace(tmp, target)


class GRPOMonitorCallback(TrainerCallback):
    """Write a TRL (or any ``transformers.Trainer``) run's logs as grpo-monitor snapshots.

    ``run`` defaults to ``args.run_name``, else the name of ``args.output_dir``. Only the
    world's main process writes its logs (TRL gathers the signals across processes before it
    logs). With ``per_rank_perf=True`` every other process writes its own step time to its own
    ``rank-<N>.jsonl``, which lets the exporter spot a straggling or stalled rank.
    """

    def __init__(self, snapshot_dir: str | os.PathLike[str], run: str | None = None, *,
                 per_rank_perf: bool = False, on_red_card: str = "stop") -> None:
        if on_red_card not in ("stop", "wait", "ignore"):
            raise ValueError(f"on_red_card must be 'stop', 'wait' or 'ignore', not {on_red_card!r}")
        self.snapshot_dir = os.fspath(snapshot_dir)
        self.run = run
        self.per_rank_perf = per_rank_perf
        self.on_red_card = on_red_card
        self.writer: SnapshotWriter | None = None
        self.saves: list[tuple[int, str, float]] = []  # (step, checkpoint path, unix time)
        self._control_sig: tuple[int, int, int] | None = None
        self._control: ControlRecord | None = None
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
            self.writer = SnapshotWriter(
                self.snapshot_dir, self.run or _run_name(args),
                rank=int(getattr(args, "process_index", 0) or 0),
                world_size=int(getattr(args, "world_size", 1) or 1))
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
            self.saves.append((step, event["path"], now))
        writer.log({}, step, events=[event], timestamp=now)

    def _paused(self, args: TrainingArguments) -> ControlRecord | None:
        # Every process looks (one stat a step): all must stop at the same step, or the others
        # hang in the next collective.
        path = control_path(self.snapshot_dir, self.run or _run_name(args))
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._control_sig = self._control = None
            return None
        sig = (st.st_mtime_ns, st.st_size, st.st_ino)
        if sig != self._control_sig:
            self._control_sig = sig
            self._control = read_control(self.snapshot_dir, self.run or _run_name(args))
        return self._control if self._control is not None and self._control.state == "paused" else None

    def last_healthy_checkpoint(self, onset: str | None) -> tuple[int, str] | None:
        """The newest checkpoint saved before the red card's onset: the rollback target."""
        cutoff = _parse_time(onset) if onset else None
        healthy = [(step, path) for step, path, t in self.saves if cutoff is None or t < cutoff]
        return healthy[-1] if healthy else None

    def _check_red_card(self, args: TrainingArguments, state: TrainerState,
                        control: TrainerControl) -> None:
        record = self._paused(args)
        if record is None:
            return
        target = self.last_healthy_checkpoint(record.onset)
        if target is not None:
            # transformers never rotates away state.best_model_checkpoint (save_total_limit):
            # pointing it at the rollback target keeps the last healthy checkpoint on disk.
            state.best_model_checkpoint = target[1]
            if state.is_world_process_zero:
                write_rollback(self.snapshot_dir, self.run or _run_name(args), target[0], target[1],
                               record)
        _log.warning("grpo_monitor: red card %s for run %s at step %s; last healthy checkpoint: %s; %s",
                     record.alertname, self.run or _run_name(args), state.global_step,
                     target[1] if target else "none", "saving and stopping"
                     if self.on_red_card == "stop" else "waiting for `grpo-monitor resume`")
        if self.on_red_card == "stop":
            control.should_save = True
            control.should_training_stop = True
            return
        if self.writer is not None:
            self.writer.wait_if_paused()
        else:
            while self._paused(args) is not None:
                time.sleep(1.0)

    def _guard(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 -- monitoring must never stop training
            if not self._warned:
                self._warned = True
                _log.warning("grpo_monitor: the TRL callback failed (%r); training goes on, "
                             "further failures are not reported", exc, exc_info=True)
            return None


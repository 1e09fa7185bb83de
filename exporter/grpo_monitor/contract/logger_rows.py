"""A logger's row as a snapshot record: where its step and time are, which fields are no metric.

The frameworks' own JSONL files and a Hugging Face ``trainer_state.json`` hold the dict the
trainer logged, with the step under a name of their own (docs/loggers.md):

* prime-rl, the Tinker cookbook, ART, EasyR1: ``step`` (EasyR1 nests its metrics: the record
  parser flattens them with ``/``);
* ms-swift's ``logging.jsonl``: ``"global_step/max_steps": "12/500"``;
* LLaMA-Factory's ``trainer_log.jsonl``: ``current_steps``;
* ``trainer_state.json``: its ``log_history``, one entry per logging step and one per
  evaluation, both under ``step``.

They also hold text that is no metric and no error (``"elapsed_time": "0:01:02"``,
``"percentage": "12%"``): left out, as a logger's display fields, not counted as bad values.
Numbers written as text stay numbers. Standard library only.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

__all__ = ["as_snapshot_row", "trainer_state_rows"]

# Names under which a framework's row carries its step, first found wins.
_STEP_FIELDS = ("step", "_step", "global_step", "current_steps", "training_step")
_SWIFT_STEP = "global_step/max_steps"
# Fields that say when the row was written, as epoch seconds or ISO text (ART's recorded_at).
_TIME_FIELDS = ("time", "_timestamp", "timestamp", "recorded_at")
# Bookkeeping of the frameworks' rows: no signal of the run.
_NOT_METRICS = frozenset({"total_steps", "max_steps", "training_step", "current_steps",
                          "recorded_at", _SWIFT_STEP})


def _number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return False
        return True
    return isinstance(value, dict)  # nested metrics, flattened by the record parser


def _step_of(row: dict[str, Any]) -> int | None:
    for name in _STEP_FIELDS:
        value = row.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    text = row.get(_SWIFT_STEP)
    if isinstance(text, str) and "/" in text:
        head = text.split("/", 1)[0].strip()
        if head.isdigit():
            return int(head)
    return None


def _time_of(row: dict[str, Any]) -> float | None:
    for name in _TIME_FIELDS:
        value = row.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value).timestamp()
            except ValueError:
                continue
    return None


def as_snapshot_row(row: Any) -> Any:
    """A framework JSONL row as a flat snapshot record (``{"step", "time", <metric>: value}``);
    anything that is no JSON object, or an object with no step, is handed back as it is, for
    the record parser to count."""
    if not isinstance(row, dict) or "metrics" in row or ("data" in row and "step" in row):
        return row  # a snapshot record of ours, or verl's file logger: read as they are
    step = _step_of(row)
    if step is None:
        return row
    out: dict[str, Any] = {"step": step}
    when = _time_of(row)
    if when is not None:
        out["time"] = when
    for name, value in row.items():
        if name in _STEP_FIELDS or name in _TIME_FIELDS or name in _NOT_METRICS:
            continue
        if _number(value):
            out[name] = value
    return out


def trainer_state_rows(state: Any) -> list[dict[str, Any]]:
    """A ``trainer_state.json``'s log, one flat record a step (its training and evaluation
    entries of one step merged), in step order; [] when it holds none."""
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        return []
    by_step: dict[int, dict[str, Any]] = {}
    for entry in history:
        row = as_snapshot_row(entry)
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row is not entry:
            by_step.setdefault(row["step"], {}).update(row)
    return [by_step[s] for s in sorted(by_step)]

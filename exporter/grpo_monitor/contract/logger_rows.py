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
Numbers written as text stay numbers.

A CSV file of metrics (``csv_table``) comes in three shapes:

* W&B's "Export CSV" of a panel: ``"Step","<run> - <key>","<run> - <key>__MIN",...``, one file
  per panel: the run's name before `` - ``, the ``__MIN`` and ``__MAX`` columns left out;
* a long table, one value a row: ``run_name,metric,step,value`` (``run`` or no run column,
  ``key`` or ``name`` for the metric);
* a wide table, one step a row: a step column (``step``, ``global_step``, ``update``,
  ``iteration``...) and a column per metric, as loops write them.

NeMo-RL's ``train_data_step<N>.jsonl`` holds one row a sample of step N (``StepSamples``): the
step's record is their aggregate.

Standard library only.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["CsvTable", "StepSamples", "as_snapshot_row", "csv_table", "log_rows",
           "trainer_state_rows"]

# Names under which a framework's row carries its step, first found wins.
_STEP_FIELDS = ("step", "_step", "global_step", "current_steps", "training_step")
_SWIFT_STEP = "global_step/max_steps"
# Fields that say when the row was written, as epoch seconds or ISO text (ART's recorded_at).
_TIME_FIELDS = ("time", "_timestamp", "timestamp", "recorded_at")
# Bookkeeping of the frameworks' rows: no signal of the run.
_NOT_METRICS = frozenset({"total_steps", "max_steps", "training_step", "current_steps",
                          "recorded_at", _SWIFT_STEP})


def _finite(value: Any) -> float | None:
    """A number as a finite float; None for anything else: a bool, NaN, ±inf, and an integer
    beyond float's range (JSON's integers have no bound: float() raises OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _mean(values: list[float]) -> float:
    """The mean of finite floats, finite however near float's max (fmean's sum would overflow)."""
    try:
        return statistics.fmean(values)
    except OverflowError:
        return float(statistics.mean(values))  # exact, as fractions


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
        if (when := _finite(value)) is not None:
            return when
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value).timestamp()
            except (ValueError, OverflowError):  # OverflowError: past the calendar's ends
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


def log_rows(document: Any) -> list[dict[str, Any]] | None:
    """A whole log in one JSON document as flat records, one a step in step order: a Hugging
    Face ``trainer_state.json`` (its ``log_history``, under any file name), or a list of step
    rows. None when the document is no such log (a single record); [] for a log none of whose
    entries has a step."""
    if isinstance(document, dict) and isinstance(document.get("log_history"), list):
        return trainer_state_rows(document)
    if isinstance(document, list) and document and all(isinstance(e, dict) for e in document):
        rows = _merged_by_step(document)
        return rows or None  # no step anywhere: read (and refused) as one record
    return None


def trainer_state_rows(state: Any) -> list[dict[str, Any]]:
    """A ``trainer_state.json``'s log, one flat record a step (its training and evaluation
    entries of one step merged), in step order; [] when it holds none."""
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        return []
    return _merged_by_step(history)


def _merged_by_step(history: list[Any]) -> list[dict[str, Any]]:
    by_step: dict[int, dict[str, Any]] = {}
    for entry in history:
        row = as_snapshot_row(entry)
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row is not entry:
            by_step.setdefault(row["step"], {}).update(row)
    return [by_step[s] for s in sorted(by_step)]


# run name (None: the file names none) -> step -> metric -> value
CsvTable = dict[str | None, dict[int, dict[str, float]]]
_CSV_STEPS = ("step", "_step", "global_step", "steps", "update", "iteration", "iter",
              "training_step", "current_steps", "trainer/global_step")
_CSV_RUNS = ("run_name", "run", "name")
_CSV_KEYS = ("metric", "key", "name", "tag")
# W&B's export: each value column comes with its min and max over the bucket, and a step column.
_WANDB_EXTRA = ("__MIN", "__MAX", "__step")
_WANDB_RUN_SEP = " - "


def _csv_number(cell: str) -> float | None:
    cell = cell.strip()
    if not cell:
        return None
    try:
        return float(cell)
    except ValueError:
        return None


def _csv_step(cell: str) -> int | None:
    value = _csv_number(cell)
    if value is None or not math.isfinite(value) or not value.is_integer() or value < 0:
        return None
    return int(value)


def _csv_rows(text: str) -> Iterator[list[str]]:
    """The rows of a CSV text; a row the csv module refuses (a cell over its field size limit)
    is left out, not the rest of the file. ``newline=""``, as the csv module asks: a carriage
    return ends a row, or stays in a quoted cell, and is no error in an unquoted one."""
    reader = csv.reader(io.StringIO(text, newline=""))
    while True:
        try:
            yield next(reader)
        except StopIteration:
            return
        except csv.Error:
            continue


def csv_table(text: str) -> CsvTable | None:
    """The metrics of a CSV file by run and step; None when the file is no such table (no step
    column in its header): a CSV of anything else is none of ours. Cells that are no number
    (a timestamp, a word) and rows without a step are left out."""
    rows = _csv_rows(text.removeprefix("\ufeff"))  # a BOM (Excel's UTF-8 export): no name's part
    header = next(rows, None)
    if not header:
        return None
    lower = [h.strip().lower() for h in header]
    step_col = next((lower.index(n) for n in _CSV_STEPS if n in lower), None)
    if step_col is None:
        return None
    table: CsvTable = {}
    key_col = next((lower.index(n) for n in _CSV_KEYS if n in lower), None)
    if key_col is not None and "value" in lower:
        run_col = next((lower.index(n) for n in _CSV_RUNS if n in lower and lower.index(n) != key_col), None)
        value_col = lower.index("value")
        for row in rows:
            if len(row) <= max(step_col, key_col, value_col):
                continue
            step, value = _csv_step(row[step_col]), _csv_number(row[value_col])
            key = row[key_col].strip()
            if step is None or value is None or not key:
                continue
            run = row[run_col].strip() or None if run_col is not None and run_col < len(row) else None
            table.setdefault(run, {}).setdefault(step, {})[key] = value
        return table
    columns: list[tuple[int, str | None, str]] = []
    for i, name in enumerate(header):
        if i == step_col or name.endswith(_WANDB_EXTRA) or not name.strip():
            continue
        run, sep, key = name.partition(_WANDB_RUN_SEP)
        columns.append((i, run.strip(), key.strip()) if sep else (i, None, name.strip()))
    for row in rows:
        if len(row) <= step_col:
            continue
        step = _csv_step(row[step_col])
        if step is None:
            continue
        for i, run, key in columns:
            if i < len(row) and (value := _csv_number(row[i])) is not None:
                table.setdefault(run, {}).setdefault(step, {})[key] = value
    return table


def _sample_number(value: Any) -> float | None:
    """A per-sample scalar: a number, or the one-element list a batch sliced a sample at a time
    gives (NeMo-RL's rows)."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return _finite(value)


def _flat(value: Any) -> list[Any]:
    """A per-token list (``[[...]]`` or ``[...]``) as one flat list; [] for anything else."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
        value = value[0]
    return value if isinstance(value, list) else []


@dataclass
class StepSamples:
    """One step's samples, as NeMo-RL logs them (``train_data_step<N>.jsonl``, a row a sample:
    ``rewards``, ``advantages`` and ``token_loss_mask`` among token ids and text), folded into
    the step's record as they are read:

    * ``rewards``: the step's reward mean, standard deviation (of the batch, ddof 0), min, max and
      quartiles with the 95th percentile (linear interpolation, as numpy's default);
    * ``token_loss_mask``: a sample's response length is the tokens the loss reads (its mask's
      sum): the length's mean and max;
    * ``advantages``: the share of samples whose advantages are all zero, the share of groups
      whose rewards were all equal when groups are the same size (GRPO's advantage is the reward
      less its group's mean).

    Fields it does not know (token ids, log-probabilities, text) are left out, not counted."""

    rewards: list[float] = field(default_factory=list)
    lengths: list[float] = field(default_factory=list)
    with_advantages: int = 0
    zero_advantages: int = 0
    samples: int = 0

    def add(self, row: Any) -> bool:
        """Fold one sample in; False when the row is no sample (no JSON object)."""
        if not isinstance(row, dict):
            return False
        self.samples += 1
        if (reward := _sample_number(row.get("rewards"))) is not None:
            self.rewards.append(reward)
        mask = _flat(row.get("token_loss_mask"))
        if mask and all(isinstance(m, (int, float)) and not isinstance(m, bool) for m in mask):
            if (length := _finite(sum(mask))) is not None:  # no length of inf, NaN, 10**400
                self.lengths.append(length)
        advantages = row.get("advantages")
        if (one := _sample_number(advantages)) is not None:
            values: list[Any] = [one]
        else:
            values = _flat(advantages)
        if values and all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in values):
            self.with_advantages += 1
            self.zero_advantages += all(a == 0 for a in values)
        return True

    def row(self, step: int) -> dict[str, Any]:
        """The step's record: ``{"step", <canonical key>: value}``."""
        out: dict[str, Any] = {"step": step}
        if self.rewards:
            r = self.rewards
            out |= {"reward/mean": _mean(r), "reward/std": statistics.pstdev(r),
                    "reward/min": min(r), "reward/max": max(r)}
            if len(r) > 1:
                cuts = statistics.quantiles(r, n=100, method="inclusive")
                # Rewards near float's max overflow the interpolation: such a cut is left out.
                for name, at in (("reward/p25", 24), ("reward/p50", 49), ("reward/p75", 74),
                                 ("reward/p95", 94)):
                    if math.isfinite(cuts[at]):
                        out[name] = cuts[at]
        if self.lengths:
            out |= {"response/len_mean": _mean(self.lengths),
                    "response/len_max": max(self.lengths)}
        if self.with_advantages:
            out["group/zero_std_frac"] = self.zero_advantages / self.with_advantages
        return out

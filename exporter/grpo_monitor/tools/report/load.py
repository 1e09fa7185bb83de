"""A run's records, read back: every snapshot file of the run folder, in the order it was written.

Rank 0's records give the training signals, one set per step: when a step is logged twice, the
latest record wins (by its ``time``, then by the order the files were written in). Every rank
gives its ``perf/*`` signals, and its events (checkpoint saves). A run's timeline is the one the
exporter judges (docs/signals.md#a-runs-timeline): a rollback mark undoes the steps after its
``to_step``, a step older than the rank's newest the steps from it on; the undone steps are left
out and listed (``RunData.undone``). Lines that are not a record are skipped and counted. Files are opened through safe_io, the run folder being the tree: a link,
FIFO or device among them is skipped unread, and named on stderr.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from grpo_monitor.contract.run_layout import is_appended, run_files
from grpo_monitor.contract.safe_io import Refused, open_regular, printable
from grpo_monitor.contract.snapshot import (
    RecordError,
    as_text,
    decode_record,
    identity_from_path,
    parse_record,
)

log = logging.getLogger("grpo_monitor.report")


@dataclass
class RunData:
    run: str
    path: Path
    records: int = 0
    bad_lines: int = 0
    refused: list[Path] = field(default_factory=list)  # links, FIFOs, devices: not read
    # rank 0's training signals: step -> canonical key -> value (latest record per step wins)
    train: dict[int, dict[str, float]] = field(default_factory=dict)
    by_type: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)
    # per rank: step -> perf key -> value
    perf: dict[int, dict[int, dict[str, float]]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    # Rank 0's undone spans, in the order they were undone: (first undone step, last undone
    # step, the step the run went back to).
    undone: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return sorted(self.train)

    def series(self, key: str) -> np.ndarray:
        """``key``'s value at each logged step of rank 0, NaN where that step did not log it."""
        return np.array([self.train[s].get(key, math.nan) for s in self.steps], dtype=float)

    def has(self, key: str) -> bool:
        return any(key in m for m in self.train.values())


def load_run(run_dir: Path | str) -> RunData:
    """Every record of the run folder (all ranks, rotated segments, *.json), bad lines skipped."""
    run_dir = Path(run_dir)
    # The name goes into UTF-8 files: one that is not UTF-8 on disk is written escaped.
    data = RunData(run=as_text(run_dir.name), path=run_dir)
    latest: dict[int, tuple[float, int]] = {}  # step -> (time, order) of the record kept
    newest: dict[int, int] = {}  # rank -> its newest step
    order = 0

    def rewind(rank: int, keep_through: int) -> None:
        last = newest.get(rank)
        if last is None or keep_through >= last:
            return
        newest[rank] = keep_through
        perf = data.perf.get(rank, {})
        for step in [s for s in perf if s > keep_through]:
            del perf[step]
        if rank != 0:
            return
        gone = [s for s in data.train if s > keep_through]
        if gone:
            data.undone.append((min(gone), max(gone), keep_through))
        for step in gone:
            del data.train[step]
            data.by_type.pop(step, None)
            latest.pop(step, None)
    for path in run_files(run_dir):
        run, rank = identity_from_path(path, run_dir.parent)
        try:
            with open_regular(run_dir, path) as fh:
                mtime = os.fstat(fh.fileno()).st_mtime
                text = fh.read().decode("utf-8", errors="replace")
        except Refused as exc:
            data.refused.append(path)
            log.warning("%s: %s, not read", printable(path), exc.what)
            continue
        except OSError:
            continue
        if is_appended(path):
            raws = [ln for ln in text.splitlines() if ln.strip()]
        else:
            raws = [text]
        for raw in raws:
            try:
                obj = decode_record(raw)
                objs = obj if isinstance(obj, list) and not is_appended(path) else [obj]
                snaps = [parse_record(o, run=run, rank=rank, mtime=mtime) for o in objs]
            except RecordError:
                data.bad_lines += 1
                continue
            for snap in snaps:
                order += 1
                data.records += 1
                step_record = bool(snap.metrics or snap.unknown or snap.by_type)
                for ev in snap.events:
                    to_step = (ev.model_extra or {}).get("to_step") if ev.type == "rollback" else None
                    if isinstance(to_step, int) and not isinstance(to_step, bool) and to_step >= 0:
                        rewind(snap.rank, to_step)
                if step_record and is_appended(path):
                    if snap.step < newest.get(snap.rank, snap.step):
                        rewind(snap.rank, snap.step - 1)
                    newest[snap.rank] = max(newest.get(snap.rank, snap.step), snap.step)
                perf = {k: v for k, v in snap.metrics.items() if k.startswith("perf/")}
                if perf:
                    data.perf.setdefault(snap.rank, {}).setdefault(snap.step, {}).update(perf)
                for ev in snap.events:
                    data.events.append({"step": snap.step if ev.step is None else ev.step,
                                        "rank": snap.rank, "type": ev.type})
                train = {k: v for k, v in snap.metrics.items() if not k.startswith("perf/")}
                if snap.rank != 0 or not (train or snap.by_type):
                    continue
                key = (snap.time, order)
                if snap.step in latest and latest[snap.step] > key:
                    continue
                latest[snap.step] = key
                data.train[snap.step] = train
                if snap.by_type:
                    data.by_type[snap.step] = snap.by_type
                else:
                    data.by_type.pop(snap.step, None)
    return data

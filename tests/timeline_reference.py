"""What a store fed only a run's surviving records serves: the reference a run's timeline is held
to (tests/test_timeline.py, tests/test_abuse.py), computed apart from the store's rewinds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from grpo_monitor.runtime import exposition as ex
from grpo_monitor.runtime.store import RunStore

# Counters keep Prometheus semantics: they count what was read, undone or not.
COUNTERS = {ex.NONFINITE.name, ex.EVENTS.name}


def surviving(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records a fresh read keeps: per rank, a step record older than the newest undoes the
    step records from its step on; a rollback mark undoes those after its to_step. Marks
    themselves do not stand (they are no step)."""
    kept: list[dict[str, Any]] = []
    for rec in records:
        rank = rec.get("rank", 0)
        mine = [r for r in kept if r.get("rank", 0) == rank]
        newest = max((r["step"] for r in mine), default=None)
        back = next((e["to_step"] for e in rec.get("events", ()) if e["type"] == "rollback"), None)
        if back is None and newest is not None and rec["step"] < newest and rec.get("metrics"):
            back = rec["step"] - 1
        if back is not None:
            kept = [r for r in kept if r.get("rank", 0) != rank or r["step"] <= back]
        if rec.get("metrics"):
            kept.append(rec)
    return kept


def series_lines(store: RunStore) -> Iterator[tuple[str, str]]:
    """(family, line) of every series the store serves after a flush, counters left out."""
    store.flush()
    family = ""
    for chunk in store.render():
        for line in chunk.splitlines():
            if line.startswith("# TYPE "):
                family = line.split()[2]
            elif line and not line.startswith("#") and family not in COUNTERS:
                yield family, line

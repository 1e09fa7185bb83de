"""The shared real runs read from their raw files, as their frameworks wrote them.

Each run of the collection keeps its raw files (TensorBoard event files, W&B CSV exports,
framework JSONL, ``trainer_state.json``, loops' CSV tables) beside ``derived_steps.jsonl``, the
same steps as flat records. For every run whose raw files hold a format the exporter reads
(docs/loggers.md), the raw files read by the exporter's ingest give the store the same steps
with the same values as the derived records written as snapshots: the same series, so the same
cards. Runs logged only to stdout, notebooks or papers are not read (the exporter has no reader
for them) and are not compared.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import real_runs
from grpo_monitor.runtime.health import ExporterHealth
from grpo_monitor.runtime.ingest import Ingestor
from grpo_monitor.runtime.store import RunStore

# Files of the collection's own making, beside the raw ones.
_NOT_RAW = {real_runs.STEPS_FILE, "PROVENANCE.md"}
Steps = list[tuple[int, dict[str, float]]]


def applied(root: Path) -> dict[str, Steps]:
    """What the ingest hands the store, run by run: (step, canonical values), the records of
    one step merged (a row of evaluation after the row of training of the same step)."""
    store = RunStore()
    seen: dict[str, Steps] = {}
    apply = store.apply

    def tee(snap, wrote_at):  # type: ignore[no-untyped-def]
        steps = seen.setdefault(snap.run, [])
        if steps and steps[-1][0] == snap.step:
            steps[-1][1].update(snap.metrics)
        else:
            steps.append((snap.step, dict(snap.metrics)))
        return apply(snap, wrote_at)

    store.apply = tee  # type: ignore[method-assign]
    ingestor = Ingestor(root, store, ExporterHealth())
    ingestor.rescan()
    ingestor.loggers.flush_all()
    return {run: steps for run, steps in seen.items() if any(m for _, m in steps)}


def same(a: dict[str, float], b: dict[str, float]) -> bool:
    # float32 in an event file, written back as its shortest decimal: equal to 1e-6.
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and math.isnan(b[k])) or math.isclose(a[k], b[k], rel_tol=1e-6, abs_tol=1e-9)
        for k in a)


def test_runs_read_from_their_raw_files_give_the_steps_their_records_give(tmp_path: Path) -> None:
    compared, unread = [], []
    for folder in sorted(p for p in real_runs.runs_dir().iterdir() if p.is_dir()):
        raw = tmp_path / "raw" / folder.name
        raw.mkdir(parents=True)
        for path in folder.iterdir():
            if path.name not in _NOT_RAW:
                shutil.copy(path, raw / path.name)
        from_raw = applied(tmp_path / "raw")
        shutil.rmtree(tmp_path / "raw")
        if not from_raw:
            unread.append(folder.name)
            continue
        derived = tmp_path / "derived" / folder.name
        for run, records in real_runs.split_runs(real_runs.load(folder.name), folder.name).items():
            real_runs.write_snapshots(records, derived, run)
        from_records = applied(derived)
        shutil.rmtree(derived)
        for run, steps in from_records.items():
            # A raw file names its runs itself (a W&B export its run's name, a sweep's table
            # each run's): the raw run with these steps and values.
            match = [name for name, got in from_raw.items() if len(got) == len(steps) and all(
                a[0] == b[0] and same(a[1], b[1]) for a, b in zip(got, steps))]
            assert match, (folder.name, run, len(steps), {n: len(s) for n, s in from_raw.items()})
            compared.append((folder.name, run))
    # Not vacuous: most of the collection keeps raw files the exporter reads.
    assert len({name for name, _ in compared}) >= 20, (compared, unread)

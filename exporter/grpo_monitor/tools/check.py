"""``grpo-monitor check RUN_DIR``: what the exporter will make of a run folder, before a card is needed.

Run right after pointing a trainer at the snapshot folder. It reads the folder with the exporter's
own ingest and store (nothing else is read, nothing is written) and prints, per run: its shape
(ranks, steps, records, how often it logs, who wrote it), its keys — each name read as which
signal, and the names that map to none, with the ones they most likely meant — the minimum
curves it logs, and which cards are armed on it and why the others are not (contract/cards.py,
the same table the exporter publishes as ``grpo_card_armed``). Exit 0; 1 when a run lacks a
minimum curve; 2 when there is nothing to check.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import TextIO

from grpo_monitor.contract.cards import CARDS, MINIMUM_CURVES, missing_cause
from grpo_monitor.contract.key_map import KEY_MAP_FILE, render_line
from grpo_monitor.contract.keys import (
    SIGNALS_BY_KEY,
    framework_evidence,
    is_known_unmapped,
    match_key,
    proposals,
)
from grpo_monitor.contract.logger_layout import run_folders
from grpo_monitor.runtime.health import ERROR_REASONS, ExporterHealth
from grpo_monitor.runtime.ingest import Ingestor
from grpo_monitor.runtime.store import RunState, RunStore

COLOURS = {"critical": "red", "warning": "yellow"}


def read(folder: Path) -> tuple[RunStore, ExporterHealth]:
    """Every snapshot file under ``folder`` (a run folder, or a snapshot folder of runs), read
    by the exporter's ingest into a store, in the order they were written."""
    store, health, _ = read_sources(folder)
    return store, health


def read_sources(folder: Path) -> tuple[RunStore, ExporterHealth, dict[str, dict[str, Path]]]:
    """``read``, and which files each run was read from, by format (snapshots, or a logger's:
    contract/logger_layout.py)."""
    folder = folder.absolute()  # "." or "run": the ingest's root must be a folder above it
    runs = run_folders(folder)
    root = folder if runs else folder.parent
    store, health = RunStore(), ExporterHealth()
    ingestor = Ingestor(root, store, health)
    ingestor.sources = {}  # which files each run is read from, for describe()
    for run_dir in runs or [folder]:
        ingestor.scan_folder(run_dir)  # the start-up replay's way: oldest first, to the end
    ingestor.loggers.flush_all()
    store.flush()
    return store, health, ingestor.sources or {}


def _names(key: str) -> str:
    sig = SIGNALS_BY_KEY.get(key)
    return ", ".join(sig.aliases) if sig and sig.aliases else "no other name"


def _cadence(run: RunState) -> str:
    rank = min(run.ranks.values(), key=lambda r: r.rank)
    steps = [s for s, _ in rank.pace]
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    if not gaps:
        return "one record so far"
    every = statistics.median(gaps)
    return "every step" if every == 1 else f"every {every:g} steps"


def _how(name: str) -> str:
    """How a logged name was read, where it was no listed name: said so a person can check."""
    hit = match_key(name)
    how = {"heldout": "a held-out score by its namespace",
           "accuracy": "the sample accuracy: a term of the reward that names correctness",
           "vocabulary": "matched by its words (docs/snapshot-format.md#names-nobody-listed)",
           "qualified": "a subset's value, read where the record has no plain one"}
    return f"   ({how[hit.how]})" if hit is not None and hit.how in how else ""


def _key_map_lines(unknown: dict[str, list[str]], read: set[str]) -> list[str]:
    """Key map lines for the unknown names the vocabulary proposes a key for (nearest first,
    the others as comments); a key the run already logs under another name is proposed all the
    same, since the person may prefer theirs."""
    lines = []
    for name in sorted(unknown):
        keys = proposals(name)
        if not keys:
            continue
        line = render_line(name, keys[0])
        if len(keys) > 1:
            line += "   # or: " + ", ".join(keys[1:])
        if keys[0] in read:
            line += "   # the run logs this key already"
        lines.append(line)
    return lines


def describe(run: RunState, out: TextIO) -> bool:
    """Print what the exporter makes of one run; whether it logs every minimum curve."""
    ranks = sorted(run.ranks)
    first = min((r.signals.first_step or 0) for r in run.ranks.values()) if run.ranks else 0
    last = max((r.step for r in run.ranks.values()), default=0)
    records = max((r.logged_steps for r in run.ranks.values()), default=0)
    names: dict[str, str] = {}
    for rank in run.ranks.values():
        names.update(rank.names)
    who = run.framework or "unknown (no marker among its key names)"
    # The name that says so, where the names say it (a record's own framework field may not).
    framework, marker = framework_evidence([*names.values(), *run.closest])
    if run.framework and framework == run.framework:
        who += f" (it logs {marker})"
    out.write(f"run {run.name}: {len(ranks)} rank(s) {ranks[:8]}{' ...' if len(ranks) > 8 else ''}, "
              f"steps {first}..{last}, {records} logged steps ({_cadence(run)}), written by {who}\n")
    out.write("  keys read as signals:\n")
    for key in sorted(names):
        shown = names[key] if names[key] == key else f"{names[key]} -> {key}"
        out.write(f"    {shown}{_how(names[key])}\n")
    unknown = {n: c for n, c in run.closest.items() if not is_known_unmapped(n)}
    if unknown:
        out.write("  keys that map to no signal (exported as grpo_metric_value, read by no card):\n")
        for name, close in sorted(unknown.items()):
            hint = f"  <- did you mean {' or '.join(close)}?" if close else ""
            out.write(f"    {name}{hint}\n")
    if framework_own := len(run.closest) - len(unknown):
        out.write(f"  and {framework_own} name(s) its framework always logs, unmapped on purpose "
                  f"(other statistics, counters, timings)\n")
    lines = _key_map_lines(unknown, set(names))
    if lines:
        out.write(f"  a key map for the names that may stand for a signal: check each line, keep the "
                  f"true ones, and paste them into {run.name}/{KEY_MAP_FILE} (or the file of "
                  f"--snapshot.key-map):\n")
        for line in lines:
            out.write(f"    {line}\n")
    missing = [k for k in MINIMUM_CURVES if k not in run.key_ranks]
    out.write("  minimum curves: " + ", ".join(
        f"{k} {'missing' if k in missing else 'ok'}" for k in MINIMUM_CURVES) + "\n")
    for key in missing:
        cause = missing_cause(run.framework, key)
        out.write(f"    {key} is also read as: {_names(key)}\n")
        if cause is not None:
            out.write(f"    {cause.hint}\n")
    armed = [a for a in run.armed if a.reason == "armed"]
    red = [a for a in run.armed if a.card.severity == "critical"]
    out.write(f"  cards armed: {len(armed)} of {len(CARDS)}; red cards: "
              f"{sum(a.reason == 'armed' for a in red)} of {len(red)}\n")
    for a in run.armed:
        if a.reason == "armed":
            # A red card with several paths says which can judge this run (the mean reward
            # alone, a trend, two records): a run that logs little is judged by fewer of them.
            if a.card.severity == "critical" and len(a.card.branches) > 1:
                paths = ", ".join(p or "its first rule" for p in a.paths)
                out.write(f"    {a.card.name:<28} {COLOURS[a.card.severity]:<6} armed by: {paths}\n")
            continue
        out.write(f"    {a.card.name:<28} {COLOURS[a.card.severity]:<6} {a.reason}: {a.explanation}\n")
    return not missing


# How check names each format a run was read from.
LOGGER_NAMES = {"snapshots": "grpo-monitor snapshots", "wandb": "W&B run file",
                "tensorboard": "TensorBoard event file", "mlflow": "MLflow database",
                "trackio": "Trackio database", "jsonl": "its framework's JSONL file",
                "trainer_state": "a Hugging Face checkpoint's trainer_state.json",
                "csv": "a CSV table"}


def _describe_sources(sources: dict[str, Path], read_from: str, folder: Path, out: TextIO) -> None:
    """Where the run was read from; the other loggers that write it too, left out (one run, one
    source: contract/logger_layout.py's SOURCE_PRECEDENCE)."""
    for fmt, path in sorted(sources.items(), key=lambda item: item[0] != read_from):
        shown = path.relative_to(folder) if path.is_relative_to(folder) else path
        if fmt == read_from or len(sources) == 1:
            out.write(f"  read from: {LOGGER_NAMES.get(fmt, fmt)} ({shown})\n")
        else:
            out.write(f"  also written to: {LOGGER_NAMES.get(fmt, fmt)} ({shown}), not read: the "
                      f"same steps as the file read from\n")
    if sources and "snapshots" not in sources:
        # Watching needs no change to the trainer; pausing it on a red card does.
        out.write("  the red-card pause needs the trainer to check the gate: add the one line "
                  "for your framework (docs/loggers.md#pausing), or the cards only alert\n")


def check(folder: Path, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    if not folder.is_dir():
        err.write(f"grpo-monitor check: {folder} is not a folder\n")
        return 2
    store, health, sources = read_sources(folder)
    runs = store.runs()
    if not runs:
        err.write(f"grpo-monitor check: no snapshot records in {folder}\n")
        return 2
    complete = True
    for run in runs:
        complete = describe(run, out) and complete
        _describe_sources(sources.get(run.name, {}), run.source or "snapshots", folder, out)
    counts = {reason: health.registry.get_sample_value("grpo_snapshot_errors_total", {"reason": reason})
              for reason in ERROR_REASONS}
    rejected = {reason: int(n) for reason, n in counts.items() if n}
    if rejected:
        out.write("input the exporter could not use: " + ", ".join(
            f"{n} {reason}" for reason, n in sorted(rejected.items())) + "\n")
    return 0 if complete else 1

"""Real RL post-training runs, played through the exporter and the real rules.

The shared collection (``../shared/real-runs`` beside the repository, or ``$GRPO_REAL_RUNS``)
holds public runs as their frameworks logged them, one ``derived_steps.jsonl`` per run. This
module writes such a run into a snapshot folder as flat records, the keys as logged, lets the
exporter's ingest and store read it step by step (promtool_harness.Recorder), and asks the
real ``promtool`` which cards fired at which steps (promtool_harness.fired_at: one evaluation
of a play, which the test session keeps). Tests assert on it (promtool_harness.check_fired, or
the bench's verdicts); promtool_harness.fired prints it for development and diagnosis, and so
does the command line:

    python tests/real_runs.py [NAME_OR_FOLDER ...] [--every K] [--scrape-every-steps N]

The data is never copied into the repository; a missing collection is an error, not a skip.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from promtool_harness import Played, Recorder, fired_at, intervals, session_cached

ROOT = Path(__file__).resolve().parents[1]
ENV = "GRPO_REAL_RUNS"
STEPS_FILE = "derived_steps.jsonl"
# Fields the collection's parser added for the reader (e.g. ``_step_inferred``: the log had no
# step, it was counted); no trainer wrote them. wandb's own ``_step`` / ``_timestamp`` /
# ``_runtime`` are part of the snapshot contract and are kept if a run has them.
_CONTRACT_UNDERSCORED = frozenset({"_step", "_timestamp", "_runtime"})
# The trainer clock of the written records: step s happened at T0 + s * STEP_SECONDS. A fixed
# clock makes every play of a run identical, whatever the machine.
T0 = 1_764_400_000.0
STEP_SECONDS = 30.0


class RealRunsMissing(FileNotFoundError):
    """The shared collection is not where it should be."""


def runs_dir() -> Path:
    """The shared collection: ``$GRPO_REAL_RUNS``, else ``<repository>/../shared/real-runs``.

    CI clones the repository with ``../shared`` beside it, so the default works there.
    """
    configured = os.environ.get(ENV)
    path = Path(configured) if configured else ROOT.parent / "shared" / "real-runs"
    if not path.is_dir():
        how = f"${ENV}={configured}" if configured else f"the default (set ${ENV} to override)"
        raise RealRunsMissing(
            f"the shared real runs are missing: {path} is not a folder ({how}). They live outside "
            f"the repository, in ../shared/real-runs beside the clone; the real-run tests need "
            f"them and fail without them.")
    return path


def run_names() -> list[str]:
    """Every run of the shared collection: the folders that hold a derived_steps.jsonl."""
    return sorted(p.parent.name for p in runs_dir().glob(f"*/{STEPS_FILE}"))


def steps_file(name_or_path: str | Path) -> Path:
    """The steps file of a shared run's name, or of a folder / *.jsonl file given as a path."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if path.is_dir():
        if (path / STEPS_FILE).is_file():
            return path / STEPS_FILE
        raise FileNotFoundError(f"{path} holds no {STEPS_FILE}")
    found = runs_dir() / str(name_or_path) / STEPS_FILE
    if not found.is_file():
        raise FileNotFoundError(f"no real run {name_or_path!r}: {found} does not exist "
                                f"(runs: {', '.join(run_names())})")
    return found


def run_label(name_or_path: str | Path) -> str:
    """The run name a play uses: the run's folder name."""
    return steps_file(name_or_path).parent.name


def load(name_or_path: str | Path) -> list[dict[str, Any]]:
    """The run's records, one per logged step, in the file's order, as logged (less the
    collection's helper fields). Every record must carry an integer ``step``."""
    path = steps_file(name_or_path)
    records: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            raw = json.loads(line)
            rec = {k: v for k, v in raw.items()
                   if not k.startswith("_") or k in _CONTRACT_UNDERSCORED}
            if not isinstance(rec.get("step"), int):
                raise ValueError(f"{path}:{lineno}: no integer step")
            records.append(rec)
    return records


def thin(records: Iterable[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """Only the records of every ``every``-th step: a run logged every step, as if it had been
    logged with ``logging_steps=every``."""
    if every < 1:
        raise ValueError(f"every must be >= 1, not {every}")
    return [r for r in records if r["step"] % every == 0]


def snapshot_path(root: Path, run: str) -> Path:
    return root / run / "metrics.jsonl"


def write_snapshots(records: Iterable[dict[str, Any]], root: Path, run: str, every: int = 1) -> Path:
    """Append the records to ``root/<run>/metrics.jsonl`` as flat records, the way a trainer's
    ``json.dumps`` of its log dict would: the keys as logged, ``step``, and a trainer ``time``.

    Plain appends, one line each, so that the exporter's tail reads them as it reads any trainer.
    Returns the file's path; calling it again appends more.
    """
    path = snapshot_path(root, run)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for rec in thin(records, every):
            line = {**rec, "time": T0 + rec["step"] * STEP_SECONDS}
            fh.write(json.dumps(line, allow_nan=True) + "\n")
            fh.flush()
    return path


def split_runs(records: list[dict[str, Any]], run: str) -> dict[str, list[dict[str, Any]]]:
    """The run folders a log's records belong in: one, named ``run``, unless the records carry a
    ``run`` field with several values (a sweep logged to one file): then one folder per value,
    ``<run>-<value>``, each with its records in the file's order."""
    names = {r.get("run") for r in records}
    if len(names) < 2:
        return {run: records}
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(f"{run}-{r['run']}", []).append(r)
    return out


def play_real(name_or_path: str | Path, *, scrape_every_steps: int = 1, every: int = 1) -> Played:
    """``_play_real``, kept for the session (promtool_harness.session_cached): four test files
    play the same runs (the 2,959-step one: 9 s a play)."""
    return session_cached("play", [str(name_or_path), str(scrape_every_steps), str(every)],
                          lambda: _play_real(name_or_path, scrape_every_steps=scrape_every_steps,
                                             every=every))


def _play_real(name_or_path: str | Path, *, scrape_every_steps: int = 1, every: int = 1) -> Played:
    """Write the run step by step and scrape the exporter's store as the run goes.

    A scrape is taken after the last logged record of each block of ``scrape_every_steps``
    steps (with the default, after every logged record), so promtool, one minute per scrape,
    sees the run step by step; ``every`` thins the run first (see ``thin``). A sweep logged to
    one file (``split_runs``) is played as its runs side by side, step by step, as if they had
    trained at once; a log whose steps go back (a restart) is played in the file's order.
    """
    if scrape_every_steps < 1:
        raise ValueError(f"scrape_every_steps must be >= 1, not {scrape_every_steps}")
    groups = split_runs(thin(load(name_or_path), every), run_label(name_or_path))
    events = (list(heapq.merge(*([(r["step"], run, r) for r in recs] for run, recs in groups.items()),
                               key=lambda e: e[0]))
              if len(groups) > 1 else [(r["step"], run, r) for run, recs in groups.items() for r in recs])
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        recorder = Recorder(root)
        paths: dict[str, Path] = {}
        for i, (step, run, rec) in enumerate(events):
            paths[run] = write_snapshots([rec], root, run)
            last_of_block = (i + 1 == len(events)
                             or events[i + 1][0] // scrape_every_steps != step // scrape_every_steps)
            if last_of_block:
                recorder.scrape(step, list(paths.values()))
    return recorder.played()


# -- command line -----------------------------------------------------------------------------


def _describe(name: str, records: list[dict[str, Any]]) -> str:
    steps = [r["step"] for r in records]
    gaps = sorted({b - a for a, b in zip(steps, steps[1:])})
    cadence = f"every {gaps[0]} step(s)" if len(gaps) == 1 else f"step gaps {gaps[:5]}"
    return f"{name}: {len(records)} records, steps {steps[0]}..{steps[-1]} ({cadence})"


def report(name_or_path: str, *, every: int, scrape_every_steps: int) -> str:
    records = thin(load(name_or_path), every)
    lines = [_describe(run_label(name_or_path), records)]
    t0 = time.monotonic()
    played = play_real(name_or_path, every=every, scrape_every_steps=scrape_every_steps)
    t1 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        at = fired_at(played, Path(tmp))
    t2 = time.monotonic()
    sev = {a: s for firing in at for a, s in firing}
    spans = intervals(played.scrape_steps, at)
    lines.append(f"  {len(played.scrape_steps)} scrapes, {len(played.series)} series; "
                 f"play {t1 - t0:.1f}s, promtool {t2 - t1:.1f}s")
    if not spans:
        lines.append("  no card fired")
    for alert in sorted(spans, key=lambda a: (spans[a][0][0], a)):
        ranges = ", ".join(f"{a}..{b}" for a, b in spans[alert])
        lines.append(f"  {alert:<28} {sev[alert]:<9} firing at steps {ranges}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Play real runs through the exporter and the rules; print which cards fired when.")
    parser.add_argument("runs", nargs="*",
                        help="shared run names, or folders / files with a derived_steps.jsonl-style "
                             "log (default: every shared run)")
    parser.add_argument("--every", type=int, default=1, help="keep only every k-th step")
    parser.add_argument("--scrape-every-steps", type=int, default=1,
                        help="one scrape (one promtool minute) per this many steps")
    args = parser.parse_args(argv)
    for name in args.runs or run_names():
        print(report(name, every=args.every, scrape_every_steps=args.scrape_every_steps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The tools on a run with a rollback on every record: do ``report``, ``check`` and ``replay``
take time and memory linear in the records, whatever the number of rollbacks?

Usage: python bench/bench_report_rollbacks.py [--records 5000 10000 20000]
       [--shapes none undo_each_record redo_each_step] [--out PATH]

Method. For each size N, three runs of N rank-0 records are written through SnapshotWriter, each
record a step of the healthy simulated run (tools/simulate.py, seed 0: ~40 training and perf keys,
by_type, checkpoint saves) with one logged prompt of two responses (samples, for ``replay``):

* ``none``: steps 1..N, no rollback: the cost of the records themselves.
* ``undo_each_record``: step i+1 carries a rollback mark to step i-1, so every record undoes the
  one before it: N - 1 undone spans, and a surviving timeline of one step.
* ``redo_each_step``: steps 1..N/2, each logged twice, the second pass with a rollback mark to the
  step before, which undoes the first: N/2 undone spans, each rewind cutting the end of a
  history of up to N/2 steps (docs/signals.md#a-runs-timeline).

Then ``grpo-monitor report RUN --out DIR``, ``grpo-monitor check RUN`` and ``grpo-monitor replay
--snapshot.dir ROOT RUN`` each run once in their own process, one after the other; their wall
time, CPU time and peak RSS (``os.wait4``'s rusage of that process alone) are recorded with
their exit status. The tools read every record (none is skipped by a rollback), so linear means: the seconds
and MiB of a shape grow with N as those of ``none`` do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_io import machine, write_result  # noqa: E402

from grpo_monitor.sdk.writer import SnapshotWriter  # noqa: E402
from grpo_monitor.tools.simulate import RankRecord, generate  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "report_rollbacks.json"
RUN = "rollbacks"
SHAPES = ("none", "undo_each_record", "redo_each_step")
# One prompt and its group of two responses on every record: replay then indexes a sample step
# per record, and undoes them with the rollbacks.
SAMPLES = [{"prompt": "2+2?", "responses": [{"text": "4", "reward": 1.0},
                                            {"text": "5", "reward": 0.0}]}]


def _mark(from_step: int, to_step: int) -> dict[str, Any]:
    return {"type": "rollback", "from_step": from_step, "to_step": to_step}


def records(shape: str, n: int) -> Iterator[tuple[int, RankRecord, list[dict[str, Any]]]]:
    """(step, record, its events) of the ``n`` records of ``shape``, in the order logged."""
    steps = n // 2 if shape == "redo_each_step" else n
    for st in generate("healthy", steps=steps, ranks=1, step_seconds=1.0):
        rec = st.records[0]
        events = list(rec.events or [])
        if shape == "none":
            yield st.step, rec, events
        elif shape == "undo_each_record":
            yield st.step, rec, events + ([_mark(st.step - 1, st.step - 2)] if st.step > 1 else [])
        else:  # redo_each_step: the first pass, then the second, which undoes it
            yield st.step, rec, events
            yield st.step, RankRecord(rec.rank, rec.metrics, rec.timestamp + 0.5, rec.by_type), \
                events + [_mark(st.step, st.step - 1)]


def write_run(root: Path, shape: str, n: int) -> int:
    """The run of ``shape`` under ``root``/RUN, through the SDK writer; the records written."""
    written = 0
    with SnapshotWriter(root, RUN, rank=0, world_size=1, warn_unknown_keys=False) as w:
        for step, rec, events in records(shape, n):
            written += w.log(rec.metrics, step, by_type=rec.by_type, samples=SAMPLES,
                             events=events or None, timestamp=rec.timestamp)
    return written


def measured(cmd: list[str]) -> dict[str, Any]:
    """Wall and CPU seconds, peak RSS (MiB) and exit status of ``cmd``, run in a process of its
    own. The CPU seconds (user + system) are the ones to compare on a shared machine: the wall
    time there also counts the other processes' turns."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # wait4 gives this child's own rusage: RUSAGE_CHILDREN would be the largest of all so far.
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "exit": proc.returncode}


def bench(shape: str, n: int) -> dict[str, Any]:
    cli = [sys.executable, "-m", "grpo_monitor.cli"]
    with tempfile.TemporaryDirectory(prefix="grpo-rollbacks-") as tmp:
        root = Path(tmp)
        written = write_run(root, shape, n)
        out = root / "report-out"
        result: dict[str, Any] = {
            "shape": shape, "records": written,
            "report": measured([*cli, "report", str(root / RUN), "--out", str(out)]),
            "check": measured([*cli, "check", str(root / RUN)]),
            "replay": measured([*cli, "replay", "--snapshot.dir", str(root), RUN]),
        }
        summary = json.loads((out / "summary.json").read_text())
        result["logged_steps"] = summary["logged_steps"]
        result["undone_spans"] = len(summary["undone"])
        result["report_txt_lines"] = len((out / "report.txt").read_text().splitlines())
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, nargs="+", default=[5000, 10000, 20000])
    ap.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    runs = []
    for n in args.records:
        for shape in args.shapes:
            r = bench(shape, n)
            runs.append(r)
            print(f"{shape:>17} {r['records']:>6} records ({r['undone_spans']} undone spans, "
                  f"{r['logged_steps']} steps left): " + "; ".join(
                      f"{tool} {r[tool]['wall_s']:.1f} s (CPU {r[tool]['cpu_s']:.1f} s) "
                      f"{r[tool]['peak_rss_mib']:.0f} MiB exit {r[tool]['exit']}"
                      for tool in ("report", "check", "replay")),
                  flush=True)
    write_result(args.out, {"source": "bench/bench_report_rollbacks.py", "machine": machine(),
                            "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

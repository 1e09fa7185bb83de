"""A run's timeline end to end: the tiny real trainer under `grpo-monitor stack up`, a level-based
red card (a reward collapse), the pause, `resume`, the rollback, and the run trained to its end
with no second pause; what the stack's exporter then serves for the run equals what a fresh
exporter serves from the surviving records alone."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from conftest import Running, Samples, scrape
from polling import wait_for
from test_stack import CLI, Stack

from grpo_monitor.runtime.app import Exporter
from grpo_monitor.runtime.config import ExporterConfig
from grpo_monitor.tools.stack import Child

RUN, STEPS, ONSET, BACK_TO = "collapse", 240, 45, 40
# Counters count what was read, undone or not; the rest is the surviving timeline's. The marks
# of the pause (paused, resumed) are left out of the fresh read, and with them the times.
NOT_COMPARED = ("grpo_nonfinite_total", "grpo_events_total", "grpo_run_last_write_timestamp_seconds",
                "grpo_last_snapshot_timestamp_seconds")


def surviving(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Step records that stand (a rollback mark undoes those after its to_step), and the end."""
    kept: list[dict[str, Any]] = []
    for rec in records:
        back = next((e["to_step"] for e in rec.get("events") or () if e["type"] == "rollback"), None)
        if back is not None:
            kept = [r for r in kept if r["step"] <= back]
        elif rec.get("metrics") or any(e["type"] == "run_end" for e in rec.get("events") or ()):
            kept.append(rec)
    return kept


def run_series(samples: Samples) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {k: v for k, v in samples.items() if ("run", RUN) in k[1] and k[0] not in NOT_COMPARED}


def test_a_level_red_card_pauses_once_and_the_rolled_back_run_trains_to_its_end(tmp_path: Path) -> None:
    snapshots = tmp_path / "snapshots"
    stack = Stack(snapshots, None, tmp_path / "stack.log")
    trainer = Child.start("trainer", [
        *CLI, "train-demo", "--snapshot.dir", str(snapshots), "--run", RUN,
        "--training-steps", str(STEPS), "--difficulty", "hard", "--onset", str(ONSET),
        "--cured-by-rollback", "--checkpoint-every", "20", "--step-seconds", "0.15",
        "--pause-poll-s", "0.2"], tmp_path / "trainer.log", Path.cwd(),
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for(lambda: f"[PAUSE ] run={RUN}: GRPORewardCollapse paused it" in stack.output()
                 or not trainer.alive(), timeout=240, interval=0.5, diagnose=stack.output)
        assert trainer.alive(), trainer.log.read_text()
        # A person looks at the report, sees the reward fall from step 45, and rolls back to the
        # checkpoint before it.
        res = subprocess.run([*CLI, "resume", RUN, "--snapshot.dir", str(snapshots),
                              "--rollback-to", str(BACK_TO), "--wait", "60s"],
                             capture_output=True, text=True, timeout=120, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"its trainer rolled back to the checkpoint of step {BACK_TO} (rank 0)" in res.stdout
        assert trainer.proc.wait(timeout=240) == 0, trainer.log.read_text()
        wait_for(lambda: f"[resume] run={RUN}: its trainer rolled back to the checkpoint of step "
                 f"{BACK_TO}" in stack.output(), timeout=30, interval=0.5, diagnose=stack.output)
        records = [json.loads(line) for line in (snapshots / RUN / "rank-0.jsonl").read_text().splitlines()]
        steps = [r["step"] for r in records if r.get("metrics")]
        assert steps[-1] == STEPS and steps.count(BACK_TO + 1) == 2, steps
        # Trained to its end with no second pause: one pause mark, one pause line.
        assert sum(e["type"] == "paused" for r in records for e in r.get("events") or ()) == 1
        assert stack.output().count(f"[PAUSE ] run={RUN}") == 1, stack.output()

        fresh_dir = tmp_path / "fresh"
        (fresh_dir / RUN).mkdir(parents=True)
        (fresh_dir / RUN / "rank-0.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in surviving(records)))
        fresh = Exporter(ExporterConfig(snapshot_dir=fresh_dir, listen_address="127.0.0.1:0")).start()
        try:
            wait_for(fresh.watcher.ready.is_set)
            Running(fresh).wait_value("grpo_run_ended", 1, run=RUN)
            want = run_series(scrape(fresh.url))
        finally:
            fresh.stop()
        url = stack.urls["exporter"]
        wait_for(lambda: run_series(scrape(url)).get(("grpo_run_ended", frozenset({("run", RUN)}))) == 1,
                 timeout=30)
        got = run_series(scrape(url))
        assert got.keys() == want.keys(), sorted(map(str, got.keys() ^ want.keys()))[:6]
        differ = [k for k in want if got[k] != want[k] and not (got[k] != got[k] and want[k] != want[k])]
        assert not differ, [(k, got[k], want[k]) for k in differ[:6]]
        assert got[("grpo_run_logged_steps", frozenset({("run", RUN)}))] == STEPS
        assert re.search(rf"\[PAUSE \] run={RUN}", stack.output())
    finally:
        trainer.stop(timeout=30)
        stack.close()

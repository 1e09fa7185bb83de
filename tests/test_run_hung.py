"""A hung run is a red card: the run-level series the GRPORunHung rule reads, and the rule on
real processes.

The store tests feed records through the contract's parser into the store and read its
rendering. The end-to-end test runs SDK writers as child processes, a real `grpo-monitor serve`
scraped over HTTP, and a real Prometheus evaluating the committed rule files (only the
5-minute floor is lowered, in a copy of the thresholds file, so that the test takes seconds).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from conftest import Samples, parse_samples, scrape
from polling import wait_for
from processes import log_tail, start_listening
from prometheus_harness import prometheus_config, start_prometheus
from promtool_harness import RULE_FILES

import grpo_monitor
from grpo_monitor.contract.snapshot import parse_record
from grpo_monitor.runtime.store import HUNG_RETAIN_INTERVALS, RunStore
from grpo_monitor.tools.stack import Child

ROOT = Path(__file__).resolve().parents[1]


# -- the store ------------------------------------------------------------------------------

def _apply(store: RunStore, record: dict[str, Any], *, run: str = "r", rank: int = 0,
           wrote_at: float | None = None) -> None:
    snap = parse_record(record, run=run, rank=rank, mtime=wrote_at or time.time())
    store.apply(snap, wrote_at=wrote_at or time.time())
    store.flush()


def _series(store: RunStore) -> Samples:
    return parse_samples("".join(store.render()))


def _get(store: RunStore, name: str, **labels: str) -> float | None:
    return _series(store).get((name, frozenset(labels.items())))


def _rec(step: int, t: float, rank: int = 0, run: str = "r") -> dict[str, Any]:
    return {"run": run, "rank": rank, "step": step, "time": t, "metrics": {"loss": 0.1}}


def _end(step: int, t: float, rank: int = 0, run: str = "r") -> dict[str, Any]:
    return {"run": run, "rank": rank, "step": step, "time": t, "metrics": {},
            "events": [{"type": "run_end", "step": step}]}


def test_pace_is_the_median_on_the_trainer_clock_of_the_slowest_rank() -> None:
    store = RunStore()
    t0 = 1_764_400_000.0
    _apply(store, _rec(1, t0))
    assert _get(store, "grpo_run_step_interval_seconds", run="r") is None  # one record: no pace
    assert _get(store, "grpo_run_ended", run="r") == 0
    # Rank 0 logs every step at 5 s, with one 60 s checkpoint step the median ignores; rank 1
    # logs every other step at 6 s a step. The trainer's clock, not the write time, counts.
    t = t0
    for step in range(2, 22):
        t += 60 if step == 10 else 5
        _apply(store, _rec(step, t))
        if step % 2 == 0:
            _apply(store, _rec(step, t0 + 6 * step, rank=1))
    assert _get(store, "grpo_run_step_interval_seconds", run="r") == 6.0
    assert _get(store, "grpo_run_log_interval_seconds", run="r") == 12.0
    # A repeated step (a checkpoint event record at the same step) adds no interval.
    _apply(store, {**_rec(21, t + 500), "metrics": {}, "events": [{"type": "checkpoint_save"}]})
    assert _get(store, "grpo_run_log_interval_seconds", run="r") == 12.0


def test_a_trainer_clock_that_jumps_back_and_forth_keeps_the_pace_of_the_writes() -> None:
    """A trainer writing every 0.3 s whose clock steps an hour ahead and back at every record: its
    pace is its writes', not an hour (which would hold the hung card off for ten)."""
    store = RunStore()
    t0 = 1_764_400_000.0
    for step in range(1, 42):
        _apply(store, _rec(step, t0 + 0.3 * step + (3600 if step % 2 else 0)))
    assert _get(store, "grpo_run_log_interval_seconds", run="r") <= 0.6
    # Nor a clock that stepped back once and stays behind: no negative time, no hour.
    store = RunStore()
    for step in range(1, 42):
        _apply(store, _rec(step, t0 + 0.3 * step - (3600 if step > 20 else 0)))
    assert 0 <= _get(store, "grpo_run_log_interval_seconds", run="r") <= 0.3 + 1e-9
    # A slow run (a record every 10 minutes) whose clock goes back at every record: its pace is
    # the files' (10 minutes), not zero, which would raise the card after the 5-minute floor.
    store = RunStore()
    wrote = time.time() - 41 * 600
    for step in range(1, 42):
        _apply(store, _rec(step, t0 - 60 * step), wrote_at=wrote + 600 * step)
    assert _get(store, "grpo_run_log_interval_seconds", run="r") == 600


def test_last_write_is_the_newest_file_mtime_capped_at_the_exporter_clock() -> None:
    store = RunStore()
    # A record stamped with a simulated clock far ahead: the file's mtime counts, not `time`.
    _apply(store, _rec(1, 4_000_000_000.0), wrote_at=1_764_400_000.0)
    assert _get(store, "grpo_run_last_write_timestamp_seconds", run="r") == 1_764_400_000.0
    before = time.time()
    _apply(store, _rec(2, 1.0), wrote_at=before + 3600)  # a file server's clock an hour ahead
    assert before <= _get(store, "grpo_run_last_write_timestamp_seconds", run="r") <= time.time()


def test_run_end_ends_the_run_without_touching_its_ranks() -> None:
    store = RunStore()
    for step in range(1, 11):
        _apply(store, _rec(step, 1000.0 + step))
        _apply(store, _rec(step, 1000.0 + step, rank=1))
    _apply(store, _end(10, 1011.0))
    # Rank 1's last record lands after rank 0's end: the run stays ended.
    _apply(store, _rec(10, 1011.5, rank=1))
    assert _get(store, "grpo_run_ended", run="r") == 1
    assert _get(store, "grpo_events_total", run="r", rank="0", type="run_end") == 1
    assert _get(store, "grpo_step", run="r", rank="0") == 10
    # A bare end mark from a launch script (step 0, a rank the run does not have) changes no
    # step, creates no rank and keeps the pace.
    _apply(store, {"step": 0, "events": [{"type": "run_end"}]}, rank=7)
    s = _series(store)
    assert s[("grpo_step", frozenset({("run", "r"), ("rank", "0")}))] == 10
    assert not any(n == "grpo_step" and ("rank", "7") in lbl for n, lbl in s)
    assert s[("grpo_run_step_interval_seconds", frozenset({("run", "r")}))] == 1.0


@pytest.mark.parametrize("resume", ["same rank writes again", "past the end step"])
def test_a_run_that_goes_on_after_its_end_is_running_again(resume: str) -> None:
    store = RunStore()
    for step in range(1, 6):
        _apply(store, _rec(step, 100.0 + step))
        _apply(store, _rec(step, 100.0 + step, rank=1))
    _apply(store, _end(5, 106.0))
    assert _get(store, "grpo_run_ended", run="r") == 1
    if resume == "same rank writes again":  # a new process, resumed from an earlier checkpoint
        _apply(store, _rec(3, 200.0))
    else:
        _apply(store, _rec(6, 200.0, rank=1))
    assert _get(store, "grpo_run_ended", run="r") == 0


def test_a_flat_record_carries_the_end_mark() -> None:
    snap = parse_record({"step": 0, "events": [{"type": "run_end"}]}, run="v", rank=0, mtime=5.0)
    assert [e.type for e in snap.events] == ["run_end"] and snap.metrics == snap.unknown == {}
    store = RunStore()
    _apply(store, {"step": 40, "data": {"critic/score/mean": 0.5}}, run="v")  # a verl line
    _apply(store, {"step": 0, "events": [{"type": "run_end"}]}, run="v")
    assert _get(store, "grpo_run_ended", run="v") == 1
    assert _get(store, "grpo_step", run="v", rank="0") == 40


def test_a_run_that_waits_on_purpose_is_paused_until_it_goes_on(tmp_path: Path) -> None:
    from grpo_monitor.contract.control import ControlRecord, write_control
    from grpo_monitor.sdk.writer import SnapshotWriter

    # The SDK announces the wait of a red card's pause, and its end.
    writer = SnapshotWriter(tmp_path, "r", rank=0)
    assert writer.log({"loss": 0.1}, 4)
    write_control(tmp_path, "r", ControlRecord(state="paused", alertname="GRPONonFiniteValues"))
    waited = threading.Thread(target=writer.wait_if_paused, kwargs={"poll_interval": 0.01})
    waited.start()
    path = tmp_path / "r" / "rank-0.jsonl"
    wait_for(lambda: path.read_text().count("\n") == 2, 10, what="paused mark written")
    write_control(tmp_path, "r", ControlRecord(state="running"))
    waited.join(10)
    assert not waited.is_alive()
    writer.close(end=False)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [([e["type"] for e in r.get("events", [])], r["step"], r["metrics"]) for r in records] == [
        ([], 4, {"loss": 0.1}), (["paused"], 4, {}), (["resumed"], 4, {})]
    assert records[1]["events"][0]["alertname"] == "GRPONonFiniteValues"

    # The store: paused from the mark on, until a resumed mark or a step of that rank.
    store = RunStore()
    for step in range(1, 5):
        _apply(store, _rec(step, 100.0 + step))
        _apply(store, _rec(step, 100.0 + step, rank=1))
    _apply(store, records[1] | {"run": "r"})
    assert _get(store, "grpo_run_paused", run="r") == 1
    assert _get(store, "grpo_step", run="r", rank="0") == 4
    assert _get(store, "grpo_events_total", run="r", rank="0", type="paused") == 1
    _apply(store, _rec(5, 106.0, rank=1))  # another rank's step: rank 0 still waits
    assert _get(store, "grpo_run_paused", run="r") == 1
    _apply(store, records[2] | {"run": "r"})
    assert _get(store, "grpo_run_paused", run="r") == 0
    _apply(store, records[1] | {"run": "r"})
    _apply(store, _rec(5, 107.0))  # or it simply steps again
    assert _get(store, "grpo_run_paused", run="r") == 0


def test_a_silent_run_outlives_the_run_timeout_until_it_can_be_called_hung() -> None:
    store = RunStore()
    t0 = 1_764_400_000.0
    # A slow run: a record every 600 s (10 min), last written at t0 + 3000.
    for i, step in enumerate(range(1, 6)):
        _apply(store, _rec(step, t0 + 600 * (i + 1)), wrote_at=t0 + 600 * (i + 1))
    _apply(store, _rec(1, t0, run="done"), wrote_at=t0 + 3000)
    _apply(store, _rec(2, t0 + 600, run="done"), wrote_at=t0 + 3000)
    _apply(store, _end(2, t0 + 601, run="done"), wrote_at=t0 + 3000)
    last = t0 + 3000
    timeout = 3600.0  # --snapshot.run-timeout's default: less than 10 intervals of 600 s
    # Past the timeout the ended run leaves, the silent one stays ...
    assert store.expire(last + timeout + 1, timeout) == ["done"]
    # ... for HUNG_RETAIN_INTERVALS of its intervals, and then it leaves too.
    assert store.expire(last + HUNG_RETAIN_INTERVALS * 600 - 1, timeout) == []
    assert store.expire(last + HUNG_RETAIN_INTERVALS * 600 + 1, timeout) == ["r"]


# -- on real processes ----------------------------------------------------------------------

# A trainer rank: an SDK writer logging a step every ~50 ms; `steps` < 0 runs until killed,
# else it closes cleanly (run_end) after that many steps and exits.
_CHILD = textwrap.dedent("""
    import sys, time
    from grpo_monitor import SnapshotWriter
    snapshot_dir, run, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    writer = SnapshotWriter(snapshot_dir, run, rank=0, world_size=1)
    step = 0
    while steps < 0 or step < steps:
        step += 1
        writer.log({"loss": 0.1, "perf/step_time_s": 0.05}, step)
        time.sleep(0.05)
    writer.close()
""")
# The floor of the card, lowered from 5 minutes so the test takes seconds; the multiple of the
# run's interval (10 x ~50 ms) stays as committed, so here the floor decides.
FLOOR_S = 2
DEADLINE_S = 30.0


def _rules_with_floor(workdir: Path, floor_s: float) -> list[str]:
    """The committed rule files, copied, with run_hung_min_seconds set to ``floor_s``."""
    paths = []
    for rule_file in RULE_FILES:
        name = rule_file.name
        doc = yaml.safe_load(rule_file.read_text())
        if name == "grpo-thresholds.yml":
            (rule,) = [r for g in doc["groups"] for r in g["rules"]
                       if r["record"] == "grpo:threshold:run_hung_min_seconds"]
            rule["expr"] = f"vector({floor_s})"
        path = workdir / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(str(path))
    return paths


class _Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, promql: str) -> list[dict[str, Any]]:
        resp = requests.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5)
        resp.raise_for_status()
        return resp.json()["data"]["result"]

    def hung(self) -> dict[str, dict[str, Any]]:
        """The firing GRPORunHung alerts, by run."""
        resp = requests.get(f"{self.url}/api/v1/alerts", timeout=5)
        resp.raise_for_status()
        return {a["labels"]["run"]: a for a in resp.json()["data"]["alerts"]
                if a["labels"].get("alertname") == "GRPORunHung" and a["state"] == "firing"}


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str, _Prometheus, ExitStack]]:
    """A `grpo-monitor serve` process and a Prometheus scraping it every second."""
    # The child processes (exporter, trainers) run in tmp_path: they must import the package
    # under test, the one this process imported, whatever the working folder.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(Path(grpo_monitor.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    with ExitStack() as stack:
        _, port = start_listening(stack, "exporter", lambda p: [
            sys.executable, "-m", "grpo_monitor.cli", "serve", f"--snapshot.dir={snapshots}",
            f"--web.listen-address=127.0.0.1:{p}", "--no-collector.gpu"], tmp_path)
        exporter = f"http://127.0.0.1:{port}"
        config = prometheus_config(f"127.0.0.1:{port}", "127.0.0.1:9", "1s")
        config["rule_files"] = _rules_with_floor(tmp_path, FLOOR_S)
        config.pop("alerting")  # the alert's state in Prometheus is what this test reads
        _, prom_url = start_prometheus(stack, tmp_path, config)
        yield snapshots, exporter, _Prometheus(prom_url), stack


def _child(stack: ExitStack, workdir: Path, snapshots: Path, run: str, steps: int) -> Child:
    proc = Child.start(run, [sys.executable, "-c", _CHILD, str(snapshots), run, str(steps)],
                       workdir / f"{run}.log", workdir)

    def stop() -> None:
        # A stopped process cannot act on SIGTERM: let it run again, then end it.
        if proc.alive():
            os.kill(proc.proc.pid, signal.SIGCONT)
        proc.stop()

    stack.callback(stop)
    return proc


def test_a_frozen_run_turns_red_and_a_closed_one_does_not(
        live: tuple[Path, str, _Prometheus, ExitStack], tmp_path: Path) -> None:
    snapshots, exporter, prom, stack = live
    finished = _child(stack, tmp_path, snapshots, "finished", 20)
    frozen = _child(stack, tmp_path, snapshots, "frozen", -1)

    def get(name: str, run: str) -> float | None:
        return scrape(exporter).get((name, frozenset({("run", run)})))

    # The finished run closed (its process exited 0) and the exporter saw its end.
    wait_for(lambda: get("grpo_run_ended", "finished") == 1, DEADLINE_S, what="finished run ended",
             diagnose=lambda: log_tail(finished))
    assert finished.proc.wait(DEADLINE_S) == 0
    # The frozen one has a pace, then stops dead, every "rank" at once: SIGSTOP.
    wait_for(lambda: get("grpo_run_log_interval_seconds", "frozen"), DEADLINE_S,
             what="frozen run has a pace", diagnose=lambda: log_tail(frozen))
    os.kill(frozen.proc.pid, signal.SIGSTOP)

    alert = wait_for(lambda: prom.hung().get("frozen"), DEADLINE_S, what="GRPORunHung for run frozen",
                     diagnose=lambda: repr(prom.query("grpo_run_last_write_timestamp_seconds")))
    assert alert["labels"]["severity"] == "critical" and alert["labels"]["card"] == "red"
    s = scrape(exporter)
    step = s[("grpo_step", frozenset({("run", "frozen"), ("rank", "0")}))]
    assert alert["annotations"]["description"].startswith("Run frozen has written nothing for ")
    assert alert["annotations"]["description"].endswith(f"its newest step is {step:.0f}.")
    assert s[("grpo_run_ended", frozenset({("run", "frozen")}))] == 0
    assert 0 < s[("grpo_run_step_interval_seconds", frozenset({("run", "frozen")}))] < FLOOR_S

    # The finished run has been silent longer than the frozen one, past the floor as well: only
    # its end keeps it quiet.
    silent = prom.query('time() - grpo_run_last_write_timestamp_seconds{run="finished"}')
    assert float(silent[0]["value"][1]) > FLOOR_S
    assert "finished" not in prom.hung()

    # The scrape, new families included, passes promtool's linter.
    body = requests.get(f"{exporter}/metrics", timeout=5).content
    lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True,
                          timeout=30)
    assert (lint.returncode, lint.stdout, lint.stderr) == (0, b"", b"")

    # Red while it stays frozen; writing again ends the card.
    assert "frozen" in prom.hung()
    os.kill(frozen.proc.pid, signal.SIGCONT)
    wait_for(lambda: "frozen" not in prom.hung(), DEADLINE_S, what="GRPORunHung resolved after SIGCONT")

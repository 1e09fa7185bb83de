"""One red card pauses every rank of a real torch.distributed job at one step, across "nodes".

Four gloo processes of examples/plain_pytorch.py, ranks 0-1 writing to one snapshot folder and
ranks 2-3 to another, as with node-local folders and one exporter per node. The pause record
lands in one folder only (the node whose exporter got the card); every rank stops at the same
step boundary, sits paused for three times the job's collective timeout without dying, and a
`grpo-monitor resume` run on the *other* node sends them all back to the last healthy
checkpoint, restored in place.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

from gloo_job import GlooJob
from polling import holds_for, wait_for

from grpo_monitor.contract.control import ControlRecord, now_rfc3339, write_control

RUN = "gloo-pause"
TIMEOUT_S = 3.0  # the job's collective timeout: the pause must outlast it
SAVE_EVERY = 5


def _resume(snapshot_dir: Path, *extra: str) -> None:
    res = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "resume", RUN,
                          "--snapshot.dir", str(snapshot_dir), *extra],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def _start(tmp_path: Path, steps: int) -> GlooJob:
    nodes = [tmp_path / "node-a", tmp_path / "node-b"]
    for n in nodes:
        n.mkdir()
    return GlooJob(nodes, RUN, [
        "--steps", str(steps), "--save-every", str(SAVE_EVERY), "--step-time-s", "0.05",
        "--dist-timeout-s", str(TIMEOUT_S), "--pause-poll-s", "0.25",
        "--checkpoint-dir", str(tmp_path / "checkpoints")], log_dir=tmp_path)


def _hold_paused(job: GlooJob, seconds: float) -> None:
    """Every rank stays alive and logs no step for ``seconds``: the pause outlasts the timeout."""
    counts = [len(job.steps(r)) for r in range(job.world_size)]

    def still_paused() -> None:
        assert len(job.alive()) == 4, "a paused rank died:\n" + job.logs()
        assert [len(job.steps(r)) for r in range(job.world_size)] == counts, "a paused rank stepped"

    holds_for(still_paused, seconds)


def test_a_card_on_one_node_pauses_every_rank_and_resume_rolls_back(tmp_path: Path) -> None:
    job = _start(tmp_path, steps=40)
    try:
        wait_for(lambda: all(len(job.steps(r)) >= 12 for r in range(4)) or len(job.alive()) < 4, 90)
        assert len(job.alive()) == 4, job.logs()
        onset = now_rfc3339()
        # The card reaches node b's exporter only; node a's ranks never see a record.
        write_control(job.snapshot_dirs[1], RUN, ControlRecord(
            state="paused", alertname="GRPONonFiniteValues", run=RUN, onset=onset,
            paused_at=onset, fingerprint="fp"))
        wait_for(lambda: all(job.events(r, "paused") for r in range(4)) or len(job.alive()) < 4, 30)
        assert len(job.alive()) == 4, job.logs()
        paused_at = {job.events(r, "paused")[0]["step"] for r in range(4)}
        assert len(paused_at) == 1, f"ranks paused at different steps: {paused_at}"
        (k,) = paused_at  # the last step every rank finished
        assert all(job.steps(r)[-1] == k for r in range(4))

        _hold_paused(job, 3 * TIMEOUT_S)

        _resume(job.snapshot_dirs[0])  # on the other node: the newest resume wins everywhere
        wait_for(lambda: all(job.events(r, "rollback") for r in range(4)) or len(job.alive()) < 4, 30)
        job.wait(120)
    finally:
        job.stop()

    # The last healthy checkpoint: the newest one saved before the card's onset.
    onset_t = datetime.fromisoformat(onset.replace("Z", "+00:00")).timestamp()
    healthy = max(rec["step"] for rec in job.records(0)
                  if any(e["type"] == "checkpoint_save" for e in rec.get("events") or ())
                  and rec["time"] < onset_t)
    for r in range(4):
        (rollback,) = job.events(r, "rollback")
        assert (rollback["from_step"], rollback["to_step"]) == (k + 1, healthy), rollback
        steps = job.steps(r)
        assert steps == [*range(1, k + 1), *range(healthy + 1, 41)]
        assert [e["type"] for e in job.events(r, "resumed")] == ["resumed"]
        assert job.records(r)[-1]["events"][0]["type"] == "run_end"
    # In place means everything: the step after the checkpoint, played again from the restored
    # weights, optimizer, scheduler and random streams, logs exactly what it logged the first time.
    replayed = [rec["metrics"] for rec in job.records(0) if rec["step"] == healthy + 1 and rec["metrics"]]
    assert len(replayed) == 2
    for key in ("loss", "grad/norm", "train/lr", "reward/mean"):
        assert replayed[0][key] == replayed[1][key], key

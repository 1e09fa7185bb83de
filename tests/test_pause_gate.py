"""PauseGate on one process: the resume's three rollback choices, the newest record wins, and
a gate that never raises. (Many processes: tests/test_pause_distributed.py.)"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from polling import wait_for
from grpo_monitor.contract.control import ControlRecord, write_control
from grpo_monitor.contract.run_layout import PAUSE_RECORD
from grpo_monitor.runtime.card_pause import ScrapePace, healthy_before
from grpo_monitor.sdk.pause import PauseGate, ResumeDecision
from grpo_monitor.sdk.writer import SnapshotWriter

RUN = "gate"
ONSET = "2025-01-01T00:04:10Z"  # between the saves of step 6 (t0+200 s) and step 9 (t0+300 s)
T0 = 1735689600.0  # 2025-01-01T00:00:00Z


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "grpo_monitor.cli", *args],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def writer(snapshot_dir: Path) -> SnapshotWriter:
    w = SnapshotWriter(snapshot_dir, RUN, rank=0, world_size=1)
    for step in range(1, 11):
        saved = step % 3 == 0
        events = [{"type": "checkpoint_save", "path": f"/ckpt/{step}"}] if saved else None
        w.log({"loss": 0.1}, step, events=events, timestamp=T0 + 100 * step / 3)
    return w


def _pause(snapshot_dir: Path, onset: str = ONSET, paused_at: str = "2025-01-01T00:04:20Z") -> None:
    write_control(snapshot_dir, RUN, ControlRecord(
        state="paused", alertname="GRPONonFiniteValues", run=RUN, step=10, onset=onset,
        paused_at=paused_at, fingerprint="fp"))


def _check_while(snapshot_dir: Path, gate: PauseGate, *resume_args: str) -> ResumeDecision:
    box: list[ResumeDecision | None] = []
    t = threading.Thread(target=lambda: box.append(gate.check(11)), daemon=True)
    t.start()
    # paused: the gate marks it in the snapshot before it waits
    wait_for(lambda: '"type":"paused"' in (snapshot_dir / RUN / "rank-0.jsonl").read_text(), 10)
    assert t.is_alive() and not box
    res = _cli("resume", RUN, "--snapshot.dir", str(snapshot_dir), *resume_args)
    assert res.returncode == 0, res.stderr
    t.join(10)
    assert not t.is_alive() and box and box[0] is not None
    return box[0]


@pytest.mark.parametrize(("args", "step", "path", "said"), [
    ((), 6, "/ckpt/6", "asks its trainer to roll back to the last healthy checkpoint, if one was saved "
                       "before the card's onset"),
    (("--rollback-to", "3"), 3, "/ckpt/3", "asks its trainer to roll back to the checkpoint of step 3"),
    (("--no-rollback",), None, None, "asks its trainer to go on where it stopped"),
])
def test_resume_chooses_where_training_goes_on(snapshot_dir: Path, writer: SnapshotWriter,
                                               args: tuple[str, ...], step: int | None,
                                               path: str | None, said: str) -> None:
    _pause(snapshot_dir)
    gate = PauseGate(writer, poll_interval=0.02)
    decision = _check_while(snapshot_dir, gate, *args)
    assert (decision.rollback_step, decision.rollback_path) == (step, path)
    assert decision.paused_at_step == 11 and decision.record["state"] == "running"
    text = (snapshot_dir / RUN / "rank-0.jsonl").read_text()
    assert text.count('"type":"paused"') == 1 and text.count('"type":"resumed"') == 1
    assert gate.check(11) is None  # resumed: it goes on
    # Resumed already: only --force writes it again.
    assert said in _cli("resume", RUN, "--snapshot.dir", str(snapshot_dir), "--force", *args).stdout


def test_no_checkpoint_before_the_onset_means_no_rollback(snapshot_dir: Path,
                                                          writer: SnapshotWriter) -> None:
    _pause(snapshot_dir, onset="2025-01-01T00:00:30Z")  # before the first save
    decision = _check_while(snapshot_dir, PauseGate(writer, poll_interval=0.02))
    assert decision.rollback_step is None and decision.rollback_path is None


@pytest.mark.parametrize(("onset", "said"), [
    ("2025-01-01T00:00:30Z", "its trainer went on without a rollback, at step 11"),
    (ONSET, "its trainer rolled back to the checkpoint of step 6"),
])
def test_resume_wait_says_what_the_trainer_did(snapshot_dir: Path, writer: SnapshotWriter,
                                               onset: str, said: str) -> None:
    """`resume --wait` reports the trainer's answer: its rollback mark, or its next step when
    no checkpoint predates the card's onset; never the rollback it asked for."""
    _pause(snapshot_dir, onset=onset)
    gate = PauseGate(writer, poll_interval=0.02)

    def trainer() -> None:  # the loop of examples/plain_pytorch.py, in short
        decision = gate.check(11)
        assert decision is not None
        if decision.rollback_step is not None:
            writer.log({}, decision.rollback_step, events=[
                {"type": "rollback", "from_step": 11, "to_step": decision.rollback_step}])
        writer.log({"loss": 0.1}, (decision.rollback_step or 10) + 1)

    t = threading.Thread(target=trainer, daemon=True)
    t.start()
    wait_for(lambda: '"type":"paused"' in (snapshot_dir / RUN / "rank-0.jsonl").read_text(), 10)
    res = _cli("resume", RUN, "--snapshot.dir", str(snapshot_dir), "--wait", "30s")
    t.join(10)
    assert res.returncode == 0, res.stderr
    assert "asks its trainer to roll back to the last healthy checkpoint" in res.stdout
    assert f"run {RUN!r}: {said} (rank 0)" in res.stdout, res.stdout


def test_the_newest_record_wins(snapshot_dir: Path, writer: SnapshotWriter) -> None:
    gate = PauseGate(writer, poll_interval=0.02)
    assert gate.paused() is False  # no record
    _pause(snapshot_dir)
    assert gate.paused() is True
    assert _cli("resume", RUN, "--snapshot.dir", str(snapshot_dir)).returncode == 0
    assert gate.paused() is False
    # A new card after the resume: the webhook writes a new paused record, newer than the resume.
    _pause(snapshot_dir, paused_at="2030-01-01T00:00:00Z")
    assert gate.paused() is True
    # A record that says paused is paused, whatever stamps it carries (written by hand).
    (snapshot_dir / RUN / PAUSE_RECORD).write_text('{"state": "paused"}')
    assert gate.paused() is True


def test_every_and_a_bad_record(snapshot_dir: Path, writer: SnapshotWriter) -> None:
    _pause(snapshot_dir)
    gate = PauseGate(writer, poll_interval=0.02, every=5)
    assert gate.check(12) is None  # not a deciding step
    (snapshot_dir / RUN / PAUSE_RECORD).write_text("{half")
    assert gate.check(15) is None  # unreadable: not paused, and no exception
    with pytest.raises(ValueError):
        PauseGate()


def test_healthy_before_goes_back_by_the_cards_detection_time(snapshot_dir: Path,
                                                              writer: SnapshotWriter) -> None:
    pace = ScrapePace()
    assert pace.interval() is None
    assert healthy_before("2025-01-01T00:04:10Z", None) == "2025-01-01T00:04:09.000Z"
    # The sick record reached Prometheus at most one scrape before the evaluation that fired,
    # and that evaluation came at most one interval later (+1 s of slack).
    assert healthy_before("2025-01-01T00:04:10Z", 15.0) == "2025-01-01T00:03:39.000Z"
    assert healthy_before("not a time", 15.0) is None
    # The step-6 checkpoint (t0+200 s) was saved before the onset (t0+250 s) but after the
    # moment the card's data surely did not exist yet: the rollback goes to step 3.
    write_control(snapshot_dir, RUN, ControlRecord(
        state="paused", alertname="GRPONonFiniteValues", run=RUN, onset=ONSET,
        healthy_before="2025-01-01T00:03:10Z", paused_at="2025-01-01T00:04:20Z"))
    decision = _check_while(snapshot_dir, PauseGate(writer, poll_interval=0.02))
    assert decision.rollback_step == 3

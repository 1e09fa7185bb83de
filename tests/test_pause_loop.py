"""The red-card pause loop: Alertmanager webhook -> control record -> trainer SDK pauses.

Unit-ish: the exporter's POST /-/alertmanager/webhook over real HTTP (auth, validation,
idempotency, size limit), the SDK's should_pause / wait_if_paused against `grpo-monitor resume`.
End to end on real processes: a training loop thread logging through SnapshotWriter, the
exporter (in-process, with the token), Prometheus and Alertmanager (the committed configs, the
webhook pointed at the exporter's real endpoint): a NaN loss pauses the loop, `resume` lifts it.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import Running, value
from polling import wait_for
from grpo_monitor.contract.control import (
    ControlRecord,
    read_control,
    write_control,
)
from grpo_monitor.contract.run_layout import PAUSE_RECORD
from grpo_monitor.sdk.writer import SnapshotWriter

TOKEN = "pause-loop-token-0123456789abcdef"
HOOK = "/-/alertmanager/webhook"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    p = tmp_path / "webhook-token"
    p.write_text(TOKEN + "\n")  # a trailing newline, as `... | base64 > webhook-token` leaves it
    p.chmod(0o600)
    return p


@pytest.fixture
def hooked(start_exporter: Callable[..., Running], token_file: Path) -> Running:
    return start_exporter(webhook_token_file=token_file, gpu_collector=False)


def _alert(run: str = "r1", severity: str = "critical", status: str = "firing",
           fingerprint: str = "fp1", starts: str = "2025-01-01T00:00:00.000Z",
           alertname: str = "GRPONonFiniteValues") -> dict[str, Any]:
    return {"status": status, "labels": {"alertname": alertname, "run": run, "rank": "0",
                                         "severity": severity},
            "annotations": {}, "startsAt": starts, "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": fingerprint}


def _payload(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {"version": "4", "status": "firing", "receiver": "grpo-webhook", "groupKey": "{}",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "",
            "truncatedAlerts": 0, "alerts": list(alerts)}


def _post(ex: Running, body: Any, token: str | None = TOKEN, raw: bytes | None = None) -> requests.Response:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = raw if raw is not None else json.dumps(body).encode()
    return requests.post(ex.url + HOOK, data=data, headers=headers, timeout=5)


def _outcome(ex: Running, outcome: str) -> float:
    return value(ex.scrape(), "grpo_webhook_requests_total", outcome=outcome) or 0.0


# --- the webhook ----------------------------------------------------------------------------


def test_webhook_off_without_token_file(exporter: Running, snapshot_dir: Path) -> None:
    assert _post(exporter, _payload(_alert())).status_code == 404
    assert not (snapshot_dir / "r1").exists()


def test_webhook_rejects_wrong_or_missing_token(hooked: Running, snapshot_dir: Path) -> None:
    assert _post(hooked, _payload(_alert()), token="wrong").status_code == 401
    assert _post(hooked, _payload(_alert()), token=None).status_code == 401
    r = requests.post(hooked.url + HOOK, json=_payload(_alert()),
                      headers={"Authorization": f"Basic {TOKEN}"}, timeout=5)
    assert r.status_code == 401
    assert not (snapshot_dir / "r1" / PAUSE_RECORD).exists()
    assert _outcome(hooked, "unauthorized") == 3


def test_webhook_rejects_malformed_payloads(hooked: Running, snapshot_dir: Path) -> None:
    assert _post(hooked, None, raw=b"not json{").status_code == 400
    assert _post(hooked, {**_payload(_alert()), "version": "3"}).status_code == 400
    assert _post(hooked, {"version": "4"}).status_code == 400
    assert _post(hooked, [1, 2]).status_code == 400
    assert not (snapshot_dir / "r1").exists()
    assert _outcome(hooked, "bad_request") == 4


def test_webhook_body_size_limit(hooked: Running, snapshot_dir: Path) -> None:
    big = json.dumps(_payload(_alert())).encode() + b" " * (2**20)
    assert _post(hooked, None, raw=big).status_code == 413
    assert _outcome(hooked, "too_large") == 1
    assert not (snapshot_dir / "r1").exists()
    # The server is still fine afterwards.
    assert _post(hooked, _payload(_alert(severity="warning"))).status_code == 200


def test_warnings_and_runless_alerts_are_ignored(hooked: Running, snapshot_dir: Path) -> None:
    no_run = _alert()
    del no_run["labels"]["run"]
    r = _post(hooked, _payload(_alert(severity="warning"), no_run, _alert(run="../evil")))
    assert r.status_code == 200
    assert not (snapshot_dir / "r1").exists()
    assert not (snapshot_dir.parent / "evil").exists()
    assert _outcome(hooked, "ignored") == 1


def test_critical_firing_pauses_idempotently_and_resolved_does_not_resume(
        hooked: Running, snapshot_dir: Path) -> None:
    # The exporter knows the run's newest step: the record carries it.
    run_dir = snapshot_dir / "r1"
    run_dir.mkdir()
    (run_dir / "rank-0.jsonl").write_text(
        '{"run": "r1", "rank": 0, "step": 41, "metrics": {"loss": 0.5}}\n'
        '{"run": "r1", "rank": 1, "step": 42, "metrics": {"loss": 0.5}}\n')
    hooked.wait_value("grpo_step", 42, run="r1", rank="1")

    r = _post(hooked, _payload(_alert(severity="warning", run="r1", fingerprint="w"), _alert()))
    assert r.status_code == 200, r.text
    rec = read_control(snapshot_dir, "r1")
    assert rec is not None
    assert rec.state == "paused" and rec.alertname == "GRPONonFiniteValues" and rec.step == 42
    assert rec.onset == "2025-01-01T00:00:00.000Z" and rec.fingerprint == "fp1"
    assert rec.paused_at and rec.resumed_at is None and rec.rollback_to is None
    assert _outcome(hooked, "paused") == 1
    path = run_dir / PAUSE_RECORD
    before = (path.read_bytes(), path.stat().st_ino)

    # The same alert again (Alertmanager re-sends), and a second red card: nothing changes.
    assert _post(hooked, _payload(_alert())).status_code == 200
    assert _post(hooked, _payload(_alert(fingerprint="fp2", starts="2025-01-01T00:05:00Z",
                                         alertname="GRPOKLExplosion"))).status_code == 200
    assert (path.read_bytes(), path.stat().st_ino) == before
    # Resolved does not resume.
    assert _post(hooked, _payload(_alert(status="resolved"))).status_code == 200
    assert read_control(snapshot_dir, "r1").state == "paused"  # type: ignore[union-attr]
    # The control record is no snapshot: the ingest ignores it.
    assert hooked.errors("invalid_json") == 0 and hooked.errors("invalid_record") == 0

    # After a resume, the same firing alert re-sent does not pause again; a new onset does.
    assert _cli("resume", "r1", "--snapshot.dir", str(snapshot_dir)).returncode == 0
    assert _post(hooked, _payload(_alert())).status_code == 200
    assert read_control(snapshot_dir, "r1").state == "running"  # type: ignore[union-attr]
    assert _post(hooked, _payload(_alert(starts="2025-01-02T00:00:00Z"))).status_code == 200
    rec = read_control(snapshot_dir, "r1")
    assert rec is not None and rec.state == "paused" and rec.onset == "2025-01-02T00:00:00Z"


# --- resume and the SDK ---------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "grpo_monitor.cli", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_pause_write_that_hangs_is_answered_in_time_and_scrapes_go_on(
        hooked: Running, snapshot_dir: Path) -> None:
    """A run folder on a file system that hangs (a dead NFS server): the record's write does not
    return. The webhook answers within its deadline (503: Alertmanager retries), another card
    for the run meanwhile is left to that write instead of queueing behind it, /metrics answers
    throughout, and the write, once the file system answers, pauses the run."""
    (snapshot_dir / "r1").mkdir()
    webhook = hooked.exporter.webhook
    assert webhook is not None
    answers = threading.Event()
    write = webhook.pauser._pause

    def hung(*args: Any) -> Any:
        answers.wait(30)
        return write(*args)

    webhook.pauser._pause = hung  # type: ignore[method-assign]
    webhook.write_deadline = 0.3
    try:
        late = _post(hooked, _payload(_alert()))
        assert late.status_code == 503 and "retry" in late.text
        assert _outcome(hooked, "error") == 1
        again = _post(hooked, _payload(_alert(fingerprint="fp2")))
        assert again.status_code == 200 and again.text == "nothing to pause\n"
        assert value(hooked.scrape(), "grpo_exporter_ready") == 1
        assert read_control(snapshot_dir, "r1") is None
    finally:
        answers.set()
    wait_for(lambda: (rec := read_control(snapshot_dir, "r1")) is not None and rec.state == "paused")


def test_resume_of_an_unknown_run_exits_2(snapshot_dir: Path) -> None:
    res = _cli("resume", "nope", "--snapshot.dir", str(snapshot_dir))
    assert res.returncode == 2, res
    assert "no run 'nope'" in res.stderr
    assert not (snapshot_dir / "nope").exists()


def test_resume_on_a_node_the_card_did_not_reach_writes_a_resume(snapshot_dir: Path) -> None:
    # Node-local folders: the card's record lies on another node; a resume written here reaches
    # every rank of the run through the job's process group (sdk PauseGate). With no rank here
    # waiting either, only --force writes it.
    (snapshot_dir / "r0").mkdir()
    res = _cli("resume", "r0", "--snapshot.dir", str(snapshot_dir), "--no-rollback", "--force")
    assert res.returncode == 0, res.stderr
    rec = read_control(snapshot_dir, "r0")
    assert rec is not None and rec.state == "running" and rec.resumed_at and rec.rollback == "none"


def test_sdk_should_pause_and_wait_if_paused(snapshot_dir: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    w = SnapshotWriter(snapshot_dir, "r2", rank=0, world_size=1)
    assert w.should_pause() is False
    assert w.wait_if_paused() is None
    write_control(snapshot_dir, "r2", ControlRecord(
        state="paused", alertname="GRPONonFiniteValues", run="r2", step=7, fingerprint="f",
        onset="2025-01-01T00:00:00Z", paused_at="2025-01-01T00:00:05Z"))
    assert w.should_pause() is True
    assert w.should_pause() is True  # cached: no re-read while the file is unchanged

    box: list[Any] = []
    with caplog.at_level(logging.WARNING, logger="grpo_monitor.sdk"):
        t = threading.Thread(target=lambda: box.append(w.wait_if_paused(poll_interval=0.05)))
        t.start()
        time.sleep(0.2)  # not synchronisation: only gives a wrong early return a chance to show
        assert t.is_alive()
        res = _cli("resume", "r2", "--snapshot.dir", str(snapshot_dir), "--rollback-to", "5")
        assert res.returncode == 0, res
        t.join(10)
    assert not t.is_alive()
    rec = box[0]
    assert rec["state"] == "running" and rec["rollback_to"] == 5 and rec["step"] == 7
    assert rec["paused_at"] == "2025-01-01T00:00:05Z" and rec["resumed_at"]
    paused_lines = [r.getMessage() for r in caplog.records if "paused by red card" in r.getMessage()]
    assert paused_lines == [("training paused by red card GRPONonFiniteValues at step 7; run "
                             "`grpo-monitor resume r2` to continue")]
    assert w.should_pause() is False


def test_sdk_never_raises_on_a_bad_control_record(snapshot_dir: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    w = SnapshotWriter(snapshot_dir, "r3", rank=0, world_size=1)
    (snapshot_dir / "r3" / PAUSE_RECORD).write_text("{half")
    with caplog.at_level(logging.WARNING, logger="grpo_monitor.sdk"):
        assert w.should_pause() is False
        assert w.should_pause() is False
        assert w.wait_if_paused() is None
    assert sum("cannot read the control record" in r.getMessage() for r in caplog.records) == 1


# --- the whole loop on real processes --------------------------------------------------------


def _stack_pointed_at(stack: ExitStack, workdir: Path, exporter_url: str, token_file: Path) -> str:
    """Alertmanager (webhook -> the exporter, with the token file) and Prometheus (1 s)."""
    from processes import log_tail
    from prometheus_harness import prometheus_config, start_alertmanager, start_prometheus

    workdir.mkdir(parents=True, exist_ok=True)
    am, am_url, _ = start_alertmanager(stack, workdir, exporter_url + HOOK, token_file)
    target = exporter_url.split("://", 1)[-1]
    prom, prom_url = start_prometheus(
        stack, workdir, prometheus_config(target, am_url.split("://", 1)[1], "1s"))
    stack.callback(lambda: print(f"--- alertmanager ---\n{log_tail(am)}\n--- prometheus ---\n"
                                 f"{log_tail(prom)}"))
    return prom_url


class TrainLoop(threading.Thread):
    """A trainer: a healthy step every 0.1 s through SnapshotWriter, should_pause() each step."""

    def __init__(self, writer: SnapshotWriter) -> None:
        super().__init__(name="train-loop", daemon=True)
        self.w = writer
        self.step = 0
        self.logged: list[tuple[int, float]] = []  # (step, time.time() after the write)
        self.nan_at: int | None = None
        self.t_nan: float | None = None  # monotonic, right before the NaN write
        self.paused_at: float | None = None  # monotonic, when should_pause() first said yes
        self.paused_step: int | None = None
        self.resumed: dict[str, Any] | None = None
        self.stop = threading.Event()
        self.inject_nan = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if self.w.should_pause():
                if self.paused_at is None:
                    self.paused_at, self.paused_step = time.monotonic(), self.step
                self.resumed = self.w.wait_if_paused(poll_interval=0.05)
                continue
            self.step += 1
            if self.inject_nan.is_set():
                # Once the loss is NaN the weights are, and it stays NaN (the real failure);
                # a single NaN would also leave the card's 50-step window in 5 s at 0.1 s/step.
                if self.nan_at is None:
                    self.nan_at, self.t_nan = self.step, time.monotonic()
                self.w.log({"loss": float("nan"), "reward/mean": 0.4}, self.step)
            else:
                self.w.log({"loss": 0.5, "reward/mean": 0.4, "kl/mean": 0.01}, self.step)
            self.logged.append((self.step, time.time()))
            self.stop.wait(0.1)


def test_red_card_pauses_the_training_loop_end_to_end(
        hooked: Running, snapshot_dir: Path, token_file: Path, tmp_path: Path) -> None:
    run = "loop"
    with ExitStack() as stack:
        prom_url = _stack_pointed_at(stack, tmp_path / "alerting", hooked.url, token_file)
        loop = TrainLoop(SnapshotWriter(snapshot_dir, run, rank=0, world_size=1))
        loop.start()
        stack.callback(loop.join, 10)
        stack.callback(loop.stop.set)

        def scraped() -> bool:
            r = requests.get(f"{prom_url}/api/v1/query",
                             params={"query": f'grpo_step{{run="{run}"}}'}, timeout=2).json()
            return bool(r["data"]["result"])

        wait_for(scraped, 20, 0.1)
        loop.inject_nan.set()
        control = snapshot_dir / run / PAUSE_RECORD
        try:
            wait_for(lambda: loop.paused_at is not None, 25, 0.01)
        except AssertionError:
            for q in ("ALERTS", "grpo_window_nonfinite", f'grpo_step{{run="{run}"}}'):
                print(q, requests.get(f"{prom_url}/api/v1/query", params={"query": q}, timeout=2).text)
            print("loop", loop.nan_at, loop.logged[-3:], (snapshot_dir / run / "rank-0.jsonl").read_text()[-600:])
            print("hook", hooked.scrape())
            raise
        latency = loop.paused_at - loop.t_nan  # type: ignore[operator]
        print(f"NaN snapshot written -> training loop paused: {latency:.3f} s "
              "(scrape 1 s, evaluation 1 s, group_wait 5 s)")

        rec = read_control(snapshot_dir, run)
        assert rec is not None and rec.state == "paused", rec
        assert rec.alertname == "GRPONonFiniteValues"
        assert rec.step is not None and rec.step >= loop.nan_at  # type: ignore[operator]
        # Paused within one step of the record appearing: at most one step logged after it.
        written = control.stat().st_mtime
        assert sum(1 for _, t in loop.logged if t > written) <= 1, (written, loop.logged[-3:])
        # And it stays paused: no step is logged while the record says so.
        n = len(loop.logged)
        time.sleep(0.5)  # not synchronisation: a window in which a wrong step would show
        assert len(loop.logged) == n and loop.resumed is None

        loop.inject_nan.clear()  # the trainer rolls back to a healthy checkpoint
        res = _cli("resume", run, "--snapshot.dir", str(snapshot_dir), "--rollback-to", str(loop.nan_at - 1))
        assert res.returncode == 0, res
        wait_for(lambda: len(loop.logged) > n + 2, 10)
        assert loop.resumed is not None and loop.resumed["rollback_to"] == loop.nan_at - 1
        assert loop.resumed["state"] == "running"
        assert 0 < latency < 20

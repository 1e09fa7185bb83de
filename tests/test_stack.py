"""The native stack (`grpo-monitor stack up`, `grpo-monitor demo`) as a user runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import requests
from polling import wait_for

from grpo_monitor.contract.run_layout import PAUSE_RECORD
from grpo_monitor.tools.stack import GRAFANA_MISSING, Child

CLI = [sys.executable, "-m", "grpo_monitor.cli"]
FREE_PORTS = [arg for name in ("exporter", "prometheus", "alertmanager", "grafana",
                                "victoriametrics", "vmagent", "vmalert")
              for arg in (f"--{name}.port", "0")]


class Stack:
    """`grpo-monitor stack up` in the background, its output in ``log``; ``state_dir`` None: its
    own temporary folder."""

    def __init__(self, snapshot_dir: Path, state_dir: Path | None, log: Path, *extra: str) -> None:
        state = ["--stack.dir", str(state_dir)] if state_dir is not None else []
        self.child = Child.start(
            "stack", [*CLI, "stack", "up", "--snapshot.dir", str(snapshot_dir), *state,
                      "--interval", "1s", *FREE_PORTS, *extra],
            log, Path.cwd(), env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wait_for(lambda: "Ctrl-C stops all" in self.output() or not self.child.alive(), timeout=90)
        assert self.child.alive(), self.output()
        # Each child's line: the pages it printed (checked to answer before they were printed).
        self.pages = {name: re.findall(r"http://\S+", rest) for name, rest in re.findall(
            r"^  (exporter|prometheus|alertmanager|grafana|victoriametrics|vmagent|vmalert) +(.*)$",
            self.output(), re.M)}
        self.urls = {name: "{0.scheme}://{0.netloc}".format(urlsplit(pages[0]))
                     for name, pages in self.pages.items() if pages}
        self.state_dir = Path(re.search(r"logs in (\S+?)[,)]", self.output()).group(1))  # type: ignore[union-attr]

    def output(self) -> str:
        return self.child.log.read_text(errors="replace")

    def close(self) -> None:
        # SIGTERM first, not SIGKILL: the stack must get to stop its children (own sessions).
        self.child.stop(timeout=30)

    def assert_pages_answer(self) -> None:
        for name, pages in self.pages.items():
            for page in pages:
                assert requests.get(page, timeout=5).status_code == 200, (name, page)

    def nan_run_card(self, snapshot_dir: Path) -> list[str]:
        """Write a run whose loss is NaN at step 1; the red card's three lines once printed."""
        run = snapshot_dir / "nan-run"
        run.mkdir(parents=True)
        (run / "rank-0.jsonl").write_text('{"step": 1, "metrics": {"loss": NaN}}\n')
        wait_for(lambda: re.search(r"\[RED\s*\] GRPONonFiniteValues run=nan-run", self.output()),
                 timeout=60, interval=0.5, diagnose=self.output)
        return self.output().split("GRPONonFiniteValues run=nan-run", 1)[1].splitlines()[:3]

    def child_up(self, name: str) -> bool:
        try:
            return requests.get(self.urls[name] + "/-/healthy", timeout=1).status_code == 200
        except requests.RequestException:
            return False


class Receiver:
    """An ntfy-style endpoint on loopback: the bodies a --notify.url relay POSTs to it."""

    def __init__(self) -> None:
        self.bodies: list[str] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                received.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"ntfy+http://127.0.0.1:{self.server.server_address[1]}/cards"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_stack_up_shows_where_to_look_the_cards_and_the_pause_and_cleans_up(tmp_path: Path) -> None:
    """`stack up` as a new user runs it: every page it names answers, a missing Grafana is one
    line, a red card prints as Alertmanager holds it (an inhibited yellow one does not), the pause
    record the exporter writes prints too, --notify.url relays the card, and Ctrl-C leaves no
    temporary folder behind."""
    receiver = Receiver()
    stack = Stack(tmp_path / "snapshots", None, tmp_path / "stack-up.log", "--notify.url", receiver.url)
    try:
        assert {"exporter", "prometheus", "alertmanager"} <= stack.urls.keys()
        stack.assert_pages_answer()
        if shutil.which("grafana-server") is None:
            assert GRAFANA_MISSING in stack.output()
        # This machine's Prometheus and Alertmanager are Debian's: the alerts page is the classic
        # one, and Alertmanager has no UI but its API.
        assert stack.pages["prometheus"][0].endswith("/alerts"), stack.pages
        assert stack.pages["alertmanager"][0].endswith("/api/v2/alerts"), stack.pages
        # The committed rule files are what Prometheus loaded.
        rules = requests.get(stack.urls["prometheus"] + "/api/v1/rules", timeout=5).json()
        files = {g["file"] for g in rules["data"]["groups"]}
        assert {Path(f).name for f in files} >= {"grpo-alerts.yml", "grpo-cluster.yml", "grpo-thresholds.yml"}
        # Under the summary, what Alertmanager's receivers get: the step and value, the runbook.
        card = stack.nan_run_card(tmp_path / "snapshots")
        assert "loss since step 1 (step 1 now" in card[1], card  # the key, the step it began
        assert card[2].strip().startswith("runbook: http"), card
        assert card[2].strip().endswith("#grpononfinitevalues"), card
        wait_for(lambda: "[PAUSE ] run=nan-run: GRPONonFiniteValues paused it" in stack.output(),
                 timeout=30, interval=0.5, diagnose=stack.output)
        wait_for(lambda: any("GRPONonFiniteValues" in b for b in receiver.bodies), timeout=30)
        # A yellow card of the red run is inhibited: not printed. Another run's is.
        yellow = [{"labels": {"alertname": name, "severity": "warning", "run": r},
                   "annotations": {"summary": "posted by the test"}}
                  for name, r in (("GRPOKLGrowthAccelerating", "nan-run"), ("GRPOGradNormSpike", "other"))]
        requests.post(stack.urls["alertmanager"] + "/api/v2/alerts", json=yellow, timeout=5).raise_for_status()
        wait_for(lambda: "GRPOGradNormSpike run=other" in stack.output(), timeout=30, interval=0.5)
        assert "GRPOKLGrowthAccelerating" not in stack.output(), stack.output()
        stack.child.proc.send_signal(signal.SIGINT)
        assert stack.child.proc.wait(timeout=30) == 0
        for name in ("exporter", "prometheus", "alertmanager"):
            assert not stack.child_up(name), f"{name} still answers after the stack stopped"
        assert not stack.state_dir.exists(), f"{stack.state_dir} left behind"
    finally:
        stack.close()
        receiver.close()


def test_stack_up_on_victoriametrics_raises_the_red_card_and_pauses_the_run(tmp_path: Path) -> None:
    """`stack up --stack.engine=victoriametrics`: vmagent, victoria-metrics and vmalert in
    Prometheus' place, from the same prometheus.yml and rule files; a NaN loss is a red card at
    Alertmanager, the exporter pauses the run, and Ctrl-C stops every child."""
    stack = Stack(tmp_path / "snapshots", tmp_path / "state", tmp_path / "stack-up.log",
                  "--stack.engine", "victoriametrics")
    try:
        assert {"exporter", "alertmanager", "victoriametrics", "vmagent", "vmalert"} <= stack.urls.keys()
        assert "prometheus" not in stack.urls
        stack.assert_pages_answer()
        # vmalert loaded the committed rule files, every group of them.
        groups = requests.get(stack.urls["vmalert"] + "/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert {g["name"] for g in groups} >= {"grpo-cards", "grpo-cluster", "grpo-thresholds",
                                               "grpo-signals", "grpo-coverage"}, groups
        card = stack.nan_run_card(tmp_path / "snapshots")
        run = tmp_path / "snapshots" / "nan-run"
        # vmalert ran the description's templates (the queries included) as Prometheus does.
        assert "loss since step 1 (step 1 now" in card[1], card
        assert "Raised at step 1." in card[1], card
        wait_for(lambda: "[PAUSE ] run=nan-run: GRPONonFiniteValues paused it" in stack.output(),
                 timeout=30, interval=0.5, diagnose=stack.output)
        assert json.loads((run / PAUSE_RECORD).read_text())["state"] == "paused"
        stack.child.proc.send_signal(signal.SIGINT)
        assert stack.child.proc.wait(timeout=30) == 0
        for name in ("exporter", "alertmanager", "victoriametrics", "vmagent", "vmalert"):
            assert not stack.child_up(name), f"{name} still answers after the stack stopped"
    finally:
        stack.close()


def test_a_busy_port_or_a_missing_server_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([*CLI, "demo", "--prometheus.port", str(port)], capture_output=True,
                              text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (f"grpo-monitor demo: port {port} (prometheus) is in use; move it "
                                   f"with --prometheus.port N (0: any free port)"), proc.stderr
    # No prometheus on PATH (the interpreter is named by its path).
    proc = subprocess.run([*CLI, "stack", "up", "--snapshot.dir", str(tmp_path), *FREE_PORTS],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": str(tmp_path)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "grpo-monitor stack: prometheus and prometheus-alertmanager not found on PATH"), proc.stderr


def test_stack_stops_everything_when_one_child_dies(tmp_path: Path) -> None:
    stack = Stack(tmp_path / "snapshots", tmp_path / "state", tmp_path / "stack-up.log")
    try:
        # Kill Alertmanager behind the stack's back (its argv names this stack's state folder).
        subprocess.run(["pkill", "-KILL", "-f", "--", f"--storage.path={tmp_path / 'state'}/alertmanager-data"],
                       check=True, timeout=10)
        assert stack.child.proc.wait(timeout=30) == 1
        assert "alertmanager exited" in stack.output(), stack.output()
        for name in ("exporter", "prometheus"):
            assert not stack.child_up(name), f"{name} survived its sibling's death"
    finally:
        stack.close()


def test_demo_shows_the_cards_arriving(tmp_path: Path) -> None:
    # make demo's command, compressed: a KL explosion from step 220 at 20 steps a second.
    proc = subprocess.run(
        [*CLI, "demo", *FREE_PORTS, "--interval", "1s", "--stack.dir", str(tmp_path / "state"),
         "--snapshot.dir", str(tmp_path / "snapshots"), "--onset", "220", "--step-seconds", "0.05",
         "--steps", "500", "--until-card", "GRPOKLExplosion", "--timeout", "150"],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"\[RED\s*\] GRPOKLExplosion run=demo", proc.stdout), proc.stdout
    # The generated configs are the committed ones, rewritten for loopback.
    am = (tmp_path / "state" / "alertmanager.yml").read_text()
    assert "127.0.0.1" in am and "inhibit_rules" in am


def test_demo_trainer_a_red_card_pauses_the_real_loop_and_resume_rolls_it_back(tmp_path: Path) -> None:
    """`make demo ARGS=--trainer`, faster: the tiny real trainer's verifier returns NaN once at
    step 45, the red card reaches Alertmanager, the exporter writes the pause record, PauseGate
    holds the loop, the demo resumes it (as `grpo-monitor resume` does) and the trainer rolls back
    to a checkpoint saved before the card's data existed: step 20, or step 40 (0.75 s before the
    NaN) when the card's onset leaves room for it. Ctrl-C then stops the trainer and the stack and
    removes the temporary folders."""
    log = tmp_path / "demo.log"
    demo = Child.start("demo", [*CLI, "demo", "--trainer", *FREE_PORTS, "--interval", "1s",
                                "--onset", "45", "--training-steps", "400", "--step-seconds", "0.15",
                                "--resume-after", "1"],
                       log, tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def output() -> str:
        return log.read_text(errors="replace")

    try:
        said = "rolled back from step"
        wait_for(lambda: said in output() or not demo.alive(), timeout=180, interval=0.5,
                 diagnose=output)
        out = output()
        assert demo.alive(), out
        order = [re.search(pattern, out) for pattern in (
            r"\[RED\s*\] GRPONonFiniteValues run=train-demo",
            r"\[PAUSE \] run=train-demo: GRPONonFiniteValues paused it after step (\d+)",
            r"trainer +training paused by red card GRPONonFiniteValues at step \d+",
            r"demo +1 s later, as a person would: grpo-monitor resume --snapshot.dir \S+ train-demo",
            r"run 'train-demo': paused -> running; asks its trainer to roll back to the last healthy checkpoint",
            r"trainer +resumed after \d+ s paused: rolled back from step \d+ to the checkpoint of step (20|40)")]
        assert all(order), out
        red, pause, held, demo_resumes, resumed, rolled = (m.start() for m in order)  # type: ignore[union-attr]
        # The pause record's line and the trainer's come in either order: two processes.
        assert red < min(pause, held) and max(pause, held) < demo_resumes < resumed < rolled, out
        assert out.count("GRPONonFiniteValues run=train-demo") == 1, out  # one card, its keys under it
        # Its one description names every signal the NaN reached, each from the step it began.
        card = out.split("GRPONonFiniteValues run=train-demo", 1)[1].splitlines()[1]
        named = dict(re.findall(r"(\S+) since step (\d+)", card))
        assert {"reward/mean", "loss", "grad/norm"} <= set(named), card
        assert set(named.values()) == {"45"}, card
        # ... and the step the run was at when the card was raised (the trainer steps on while the
        # scrape and the evaluation come round).
        raised = re.search(r"Raised at step (\d+)\.", card)
        assert raised and 45 <= int(raised.group(1)) <= int(order[1].group(1)), card  # type: ignore[union-attr]
        snapshots = Path(re.search(r"snapshots +(\S+)", out).group(1))  # type: ignore[union-attr]
        state = Path(re.search(r"logs in (\S+?), removed on exit", out).group(1))  # type: ignore[union-attr]
        records = [json.loads(line) for line in (snapshots / "train-demo" / "rank-0.jsonl").read_text().splitlines()]
        events = [e["type"] for r in records for e in r.get("events", [])]
        assert {"paused", "resumed", "rollback", "checkpoint_save"} <= set(events), events
        rollback = next(r for r in records if any(e["type"] == "rollback" for e in r.get("events", [])))
        assert rollback["step"] == int(order[-1].group(1))  # type: ignore[union-attr]
        demo.proc.send_signal(signal.SIGINT)
        assert demo.proc.wait(timeout=60) == 0, output()
        assert not snapshots.exists() and not state.exists(), output()
    finally:
        demo.stop(timeout=30)


def test_the_pause_line_says_what_the_run_does(tmp_path: Path) -> None:
    # A trainer that reads pause records stops at the step boundary after the one the card saw;
    # the demo's simulated run reads none and goes on, and its line says so.
    from grpo_monitor.contract.control import ControlRecord, write_control
    from grpo_monitor.tools.stack import PausePrinter

    said: list[str] = []
    printer = PausePrinter(tmp_path, said.append)
    printer.deaf.add("simulated")
    for run in ("trainer", "simulated"):
        (tmp_path / run).mkdir()
        write_control(tmp_path, run, ControlRecord(state="paused", alertname="GRPOKLExplosion",
                                                   run=run, step=352))
    printer.poll()
    trainer = next(line for line in said if "run=trainer" in line)
    simulated = next(line for line in said if "run=simulated" in line)
    assert "paused it after step 352; its trainer waits at its next step boundary" in trainer
    assert ("wrote its pause record after step 352, but this simulated run reads no pause record "
            "and goes on") in simulated and "waits" not in simulated


def test_the_resume_line_says_what_the_trainer_did(tmp_path: Path) -> None:
    """A resume record asks; the line says a rollback only once the trainer logged one, and
    that it went on without one when it did."""
    from grpo_monitor.contract.control import ControlRecord, write_control
    from grpo_monitor.tools.stack import PausePrinter

    said: list[str] = []
    printer = PausePrinter(tmp_path, said.append)

    def log(run: str, *records: dict) -> None:
        with open(tmp_path / run / "rank-0.jsonl", "a") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in records))

    for run in ("back", "on"):
        (tmp_path / run).mkdir()
        log(run, *({"step": s, "metrics": {"loss": 0.1}} for s in range(1, 70)))
        write_control(tmp_path, run, ControlRecord(state="paused", alertname="GRPORewardCollapse",
                                                   run=run, step=68))
    printer.poll()
    for run in ("back", "on"):
        log(run, {"step": 69, "metrics": {}, "events": [{"type": "paused"}]})
        write_control(tmp_path, run, ControlRecord(state="running", run=run, rollback="last_healthy"))
    printer.poll()
    asked = [line for line in said if "[resume]" in line]
    assert len(asked) == 2 and all("resume written, asking for a rollback to the last healthy "
                                   "checkpoint" in line for line in asked), said
    printer.poll()
    assert len([line for line in said if "[resume]" in line]) == 2  # no answer yet: nothing more
    log("back", {"step": 69, "metrics": {}, "events": [{"type": "resumed"}]},
        {"step": 20, "metrics": {}, "events": [{"type": "rollback", "from_step": 70, "to_step": 20}]},
        {"step": 21, "metrics": {"loss": 0.1}})
    log("on", {"step": 69, "metrics": {}, "events": [{"type": "resumed"}]},
        {"step": 70, "metrics": {"loss": 0.1}})
    printer.poll()
    assert "  [resume] run=back: its trainer rolled back to the checkpoint of step 20" in said, said
    assert "  [resume] run=on: its trainer went on without a rollback, at step 70" in said, said
    assert not any("rolled back" in line for line in said if "run=on" in line)


def test_the_demo_says_when_its_simulated_run_ends(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*CLI, "demo", *FREE_PORTS, "--interval", "1s", "--snapshot.dir", str(tmp_path / "snapshots"),
         "--step-seconds", "0.01", "--steps", "30", "--exit-after-run", "--timeout", "120"],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "demo          the simulated run 'demo' wrote its last step (30); stopping" in proc.stdout, proc.stdout

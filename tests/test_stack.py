"""The native stack (`grpo-monitor stack up`, `grpo-monitor demo`) as a user runs it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import requests
from polling import wait_for

from grpo_monitor.tools.stack import Child

CLI = [sys.executable, "-m", "grpo_monitor.cli"]
FREE_PORTS = ["--exporter.port", "0", "--prometheus.port", "0", "--alertmanager.port", "0",
              "--grafana.port", "0"]


class Stack:
    """`grpo-monitor stack up` in the background, its output in ``log``."""

    def __init__(self, snapshot_dir: Path, state_dir: Path, log: Path) -> None:
        self.state_dir = state_dir
        self.child = Child.start(
            "stack", [*CLI, "stack", "up", "--snapshot.dir", str(snapshot_dir), "--stack.dir",
                      str(state_dir), "--interval", "1s", *FREE_PORTS],
            log, Path.cwd(), env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wait_for(lambda: "Ctrl-C stops all" in self.output() or not self.child.alive(), timeout=90)
        assert self.child.alive(), self.output()
        self.urls = dict(re.findall(r"^\s+(exporter|prometheus|alertmanager|grafana)\s+(\S+)",
                                    self.output(), re.M))

    def output(self) -> str:
        return self.child.log.read_text(errors="replace")

    def close(self) -> None:
        # SIGTERM first, not SIGKILL: the stack must get to stop its children (own sessions).
        self.child.stop(timeout=30)

    def child_up(self, name: str) -> bool:
        url = self.urls[name].removesuffix("/metrics")
        try:
            return requests.get(url + "/-/healthy", timeout=1).status_code == 200
        except requests.RequestException:
            return False


def test_stack_up_raises_a_red_card_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    stack = Stack(tmp_path / "snapshots", tmp_path / "state", tmp_path / "stack-up.log")
    try:
        assert {"exporter", "prometheus", "alertmanager"} <= stack.urls.keys()
        # The committed rule files are what Prometheus loaded.
        rules = requests.get(stack.urls["prometheus"] + "/api/v1/rules", timeout=5).json()
        files = {g["file"] for g in rules["data"]["groups"]}
        assert {Path(f).name for f in files} >= {"grpo-alerts.yml", "grpo-cluster.yml", "grpo-thresholds.yml"}
        run = tmp_path / "snapshots" / "nan-run"
        run.mkdir(parents=True)
        (run / "rank-0.jsonl").write_text('{"step": 1, "metrics": {"loss": NaN}}\n')

        def red_card() -> bool:
            alerts = requests.get(stack.urls["alertmanager"] + "/api/v2/alerts", timeout=2).json()
            return any(a["labels"].get("alertname") == "GRPONonFiniteValues"
                       and a["labels"].get("run") == "nan-run" for a in alerts)

        wait_for(red_card, timeout=60, interval=0.5)
        stack.child.proc.send_signal(signal.SIGINT)
        assert stack.child.proc.wait(timeout=30) == 0
        for name in ("exporter", "prometheus", "alertmanager"):
            assert not stack.child_up(name), f"{name} still answers after the stack stopped"
    finally:
        stack.close()


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

"""--alertmanager.url: an exporter asks the real Alertmanager for red cards and pauses the runs
of its own node, the way each exporter of a fleet does whichever one the webhook reaches."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import requests
from conftest import Running, value
from polling import wait_for
from prometheus_harness import start_alertmanager

from grpo_monitor.contract.control import read_control, write_control
from grpo_monitor.tools.stack import free_port


def _card(run: str, severity: str = "critical", alertname: str = "GRPONonFiniteValues") -> dict[str, Any]:
    return {"labels": {"alertname": alertname, "run": run, "rank": "0", "severity": severity,
                       "card": "red" if severity == "critical" else "yellow"},
            "annotations": {"summary": "test"}}


def _alertmanager(stack: ExitStack, workdir: Path) -> str:
    token = workdir / "token"
    token.write_text("unused-token\n")
    # The committed routing; its webhook points nowhere: only the poll may pause here.
    return start_alertmanager(stack, workdir, "http://127.0.0.1:9/hook", token)[1]


def test_the_poll_pauses_this_nodes_runs_only(tmp_path: Path, snapshot_dir: Path,
                                              start_exporter: Callable[..., Running]) -> None:
    with ExitStack() as stack:
        am = _alertmanager(stack, tmp_path)
        for run in ("here", "resumed", "warned"):
            (snapshot_dir / run).mkdir()
        # A run someone resumed already while its card still fires keeps running.
        exporter = start_exporter(alertmanager_url=am, alertmanager_poll_interval=0.2,
                                  gpu_collector=False)
        requests.post(f"{am}/api/v2/alerts", json=[
            _card("here"), _card("elsewhere"), _card("warned", "warning", "GRPOKLGrowthAccelerating"),
            _card("resumed")], timeout=5).raise_for_status()

        wait_for(lambda: read_control(snapshot_dir, "here") is not None
                 and read_control(snapshot_dir, "resumed") is not None, 20)
        rec = read_control(snapshot_dir, "here")
        assert rec is not None and rec.state == "paused" and rec.alertname == "GRPONonFiniteValues"
        assert rec.onset and rec.fingerprint
        # the person resumes "resumed"; later polls of the same card leave it running
        first = read_control(snapshot_dir, "resumed")
        assert first is not None
        write_control(snapshot_dir, "resumed", first.model_copy(update={"state": "running"}))
        polls = value(exporter.scrape(), "grpo_alertmanager_polls_total", outcome="unchanged") or 0
        exporter.wait_value("grpo_alertmanager_polls_total", lambda v: (v or 0) >= polls + 3,
                            outcome="unchanged")
        rec2 = read_control(snapshot_dir, "resumed")
        assert rec2 is not None and rec2.state == "running"
        assert read_control(snapshot_dir, "warned") is None  # a yellow card never pauses
        assert not (snapshot_dir / "elsewhere").exists()  # another node's run: not created here
        s = exporter.scrape()
        assert value(s, "grpo_alertmanager_polls_total", outcome="paused") == 1
        assert value(s, "grpo_alertmanager_polls_total", outcome="error") == 0


def test_an_unreachable_alertmanager_is_counted_not_fatal(snapshot_dir: Path,
                                                          start_exporter: Callable[..., Running]) -> None:
    exporter = start_exporter(alertmanager_url=f"http://127.0.0.1:{free_port()}",
                              alertmanager_poll_interval=0.1, gpu_collector=False)
    exporter.wait_value("grpo_alertmanager_polls_total", lambda v: (v or 0) >= 2, outcome="error")
    assert requests.get(f"{exporter.url}/metrics", timeout=5).status_code == 200

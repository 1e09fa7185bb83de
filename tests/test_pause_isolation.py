"""Each pause on its own: a run whose pause record cannot be written never delays or drops the
pause of another run, from the webhook or from the Alertmanager poll; each outcome is counted
(grpo_card_pauses_total{result})."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import requests
from conftest import Running, value
from polling import wait_for
from test_alertmanager_poll import _alertmanager, _card

from grpo_monitor.contract.control import read_control
from grpo_monitor.contract.run_layout import PAUSE_RECORD

TOKEN = "isolation-token"
PATH = "/-/alertmanager/webhook"


def _unwritable(snapshot_dir: Path, run: str) -> None:
    """A run folder whose pause record cannot be written: a folder sits at its name (a rename
    cannot replace a folder; permissions would not stop root, which the suite may run as)."""
    (snapshot_dir / run / PAUSE_RECORD).mkdir(parents=True)


def _alert(run: str) -> dict[str, Any]:
    return {"status": "firing", "labels": {"alertname": "GRPONonFiniteValues", "run": run,
                                           "severity": "critical"},
            "startsAt": "2025-01-01T00:00:00Z", "fingerprint": f"fp-{run}"}


def test_the_webhook_pauses_the_writable_run_of_a_payload(
        start_exporter: Callable[..., Running], snapshot_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    _unwritable(snapshot_dir, "stuck")
    (snapshot_dir / "fine").mkdir()
    exporter = start_exporter(webhook_token_file=tmp_path / "token", gpu_collector=False)
    payload = {"version": "4", "status": "firing", "alerts": [_alert("stuck"), _alert("fine")]}
    r = requests.post(exporter.url + PATH, json=payload, timeout=10,
                      headers={"Authorization": f"Bearer {TOKEN}"})
    # The stuck run is retried by Alertmanager (500); the other is paused at once.
    assert r.status_code == 500, r.text
    assert "paused: fine" in r.text and "stuck (write_error)" in r.text
    rec = read_control(snapshot_dir, "fine")
    assert rec is not None and rec.state == "paused"
    s = exporter.scrape()
    assert value(s, "grpo_card_pauses_total", result="paused") == 1
    assert value(s, "grpo_card_pauses_total", result="write_error") == 1
    # A retry changes nothing for the paused run and counts the stuck one again.
    r = requests.post(exporter.url + PATH, json=payload, timeout=10,
                      headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 500 and "nothing to pause" in r.text
    s = exporter.scrape()
    assert value(s, "grpo_card_pauses_total", result="unchanged") == 1
    assert value(s, "grpo_card_pauses_total", result="write_error") == 2


def test_the_poll_pauses_the_writable_run(tmp_path: Path, snapshot_dir: Path,
                                          start_exporter: Callable[..., Running]) -> None:
    with ExitStack() as stack:
        am = _alertmanager(stack, tmp_path)
        _unwritable(snapshot_dir, "stuck")
        (snapshot_dir / "fine").mkdir()
        exporter = start_exporter(alertmanager_url=am, alertmanager_poll_interval=0.2,
                                  gpu_collector=False)
        # The stuck run's card first, as Alertmanager may list it.
        requests.post(f"{am}/api/v2/alerts", json=[_card("stuck"), _card("fine")],
                      timeout=5).raise_for_status()
        wait_for(lambda: read_control(snapshot_dir, "fine") is not None, 20)
        exporter.wait_value("grpo_card_pauses_total", lambda v: (v or 0) >= 2, result="write_error")
        s = exporter.scrape()
        assert value(s, "grpo_card_pauses_total", result="paused") == 1
        assert value(s, "grpo_alertmanager_polls_total", outcome="paused") == 1
        assert value(s, "grpo_alertmanager_polls_total", outcome="error") == 0

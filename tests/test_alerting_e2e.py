"""End to end on real processes: a NaN loss in a snapshot becomes a red card at the webhook.

snapshot file -> exporter (in-process, inotify) -> prometheus (scrape 1 s, rules 1 s, the
committed rule files) -> prometheus-alertmanager (the committed routes and inhibit rules) ->
a webhook listener in this process. Also proves the committed inhibit rules on the real
Alertmanager: the red card mutes a yellow card of the same run, not of another run, and the
reward-hacking card mutes the length-shift card of its run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import Running
from polling import wait_for
from prometheus_harness import REPO, AlertStack, alert_stack, latency_report, write_nonfinite_loss

RUN = "e2e"
DEADLINE_S = 60.0  # generous: the target (~9 s) is checked by bench/bench_alert_latency.py


@pytest.fixture
def stack(exporter: Running, tmp_path: Path) -> Iterator[AlertStack]:
    with alert_stack(tmp_path / "alerting", exporter.url) as s:
        yield s
        # Teardown output is shown by pytest only when the test failed.
        print(s.logs())


def _synthetic(alertname: str, run: str, severity: str = "warning") -> dict[str, Any]:
    return {"labels": {"alertname": alertname, "run": run, "rank": "0", "severity": severity,
                       "card": "yellow" if severity == "warning" else "red"},
            "annotations": {"summary": "synthetic, posted by the test"}}


def _state(alerts: list[dict[str, Any]], alertname: str, run: str) -> dict[str, Any] | None:
    for a in alerts:
        if a["labels"].get("alertname") == alertname and a["labels"].get("run") == run:
            return a["status"]
    return None


def test_nan_loss_pages_red_card_and_inhibits_yellow(stack: AlertStack, snapshot_dir: Path) -> None:
    stack.wait_scraping()

    # Yellow cards, pushed straight to Alertmanager: one for the run that is about to go red,
    # one for a calm run, and a reward-hacking / length-shift pair for a third run.
    stack.post_alerts([
        _synthetic("GRPOResponseLengthShift", RUN),
        _synthetic("GRPOKLTailOutliers", "calm"),
        _synthetic("GRPORewardHackingSuspected", "hack"),
        _synthetic("GRPOResponseLengthShift", "hack"),
    ])

    def states() -> dict[tuple[str, str], str] | None:
        alerts = stack.am_alerts()
        out = {}
        for name, run in (("GRPOResponseLengthShift", RUN), ("GRPOKLTailOutliers", "calm"),
                          ("GRPORewardHackingSuspected", "hack"),
                          ("GRPOResponseLengthShift", "hack")):
            st = _state(alerts, name, run)
            if st is None:
                return None
            out[name, run] = st["state"]
        return out

    before = wait_for(states, 10, what="synthetic alerts in Alertmanager", diagnose=stack.diagnose)
    # Before the red card, the e2e run's yellow card is active: what mutes it later is the NaN.
    assert before == {("GRPOResponseLengthShift", RUN): "active",
                      ("GRPOKLTailOutliers", "calm"): "active",
                      ("GRPORewardHackingSuspected", "hack"): "active",
                      ("GRPOResponseLengthShift", "hack"): "suppressed"}, before

    t0 = write_nonfinite_loss(snapshot_dir, RUN)
    post, alert = stack.wait_post(DEADLINE_S, alertname="GRPONonFiniteValues", run=RUN)
    latency = post.arrived - t0
    print(f"NaN written -> red-card webhook POST: {latency:.3f} s "
          f"(scrape {stack.interval_s:g} s, evaluation {stack.interval_s:g} s, "
          f"group_wait {stack.group_wait_s:g} s)")

    body = post.body
    assert post.path == "/-/alertmanager/webhook"
    assert post.authorization == f"Bearer {stack.token}"
    assert body["version"] == "4"
    assert body["status"] == "firing"
    assert body["receiver"] == "grpo-webhook"
    # The red route groups by alertname and run.
    assert body["groupLabels"] == {"alertname": "GRPONonFiniteValues", "run": RUN}
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["card"] == "red"
    assert alert["labels"]["rank"] == "0"
    assert "key" not in alert["labels"]  # one card a rank, its keys in the description
    ann = alert["annotations"]
    assert ann.get("summary")
    assert ann.get("runbook_url", "").endswith("#grpononfinitevalues")
    # The description's templates ran in Prometheus: value, run, rank, each key with the step
    # its streak began, and the step now.
    assert f"1 signal(s) NaN or infinite in run {RUN}, rank 0: loss since step 1 (step 1 now" in \
        ann.get("description", ""), ann
    # ... and the step the card was raised at, read back through the engine's ALERTS_FOR_STATE
    # (or, at the evaluation that raised it, the step then).
    assert "). Raised at step 1." in ann["description"], ann
    assert latency < DEADLINE_S

    # Inhibition on the real Alertmanager: red mutes yellow of the same run only.
    after = wait_for(lambda: (s := states()) and s[("GRPOResponseLengthShift", RUN)] == "suppressed"
                     and s, 10, what="yellow card of the red run suppressed", diagnose=stack.diagnose)
    assert after == {("GRPOResponseLengthShift", RUN): "suppressed",
                     ("GRPOKLTailOutliers", "calm"): "active",
                     ("GRPORewardHackingSuspected", "hack"): "active",
                     ("GRPOResponseLengthShift", "hack"): "suppressed"}, after
    alerts = stack.am_alerts()
    red = [a for a in alerts if a["labels"].get("alertname") == "GRPONonFiniteValues"]
    assert red and red[0]["status"]["state"] == "active"
    assert _state(alerts, "GRPOResponseLengthShift", RUN)["inhibitedBy"] == [red[0]["fingerprint"]]

    # No yellow card reached the webhook (their route waits 1 m before its first notification).
    assert all(a["labels"].get("severity") == "critical"
               for p in stack.listener.snapshot() for a in p.body.get("alerts", []))

    if os.environ.get("GRPO_BENCH_OUT"):
        out = REPO / "bench" / "results" / "alert_latency.json"
        report = latency_report([latency], stack.interval_s, stack.group_wait_s,
                                source="tests/test_alerting_e2e.py")
        out.write_text(json.dumps(report, indent=2) + "\n")

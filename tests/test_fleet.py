"""docs/scaling.md's fleet on real processes: two nodes, file_sd, cards across exporters,
an exporter going down, remote write to a long-term store.

tests/fleet.py starts two exporters (node-a, node-b, each on its own snapshot folder), the
fleet's Prometheus from the committed prometheus-fleet.yml (targets from a file_sd folder,
remote_write on), a second Prometheus as the remote-write receiver, and Alertmanager from the
committed alertmanager.yml with its webhook on node-a's exporter. Two real torch.distributed
(gloo) jobs of 4 ranks each write to it, ranks 0-1 on node-a and 2-3 on node-b:

* `plain`: examples/plain_pytorch.py as it is, 20 steps, ended cleanly;
* `stall`: tests/fleet_trainer.py (the example's step, paced), whose node-b ranks stop writing
  snapshots at step STOP_AT while they keep joining the all-reduces, so the job goes on.

One fleet and both jobs are shared by the module (starting them is most of the time); every
test leaves the fleet as it found it (both targets listed, both exporters up).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from conftest import scrape, value
from fleet import FLEET_YML, Fleet, start_fleet
from gloo_job import GlooJob
from polling import holds_for, wait_for
from prometheus_harness import PROMETHEUS_DIR, REPO
from test_dashboards import queries, substitute

from grpo_monitor.contract.run_layout import PAUSE_RECORD
from grpo_monitor.contract.thresholds import TABLE
from grpo_monitor.runtime.config import parse_duration

EXAMPLE = REPO / "examples" / "plain_pytorch.py"
TRAINER = Path(__file__).with_name("fleet_trainer.py")
CLUSTER_RULES = PROMETHEUS_DIR / "rules" / "grpo-cluster.yml"
PLAIN, PLAIN_STEPS = "plain", 20
STALL = "stall"
STOP_AT = 5  # node-b's ranks of `stall` write their last snapshot at step STOP_AT - 1
STEP_S = 0.2  # the stall job's pace: 20 steps past STOP_AT in ~4 s
# Long enough to outlast the module (it is stopped with the fleet), short enough to end by
# itself if something leaks.
STALL_STEPS = 3000
RANK_LAG_STEPS = next(t.value for t in TABLE if t.name == "rank_lag_steps")
DEADLINE_S = 60.0  # generous per wait: two cores run the fleet and eight ranks
# Panels of the dashboards whose queries the long-term store must answer like the fleet's
# Prometheus: exporter series, a cross-exporter aggregation, a recording rule, a threshold.
DASHBOARD_PANELS = {
    ("grpo-training", "Step"),
    ("grpo-training", "Reward mean"),
    ("grpo-training", "KL mean"),
    ("grpo-cluster", "Step time per rank"),
    ("grpo-cluster", "Step lag"),
    ("grpo-cluster", "Rank → GPU"),
}


@dataclass
class Jobs:
    plain: GlooJob
    stall: GlooJob


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with start_fleet(tmp_path_factory.mktemp("fleet")) as f:
        yield f
        print(f.logs())  # shown by pytest only when a test failed


@pytest.fixture(scope="module")
def jobs(fleet: Fleet) -> Jobs:
    # Both jobs start together, so that their eight torch start-ups overlap.
    plain = fleet.launch(EXAMPLE, PLAIN, ["--steps", str(PLAIN_STEPS)])
    stall = fleet.launch(TRAINER, STALL, [
        "--steps", str(STALL_STEPS), "--step-seconds", str(STEP_S),
        "--stop-logging-rank", "2", "--stop-logging-rank", "3", "--stop-logging-at", str(STOP_AT)])
    assert plain.placement == stall.placement == [0, 0, 1, 1]  # node-a, node-a, node-b, node-b
    return Jobs(plain, stall)


@pytest.fixture
def plain_done(jobs: Jobs) -> None:
    jobs.plain.wait(DEADLINE_S * 2)


def _series(n: int) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda result: len(result) == n


def _series_at(n: int, value: float) -> Callable[[list[dict[str, Any]]], bool]:
    """``n`` series, each at ``value``: a job that has exited is scraped at its end only at the
    next scrape, and its ranks may exit within one scrape interval of their last step."""
    return lambda result: len(result) == n and all(float(r["value"][1]) == value for r in result)


def _empty(result: list[dict[str, Any]]) -> bool:
    return not result


def _one(result: list[dict[str, Any]]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def _by(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"].get(k, "") for k in labels): float(r["value"][1]) for r in result}


def _config_loaded_at(fleet: Fleet) -> str:
    info = requests.get(f"{fleet.prometheus_url}/api/v1/status/runtimeinfo", timeout=5).json()
    return str(info["data"]["lastConfigTime"])


# --- a: file_sd ---------------------------------------------------------------------------------


def test_file_sd_finds_both_nodes_and_the_run_spans_them(fleet: Fleet, jobs: Jobs,
                                                         plain_done: None) -> None:
    a, b = fleet.nodes
    up = fleet.query('up{job="grpo-exporter"}')
    assert {r["metric"]["instance"]: r["value"][1] for r in up} == {a.target: "1", b.target: "1"}
    # The relabeling keeps the host as `node`; on loopback both are 127.0.0.1, so the two
    # exporters are told apart by `instance` alone.
    assert {r["metric"]["node"] for r in up} == {"127.0.0.1"}

    # The run is whole only across both exporters: 2 ranks on each, 4 in all.
    ranks = fleet.wait_query(f'grpo_step{{run="{PLAIN}"}}', _series_at(4, PLAIN_STEPS),
                             DEADLINE_S, what="4 ranks at their last step")
    assert _by(ranks, "rank", "instance") == {
        ("0", a.target): PLAIN_STEPS, ("1", a.target): PLAIN_STEPS,
        ("2", b.target): PLAIN_STEPS, ("3", b.target): PLAIN_STEPS}
    assert _one(fleet.query(f'count by (run) (grpo_step{{run="{PLAIN}"}})')) == 4
    assert _one(fleet.query(f'max by (run) (grpo_world_size{{run="{PLAIN}"}})')) == 4
    fleet.wait_query(f'max by (run) (grpo_run_ended{{run="{PLAIN}"}})', _series_at(1, 1),
                     DEADLINE_S, what="the run's end mark")

    # A node joins and leaves through the file_sd folder alone: a rewritten file adds and
    # removes a target, a new file adds one and deleting it removes it, all without a
    # reload. The extra node is no part of the jobs, so the other tests' cards are untouched.
    def targets_are(*want: str) -> None:
        wait_for(lambda: set(fleet.active_targets()) == set(want), DEADLINE_S, interval=0.2,
                 what=f"active targets {want}", diagnose=fleet.diagnose)

    loaded_at = _config_loaded_at(fleet)
    with fleet.extra_node("node-c") as c:
        ready = f'grpo_exporter_ready{{instance="{c.target}"}}'
        try:
            fleet.write_targets([a.target, b.target, c.target])
            joined = fleet.wait_query(f"{ready} == 1", timeout=DEADLINE_S)
            assert joined[0]["metric"]["node"] == "127.0.0.1"
            fleet.write_targets([a.target, b.target])
            targets_are(a.target, b.target)
            # A removed target's series end at once (staleness), not after 5 minutes.
            fleet.wait_query(ready, _empty, DEADLINE_S, what="no series of the removed target")

            # One file per job, as the Slurm example of docs/scaling.md writes, with a label.
            fleet.write_targets([c.target], file="job-42.yml", labels={"partition": "loopback"})
            joined = fleet.wait_query(f"{ready} == 1", timeout=DEADLINE_S)
            assert joined[0]["metric"]["partition"] == "loopback"
            fleet.remove_targets("job-42.yml")
            targets_are(a.target, b.target)
            fleet.wait_query(ready, _empty, DEADLINE_S, what="no series of the removed file")
        finally:
            fleet.reset_targets()
    assert _config_loaded_at(fleet) == loaded_at, "Prometheus reloaded its configuration"
    # The jobs' nodes were never touched: the run still has its 4 ranks.
    assert _one(fleet.query(f'count by (run) (grpo_step{{run="{PLAIN}"}})')) == 4


# --- b: GRPORankStalled across exporters --------------------------------------------------------


def test_rank_stalled_fires_when_only_another_exporter_shows_the_lag(fleet: Fleet,
                                                                     jobs: Jobs) -> None:
    """Every rank of node-b goes silent at once, so node-b's exporter alone sees no lag at all:
    the card can only come from comparing its ranks with node-a's, on the other exporter.
    (With one silent rank only, node-b's other rank would show the lag on the same exporter,
    and a per-exporter rule would pass the test just as well.)"""
    a, b = fleet.nodes
    alerts = fleet.wait_query(
        f'ALERTS{{alertname="GRPORankStalled",alertstate="firing",run="{STALL}"}}',
        lambda r: {x["metric"]["rank"] for x in r} == {"2", "3"}, DEADLINE_S,
        what="the card for ranks 2 and 3, and no other")
    assert {x["metric"]["instance"] for x in alerts} == {b.target}
    assert all(x["metric"]["severity"] == "critical" for x in alerts)

    # node-b on its own: both ranks at the last step they wrote, level with each other.
    local = scrape(b.url)
    assert value(local, "grpo_step", run=STALL, rank="2") == STOP_AT - 1
    assert value(local, "grpo_step", run=STALL, rank="3") == STOP_AT - 1
    assert value(local, "grpo_step", run=STALL, rank="0") is None  # node-a's ranks: not here
    # Across exporters: node-a's ranks are past the threshold, and node-b's exporter is fine.
    lead = _one(fleet.query(f'max by (run) (grpo_step{{run="{STALL}",instance="{a.target}"}})'))
    assert lead > STOP_AT - 1 + RANK_LAG_STEPS
    assert _one(fleet.query(f'up{{instance="{b.target}"}}')) == 1
    # The job itself goes on: every rank is alive, the silent ones still in the all-reduces.
    assert jobs.stall.alive() == [0, 1, 2, 3], jobs.stall.logs()

    # Alertmanager has the card, and (red route: group_wait 5 s) the webhook on node-a paused
    # the run there: the grpo-webhook receiver with the shared token reaches that exporter.
    def in_alertmanager() -> set[str]:
        return {x["labels"]["rank"] for x in fleet.am_alerts()
                if x["labels"].get("alertname") == "GRPORankStalled"
                and x["labels"].get("run") == STALL and x["status"]["state"] == "active"}

    wait_for(lambda: in_alertmanager() == {"2", "3"}, DEADLINE_S, what="card in Alertmanager",
             diagnose=fleet.diagnose)
    assert fleet.webhook_node is a
    control = a.snapshot_dir / STALL / PAUSE_RECORD
    wait_for(control.is_file, DEADLINE_S, what=f"{control} written by node-a's webhook",
             diagnose=fleet.diagnose)
    record = json.loads(control.read_text())
    assert (record["state"], record["alertname"], record["run"]) == \
        ("paused", "GRPORankStalled", STALL)
    assert (value(scrape(a.url), "grpo_webhook_requests_total", outcome="paused") or 0) >= 1
    # Only the webhook's node: node-b's exporter got no request.
    assert not (b.snapshot_dir / STALL / PAUSE_RECORD).exists()


# --- c: one exporter going down -----------------------------------------------------------------


def test_exporter_down_leaves_the_other_node_visible_and_comes_back(fleet: Fleet,
                                                                    jobs: Jobs) -> None:
    """GRPOExporterDown keeps its committed `for: 2m` (the rule files are loaded unchanged, and
    Prometheus has no way to shorten a `for:` short of rewriting the rule), so the test sees
    the card pending, with that 2 minutes as its hold, not firing. Pending is the proof that
    matters here: the expression matched the dead target of the fleet's job; the move from
    pending to firing after `for:` is Prometheus' own."""
    a, b = fleet.nodes
    fleet.wait_query(f'grpo_step{{run="{STALL}",instance="{b.target}"}}',
                     _series(2), DEADLINE_S, what="node-b's 2 ranks")
    b.stop(hard=True)
    try:
        fleet.wait_query(f'up{{instance="{b.target}"}} == 0', timeout=DEADLINE_S)
        pending = fleet.wait_query(
            f'ALERTS{{alertname="GRPOExporterDown",instance="{b.target}"}}', timeout=DEADLINE_S)
        assert [x["metric"]["alertstate"] for x in pending] == ["pending"]
        rule = next(r for g in requests.get(f"{fleet.prometheus_url}/api/v1/rules",
                                            timeout=5).json()["data"]["groups"]
                    for r in g["rules"] if r["name"] == "GRPOExporterDown")
        committed = next(r for g in yaml.safe_load(CLUSTER_RULES.read_text())["groups"]
                         for r in g["rules"] if r.get("alert") == "GRPOExporterDown")
        assert rule["state"] == "pending"
        assert rule["duration"] == parse_duration(committed["for"]) == 120
        assert not fleet.query(f'ALERTS{{alertname="GRPOExporterDown",instance="{a.target}"}}')

        # node-b's ranks leave with their exporter; world size against ranks seen tells how
        # many are missing (docs/scaling.md).
        fleet.wait_query(f'grpo_step{{instance="{b.target}"}}', _empty, DEADLINE_S,
                         what="no series of the dead exporter")
        missing = fleet.query(f'max by (run) (grpo_world_size{{run="{STALL}"}}) '
                              f'- count by (run) (grpo_step{{run="{STALL}"}})')
        assert _one(missing) == 2
        # node-a's ranks are still scraped, and still advancing.
        before = _one(fleet.query(
            f'max by (run) (grpo_step{{run="{STALL}",instance="{a.target}"}})'))
        fleet.wait_query(
            f'min by (run) (grpo_step{{run="{STALL}",instance="{a.target}"}}) > {before + 3}',
            timeout=DEADLINE_S)
        assert _one(fleet.query(f'up{{instance="{a.target}"}}')) == 1
    finally:
        if not b.alive():
            b.start()

    # Back on the same port, the same target: up again, the card gone, the run whole again
    # (node-b's exporter re-read its files: its ranks still at their last step).
    fleet.wait_query(f'up{{instance="{b.target}"}} == 1', timeout=DEADLINE_S)
    fleet.wait_query(f'ALERTS{{alertname="GRPOExporterDown",instance="{b.target}"}}',
                     _empty, DEADLINE_S, what="the card gone")
    ranks = fleet.wait_query(f'grpo_step{{run="{STALL}",instance="{b.target}"}}',
                             _series(2), DEADLINE_S, what="node-b's 2 ranks back")
    assert set(_by(ranks, "rank").values()) == {STOP_AT - 1}
    assert _one(fleet.query(f'count by (run) (grpo_step{{run="{STALL}"}})')) == 4


# --- d: remote write to a long-term store -------------------------------------------------------


Answer = set[tuple[frozenset[tuple[str, str]], str]]


def _answer(result: list[dict[str, Any]], drop: set[str]) -> Answer:
    """A result as comparable (labels less ``drop``, value) pairs."""
    return {(frozenset((k, v) for k, v in r["metric"].items() if k not in drop), r["value"][1])
            for r in result}


def test_remote_write_receiver_answers_the_dashboards_like_the_fleet(fleet: Fleet, jobs: Jobs,
                                                                     plain_done: None) -> None:
    a, b = fleet.nodes
    ext = fleet.external_labels
    assert ext == yaml.safe_load(FLEET_YML.read_text())["global"]["external_labels"]
    assert {"monitor", "cluster"} <= ext.keys()
    # The store holds the exporters' series with the fleet's external labels added.
    stored = fleet.wait_query(f'grpo_step{{run="{PLAIN}"}}', _series_at(4, PLAIN_STEPS),
                              DEADLINE_S, url=fleet.receiver_url, what="4 ranks at their last step")
    for r in stored:
        m = r["metric"]
        assert (m["monitor"], m["cluster"], m["job"], m["node"]) == \
            (ext["monitor"], ext["cluster"], "grpo-exporter", "127.0.0.1"), m
    assert _by(stored, "rank", "instance") == {
        ("0", a.target): PLAIN_STEPS, ("1", a.target): PLAIN_STEPS,
        ("2", b.target): PLAIN_STEPS, ("3", b.target): PLAIN_STEPS}
    # ... and the rules' outputs, which it does not compute itself.
    fleet.wait_query(f'run_rank:grpo_step:lag{{run="{PLAIN}",cluster="{ext["cluster"]}"}}',
                     _series(4), DEADLINE_S, url=fleet.receiver_url, what="4 ranks")

    # The dashboards' queries (for the ended run: its series no longer change) give the same
    # answer from both, label for label and value for value, less the external labels.
    where = {(uid, f"panel {title!r}"): (uid, title) for uid, title in DASHBOARD_PANELS}
    picked = [q for q in queries() if (q.dashboard, q.where) in where]
    assert {where[q.dashboard, q.where] for q in picked} == DASHBOARD_PANELS, \
        "a picked panel is gone from grafana/dashboards"
    for q in picked:
        promql = substitute(q.expr, PLAIN)
        want = _answer(fleet.wait_query(promql, timeout=DEADLINE_S), set())

        def same(result: list[dict[str, Any]], want: Answer = want) -> bool:
            return _answer(result, set(ext)) == want

        fleet.wait_query(promql, same, DEADLINE_S, url=fleet.receiver_url,
                         what=f"the fleet's answer {sorted(want)} ({q})")


# --- e: one red card pauses both nodes, past the collective timeout, and rolls back ----------

REDCARD, NAN_AT, SAVE_EVERY, STEPS = "redcard", 25, 5, 80
COLLECTIVE_TIMEOUT_S = 4.0  # the job's own torch.distributed timeout: the pause must outlast it


def test_a_red_card_pauses_both_nodes_and_resume_rolls_back(fleet: Fleet, jobs: Jobs,
                                                            tmp_path: Path) -> None:
    a, b = fleet.nodes
    assert fleet.webhook_node is a  # Alertmanager posts to node-a's exporter only
    job = fleet.launch(EXAMPLE, REDCARD, [
        "--steps", str(STEPS), "--step-time-s", "0.2", "--save-every", str(SAVE_EVERY),
        "--inject-nan-at", str(NAN_AT), "--dist-timeout-s", str(COLLECTIVE_TIMEOUT_S),
        "--pause-poll-s", "0.5", "--checkpoint-dir", str(tmp_path / "checkpoints")])
    # Rank 0 (node-a) logs a NaN loss at step NAN_AT: GRPONonFiniteValues, Alertmanager, node-a's
    # webhook, a control record in node-a's folder; node-b's ranks learn it from the job.
    wait_for(lambda: all(job.events(r, "paused") for r in range(4)) or len(job.alive()) < 4,
             DEADLINE_S * 2, interval=0.2, what="every rank paused", diagnose=fleet.logs)
    assert job.alive() == [0, 1, 2, 3], job.logs()
    record = json.loads((a.snapshot_dir / REDCARD / PAUSE_RECORD).read_text())
    assert (record["state"], record["alertname"]) == ("paused", "GRPONonFiniteValues")
    assert not (b.snapshot_dir / REDCARD / PAUSE_RECORD).exists()
    (k,) = {job.events(r, "paused")[0]["step"] for r in range(4)}  # one step for every rank
    assert k >= NAN_AT and all(job.steps(r)[-1] == k for r in range(4))
    # The fleet sees a run that waits on purpose, on both nodes (no hung-run card).
    fleet.wait_query(f'grpo_run_paused{{run="{REDCARD}"}} == 1', _series(2), DEADLINE_S,
                     what="paused on both exporters")

    # Paused for three collective timeouts: every rank alive, none steps.
    def still_paused() -> None:
        assert job.alive() == [0, 1, 2, 3], job.logs()
        assert all(job.steps(r)[-1] == k for r in range(4))

    holds_for(still_paused, 3 * COLLECTIVE_TIMEOUT_S)

    # A person resumes, on the other node.
    res = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "resume", REDCARD,
                          "--snapshot.dir", str(b.snapshot_dir)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    job.wait(DEADLINE_S * 2)

    # The last healthy checkpoint: saved before the card's data surely existed (its onset less
    # the detection time the exporter dated, which grows with the scrape intervals it measured),
    # so before the NaN, though the saves just before it happened before the onset. The NaN comes
    # NAN_AT steps in so that a checkpoint normally predates that moment; on a machine so loaded
    # that none does, every rank must go on without a rollback instead.
    before = datetime.fromisoformat(record["healthy_before"].replace("Z", "+00:00")).timestamp()
    healthy = max((rec["step"] for rec in job.records(0) if rec["time"] < before
                   and any(e["type"] == "checkpoint_save" for e in rec.get("events") or ())),
                  default=None)
    assert healthy is None or 0 < healthy < NAN_AT
    for r in range(4):
        if healthy is None:
            assert job.events(r, "rollback") == [] and job.steps(r) == [*range(1, STEPS + 1)]
            continue
        (rollback,) = job.events(r, "rollback")
        assert (rollback["from_step"], rollback["to_step"]) == (k + 1, healthy)
        assert job.steps(r) == [*range(1, k + 1), *range(healthy + 1, STEPS + 1)]

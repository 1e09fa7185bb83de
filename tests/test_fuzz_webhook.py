"""Fuzzing the Alertmanager webhook: any body, any JSON, almost-valid payloads.

Properties: ``WebhookHandler.handle`` always answers 2xx, 4xx or 5xx with a message HTTP can
send, counts the request once in grpo_webhook_requests_total{outcome}, raises nothing (the
relay to a person included), and writes a control record only for a firing critical alert of a
run that has a folder here, creating no folder. The same over real HTTP for a handful. Then the
findings, one plain test each.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import Running, value
from fuzz_strategies import dates, fuzz, json_object, json_text, mostly, names, string_literal
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from grpo_monitor.contract.control import read_control
from grpo_monitor.contract.run_layout import PAUSE_RECORD
from grpo_monitor.contract.snapshot import is_text
from grpo_monitor.runtime.card_pause import CardPauser
from grpo_monitor.runtime.notify import Message, Notifier, Sink
from grpo_monitor.runtime.store import RunStore
from grpo_monitor.runtime.webhook import OUTCOMES, PATH, WebhookHandler

TOKEN = "fuzz-token-0123456789abcdef"
KNOWN = ("exp-1", "exp-2")  # run folders of this exporter
# Runs a card may name that must never get a record: no folder, a path, a link to a folder
# elsewhere, a dot-folder (the ingest skips it), a file, names no folder can have.
STRANGERS = ("nope", "../evil", "a/b", ".", "..", "", "link", ".hidden", "afile", "x\x00",
             "\ud800", "\udcff", "exp-1/", " exp-1")


class Recording(Sink):
    """A relay target that takes every message."""

    def __init__(self) -> None:
        super().__init__("recording://")
        self.messages: list[Message] = []

    def send(self, msg: Message) -> None:
        self.messages.append(msg)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A snapshot folder beside the things a forged card might reach for."""
    root = tmp_path_factory.mktemp("webhook")
    snapshots = root / "snapshots"
    for run in KNOWN:
        (snapshots / run).mkdir(parents=True)
    (root / "elsewhere").mkdir()
    (snapshots / "link").symlink_to(root / "elsewhere")
    (snapshots / ".hidden").mkdir()
    (snapshots / "afile").write_text("")
    (root / "token").write_text(TOKEN + "\n")
    return root


@pytest.fixture(scope="module")
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture(scope="module")
def hook(folder: Path, registry: CollectorRegistry) -> Iterator[WebhookHandler]:
    """The handler as app.py builds it, with a relay to a person (a target that takes all)."""
    store = RunStore()
    snapshots = folder / "snapshots"
    yield WebhookHandler(snapshots, folder / "token", store, registry,
                         notifier=Notifier([Recording()], store.max_step),
                         pauser=CardPauser(snapshots, store))


def tree(root: Path) -> set[str]:
    """Every path under ``root``, links not followed."""
    out: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        out.update(os.path.relpath(os.path.join(dirpath, n), root) for n in dirnames + filenames)
    return out


def outcomes(registry: CollectorRegistry) -> dict[str, float]:
    return {o: registry.get_sample_value("grpo_webhook_requests_total", {"outcome": o}) or 0.0
            for o in OUTCOMES}


def red_cards_for_known_runs(body: bytes) -> set[str]:
    """The runs of this folder that a firing critical alert in ``body`` names."""
    try:
        alerts = json.loads(body)["alerts"]
    except Exception:  # noqa: BLE001 -- not even the shape to name one
        return set()
    runs: set[str] = set()
    for alert in alerts if isinstance(alerts, list) else ():
        labels = alert.get("labels") if isinstance(alert, dict) else None
        if (isinstance(labels, dict) and alert.get("status") == "firing"
                and labels.get("severity") == "critical" and labels.get("run") in KNOWN):
            runs.add(labels["run"])
    return runs


# -- payloads -----------------------------------------------------------------------------------


def string_map(required: dict[str, st.SearchStrategy[str]], valid: bool) -> st.SearchStrategy[str]:
    text = (names.filter(is_text) if valid else names).map(string_literal)
    return st.fixed_dictionaries(required, optional={"alertname": text, "rank": text}).map(json_object)


def alerts(valid: bool) -> st.SearchStrategy[str]:
    """An alert's JSON: as Alertmanager sends it (``valid``), or with any JSON in places."""
    pick = (lambda s: s) if valid else mostly
    runs = st.sampled_from(KNOWN + (STRANGERS if not valid else tuple(filter(is_text, STRANGERS))))
    return st.fixed_dictionaries(
        {"status": pick(st.sampled_from(("firing", "resolved", "")).map(string_literal)),
         "labels": pick(string_map({
             "severity": pick(st.sampled_from(("critical", "warning", "Critical")).map(string_literal)),
             "run": pick(runs.map(string_literal))}, valid))},
        optional={"annotations": pick(string_map({}, valid)),
                  "startsAt": pick(dates.map(string_literal)),
                  "endsAt": pick(dates.map(string_literal)),
                  "fingerprint": pick(names.filter(is_text).map(string_literal))},
    ).map(json_object)


def payloads(valid: bool) -> st.SearchStrategy[str]:
    pick = (lambda s: s) if valid else mostly
    return st.fixed_dictionaries(
        {"version": pick(st.just('"4"')),
         "alerts": pick(st.lists(alerts(valid), max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"))},
        optional={"status": pick(st.sampled_from(('"firing"', '"resolved"'))),
                  "receiver": pick(st.just('"grpo-webhook"')),
                  "commonLabels": pick(string_map({}, valid)),
                  "groupLabels": pick(string_map({}, valid)),
                  "commonAnnotations": pick(string_map({}, valid)), "truncatedAlerts": pick(st.integers(0, 100).map(str))},
    ).map(json_object)


bodies = st.one_of(
    payloads(valid=True).map(str.encode), payloads(valid=False).map(str.encode),
    json_text.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=64),
)


@fuzz(500)
@given(body=bodies)
def test_any_body_is_answered_and_counted_once(hook: WebhookHandler, registry: CollectorRegistry,
                                               folder: Path, body: bytes) -> None:
    for run in KNOWN:  # every example starts unpaused, so that each red card shows
        (folder / "snapshots" / run / PAUSE_RECORD).unlink(missing_ok=True)
    before, paths_before = outcomes(registry), tree(folder)
    code, msg = hook.handle(body)
    after, paths_after = outcomes(registry), tree(folder)

    assert code // 100 in (2, 4, 5), (code, msg)
    msg.encode("utf-8")  # what http.py sends
    changed = {o: after[o] - before[o] for o in OUTCOMES if after[o] != before[o]}
    assert len(changed) == 1 and list(changed.values()) == [1], changed
    new = paths_after - paths_before
    written = {p.split("/")[1] for p in new if p.startswith("snapshots/")}
    assert new == {f"snapshots/{run}/{PAUSE_RECORD}" for run in written}, new
    assert written <= red_cards_for_known_runs(body)
    assert (changed.get("paused") == 1) == bool(written)
    for run in written:
        record = read_control(folder / "snapshots", run)
        assert record is not None and record.state == "paused" and record.run == run


@fuzz(120)
@given(body=payloads(valid=True).map(str.encode))
def test_a_red_card_for_a_run_folder_here_pauses_it(hook: WebhookHandler, folder: Path,
                                                     body: bytes) -> None:
    for run in KNOWN:
        (folder / "snapshots" / run / PAUSE_RECORD).unlink(missing_ok=True)
    code, msg = hook.handle(body)
    assert code == 200, msg
    paused = {run for run in KNOWN if (folder / "snapshots" / run / PAUSE_RECORD).exists()}
    assert paused == red_cards_for_known_runs(body)
    said = msg.split(";")[0]
    assert set(said.removeprefix("paused: ").split(", ")) == paused if paused else (
        said == "nothing to pause")


@fuzz(10)
@given(body=bodies)
def test_over_http_every_body_gets_a_counted_answer(exporter_with_hook: Running,
                                                    body: bytes) -> None:
    before = exporter_with_hook.scrape()
    r = requests.post(exporter_with_hook.url + PATH, data=body, timeout=10,
                      headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code // 100 in (2, 4, 5)
    after = exporter_with_hook.scrape()
    total = [sum(value(s, "grpo_webhook_requests_total", outcome=o) or 0 for o in OUTCOMES)
             for s in (before, after)]
    assert total[1] - total[0] == 1


@pytest.fixture
def exporter_with_hook(start_exporter: Any, snapshot_dir: Path, tmp_path: Path) -> Running:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    for run in KNOWN:
        (snapshot_dir / run).mkdir()
    return start_exporter(webhook_token_file=token, gpu_collector=False)


# -- findings, one example each ---------------------------------------------------------------


def _alert(run: str = "exp-1", **extra: Any) -> dict[str, Any]:
    return {"status": "firing", "labels": {"alertname": "GRPONonFiniteValues", "run": run,
                                           "severity": "critical"},
            "startsAt": "2025-01-01T00:00:00Z", "fingerprint": "fp", **extra}


Handle = Callable[[Any], tuple[int, str, dict[str, float]]]


@pytest.fixture
def handle(hook: WebhookHandler, registry: CollectorRegistry) -> Handle:
    """hook.handle(a payload as JSON, or bytes) -> (status, message, {outcome: how many more})."""
    def call(payload: Any) -> tuple[int, str, dict[str, float]]:
        before = outcomes(registry)
        code, msg = hook.handle(payload if isinstance(payload, bytes) else json.dumps(payload).encode())
        after = outcomes(registry)
        return code, msg, {o: after[o] - before[o] for o in OUTCOMES if after[o] != before[o]}
    return call


def test_a_body_nested_beyond_the_recursion_limit_is_a_bad_request(handle: Handle) -> None:
    # json.loads raised RecursionError out of the handler: the connection closed unanswered.
    code, _, counted = handle(b"[" * 100_000 + b"]" * 100_000)
    assert (code, counted) == (400, {"bad_request": 1})


@pytest.mark.parametrize("payload", [
    {"version": "4", "alerts": [_alert(labels=["run", "exp-1"])]},
    {"version": "4", "alerts": [_alert(labels={"run": "exp-1", "severity": ["critical"]})]},
    {"version": "4", "commonLabels": [1], "alerts": [_alert()]},
    {"version": "4", "alerts": [_alert(annotations={"summary": {"a": 1}})]},
    {"version": "4", "alerts": [_alert(startsAt=20250101)]},
    {"version": "4", "alerts": [_alert(run="\ud800")]},
], ids=["labels-list", "severity-list", "common-labels-list", "annotation-object",
        "starts-number", "lone-surrogate"])
def test_a_payload_alertmanager_would_not_send_is_a_bad_request(
        handle: Handle, folder: Path, payload: dict[str, Any]) -> None:
    # The relay to a person read these as Alertmanager's string maps and raised (TypeError,
    # AttributeError) out of the handler, after the pause record was written.
    (folder / "snapshots" / "exp-1" / PAUSE_RECORD).unlink(missing_ok=True)
    code, msg, counted = handle(payload)
    assert (code, counted) == (400, {"bad_request": 1}), msg
    assert not (folder / "snapshots" / "exp-1" / PAUSE_RECORD).exists()


@pytest.mark.parametrize("starts", ["0001-01-01T00:00:00Z", "0001-01-01T00:00:00+14:00"])
def test_an_onset_at_the_calendars_start_still_pauses(handle: Handle, folder: Path,
                                                      starts: str) -> None:
    # Dating the last healthy checkpoint raised (year 0), and the card answered 500 forever.
    (folder / "snapshots" / "exp-2" / PAUSE_RECORD).unlink(missing_ok=True)
    code, msg, counted = handle({"version": "4", "alerts": [_alert("exp-2", startsAt=starts)]})
    assert (code, counted) == (200, {"paused": 1}), msg
    record = read_control(folder / "snapshots", "exp-2")
    assert record is not None and record.onset == starts and record.healthy_before is None


@pytest.mark.parametrize("run", ["nope", "link", ".hidden", "afile"])
def test_a_card_for_a_run_without_a_folder_here_creates_nothing(
        handle: Handle, folder: Path, run: str) -> None:
    # A forged or stale card (or another node's) created <snapshot_dir>/<run>/, or wrote
    # through a link, or into a folder the ingest does not read.
    before = tree(folder)
    code, msg, counted = handle({"version": "4", "alerts": [_alert(run)]})
    assert (code, msg, counted) == (200, "nothing to pause; notified", {"ignored": 1})
    assert tree(folder) == before


def test_a_folder_in_place_of_the_record_is_a_counted_error(handle: Handle, folder: Path) -> None:
    record = folder / "snapshots" / "exp-1" / PAUSE_RECORD
    record.unlink(missing_ok=True)
    record.mkdir()
    try:
        code, msg, counted = handle({"version": "4", "alerts": [_alert()]})
    finally:
        record.rmdir()
    assert (code, msg, counted) == (
        500, "nothing to pause; could not write the pause record of exp-1 (write_error)", {"error": 1})

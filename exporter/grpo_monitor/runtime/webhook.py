"""``POST /-/alertmanager/webhook``: a red card pauses its run.

Alertmanager (receiver ``grpo-webhook`` in prometheus/alertmanager.yml) posts its webhook
payload, version 4, with ``Authorization: Bearer <token>``. For every FIRING alert with
``severity="critical"`` and a ``run`` label naming a run folder of this exporter, the run's
control record (``<snapshot_dir>/<run>/.grpo-control.json``, see control.py) is set to
``paused``; the trainer SDK sees it at its next step (card_pause.py holds the rule). Everything
else (warnings, resolved alerts, alerts without a run, runs without a folder here) is
acknowledged and ignored: a resolved card does NOT resume a run, a person does
(``grpo-monitor resume``), because a NaN that stopped recurring has not un-ruined the weights.
A body that is not Alertmanager's payload (not JSON, not version "4", labels that are not a map
of strings, ...) is refused with 400.

With a notifier (``--notify.url``, notify.py), every notification, whatever its severity or
status, is also relayed to a person; a failed relay answers 502 so that Alertmanager retries.

Idempotent (card_pause.py): Alertmanager's re-sends of a firing group change nothing.

The records are written on a thread of their own, and a request waits for them at most
``WRITE_DEADLINE_S``: whatever sits in a run folder (a FIFO, a link: refused without blocking,
card_pause.py) or whatever the file system does (a hung network mount), the webhook answers
in time, with 503 when the write did not finish (Alertmanager retries), and its connection
goes back to the scrapes.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter

from grpo_monitor.contract.snapshot import is_text
from grpo_monitor.runtime.card_pause import CardPauser
from grpo_monitor.runtime.store import RunStore

if TYPE_CHECKING:
    from grpo_monitor.runtime.notify import Notifier

log = logging.getLogger("grpo_monitor.runtime.webhook")

PATH = "/-/alertmanager/webhook"
MAX_BODY_BYTES = 2**20
# How long a request waits for its pause records: well within Alertmanager's patience, and short
# enough that a hung file system costs the webhook one connection slot for a few seconds at most.
WRITE_DEADLINE_S = 5.0
OUTCOMES = ("paused", "ignored", "unauthorized", "bad_request", "too_large", "error")
NOTIFY_OUTCOMES = ("sent", "failed")
# What Alertmanager's webhook payload (version 4) holds as string maps, and as strings; anything
# else there is no Alertmanager payload, and would reach the control record and the relay as is.
_STRING_MAPS = ("labels", "annotations", "groupLabels", "commonLabels", "commonAnnotations")
_STRINGS = ("status", "startsAt", "endsAt", "fingerprint", "generatorURL", "receiver",
            "groupKey", "externalURL")


class _Late(Exception):
    """The pause records were not written within the webhook's deadline."""


def _is_string(value: Any) -> bool:
    # A lone surrogate escape ("\ud800") is no text Alertmanager (Go) ever writes.
    return isinstance(value, str) and is_text(value)


def _payload_problem(payload: Any) -> str | None:
    """Why ``payload`` is not an Alertmanager webhook payload of version 4; None when it is."""
    if not isinstance(payload, dict) or payload.get("version") != "4":
        return 'not an Alertmanager webhook payload of version "4"'
    alerts = payload.get("alerts")
    if not isinstance(alerts, list) or not all(isinstance(a, dict) for a in alerts):
        return "payload has no alerts list"
    for where, obj in [("payload", payload), *((f"alert {i}", a) for i, a in enumerate(alerts))]:
        for key in _STRING_MAPS:
            if key in obj and not (isinstance(obj[key], dict) and all(
                    _is_string(k) and _is_string(v) for k, v in obj[key].items())):
                return f"{where}: {key} is not a map of strings"
        for key in _STRINGS:
            if key in obj and not _is_string(obj[key]):
                return f"{where}: {key} is not a string"
    return None


class WebhookHandler:
    """Authentication, validation and the control-record writes; http.py does the transport."""

    def __init__(self, snapshot_dir: Path, token_file: Path, store: RunStore,
                 registry: CollectorRegistry, max_body_bytes: int = MAX_BODY_BYTES,
                 notifier: Notifier | None = None, pauser: CardPauser | None = None,
                 write_deadline: float = WRITE_DEADLINE_S) -> None:
        self.snapshot_dir = snapshot_dir
        self.write_deadline = write_deadline
        self.token_file = Path(token_file)
        self.store = store
        self.max_body_bytes = max_body_bytes
        self._token = self._read_token()  # fail at start-up, not at the first red card
        self.pauser = pauser or CardPauser(snapshot_dir, store)
        self.requests = Counter(
            "grpo_webhook_requests", "Alertmanager webhook requests, by outcome (paused: at least "
            "one run was paused by this request).", ["outcome"], registry=registry)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)
        self.notifier = notifier
        self.notifications = Counter(
            "grpo_notifications", "Alertmanager notifications relayed to a person (--notify.url), "
            "by outcome (failed: at least one target did not take it; Alertmanager retries).",
            ["outcome"], registry=registry)
        for outcome in NOTIFY_OUTCOMES:
            self.notifications.labels(outcome)

    def _read_token(self) -> bytes:
        token = self.token_file.read_text().strip().encode()
        if not token:
            raise ValueError(f"{self.token_file}: the webhook token file is empty")
        return token

    def _token_now(self) -> bytes:
        # Re-read per request (rare, tiny): a rotated token file takes effect without a restart.
        try:
            self._token = self._read_token()
        except (OSError, ValueError) as exc:
            log.warning("cannot re-read webhook token file, keeping the previous token: %s", exc)
        return self._token

    def authorized(self, authorization: str | None) -> bool:
        scheme, _, given = (authorization or "").partition(" ")
        ok = hmac.compare_digest(given.strip().encode(), self._token_now())
        return scheme.lower() == "bearer" and ok

    def count(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()

    def _pause_all(self, alerts: list[dict[str, Any]]) -> tuple[list[str], dict[str, str]]:
        """(the runs the alerts paused, run -> why its record could not be written), each run on
        its own, written on a thread of their own within the deadline: _Late past it (the thread
        goes on; a daemon, so that a write stuck in a hung file system holds up neither this
        request nor the exporter's exit); an unexpected error otherwise."""
        outcome: list[tuple[bool, Any]] = []
        done = threading.Event()

        def write() -> None:
            try:
                outcome.append((True, self.pauser.apply_all(alerts)))
            except BaseException as exc:  # noqa: BLE001 -- handed to the request's thread
                outcome.append((False, exc))
            finally:
                done.set()

        threading.Thread(target=write, name="grpo-pause-write", daemon=True).start()
        if not done.wait(self.write_deadline):
            raise _Late
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    def handle(self, body: bytes) -> tuple[int, str]:
        """An authorized request's body -> (HTTP status, message)."""
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):  # not UTF-8 is a ValueError too; nested too deep
            self.count("bad_request")
            return 400, "body is not JSON"
        problem = _payload_problem(payload)
        if problem is not None:
            self.count("bad_request")
            return 400, problem
        try:
            paused, failed = self._pause_all(payload["alerts"])
        except _Late:
            # The write goes on in its thread (the run stays claimed until it ends); Alertmanager
            # retries, and a retry that finds the record written changes nothing.
            log.error("webhook: writing the control records took over %g s (a slow or hung "
                      "file system under %s?); answered 503", self.write_deadline, self.snapshot_dir)
            self.count("error")
            return 503, "the control record write did not finish in time; retry"
        except Exception:
            log.exception("webhook: writing a control record failed")
            self.count("error")
            return 500, "could not write the control record"
        answer = ("paused: " + ", ".join(paused)) if paused else "nothing to pause"
        if failed:
            # The others are paused; Alertmanager retries the notification, and a retry that
            # finds their records written changes nothing (grpo_card_pauses_total counts each).
            self.count("error")
            return 500, (f"{answer}; could not write the pause record of "
                         + ", ".join(f"{run} ({why})" for run, why in failed.items()))
        self.count("paused" if paused else "ignored")
        if self.notifier is not None:
            try:
                self.notifier.notify(payload)
            except Exception as exc:  # noqa: BLE001 -- the pause is written; the relay may fail
                if not isinstance(exc, RuntimeError):  # RuntimeError: a target did not take it
                    log.exception("webhook: relaying the notification failed")
                self.notifications.labels("failed").inc()
                return 502, f"{answer}; {exc}"
            self.notifications.labels("sent").inc()
            answer += "; notified"
        return 200, answer

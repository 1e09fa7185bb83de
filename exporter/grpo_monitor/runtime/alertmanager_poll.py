"""``--alertmanager.url``: ask Alertmanager for red cards, for a fleet of exporters.

Alertmanager's webhook reaches one URL, so with one exporter per node the card lands on one
node; a run whose ranks all live on other nodes would never be paused. Alertmanager's receivers
are static, the fleet is not (file_sd). So each exporter asks: every ``--alertmanager.poll-
interval`` it fetches the active, unsilenced, uninhibited critical alerts
(``GET /api/v2/alerts``) and pauses those of the runs that have a folder on its node, by the
same rule as the webhook (card_pause.py). One node is enough: the trainer's ranks agree on the
pause through their own process group (sdk/pause.py). The webhook stays the fast path (no poll
delay) for the node it points at.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import requests
from prometheus_client import CollectorRegistry, Counter

from grpo_monitor.runtime.card_pause import CardPauser

log = logging.getLogger("grpo_monitor.runtime.alertmanager_poll")

OUTCOMES = ("paused", "unchanged", "error")
# Alertmanager's v2 API filter: the cards that may pause a run, and only those a person has not
# silenced and no other card inhibits (as the webhook would have received them).
QUERY = {"active": "true", "silenced": "false", "inhibited": "false",
         "filter": 'severity="critical"'}


class AlertmanagerPoller:
    def __init__(self, url: str, interval: float, pauser: CardPauser,
                 registry: CollectorRegistry, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.interval = interval
        self.timeout = min(timeout, interval)
        self.pauser = pauser
        self.polls = Counter(
            "grpo_alertmanager_polls", "Polls of Alertmanager for red cards (--alertmanager.url), "
            "by outcome (paused: at least one run of this node was paused).", ["outcome"],
            registry=registry)
        for outcome in OUTCOMES:
            self.polls.labels(outcome)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="alertmanager-poll", daemon=True)
        self._session = requests.Session()
        self._failing = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout + 1)
        self._session.close()

    def poll_once(self) -> list[str]:
        """One poll; the runs it paused. Never raises (counted as an error and logged once per
        outage)."""
        try:
            resp = self._session.get(self.url, params=QUERY, timeout=self.timeout)
            resp.raise_for_status()
            alerts = resp.json()
            if not isinstance(alerts, list):
                raise ValueError("the answer is not a list of alerts")
            # Each run on its own: a run folder it cannot write is counted there
            # (grpo_card_pauses_total) and stops no other run's pause.
            paused, _ = self.pauser.apply_all([_as_webhook_alert(a) for a in alerts
                                               if isinstance(a, dict)])
        except Exception as exc:  # noqa: BLE001 -- a poll that fails is retried at the next tick
            self.polls.labels("error").inc()
            if not self._failing:
                log.warning("cannot read red cards from %s: %s; retrying every %.0f s",
                            self.url, exc, self.interval)
            self._failing = True
            return []
        if self._failing:
            log.info("reading red cards from %s again", self.url)
        self._failing = False
        self.polls.labels("paused" if paused else "unchanged").inc()
        return paused

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval)


def _as_webhook_alert(alert: dict[str, Any]) -> dict[str, Any]:
    """An API v2 alert in the webhook's shape: ``status`` is an object there, a word here."""
    state = alert.get("status", {}).get("state") if isinstance(alert.get("status"), dict) else None
    return {"status": "firing" if state == "active" else "resolved",
            "labels": alert.get("labels"), "startsAt": alert.get("startsAt"),
            "fingerprint": alert.get("fingerprint")}

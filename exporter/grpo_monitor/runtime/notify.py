"""Cards to a person: the exporter relays Alertmanager's notifications to chat, ntfy or email.

Alertmanager already sends every card (both severities, and their resolution) to the exporter's
webhook, after its routing, grouping, inhibition and repeat pacing. With ``--notify.url``
(env ``GRPO_MONITOR_NOTIFY_URL``; docker-compose.yml fills it from ``GRPO_NOTIFY_URL`` in .env)
the webhook also turns each notification into one message for a person:

* ``slack+https://hooks.slack.com/services/...`` (or any ``https://hooks.slack.com/`` URL): a
  Slack-compatible incoming webhook (Slack, Mattermost, Rocket.Chat, Discord's ``/slack``): an
  attachment coloured like the card, its summary, run, step and runbook link.
* ``ntfy+https://ntfy.sh/TOPIC`` (any URL that takes a plain-text POST): the text as the body,
  ``Title``, ``Priority``, ``Tags`` and ``Click`` (the runbook) as headers, ntfy's convention.
* ``smtp://[USER:PASSWORD@]HOST[:PORT]?to=ADDR[,ADDR]&from=ADDR`` (STARTTLS when the server
  offers it) or ``smtps://`` (TLS from the start): an email with the same text.

Several URLs, separated by spaces, each get every message. Why a relay rather than receivers in
alertmanager.yml: Alertmanager reads no environment variables in its configuration, so one
setting in .env could only reach it by re-writing its file; it has no plain-text webhook for
ntfy-style services; and the exporter is the one piece that knows the run's current step. A
failed delivery makes the webhook answer 502, so Alertmanager retries the notification (the
pause it carries is idempotent, see webhook.py).
"""

from __future__ import annotations

import json
import logging
import smtplib
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import requests

log = logging.getLogger("grpo_monitor.runtime.notify")

TIMEOUT_S = 10.0  # per delivery; Alertmanager's own webhook timeout is longer

# Card colours, as the cards are named (docs/background.md#two-colours: red = critical, yellow = warning).
COLOURS = {"red": "#d7191c", "yellow": "#fdae61", "resolved": "#1a9641", "other": "#7f7f7f"}


@dataclass(frozen=True)
class Message:
    """One Alertmanager notification, as a person reads it."""

    card: str  # red, yellow, resolved, other
    title: str
    lines: list[str]
    runbook_url: str | None

    @property
    def colour(self) -> str:
        return COLOURS[self.card]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def _card(payload: dict[str, Any]) -> str:
    if payload.get("status") == "resolved":
        return "resolved"
    severity = (payload.get("commonLabels") or {}).get("severity")
    severities = {(a.get("labels") or {}).get("severity") for a in payload.get("alerts", [])}
    if severity == "critical" or "critical" in severities:
        return "red"
    if severity == "warning" or "warning" in severities:
        return "yellow"
    return "other"


def message(payload: dict[str, Any], step_of: Callable[[str], int | None]) -> Message:
    """The message for one Alertmanager webhook payload (version 4); ``step_of(run)`` is the
    run's newest step as the exporter knows it."""
    card = _card(payload)
    alerts = [a for a in payload.get("alerts", []) if isinstance(a, dict)]
    common = payload.get("commonLabels") or {}
    name = common.get("alertname") or ", ".join(
        sorted({str((a.get("labels") or {}).get("alertname", "?")) for a in alerts}))
    runs = sorted({str(r) for a in alerts if (r := (a.get("labels") or {}).get("run"))})
    word = {"red": "RED card", "yellow": "yellow card", "resolved": "resolved",
            "other": "alert"}[card]
    title = f"[{word}] {name}" + (f" in run {', '.join(runs)}" if runs else "")
    lines: list[str] = []
    runbook: str | None = None
    for alert in alerts:
        labels = alert.get("labels") or {}
        notes = alert.get("annotations") or {}
        run = labels.get("run")
        step = step_of(run) if isinstance(run, str) else None
        where = " ".join(f"{k}={labels[k]}" for k in ("run", "rank", "gpu", "key") if k in labels)
        state = "resolved" if alert.get("status") == "resolved" else "firing"
        lines.append(f"{labels.get('alertname', '?')} ({state}) {where} step={step if step is not None else '?'}: "
                     f"{notes.get('summary', '')}")
        if notes.get("description"):
            lines.append(f"  {notes['description']}")
        runbook = runbook or notes.get("runbook_url")
        if notes.get("runbook_url"):
            lines.append(f"  runbook: {notes['runbook_url']}")
    return Message(card=card, title=title, lines=lines, runbook_url=runbook)


class Sink:
    scheme = ""

    def __init__(self, url: str) -> None:
        self.url = url

    def send(self, msg: Message) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        # Never the full URL: a Slack webhook URL or an SMTP password is a secret.
        parts = urlsplit(self.url)
        return f"{type(self).__name__}({parts.hostname or '?'})"


class SlackSink(Sink):
    def send(self, msg: Message) -> None:
        # Slack's "attachments" carry the colour bar; fields hold what a person scans first.
        body = {
            "text": msg.title,
            "attachments": [{
                "color": msg.colour,
                "title": msg.title,
                "title_link": msg.runbook_url,
                "text": msg.text,
                "fallback": f"{msg.title}\n{msg.text}",
            }],
        }
        r = requests.post(self.url, data=json.dumps(body), timeout=TIMEOUT_S,
                          headers={"Content-Type": "application/json"})
        r.raise_for_status()


class NtfySink(Sink):
    PRIORITY = {"red": "5", "yellow": "3", "resolved": "2", "other": "3"}
    TAGS = {"red": "red_circle", "yellow": "yellow_circle", "resolved": "green_circle",
            "other": "white_circle"}

    def send(self, msg: Message) -> None:
        headers = {"Title": msg.title.encode("utf-8").decode("latin-1", "replace"),
                   "Priority": self.PRIORITY[msg.card], "Tags": self.TAGS[msg.card],
                   "Content-Type": "text/plain; charset=utf-8"}
        if msg.runbook_url:
            headers["Click"] = msg.runbook_url
        r = requests.post(self.url, data=msg.text.encode(), headers=headers, timeout=TIMEOUT_S)
        r.raise_for_status()


class EmailSink(Sink):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        self.host = parts.hostname or ""
        self.tls = parts.scheme == "smtps"
        self.port = parts.port or (465 if self.tls else 587)
        self.user = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        self.to = [a for v in query.get("to", []) for a in v.split(",") if a]
        self.sender = (query.get("from") or [f"grpo-monitor@{self.host}"])[0]
        if not self.host or not self.to:
            raise ValueError("an smtp:// notify URL needs a host and ?to=ADDRESS")

    def send(self, msg: Message) -> None:
        mail = EmailMessage()
        mail["Subject"] = msg.title
        mail["From"] = self.sender
        mail["To"] = ", ".join(self.to)
        mail["X-GRPO-Card"] = msg.card
        mail.set_content(msg.text + "\n")
        context = ssl.create_default_context()
        smtp: smtplib.SMTP
        if self.tls:
            smtp = smtplib.SMTP_SSL(self.host, self.port, timeout=TIMEOUT_S, context=context)
        else:
            smtp = smtplib.SMTP(self.host, self.port, timeout=TIMEOUT_S)
        with smtp:
            if not self.tls:
                smtp.ehlo()
                if smtp.has_extn("starttls"):
                    smtp.starttls(context=context)
                    smtp.ehlo()
            if self.user:
                smtp.login(self.user, self.password or "")
            smtp.send_message(mail)


def sink(url: str) -> Sink:
    """The sink one notify URL names; ValueError for anything else."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("slack+https", "slack+http"):
        return SlackSink(url.split("+", 1)[1])
    if scheme in ("ntfy+https", "ntfy+http"):
        return NtfySink(url.split("+", 1)[1])
    if scheme in ("smtp", "smtps"):
        return EmailSink(url)
    if scheme == "https" and urlsplit(url).hostname == "hooks.slack.com":
        return SlackSink(url)
    raise ValueError(f"notify URL scheme {scheme!r} is not one of slack+https, ntfy+https, smtp, "
                     "smtps (or an https://hooks.slack.com/ URL)")


def sinks(spec: str | None) -> list[Sink]:
    return [sink(u) for u in (spec or "").split() if u]


class Notifier:
    """Sends each notification to every sink; raises if any delivery failed (after trying all)."""

    def __init__(self, targets: Sequence[Sink], step_of: Callable[[str], int | None]) -> None:
        self.targets = list(targets)
        self.step_of = step_of

    def notify(self, payload: dict[str, Any]) -> Message:
        msg = message(payload, self.step_of)
        failed: list[str] = []
        for target in self.targets:
            try:
                target.send(msg)
            except (requests.RequestException, OSError, smtplib.SMTPException) as exc:
                log.warning("notify %r: %s failed: %s", target, msg.title, type(exc).__name__)
                failed.append(repr(target))
        if failed:
            raise RuntimeError("notification not delivered to " + ", ".join(failed))
        return msg

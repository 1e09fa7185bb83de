"""Cards to a person (notify.py) and the compose init's secrets and ACLs (compose_init.py).

Real transports on loopback: the exporter's webhook relays to a Slack-compatible listener and to
an ntfy-style one over HTTP, and to a minimal SMTP server over a socket; a failed relay answers
502 so that Alertmanager retries, without pausing twice. The ACL test creates run folders as an
ordinary user (uid 1000, umask 022) and writes into them as the exporter's uid.
"""

from __future__ import annotations

import os
import socketserver
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from conftest import Running, scrape, value
from grpo_monitor.contract.run_layout import PAUSE_RECORD
from grpo_monitor.runtime import notify
from grpo_monitor.tools.compose_init import Secret, ensure_secret, prepare_snapshot_dir, user_has_acl
from prometheus_harness import WebhookListener

TOKEN = "notify-test-token-0123456789abcdef"
HOOK = "/-/alertmanager/webhook"
RUNBOOK = "https://example.org/runbook.md#grpononfinitevalues"


def _payload(severity: str = "critical", status: str = "firing") -> dict[str, Any]:
    alert = {"status": status,
             "labels": {"alertname": "GRPONonFiniteValues", "run": "exp-7", "rank": "0",
                        "key": "loss", "severity": severity},
             "annotations": {"summary": "A training signal is NaN or infinite.",
                             "description": "1 NaN/Inf value(s) of loss", "runbook_url": RUNBOOK},
             "startsAt": "2025-01-01T00:00:00.000Z", "endsAt": "0001-01-01T00:00:00Z",
             "fingerprint": "fp-notify"}
    return {"version": "4", "status": status, "receiver": "grpo-webhook",
            "commonLabels": {"alertname": "GRPONonFiniteValues", "run": "exp-7", "severity": severity},
            "alerts": [alert]}


def test_message_carries_colour_summary_run_step_and_runbook() -> None:
    red = notify.message(_payload(), lambda run: {"exp-7": 41}.get(run))
    assert (red.card, red.colour) == ("red", "#d7191c")
    assert red.title == "[RED card] GRPONonFiniteValues in run exp-7"
    assert "run=exp-7" in red.text and "step=41" in red.text
    assert "A training signal is NaN or infinite." in red.text and red.runbook_url == RUNBOOK
    assert notify.message(_payload("warning"), lambda _: None).card == "yellow"
    resolved = notify.message(_payload(status="resolved"), lambda _: None)
    assert resolved.card == "resolved" and "step=?" in resolved.text


def test_notify_urls_choose_the_sink() -> None:
    kinds = [type(s).__name__ for s in notify.sinks(
        "slack+https://chat.example/hooks/x https://hooks.slack.com/services/T/B/C "
        "ntfy+http://127.0.0.1:1/topic smtp://mail.example:25?to=a@example.org")]
    assert kinds == ["SlackSink", "SlackSink", "NtfySink", "EmailSink"]
    with pytest.raises(ValueError, match="scheme"):
        notify.sink("ftp://example.org/")
    with pytest.raises(ValueError, match="to="):
        notify.sink("smtp://mail.example:25")
    # A sink never shows its URL (a Slack webhook URL is a secret).
    assert "services" not in repr(notify.sink("https://hooks.slack.com/services/T/B/C"))


class _SMTP(socketserver.StreamRequestHandler):
    """Just enough SMTP (RFC 5321) to accept one message; no STARTTLS offered."""

    mails: list[str] = []

    def _say(self, line: str) -> None:
        self.wfile.write(line.encode() + b"\r\n")

    def handle(self) -> None:
        self._say("220 localhost test")
        while line := self.rfile.readline().decode():
            verb = line.strip().split(" ", 1)[0].upper()
            if verb in ("EHLO", "HELO"):
                self._say("250 localhost")
            elif verb == "DATA":
                self._say("354 go ahead")
                lines = []
                while (chunk := self.rfile.readline().decode()) not in (".\r\n", ""):
                    lines.append(chunk)
                _SMTP.mails.append("".join(lines))
                self._say("250 queued")
            elif verb == "QUIT":
                self._say("221 bye")
                return
            else:  # MAIL, RCPT, RSET, NOOP
                self._say("250 ok")


@pytest.fixture
def smtp_server() -> Iterator[int]:
    _SMTP.mails = []
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _SMTP)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_webhook_relays_every_card_to_slack_ntfy_and_email(
        start_exporter: Callable[..., Running], tmp_path: Path, smtp_server: int) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    listener = WebhookListener().start()
    try:
        urls = (f"slack+{listener.url('/slack')} ntfy+{listener.url('/ntfy')} "
                f"smtp://127.0.0.1:{smtp_server}?to=oncall@example.org&from=grpo@example.org")
        ex = start_exporter(webhook_token_file=token, gpu_collector=False, notify_url=urls)
        r = requests.post(ex.url + HOOK, json=_payload(), timeout=10,
                          headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and "notified" in r.text, r.text
        posts = {p.path: p for p in listener.snapshot()}
        slack = posts["/slack"].body["attachments"][0]
        assert slack["color"] == "#d7191c" and slack["title_link"] == RUNBOOK
        assert "run=exp-7" in slack["text"] and "A training signal is NaN" in slack["text"]
        ntfy = posts["/ntfy"].body
        assert isinstance(ntfy, str) and "run=exp-7" in ntfy and RUNBOOK in ntfy
        assert len(_SMTP.mails) == 1
        mail = _SMTP.mails[0]
        assert "Subject: [RED card] GRPONonFiniteValues in run exp-7" in mail
        assert "X-GRPO-Card: red" in mail and "To: oncall@example.org" in mail
        assert value(scrape(ex.url), "grpo_notifications_total", outcome="sent") == 1
    finally:
        listener.stop()


def test_a_failed_relay_answers_502_and_the_retry_pauses_once(
        start_exporter: Callable[..., Running], tmp_path: Path, snapshot_dir: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    from grpo_monitor.tools.stack import free_port

    dead = f"ntfy+http://127.0.0.1:{free_port()}/topic"  # nothing listens there
    ex = start_exporter(webhook_token_file=token, gpu_collector=False, notify_url=dead)
    (snapshot_dir / "exp-7").mkdir()  # a run of this exporter: only such a run is paused
    headers = {"Authorization": f"Bearer {TOKEN}"}
    first = requests.post(ex.url + HOOK, json=_payload(), headers=headers, timeout=30)
    assert first.status_code == 502 and first.text.startswith("paused: exp-7")
    record = (snapshot_dir / "exp-7" / PAUSE_RECORD).read_text()
    again = requests.post(ex.url + HOOK, json=_payload(), headers=headers, timeout=30)
    assert again.status_code == 502 and again.text.startswith("nothing to pause")
    assert (snapshot_dir / "exp-7" / PAUSE_RECORD).read_text() == record
    assert value(scrape(ex.url), "grpo_notifications_total", outcome="failed") == 2


def test_notify_url_without_the_webhook_is_refused(tmp_path: Path) -> None:
    from grpo_monitor.runtime.app import Exporter
    from grpo_monitor.runtime.config import ExporterConfig

    with pytest.raises(ValueError, match="webhook-token-file"):
        Exporter(ExporterConfig(snapshot_dir=tmp_path, listen_address="127.0.0.1:0",
                                gpu_collector=False, notify_url="ntfy+http://127.0.0.1:1/x"))


# --- compose init ---------------------------------------------------------------------------



def test_secrets_are_made_once_and_owned_by_their_reader(tmp_path: Path) -> None:
    secret = Secret(tmp_path / "vol" / "webhook-token", 10001, 65534, "webhook token")
    assert ensure_secret(secret) is True
    first = secret.path.read_text()
    st = secret.path.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (10001, 65534, 0o440)
    assert len(first.strip()) >= 32
    assert ensure_secret(secret) is False and secret.path.read_text() == first


def test_run_folders_of_an_ordinary_user_open_to_the_exporter(tmp_path: Path) -> None:
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="grpo-acl-"))  # reachable by uid 1000
    try:
        base.chmod(0o755)
        os.chown(base, 1000, 1000)
        snapshots = base / "snapshots"
        as_user: dict[str, Any] = {"user": 1000, "group": 1000, "extra_groups": [], "umask": 0o022,
                                   "check": True, "timeout": 30}
        subprocess.run(["mkdir", str(snapshots), str(snapshots / "old")], **as_user)
        notes = prepare_snapshot_dir(snapshots, 1000, 1000)
        assert "uid 10001" in notes[-1] and "1 run folder" in notes[-1]
        subprocess.run(["mkdir", str(snapshots / "new")], **as_user)
        for run in ("old", "new"):
            folder = snapshots / run
            assert folder.stat().st_uid == 1000 and user_has_acl(folder, 10001)
            # The exporter's uid writes the pause record; a stranger still may not.
            subprocess.run(["sh", "-c", f"echo x > {folder / PAUSE_RECORD}"], user=10001,
                           group=10001, extra_groups=[], check=True, timeout=30)
            denied = subprocess.run(["sh", "-c", f"echo x > {folder}/intruder"], user=10002,
                                    group=10002, extra_groups=[], capture_output=True, timeout=30)
            assert denied.returncode != 0
        # The snapshot folder itself stays closed to the exporter (it only needs the run folders).
        assert subprocess.run(["sh", "-c", f"echo x > {snapshots}/stray"], user=10001, group=10001,
                              extra_groups=[], capture_output=True, timeout=30).returncode != 0
        # An engine-made folder (root's, empty) is handed to the user first.
        made = base / "made-by-engine"
        made.mkdir()
        prepare_snapshot_dir(made, 1000, 1000)
        assert (made.stat().st_uid, made.stat().st_gid) == (1000, 1000)
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)

"""--web.config.file (exporter-toolkit's format): TLS, client certificates, basic auth and
response headers on a real exporter, real TLS clients, the real Prometheus scraping it; and
every configuration the exporter cannot honour refused at start-up with one line."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import requests
import trustme
import yaml
from polling import wait_for
from prometheus_harness import start_prometheus

from conftest import Running, parse_samples, value
from grpo_monitor.cli import build_parser
from grpo_monitor.runtime.web_config import WebConfigError, load_web_config
from grpo_monitor.sdk.samples import replay_samples
from grpo_monitor.sdk.writer import SnapshotWriter

USER, PASSWORD = "prometheus", "correct horse battery staple"
TOKEN = "webhook-token-0123456789"


@dataclass(frozen=True)
class Pki:
    """A server CA and certificate for 127.0.0.1, and a separate CA for client certificates."""
    folder: Path
    ca: Path  # the server certificate's CA, for clients
    cert: Path
    key: Path
    client_ca: Path
    client: Path  # key + certificate for "scraper.example", by client_ca
    client_other_san: Path  # by client_ca, for "intruder.example"
    client_wrong_ca: Path  # for "scraper.example", by the server's CA


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, client_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(d / "server.pem"))
    server.private_key_pem.write_to_path(str(d / "server.key"))
    client_ca.cert_pem.write_to_path(str(d / "client-ca.pem"))
    for name, issuer, san in (("client", client_ca, "scraper.example"),
                              ("client-other-san", client_ca, "intruder.example"),
                              ("client-wrong-ca", ca, "scraper.example")):
        issuer.issue_cert(san).private_key_and_cert_chain_pem.write_to_path(str(d / f"{name}.pem"))
    return Pki(d, d / "ca.pem", d / "server.pem", d / "server.key", d / "client-ca.pem",
               d / "client.pem", d / "client-other-san.pem", d / "client-wrong-ca.pem")


def write_config(folder: Path, doc: Any, name: str = "web.yml") -> Path:
    path = folder / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def hashed(password: str) -> str:
    # Cost 4, the lowest: the tests count bcrypt runs, they do not need them slow.
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


def tls_section(pki: Pki, **extra: Any) -> dict[str, Any]:
    return {"cert_file": str(pki.cert), "key_file": str(pki.key), **extra}


# --- TLS and basic auth on a running exporter ------------------------------------------------------

def test_tls_basic_auth_and_headers(start_exporter: Callable[..., Running], snapshot_dir: Path,
                                    pki: Pki, tmp_path: Path) -> None:
    with SnapshotWriter(snapshot_dir, "r1", rank=0, world_size=1) as w:
        w.log({"loss": 0.1}, 500, samples=replay_samples(["2+2"], [["4"]], [[1.0]]))
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    web = write_config(tmp_path, {
        "tls_server_config": tls_section(pki),
        "http_server_config": {"headers": {"X-Frame-Options": "deny",
                                           "Strict-Transport-Security": "max-age=31536000"}},
        "basic_auth_users": {USER: hashed(PASSWORD), "other": hashed("another password")}})
    running = start_exporter(web_config_file=web, webhook_token_file=token, enable_replay=True)
    url = running.url
    assert url.startswith("https://127.0.0.1:")

    def get(path: str, auth: tuple[str, str] | None = None) -> requests.Response:
        return requests.get(url + path, auth=auth, verify=str(pki.ca), timeout=10)

    # Every path asks for the password, the landing page and health checks included.
    for path in ("/metrics", "/-/healthy", "/", "/replay?run=r1"):
        refused = get(path)
        assert refused.status_code == 401, path
        assert refused.headers["WWW-Authenticate"].startswith("Basic ")
        assert refused.headers["X-Frame-Options"] == "deny"  # on refusals too
        assert "2+2" not in refused.text
    assert get("/metrics", (USER, "wrong password")).status_code == 401
    assert get("/metrics", ("nobody", PASSWORD)).status_code == 401
    assert get("/metrics", ("other", PASSWORD)).status_code == 401  # another user's password

    for _ in range(5):
        ok = get("/metrics", (USER, PASSWORD))
        assert ok.status_code == 200 and "grpo_exporter_ready 1.0" in ok.text
    assert ok.headers["Strict-Transport-Security"] == "max-age=31536000"
    replay = get("/replay?run=r1&format=json", (USER, PASSWORD))
    assert replay.status_code == 200 and "2+2" in replay.text
    # /replay's own stricter policy is kept; the configured headers are added beside it.
    assert "default-src 'none'" in replay.headers["Content-Security-Policy"]
    assert replay.headers["X-Frame-Options"] == "deny"
    # bcrypt ran for the wrong password, the unknown user (a decoy hash), the other user and the
    # first good scrape; the other four good scrapes and /replay hit the cache.
    assert running.exporter.server.basic_auth is not None
    assert running.exporter.server.basic_auth.bcrypt_checks == 4

    # The webhook answers to its bearer token alone (Alertmanager sends one Authorization).
    hook = f"{url}/-/alertmanager/webhook"
    payload = {"version": "4", "status": "firing", "alerts": []}
    assert requests.post(hook, json=payload, headers={"Authorization": f"Bearer {TOKEN}"},
                         verify=str(pki.ca), timeout=10).status_code == 200
    wrong = requests.post(hook, json=payload, auth=(USER, PASSWORD), verify=str(pki.ca), timeout=10)
    assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"].startswith("Bearer ")

    # Plain HTTP on the TLS port gets no answer, and no data.
    with pytest.raises(requests.ConnectionError):
        requests.get(url.replace("https://", "http://") + "/metrics", timeout=10)

    s = parse_samples(get("/metrics", (USER, PASSWORD)).text)
    assert value(s, "grpo_http_rejects_total", reason="unauthorized") == 7
    assert value(s, "grpo_http_rejects_total", reason="tls_handshake") == 1
    assert value(s, "grpo_webhook_requests_total", outcome="unauthorized") == 1
    assert value(s, "grpo_webhook_requests_total", outcome="ignored") == 1


def test_client_certificates(start_exporter: Callable[..., Running], pki: Pki, tmp_path: Path) -> None:
    """RequireAndVerifyClientCert: no certificate, one from another CA, or one without an
    allowed SAN is refused in the handshake; the right one is served."""
    web = write_config(tmp_path, {"tls_server_config": tls_section(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.client_ca),
        client_allowed_sans=["scraper.example"])})
    running = start_exporter(web_config_file=web)

    def get(cert: Path | None) -> requests.Response:
        return requests.get(f"{running.url}/metrics", verify=str(pki.ca), timeout=10,
                            cert=str(cert) if cert else None)

    for refused in (None, pki.client_wrong_ca, pki.client_other_san):
        with pytest.raises(requests.ConnectionError):
            get(refused)
    resp = get(pki.client)
    assert resp.status_code == 200
    s = parse_samples(resp.text)
    assert value(s, "grpo_http_rejects_total", reason="tls_handshake") == 2
    assert value(s, "grpo_http_rejects_total", reason="tls_client_san") == 1


def test_a_stalled_tls_handshake_is_dropped(start_exporter: Callable[..., Running], pki: Pki,
                                             tmp_path: Path) -> None:
    """The handshake runs on the connection's own thread under the read timeout: clients that
    connect and never send (or never finish) a ClientHello hold nothing for long, and a TLS
    client is served meanwhile."""
    running = start_exporter(web_config_file=write_config(tmp_path, {"tls_server_config": tls_section(pki)}),
                             read_timeout=1.0)
    host, port = running.url.rsplit("/", 1)[-1].rsplit(":", 1)
    stalled = [socket.create_connection((host, int(port)), timeout=10) for _ in range(10)]
    for s in stalled[5:]:
        s.sendall(b"\x16\x03\x01\x02\x00")  # the first bytes of a ClientHello, then nothing
    try:
        assert requests.get(f"{running.url}/-/healthy", verify=str(pki.ca), timeout=10).text == "OK\n"
        for s in stalled:
            try:  # blocks until dropped (the socket timeout is the deadline): end of file, or reset
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
    finally:
        for s in stalled:
            s.close()
    s = parse_samples(requests.get(f"{running.url}/metrics", verify=str(pki.ca), timeout=10).text)
    assert value(s, "grpo_http_rejects_total", reason="read_timeout") == 10
    assert value(s, "grpo_http_rejects_total", reason="tls_handshake") == 0


def test_tls_versions_and_cipher_suites(start_exporter: Callable[..., Running], pki: Pki,
                                        tmp_path: Path) -> None:
    suite = "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"  # trustme's keys are ECDSA
    web = write_config(tmp_path, {"tls_server_config": tls_section(
        pki, max_version="TLS12", cipher_suites=[suite])})
    running = start_exporter(web_config_file=web)
    host, port = running.url.rsplit("/", 1)[-1].rsplit(":", 1)

    def handshake(minimum: ssl.TLSVersion | None = None, ciphers: str | None = None) -> tuple[str, str]:
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        if minimum is not None:
            ctx.minimum_version = minimum
        if ciphers is not None:
            ctx.set_ciphers(ciphers)
        with socket.create_connection((host, int(port)), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as tls:
            name, version, _ = tls.cipher()  # type: ignore[misc]
            return name, version

    assert handshake() == ("ECDHE-ECDSA-AES256-GCM-SHA384", "TLSv1.2")
    with pytest.raises(ssl.SSLError):
        handshake(minimum=ssl.TLSVersion.TLSv1_3)
    with pytest.raises(ssl.SSLError):
        handshake(ciphers="ECDHE-ECDSA-AES128-GCM-SHA256")


# --- the real Prometheus -------------------------------------------------------------------------

def test_prometheus_scrapes_over_tls_with_basic_auth(start_exporter: Callable[..., Running],
                                                    snapshot_dir: Path, pki: Pki,
                                                    tmp_path: Path) -> None:
    """Prometheus' own TLS and basic-auth client: the right password scrapes (up 1, the run's
    series stored), a wrong one is refused (up 0, HTTP 401)."""
    with SnapshotWriter(snapshot_dir, "tls-run", rank=0, world_size=1) as w:
        w.log({"loss": 0.25}, 7)
    web = write_config(tmp_path, {"tls_server_config": tls_section(pki),
                                  "basic_auth_users": {USER: hashed(PASSWORD)}})
    running = start_exporter(web_config_file=web)
    target = running.url.split("://", 1)[1]
    (tmp_path / "good-password").write_text(PASSWORD)
    (tmp_path / "bad-password").write_text("not the password")

    def job(name: str) -> dict[str, Any]:
        return {"job_name": name, "scheme": "https", "tls_config": {"ca_file": str(pki.ca)},
                "basic_auth": {"username": USER, "password_file": str(tmp_path / f"{name}-password")},
                "static_configs": [{"targets": [target]}]}

    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [job("good"), job("bad")]}
    with ExitStack() as stack:
        _, prom = start_prometheus(stack, tmp_path, config)

        def query(promql: str) -> list[dict[str, Any]]:
            resp = requests.get(f"{prom}/api/v1/query", params={"query": promql}, timeout=5)
            return resp.json()["data"]["result"]

        def targets() -> dict[str, dict[str, Any]]:
            active = requests.get(f"{prom}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            return {t["labels"]["job"]: t for t in active}

        wait_for(lambda: query('up{job="good"} == 1') and query('up{job="bad"} == 0'), 30,
                 what="both jobs scraped", diagnose=lambda: json.dumps(targets()))
        series = wait_for(lambda: query('grpo_step{job="good", run="tls-run"}'), 30, what="run series")
        assert series[0]["value"][1] == "7"
        assert query('grpo_step{job="bad"}') == []
        assert "401" in targets()["bad"]["lastError"]
        assert targets()["good"]["lastError"] == ""


# --- refused at start-up -------------------------------------------------------------------------

def _config_errors(pki: Pki) -> list[tuple[Any, str]]:
    tls = tls_section(pki)
    return [
        ({"tls_config": tls}, "tls_config: unknown key"),
        ({"tls_server_config": {**tls, "cert_fil": "x"}}, "tls_server_config.cert_fil: unknown key"),
        ({"rate_limit": {"interval": "1s", "burst": 5}}, "rate_limit is not supported"),
        ({"tls_server_config": {**tls, "curve_preferences": ["X25519"]}}, "curve_preferences is not supported"),
        ({"tls_server_config": {"cert": "PEM", "key": "PEM"}}, "cert (an inline certificate) is not supported"),
        ({"tls_server_config": {"cert_file": str(pki.cert)}}, "key_file: missing"),
        ({"tls_server_config": {**tls, "cert_file": "nope.pem"}}, "nope.pem: no such file"),
        ({"tls_server_config": {**tls, "key_file": str(pki.ca)}}, "cannot use"),
        ({"tls_server_config": {**tls, "min_version": "TLS9"}}, "min_version: 'TLS9' is not one of"),
        ({"tls_server_config": {**tls, "min_version": "TLS13", "max_version": "TLS12"}},
         "min_version is above max_version"),
        ({"tls_server_config": {**tls, "cipher_suites": ["TLS_AES_128_GCM_SHA256"]}}, "TLS 1.3 suite"),
        ({"tls_server_config": {**tls, "cipher_suites": ["TLS_FOO"]}}, "unknown cipher suite 'TLS_FOO'"),
        ({"tls_server_config": {**tls, "client_auth_type": "RequireAnyClientCert"}}, "is not supported"),
        ({"tls_server_config": {**tls, "client_auth_type": "Sometimes"}}, "'Sometimes' is not one of"),
        ({"tls_server_config": {**tls, "client_auth_type": "RequireAndVerifyClientCert"}},
         "needs client_ca_file"),
        ({"tls_server_config": {**tls, "client_ca_file": str(pki.client_ca)}}, "NoClientCert"),
        ({"tls_server_config": {**tls, "client_auth_type": "VerifyClientCertIfGiven",
                                "client_ca_file": str(pki.client_ca), "client_allowed_sans": ["a"]}},
         "client_allowed_sans needs client_auth_type: RequireAndVerifyClientCert"),
        ({"http_server_config": {"http2": True}}, "HTTP/1.1 only"),
        ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}}, "'allow' is not one of"),
        ({"http_server_config": {"headers": {"X-Powered-By": "me"}}}, "cannot be configured"),
        ({"basic_auth_users": {USER: "plain text"}}, "not a bcrypt hash"),
        ({"basic_auth_users": {"a:b": hashed("x")}}, "without ':'"),
        ("- just\n- a list\n", "expected a mapping"),
        ("tls_server_config: [unclosed\n  cert_file: x\n", "not YAML"),
    ]


def test_unusable_configurations_are_refused_with_one_line(pki: Pki, tmp_path: Path) -> None:
    for i, (doc, expected) in enumerate(_config_errors(pki)):
        path = write_config(tmp_path, doc, f"bad-{i}.yml")
        with pytest.raises(WebConfigError) as err:
            load_web_config(path)
        message = str(err.value)
        assert expected in message and message.startswith(str(path)), (doc, message)
        assert "\n" not in message
    with pytest.raises(WebConfigError, match="cannot read"):
        load_web_config(tmp_path / "missing.yml")


def test_usable_configurations(pki: Pki, tmp_path: Path) -> None:
    empty = load_web_config(write_config(tmp_path, "", "empty.yml"))
    assert empty.tls is None and not empty.users and not empty.headers
    # Relative file names are relative to the configuration file's folder (exporter-toolkit's rule).
    relative = load_web_config(write_config(pki.folder, {"tls_server_config": {
        "cert_file": pki.cert.name, "key_file": pki.key.name, "client_auth_type": "VerifyClientCertIfGiven",
        "client_ca_file": pki.client_ca.name}}, "relative.yml"))
    assert relative.tls is not None and relative.tls.verify_mode == ssl.CERT_OPTIONAL
    blank = load_web_config(write_config(tmp_path, {"http_server_config": {
        "http2": False, "headers": {"X-XSS-Protection": "", "X-Content-Type-Options": "nosniff"}}}))
    assert dict(blank.headers) == {"X-Content-Type-Options": "nosniff"}  # blank: unset


def test_serve_refuses_a_bad_web_config_at_start_up(tmp_path: Path) -> None:
    """`grpo-monitor serve` exits 2 with one line naming the key, before serving anything;
    GRPO_MONITOR_WEB_CONFIG_FILE sets the flag."""
    bad = write_config(tmp_path, {"basic_auth_users": {USER: hashed(PASSWORD)},
                                  "tls_server_config": {"cert_fil": "server.pem"}}, "bad.yml")
    argv = [sys.executable, "-m", "grpo_monitor.cli", "serve", "--snapshot.dir", str(tmp_path),
            "--web.listen-address", "127.0.0.1:0", "--no-collector.gpu"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
    for extra, extra_env in ((["--web.config.file", str(bad)], {}),
                             ([], {"GRPO_MONITOR_WEB_CONFIG_FILE": str(bad)})):
        proc = subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=60,
                              env={**env, **extra_env})
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("grpo-monitor serve: ") and "cert_fil: unknown key" in lines[0]
        assert "serving" not in proc.stderr


def test_web_flags_and_their_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(["serve", "--snapshot.dir", "/s"])
    assert args.web_config_file is None and args.enable_replay is False
    monkeypatch.setenv("GRPO_MONITOR_WEB_CONFIG_FILE", "/etc/grpo/web.yml")
    monkeypatch.setenv("GRPO_MONITOR_WEB_ENABLE_REPLAY", "true")
    monkeypatch.setenv("GRPO_MONITOR_WEB_READ_TIMEOUT", "1m")
    monkeypatch.setenv("GRPO_MONITOR_WEB_MAX_CONNECTIONS", "16")
    args = build_parser().parse_args(["serve", "--snapshot.dir", "/s"])
    assert args.web_config_file == Path("/etc/grpo/web.yml") and args.enable_replay is True
    assert args.read_timeout == 60.0 and args.max_connections == 16
    args = build_parser().parse_args(["serve", "--snapshot.dir", "/s", "--no-web.enable-replay"])
    assert args.enable_replay is False

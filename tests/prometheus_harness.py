"""Prometheus and Alertmanager as real processes for the tests, and the alerting path on them:
Prometheus -> Alertmanager -> a webhook listener.

Shared by the tests that run the servers and bench/bench_alert_latency.py (which puts tests/ on
sys.path). Everything listens on 127.0.0.1 on ports picked by binding to port 0; every file
(configs, TSDB, Alertmanager state, logs, the token) lives in one working folder.

The configs are generated from the committed ones, not written anew: Alertmanager's routes,
grouping and inhibit rules are kept exactly as in prometheus/alertmanager.yml (only the
webhook URL and the token file move), and Prometheus keeps prometheus.yml's rule files (made
absolute), job and labels (only the intervals and targets change).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
import yaml
from polling import wait_for
from processes import log_tail, start_listening

from grpo_monitor.runtime.config import parse_duration
from grpo_monitor.tools import stack as native
from grpo_monitor.tools.stack import Child

REPO = Path(__file__).resolve().parent.parent
PROMETHEUS_DIR = REPO / "prometheus"
ALERTMANAGER_YML = PROMETHEUS_DIR / "alertmanager.yml"
PROMETHEUS_YML = PROMETHEUS_DIR / "prometheus.yml"
WEBHOOK_RECEIVER = "grpo-webhook"

PROMETHEUS_BIN = "prometheus"
ALERTMANAGER_BIN = "prometheus-alertmanager"  # Debian's name; upstream calls it alertmanager


def find_binary(*names: str) -> str:
    path = native.find_binary(*names)
    if path:
        return path
    raise RuntimeError(f"none of {names} on PATH: install Debian's prometheus and "
                       "prometheus-alertmanager packages (make system-deps)")


# --- webhook listener ----------------------------------------------------------------------


@dataclass(frozen=True)
class Post:
    path: str
    authorization: str | None
    body: Any  # parsed JSON, or the raw text if it was not JSON
    arrived: float  # time.monotonic() when the request line had been read


class WebhookListener:
    """A ThreadingHTTPServer on 127.0.0.1 that records every POST and answers 200."""

    def __init__(self) -> None:
        self.posts: list[Post] = []
        self._lock = threading.Lock()
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                arrived = time.monotonic()
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with listener._lock:
                    listener.posts.append(
                        Post(self.path, self.headers.get("Authorization"), body, arrived))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="webhook",
                                        daemon=True)

    def start(self) -> "WebhookListener":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def snapshot(self) -> list[Post]:
        with self._lock:
            return list(self.posts)


class ExpositionServer:
    """A ThreadingHTTPServer on 127.0.0.1 that answers every GET with ``body``, an exposition
    the caller sets: a job's /metrics served as it was at one moment (the rule benchmark's job,
    the engine parity test's frozen parts)."""

    def __init__(self, body: bytes = b"") -> None:
        self.body = body
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                body = served.body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        self.url = f"http://{self.target}"
        threading.Thread(target=self.server.serve_forever, name="exposition", daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def firing_alert(post: Post, **labels: str) -> dict[str, Any] | None:
    """The first alert of a "firing" notification whose labels include ``labels``."""
    body = post.body
    if not isinstance(body, dict) or body.get("status") != "firing":
        return None
    for alert in body.get("alerts", []):
        if alert.get("status") == "firing" and all(
                alert.get("labels", {}).get(k) == v for k, v in labels.items()):
            return alert
    return None


# --- configs -------------------------------------------------------------------------------


def alertmanager_config(webhook_url: str, token_file: Path,
                        source: Path = ALERTMANAGER_YML) -> dict[str, Any]:
    """The committed config with the webhook receiver pointed at the listener and the token."""
    return native.alertmanager_config(source, webhook_url, token_file)


def uncomment_example(text: str, name: str) -> str:
    """A committed file's text with its `# BEGIN EXAMPLE <name>` ... `# END` block uncommented
    (the remote_write and target examples of the fleet configs)."""
    out, inside = [], False
    for line in text.splitlines():
        if line.strip() == f"# BEGIN EXAMPLE {name}":
            inside = True
        elif line.strip() == f"# END EXAMPLE {name}":
            inside = False
        elif inside:
            line = re.sub(r"^# ?", "", line)
        out.append(line)
    assert not inside, f"unterminated example block {name}"
    return "\n".join(out) + "\n"


def prometheus_config(exporter_target: str, alertmanager_target: str, interval: str = "1s",
                      source: Path = PROMETHEUS_YML) -> dict[str, Any]:
    """The committed config with short intervals, loopback targets and absolute rule files."""
    return native.prometheus_config(source, exporter_target, alertmanager_target, interval)


# --- the servers ---------------------------------------------------------------------------


def start_alertmanager(stack: ExitStack, workdir: Path, webhook_url: str, token_file: Path
                       ) -> tuple[Child, str, dict[str, Any]]:
    """Alertmanager from the committed config, its grpo-webhook receiver posting to
    ``webhook_url`` with ``token_file``, on loopback, no cluster; ``stack`` stops it. Returns
    the process, its URL and the config it runs."""
    am_config = alertmanager_config(webhook_url, token_file)
    am_yml = workdir / "alertmanager.yml"
    am_yml.write_text(yaml.safe_dump(am_config, sort_keys=False))
    (workdir / "alertmanager-data").mkdir(exist_ok=True)
    am_bin = find_binary(ALERTMANAGER_BIN, "alertmanager")
    am, port = start_listening(stack, "alertmanager", lambda port: [
        am_bin, f"--config.file={am_yml}", f"--storage.path={workdir / 'alertmanager-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="], workdir)
    return am, f"http://127.0.0.1:{port}", am_config


def start_prometheus(stack: ExitStack, workdir: Path, config: dict[str, Any],
                     name: str = "prometheus", flags: Sequence[str] = ()) -> tuple[Child, str]:
    """Prometheus running ``config`` (written to ``workdir/<name>.yml``, its data in
    ``workdir/<name>-data``) on loopback; ``stack`` stops it. Returns the process and its URL."""
    config_file = workdir / f"{name}.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    prom_bin = find_binary(PROMETHEUS_BIN)
    prom, port = start_listening(stack, name, lambda port: [
        prom_bin, f"--config.file={config_file}", f"--storage.tsdb.path={workdir / f'{name}-data'}",
        f"--web.listen-address=127.0.0.1:{port}", *flags], workdir)
    return prom, f"http://127.0.0.1:{port}"


# --- the alerting path ---------------------------------------------------------------------


@dataclass
class AlertStack:
    workdir: Path
    token: str
    listener: WebhookListener
    alertmanager: Child
    prometheus: Child
    am_url: str
    prom_url: str
    interval_s: float
    group_wait_s: float
    processes: list[Child] = field(default_factory=list)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} log ({p.log}) ---\n{log_tail(p)}" for p in self.processes)

    def query(self, promql: str) -> Any:
        resp = requests.get(f"{self.prom_url}/api/v1/query", params={"query": promql}, timeout=5)
        return resp.json()

    def am_alerts(self) -> list[dict[str, Any]]:
        resp = requests.get(f"{self.am_url}/api/v2/alerts", timeout=5)
        resp.raise_for_status()
        return resp.json()

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        """Push alerts to Alertmanager's API as Prometheus would (labels + annotations)."""
        resp = requests.post(f"{self.am_url}/api/v2/alerts", json=alerts, timeout=5)
        resp.raise_for_status()

    def diagnose(self, promql: tuple[str, ...] = ()) -> str:
        """Everything that says where an alert got stuck, for a failure message."""
        return "\n".join([*server_state(self.prom_url, self.am_url, promql),
                          f"webhook posts: {self.listener.snapshot()!r}", self.logs()])

    def wait_scraping(self, timeout: float = 30.0) -> None:
        """Prometheus has scraped the exporter and knows the Alertmanager."""
        def targets_up() -> bool:
            targets = requests.get(f"{self.prom_url}/api/v1/targets", timeout=5).json()
            active = targets["data"]["activeTargets"]
            return bool(active) and all(t["health"] == "up" for t in active)

        wait_for(targets_up, timeout, what="exporter target up", diagnose=self.diagnose)
        wait_for(lambda: alertmanager_known(self.prom_url), timeout,
                 what="Alertmanager discovered", diagnose=self.diagnose)

    def wait_post(self, timeout: float, **labels: str) -> tuple[Post, dict[str, Any]]:
        """The first firing notification carrying an alert with ``labels``."""
        def found() -> tuple[Post, dict[str, Any]] | None:
            for post in self.listener.snapshot():
                alert = firing_alert(post, **labels)
                if alert is not None:
                    return post, alert
            return None

        return wait_for(found, timeout, interval=0.01, what=f"firing webhook POST with {labels}",
                        diagnose=lambda: self.diagnose(
                            ("grpo_window_nonfinite", "grpo_nonfinite_values_total")))


def server_state(prom_url: str, am_url: str, promql: Sequence[str] = ()) -> list[str]:
    """What Prometheus and Alertmanager say now (the queries, up, ALERTS, targets, alerts,
    Alertmanagers), for a failure message; never raises."""
    parts = []
    for q in (*promql, "up", "ALERTS"):
        try:
            resp = requests.get(f"{prom_url}/api/v1/query", params={"query": q}, timeout=5)
            parts.append(f"query {q}: {json.dumps(resp.json()['data']['result'])}")
        except Exception as e:  # noqa: BLE001 (a diagnostic must not raise)
            parts.append(f"query {q}: {e!r}")
    for what, url in (("prometheus targets", f"{prom_url}/api/v1/targets"),
                      ("prometheus alerts", f"{prom_url}/api/v1/alerts"),
                      ("prometheus alertmanagers", f"{prom_url}/api/v1/alertmanagers"),
                      ("alertmanager alerts", f"{am_url}/api/v2/alerts")):
        try:
            parts.append(f"{what}: {requests.get(url, timeout=5).text.strip()}")
        except requests.RequestException as e:
            parts.append(f"{what}: {e!r}")
    return parts


def alertmanager_known(prom_url: str) -> bool:
    """Prometheus has discovered its Alertmanager (alerts can leave it)."""
    ams = requests.get(f"{prom_url}/api/v1/alertmanagers", timeout=5).json()
    return bool(ams["data"]["activeAlertmanagers"])


def _group_wait_seconds(am_config: dict[str, Any], severity: str) -> float:
    for route in am_config["route"].get("routes", []):
        if f'severity="{severity}"' in route.get("matchers", []):
            return parse_duration(route.get("group_wait", am_config["route"]["group_wait"]))
    return parse_duration(am_config["route"]["group_wait"])


@contextmanager
def alert_stack(workdir: Path, exporter_url: str, interval: str = "1s",
                token: str = "e2e-token-0123456789abcdef") -> Iterator[AlertStack]:
    """Start the listener, Alertmanager and Prometheus; stop all of them on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    exporter_target = exporter_url.split("://", 1)[-1].rstrip("/")
    with ExitStack() as stack:
        listener = WebhookListener().start()
        stack.callback(listener.stop)

        # A trailing newline, as `... | base64 > webhook-token` leaves it.
        token_file = workdir / "webhook-token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        # One process at a time, each ready (its port bound) before the next port is picked,
        # so that two of ours can never be handed the same free port.
        am, am_url, am_config = start_alertmanager(
            stack, workdir, listener.url("/-/alertmanager/webhook"), token_file)
        am_port = am_url.rsplit(":", 1)[1]

        prom, prom_url = start_prometheus(
            stack, workdir, prometheus_config(exporter_target, f"127.0.0.1:{am_port}", interval))
        processes = [am, prom]
        yield AlertStack(workdir, token, listener, am, prom, am_url, prom_url,
                         parse_duration(interval), _group_wait_seconds(am_config, "critical"),
                         processes)


def write_nonfinite_loss(snapshot_dir: Path, run: str, step: int = 1) -> float:
    """Append one native record with a NaN loss (the JSON token) to <run>/rank-0.jsonl.

    Returns time.monotonic() taken right before the write."""
    path = snapshot_dir / run / "rank-0.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (f'{{"run": "{run}", "rank": 0, "step": {step}, "time": {time.time():.3f}, '
            f'"metrics": {{"loss": NaN}}}}\n')
    t0 = time.monotonic()
    with path.open("a") as fh:
        fh.write(line)
    return t0


def latency_report(latencies_s: list[float], interval_s: float, group_wait_s: float,
                   source: str, **extra: Any) -> dict[str, Any]:
    """The bench/results/alert_latency.json document."""
    s = sorted(latencies_s)
    n = len(s)
    median = (s[(n - 1) // 2] + s[n // 2]) / 2 if n else float("nan")
    target = interval_s + interval_s + group_wait_s + 2.0
    return {
        "benchmark": "snapshot with a NaN loss written -> red-card webhook POST received",
        "source": source,
        "path": "exporter (inotify) -> Prometheus scrape -> rule evaluation -> Alertmanager "
                "(red route group_wait) -> webhook",
        "scrape_interval_s": interval_s,
        "evaluation_interval_s": interval_s,
        "group_wait_s": group_wait_s,
        "target_s": target,
        "target_rule": "scrape_interval + evaluation_interval + group_wait + 2 s",
        "n": n,
        "latencies_s": [round(x, 3) for x in latencies_s],
        "median_s": round(median, 3),
        "max_s": round(s[-1], 3) if s else float("nan"),
        "min_s": round(s[0], 3) if s else float("nan"),
        "max_within_target": bool(s) and s[-1] <= target,
        **extra,
    }

"""The native stack: exporter, Prometheus, Alertmanager (and Grafana) as child processes.

For machines without Docker. The children run from the project's own configuration — the
committed `prometheus/prometheus.yml`, its rule files and `prometheus/alertmanager.yml` — with
only what must differ rewritten: loopback targets, ports, state folders, and optionally shorter
intervals. One source of truth for both ways of running the stack.
"""

from __future__ import annotations

import copy
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpo_monitor.runtime.config import DEFAULT_PORT

WEBHOOK_RECEIVER = "grpo-webhook"


def project_config_dir() -> Path | None:
    """`prometheus/` of the checkout this package runs from, if it runs from one."""
    candidate = Path(__file__).resolve().parents[3] / "prometheus"
    return candidate if (candidate / "prometheus.yml").is_file() else None


def prometheus_config(source: Path, exporter_target: str | None, alertmanager_target: str,
                      interval: str | None = None) -> dict[str, Any]:
    """The committed config with loopback targets, absolute rule files and, if given, one
    interval for scrape and evaluation. ``exporter_target`` None keeps the scrape configs' own
    target discovery (prometheus-fleet.yml's ``file_sd_configs``) for the caller to re-point."""
    config = copy.deepcopy(yaml.safe_load(source.read_text()))
    if interval is not None:
        config["global"]["scrape_interval"] = interval
        config["global"]["evaluation_interval"] = interval
        config["global"]["scrape_timeout"] = interval
    config["rule_files"] = [str((source.parent / f).resolve()) for f in config["rule_files"]]
    for sc in config["scrape_configs"]:
        if interval is not None:
            sc.pop("scrape_interval", None)
            sc.pop("scrape_timeout", None)
        if exporter_target is not None:
            sc["static_configs"] = [{"targets": [exporter_target]}]
    config["alerting"]["alertmanagers"] = [{"static_configs": [{"targets": [alertmanager_target]}]}]
    return config


def alertmanager_config(source: Path, webhook_url: str, token_file: Path) -> dict[str, Any]:
    """The committed config with the webhook receiver pointed at ``webhook_url`` and its bearer
    token read from ``token_file``."""
    config = copy.deepcopy(yaml.safe_load(source.read_text()))
    hooks = [hook for r in config["receivers"] if r["name"] == WEBHOOK_RECEIVER
             for hook in r.get("webhook_configs", [])]
    if not hooks:
        raise ValueError(f"{source}: no webhook_configs in receiver {WEBHOOK_RECEIVER}")
    for hook in hooks:
        hook["url"] = webhook_url
        hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    return config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_binary(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class Child:
    """A child process, its stdout and stderr appended to ``log``; ``url`` is where it serves."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, name: str, argv: Sequence[str], log: Path, cwd: Path, *, url: str = "",
              env: Mapping[str, str] | None = None) -> Child:
        """Start ``argv`` in ``cwd`` with exactly ``env`` (None: this process' environment)."""
        with log.open("ab") as fh:
            # Its own session: a Ctrl-C in the terminal reaches the parent, which stops its
            # children in order, instead of every child at once.
            proc = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True,
                                    env=None if env is None else dict(env))
        return cls(name, url, proc, log)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, and SIGKILL if it has not exited ``timeout`` seconds later."""
        stop_children([self], timeout)

    def wait_ready(self, url: str, timeout: float) -> None:
        """Until GET ``url`` answers 200: RuntimeError if the process exits first, TimeoutError
        if ``timeout`` seconds pass first."""
        import requests

        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with status {self.proc.returncode}; "
                                   f"see {self.log}")
            try:
                if requests.get(url, timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready after {timeout:.0f} s; see {self.log}")
            time.sleep(0.2)


def stop_children(children: Sequence[Child], timeout: float = 10.0) -> None:
    """SIGTERM to every child at once, then SIGKILL to those still running ``timeout`` seconds
    later."""
    for ch in children:
        if ch.alive():
            ch.proc.terminate()
    deadline = time.monotonic() + timeout
    for ch in children:
        try:
            ch.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            ch.proc.kill()
            ch.proc.wait()


@dataclass
class StackConfig:
    snapshot_dir: Path
    state_dir: Path
    config_dir: Path
    exporter_port: int = DEFAULT_PORT
    prometheus_port: int = 9090
    alertmanager_port: int = 9093
    grafana_port: int = 3000
    interval: str | None = None  # None: the committed intervals (15s)
    exporter_args: list[str] = field(default_factory=list)


class NativeStack:
    """Start the children, watch them, stop them all together."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.children: list[Child] = []
        self._stop = threading.Event()

    def _port(self, port: int) -> int:
        return port or free_port()

    def _spawn(self, name: str, argv: list[str], url: str, env: dict[str, str] | None = None) -> Child:
        child = Child.start(name, argv, self.config.state_dir / f"{name}.log", self.config.state_dir,
                            url=url, env=None if env is None else {**os.environ, **env})
        self.children.append(child)
        return child

    def start(self) -> list[Child]:
        c = self.config
        c.state_dir.mkdir(parents=True, exist_ok=True)
        c.snapshot_dir.mkdir(parents=True, exist_ok=True)
        prometheus = find_binary("prometheus")
        alertmanager = find_binary("prometheus-alertmanager", "alertmanager")
        missing = [n for n, b in (("prometheus", prometheus), ("alertmanager", alertmanager)) if not b]
        if missing:
            raise RuntimeError(f"not on PATH: {', '.join(missing)} (Debian: apt-get install "
                               "prometheus prometheus-alertmanager)")
        exporter_port, prom_port, am_port = (self._port(p) for p in (
            c.exporter_port, c.prometheus_port, c.alertmanager_port))
        token = c.state_dir / "webhook-token"
        if not token.exists():
            token.write_text(secrets.token_urlsafe(32) + "\n")
            token.chmod(0o600)

        self._spawn("exporter", [sys.executable, "-m", "grpo_monitor.cli", "serve",
                                 "--snapshot.dir", str(c.snapshot_dir),
                                 "--web.listen-address", f"127.0.0.1:{exporter_port}",
                                 "--web.webhook-token-file", str(token),
                                 *c.exporter_args], f"http://127.0.0.1:{exporter_port}/metrics")
        am_yml = c.state_dir / "alertmanager.yml"
        am_yml.write_text(yaml.safe_dump(alertmanager_config(
            c.config_dir / "alertmanager.yml",
            f"http://127.0.0.1:{exporter_port}/-/alertmanager/webhook", token)))
        self._spawn("alertmanager", [alertmanager, f"--config.file={am_yml}",
                                     f"--storage.path={c.state_dir / 'alertmanager-data'}",
                                     f"--web.listen-address=127.0.0.1:{am_port}",
                                     "--cluster.listen-address="], f"http://127.0.0.1:{am_port}")
        prom_yml = c.state_dir / "prometheus.yml"
        prom_yml.write_text(yaml.safe_dump(prometheus_config(
            c.config_dir / "prometheus.yml", f"127.0.0.1:{exporter_port}", f"127.0.0.1:{am_port}",
            c.interval)))
        self._spawn("prometheus", [prometheus, f"--config.file={prom_yml}",
                                   f"--storage.tsdb.path={c.state_dir / 'prometheus-data'}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}"],
                    f"http://127.0.0.1:{prom_port}")
        grafana = find_binary("grafana-server", "grafana")
        grafana_home = Path("/usr/share/grafana")
        if grafana and grafana_home.is_dir():
            self._start_grafana(grafana, grafana_home, prom_port, am_port)
        return self.children

    def _start_grafana(self, binary: str, home: Path, prom_port: int, am_port: int) -> None:
        c = self.config
        port = self._port(c.grafana_port)
        prov = c.state_dir / "grafana-provisioning"
        root = c.config_dir.parent / "grafana"
        if prov.exists():
            shutil.rmtree(prov)
        shutil.copytree(root / "provisioning", prov)
        for ds in (prov / "datasources").glob("*.yml"):
            text = ds.read_text().replace("http://prometheus:9090", f"http://127.0.0.1:{prom_port}")
            ds.write_text(text.replace("http://alertmanager:9093", f"http://127.0.0.1:{am_port}"))
        for dash in (prov / "dashboards").glob("*.yml"):
            dash.write_text(dash.read_text().replace("/var/lib/grafana/dashboards",
                                                     str((root / "dashboards").resolve())))
        env = {"GF_PATHS_PROVISIONING": str(prov), "GF_PATHS_DATA": str(c.state_dir / "grafana-data"),
               "GF_SERVER_HTTP_PORT": str(port), "GF_SERVER_HTTP_ADDR": "127.0.0.1",
               "GF_AUTH_ANONYMOUS_ENABLED": "true", "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer"}
        self._spawn("grafana", [binary, f"--homepath={home}"], f"http://127.0.0.1:{port}", env)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every child answers its readiness endpoint; RuntimeError if one dies first."""
        ready_path = {"exporter": "/-/ready", "prometheus": "/-/ready", "alertmanager": "/-/ready",
                      "grafana": "/api/health"}
        deadline = time.monotonic() + timeout
        for ch in self.children:
            try:
                ch.wait_ready(ch.url.removesuffix("/metrics") + ready_path[ch.name],
                              max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise RuntimeError(f"{ch.name} not ready after {timeout:.0f} s; see {ch.log}") from None

    def wait(self, tick: Callable[[], bool] | None = None) -> int:
        """Block until a signal, a child's death, or ``tick()`` returning True (called every
        half second); stop every child; return the exit status (1 if a child died)."""
        def on_signal(*_: object) -> None:
            self._stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        dead: Child | None = None
        while not self._stop.wait(0.5):
            dead = next((ch for ch in self.children if not ch.alive()), None)
            if dead is not None:
                print(f"grpo-monitor stack: {dead.name} exited with status {dead.proc.returncode}; "
                      f"stopping the others (its log: {dead.log})", file=sys.stderr, flush=True)
                break
            if tick is not None and tick():
                break
        self.stop()
        return 0 if dead is None else 1

    def stop(self, timeout: float = 10.0) -> None:
        stop_children(self.children, timeout)

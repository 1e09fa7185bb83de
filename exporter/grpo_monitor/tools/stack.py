"""The native stack: exporter, Prometheus, Alertmanager (and Grafana) as child processes; or,
with the VictoriaMetrics engine, vmagent + victoria-metrics + vmalert in Prometheus' place.

For machines without Docker. The children run from the project's own configuration — the
committed `prometheus/prometheus.yml`, its rule files and `prometheus/alertmanager.yml` — with
only what must differ rewritten: loopback targets, ports, state folders, and optionally shorter
intervals. One source of truth for both ways of running the stack; an installed wheel carries
the same files (``stack_config/``, links to the checkout's folders).

Once it runs, the stack says where to look (``where_to_look``: only pages that answer, for
distribution builds differ: Debian's Prometheus serves its alerts page at /classic/alerts, and
Debian's Alertmanager has no web UI at all), and shows what a person should see: the cards as
Alertmanager holds them active, inhibited and silenced ones left out (``CardPrinter``), and the
pause records the exporter writes for red cards (``PausePrinter``).
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

from grpo_monitor.contract.control import read_control
from grpo_monitor.contract.run_layout import PAUSE_RECORD
from grpo_monitor.runtime.config import DEFAULT_PORT
from grpo_monitor.tools import victoriametrics as vm
from grpo_monitor.tools.trainer_marks import file_sizes, trainer_answer

WEBHOOK_RECEIVER = "grpo-webhook"
# What Debian's prometheus-alertmanager serves at / instead of the web UI.
_NO_ALERTMANAGER_UI = "does not include a web application"
GRAFANA_MISSING = ("grafana       not installed, so no dashboards: grafana-server comes from "
                   "Grafana's own Debian repository (how, and how the stack runs it: "
                   "docs/dashboards.md#the-dashboards-without-docker); the compose stack has it")


class StackError(Exception):
    """Something a person fixes before the stack can start (a missing binary, a busy port): one
    line, exit status 2."""


class PortBusy(StackError):
    def __init__(self, name: str, port: int) -> None:
        super().__init__(f"port {port} ({name}) is in use")
        self.name, self.port = name, port


def project_config_dir() -> Path | None:
    """`prometheus/` of the checkout this package runs from, else the copy an installed wheel
    carries (stack_config/prometheus); None when neither is there."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[3] / "prometheus", here.parent / "stack_config" / "prometheus"):
        if (candidate / "prometheus.yml").is_file():
            return candidate
    return None


def card_severities(config_dir: Path | None = None) -> dict[str, str]:
    """Every alert of the rule files with its ``severity`` label: the cards' colours, as
    Prometheus loads them ({} without the rule files)."""
    config_dir = config_dir or project_config_dir()
    if config_dir is None:
        return {}
    out: dict[str, str] = {}
    for path in sorted((config_dir / "rules").glob("*.yml")):
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            for rule in group.get("rules", []):
                if "alert" in rule:
                    out[rule["alert"]] = rule.get("labels", {}).get("severity", "")
    return out


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


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on ``host:port`` (or on every interface at ``port``)."""
    with socket.socket() as s:
        # As the servers bind: a connection of an earlier run in TIME_WAIT does not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


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
    port: int = 0

    @classmethod
    def start(cls, name: str, argv: Sequence[str], log: Path, cwd: Path, *, url: str = "",
              env: Mapping[str, str] | None = None, port: int = 0) -> Child:
        """Start ``argv`` in ``cwd`` with exactly ``env`` (None: this process' environment)."""
        with log.open("ab") as fh:
            # Its own session: a Ctrl-C in the terminal reaches the parent, which stops its
            # children in order, instead of every child at once.
            proc = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True,
                                    env=None if env is None else dict(env))
        return cls(name, url, proc, log, port)

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
                if self.port and "address already in use" in self.log.read_text(errors="replace"):
                    raise PortBusy(self.name, self.port)  # taken after the stack looked
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
    notify_url: str | None = None  # the exporter's --notify.url: cards to a person
    # Which store evaluates the rules: Prometheus, or vmagent + victoria-metrics + vmalert
    # (grpo_monitor.tools.victoriametrics), both from the same prometheus.yml and rule files.
    engine: str = "prometheus"
    victoriametrics_port: int = 8428
    vmagent_port: int = 8429
    vmalert_port: int = 8880


ENGINES = ("prometheus", "victoriametrics")


class NativeStack:
    """Start the children, watch them, stop them all together."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.children: list[Child] = []
        self._stop = threading.Event()

    def _port(self, port: int) -> int:
        return port or free_port()

    def _spawn(self, name: str, argv: list[str], port: int, url: str,
               env: dict[str, str] | None = None) -> Child:
        child = Child.start(name, argv, self.config.state_dir / f"{name}.log", self.config.state_dir,
                            url=url, env=None if env is None else {**os.environ, **env}, port=port)
        self.children.append(child)
        return child

    @staticmethod
    def grafana() -> tuple[str, Path] | None:
        """grafana-server and its home, when installed."""
        binary, home = find_binary("grafana-server", "grafana"), Path("/usr/share/grafana")
        return (binary, home) if binary and home.is_dir() else None

    def check(self) -> None:
        """StackError before anything starts: a server binary missing, a chosen port taken."""
        c = self.config
        if c.engine not in ENGINES:
            raise StackError(f"unknown engine {c.engine!r}: one of {', '.join(ENGINES)}")
        missing = [n for n, names in (*self._engine_binaries(),
                                      ("prometheus-alertmanager", ("prometheus-alertmanager", "alertmanager")))
                   if not find_binary(*names)]
        if missing:
            package = vm.PACKAGE if c.engine == "victoriametrics" else "prometheus"
            raise StackError(f"{' and '.join(missing)} not found on PATH (Debian: apt-get install "
                             f"{package} prometheus-alertmanager; or run `make demo`, which does)")
        ports = [("exporter", c.exporter_port), ("alertmanager", c.alertmanager_port),
                 *self._engine_ports()]
        if self.grafana():
            ports.append(("grafana", c.grafana_port))
        for name, port in ports:
            if port and port_in_use(port):
                raise PortBusy(name, port)

    def start(self) -> list[Child]:
        c = self.config
        self.check()
        c.state_dir.mkdir(parents=True, exist_ok=True)
        c.snapshot_dir.mkdir(parents=True, exist_ok=True)
        alertmanager = find_binary("prometheus-alertmanager", "alertmanager")
        assert alertmanager  # check() said so
        exporter_port, am_port = self._port(c.exporter_port), self._port(c.alertmanager_port)
        token = c.state_dir / "webhook-token"
        if not token.exists():
            token.write_text(secrets.token_urlsafe(32) + "\n")
            token.chmod(0o600)

        self._spawn("exporter", [sys.executable, "-m", "grpo_monitor.cli", "serve",
                                 "--snapshot.dir", str(c.snapshot_dir),
                                 "--web.listen-address", f"127.0.0.1:{exporter_port}",
                                 "--web.webhook-token-file", str(token),
                                 *(["--notify.url", c.notify_url] if c.notify_url else []),
                                 *c.exporter_args], exporter_port,
                    f"http://127.0.0.1:{exporter_port}/metrics")
        am_yml = c.state_dir / "alertmanager.yml"
        am_yml.write_text(yaml.safe_dump(alertmanager_config(
            c.config_dir / "alertmanager.yml",
            f"http://127.0.0.1:{exporter_port}/-/alertmanager/webhook", token)))
        self._spawn("alertmanager", [alertmanager, f"--config.file={am_yml}",
                                     f"--storage.path={c.state_dir / 'alertmanager-data'}",
                                     f"--web.listen-address=127.0.0.1:{am_port}",
                                     "--cluster.listen-address="], am_port,
                    f"http://127.0.0.1:{am_port}")
        # One configuration for either engine: the committed one, pointed at these ports.
        config = prometheus_config(c.config_dir / "prometheus.yml", f"127.0.0.1:{exporter_port}",
                                   f"127.0.0.1:{am_port}", c.interval)
        if c.engine == "victoriametrics":
            query_port = self._start_victoriametrics(config, am_port)
        else:
            query_port = self._start_prometheus(config)
        grafana = self.grafana()
        if grafana:
            self._start_grafana(*grafana, query_port, am_port)
        return self.children

    def _engine_binaries(self) -> list[tuple[str, tuple[str, ...]]]:
        if self.config.engine == "victoriametrics":
            return [(b, (b,)) for b in (vm.SERVER_BIN, vm.AGENT_BIN, vm.RULER_BIN)]
        return [("prometheus", ("prometheus",))]

    def _engine_ports(self) -> list[tuple[str, int]]:
        c = self.config
        if c.engine == "victoriametrics":
            return [("victoriametrics", c.victoriametrics_port), ("vmagent", c.vmagent_port),
                    ("vmalert", c.vmalert_port)]
        return [("prometheus", c.prometheus_port)]

    def _start_prometheus(self, config: dict[str, Any]) -> int:
        """Prometheus running ``config``: scraping the exporter and evaluating the rules;
        returns its port."""
        c = self.config
        prometheus = find_binary("prometheus")
        assert prometheus  # check() said so
        port = self._port(c.prometheus_port)
        prom_yml = c.state_dir / "prometheus.yml"
        prom_yml.write_text(yaml.safe_dump(config))
        self._spawn("prometheus", [prometheus, f"--config.file={prom_yml}",
                                   f"--storage.tsdb.path={c.state_dir / 'prometheus-data'}",
                                   f"--web.listen-address=127.0.0.1:{port}"], port,
                    f"http://127.0.0.1:{port}")
        return port

    def _start_victoriametrics(self, config: dict[str, Any], am_port: int) -> int:
        """victoria-metrics, vmagent scraping ``config``'s targets into it and vmalert
        evaluating its rules against it; returns the store's port (Grafana's datasource: it
        answers PromQL)."""
        c = self.config
        store_port, agent_port, ruler_port = (self._port(p) for p in (
            c.victoriametrics_port, c.vmagent_port, c.vmalert_port))
        store = f"http://127.0.0.1:{store_port}"
        self._spawn("victoriametrics", vm.server_argv(
            find_binary(vm.SERVER_BIN) or vm.SERVER_BIN, c.state_dir / "victoria-metrics-data",
            store_port), store_port, store)
        scrape_yml = c.state_dir / "vmagent.yml"
        scrape_yml.write_text(yaml.safe_dump(vm.scrape_config(config), sort_keys=False))
        self._spawn("vmagent", vm.agent_argv(
            find_binary(vm.AGENT_BIN) or vm.AGENT_BIN, scrape_yml, c.state_dir / "vmagent-data",
            agent_port, store), agent_port, f"http://127.0.0.1:{agent_port}")
        self._spawn("vmalert", vm.ruler_argv(
            find_binary(vm.RULER_BIN) or vm.RULER_BIN, config, ruler_port, store,
            f"http://127.0.0.1:{am_port}"), ruler_port, f"http://127.0.0.1:{ruler_port}")
        return store_port

    def _start_grafana(self, binary: str, home: Path, query_port: int, am_port: int) -> None:
        c = self.config
        port = self._port(c.grafana_port)
        prov = c.state_dir / "grafana-provisioning"
        root = c.config_dir.parent / "grafana"
        if prov.exists():
            shutil.rmtree(prov)
        shutil.copytree(root / "provisioning", prov)
        for ds in (prov / "datasources").glob("*.yml"):
            ds.write_text(ds.read_text().replace("http://alertmanager:9093", f"http://127.0.0.1:{am_port}"))
        for dash in (prov / "dashboards").glob("*.yml"):
            dash.write_text(dash.read_text().replace("/var/lib/grafana/dashboards",
                                                     str((root / "dashboards").resolve())))
        env = {"GF_PATHS_PROVISIONING": str(prov), "GF_PATHS_DATA": str(c.state_dir / "grafana-data"),
               "GF_SERVER_HTTP_PORT": str(port), "GF_SERVER_HTTP_ADDR": "127.0.0.1",
               "GF_AUTH_ANONYMOUS_ENABLED": "true", "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
               # The Prometheus datasource's URL (Grafana expands it in the provisioning file):
               # whichever engine runs; VictoriaMetrics answers the same HTTP API.
               "GRPO_DATASOURCE_URL": f"http://127.0.0.1:{query_port}"}
        self._spawn("grafana", [binary, f"--homepath={home}"], port, f"http://127.0.0.1:{port}", env)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every child answers its readiness endpoint; RuntimeError if one dies first."""
        ready_path = {"grafana": "/api/health"}  # every other child answers /-/ready
        deadline = time.monotonic() + timeout
        for ch in self.children:
            try:
                ch.wait_ready(ch.url.removesuffix("/metrics") + ready_path.get(ch.name, "/-/ready"),
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


# -- what a person sees --------------------------------------------------------------------------


def _page(url: str) -> str | None:
    """The body of ``url`` if it answers 200 within two seconds, else None."""
    import requests

    try:
        res = requests.get(url, timeout=2)
    except requests.RequestException:
        return None
    return res.text if res.status_code == 200 else None


# The pages worth opening on the VictoriaMetrics engine's children, the first that answers: the
# store's query UI, vmagent's targets, vmalert's alerts.
_ENGINE_PAGES = {"victoriametrics": ("/vmui/", "/"), "vmagent": ("/targets",),
                 "vmalert": ("/vmalert/alerts", "/alerts", "/")}


def where_to_look(children: Sequence[Child]) -> list[str]:
    """One line per child: the page worth opening there, each checked to answer before it is
    named (distribution builds serve different pages from the upstream ones)."""
    lines = []
    for ch in children:
        base = ch.url.removesuffix("/metrics")
        if ch.name == "exporter":
            pages = [u for u in (ch.url, f"{base}/docs/runbook.md") if _page(u) is not None]
            lines.append(f"exporter      {'  '.join(pages)}")
        elif ch.name == "prometheus":
            # Upstream builds serve the alerts page at /alerts; Debian's 2.x at /classic/alerts.
            page = next((base + p for p in ("/alerts", "/classic/alerts", "/graph", "/classic/graph")
                         if _page(base + p) is not None), None)
            lines.append(f"prometheus    {page or base}")
        elif ch.name == "alertmanager":
            ui = _page(base + "/")
            if ui is not None and _NO_ALERTMANAGER_UI not in " ".join(ui.split()):
                lines.append(f"alertmanager  {base}/#/alerts")
            else:  # Debian's package: the API alone, which amtool reads
                amtool = (f"; amtool --alertmanager.url={base} alert query"
                          if find_binary("amtool") else "")
                lines.append(f"alertmanager  {base}/api/v2/alerts (this build has no web UI{amtool})")
        elif ch.name in _ENGINE_PAGES:
            page = next((base + p for p in _ENGINE_PAGES[ch.name] if _page(base + p) is not None), base)
            lines.append(f"{ch.name:<13} {page}")
        elif ch.name == "grafana":
            lines.append(f"grafana       {base}/dashboards")
    return lines


def _card_line(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str:
    """The card as Alertmanager holds it: its summary on the first line, then what its receivers
    get besides (the description, with the step and the value, and the runbook's link)."""
    card = {"critical": "RED   ", "warning": "yellow"}.get(labels.get("severity", ""), "other ")
    where = " ".join(f"{k}={labels[k]}" for k in ("run", "rank", "gpu") if k in labels)
    lines = [f"  [{card}] {labels.get('alertname')} {where}: {annotations.get('summary', '')}"]
    if annotations.get("description"):
        lines.append(f"           {annotations['description']}")
    if annotations.get("runbook_url"):
        lines.append(f"           runbook: {annotations['runbook_url']}")
    return "\n".join(lines)


class CardPrinter:
    """Prints each card the first time Alertmanager holds it active: what its receivers get.
    Inhibited cards (a yellow one under a red one of the same run) and silenced ones are left
    out, as Alertmanager leaves them out of its notifications. One line per card and run, rank
    or GPU: the alerts under it that differ in a detail (which key went NaN) are one card."""

    def __init__(self, alertmanager_url: str, out: Callable[[str], None] = print,
                 every: float = 2.0) -> None:
        self.url = alertmanager_url + "/api/v2/alerts"
        self.out = out
        self.every = every
        self.seen: set[str] = set()
        self.names: set[str] = set()
        self._next = 0.0

    def poll(self) -> None:
        import requests

        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.every
        try:
            alerts = requests.get(self.url, params={"active": "true", "inhibited": "false",
                                                    "silenced": "false"}, timeout=2).json()
        except (requests.RequestException, ValueError):
            return
        for alert in alerts:
            labels = alert["labels"]
            card = "/".join(labels.get(k, "") for k in ("alertname", "run", "rank", "gpu"))
            if card in self.seen:
                continue
            self.seen.add(card)
            self.names.add(labels.get("alertname", ""))
            self.out(_card_line(labels, alert.get("annotations") or {}))


class PausePrinter:
    """Prints each pause record the exporter writes into a run folder (a red card pausing its
    run), and each resume. Records already there when it starts are not news."""

    def __init__(self, snapshot_dir: Path, out: Callable[[str], None] = print) -> None:
        self.snapshot_dir = Path(snapshot_dir)
        self.out = out
        # Runs whose writer reads no pause record (the demo's simulated run): their pause line
        # says the record was written and the run goes on, not that a trainer waits.
        self.deaf: set[str] = set()
        self.seen: dict[str, tuple[int, int]] = {}
        self.paused: dict[str, int | None] = {}  # run -> the step its newest pause record names
        # run -> its files' sizes when it was paused: the trainer's answer to the resume lies
        # past them (trainer_marks.py); a rollback is said only once the trainer logged one.
        self.awaiting: dict[str, dict[Path, int]] = {}
        self.since: dict[str, dict[Path, int]] = {}
        for run, sig in self._records():
            self.seen[run] = sig

    def _records(self) -> list[tuple[str, tuple[int, int]]]:
        """(run, file signature) of every run folder's pause record, regular files only: nothing
        placed in the folder can block the stack on a read."""
        import stat as stat_mod

        found = []
        try:
            entries = list(os.scandir(self.snapshot_dir))
        except OSError:
            return []
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                st = os.stat(Path(entry.path) / PAUSE_RECORD, follow_symlinks=False)
            except OSError:
                continue
            if stat_mod.S_ISREG(st.st_mode):
                found.append((entry.name, (st.st_mtime_ns, st.st_size)))
        return found

    def poll(self) -> None:
        for run, since in list(self.awaiting.items()):
            answer = trainer_answer(self.snapshot_dir / run, since)
            if answer is None:
                continue
            del self.awaiting[run]
            if answer.to_step is not None:
                self.out(f"  [resume] run={run}: its trainer rolled back to the checkpoint of step "
                         f"{answer.to_step}")
            else:
                self.out(f"  [resume] run={run}: its trainer went on without a rollback, at step "
                         f"{answer.step}")
        for run, sig in self._records():
            if self.seen.get(run) == sig:
                continue
            self.seen[run] = sig
            try:
                record = read_control(self.snapshot_dir, run)
            except ValueError:
                continue
            if record is None:
                continue
            path = self.snapshot_dir / run / PAUSE_RECORD
            if record.state == "paused":
                self.paused[run] = record.step
                self.since[run] = file_sizes(self.snapshot_dir / run)
                # record.step is the newest step the exporter had seen: the trainer stops at the
                # boundary after it, the step it then names.
                if run in self.deaf:
                    self.out(f"  [PAUSE ] run={run}: {record.alertname} wrote its pause record after "
                             f"step {record.step}, but this simulated run reads no pause record and "
                             f"goes on (a trainer with PauseGate or SnapshotWriter.should_pause() "
                             f"stops at its next step boundary) ({path})")
                else:
                    self.out(f"  [PAUSE ] run={run}: {record.alertname} paused it after step "
                             f"{record.step}; its trainer waits at its next step boundary ({path})")
            else:
                self.paused.pop(run, None)
                asked = {"last_healthy": "a rollback to the last healthy checkpoint",
                         "step": f"a rollback to the checkpoint of step {record.rollback_to}",
                         "none": "no rollback"}.get(record.rollback or "", "no rollback")
                self.out(f"  [resume] run={run}: resume written, asking for {asked} ({path})")
                if run not in self.deaf:
                    self.awaiting[run] = self.since.pop(run, {})

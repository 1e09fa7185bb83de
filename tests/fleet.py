"""A two-node fleet on loopback, as real processes: docs/scaling.md's layout, run for real.

    node-a: exporter (grpo-monitor serve) <- workdir/node-a/snapshots <- its ranks ─┐
    node-b: exporter (grpo-monitor serve) <- workdir/node-b/snapshots <- its ranks ─┤
      Prometheus (prometheus-fleet.yml, targets from workdir/file_sd/*.yml) <────────┘
        │ rules -> Alertmanager (alertmanager.yml) -> webhook of one node's exporter
        │ remote_write -> a second Prometheus, --web.enable-remote-write-receiver
        ▼   (the long-term store's stand-in)

Every process is a real subprocess listening on 127.0.0.1, on a port picked by binding to port
0 (tests/processes.py's start_listening); configs, TSDBs, logs and the webhook token live in one
working folder. An exporter can be killed and started again on the same port (Node.stop,
Node.start), as a node that goes away and comes back. Trainer ranks are launched as one
torch.distributed (gloo) job spread over the nodes' snapshot folders (Fleet.launch).

The configs are the committed ones with only what must differ rewritten, as in
tests/prometheus_harness.py:
prometheus-fleet.yml keeps its job, its relabeling to `node`, its external labels and the
committed rule files (by absolute path, unchanged: GRPOExporterDown keeps its `for: 2m`);
its intervals shrink, its file_sd folder and Alertmanager move to the working folder and to
loopback, and the first remote_write example of its commented block is enabled with the
receiver's URL. alertmanager.yml keeps its routes; its grpo-webhook receiver points at
the chosen node's exporter with the token file that exporter reads.

Used by tests/test_fleet.py.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import requests
import yaml
from gloo_job import GlooJob
from polling import wait_for
from processes import log_tail, start_listening, wait_ready
from prometheus_harness import (
    PROMETHEUS_DIR,
    alertmanager_known,
    server_state,
    start_alertmanager,
    start_prometheus,
    uncomment_example,
)

from grpo_monitor.cli import ENV_PREFIX
from grpo_monitor.runtime.config import parse_duration
from grpo_monitor.tools import stack as native
from grpo_monitor.tools.stack import Child

FLEET_YML = PROMETHEUS_DIR / "prometheus-fleet.yml"
NODE_NAMES = ("node-a", "node-b")
TARGET_FILE = "exporters.yml"  # the harness's file in the file_sd folder
RECEIVE_PATH = "/api/v1/write"  # Prometheus' remote-write receiver endpoint


# --- configs -------------------------------------------------------------------------------


def remote_write_example(url: str, secrets_dir: Path, interval: str) -> dict[str, Any]:
    """The first remote_write example of prometheus-fleet.yml's commented block (Mimir's: a
    tenant header, basic auth from a password file, the small queue), sent to ``url``.

    The receiver ignores the header and the credentials, but Prometheus still reads the
    password file and sends both, so the example is exercised as written. The batch deadline
    shrinks with the intervals (default 5 s) so that samples reach the receiver quickly."""
    block = yaml.safe_load(uncomment_example(FLEET_YML.read_text(), "REMOTE_WRITE"))
    example: dict[str, Any] = block["remote_write"][0]
    example["url"] = url
    auth = example.get("basic_auth", {})
    if "password_file" in auth:
        secrets_dir.mkdir(parents=True, exist_ok=True)
        password = secrets_dir / PurePosixPath(auth["password_file"]).name
        password.write_text("loopback-only\n")
        password.chmod(0o600)
        auth["password_file"] = str(password)
    example.setdefault("queue_config", {})["batch_send_deadline"] = interval
    return example


def fleet_prometheus_config(file_sd_dir: Path, alertmanager_target: str, remote_write_url: str,
                            secrets_dir: Path, interval: str = "1s",
                            source: Path = FLEET_YML) -> dict[str, Any]:
    """prometheus-fleet.yml with short intervals, absolute rule files, a loopback
    Alertmanager, its file_sd patterns moved into ``file_sd_dir`` and remote_write on."""
    config: dict[str, Any] = native.prometheus_config(source, None, alertmanager_target,
                                                      interval)
    for sc in config["scrape_configs"]:
        for sd in sc.get("file_sd_configs", []):
            # Same file names (`*.yml`), another folder: the committed file_sd/ holds the
            # compose stack's `exporter:9400`, which does not resolve here.
            sd["files"] = [str(file_sd_dir / PurePosixPath(f).name) for f in sd["files"]]
    config["remote_write"] = [remote_write_example(remote_write_url, secrets_dir, interval)]
    return config


def exporter_env() -> dict[str, str]:
    """The environment without GRPO_MONITOR_* settings, which `serve` would take as flags."""
    return {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}


# --- nodes and ranks -----------------------------------------------------------------------


class Node:
    """One node: its snapshot folder and its exporter, a subprocess on a fixed port."""

    def __init__(self, name: str, snapshot_dir: Path, port: int, process: Child,
                 argv: Callable[[int], list[str]], workdir: Path) -> None:
        self.name = name
        self.snapshot_dir = snapshot_dir
        self.port = port
        self.process = process
        self._argv = argv
        self._workdir = workdir
        self._starts = 1

    @property
    def target(self) -> str:
        """host:port as the file_sd file lists it; Prometheus' `instance` label."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}"

    def alive(self) -> bool:
        return self.process.alive()

    def stop(self, *, hard: bool = False) -> None:
        """Stop the exporter: SIGTERM (SIGKILL after 10 s), or SIGKILL at once with ``hard``,
        like a node that dies without closing its connections."""
        if hard and self.process.alive():
            self.process.proc.kill()
        self.process.stop()

    def start(self, timeout: float = 30.0) -> None:
        """Start the exporter again on the same port (the target Prometheus knows) and wait
        until it is ready, i.e. has read the files on disk again. Each start has its own log."""
        if self.process.alive():
            raise RuntimeError(f"{self.name}: the exporter is still running")
        self._starts += 1
        name = f"{self.name}-exporter"
        self.process = Child.start(name, self._argv(self.port),
                                   self._workdir / f"{name}.{self._starts}.log", self._workdir,
                                   url=self.url, env=exporter_env())
        wait_ready(self.process, timeout)


# --- the fleet -----------------------------------------------------------------------------


@dataclass
class Fleet:
    """The running fleet. ``nodes`` are the jobs' nodes (node-a, node-b), all listed in the
    harness's target file; ``webhook_node`` is the one whose exporter Alertmanager's
    grpo-webhook receiver posts to; ``services`` are Alertmanager, the receiver and the fleet's
    Prometheus. Exporters and every launched job are stopped when start_fleet's block ends."""

    workdir: Path
    nodes: list[Node]
    webhook_node: Node
    prometheus_url: str
    receiver_url: str
    alertmanager_url: str
    token_file: Path
    file_sd_dir: Path
    interval_s: float
    external_labels: dict[str, str]
    services: list[Child]  # alertmanager, receiver, prometheus
    _stack: ExitStack = field(repr=False)
    _jobs: list[GlooJob] = field(default_factory=list, repr=False)
    _extra: list[Node] = field(default_factory=list, repr=False)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    # -- file_sd --

    def write_targets(self, targets: Sequence[str], file: str = TARGET_FILE,
                      labels: Mapping[str, str] | None = None) -> Path:
        """Write one target group to ``file_sd_dir/file`` atomically (a temporary file, then a
        rename, as docs/scaling.md asks: Prometheus rejects a half-written file). The
        temporary name ends in .tmp, so the `*.yml` pattern never matches it."""
        group: dict[str, Any] = {"targets": list(targets)}
        if labels:
            group["labels"] = dict(labels)
        path = self.file_sd_dir / file
        tmp = path.with_name(f".{file}.tmp")
        tmp.write_text(yaml.safe_dump([group], sort_keys=False))
        os.replace(tmp, path)
        return path

    def remove_targets(self, file: str) -> None:
        (self.file_sd_dir / file).unlink(missing_ok=True)

    def reset_targets(self) -> None:
        """Back to the harness's own file listing every node, and nothing else."""
        for path in self.file_sd_dir.glob("*.yml"):
            if path.name != TARGET_FILE:
                path.unlink()
        self.write_targets([n.target for n in self.nodes])

    def active_targets(self) -> dict[str, dict[str, Any]]:
        """Prometheus' active targets by `instance`."""
        resp = requests.get(f"{self.prometheus_url}/api/v1/targets", timeout=5)
        resp.raise_for_status()
        return {t["labels"]["instance"]: t for t in resp.json()["data"]["activeTargets"]}

    @contextmanager
    def extra_node(self, name: str) -> Iterator[Node]:
        """Another node's exporter (its own, empty snapshot folder), in no target file and
        not in ``nodes``: a node that joins and leaves the fleet without disturbing the
        nodes the jobs run on. Stopped on exit."""
        with ExitStack() as stack:
            node = start_node(stack, name, self.workdir, self.token_file)
            self._extra.append(node)
            try:
                yield node
            finally:
                self._extra.remove(node)

    # -- queries --

    def query(self, promql: str, url: str | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (default: the fleet Prometheus; pass
        ``receiver_url`` for the long-term store). A query Prometheus rejects raises
        ValueError, which wait_query does not retry."""
        resp = requests.get(f"{url or self.prometheus_url}/api/v1/query",
                            params={"query": promql}, timeout=5)
        body = resp.json()
        if body.get("status") != "success":
            raise ValueError(f"{promql}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_query(self, promql: str,
                   predicate: Callable[[list[dict[str, Any]]], Any] = bool,
                   timeout: float = 30.0, url: str | None = None,
                   what: str = "") -> list[dict[str, Any]]:
        """Poll ``query(promql)`` until ``predicate(result)`` is truthy (default: non-empty);
        return that result. On timeout, fail with ``what``, the last result and diagnose()."""
        box: list[list[dict[str, Any]]] = [[]]

        def check() -> bool:
            box[0] = self.query(promql, url)
            return bool(predicate(box[0]))

        where = "the receiver" if url == self.receiver_url else url or "the fleet's Prometheus"
        wait_for(check, timeout, interval=0.2,
                 what=f"{what or 'a non-empty result'}: {promql} at {where}",
                 diagnose=lambda: f"last result: {json.dumps(box[0])}\n{self.diagnose((promql,))}")
        return box[0]

    def am_alerts(self) -> list[dict[str, Any]]:
        resp = requests.get(f"{self.alertmanager_url}/api/v2/alerts", timeout=5)
        resp.raise_for_status()
        alerts: list[dict[str, Any]] = resp.json()
        return alerts

    # -- trainer ranks --

    def launch(self, script: Path, run: str, args: Sequence[str] = (), *,
               world_size: int = 4) -> GlooJob:
        """Start ``world_size`` ranks of ``script`` as one gloo job, spread over the nodes in
        blocks (tests/gloo_job.py): with 4 ranks and 2 nodes, ranks 0-1 write to node-a's
        snapshot folder, ranks 2-3 to node-b's. The ranks are stopped with the fleet."""
        job = GlooJob([n.snapshot_dir for n in self.nodes], run, args, world_size=world_size,
                      script=script, log_dir=self.workdir)
        self._jobs.append(job)
        self._stack.callback(job.stop)
        return job

    # -- diagnostics --

    def logs(self) -> str:
        procs = [*self.services, *(n.process for n in (*self.nodes, *self._extra))]
        parts = [f"--- {p.name} log ({p.log}) ---\n{log_tail(p)}" for p in procs]
        parts += [job.logs() for job in self._jobs]
        return "\n".join(parts)

    def diagnose(self, promql: Sequence[str] = ()) -> str:
        """Where things stand, for a failure message; never raises."""
        return "\n".join([*server_state(self.prometheus_url, self.alertmanager_url, promql),
                          self.logs()])

    def wait_scraping(self, timeout: float = 30.0) -> None:
        """Every node's exporter is an active target and up, and Prometheus knows the
        Alertmanager."""
        want = {n.target for n in self.nodes}

        def all_up() -> bool:
            targets = self.active_targets()
            return want <= targets.keys() and all(targets[t]["health"] == "up" for t in want)

        wait_for(all_up, timeout, interval=0.2, what=f"targets {sorted(want)} up",
                 diagnose=self.diagnose)
        wait_for(lambda: alertmanager_known(self.prometheus_url), timeout, interval=0.2,
                 what="Alertmanager discovered", diagnose=self.diagnose)


def start_node(stack: ExitStack, name: str, workdir: Path, token_file: Path) -> Node:
    """Start node ``name``'s exporter on ``workdir/<name>/snapshots``, without the GPU
    collector, its webhook reading ``token_file``; ``stack`` stops it."""
    snapshot_dir = workdir / name / "snapshots"
    snapshot_dir.mkdir(parents=True, exist_ok=True)

    def argv(port: int) -> list[str]:
        return [sys.executable, "-m", "grpo_monitor.cli", "serve",
                "--snapshot.dir", str(snapshot_dir), "--web.listen-address", f"127.0.0.1:{port}",
                "--web.webhook-token-file", str(token_file), "--no-collector.gpu"]

    process, port = start_listening(stack, f"{name}-exporter", argv, workdir, env=exporter_env())
    node = Node(name, snapshot_dir, port, process, argv, workdir)
    # Whichever process is the node's at the end (a test may have restarted it).
    stack.callback(lambda: node.process.stop())
    return node


@contextmanager
def start_fleet(workdir: Path, *, interval: str = "1s", webhook_node: int = 0,
                token: str = "fleet-token-0123456789abcdef") -> Iterator[Fleet]:
    """Start two exporters, the remote-write receiver, Alertmanager and the fleet's
    Prometheus; yield once Prometheus scrapes both exporters; stop everything on exit
    (launched ranks first)."""
    workdir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        # One token file for every exporter: the webhook of any node accepts the central
        # Alertmanager (docs/scaling.md: copy the central node's token to the nodes it pauses).
        # A trailing newline, as `... | base64 > webhook-token` leaves it.
        token_file = workdir / "webhook-token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)

        # One process at a time, each ready (its port bound) before the next port is picked,
        # so that two of ours can never be handed the same free port.
        nodes = [start_node(stack, name, workdir, token_file) for name in NODE_NAMES]

        # Nothing to scrape, no rules: it only stores what the fleet's Prometheus sends.
        receiver, receiver_url = start_prometheus(stack, workdir, {"global": {}}, "receiver",
                                                  ["--web.enable-remote-write-receiver"])

        hook = nodes[webhook_node]
        am, alertmanager_url, _ = start_alertmanager(
            stack, workdir, f"{hook.url}/-/alertmanager/webhook", token_file)
        am_port = alertmanager_url.rsplit(":", 1)[1]

        file_sd_dir = workdir / "file_sd"
        file_sd_dir.mkdir(exist_ok=True)
        prom_config = fleet_prometheus_config(file_sd_dir, f"127.0.0.1:{am_port}",
                                              receiver_url + RECEIVE_PATH, workdir / "secrets",
                                              interval)
        prom, prometheus_url = start_prometheus(stack, workdir, prom_config, "prometheus-fleet")

        fleet = Fleet(workdir=workdir, nodes=nodes, webhook_node=hook,
                      prometheus_url=prometheus_url, receiver_url=receiver_url,
                      alertmanager_url=alertmanager_url, token_file=token_file,
                      file_sd_dir=file_sd_dir, interval_s=parse_duration(interval),
                      external_labels=dict(prom_config["global"]["external_labels"]),
                      services=[am, receiver, prom], _stack=stack)
        # Written once Prometheus runs: discovery of a file that appears is what a fleet does
        # (the scheduler writes it when the job starts), and the first targets prove it.
        fleet.reset_targets()
        fleet.wait_scraping()
        yield fleet

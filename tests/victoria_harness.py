"""VictoriaMetrics as the rule engine, as real processes for the tests: victoria-metrics (the
store), vmagent scraping the exporter into it, vmalert evaluating the committed rule files
against it and sending to an Alertmanager (Debian's `victoria-metrics` package, make
system-deps).

The flags and configs are the ones `grpo-monitor stack up --stack.engine=victoriametrics` runs
(grpo_monitor.tools.victoriametrics), with loopback ports and shorter intervals.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml
from processes import log_tail, start_listening

from grpo_monitor.tools import victoriametrics as vm
from grpo_monitor.tools.stack import Child, find_binary
from prometheus_harness import prometheus_config


def binary(name: str) -> str:
    path = find_binary(name)
    if path:
        return path
    raise RuntimeError(f"{name} not on PATH: install Debian's {vm.PACKAGE} package (make system-deps)")


@dataclass
class VictoriaStack:
    """The three processes and their URLs; ``restart_ruler`` stops vmalert and starts it again
    with the same flags (its state comes back from the store)."""

    workdir: Path
    stack: ExitStack
    server: Child
    agent: Child
    ruler: Child
    store_url: str
    alertmanager_url: str
    prometheus: dict[str, Any]  # the Prometheus config both engines are derived from

    @property
    def ruler_url(self) -> str:
        return self.ruler.url

    def processes(self) -> list[Child]:
        return [self.server, self.agent, self.ruler]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} log ({p.log}) ---\n{log_tail(p)}" for p in self.processes())

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query answered by the store (what vmalert's rules read)."""
        resp = requests.get(f"{self.store_url}/api/v1/query", params={"query": promql}, timeout=10)
        resp.raise_for_status()
        return resp.json()["data"]["result"]

    def alerts(self) -> list[dict[str, Any]]:
        """vmalert's active alerts (its Prometheus-compatible /api/v1/alerts)."""
        resp = requests.get(f"{self.ruler_url}/api/v1/alerts", timeout=10)
        resp.raise_for_status()
        return resp.json()["data"]["alerts"] or []

    def evaluations(self) -> dict[str, float]:
        """Evaluations started so far, by rule group (vmalert_iteration_total)."""
        return group_counters(requests.get(f"{self.ruler_url}/metrics", timeout=10).text,
                              "vmalert_iteration_total")

    def start_ruler(self) -> Child:
        self.ruler, _ = start_listening(self.stack, "vmalert", lambda port: vm.ruler_argv(
            binary(vm.RULER_BIN), self.prometheus, port, self.store_url, self.alertmanager_url),
            self.workdir)
        return self.ruler

    def restart_ruler(self) -> Child:
        self.ruler.stop()
        self.ruler.log.rename(self.ruler.log.with_suffix(".log.before-restart"))
        return self.start_ruler()


_GROUP = re.compile(r'group="([^"]*)"')


def group_counters(exposition: str, name: str) -> dict[str, float]:
    """``name``'s value by its ``group`` label (the rule group; Prometheus puts the file before
    it), from an exposition."""
    out: dict[str, float] = {}
    for line in exposition.splitlines():
        if line.startswith(name + "{"):
            m = _GROUP.search(line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return out


@contextmanager
def victoria_stack(workdir: Path, exporter_url: str, alertmanager_url: str,
                   interval: str = "1s") -> Iterator[VictoriaStack]:
    """victoria-metrics, vmagent scraping ``exporter_url`` and vmalert sending to
    ``alertmanager_url``, each ready before the next starts; all stopped on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    prometheus = prometheus_config(exporter_url.split("://", 1)[-1].rstrip("/"),
                                   alertmanager_url.split("://", 1)[-1], interval)
    with ExitStack() as stack:
        server, port = start_listening(stack, "victoria-metrics", lambda p: vm.server_argv(
            binary(vm.SERVER_BIN), workdir / "victoria-metrics-data", p), workdir)
        store_url = f"http://127.0.0.1:{port}"
        scrape_yml = workdir / "vmagent.yml"
        scrape_yml.write_text(yaml.safe_dump(vm.scrape_config(prometheus), sort_keys=False))
        agent, _ = start_listening(stack, "vmagent", lambda p: vm.agent_argv(
            binary(vm.AGENT_BIN), scrape_yml, workdir / "vmagent-data", p, store_url), workdir)
        vs = VictoriaStack(workdir, stack, server, agent, None, store_url,  # type: ignore[arg-type]
                           alertmanager_url, prometheus)
        vs.start_ruler()
        yield vs

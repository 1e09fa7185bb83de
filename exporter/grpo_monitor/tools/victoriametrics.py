"""VictoriaMetrics as the stack's store and rule engine: vmagent scrapes the exporters into a
victoria-metrics server, vmalert evaluates the committed rule files against it and sends the
cards to the same Alertmanager.

Everything here is derived from the Prometheus configuration the stack would run
(stack.prometheus_config of the committed `prometheus/prometheus.yml`), so that both engines run
one configuration: its scrape configs (vmagent), its rule files, its evaluation interval and its
external labels (vmalert). What differs between the engines and why is in
docs/scaling.md#victoriametrics; the flags that make VictoriaMetrics answer the rules as
Prometheus does are set here, each with its reason.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Debian's package `victoria-metrics` ships all three under these names.
SERVER_BIN = "victoria-metrics"
AGENT_BIN = "vmagent"
RULER_BIN = "vmalert"
PACKAGE = "victoria-metrics"

# How long after a scrape its samples may be missing from a query. VictoriaMetrics hides the last
# -search.latencyOffset (default 30 s) from every query and answers for now - offset instead;
# vmalert would then judge data two scrapes old and hold a card 30 s after its sickness ended.
# One second leaves room for a remote-write batch in flight.
LATENCY_OFFSET = "1s"


def scrape_config(prometheus: Mapping[str, Any]) -> dict[str, Any]:
    """vmagent's -promscrape.config from a Prometheus config as the stack runs it
    (stack.prometheus_config: targets and intervals set): its scrape configs and scrape interval,
    nothing else. Rule files and Alertmanagers are vmalert's business; external labels belong on
    alerts and remote writes, not on every scraped series (Prometheus keeps them off its own
    queries, so the rules must not see them either)."""
    glob = {k: v for k, v in prometheus.get("global", {}).items()
            if k in ("scrape_interval", "scrape_timeout")}
    return {"global": glob, "scrape_configs": copy.deepcopy(prometheus["scrape_configs"])}


def server_argv(binary: str, data_dir: Path, port: int) -> list[str]:
    """victoria-metrics on loopback, its data in ``data_dir``."""
    return [binary, f"-storageDataPath={data_dir}", f"-httpListenAddr=127.0.0.1:{port}",
            f"-search.latencyOffset={LATENCY_OFFSET}",
            # Rules read what was written a second ago: no cached answer may hide it.
            "-search.disableCache"]


def agent_argv(binary: str, config_file: Path, data_dir: Path, port: int, store_url: str) -> list[str]:
    """vmagent scraping ``config_file``'s targets into ``store_url``."""
    return [binary, f"-promscrape.config={config_file}", f"-remoteWrite.url={store_url}/api/v1/write",
            f"-remoteWrite.tmpDataPath={data_dir}", f"-httpListenAddr=127.0.0.1:{port}",
            # A batch a second: a card waits on the scrape, not on vmagent's buffer.
            "-remoteWrite.flushInterval=1s",
            # vmagent rejects a body over 16 MiB; Prometheus takes any. One exporter serving
            # 16,384 ranks answers 42 MiB (docs/scaling.md#rules-at-scale).
            "-promscrape.maxScrapeSize=1GiB"]


def ruler_argv(binary: str, prometheus: Mapping[str, Any], port: int, store_url: str,
               alertmanager_url: str, external_url: str = "") -> list[str]:
    """vmalert evaluating the rule files of ``prometheus`` (a config as the stack runs it: rule
    files absolute, its evaluation interval and external labels) against ``store_url``, writing
    recording rules and ALERTS back to it and restoring its state from it on restart, its cards
    to ``alertmanager_url``."""
    glob = prometheus.get("global", {})
    every = glob.get("evaluation_interval", "1m")
    return [
        binary, *(f"-rule={f}" for f in prometheus["rule_files"]),
        f"-datasource.url={store_url}", f"-remoteWrite.url={store_url}",
        f"-remoteRead.url={store_url}", f"-notifier.url={alertmanager_url}",
        f"-httpListenAddr=127.0.0.1:{port}", f"-evaluationInterval={every}",
        *(f"-external.label={k}={v}" for k, v in (glob.get("external_labels") or {}).items()),
        *([f"-external.url={external_url}"] if external_url else []),
        # Prometheus names no rule group on an alert; the inhibit rules and routes match on the
        # alert's own labels only, and so must the alerts.
        "-disableAlertgroupLabel",
        # Each evaluation at its own time, as Prometheus does: aligned to the interval, a query
        # asks for a moment up to one interval old and misses the last scrape.
        "-datasource.queryTimeAlignment=false",
        # The recording rules (thresholds, readiness) are read back by the next evaluation.
        "-remoteWrite.flushInterval=1s",
    ]

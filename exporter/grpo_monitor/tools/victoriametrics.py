"""VictoriaMetrics as the stack's store and rule engine: vmagent scrapes the exporters into a
victoria-metrics server, vmalert evaluates the committed rule files against it and sends the
cards to the same Alertmanager.

Everything here is derived from the Prometheus configuration the stack would run
(stack.prometheus_config of the committed `prometheus/prometheus.yml`), so that both engines run
one configuration: its scrape configs (vmagent), its rule files, its evaluation interval and its
external labels (vmalert). What differs between the engines and why is in
docs/scaling.md#victoriametrics; the flags that make VictoriaMetrics answer the rules as
Prometheus does are set here, each with its reason.

The Compose side is generated from the same functions (``python -m
grpo_monitor.tools.victoriametrics --write``, part of ``make docs``): vmagent's scrape configs
``prometheus/vmagent.yml`` and ``prometheus/vmagent-fleet.yml``, and the ``command:`` of the three
services of ``docker-compose.victoriametrics.yml``.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import yaml

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


# How often vmagent re-reads the file_sd_configs' files (prometheus-fleet.yml's targets). It has no
# file watch: its default, 5 min, would leave a node added to file_sd/ unscraped that long, where
# Prometheus sees the change within seconds.
FILE_SD_CHECK_INTERVAL = "30s"


def scrape_config(prometheus: Mapping[str, Any]) -> dict[str, Any]:
    """vmagent's -promscrape.config from a Prometheus config as the stack runs it
    (stack.prometheus_config: targets and intervals set), or as committed for Compose: its scrape
    configs and scrape interval, nothing else. Rule files and Alertmanagers are vmalert's
    business; external labels belong on alerts and remote writes, not on every scraped series
    (Prometheus keeps them off its own queries, so the rules must not see them either).
    file_sd_configs lose ``refresh_interval``: vmagent refuses the field (it polls every
    -promscrape.fileSDCheckInterval instead, :data:`FILE_SD_CHECK_INTERVAL`)."""
    glob = {k: v for k, v in prometheus.get("global", {}).items()
            if k in ("scrape_interval", "scrape_timeout")}
    scrape_configs = copy.deepcopy(prometheus["scrape_configs"])
    for sc in scrape_configs:
        for sd in sc.get("file_sd_configs", []):
            sd.pop("refresh_interval", None)
    return {"global": glob, "scrape_configs": scrape_configs}


def server_argv(binary: str, data_dir: PurePath, port: int, host: str = "127.0.0.1") -> list[str]:
    """victoria-metrics on ``host`` (loopback; "" for every interface, as in a container), its
    data in ``data_dir``."""
    return [binary, f"-storageDataPath={data_dir}", f"-httpListenAddr={host}:{port}",
            f"-search.latencyOffset={LATENCY_OFFSET}",
            # Rules read what was written a second ago: no cached answer may hide it.
            "-search.disableCache"]


def agent_argv(binary: str, config_file: PurePath | str, data_dir: PurePath, port: int,
               store_url: str, host: str = "127.0.0.1") -> list[str]:
    """vmagent scraping ``config_file``'s targets into ``store_url``, listening on ``host``."""
    return [binary, f"-promscrape.config={config_file}", f"-remoteWrite.url={store_url}/api/v1/write",
            f"-remoteWrite.tmpDataPath={data_dir}", f"-httpListenAddr={host}:{port}",
            # A batch a second: a card waits on the scrape, not on vmagent's buffer.
            "-remoteWrite.flushInterval=1s",
            f"-promscrape.fileSDCheckInterval={FILE_SD_CHECK_INTERVAL}",
            # vmagent rejects a body over 16 MiB; Prometheus takes any. One exporter serving
            # 16,384 ranks answers 46 MiB (docs/scaling.md#rules-at-scale).
            "-promscrape.maxScrapeSize=1GiB"]


def ruler_argv(binary: str, prometheus: Mapping[str, Any], port: int, store_url: str,
               alertmanager_url: str, external_url: str = "", host: str = "127.0.0.1") -> list[str]:
    """vmalert evaluating the rule files of ``prometheus`` (a config as the stack runs it: rule
    files absolute, its evaluation interval and external labels) against ``store_url``, writing
    recording rules and ALERTS back to it and restoring its state from it on restart, its cards
    to ``alertmanager_url``; listening on ``host``."""
    glob = prometheus.get("global", {})
    every = glob.get("evaluation_interval", "1m")
    return [
        binary, *(f"-rule={f}" for f in prometheus["rule_files"]),
        f"-datasource.url={store_url}", f"-remoteWrite.url={store_url}",
        f"-remoteRead.url={store_url}", f"-notifier.url={alertmanager_url}",
        f"-httpListenAddr={host}:{port}", f"-evaluationInterval={every}",
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


# -- docker-compose.victoriametrics.yml ----------------------------------------------------------
#
# The containers' side of the same flags: the services' names and ports on the Compose network
# (the upstream images' own ports), the data folders of the named volumes, and where the
# committed files are mounted. The rule files are mounted where Prometheus' container has them
# (/etc/prometheus/rules), so that the rule_files of prometheus.yml resolve alike in both.

REPO = Path(__file__).resolve().parents[3]
CONFIG_DIR = REPO / "prometheus"
COMPOSE_OVERRIDE = REPO / "docker-compose.victoriametrics.yml"
# vmagent's scrape config generated from each Prometheus config the compose file can select
# (GRPO_PROMETHEUS_CONFIG): committed file -> the Prometheus config it comes from. The override
# mounts each under its Prometheus config's name, so that the one setting picks both.
SCRAPE_CONFIGS = {"vmagent.yml": "prometheus.yml", "vmagent-fleet.yml": "prometheus-fleet.yml"}

SERVICE_PORTS = {"victoriametrics": 8428, "vmagent": 8429, "vmalert": 8880}
STORE_URL = f"http://victoriametrics:{SERVICE_PORTS['victoriametrics']}"
CONTAINER_CONFIG_DIR = PurePosixPath("/etc/prometheus")
CONTAINER_SCRAPE_CONFIG = "/etc/vmagent/${GRPO_PROMETHEUS_CONFIG:-prometheus.yml}"
CONTAINER_DATA = {"victoriametrics": PurePosixPath("/storage"), "vmagent": PurePosixPath("/vmagentdata")}
# Where a card's link (generatorURL) opens vmalert: the host people reach, as Prometheus'
# --web.external-url in docker-compose.yml, and vmalert's published port.
RULER_EXTERNAL_URL = "http://${GRPO_EXTERNAL_HOST:-localhost}:${GRPO_VMALERT_PORT:-8880}"


def compose_commands(prometheus: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each VictoriaMetrics service's ``command:`` (the arguments after its image's entrypoint)
    for the committed ``prometheus`` config (prometheus.yml as Compose runs it: its targets and
    Alertmanager are the compose services): the argv of :func:`server_argv`, :func:`agent_argv`
    and :func:`ruler_argv`, every interface, container paths, the rule files where the mounts put
    them. Strings with ``${...}`` are Compose's to interpolate."""
    config = copy.deepcopy(dict(prometheus))
    config["rule_files"] = [str(CONTAINER_CONFIG_DIR / f) for f in config["rule_files"]]
    [alertmanager] = [t for am in config["alerting"]["alertmanagers"]
                      for sc in am["static_configs"] for t in sc["targets"]]
    ports, data = SERVICE_PORTS, CONTAINER_DATA
    return {
        "victoriametrics": server_argv("", data["victoriametrics"], ports["victoriametrics"], host="")[1:],
        "vmagent": agent_argv("", CONTAINER_SCRAPE_CONFIG, data["vmagent"], ports["vmagent"], STORE_URL,
                              host="")[1:],
        "vmalert": ruler_argv("", config, ports["vmalert"], STORE_URL, f"http://{alertmanager}",
                              external_url=RULER_EXTERNAL_URL, host="")[1:],
    }


_GENERATED = re.compile(r"^(?P<indent> *)# BEGIN GENERATED (?P<service>[\w-]+) command\b.*?\n"
                        r".*?^(?P=indent)# END GENERATED\n", re.M | re.S)


def render_compose(text: str, prometheus: Mapping[str, Any]) -> str:
    """``text`` (docker-compose.victoriametrics.yml) with each generated ``command:`` block
    written anew from :func:`compose_commands`."""
    commands = compose_commands(prometheus)

    def block(m: re.Match[str]) -> str:
        ind, service = m.group("indent"), m.group("service")
        head = f"{ind}# BEGIN GENERATED {service} command (`make docs`; do not edit)"
        # JSON strings are YAML double-quoted scalars: no flag is read as YAML syntax.
        return "\n".join([head, f"{ind}command:", *(f"{ind}  - {json.dumps(a)}" for a in commands[service]),
                          f"{ind}# END GENERATED", ""])

    rendered, n = _GENERATED.subn(block, text)
    if {m.group("service") for m in _GENERATED.finditer(text)} != set(commands) or n != len(commands):
        raise ValueError(f"{COMPOSE_OVERRIDE.name}: one generated command block for each of "
                         f"{', '.join(sorted(commands))}")
    return rendered


def render_scrape_config(source: str) -> str:
    """vmagent's scrape config file for the Prometheus config named ``source`` (in prometheus/)."""
    config = scrape_config(yaml.safe_load((CONFIG_DIR / source).read_text(encoding="utf-8")))
    head = (f"# vmagent's scrape config under docker-compose.victoriametrics.yml: {source}'s scrape\n"
            f"# configs and interval. Generated by `make docs` (grpo_monitor/tools/victoriametrics.py);\n"
            f"# edit {source}, not this file. Mounted as /etc/vmagent/{source}.\n")
    return head + yaml.safe_dump(config, sort_keys=False)


# The hand-written file whose parts `make docs` rewrites in place (as every --write module of the
# docs target: TARGET and render(text)); the scrape configs are whole generated files beside it.
TARGET = COMPOSE_OVERRIDE


def render(text: str) -> str:
    """``text`` (docker-compose.victoriametrics.yml) with its generated blocks written anew from
    the committed prometheus/prometheus.yml."""
    return render_compose(text, yaml.safe_load((CONFIG_DIR / "prometheus.yml").read_text(encoding="utf-8")))


def generated() -> dict[Path, str]:
    """Every file this module generates, with the text it should hold."""
    out = {CONFIG_DIR / name: render_scrape_config(source) for name, source in SCRAPE_CONFIGS.items()}
    out[TARGET] = render(TARGET.read_text(encoding="utf-8"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="vmagent's scrape configs and the VictoriaMetrics services' flags for Compose, "
                    "from prometheus/prometheus.yml and prometheus-fleet.yml.")
    parser.add_argument("--write", action="store_true",
                        help="rewrite the files that changed in place (else print them all)")
    args = parser.parse_args(argv)
    for path, text in generated().items():
        if not args.write:
            sys.stdout.write(f"--- {path.relative_to(REPO)}\n{text}")
        elif not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

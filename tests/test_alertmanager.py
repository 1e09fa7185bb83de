"""prometheus/alertmanager.yml: valid for Alertmanager 0.25 (amtool), routes and inhibit rules.

amtool answers where an alert goes; the timings per card are read from the YAML, since amtool
prints no route timings. The inhibit rules are proven on a real Alertmanager in
test_alerting_e2e.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from prometheus_harness import ALERTMANAGER_YML, REPO, find_binary
from promtool_harness import alerts

from grpo_monitor.runtime.config import parse_duration

RED = {"alertname": "GRPONonFiniteValues", "severity": "critical", "card": "red", "run": "exp-42",
       "rank": "0", "key": "loss"}
YELLOW = {"alertname": "GRPOKLTailOutliers", "severity": "warning", "card": "yellow",
          "run": "exp-42", "rank": "3"}


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_binary("amtool"), *args], capture_output=True, text=True,
                          timeout=30)


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return yaml.safe_load(ALERTMANAGER_YML.read_text())


def _route(config: dict[str, Any], severity: str) -> dict[str, Any]:
    routes = [r for r in config["route"].get("routes", [])
              if f'severity="{severity}"' in r.get("matchers", [])]
    assert len(routes) == 1, f"expected one route for severity={severity}: {routes}"
    return routes[0]


def test_check_config() -> None:
    # amtool does not open credentials_file, so the committed path needs no token file here.
    res = amtool("check-config", str(ALERTMANAGER_YML))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout
    assert "2 inhibit rules" in res.stdout


def test_example_receivers_are_valid_when_uncommented(tmp_path: Path) -> None:
    text = ALERTMANAGER_YML.read_text()
    head, rest = text.split("  # BEGIN EXAMPLE RECEIVERS\n")
    block, tail = rest.split("  # END EXAMPLE RECEIVERS\n")
    lines = block.splitlines()
    assert lines and all(line.startswith("  # ") for line in lines), block
    uncommented = "\n".join("  " + line[len("  # "):] for line in lines) + "\n"
    path = tmp_path / "alertmanager.yml"
    path.write_text(head + uncommented + tail)
    res = amtool("check-config", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
    names = {r["name"] for r in yaml.safe_load(path.read_text())["receivers"]}
    assert names == {"grpo-webhook", "grpo-email", "grpo-slack"}


def _routes_test(labels: dict[str, str]) -> str:
    res = amtool("config", "routes", "test", f"--config.file={ALERTMANAGER_YML}",
                 "--verify.receivers=grpo-webhook", "--tree",
                 *(f"{k}={v}" for k, v in labels.items()))
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def _matched_leaf(tree: str) -> str:
    """The last route of amtool's "Matching routes" tree (the one that took the alert)."""
    section = tree.split("Matching routes:", 1)[1]
    nodes = [m.group(1).strip() for m in re.finditer(r"── (.*)", section)]
    assert nodes, tree
    return nodes[-1]


@pytest.mark.parametrize(("labels", "leaf"), [
    (RED, '{severity="critical"}  receiver: grpo-webhook'),
    (YELLOW, '{severity="warning"}  receiver: grpo-webhook'),
    # No severity (say, a future GPU alert): the default route still delivers it.
    ({"alertname": "NodeGPUXidError", "instance": "gpu-3"},
     "default-route  receiver: grpo-webhook"),
])
def test_routes(labels: dict[str, str], leaf: str) -> None:
    assert _matched_leaf(_routes_test(labels)) == leaf


def test_route_tree_shape() -> None:
    res = amtool("config", "routes", "show", f"--config.file={ALERTMANAGER_YML}")
    assert res.returncode == 0, res.stdout + res.stderr
    nodes = [m.group(1).strip() for m in re.finditer(r"── (.*)", res.stdout)]
    assert nodes == ["default-route  receiver: grpo-webhook",
                     '{severity="critical"}  receiver: grpo-webhook',
                     '{severity="warning"}  receiver: grpo-webhook'], res.stdout


def test_red_route_timing(config: dict[str, Any]) -> None:
    red = _route(config, "critical")
    assert red["receiver"] == "grpo-webhook"
    assert red["group_by"] == ["alertname", "run"]
    assert parse_duration(red["group_wait"]) == 5
    assert parse_duration(red["group_interval"]) == 60
    assert parse_duration(red["repeat_interval"]) == 3600
    assert not red.get("continue", False)


def test_yellow_route_timing(config: dict[str, Any]) -> None:
    yellow = _route(config, "warning")
    assert yellow["receiver"] == "grpo-webhook"
    assert yellow["group_by"] == ["run"]
    assert parse_duration(yellow["group_wait"]) == 60
    assert parse_duration(yellow["group_interval"]) == 300
    assert parse_duration(yellow["repeat_interval"]) == 4 * 3600


def test_default_receiver_and_webhook(config: dict[str, Any]) -> None:
    assert config["route"]["receiver"] == "grpo-webhook"
    (receiver,) = [r for r in config["receivers"] if r["name"] == "grpo-webhook"]
    (hook,) = receiver["webhook_configs"]
    assert hook["url"] == "http://exporter:9400/-/alertmanager/webhook"
    assert hook["send_resolved"] is True
    auth = hook["http_config"]["authorization"]
    assert auth.get("type", "Bearer") == "Bearer"
    assert auth["credentials_file"] == "/etc/alertmanager/secrets/webhook-token"
    assert "credentials" not in auth  # the token never sits in the config


def test_inhibit_rules(config: dict[str, Any]) -> None:
    rules = [(r["source_matchers"], r["target_matchers"], r["equal"])
             for r in config["inhibit_rules"]]
    assert (['severity="critical"'], ['severity="warning"'], ["run"]) in rules
    assert (['alertname="GRPORewardHackingSuspected"'], ['alertname="GRPOResponseLengthShift"'],
            ["run"]) in rules


def test_alert_names_in_config_exist_in_rules(config: dict[str, Any]) -> None:
    defined = {r["alert"] for r in alerts()}
    named = set()
    for rule in config["inhibit_rules"]:
        for m in rule["source_matchers"] + rule["target_matchers"]:
            named.update(re.findall(r'alertname="(\w+)"', m))
    for name in named:
        assert name in defined, name


def test_token_example_exists_and_real_token_is_ignored() -> None:
    assert (REPO / "prometheus" / "secrets" / "webhook-token.example").is_file()
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "prometheus/secrets/webhook-token" in ignored

"""The Prometheus rule files: promtool accepts them, their unit tests pass, and every card keeps
the contract of the alert catalog (names, severity/card, annotations, runbook section)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from promtool_harness import RULE_FILES, alerts, rules

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "prometheus"
RULES = PROM / "rules"
ALERTS_YML = RULES / "grpo-alerts.yml"
CLUSTER_YML = RULES / "grpo-cluster.yml"
# The training cards speak of a run's step; hardware and exporter alerts have none.
STEP_FREE = {r["alert"] for r in alerts(CLUSTER_YML.name)} - {"GRPORankStraggler"}
TEST_FILES = sorted((PROM / "tests").glob("*.test.yml"))
RUNBOOK = ROOT / "docs" / "runbook.md"

# The alert catalog: the first cards, whose names and colours are a public contract (users'
# routes, silences and dashboards name them; docs/signals.md#the-cards): name -> card.
CATALOG = {
    "GRPONonFiniteValues": "red",
    "GRPOKLExplosion": "red",
    "GRPOEntropyCollapse": "red",
    "GRPORankStalled": "red",
    "GRPOEntropyExplosion": "red",
    "GRPORewardCollapse": "red",
    "GRPOCompletionsTruncated": "yellow",
    "GRPORunHung": "red",
    "GRPOKLGrowthAccelerating": "yellow",
    "GRPOKLTailOutliers": "yellow",
    "GRPORewardHackingSuspected": "yellow",
    "GRPOResponseLengthShift": "yellow",
    "GRPORewardStdRising": "yellow",
    "GRPORewardQuantileExtreme": "yellow",
    "GRPOAdvantageVanishing": "yellow",
    "GRPOGroupDominated": "yellow",
    "GRPOGradNormSpike": "yellow",
    "GRPOStepTimeDrift": "yellow",
    "GRPOThroughputDrop": "yellow",
}
# Beyond the catalog: cards over the signals newer RL stacks log (rollout vs trainer, async
# staleness, dead groups by cause, prompt types, the entropy mechanism, the entropy-reward law,
# length by correctness). Each judges an absolute level or the initial value: real runs are often
# too short for a baseline, so none may wait for one.
FROM_FIRST_STEPS = {
    "GRPORolloutMismatch": "yellow",
    "GRPORolloutMismatchRising": "yellow",
    "GRPOStaleRollouts": "yellow",
    "GRPOPromptsTooHard": "yellow",
    "GRPOPromptsTooEasy": "yellow",
    "GRPOShortcutLearning": "yellow",
    "GRPOEntropyCovarianceSurge": "yellow",
    "GRPORewardCeilingNear": "yellow",
    "GRPOLengthBias": "yellow",
}
CARD_OF_SEVERITY = {"critical": "red", "warning": "yellow"}


def promtool() -> str:
    path = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if path is None:
        pytest.fail("promtool not on PATH: install Debian's prometheus package (make system-deps)")
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    # A hang guard, not a speed test: all the rule tests take ~70 s on two idle cores.
    return subprocess.run([promtool(), *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


ALERTS = alerts()
ALERT_IDS = [r["alert"] for r in ALERTS]


# -- promtool -------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(path: Path) -> None:
    res = run_promtool("check", "rules", str(path))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "SUCCESS" in out, out


def test_every_rule_file_is_a_yml() -> None:
    """RULE_FILES is prometheus/rules/*.yml: a rule file spelled otherwise would go untested."""
    others = sorted(p.name for p in RULES.iterdir() if p.suffix != ".yml")
    assert not others, f"rule files must end in .yml: {others}"
    assert {p.name for p in RULE_FILES} >= {"grpo-thresholds.yml", "grpo-signals.yml",
                                            "grpo-alerts.yml", "grpo-cluster.yml"}


def test_promtool_check_config() -> None:
    """prometheus.yml is valid and the rule files it lists load (promtool checks them too)."""
    res = run_promtool("check", "config", str(PROM / "prometheus.yml"))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for path in RULE_FILES:
        assert path.name in out, f"prometheus.yml does not load {path.name}:\n{out}"


def test_promtool_test_rules() -> None:
    assert TEST_FILES, "no prometheus/tests/*.test.yml"
    res = run_promtool("test", "rules", *map(str, TEST_FILES))
    assert res.returncode == 0, res.stdout + res.stderr


# -- the cards' contract -----------------------------------------------------------------------

def test_catalog_alerts_all_exist() -> None:
    # (Two rules may share an alert name, e.g. one per branch, each with its own description.)
    names = set(ALERT_IDS)
    missing = sorted(set(CATALOG) - names)
    assert not missing, f"catalog alerts missing from grpo-alerts.yml: {missing}"


def test_first_step_cards_exist_and_need_no_baseline() -> None:
    missing = sorted(set(FROM_FIRST_STEPS) - set(ALERT_IDS))
    assert not missing, f"cards missing from grpo-alerts.yml: {missing}"
    for rule in ALERTS:
        if rule["alert"] in FROM_FIRST_STEPS:
            assert rule["labels"]["card"] == FROM_FIRST_STEPS[rule["alert"]], rule["alert"]
            assert "grpo_baseline" not in rule["expr"], f"{rule['alert']} must not wait for the baseline"


def test_rollout_mismatch_has_one_rule_per_reason() -> None:
    """Stacks log different mismatch signals; each rule says in its reason which one it saw."""
    reasons = sorted(r["labels"].get("reason") for r in ALERTS if r["alert"] == "GRPORolloutMismatch")
    assert reasons == ["chi2_token", "ess", "is_weight", "kl"]


@pytest.mark.parametrize("rule", ALERTS, ids=ALERT_IDS)
def test_alert_contract(rule: dict[str, Any]) -> None:
    name = rule["alert"]
    assert re.fullmatch(r"GRPO(?:[A-Z][a-z0-9]*)+", name), f"{name}: not GRPO + CamelCase"

    labels = rule.get("labels") or {}
    severity = labels.get("severity")
    assert severity in CARD_OF_SEVERITY, f"{name}: severity {severity!r}"
    assert labels.get("card") == CARD_OF_SEVERITY[severity], f"{name}: card {labels.get('card')!r} for {severity}"
    if name in CATALOG:
        assert labels["card"] == CATALOG[name], f"{name}: the catalog says a {CATALOG[name]} card"

    ann = rule.get("annotations") or {}
    assert ann.get("summary"), f"{name}: no summary"
    assert "{{" not in ann["summary"], f"{name}: the summary must be static (it groups notifications)"
    assert "{{ $value" in ann.get("description", ""), f"{name}: the description must show the value"
    if name not in STEP_FREE:
        assert "grpo_step" in ann["description"] or "grpo_rank_info" in ann["description"], (
            f"{name}: the description must show the step (or the rank's node)")
    url = ann.get("runbook_url", "")
    # The link's form and its section: tests/test_runbook.py.
    assert url.endswith("#" + name.lower()), f"{name}: runbook_url {url!r}"


def test_every_threshold_is_used() -> None:
    thresholds = [r["record"] for r in rules("grpo-thresholds.yml")]
    assert all(t.startswith("grpo:threshold:") for t in thresholds), thresholds
    used = "".join(path.read_text() for path in RULE_FILES if path.name != "grpo-thresholds.yml")
    unused = [t for t in thresholds if not re.search(re.escape(t) + r"\b", used)]
    assert not unused, f"thresholds no rule reads: {unused}"


def test_runbook_has_a_section_per_alert() -> None:
    assert RUNBOOK.exists(), "docs/runbook.md is missing (every runbook_url points into it)"
    text = RUNBOOK.read_text()
    missing = [n for n in ALERT_IDS if not re.search(rf"^## {re.escape(n)}\s*$", text, re.MULTILINE)]
    assert not missing, f"docs/runbook.md lacks a '## <AlertName>' section for: {missing}"


# -- the unit tests cover every card -----------------------------------------------------------

def test_unit_tests_cover_every_alert() -> None:
    """Each alert is proven to fire (non-empty exp_alerts) and to stay quiet (empty exp_alerts)."""
    fires: set[str] = set()
    quiet: set[str] = set()
    tested: set[str] = set()
    for path in TEST_FILES:
        doc = load(path)
        loaded = {(path.parent / f).resolve() for f in doc.get("rule_files", [])}
        assert {p.resolve() for p in RULE_FILES} <= loaded, f"{path.name} must load all the rule files"
        for group in doc.get("tests", []):
            for series in group.get("input_series", []):
                assert not series["series"].startswith("grpo:threshold:"), (
                    f"{path.name}: thresholds come from the rules, not from input series")
            for case in group.get("alert_rule_test", []) or []:
                name = case["alertname"]
                tested.add(name)
                (fires if case.get("exp_alerts") else quiet).add(name)
    unknown = sorted(tested - set(ALERT_IDS))
    assert not unknown, f"tests name alerts the rules do not have (an empty exp_alerts passes vacuously): {unknown}"
    assert not sorted(set(ALERT_IDS) - fires), f"no firing case for: {sorted(set(ALERT_IDS) - fires)}"
    assert not sorted(set(ALERT_IDS) - quiet), f"no quiet case for: {sorted(set(ALERT_IDS) - quiet)}"


def test_unit_tests_prove_the_forecast_records() -> None:
    """Every forecast recording rule's value is checked by a promql_expr_test."""
    records = [r["record"] for r in rules("grpo-signals.yml")
               if "record" in r and ":grpo_forecast_" in r["record"]]
    assert records, "grpo-signals.yml records no forecast"
    exprs = " ".join(case["expr"] for path in TEST_FILES for group in load(path).get("tests", [])
                     for case in group.get("promql_expr_test", []) or [])
    unproven = [r for r in records if r not in exprs]
    assert not unproven, f"no promql_expr_test reads: {unproven}"


# -- recording rules that read only the keys their readers ask for ------------------------------

_MATCHER = re.compile(r'key(=~|=|!~|!=)"([^"]*)"')


def _admits(selector: str) -> set[str]:
    """The canonical keys a selector's key matchers admit (all of them with none)."""
    from grpo_monitor.contract.keys import SIGNALS

    keys = {s.key for s in SIGNALS}
    for op, pattern in _MATCHER.findall(selector):
        rx = re.compile(pattern)
        match = {"=": lambda k: k == pattern, "!=": lambda k: k != pattern,
                 "=~": lambda k: rx.fullmatch(k) is not None, "!~": lambda k: rx.fullmatch(k) is None}[op]
        keys = {k for k in keys if match(k)}
    return keys


@pytest.mark.parametrize("record", ["run_rank_key:grpo_window_mean:ratio_baseline",
                                    "run_rank_key:grpo_window_mean:ratio_200steps",
                                    "run_rank_key:grpo_window_mean:delta_200steps"])
def test_a_recording_rule_limited_to_some_keys_has_every_key_its_readers_ask_for(record: str) -> None:
    """These rules read only the keys something reads them for (every rank's perf/* keys would
    cost the most and feed nothing); each card, dashboard panel and runbook query that reads
    one names keys the rule computes, so a narrower rule cannot silently starve any of them."""
    (rule,) = [r for r in rules() if r.get("record") == record]
    inputs = [m.group(0) for m in re.finditer(r"\w+\{[^}]*\}", rule["expr"])]
    computed = set.intersection(*(_admits(sel) for sel in inputs))
    assert computed, rule["expr"]
    texts = [r["expr"] for r in rules() if "alert" in r or r.get("record") != record]
    texts += [p.read_text() for p in (ROOT / "grafana").rglob("*.json")]
    readers = [m.group(1).replace('\\"', '"') for text in texts
               for m in re.finditer(re.escape(record) + r"(\{[^}]*\}|(?![\w{]))", text)]
    # The queries a runbook section runs (its prose names the rule bare).
    readers += re.findall(re.escape(record) + r"(\{[^}]*\})", (ROOT / "docs" / "runbook.md").read_text())
    assert readers, f"nothing reads {record}"
    for selector in readers:
        if any("$" in pattern for _, pattern in _MATCHER.findall(selector)):
            continue  # a dashboard variable picks the key: its values are not known here
        asked = _admits(selector)
        assert asked <= computed, f"{record}{selector} asks for {sorted(asked - computed)}, which the rule does not compute"

"""One source of thresholds: the table in grpo_monitor.thresholds writes the rule file, matches
every threshold the rules record or read, and is what the report compares with."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_monitor import thresholds as th
from grpo_monitor.thresholds import THRESHOLDS, Threshold

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "prometheus" / "rules"
COMMITTED = ROOT / th.RULE_FILE
SERIES = re.compile(r"grpo:threshold:([A-Za-z0-9_]+)")
VECTOR = re.compile(r"\s*vector\(\s*([^()\s]+)\s*\)\s*")


def _rules(path: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text()) or {}
    return [r for g in doc.get("groups") or [] for r in g.get("rules") or []]


def _rule_files() -> list[Path]:
    files = sorted(RULES.glob("*.yml")) + sorted(RULES.glob("*.yaml"))
    assert COMMITTED in files, files
    return files


def recorded() -> dict[str, tuple[str, float]]:
    """Every ``grpo:threshold:*`` record in every rule file: name -> (file, value)."""
    out: dict[str, tuple[str, float]] = {}
    for path in _rule_files():
        for rule in _rules(path):
            m = SERIES.fullmatch(str(rule.get("record", "")))
            if not m:
                continue
            assert m.group(1) not in out, f"{m.group(1)} recorded twice ({out[m.group(1)][0]}, {path.name})"
            v = VECTOR.fullmatch(str(rule["expr"]))
            assert v, f"{path.name}: {rule['record']} is not a constant: {rule['expr']!r}"
            out[m.group(1)] = (path.name, float(v.group(1)))
    return out


def read_by_rules() -> dict[str, set[str]]:
    """Every ``grpo:threshold:*`` an expression reads: name -> the rules (record/alert) reading it."""
    out: dict[str, set[str]] = {}
    for path in _rule_files():
        for rule in _rules(path):
            for name in SERIES.findall(str(rule.get("expr", ""))):
                out.setdefault(name, set()).add(f"{path.name}:{rule.get('alert') or rule.get('record')}")
    return out


def test_committed_rule_file_is_generated() -> None:
    committed = COMMITTED.read_text()
    assert committed == th.render(), f"{th.RULE_FILE} is stale: run `make docs`"


def test_rule_files_and_table_agree() -> None:
    table = {t.name: t for t in th.TABLE if t.in_rules}
    rec = recorded()
    # Each card threshold is recorded, in the generated file, with the table's value ...
    missing = sorted(set(table) - set(rec))
    assert not missing, f"table entries no rule file records: {missing}"
    for name, (fname, v) in rec.items():
        assert name in THRESHOLDS, f"{fname} records grpo:threshold:{name}, which the table lacks"
        t = THRESHOLDS[name]
        assert t.in_rules, f"{fname} records {name}, a {t.group!r} entry: move it to a card group"
        assert fname == COMMITTED.name, f"{name} is recorded in {fname}, not in the generated file"
        assert v == t.value, f"{name}: {v} in {fname}, {t.value} in the table"
    # ... and every threshold an expression reads is a card threshold of the table.
    for name, users in read_by_rules().items():
        assert name in table, f"{sorted(users)} read grpo:threshold:{name}, not a card threshold of the table"


def test_agreement_check_catches_a_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    # The check above compares values, not just names: a table edit without `make docs` fails.
    old = THRESHOLDS["throughput_drop_ratio"]
    patched = old.value / 2
    monkeypatch.setitem(THRESHOLDS, old.name, replace(old, value=patched))
    with pytest.raises(AssertionError, match=re.escape(
            f"{old.name}: {float(old.value)} in grpo-thresholds.yml, {patched} in the table")):
        test_rule_files_and_table_agree()
    monkeypatch.setattr(th, "TABLE", tuple(replace(t, value=patched) if t.name == old.name else t
                                           for t in th.TABLE))
    with pytest.raises(AssertionError, match="stale"):
        test_committed_rule_file_is_generated()


def test_table_entries_are_well_formed() -> None:
    assert len(THRESHOLDS) == len(th.TABLE)
    for t in th.TABLE:
        assert t.group in ("red", "yellow", "cluster", "report"), t
        assert isinstance(t.value, (int, float)) and not isinstance(t.value, bool), t
        words = " ".join(t.why.split())
        assert len(words) >= 40, f"{t.name}: the why is a sentence or more"
        assert "seed" not in words.lower() and "§" not in words, f"{t.name}: say the rule, not a citation"
        if re.search(r"_(steps|windows|ranks)$", t.name):
            assert th.count(t.name) == t.value, t.name
    with pytest.raises(ValueError, match="twice"):
        th._index((*th.TABLE, th.TABLE[0]))
    with pytest.raises(ValueError, match="not a whole number"):
        th.count("kl_tail_baseline_ratio")


def test_a_new_threshold_is_one_entry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An entry added to the table comes out as a commented record promtool accepts; a report
    entry stays out of the rule file."""
    new = Threshold("example_spike_ratio", 2.5e-3, "yellow", """
        An example rule whose comment is long enough to wrap over more than one line of the
        generated file, with a colon: and a # that must stay inside the comment.""")
    extra = Threshold("example_report_steps", 7, "report", "Only the report reads this one.")
    monkeypatch.setattr(th, "TABLE", (*th.TABLE, new, extra))
    text = th.render()
    rules = {r["record"]: r["expr"] for r in yaml.safe_load(text)["groups"][0]["rules"]}
    assert rules["grpo:threshold:example_spike_ratio"] == "vector(0.0025)"
    assert "example_report_steps" not in text
    block = text.split("# -- yellow cards")[1].split("# -- cluster")[0]
    comment = block.split("# An example rule")[1].split("- record: grpo:threshold:example_spike_ratio")[0]
    assert comment.count("\n      # ") >= 1 and "must stay inside the comment." in comment
    assert max(map(len, text.splitlines())) <= 100
    promtool = shutil.which("promtool")
    assert promtool, "promtool not on PATH: install Debian's prometheus package (make system-deps)"
    path = tmp_path / "grpo-thresholds.yml"
    path.write_text(text)
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(rules)} rules found" in res.stdout + res.stderr


@pytest.mark.parametrize("v, text", [(10, "10"), (0.1, "0.1"), (1.5, "1.5"), (85, "85"), (1e-12, "1e-12")])
def test_promql_numbers_read_back_exactly(v: float, text: str) -> None:
    assert th.promql_number(v) == text
    assert float(text) == v


# -- the report reads the table -------------------------------------------------------------------

def test_report_keeps_no_numbers_of_its_own() -> None:
    """report.py defines no module-level numeric constant: its thresholds come from the table."""
    from grpo_monitor import report

    tree = ast.parse(Path(report.__file__).read_text())

    def numeric(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
        if isinstance(node, ast.UnaryOp):
            return numeric(node.operand)
        if isinstance(node, (ast.Tuple, ast.List)):
            return any(numeric(e) for e in node.elts)
        return False

    own = [ast.unparse(n) for n in tree.body
           if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None and numeric(n.value)]
    assert not own, f"report.py keeps its own numbers; put them in grpo_monitor.thresholds: {own}"


_RUNS: dict[str, Any] = {}


def _run(scenario: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from grpo_monitor import report
    from grpo_monitor.simulate import write_run

    if scenario not in _RUNS:
        root = tmp_path_factory.mktemp(scenario)
        write_run(root, scenario, scenario)
        _RUNS[scenario] = report.load_run(root / scenario)
    return _RUNS[scenario]


# (scenario, threshold, patched value, the verdict that appears or disappears with the patch)
REPORT_READS = [
    ("throughput_drop", "throughput_drop_ratio", 0.5, "throughput_drop"),
    # The old copy in report.py said 0.2: a straggler's 23% lower samples/s read as a drop.
    ("straggler", "throughput_drop_ratio", 0.2, "throughput_drop"),
    ("straggler", "straggler_ratio", 0.4, "rank_straggler"),
    ("step_time_drift", "step_time_drift_ratio", 0.5, "step_time_drift"),
    ("kl_explosion", "kl_explosion_ratio", 1e6, "kl_explosion"),
    ("entropy_collapse", "entropy_collapse_ratio", 1e-6, "entropy_collapse"),
    ("grad_norm_spike", "grad_norm_spike_ratio", 100, "grad_norm_spike"),
    ("grad_norm_spike", "sustain_steps", 1000, "grad_norm_spike"),
    ("reward_up_accuracy_flat", "reward_rise", 10, "reward_hacking"),
    ("entropy_explosion", "entropy_explosion_ratio", 1e6, "entropy_explosion"),
    ("entropy_explosion", "truncated_ratio", 1.0, "completions_truncated"),
    ("reward_collapse", "reward_collapse_spread_ratio", 1e6, "reward_collapse"),
    ("early_length_collapse", "length_shift_ratio", 10, "length_shift"),
    # Windows longer than the run: the early cards never see one.
    ("early_entropy_collapse", "early_window_steps", 1000, "entropy_collapse"),
    ("kl_growth", "kl_growth_ratio", 10, "kl_growth_accelerating"),
]


@pytest.mark.parametrize("scenario, name, patched, verdict", REPORT_READS,
                         ids=[f"{c[0]}-{c[1]}" for c in REPORT_READS])
def test_report_follows_the_table(scenario: str, name: str, patched: float, verdict: str,
                                  monkeypatch: pytest.MonkeyPatch,
                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    from grpo_monitor import report

    data = _run(scenario, tmp_path_factory)
    before = {v["id"] for v in report.diagnose(data)}
    monkeypatch.setitem(THRESHOLDS, name, replace(THRESHOLDS[name], value=patched))
    after = {v["id"] for v in report.diagnose(data)}
    assert (verdict in before) != (verdict in after), (name, before, after)

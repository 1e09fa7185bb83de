"""One source of thresholds: the table in grpo_monitor.contract.thresholds writes the rule file, matches
every threshold the rules record or read, and is what the report compares with.

A threshold's number lives in its table entry alone. The alert expressions and the dashboards'
lines read its ``grpo:threshold:*`` series, the alert descriptions quote that series, and the
report calls ``th.value``; every other text (summaries, comments, panel titles, descriptions and
legends, docs/dashboards.md, docs/metrics.md) names a threshold or says what it means, never its
value, so that one edit of the table and ``make docs`` move everything. The window lengths the
rules select are the exporter's (grpo_monitor.runtime.signals' menus), and the prose around them names
only windows its expression reads.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from promtool_harness import RULE_FILES, rules

from grpo_monitor.runtime import forecast, signals

from grpo_monitor.contract import thresholds as th
from grpo_monitor.contract.thresholds import THRESHOLDS, Threshold
from grpo_monitor.runtime.store import INTERVAL_STEPS, Limits
from grpo_monitor.tools import metrics_doc

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / th.RULE_FILE
DASHBOARDS = ROOT / "grafana" / "dashboards"
DASHBOARDS_MD = ROOT / "docs" / "dashboards.md"
MAKEFILE = ROOT / "Makefile"
SERIES = re.compile(r"grpo:threshold:([A-Za-z0-9_]+)")
VECTOR = re.compile(r"\s*vector\(\s*([^()\s]+)\s*\)\s*")


def _rule_files() -> list[Path]:
    assert COMMITTED in RULE_FILES, RULE_FILES
    return RULE_FILES


def recorded() -> dict[str, tuple[str, float]]:
    """Every ``grpo:threshold:*`` record in every rule file: name -> (file, value)."""
    out: dict[str, tuple[str, float]] = {}
    for path in _rule_files():
        for rule in rules(path.name):
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
        for rule in rules(path.name):
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
    records = {r["record"]: r["expr"] for r in yaml.safe_load(text)["groups"][0]["rules"]}
    assert records["grpo:threshold:example_spike_ratio"] == "vector(0.0025)"
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
    assert f"{len(records)} rules found" in res.stdout + res.stderr


@pytest.mark.parametrize("v, text", [(10, "10"), (0.1, "0.1"), (1.5, "1.5"), (85, "85"), (1e-12, "1e-12")])
def test_promql_numbers_read_back_exactly(v: float, text: str) -> None:
    assert th.promql_number(v) == text
    assert float(text) == v


# -- the report reads the table -------------------------------------------------------------------

def report_sources() -> dict[str, str]:
    """The report's modules, a single report.py or a report/ package: path -> source."""
    report = importlib.import_module("grpo_monitor.tools.report")
    main = Path(report.__file__)
    files = sorted(main.parent.rglob("*.py")) if main.name == "__init__.py" else [main]
    return {str(f.relative_to(ROOT)): f.read_text() for f in files}


def test_report_keeps_no_numbers_of_its_own() -> None:
    """No report module defines a module-level numeric constant: its thresholds come from the
    table."""

    def numeric(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
        if isinstance(node, ast.UnaryOp):
            return numeric(node.operand)
        if isinstance(node, (ast.Tuple, ast.List)):
            return any(numeric(e) for e in node.elts)
        return False

    sources = report_sources()
    assert sources
    for path, source in sources.items():
        own = [ast.unparse(n) for n in ast.parse(source).body
               if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None
               and numeric(n.value)]
        assert not own, f"{path} keeps its own numbers; put them in grpo_monitor.contract.thresholds: {own}"


def test_report_reads_the_table_by_name() -> None:
    """Every name the report passes to th.value / th.count is an entry of the table (a typo
    would raise only on the verdict that reads it), and every entry of the report group is read
    by the report or the card declarations it judges: the table holds no number nobody uses."""
    text = "\n".join(report_sources().values())
    read = set(re.findall(r"\bth\.(?:value|count)\(\s*[\"']([a-z0-9_]+)[\"']", text))
    assert read, "the report reads no threshold through th.value / th.count"
    unknown = sorted(read - set(THRESHOLDS))
    assert not unknown, f"the report reads names the table lacks: {unknown}"
    # The card declarations the report judges (contract/cards.py) read window lengths too.
    judged = text + (ROOT / "exporter" / "grpo_monitor" / "contract" / "cards.py").read_text()
    unread = [t.name for t in th.TABLE if t.group == "report" and not re.search(rf"\b{t.name}\b", judged)]
    assert not unread, f"report entries neither the report nor its declarations read: {unread}"


_RUNS: dict[str, Any] = {}


def _run(scenario: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from grpo_monitor.tools import report
    from grpo_monitor.tools.simulate import write_run

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
    ("reward_up_accuracy_flat", "hacking_reward_sigmas", 1e6, "reward_hacking"),
    ("entropy_explosion", "entropy_explosion_ratio", 1e6, "entropy_explosion"),
    ("entropy_explosion", "truncated_ratio", 1.0, "completions_truncated"),
    ("reward_collapse", "reward_collapse_spread_ratio", 1e6, "reward_collapse"),
    ("early_length_collapse", "length_shift_ratio", 10, "length_shift"),
    ("kl_growth", "kl_growth_ratio", 10, "kl_growth_accelerating"),
    ("early_kl_explosion", "kl_early_level", 1e6, "kl_explosion"),
    ("entropy_rebound", "entropy_rebound_ratio", 1e6, "entropy_explosion"),
    ("entropy_rebound", "entropy_rebound_floor_ratio", 0.0, "entropy_explosion"),
    ("entropy_rebound", "entropy_rebound_warn_ratio", 1e6, "entropy_rebound"),
    # The late blow-up's reward holds (no trend path): its signals alone judge it.
    ("blow_up_late", "blowup_min_signals", 6, "training_blow_up"),
    ("blow_up_late", "blowup_length_ratio", 10, "training_blow_up"),
]


@pytest.mark.parametrize("scenario, name, patched, verdict", REPORT_READS,
                         ids=[f"{c[0]}-{c[1]}" for c in REPORT_READS])
def test_report_follows_the_table(scenario: str, name: str, patched: float, verdict: str,
                                  monkeypatch: pytest.MonkeyPatch,
                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    from grpo_monitor.tools import report

    data = _run(scenario, tmp_path_factory)
    before = {v["id"] for v in report.diagnose(data)}
    monkeypatch.setitem(THRESHOLDS, name, replace(THRESHOLDS[name], value=patched))
    after = {v["id"] for v in report.diagnose(data)}
    assert (verdict in before) != (verdict in after), (name, before, after)


# -- what the rules and the dashboards read -------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """One rule of a hand-written rule file, with the prose around it."""

    file: str
    name: str  # the alert's or the record's name
    is_alert: bool
    expr: str
    for_: str
    comment: str  # the comment lines right above it
    annotations: dict[str, str]


def _comment_blocks(text: str) -> list[str]:
    """The comment block right above each ``- alert:`` / ``- record:`` line, in file order."""
    blocks, pending = [], []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            pending.append(s.lstrip("#").strip())
        elif re.match(r"- (alert|record):", s):
            blocks.append(" ".join(pending))
            pending = []
        else:
            pending = []
    return blocks


def hand_written_rule_files() -> list[Path]:
    return [p for p in _rule_files() if p != COMMITTED]


def hand_written_rules() -> list[Rule]:
    out = []
    for path in hand_written_rule_files():
        in_file, blocks = rules(path.name), _comment_blocks(path.read_text())
        assert len(in_file) == len(blocks), path.name
        out += [Rule(path.name, str(r.get("alert") or r.get("record")), "alert" in r, str(r["expr"]),
                     str(r.get("for", "")), comment, dict(r.get("annotations") or {}))
                for r, comment in zip(in_file, blocks)]
    return out


RULE_LIST = hand_written_rules()
RECORDS = {r.name: r.expr for r in RULE_LIST if not r.is_alert}
ALERTS = [r for r in RULE_LIST if r.is_alert]

_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^{}]*)\}")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_NAME = re.compile(r"\b(?:grpo_[a-z0-9_]+|[a-z_]+:[a-z_0-9]+:[a-z_0-9]+)\b")


def selectors(expr: str) -> Iterator[tuple[str, dict[str, tuple[str, str]]]]:
    """(metric, {label: (operator, value)}) of every selector with matchers in ``expr``."""
    for m in _SELECTOR.finditer(expr):
        yield m.group(1), {k: (op, v) for k, op, v in _MATCHER.findall(m.group(2))}


def expanded(expr: str) -> str:
    """``expr`` and the expressions of the recording rules it reads, recursively."""
    out, seen, todo = [expr], set(), [expr]
    while todo:
        for name in _NAME.findall(todo.pop()):
            if name in RECORDS and name not in seen:
                seen.add(name)
                out.append(RECORDS[name])
                todo.append(RECORDS[name])
    return "\n".join(out)


def thresholds_read(expr: str) -> set[str]:
    return set(SERIES.findall(expanded(expr)))


# Features whose window is implicit in the family: the steps that stand behind their value.
IMPLICIT_WINDOWS: dict[str, int] = {
    "grpo_baseline_mean": Limits.baseline_steps,
    "grpo_baseline_stddev": Limits.baseline_steps,
    "grpo_baseline_ready": Limits.baseline_steps,
    "grpo_initial_mean": signals.INITIAL_STEPS,
    "grpo_prompt_type_initial_mean": signals.INITIAL_STEPS,
    "grpo_run_window_mean_max": signals.RANGE_WINDOW,
    "grpo_run_window_mean_min": signals.RANGE_WINDOW,
    "grpo_rising_windows": signals.RISING_WINDOW,
    "grpo_window_nonfinite": signals.NONFINITE_WINDOW,
    "grpo_run_log_interval_seconds": INTERVAL_STEPS,
    "grpo_forecast_fit_r_squared": forecast.BLOCK_STEPS,
    "grpo_forecast_law_scale": forecast.BLOCK_STEPS,
    "grpo_forecast_law_offset": forecast.BLOCK_STEPS,
    "grpo_forecast_reward_ceiling": forecast.BLOCK_STEPS,
}


def windows(expr: str) -> set[int]:
    """Every step count ``expr`` stands on: its selectors' window and offset (and their sum, the
    far end of a shifted window), the implicit windows of the families it reads, through the
    recording rules it reads."""
    full = expanded(expr)
    out = {IMPLICIT_WINDOWS[n] for n in _NAME.findall(full) if n in IMPLICIT_WINDOWS}
    for _, labels in selectors(full):
        w = int(labels["window_steps"][1]) if "window_steps" in labels else 0
        o = int(labels["offset_steps"][1]) if "offset_steps" in labels else 0
        out |= {w, o, w + o}
    # The growth ratios at every offset in a row span as many growth windows, and one more with
    # the window the oldest is compared with.
    if "grpo_window_growth_ratio" in full:
        span = signals.GROWTH_WINDOW * len(signals.GROWTH_OFFSETS)
        out |= {span, span + signals.GROWTH_WINDOW}
    return out - {0}


def durations(rule: Rule) -> set[int]:
    """The minutes a rule counts in wall time: its range selectors and its ``for:``."""
    found = (re.findall(r"\[(\d+)m\]", rule.expr) + re.findall(r"\boffset\s+(\d+)m\b", rule.expr)
             + re.findall(r"^(\d+)m$", rule.for_))
    return {int(n) for n in found}


# The exporter's menus (grpo_monitor.runtime.signals): the only windows a query may select.
MENUS: dict[str, set[tuple[int, int | None]]] = {
    "grpo_window_mean": {*signals.TRAINING_MEANS, *signals.PERF_MEANS},
    "grpo_window_p10": {(w, None) for w in signals.TRAINING_PERCENTILES},
    "grpo_window_p90": {(w, None) for w in signals.TRAINING_PERCENTILES},
    "grpo_window_min": {(w, None) for w in (*signals.TRAINING_EXTREMES, *signals.PERF_EXTREMES)},
    "grpo_window_max": {(w, None) for w in (*signals.TRAINING_EXTREMES, *signals.PERF_EXTREMES)},
    "grpo_window_growth_ratio": {(signals.GROWTH_WINDOW, o) for o in signals.GROWTH_OFFSETS},
    "grpo_window_slope": {(w, None) for w in signals.SLOPE_WINDOWS},
    "grpo_prompt_type_window_mean": set(signals.PROMPT_TYPE_MEANS),
}
MENU_WINDOWS: set[int] = {n for menu in MENUS.values() for w, o in menu for n in (w, o) if n} | \
    set(IMPLICIT_WINDOWS.values())


def dashboard_texts() -> Iterator[tuple[str, dict[str, Any], list[str]]]:
    """(where, panel, its texts) for each panel of each dashboard, and the dashboards' own."""
    for path in sorted(DASHBOARDS.glob("*.json")):
        d = json.loads(path.read_text())
        yield path.name, {}, [d.get("title", ""), d.get("description", "")]
        todo = list(d.get("panels", []))
        while todo:
            p = todo.pop(0)
            todo[0:0] = p.get("panels", [])
            texts = [p.get("title", ""), p.get("description", ""),
                     *(t.get("legendFormat", "") for t in p.get("targets", []))]
            yield f"{path.name}: {p.get('title')}", p, texts


def dashboard_queries() -> Iterator[tuple[str, str]]:
    for where, panel, _ in dashboard_texts():
        for t in panel.get("targets", []):
            yield f"{where} [{t.get('refId')}]", t.get("expr", "")


def test_rules_and_dashboards_select_the_exporters_windows() -> None:
    """A window a rule or a panel selects is one the exporter publishes (signals.py's menus),
    and a recording rule named after a step count (ratio_200steps) reads that window."""
    exprs = [(f"{r.file}: {r.name}", r.expr) for r in RULE_LIST] + list(dashboard_queries())
    checked = 0
    for where, expr in exprs:
        for metric, labels in selectors(expr):
            if metric not in MENUS or "window_steps" not in labels:
                continue
            w = int(labels["window_steps"][1])
            o = int(labels["offset_steps"][1]) if "offset_steps" in labels else None
            menu = MENUS[metric]
            assert (w, o) in menu or (o is None and any(w == mw for mw, _ in menu)), (
                f"{where}: {metric} window {w}@{o} is not in the exporter's menu {sorted(menu, key=str)}")
            checked += 1
    assert checked > 50
    for name, expr in RECORDS.items():
        for n in re.findall(r"_(\d+)steps\b", name):
            assert int(n) in windows(expr), f"{name} reads no {n}-step window: {expr}"


_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")


def literals(expr: str) -> set[float]:
    """The numbers of a PromQL expression outside label values, range selectors, offsets and
    names, less the median a quantile() asks for and a window the expression reads used as a
    factor (a slope per step times its window: the trend over the window)."""
    e = re.sub(r'"[^"]*"', '""', expr)
    e = re.sub(r"\[[^\]]*\]|\boffset\s+\w+", " ", e)
    e = re.sub(r"quantile\s*(?:by\s*\([^)]*\)\s*)?\(\s*0\.5\s*,", "quantile(", e)
    read = windows(expr)
    e = re.sub(r"\*\s*(\d+)(?![\w.])", lambda m: " " if int(m.group(1)) in read else m.group(0), e)
    e = re.sub(r"[A-Za-z_:][A-Za-z0-9_:]*", " ", e)
    return {float(n) for n in _NUMBER.findall(e)}


def test_rules_and_dashboards_carry_no_threshold_literal() -> None:
    """Outside the generated threshold file, an expression compares with a grpo:threshold:*
    series, never with a number of its own: its numbers are 0 and 1 (a sign, a ratio's 1, a
    flag), or a window it reads as a factor. A Grafana threshold step is the cards' count (1 or
    more firing), never a card's number."""
    for where, expr in [(f"{r.file}: {r.name}", r.expr) for r in RULE_LIST] + list(dashboard_queries()):
        own = literals(expr) - {0.0, 1.0}
        assert not own, f"{where} compares with literal {sorted(own)}: read a grpo:threshold:* series\n{expr}"

    def steps(node: Any) -> Iterator[Any]:
        if isinstance(node, dict):
            if isinstance(node.get("thresholds"), dict):
                yield from (s.get("value") for s in node["thresholds"].get("steps", []))
            for v in node.values():
                yield from steps(v)
        elif isinstance(node, list):
            for v in node:
                yield from steps(v)

    for path in sorted(DASHBOARDS.glob("*.json")):
        values = set(steps(json.loads(path.read_text())))
        assert values <= {None, 0, 1}, f"{path.name}: Grafana threshold steps {values}"


def test_threshold_lines_draw_the_cards_own_line() -> None:
    """A dashboard line over grpo:threshold:<name> multiplies the same feature the rules reading
    that threshold compare with (the initial value, the baseline, the same window), so that the
    line sits where the card fires."""
    checked = 0
    for where, expr in dashboard_queries():
        for name in set(SERIES.findall(expr)):
            readers = [r.expr for r in RULE_LIST if name in thresholds_read(r.expr)]
            assert readers, f"{where}: no rule reads grpo:threshold:{name}"
            theirs = [s for e in readers for s in selectors(expanded(e))]
            for metric, labels in selectors(expr):
                mine = {k: v for k, (_, v) in labels.items() if k in ("key", "window_steps", "offset_steps")}

                def matches(sel: tuple[str, dict[str, tuple[str, str]]]) -> bool:
                    m, ls = sel
                    return m == metric and all(
                        k not in ls or (re.fullmatch(ls[k][1], v) if ls[k][0] == "=~" else ls[k][1] == v)
                        for k, v in mine.items())

                assert any(matches(s) for s in theirs), (
                    f"{where}: the line over {name} reads {metric}{mine}, which no rule reading "
                    f"grpo:threshold:{name} compares with")
                checked += 1
    assert checked >= 10


# -- prose: thresholds by name, windows as the expressions read them -----------------------------

_NUM = r"[-+±]?\d+(?:\.\d+)?"
# The shapes a threshold takes in prose. A number in any of them is refused, whatever its value:
# a sentence that states today's value would not change with the table.
THRESHOLD_SHAPES: dict[str, re.Pattern[str]] = {
    "a multiple": re.compile(rf"(?<![\w.]){_NUM}\s*[x×](?!\w)|×\s*{_NUM}(?![\w.])|\b{_NUM}\s+times\b"),
    "a percentage": re.compile(rf"{_NUM}\s*%"),
    "standard deviations": re.compile(
        rf"{_NUM}\s*(?:baseline |reward )?(?:σ|sigmas?|stddevs?|standard deviations?)\b"),
    "a number in words": re.compile(
        r"\b(?:half|twice|double[ds]?|tripled?|triples|tenfold|order of magnitude|quarters?|thirds?)\b(?!-)",
        re.I),
    "a comparison": re.compile(
        rf"\b(?:above|below|over|under|exceeds?|past|beyond|than|least|most)\s+({_NUM})\b"
        r"(?!\s*(?:-|\s)?(?:steps?|minutes?|seconds?|tokens?|nats?|blocks?)\b)"),
    "a unit of a threshold": re.compile(rf"{_NUM}\s*(?:°C|policy versions?|steps behind|intervals)"),
    "a line at a number": re.compile(rf"\b(?:red|yellow|line)\s*[:=]?\s*{_NUM}\b(?!\s*[-+−±])"),
}
# Phrases whose numbers are not thresholds, with why.
NOT_THRESHOLDS: dict[str, str] = {
    r"\b90% of\b": "the window percentiles (p10 / p90) read as 'nine steps in ten'",
    r"\bfar(?:ther)? from 1\b": "a ratio of 1: the same value (rollout and trainer agree, no move)",
    r"\b100% =|\bnear 100%": "the importance weights' effective sample size when they all agree",
    r"×2 and ÷2": "the log₂ axis of the importance weights",
    r"\b0\.001–0\.01\b": "where a healthy rollout engine's KL sits (the mismatch_kl entry's why)",
    r"\bdouble-bit\b": "a kind of ECC error",
}


def threshold_numbers(text: str) -> list[str]:
    """The threshold-shaped numbers of a prose text (Go templates and code spans left out)."""
    text = re.sub(r"\{\{.*?\}\}|`[^`]*`", " ", text)
    for phrase in NOT_THRESHOLDS:
        text = re.sub(phrase, " ", text)
    found = []
    for shape, rx in THRESHOLD_SHAPES.items():
        for m in rx.finditer(text):
            number = next((g for g in m.groups() if g), None) if m.groups() else None
            if number is not None and float(number.lstrip("+±")) == 0:
                continue  # zero is a sign, not a threshold
            found.append(f"{shape}: …{text[max(0, m.start() - 30):m.end() + 20]}…")
    return found


def _paragraphs(text: str, comments: bool = False) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each run of consecutive lines (of comment lines only, with
    ``comments``), so that a phrase wrapped over two lines is read whole."""
    start, block = 0, []
    for i, line in enumerate([*text.splitlines(), ""], 1):
        s = line.strip()
        keep = s.startswith("#") if comments else bool(s)
        if keep:
            start = start or i
            block.append(s.lstrip("#").strip() if comments else s)
        elif block:
            yield start, " ".join(block)
            start, block = 0, []


def prose() -> Iterator[tuple[str, str]]:
    """(where, text) of every text that speaks of the cards outside the table. docs/metrics.md is
    read in metrics_doc's templates: the numbers it fills in come from the code."""
    for path in hand_written_rule_files():
        for i, block in _paragraphs(path.read_text(), comments=True):
            yield f"{path.name}:{i}", block
    for r in ALERTS:
        for key in ("summary", "description"):
            yield f"{r.file}: {r.name} {key}", r.annotations.get(key, "")
    for where, _, texts in dashboard_texts():
        for text in texts:
            yield where, text
    for i, block in _paragraphs(DASHBOARDS_MD.read_text()):
        yield f"docs/dashboards.md:{i}", block
    for name, value in vars(metrics_doc).items():
        if name.isupper() and isinstance(value, str):
            yield f"metrics_doc.{name}", re.sub(r"\{[a-z_]*(?::[^}]*)?\}", " ", value)
    yield "the header of grpo-thresholds.yml", th.HEADER


def test_prose_names_thresholds_and_never_states_them() -> None:
    found = [f"{where}: {hit}" for where, text in prose() for hit in threshold_numbers(text)]
    assert not found, ("a threshold's number written out goes stale when the table changes; name "
                       "the threshold, quote its series ({{ with query \"grpo:threshold:...\" }}) "
                       "or say what it means:\n" + "\n".join(found))


@pytest.mark.parametrize("text", [
    "KL above 10x its baseline", "below 0.1× its initial value", "baseline × 0.2", "+20% per 100 steps",
    "falls 3 baseline σ below", "more than half within 200 steps", "an order of magnitude",
    "Dashed yellow: 1.25", "yellow 85 °C", "red 20 steps", "over 4 policy versions", "above 0.9",
])
def test_the_prose_scanner_sees_a_stated_threshold(text: str) -> None:
    assert threshold_numbers(text), text


@pytest.mark.parametrize("text", [
    "in 90% of the last 20 steps", "{{ with query \"grpo:threshold:x\" }}{{ . | first | value }}{{ end }}x",
    "kl_explosion_ratio × the KL baseline", "the 50-step mean of 200 steps before", "above 0",
    "`grpo_window_growth_ratio{window_steps=\"100\"}`", "weights far from 1", "1.5 -> 0.05 in 200 steps",
])
def test_the_prose_scanner_lets_other_numbers_be(text: str) -> None:
    assert not threshold_numbers(text), text


def test_descriptions_quote_the_thresholds_their_alert_reads() -> None:
    """A description quotes a threshold through its series, and only one its own rule reads."""
    quoted_any = 0
    for r in ALERTS:
        quoted = set(re.findall(r'query "grpo:threshold:([a-z0-9_]+)"', r.annotations.get("description", "")))
        stray = quoted - thresholds_read(r.expr)
        assert not stray, f"{r.file}: {r.name}'s description quotes {sorted(stray)}, which it does not read"
        quoted_any += bool(quoted)
    assert quoted_any >= 15


_STEPS = re.compile(r"\b(\d+)(?=-step\b|\s+(?:consecutive\s+)?steps?\b)")
_MINUTES = re.compile(r"\b(\d+)\s+minutes?\b")


def step_counts(text: str) -> set[int]:
    """The window lengths a text speaks of ("the last 20 steps", "a 50-step mean"); a logging
    cadence ("logged every 10 steps") is none."""
    text = re.sub(r"\{\{.*?\}\}|\bevery \d+ steps?\b", " ", text)
    return {int(n) for n in _STEPS.findall(text)}


def test_rule_prose_names_the_windows_its_expression_reads() -> None:
    """'in 90% of the last 20 steps', 'within 200 steps', 'for 5 minutes': a rule's comment,
    summary and description speak of the windows its expression (and the recording rules it
    reads) selects, and of its wall-clock windows; a comment outside any rule of those the
    exporter publishes."""
    for r in RULE_LIST:
        text = " ".join([r.comment, *r.annotations.values()])
        allowed = windows(r.expr)
        stray = step_counts(text) - allowed
        assert not stray, (f"{r.file}: {r.name} speaks of {sorted(stray)} steps; its expression "
                           f"reads {sorted(allowed)}")
        minutes = {int(n) for n in _MINUTES.findall(text)} - durations(r)
        assert not minutes, (f"{r.file}: {r.name} speaks of {sorted(minutes)} minutes; it counts "
                             f"{sorted(durations(r))}")
    for path in hand_written_rule_files():
        stray = step_counts(path.read_text()) - MENU_WINDOWS
        assert not stray, f"{path.name} speaks of {sorted(stray)} steps, windows nobody publishes"


def test_dashboard_prose_names_the_windows_its_lines_read() -> None:
    """A panel's title, description and legends speak of the windows its queries read, or those
    of the cards it names; a row of docs/dashboards.md of those of its panel."""
    by_title: dict[str, set[int]] = {}
    for where, panel, texts in dashboard_texts():
        exprs = [t.get("expr", "") for t in panel.get("targets", [])]
        text = " ".join(texts)
        named = set(re.findall(r"\bGRPO[A-Za-z]+\b", text))
        allowed = {w for e in exprs for w in windows(e)} | {
            w for r in ALERTS if r.name in named for w in windows(r.expr)}
        minutes = {m for r in ALERTS if r.name in named for m in durations(r)}
        if not panel:  # the dashboard's own title and description
            allowed = MENU_WINDOWS
        stray = step_counts(text) - allowed
        assert not stray, f"{where} speaks of {sorted(stray)} steps; it reads {sorted(allowed)}"
        stray_min = {int(n) for n in _MINUTES.findall(text)} - minutes
        assert not stray_min, f"{where} speaks of {sorted(stray_min)} minutes; its cards: {sorted(minutes)}"
        if panel:
            by_title.setdefault(panel["title"], set()).update(allowed)
    for i, line in enumerate(DASHBOARDS_MD.read_text().splitlines(), 1):
        cell = line.split("|")[1].strip().replace("\\", "") if line.startswith("| ") else ""
        allowed = next((w for t, w in by_title.items() if cell and (t == cell or t.startswith(cell + ":"))),
                       MENU_WINDOWS)
        stray = step_counts(re.sub(r"`[^`]*`", " ", line)) - allowed
        assert not stray, f"docs/dashboards.md:{i} speaks of {sorted(stray)} steps; its panel: {allowed}"


def test_the_reports_windows_are_the_exporters() -> None:
    """The report judges a run offline with the windows the cards read live: its rising-spread
    window is the exporter's rising window, its look-back an offset the exporter publishes, and
    its baseline the exporter's default baseline period."""
    assert th.count("rising_window_steps") == signals.RISING_WINDOW
    assert th.count("lookback_steps") in {o for _, o in signals.TRAINING_MEANS}
    assert th.count("sustain_steps") in signals.TRAINING_PERCENTILES
    assert th.count("early_window_steps") in signals.TRAINING_PERCENTILES
    assert th.count("baseline_steps") == Limits.baseline_steps


# Step counts in a why that are examples or facts, not a window a rule selects.
WHY_EXAMPLES: dict[str, set[int]] = {
    "kl_explosion_ratio": {100},  # "0.3 to 5 within 100 steps": what a blow-up looks like
}


def test_each_why_names_the_windows_of_the_rules_reading_it() -> None:
    """The table's why of a card threshold speaks of the windows of the rules that read it; a
    report entry's of windows the exporter publishes."""
    for t in th.TABLE:
        counts = step_counts(t.why) - WHY_EXAMPLES.get(t.name, set())
        if t.in_rules:
            allowed = {w for r in RULE_LIST if t.name in thresholds_read(r.expr) for w in windows(r.expr)}
        else:
            allowed = MENU_WINDOWS
        stray = counts - allowed
        assert not stray, f"{t.name}'s why speaks of {sorted(stray)} steps; its rules read {sorted(allowed)}"


# -- one edit moves everything --------------------------------------------------------------------

def _fired(rule_dir: Path, series: dict[str, float],
           alert: str) -> list[tuple[dict[str, str], dict[str, str]]]:
    """The ``alert``s promtool's evaluation of the rule files in ``rule_dir`` raises after five
    minutes of constant ``series``, as (labels, annotations): promtool prints what it got when
    the test expects none."""
    test = rule_dir / "probe.test.yml"
    test.write_text(yaml.safe_dump({
        "rule_files": sorted(p.name for p in rule_dir.glob("*.yml") if p != test),
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m",
                   "input_series": [{"series": s, "values": f"{v}x10"} for s, v in series.items()],
                   "alert_rule_test": [{"eval_time": "5m", "alertname": alert, "exp_alerts": []}]}],
    }))
    promtool = shutil.which("promtool")
    assert promtool, "promtool not on PATH: install Debian's prometheus package (make system-deps)"
    res = subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True,
                         timeout=120, cwd=rule_dir)
    out = res.stdout + res.stderr
    if res.returncode == 0:
        return []
    assert "got:[" in out, out

    def fields(line: str) -> dict[str, str]:
        return {k: re.sub(r"\\(.)", r"\1", v) for k, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line)}

    labels = [fields(ln) for ln in out.splitlines() if ln.strip().startswith("Labels:")]
    annotations = [fields(ln) for ln in out.splitlines() if ln.strip().startswith("Annotations:")]
    assert labels and len(labels) == len(annotations), out
    return list(zip(labels, annotations))


def test_one_edit_of_the_table_moves_rule_description_dashboard_and_report(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """dead_group_cause_ratio from 0.5 to 0.8 in the table alone: the generated record, the card
    (a run at 0.6 of its groups all wrong no longer fires, one at 0.85 still does), the number
    its description quotes, the dashboard line (a query of the series) and the report's verdict
    all follow; the committed rule file is then stale, which the first test of this file says."""
    from grpo_monitor.tools import report

    name, old, new = "dead_group_cause_ratio", THRESHOLDS["dead_group_cause_ratio"].value, 0.8
    assert old == 0.5, "the inputs below straddle the old and the new value: adjust them"
    data = _run("prompts_too_hard", tmp_path_factory)
    series = {f'grpo_window_p10{{run="{run}",rank="0",key="group/all_wrong_frac",window_steps="20"}}': v
              for run, v in (("between", 0.6), ("above", 0.85))}
    series |= {f'grpo_step{{run="{run}",rank="0"}}': 300 for run in ("between", "above")}

    def state(table_dir: Path) -> tuple[dict[str, str], set[str]]:
        fired = _fired(table_dir, series, "GRPOPromptsTooHard")
        return ({lab["run"]: ann["description"] for lab, ann in fired},
                {v["id"] for v in report.diagnose(data)})

    before_dir, after_dir = tmp_path / "before", tmp_path / "after"
    for d in (before_dir, after_dir):
        d.mkdir()
        for path in hand_written_rule_files():
            shutil.copy(path, d / path.name)
    (before_dir / COMMITTED.name).write_text(th.render())
    before = state(before_dir)

    patched = replace(THRESHOLDS[name], value=new)
    monkeypatch.setattr(th, "TABLE", tuple(patched if t.name == name else t for t in th.TABLE))
    monkeypatch.setitem(THRESHOLDS, name, patched)
    text = th.render()
    assert f"- record: grpo:threshold:{name}\n        expr: vector({new})\n" in text
    (after_dir / COMMITTED.name).write_text(text)
    after = state(after_dir)

    # The card: the run between the two values fires only under the old table.
    assert set(before[0]) == {"between", "above"} and set(after[0]) == {"above"}, (before[0], after[0])
    # Its description: the same words, the new number (humanizePercentage of the series).
    assert before[0]["above"].count(f"{old:.0%}") == 1, before[0]["above"]
    assert after[0]["above"] == before[0]["above"].replace(f"{old:.0%}", f"{new:.0%}")
    # The dashboard draws the line from the series, so it moves with the record.
    assert any(f"grpo:threshold:{name}" in expr for _, expr in dashboard_queries())
    # The report: the simulated run's 70% of groups all wrong is a verdict under 0.5, not 0.8.
    assert "prompts_too_hard" in before[1] and "prompts_too_hard" not in after[1]
    # And the committed file no longer matches the table: `make docs` is due.
    with pytest.raises(AssertionError, match="stale"):
        test_committed_rule_file_is_generated()


# -- generated files ------------------------------------------------------------------------------

def make_docs_outputs() -> dict[str, str]:
    """What `make docs` writes: target path -> the module whose render() writes it."""
    text = MAKEFILE.read_text()
    recipe = re.search(r"^docs:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert recipe, "the Makefile has no docs target"
    out = {}
    for line in recipe.group(1).splitlines():
        if re.fullmatch(r"\t\$\(PY\) -m ([\w.]+) --write", line):
            continue  # a part of a hand-written file, rewritten in place: make_docs_in_place()
        m = re.fullmatch(r"\t\$\(PY\) -m ([\w.]+) > (\S+)", line)
        assert m, f"a docs step that is not `$(PY) -m module > file` or `--write`: {line.strip()}"
        out[m.group(2)] = m.group(1)
    return out


def make_docs_in_place() -> list[str]:
    """The modules `make docs` runs with --write: each rewrites a part of a hand-written file
    (its TARGET) with render(text)."""
    text = MAKEFILE.read_text()
    recipe = re.search(r"^docs:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert recipe
    return re.findall(r"^\t\$\(PY\) -m ([\w.]+) --write$", recipe.group(1), re.MULTILINE)


def test_make_docs_rewrites_parts_in_place_and_each_is_fresh() -> None:
    modules = make_docs_in_place()
    assert "grpo_monitor.tools.runbook_index" in modules
    for name in modules:
        module = importlib.import_module(name)
        text = Path(module.TARGET).read_text(encoding="utf-8")
        assert module.render(text) == text, f"{module.TARGET} is stale: run `make docs`"


def test_make_docs_writes_every_generated_file_and_each_is_fresh() -> None:
    """Every committed file that says it is generated by `make docs` is written by the docs
    target, and equals what its module renders now."""
    outputs = make_docs_outputs()
    # Build outputs (`make dist` leaves build/ with a copy of the stack's files) are ignored.
    ignored = ("build", "dist", "snapshots")
    generated = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                 if p.is_file() and p.suffix in (".md", ".yml", ".yaml", ".json")
                 and not any(part.startswith(".") or part.endswith(".egg-info")
                             for part in p.relative_to(ROOT).parts)
                 and p.relative_to(ROOT).parts[0] not in ignored
                 and "make docs" in p.read_text(errors="replace")[:600]
                 and "do not edit" in p.read_text(errors="replace")[:600].lower()}
    assert {th.RULE_FILE, "docs/metrics.md"} <= generated
    unwritten = sorted(generated - set(outputs))
    assert not unwritten, f"generated files `make docs` does not write: {unwritten}"
    for target, module in outputs.items():
        rendered = importlib.import_module(module).render()
        assert (ROOT / target).read_text() == rendered, f"{target} is stale: run `make docs`"

"""The Grafana dashboards and provisioning, checked without a Grafana server.

No Grafana binary can be installed here (docs/dashboards.md), so the dashboards are proven the
two ways that matter without one:

1. Structure: every dashboard JSON loads into the typed models below (unknown keys refused
   where a typo would silently break a panel), one `datasource` variable feeds every panel,
   target and annotation, units are set, ids are unique, the grid does not overlap, uids are
   fixed, and the provisioning YAMLs point Grafana at the dashboards folder and at both
   datasources.
2. Data: every PromQL expression of every panel, annotation and variable, with Grafana's
   variables substituted, is executed against a REAL Prometheus (the project's own rule files)
   that scrapes the REAL exporter fed by `grpo_monitor.tools.simulate` (a KL-explosion run and a
   straggler run) with the fake NVML of tests/fake_pynvml.py, and must return at least one
   series. A misspelt metric, label or recording rule returns nothing, and fails here with the
   dashboard, the panel and the query named.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import fake_pynvml as nv
import pytest
import requests
import yaml
from fake_pynvml import FakeDevice, FakeNVML
from grpo_monitor.runtime.app import Exporter
from grpo_monitor.runtime.config import ExporterConfig
from grpo_monitor.sdk.writer import SnapshotWriter
from grpo_monitor.tools.simulate import RankRecord, generate, write_run, write_steps
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from polling import wait_for
from prometheus_harness import WebhookListener, alert_stack, start_alertmanager
from promtool_harness import rules
from victoria_harness import victoria_stack

from grpo_monitor.tools.stack import ENGINES

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
DATASOURCES_YML = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDER_YML = GRAFANA / "provisioning" / "dashboards" / "grpo.yml"
METRICS_MD = ROOT / "docs" / "metrics.md"

# The uids are links: bookmarks, alert annotations and other dashboards point at them.
EXPECTED_UIDS = {
    "grpo-training.json": "grpo-training",
    "grpo-cluster.json": "grpo-cluster",
    "grpo-alerts.json": "grpo-alerts",
}
DS_REF = {"type": "prometheus", "uid": "${datasource}"}
PROMETHEUS_UID = "grpo-prometheus"
ALERTMANAGER_UID = "grpo-alertmanager"
MOUNT = "/var/lib/grafana/dashboards"

# The simulated runs the live queries read; each dashboard's $run is the run that shows what
# its panels are about.
TRAINING_RUN = "demo"  # kl_explosion: red and yellow cards, every training signal
CLUSTER_RUN = "slow"  # straggler: rank 3 30% slower, step time drift
RUN_FOR = {"grpo-training": TRAINING_RUN, "grpo-cluster": CLUSTER_RUN, "grpo-alerts": TRAINING_RUN}
# kl_explosion turns sick at step 800 and the red card holds while KL is 10x its mean of 200
# steps before: 100 steps into the jump it fires (a later step compares with a sick window).
TRAINING_STEPS = 900
CLUSTER_STEPS = 1200
COMPOSE_YML = ROOT / "docker-compose.yml"


# --- the typed models ---------------------------------------------------------------------


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class DataSourceRef(Strict):
    type: str
    uid: str


class GridPos(Strict):
    h: int = Field(ge=1)
    w: int = Field(ge=1, le=24)
    x: int = Field(ge=0, le=23)
    y: int = Field(ge=0)

    @model_validator(mode="after")
    def _fits(self) -> GridPos:
        if self.x + self.w > 24:
            raise ValueError(f"x {self.x} + w {self.w} exceeds the 24-column grid")
        return self

    def cells(self) -> set[tuple[int, int]]:
        return {(x, y) for x in range(self.x, self.x + self.w) for y in range(self.y, self.y + self.h)}


class Target(Strict):
    datasource: DataSourceRef
    refId: str = Field(pattern=r"^[A-Z]$")
    expr: str = Field(min_length=1)
    legendFormat: str = ""
    range: bool = True
    instant: bool = False
    format: Literal["time_series", "table", "heatmap"] = "time_series"


class Defaults(Loose):
    unit: str = Field(min_length=1)


class FieldConfig(Strict):
    defaults: Defaults
    overrides: list[dict[str, Any]] = []


PanelType = Literal["row", "timeseries", "stat", "table", "alertlist", "gauge", "bargauge",
                    "xychart"]


class Panel(Strict):
    id: int
    type: PanelType
    title: str = Field(min_length=1)
    description: str = ""
    gridPos: GridPos
    datasource: DataSourceRef | None = None
    targets: list[Target] = []
    fieldConfig: FieldConfig | None = None
    options: dict[str, Any] = {}
    transformations: list[dict[str, Any]] = []
    collapsed: bool = False
    panels: list[Panel] = []


class VariableQuery(Strict):
    query: str
    refId: str


class Variable(Loose):
    name: str
    type: Literal["datasource", "query", "custom", "constant", "interval"]
    query: str | VariableQuery
    datasource: DataSourceRef | None = None


class Templating(Strict):
    list: list[Variable]


class Annotation(Loose):
    name: str
    datasource: DataSourceRef
    enable: bool
    builtIn: int = 0
    expr: str = ""


class Annotations(Strict):
    list: list[Annotation]


class TimeRange(Strict):
    to: str
    from_: str = Field(alias="from")


class Dashboard(Loose):
    uid: str
    title: str = Field(min_length=1)
    schemaVersion: int = Field(ge=36)
    panels: list[Panel]
    templating: Templating
    annotations: Annotations
    time: TimeRange
    tags: list[str]

    def all_panels(self) -> Iterator[Panel]:
        for p in self.panels:
            yield p
            yield from p.panels

    def variable(self, name: str) -> Variable | None:
        return next((v for v in self.templating.list if v.name == name), None)


# --- loading --------------------------------------------------------------------------------


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))


def load(path: Path) -> Dashboard:
    return Dashboard.model_validate(json.loads(path.read_text()))


@dataclass(frozen=True)
class Query:
    dashboard: str  # uid
    where: str  # panel title / annotation / variable
    ref: str
    expr: str

    def __str__(self) -> str:
        return f"dashboard {self.dashboard!r}, {self.where} [{self.ref}]: {self.expr}"


def queries() -> list[Query]:
    """Every PromQL expression of every dashboard (panels, annotations); read leniently, so
    that a broken file fails its own structure test instead of the collection."""
    out: list[Query] = []
    for path in dashboard_files():
        try:
            raw = json.loads(path.read_text())
        except ValueError:
            continue
        uid = raw.get("uid", path.stem)
        stack = list(raw.get("panels", []))
        while stack:
            p = stack.pop(0)
            stack.extend(p.get("panels", []))
            for t in p.get("targets", []):
                out.append(Query(uid, f"panel {p.get('title')!r}", t.get("refId", "?"),
                                 t.get("expr", "")))
        for a in raw.get("annotations", {}).get("list", []):
            if a.get("expr"):
                out.append(Query(uid, f"annotation {a.get('name')!r}", "-", a["expr"]))
    return out


def substitute(expr: str, run: str) -> str:
    """Grafana's variables as they would expand for one run and all ranks."""
    out = (expr.replace("$__rate_interval", "1m").replace("${__rate_interval}", "1m")
           .replace("$__interval", "15s").replace("${__interval}", "15s")
           .replace("${run}", run).replace("$run", run)
           .replace("${rank}", ".*").replace("$rank", ".*"))
    left = re.findall(r"\$\{?\w+", out)
    assert not left, f"unsubstituted variables {left} in {expr}"
    return out


# --- structure ------------------------------------------------------------------------------


def test_dashboard_files_are_the_expected_ones() -> None:
    assert {p.name for p in dashboard_files()} == set(EXPECTED_UIDS)


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_dashboard_parses_with_fixed_uid(name: str) -> None:
    try:
        d = load(DASHBOARDS / name)
    except ValidationError as e:
        pytest.fail(f"{name} does not load into the Dashboard model:\n{e}")
    assert d.uid == EXPECTED_UIDS[name]
    assert "grpo" in d.tags


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_one_datasource_variable_feeds_every_panel(name: str) -> None:
    d = load(DASHBOARDS / name)
    ds_vars = [v for v in d.templating.list if v.type == "datasource"]
    assert [v.name for v in ds_vars] == ["datasource"], "exactly one datasource variable"
    assert ds_vars[0].query == "prometheus"
    assert ds_vars[0].model_extra.get("current", {}).get("value") == PROMETHEUS_UID
    for v in d.templating.list:
        if v.type == "query":
            assert v.datasource is not None and v.datasource.model_dump() == DS_REF, v.name
    for p in d.all_panels():
        if p.type == "row":
            assert not p.targets, p.title
            continue
        if p.type == "alertlist":
            # No PromQL: Grafana's alert list reads the Alertmanager datasource, which the
            # provisioning test checks.
            assert p.datasource is not None and p.datasource.uid == ALERTMANAGER_UID
            assert not p.targets
            continue
        assert p.datasource is not None and p.datasource.model_dump() == DS_REF, p.title
        assert p.targets, f"panel {p.title!r} has no query"
        for t in p.targets:
            assert t.datasource.model_dump() == DS_REF, f"{p.title} [{t.refId}]"
        refs = [t.refId for t in p.targets]
        assert len(refs) == len(set(refs)), f"{p.title}: duplicate refIds {refs}"
    for a in d.annotations.list:
        if not a.builtIn:
            assert a.datasource.model_dump() == DS_REF, a.name


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_units_set_on_every_panel(name: str) -> None:
    d = load(DASHBOARDS / name)
    for p in d.all_panels():
        if p.type != "row":
            assert p.fieldConfig is not None and p.fieldConfig.defaults.unit, p.title


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_panel_ids_unique(name: str) -> None:
    ids = [p.id for p in load(DASHBOARDS / name).all_panels()]
    assert len(ids) == len(set(ids)), sorted(ids)


def overlaps(panels: list[Panel]) -> list[str]:
    seen: dict[tuple[int, int], str] = {}
    bad = []
    for p in panels:
        for cell in p.gridPos.cells():
            if cell in seen:
                bad.append(f"{p.title!r} overlaps {seen[cell]!r} at {cell}")
                break
            seen[cell] = p.title
    return bad


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_grid_does_not_overlap(name: str) -> None:
    """Visible panels (rows included) share one grid; a collapsed row's panels keep their own
    positions, laid out below the row when it opens, so they are checked among themselves."""
    d = load(DASHBOARDS / name)
    assert overlaps(d.panels) == []
    for p in d.panels:
        if p.type == "row":
            assert p.gridPos.w == 24 and p.gridPos.h == 1 and p.gridPos.x == 0, p.title
            if p.collapsed:
                assert overlaps(p.panels) == [], p.title
                assert all(c.gridPos.y > p.gridPos.y for c in p.panels), p.title
            else:
                assert not p.panels, f"open row {p.title!r} must not hold panels"
        else:
            assert not p.panels, p.title


def test_training_dashboard_layout() -> None:
    """The brief's shape: the stat cards on top, then one row per seed layer, with threshold
    lines, the firing-card annotation and the run/rank variables."""
    d = load(DASHBOARDS / "grpo-training.json")
    top = [p for p in d.panels if p.gridPos.y == 0]
    assert top and all(p.type == "stat" for p in top)
    titles = {p.title for p in top}
    assert {"Step", "Red cards firing", "Yellow cards firing"} <= titles
    rows = [p.title.split(" (")[0] for p in d.panels if p.type == "row"]
    assert rows == ["Coverage", "Policy behaviour", "Reward feedback", "Distribution stability",
                    "Training mechanics", "Rollout vs trainer", "Forecast"]
    red = next(p for p in top if p.title == "Red cards firing")
    assert red.targets[0].expr == ('count(ALERTS{alertstate="firing",severity="critical",'
                                   'run=~"$run"}) or vector(0)')
    exprs = [t.expr for p in d.all_panels() for t in p.targets]
    # The collapse line is the card's: the initial value, not the baseline, times the ratio.
    assert ('grpo_initial_mean{key="entropy/mean",run=~"$run",rank=~"$rank"} * on() '
            'group_left() grpo:threshold:entropy_collapse_ratio') in exprs
    ann = [a for a in d.annotations.list if not a.builtIn]
    assert [a.expr for a in ann] == ['ALERTS{alertstate="firing",run=~"$run"}']
    run, rank = d.variable("run"), d.variable("rank")
    assert run is not None and run.model_extra["definition"] == "label_values(grpo_step, run)"
    assert rank is not None and rank.model_extra["definition"] == \
        'label_values(grpo_step{run=~"$run"}, rank)'


def row_sections(d: Dashboard) -> dict[str, list[Panel]]:
    """Each row's panels by the row's short title (before " ("): an open row's are the panels
    after it up to the next row, a collapsed row's are its own."""
    sections: dict[str, list[Panel]] = {}
    current: list[Panel] = []
    for p in d.panels:
        if p.type == "row":
            current = sections.setdefault(p.title.split(" (")[0], [])
            current.extend(p.panels)
        else:
            current.append(p)
    return sections


def names_in(panels: list[Panel]) -> set[str]:
    """The metric, recording-rule and threshold names the panels' queries read."""
    return {n for p in panels for t in p.targets
            for n in re.findall(r"[a-z_]+:[a-z_]+:[a-z_0-9]+|grpo_[a-z0-9_]+", t.expr)}


def test_threshold_lines_are_dashed() -> None:
    """A threshold line is a query of a grpo:threshold:* record, drawn dashed in a fixed colour
    (docs/dashboards.md), so that it never reads as a signal."""
    for path in dashboard_files():
        for p in load(path).all_panels():
            if p.type != "timeseries":
                continue
            styled = {o["matcher"]["options"]: {x["id"]: x["value"] for x in o["properties"]}
                      for o in p.fieldConfig.overrides if o["matcher"]["id"] == "byFrameRefID"}
            for t in p.targets:
                if "grpo:threshold:" in t.expr:
                    props = styled.get(t.refId, {})
                    assert props.get("custom.lineStyle", {}).get("fill") == "dash", \
                        f"{path.name}: {p.title} [{t.refId}] is no dashed line"
                    assert props.get("color", {}).get("mode") == "fixed", f"{p.title} [{t.refId}]"


def test_coverage_row_says_what_the_run_is_watched_for() -> None:
    """Which cards can fire on the run (N of M, per colour), and a table of those that cannot,
    with the reason and the keys they need (grpo_card_armed); panels of signals only some
    stacks log say "not logged by this run" instead of "No data"."""
    d = load(DASHBOARDS / "grpo-training.json")
    row = row_sections(d)["Coverage"]
    assert [p.type for p in row] == ["stat", "stat", "table"]
    assert {p.title for p in row} == {"Red cards armed", "Yellow cards armed",
                                      "Cards that cannot fire on this run, and why"}
    assert all("grpo_card_armed" in t.expr for p in row for t in p.targets)
    table = row[2]
    assert table.targets[0].format == "table"
    shown = table.transformations[0]["options"]["indexByName"]
    assert list(shown) == ["run", "card", "severity", "reason", "needs"]
    optional = [p for p in d.all_panels() if p.type == "timeseries" and any(
        n.startswith(("grpo_mismatch_", "grpo_staleness_")) for n in names_in([p]))]
    assert optional and all(p.fieldConfig.defaults.model_extra.get("noValue") == "not logged by this run"
                            for p in optional)


def test_rollout_row_shows_mismatch_staleness_and_dead_groups() -> None:
    """Rollout vs trainer: the training-inference mismatch, the rollouts' staleness and dead
    groups by cause, each with the lines of the cards that read it."""
    row = row_sections(load(DASHBOARDS / "grpo-training.json"))["Rollout vs trainer"]
    assert row and all(p.type == "timeseries" for p in row)
    names = names_in(row)
    assert {
        "grpo_mismatch_kl", "grpo_mismatch_k3_kl", "grpo_mismatch_logprob_abs_diff_mean",
        "grpo_mismatch_logprob_abs_diff_max", "grpo_mismatch_prob_abs_diff_mean",
        "grpo_mismatch_is_weight_mean", "grpo_mismatch_is_weight_min",
        "grpo_mismatch_is_weight_max", "grpo_mismatch_is_effective_sample_ratio",
        "grpo_mismatch_chi2_token", "grpo_staleness_mean_steps", "grpo_staleness_max_steps",
        "grpo_group_all_wrong_ratio", "grpo_group_all_right_ratio", "grpo_group_zero_std_ratio",
    } <= names
    assert {f"grpo:threshold:{t}" for t in (
        "mismatch_kl", "mismatch_rise_ratio", "mismatch_chi2_token", "mismatch_is_weight_low",
        "mismatch_is_weight_high", "mismatch_ess_ratio", "staleness_steps",
        "dead_group_cause_ratio")} <= names
    # The rise line is the card's own: the initial value times the ratio.
    kl = next(p for p in row if "grpo_mismatch_kl" in names_in([p]))
    assert ('grpo_initial_mean{key="mismatch/kl",run=~"$run",rank=~"$rank"} * on() '
            "group_left() grpo:threshold:mismatch_rise_ratio") in [t.expr for t in kl.targets]


def forecast_chart(d: Dashboard) -> Panel:
    [xy] = [p for p in d.all_panels() if p.type == "xychart"]
    return xy


def test_forecast_row_plots_the_law_and_its_numbers() -> None:
    """The XY chart joins its queries into one frame and picks X by a field name that one of its
    queries gives; the stats beside it show the ceiling, the fit's R², the headroom and the
    steps to the entropy floor, each beside the rule's number where a card reads one."""
    d = load(DASHBOARDS / "grpo-training.json")
    row = row_sections(d)["Forecast"]
    xy = forecast_chart(d)
    assert xy in row
    # Fixed, distinct field names (legends): X and the series styles select fields by name.
    legends = [t.legendFormat for t in xy.targets]
    assert len(set(legends)) == len(legends) and not any("{{" in n for n in legends), legends
    exprs = {t.legendFormat: t.expr for t in xy.targets}
    # One frame: an outer join on the time, which is the same step grid for every query of a
    # panel, so entropy, reward, law and ceiling of one moment land in one row. Range queries
    # only: an instant query would give the join one row.
    assert xy.transformations == [
        {"id": "joinByField", "options": {"byField": "Time", "mode": "outer"}}]
    assert all(t.range and not t.instant for t in xy.targets)
    # The options of the XY chart before Grafana 11's rewrite (series mapping "auto", dims);
    # Grafana 11 and 12 migrate them when the panel has no pluginVersion (the Panel model
    # refuses one), and that migration reads custom.pointSize.
    assert xy.options["seriesMapping"] == "auto"
    assert xy.options["dims"] == {"frame": 0, "x": "entropy"}
    assert 'key="entropy/mean"' in exprs["entropy"] and 'key="reward/mean"' in exprs["reward"]
    assert "fixed" in xy.fieldConfig.defaults.model_extra["custom"]["pointSize"]
    for o in xy.fieldConfig.overrides:
        if o["matcher"]["id"] == "byName":
            assert o["matcher"]["options"] in legends, o
    # law = b - a exp(H) at the plotted entropy H (b: law_offset, a: law_scale); ceiling = b - a.
    law = exprs["law"]
    assert "grpo_forecast_law_offset" in law and "grpo_forecast_law_scale" in law
    assert f"exp({exprs['entropy']})" in law
    assert "grpo_forecast_reward_ceiling" in exprs["ceiling"]
    stats = {p.title: names_in([p]) for p in row if p.type == "stat"}
    assert stats == {
        "Reward ceiling": {"grpo_forecast_reward_ceiling", "grpo_window_mean"},
        "Law fit R²": {"grpo_forecast_fit_r_squared", "grpo:threshold:forecast_min_r2"},
        "Headroom left": {"run_rank:grpo_forecast_reward_headroom:ratio",
                          "grpo:threshold:ceiling_headroom_ratio"},
        "Steps to the entropy floor": {"run_rank:grpo_forecast_entropy_floor:steps"},
    }
    assert "grpo_window_slope" in names_in(row)


def test_compose_pins_a_grafana_that_reads_the_xy_chart() -> None:
    """The XY chart's JSON is written for Grafana 10-12 (see the forecast test); a Grafana of
    another major version needs the panel checked again."""
    compose = yaml.safe_load(COMPOSE_YML.read_text())
    image = compose["services"]["grafana"]["image"]
    m = re.fullmatch(r"grafana/grafana(?:-oss)?:(\d+)\.\d+\.\d+", image)
    assert m and 10 <= int(m.group(1)) <= 12, image


def test_leading_indicators_sit_beside_what_they_lead() -> None:
    """The log-prob/advantage covariance and the correct/incorrect lengths beside entropy (they
    move before it), the per-type reward change beside the per-type reward."""
    d = load(DASHBOARDS / "grpo-training.json")
    sections = row_sections(d)
    by_title = {p.title: p for p in d.all_panels()}

    def beside(a: str, b: str, row: str) -> None:
        pa, pb = by_title[a], by_title[b]
        assert pa in sections[row] and pb in sections[row]
        assert pa.gridPos.y == pb.gridPos.y, (a, b)

    beside("Entropy against its baseline", "Log-prob/advantage covariance", "Policy behaviour")
    beside("Entropy against its baseline", "Response length: correct vs incorrect",
           "Policy behaviour")
    beside("Reward by prompt type", "Reward change by prompt type", "Reward feedback")
    assert "grpo_entropy_logprob_advantage_covariance" in names_in(
        [by_title["Log-prob/advantage covariance"]])
    assert {"grpo_response_length_correct_mean_tokens",
            "grpo_response_length_incorrect_mean_tokens"} <= names_in(
        [by_title["Response length: correct vs incorrect"]])
    assert {"grpo_prompt_type_window_mean", "grpo_prompt_type_initial_mean",
            "grpo:threshold:shortcut_delta"} <= names_in(
        [by_title["Reward change by prompt type"]])


def test_rate_panels_use_rate_interval() -> None:
    """Grafana widens $__rate_interval to four scrape intervals; a fixed window would be
    empty on a fresh stack or a zoomed-in graph."""
    for q in queries():
        for window in re.findall(r"\b(?:rate|increase|irate)\([^\[]*\[([^\]]+)\]", q.expr):
            assert window == "$__rate_interval", str(q)


def rule_records() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def test_every_name_is_exported_or_recorded() -> None:
    """Static twin of the live test: every metric name is in docs/metrics.md (generated from
    the code) or is a recording rule; every threshold line reads a grpo:threshold:* record."""
    documented = set(re.findall(r"`(grpo_[a-z0-9_]+)`", METRICS_MD.read_text()))
    records = rule_records()
    known = documented | records | {"ALERTS", "ALERTS_FOR_STATE", "up"}
    funcs = {"count", "max", "min", "sum", "quantile", "rate", "vector", "on", "by", "without",
             "group_left", "group_right", "or", "and", "unless", "ignoring", "abs", "increase",
             "exp"}
    for q in queries():
        stripped = re.sub(r'"[^"]*"', '""', q.expr)  # no label values
        stripped = re.sub(r"\{[^}]*\}", "{}", stripped)  # no label names
        # no label lists of on(...), ignoring(...), by (...), group_left(...) and the like
        stripped = re.sub(r"\b(on|ignoring|by|without|group_left|group_right)\s*\([^()]*\)",
                          r"\1()", stripped)
        for name in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", stripped):
            if name in funcs or name.startswith("__"):
                continue
            assert name in known, f"unknown name {name!r} in {q}"
        for thr in re.findall(r"grpo:threshold:[a-z0-9_]+", q.expr):
            assert thr in records, f"{thr} is no record of prometheus/rules: {q}"


# --- provisioning ---------------------------------------------------------------------------


def test_datasource_provisioning() -> None:
    cfg = yaml.safe_load(DATASOURCES_YML.read_text())
    assert cfg["apiVersion"] == 1
    by_uid = {d["uid"]: d for d in cfg["datasources"]}
    assert set(by_uid) == {PROMETHEUS_UID, ALERTMANAGER_UID}
    prom, am = by_uid[PROMETHEUS_UID], by_uid[ALERTMANAGER_UID]
    # Whichever engine answers PromQL, from Grafana's environment: tests/test_compose.py
    # resolves it for Compose (either engine) and `stack up`.
    assert prom["type"] == "prometheus" and prom["url"] == "${GRPO_DATASOURCE_URL}"
    assert prom["access"] == "proxy" and prom.get("isDefault") is True
    assert am["type"] == "alertmanager" and am["url"] == "http://alertmanager:9093"
    assert am["jsonData"]["implementation"] == "prometheus"
    assert sum(bool(d.get("isDefault")) for d in cfg["datasources"]) == 1
    # Every datasource uid a dashboard names outright is provisioned.
    for path in dashboard_files():
        for p in load(path).all_panels():
            if p.datasource is not None and not p.datasource.uid.startswith("$"):
                assert p.datasource.uid in by_uid, f"{path.name}: {p.title}"
                assert p.datasource.type == by_uid[p.datasource.uid]["type"]


def test_dashboard_provisioning() -> None:
    cfg = yaml.safe_load(DASHBOARD_PROVIDER_YML.read_text())
    assert cfg["apiVersion"] == 1
    [provider] = cfg["providers"]
    assert provider["type"] == "file"
    assert provider["folder"] == "GRPO"
    assert provider["options"]["path"] == MOUNT


def test_only_provisioning_and_dashboards_under_grafana() -> None:
    """Grafana reads provisioning/ and the mounted dashboards/; anything else is a stray."""
    for f in GRAFANA.rglob("*"):
        if f.is_file():
            rel = f.relative_to(GRAFANA).as_posix()
            assert re.fullmatch(r"provisioning/(datasources|dashboards)/[\w.-]+\.ya?ml"
                                r"|dashboards/[\w.-]+\.json", rel), rel


# --- the live stack: exporter (simulated runs, fake NVML) -> Prometheus ---------------------

U0 = "GPU-5f2a9c3e-1b7d-4e80-a6f1-3c9d2b8e7a10"
U1 = "GPU-c81e4d07-92ab-4f3c-b5d6-0e7f18a29c44"


def unsimulated_signals(rng: random.Random) -> dict[str, float]:
    """Rollout-vs-trainer signals grpo_monitor.tools.simulate does not log, at healthy levels, so that
    their panels have data too: the largest |log-prob| gap, the probability gaps and the
    smallest and largest importance weight."""
    return {
        "mismatch/logprob_diff_max": 1.5 + abs(rng.gauss(0, 0.3)),
        "mismatch/prob_diff_mean": 0.004 * (1 + rng.gauss(0, 0.05)),
        "mismatch/prob_diff_max": 0.4 + abs(rng.gauss(0, 0.05)),
        "mismatch/is_weight_min": 0.3 + rng.gauss(0, 0.02),
        "mismatch/is_weight_max": 3 + abs(rng.gauss(0, 0.3)),
    }


def write_training_run(snapshots: Path) -> None:
    """The simulator's kl_explosion run, written as write_run writes it (on a simulated clock),
    whose rank 0 also logs unsimulated_signals(); the simulator's values win where it has its
    own."""
    rng = random.Random(14)

    def with_unsimulated(rec: RankRecord) -> RankRecord:
        if rec.rank != 0:
            return rec
        return replace(rec, metrics={**unsimulated_signals(rng), **rec.metrics})

    with ExitStack() as stack:
        writers = [stack.enter_context(SnapshotWriter(snapshots, TRAINING_RUN, rank=r,
                                                      world_size=4)) for r in range(4)]
        write_steps(writers, generate("kl_explosion", steps=TRAINING_STEPS, ranks=4,
                                      start_time=time.time()), record=with_unsimulated)


class MovingCounters:
    """Makes the fake GPUs' error counters tick, so the rate() panels have something to show:
    NVLink replays and CRC errors, PCIe replays, and an XID 79 now and then."""

    def __init__(self, fake: FakeNVML) -> None:
        self.fake = fake
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gpu-counters", daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.wait(0.25):
            n += 1
            gpu0 = self.fake.devices[0]
            gpu0.nvlink = {link: tuple(c + 1 for c in counters)
                           for link, counters in gpu0.nvlink.items()}
            gpu0.pcie_replays += 1
            if n % 4 == 0:
                self.fake.xid(1, 79)


@dataclass
class Live:
    prom_url: str

    def query(self, promql: str) -> dict[str, Any]:
        resp = requests.get(f"{self.prom_url}/api/v1/query", params={"query": promql}, timeout=10)
        return resp.json()

    def result(self, promql: str) -> list[dict[str, Any]]:
        body = self.query(promql)
        assert body.get("status") == "success", f"{promql}: {body}"
        return body["data"]["result"]

    def range_result(self, promql: str, start: int, end: int) -> list[dict[str, Any]]:
        """A range query, one point a second, as a panel asks for its time range."""
        resp = requests.get(f"{self.prom_url}/api/v1/query_range", timeout=10, params={
            "query": promql, "start": start, "end": end, "step": 1})
        body = resp.json()
        assert body.get("status") == "success", f"{promql}: {body}"
        return body["data"]["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        resp = requests.get(f"{self.prom_url}/api/v1/label/{label}/values",
                            params={"match[]": match}, timeout=10)
        resp.raise_for_status()
        return resp.json()["data"]


@pytest.fixture(scope="module", params=ENGINES)
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """The stack on either engine: the dashboards' one datasource is Prometheus, or
    VictoriaMetrics answering the same API (grpo-monitor stack up --stack.engine)."""
    work = tmp_path_factory.mktemp("dashboards")
    snapshots = work / "snapshots"
    snapshots.mkdir()
    write_training_run(snapshots)
    write_run(snapshots, CLUSTER_RUN, "straggler", ranks=4, steps=CLUSTER_STEPS)
    fake = FakeNVML([
        FakeDevice(U0, nvlink_links=2, nvlink={0: (0, 0, 0, 0), 1: (0, 0, 0, 0)}),
        FakeDevice(U1, utilization=3, temperature=41, power_mw=71_230,
                   clock_reasons=nv.nvmlClocksEventReasonGpuIdle),
    ])
    with ExitStack() as stack:
        exporter = Exporter(ExporterConfig(snapshot_dir=snapshots, listen_address="127.0.0.1:0",
                                           gpu_nvml=fake, gpu_interval=0.2)).start()
        stack.callback(exporter.stop)
        wait_for(exporter.watcher.ready.is_set, timeout=60)
        counters = MovingCounters(fake)
        counters.thread.start()
        stack.callback(counters.thread.join, 5)
        stack.callback(counters.stop.set)
        if request.param == "prometheus":
            s = stack.enter_context(alert_stack(work / "stack", exporter.url, interval="1s"))
            s.wait_scraping()
            live, diagnose = Live(s.prom_url), s.diagnose
        else:
            listener = WebhookListener().start()
            stack.callback(listener.stop)
            token = work / "webhook-token"
            token.write_text("dashboards\n")
            _, am_url, _ = start_alertmanager(stack, work, listener.url("/"), token)
            vs = stack.enter_context(victoria_stack(work / "victoria", exporter.url, am_url))
            live, diagnose = Live(vs.store_url), vs.logs

        # Data that takes a few evaluations: the cards, the recording rules, and two samples
        # of the ticking counters inside the 1m rate window.
        def ready() -> bool:
            return all(live.result(q) for q in (
                f'ALERTS{{alertstate="firing",severity="critical",run="{TRAINING_RUN}"}}',
                f'ALERTS{{alertstate="firing",severity="warning",run="{TRAINING_RUN}"}}',
                f'ALERTS{{alertstate="firing",alertname="GRPORankStraggler",run="{CLUSTER_RUN}"}}',
                'run_rank_key:grpo_window_mean:ratio_baseline{key="kl/mean"}',
                "run_rank:grpo_step:lag",
                "run_rank:grpo_forecast_reward_headroom:ratio",
                "run_rank:grpo_forecast_entropy_floor:steps",
                "rate(grpo_gpu_nvlink_errors_total[1m]) > 0",
                "rate(grpo_gpu_pcie_replay_errors_total[1m]) > 0",
                "rate(grpo_gpu_xid_errors_total[1m]) > 0",
            ))

        wait_for(ready, 90, interval=0.5, what=f"cards, recording rules and GPU rates in {request.param}",
                 diagnose=diagnose)
        yield live


@pytest.mark.parametrize("q", queries(), ids=lambda q: f"{q.dashboard}:{q.where}:{q.ref}")
def test_query_returns_series(live: Live, q: Query) -> None:
    run = RUN_FOR.get(q.dashboard, TRAINING_RUN)
    promql = substitute(q.expr, run)
    body = live.query(promql)
    assert body.get("status") == "success", f"{q}\n-> {promql}\n{body}"
    assert body["data"]["result"], f"no series: {q}\n-> {promql} (run {run!r})"


def test_every_dashboard_has_queries() -> None:
    per = {uid: 0 for uid in EXPECTED_UIDS.values()}
    for q in queries():
        per[q.dashboard] = per.get(q.dashboard, 0) + 1
    assert all(per.values()), per


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_variable_queries_return_values(live: Live, name: str) -> None:
    """label_values(metric{...}, label) as Grafana runs it: /api/v1/label/<label>/values."""
    d = load(DASHBOARDS / name)
    run = RUN_FOR[d.uid]
    for v in d.templating.list:
        if v.type != "query":
            continue
        text = v.query.query if isinstance(v.query, VariableQuery) else v.query
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", text)
        assert m, f"{name}: variable {v.name} is no label_values(): {text}"
        values = live.label_values(m.group(2), substitute(m.group(1), run))
        assert values, f"{name}: variable {v.name} ({text}) has no values"
        if v.name == "run":
            assert {TRAINING_RUN, CLUSTER_RUN} <= set(values)
        if v.name == "rank":
            assert set(values) == {"0", "1", "2", "3"}


def test_panels_show_the_sickness(live: Live) -> None:
    """Not only data, the right data: the KL-explosion run lights the red-card stat and its KL
    crosses the red line; the straggler run's rank 3 sits above the straggler line."""
    d = load(DASHBOARDS / "grpo-training.json")
    by_title = {p.title: p for p in d.all_panels()}
    red = live.result(substitute(by_title["Red cards firing"].targets[0].expr, TRAINING_RUN))
    assert float(red[0]["value"][1]) >= 1
    ratio = by_title["KL ratio to baseline"].targets
    value = live.result(substitute(ratio[0].expr, TRAINING_RUN))
    line = live.result(substitute(ratio[1].expr, TRAINING_RUN))
    assert float(value[0]["value"][1]) > float(line[0]["value"][1])

    c = load(DASHBOARDS / "grpo-cluster.json")
    straggler = next(p for p in c.all_panels() if p.title == "Straggler view").targets
    ranks = {r["metric"]["rank"]: float(r["value"][1])
             for r in live.result(substitute(straggler[0].expr, CLUSTER_RUN))}
    limit = float(live.result(substitute(straggler[1].expr, CLUSTER_RUN))[0]["value"][1])
    assert ranks["3"] > limit and all(v < limit for r, v in ranks.items() if r != "3"), ranks


def test_rollout_and_forecast_panels_show_the_run(live: Live) -> None:
    """The right data on the new rows: the run's healthy rollout engine sits on the healthy side
    of the mismatch lines, and its dead groups split into the two causes; the law, evaluated at
    the run's entropy, sits under its ceiling and near the reward it fits; the fit is trusted,
    some headroom is left and entropy is falling towards its floor."""
    d = load(DASHBOARDS / "grpo-training.json")
    by_title = {p.title: p for p in d.all_panels()}

    def value(expr: str) -> float:
        [series] = live.result(substitute(expr, TRAINING_RUN))
        return float(series["value"][1])

    end = int(time.time())

    def timestamps(expr: str) -> set[float]:
        [series] = live.range_result(substitute(expr, TRAINING_RUN), end - 10, end)
        return {t for t, _ in series["values"]}

    kl = {t.refId: t.expr for t in by_title["Rollout–trainer KL"].targets}
    assert value(kl["A"]) < value(kl["C"])  # under the level mismatch_kl
    assert value(kl["A"]) < value(kl["D"])  # and under initial x mismatch_rise_ratio
    ess = [value(t.expr) for t in by_title["Importance-weight ESS"].targets]
    assert ess[0] > ess[1], ess  # over mismatch_ess_ratio
    wrong, right, dead, _ = [value(t.expr) for t in by_title["Dead groups by cause"].targets]
    assert wrong + right == pytest.approx(dead) and wrong > 0 and right > 0

    xy = {t.legendFormat: t.expr for t in forecast_chart(d).targets}
    # The chart's join on the time gives rows that hold all four fields: Grafana runs a panel's
    # queries over one time range and step, so their points share timestamps.
    times = [timestamps(e) for e in xy.values()]
    assert set.intersection(*times), times
    law, ceiling, reward = value(xy["law"]), value(xy["ceiling"]), value(xy["reward"])
    assert law < ceiling
    assert abs(law - reward) < 0.05, (law, reward)
    r2 = [value(t.expr) for t in by_title["Law fit R²"].targets]
    assert r2[0] >= r2[1], r2  # R² of the fit, least R² the ceiling card trusts
    headroom = value(by_title["Headroom left"].targets[0].expr)
    assert 0 < headroom < 1
    assert value(by_title["Steps to the entropy floor"].targets[0].expr) > 0

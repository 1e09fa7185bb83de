"""The declared card branches (contract/card_logic.py): one declaration, the rule and the report.

The rule file's expression of each declared branch is rendered from its declaration (`make
docs`; tests/test_thresholds.py holds the committed file fresh). Here: what a declaration renders
reads only series the exporter publishes; the report's inputs of a declared branch are the very
values the exporter's exposition carries at the same step; a declared branch missing from the
rule file is an error, not a silent skip. Parity of the two on runs is held by
tests/test_real_run_verdicts.py, tests/test_report_parity.py and tests/test_scenarios.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from promtool_harness import alerts

from grpo_monitor.contract import card_logic
from grpo_monitor.contract.card_logic import AnyOf, Level, Line, above, below
from grpo_monitor.contract.cards import CARDS
from grpo_monitor.runtime import signals
from grpo_monitor.runtime.health import ExporterHealth
from grpo_monitor.runtime.ingest import Ingestor
from grpo_monitor.runtime.store import RunStore
from grpo_monitor.tools.report import declared, load_run
from grpo_monitor.tools.simulate import write_run

DECLARED = card_logic.declared()


def test_the_catalog_declares_the_level_branches() -> None:
    # The cards whose every branch is declared; a branch declared elsewhere in the catalog would
    # land here too, and so be rendered and judged.
    whole = {c.name for c in CARDS if all(b.logic is not None for b in c.branches)}
    assert {"GRPOCompletionsTruncated", "GRPORolloutMismatch", "GRPOStaleRollouts",
            "GRPOPromptsTooHard", "GRPOPromptsTooEasy", "GRPOGradNormSpike",
            "GRPORolloutMismatchRising", "GRPOEntropyRebound", "GRPORewardStdRising"} <= whole
    assert len(DECLARED) >= 19


@pytest.mark.parametrize("branch", sorted(DECLARED), ids=lambda b: f"{b[0]}-{b[1] or 'main'}")
def test_a_declared_branch_reads_what_the_exporter_publishes(branch: tuple[str, str]) -> None:
    logic = DECLARED[branch]
    published = {"p10": {(w, 0) for w in signals.TRAINING_PERCENTILES},
                 "p90": {(w, 0) for w in signals.TRAINING_PERCENTILES},
                 "mean": set(signals.TRAINING_MEANS), "slope": {(w, 0) for w in signals.SLOPE_WINDOWS},
                 **{f"records_{s}": {(c, o) for c, o, _ in signals.PUBLISHED_RECORD_WINDOWS}
                    for s in ("min", "max", "median")}}
    for key, feature, window, offset in declared.inputs(logic):
        if feature in published:
            assert (window, offset) in published[feature], (key, feature, window, offset)
        if feature.startswith("trend"):
            assert key in signals.TREND_KEYS
        if feature.startswith("records"):
            assert key in signals.RECORD_KEYS
    # The keys its branches (a rule may read either of two sets, a branch each) list: what it
    # reads, those whose presence hands the run to another branch, and those read through a
    # derived feature.
    card = next(c for c in CARDS if c.name == branch[0])
    listed = {k for b in card.branches if b.reason == branch[1]
              for k in (*b.keys, *b.unless_logged, *b.indirect)}
    assert listed == set(logic.keys)
    # The rule as loaded is the rendering (the file is written from it).
    rule = next(r for r in alerts() if r["alert"] == branch[0]
                and r.get("labels", {}).get("reason", "") == branch[1])
    assert rule["expr"] == card_logic.expression(logic, *branch)


def test_the_renderings_shapes() -> None:
    with_reference = Level("grad/norm", 50, (above("grad_norm_spike_ratio", "baseline"),),
                           baseline=True).promql()
    assert with_reference == (
        'max without (window_steps) (\n'
        '  grpo_window_p10{key="grad/norm",window_steps="50"}\n'
        '    > on(run, rank, key) group_left()\n'
        '  (grpo_baseline_mean{key="grad/norm"} * on() group_left() grpo:threshold:grad_norm_spike_ratio)\n'
        ')\nand on(run, rank) run_rank:grpo_baseline_ready:training\n')
    constant = Level("reward/std", 20, (Line("p90", "<=", constant=0),)).promql()
    assert constant == ('max without (key, window_steps) (\n'
                        '  grpo_window_p90{key="reward/std",window_steps="20"} <= 0\n)\n')
    # Lines and gates: the gates inside the maximum, each matched on the signal's own labels.
    gated = Level("entropy/mean", 20, (above("entropy_rebound_ratio", "floor"),), gates=(
        Line("floor", "<", "entropy_rebound_floor_ratio", reference="initial"),)).promql()
    assert gated == (
        'max without (window_steps) (\n'
        '  grpo_window_p10{key="entropy/mean",window_steps="20"}\n'
        '    > on(run, rank, key) group_left()\n'
        '  (grpo_run_window_mean_min{key="entropy/mean"} * on() group_left() grpo:threshold:entropy_rebound_ratio)\n'
        '  and on(run, rank, key)\n'
        '  (\n'
        '    grpo_run_window_mean_min{key="entropy/mean"}\n'
        '      < on(run, rank, key) group_left()\n'
        '    (grpo_initial_mean{key="entropy/mean"} * on() group_left() grpo:threshold:entropy_rebound_floor_ratio)\n'
        '  )\n)\n')
    with pytest.raises(ValueError):
        Line("p10", ">")
    with pytest.raises(ValueError):
        Line("p10", ">", constant=1, reference="initial")
    with pytest.raises(ValueError):
        Level("kl/mean", 0, (above("kl_early_level"),))
    # Several keys: selected by a regular expression, each judged on its own (the key stays).
    several = Level(("mismatch/kl", "mismatch/k3_kl"), 20, (above("mismatch_kl"),)).promql()
    assert several.startswith('max without (window_steps) (\n'
                              '  grpo_window_p10{key=~"mismatch/kl|mismatch/k3_kl",window_steps="20"}\n')
    # Levels of different signals, any one firing: each without its key, the baseline outside.
    either = AnyOf((Level("a/x", 50, (above("kl_early_level"),)),
                    Level("b/y", 50, (below("kl_early_level", "baseline"),))), baseline=True).promql()
    assert either.count("max without (key, window_steps) (") == 2
    assert either.startswith("(\n") and either.endswith(")\nand on(run, rank) run_rank:grpo_baseline_ready:training\n")
    with pytest.raises(ValueError):
        AnyOf((Level("a/x", 50, (above("kl_early_level"),), baseline=True),))


def test_a_branch_in_words_quotes_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from grpo_monitor.contract.thresholds import THRESHOLDS

    rising = DECLARED["GRPORolloutMismatchRising", ""]
    assert rising.words() == "50-step p10 > 2x initial and p10 > 0.001 and slope > 0"
    monkeypatch.setitem(THRESHOLDS, "mismatch_rise_ratio",
                        replace(THRESHOLDS["mismatch_rise_ratio"], value=3))
    assert rising.words().startswith("50-step p10 > 3x initial")
    assert DECLARED["GRPOAdvantageVanishing", ""].words() == (
        "group/zero_std_frac 50-step p10 > 0.5 or adv/mean_abs 50-step p90 < 0.2x baseline "
        "(after the baseline)")


def test_a_declared_branch_without_its_rule_in_the_file_is_an_error() -> None:
    for target in card_logic.TARGETS:  # the cluster file's declared straggler too
        assert card_logic.render(target.read_text(), target) == target.read_text(), target
    text = card_logic.TARGET.read_text()
    # An edited expression is written back from its declaration.
    edited = text.replace('grpo_window_p10{key="staleness/mean",window_steps="20"}',
                          'grpo_window_p10{key="staleness/mean",window_steps="50"}')
    assert edited != text and card_logic.render(edited) == text
    # So is each description's raised-at sentence, where it was dropped.
    sentence = card_logic.raised_sentence("GRPOStaleRollouts", "")
    assert text.count(sentence) == 1 and card_logic.render(text.replace(sentence, "")) == text
    every = "".join(t.read_text() for t in card_logic.TARGETS)
    assert all(card_logic.raised_sentence(*branch) in every for branch in card_logic.declared())
    gone = re.sub(r"      - alert: GRPOStaleRollouts\n(?:        .*\n)+", "", text)
    with pytest.raises(ValueError, match="GRPOStaleRollouts"):
        card_logic.render(gone)


def _exposition(root: Path) -> dict[str, float]:
    store = RunStore()
    ingestor = Ingestor(root, store, ExporterHealth())
    ingestor.scan_folder(root / "run")
    store.flush()
    out = {}
    for line in "".join(store.render()).splitlines():
        if not line.startswith("#") and ('rank="0"' in line):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _heldout_run(root: Path) -> int:
    """A run that logs a held-out score every 10 steps, rising then falling, beside its reward
    and entropy (the over-optimisation card's and the law's inputs)."""
    from grpo_monitor.sdk.writer import SnapshotWriter

    writer = SnapshotWriter(root, "run", rank=0)
    for step in range(1, 301):
        metrics = {"reward/mean": 0.2 + step / 600, "entropy/mean": 1.5 - step / 400,
                   "kl/mean": 0.01 + step / 10_000}
        if step % 10 == 0:
            metrics["eval/heldout_score"] = 0.3 + step / 500 if step < 200 else 0.9 - step / 400
        writer.log(metrics, step)
    writer.close()
    return 300


@pytest.mark.parametrize("scenario", ["entropy_collapse", "grad_norm_spike", "dead_signal",
                                      "entropy_rebound", "reward_std_rising", "mismatch_rising",
                                      "blow_up", "kl_growth", "kl_tail", "reward_ceiling",
                                      "reward_hacking", "length_bias", "heldout",
                                      "step_time_drift", "throughput_drop"])
def test_the_reports_readings_are_the_exporters_series(scenario: str, tmp_path: Path) -> None:
    # Every declared reading of a key the run logs, at its last step: a value exactly where the
    # exposition has the series, and the series' value.
    if scenario == "heldout":
        steps = _heldout_run(tmp_path)
    else:
        steps = write_run(tmp_path, "run", scenario, steps=420 if scenario == "kl_growth" else 260,
                          ranks=1)
    data = load_run(tmp_path / "run")
    if scenario in ("step_time_drift", "throughput_drop"):  # rank 0's performance readings
        perf = data.perf_readings[0]
        last = max(perf)
        taken = dict(zip(declared.PERF_READINGS, perf[last]))
    else:
        last = max(data.readings)
        taken = dict(zip(declared.READINGS, data.readings[last]))
    assert last == steps - 1 or last == steps
    series = _exposition(tmp_path)
    logged = {k for k in {r[0] for r in taken} if any(f'key="{k}"' in n for n in series)}
    compared = 0
    for (key, feature, window, offset), value in taken.items():
        if feature == "ready":
            name = next(n for n in series if n.startswith("grpo_baseline_ready{"))
            assert (series[name] == 1) == (value == 1), (series[name], value)
            continue
        if key not in logged or declared.is_across(declared.Reading(key, feature, window, offset)):
            assert math.isnan(value), (key, feature)  # across ranks: the report fills it in
            continue
        metric = card_logic.EXPR_SERIES[feature]
        if feature in card_logic.RANK_SERIES:
            labels = []
        else:
            selector = card_logic.Series(feature, key, window, offset).render()
            labels = selector[selector.index("{") + 1:selector.index("}")].split(",")
        match = [v for n, v in series.items() if n.startswith(metric + "{")
                 and all(lb in n for lb in labels)]
        if feature == "least_growth":  # the least of the windows' growths
            match = [min(match)] if match else []
        assert match == ([] if math.isnan(value) else [pytest.approx(value)]), (key, feature, window, match)
        compared += bool(match)
    assert compared >= 2, taken


@pytest.mark.filterwarnings("ignore:.*maps to no signal the cards read")  # unknown on purpose
def test_the_readings_of_any_key_are_the_exporters_series(tmp_path: Path) -> None:
    # The NaN / Inf counts and their streaks' first steps, of every key that has one (a key the
    # trainer made up too): exactly the grpo_window_nonfinite* series the exposition has.
    from grpo_monitor.sdk.writer import SnapshotWriter

    writer = SnapshotWriter(tmp_path, "run", rank=0)
    for step in range(1, 121):
        writer.log({"reward/mean": 0.5, "loss/policy": math.nan if 70 <= step < 75 else 0.1,
                    "my_team/odd_signal": math.inf if step >= 90 else 1.0,
                    "kl/mean": math.nan if step == 10 else 0.01}, step)
    writer.close()
    data = load_run(tmp_path / "run")
    taken = {key: dict(zip(declared.ANY_READINGS, values))
             for key, values in data.any_readings[max(data.readings)].items()}
    series = _exposition(tmp_path)
    published: dict[str, dict[str, float]] = {}
    for name, value in series.items():
        for feature, metric in card_logic.ANY_KEY_SERIES.items():
            if name.startswith(metric + "{"):
                key = re.search(r'key="([^"]+)"', name).group(1)  # type: ignore[union-attr]
                published.setdefault(key, {})[feature] = value
    assert set(published) == {"loss/policy", "my_team/odd_signal"}  # kl's NaN is 110 steps old
    assert {k: {r.feature: v for r, v in by.items()} for k, by in taken.items()} == published
    assert published["my_team/odd_signal"]["nonfinite_since"] == 90
    # The card names both, each with the step its streak began.
    steps = sorted(data.readings)
    anys = declared.type_tables(steps, data.any_readings, declared.ANY_READINGS)
    found = declared.judge(steps, declared.table(steps, data.readings), "GRPONonFiniteValues",
                           anys=anys)[card_logic.NO_KEY]
    assert found is not None
    assert found["steps"] == [10, 120] and found["since_step"] == {
        "kl/mean": 10, "loss/policy": 70, "my_team/odd_signal": 90}


def test_an_expressions_rendering_and_refusals() -> None:
    from grpo_monitor.contract.card_logic import Agg, Const, Func, Held, Rule, Series, Threshold

    mean, base = Series("mean", "kl/max", 50, 0), Series("baseline", "kl/max")
    # The same keys match on the key; a ratio of two keys on the rank; a threshold on nothing.
    assert (mean / base).render() == ('grpo_window_mean{key="kl/max",window_steps="50",offset_steps="0"}\n'
                                      '  / on(run, rank, key) group_left() grpo_baseline_mean{key="kl/max"}')
    other = Series("mean", "kl/p95", 50, 0)
    assert "/ on(run, rank) group_left()" in (mean / other).render()
    # A comparison with a threshold reads it as a scalar; arithmetic matches it as a vector.
    assert (mean > Threshold("kl_tail_ratio")).render().endswith("> scalar(grpo:threshold:kl_tail_ratio)")
    assert (mean * Threshold("kl_tail_ratio")).render().endswith(
        "* on() group_left() grpo:threshold:kl_tail_ratio")
    # An or of two keyed sides is their union, key by key; of keyless ones, on the rank.
    either = Series("p10", "a/x", 20) | Series("p10", "b/y", 20)
    assert "or on(run, rank, key)" in either.render() and either.keys == ("a/x", "b/y")
    assert "or on(run, rank)\n" in (Agg("max", mean) | Agg("max", other)).render()
    # A hold reads the branch's own firing; the baseline gate is outside.
    held = Rule(Agg("max", (mean > Const(1)) & Held()), baseline=True).promql("GRPOX", "r")
    assert 'ALERTS{alertname="GRPOX",alertstate="firing",reason="r"}' in held
    assert held.endswith("and on(run, rank) run_rank:grpo_baseline_ready:training\n")
    assert Func("sqrt", Threshold("heldout_smooth_points")).scalar
    with pytest.raises(ValueError):  # many-to-many: the right side carries several keys
        _ = Series("mean", "a/x", 50) / Series("mean", ("b/y", "c/z"), 50)
    with pytest.raises(ValueError):  # a threshold filtered by a vector
        _ = Threshold("kl_tail_ratio") > mean
    with pytest.raises(ValueError):
        Series("p10", "a/x")  # a window statistic needs its window
    with pytest.raises(ValueError):
        Threshold("no_such_threshold")
    with pytest.raises(ValueError):
        Rule(Threshold("kl_tail_ratio") * Const(2))


def test_a_hold_is_judged_on_the_step_before() -> None:
    # Raised where the 20-step p10 crosses 1, held while the 50-step mean stays over 0.5: the
    # report walks the steps as the rule engine's evaluations do.
    from grpo_monitor.contract.card_logic import Agg, Held, Rule, Series

    rule = Rule(Agg("max", (Series("p10", "kl/mean", 20) > 1)
                    | ((Series("mean", "kl/mean", 50) > 0.5) & Held())))
    p10 = [0.0, 2.0, 0.0, 0.0, 0.0, 2.0, 0.0]
    mean = [0.0, 0.0, 0.9, 0.9, 0.1, 0.0, 0.9]
    columns = {declared.Reading("kl/mean", "p10", 20): 0, declared.Reading("kl/mean", "mean", 50): 1}
    found = declared._judge_rule(list(range(1, 8)), np.array([p10, mean]).T, rule, columns, {}, {})
    # Steps 2 (raised), 3 and 4 (held), not 5 (the mean fell), 6 (raised again), 7 (held).
    assert found is not None
    assert found["steps"] == [2, 7] and found["steps_flagged"] == 5


def test_the_reports_prompt_type_readings_are_the_exporters_series(tmp_path: Path) -> None:
    # Each prompt type's readings at the last step: the exposition's series of that type.
    steps = write_run(tmp_path, "run", "shortcut_learning", steps=300, ranks=1)
    data = load_run(tmp_path / "run")
    last = max(data.type_readings)
    assert last in (steps - 1, steps)
    series = _exposition(tmp_path)
    compared = 0
    for ptype, values in data.type_readings[last].items():
        for r, value in zip(declared.TYPE_READINGS, values):
            selector = card_logic.Series(r.feature, r.key, r.window, r.offset).render()
            metric, labels = selector.split("{")[0], selector[selector.index("{") + 1:-1].split(",")
            match = [v for n, v in series.items() if n.startswith(metric + "{")
                     and f'prompt_type="{ptype}"' in n and all(lb in n for lb in labels)]
            assert match == ([] if math.isnan(value) else [pytest.approx(value)]), (ptype, r, match)
            compared += bool(match)
    assert compared >= 6, data.type_readings[last]

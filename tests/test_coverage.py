"""Never blind without saying so: which cards each run is armed for, and why the others are not.

The card declarations (contract/cards.py) are checked against the rules they describe; the armed
table is checked on the shared real runs against what each logs, and on the key sets of TRL
(with and without KL), verl and OpenRLHF, on a 150-step run and on a typo, through the real
exporter (HTTP), ``grpo-monitor check``, the SDK's warning and the coverage card in promtool.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from conftest import Running, value
from grpo_monitor.contract.cards import (CARDS, CARDS_BY_NAME, COVERAGE, MINIMUM_CURVES, Armed,
                                         Card, RunShape, arm, disarmed_by)
from grpo_monitor.contract.keys import SIGNALS_BY_KEY, canonical_key, closest_names
from grpo_monitor.sdk.writer import SnapshotWriter, UnknownKeyWarning
from grpo_monitor.tools.check import read
from promtool_harness import Check, Recorder, alerts, check_cards
from real_runs import load, run_names, write_snapshots

ROOT = Path(__file__).resolve().parents[1]


# -- the declarations are the rules' --------------------------------------------------------------


def rule_keys(expr: str) -> set[str]:
    """The canonical keys a rule's expression selects (``key="..."`` and ``key=~"..."``)."""
    found: set[str] = set()
    for op, pattern in re.findall(r'key(=~?)"([^"]+)"', expr):
        found |= {pattern} if op == "=" else {k for k in SIGNALS_BY_KEY if re.fullmatch(pattern, k)}
    if "grpo_heldout_" in expr:  # the held-out score's own features carry no key label
        found.add("eval/heldout_score")
    return found


def declaration_problems(rules: list[dict[str, Any]], cards: tuple[Card, ...]) -> list[str]:
    """Where the rules and the card declarations disagree: an alert without a card (or the
    other way round), a rule reading a key its branches do not list (or not reading one they
    do), a baseline, prompt-type or GPU dependence not declared."""
    by_name = {c.name: c for c in cards}
    problems = [f"{n}: declared but no rule" for n in sorted(by_name.keys() - {r["alert"] for r in rules})]
    for rule in rules:
        name, reason = rule["alert"], rule["labels"].get("reason", "")
        card = by_name.get(name)
        if card is None:
            problems.append(f"{name}: a rule without a declaration")
            continue
        if card.severity != rule["labels"]["severity"]:
            problems.append(f"{name}: declared {card.severity}, the rule says {rule['labels']['severity']}")
        if card.rule_file == COVERAGE:
            continue  # written from the same module (MISSING_CAUSES), and checked for freshness
        branches = [b for b in card.branches if b.reason == reason]
        if not branches:
            problems.append(f"{name}: no branch for reason {reason!r}")
            continue
        declared = set().union(*(set(b.keys) | set(b.unless_logged) for b in branches))
        read = rule_keys(rule["expr"])
        if read != declared:
            problems.append(f"{name} ({reason or 'no reason'}): reads {sorted(read)}, declares {sorted(declared)}")
        expr = " ".join(rule["expr"].split())
        # A rule waits for the baseline by joining the readiness, or by reading a baseline mean
        # or a window's ratio to it: the exporter publishes them only once the rank's baseline is
        # ready.
        waits = ("and on(run, rank) grpo_baseline_ready == 1" in expr
                 or "and on(run, rank) run_rank:grpo_baseline_ready:training" in expr
                 or "grpo_baseline_mean{" in expr or "grpo_window_baseline_ratio{" in expr)
        if waits != any(b.baseline for b in branches):
            problems.append(f"{name} ({reason or 'no reason'}): baseline {waits} in the rule")
        if ("grpo_prompt_type_" in expr) != any(b.prompt_types for b in branches):
            problems.append(f"{name}: prompt types")
        if ("grpo_gpu_" in expr) != any(b.gpu for b in branches):
            problems.append(f"{name}: GPUs")
    return problems


def test_every_rule_reads_what_its_card_declares() -> None:
    assert declaration_problems(alerts(), CARDS) == []


def test_a_rule_reading_an_undeclared_signal_is_caught() -> None:
    rules = alerts()
    drifted = [dict(r) for r in rules]
    i = next(i for i, r in enumerate(drifted) if r["alert"] == "GRPOGradNormSpike")
    drifted[i]["expr"] += ' and on(run, rank) grpo_window_mean{key="loss"}'
    assert declaration_problems(drifted, CARDS) == [
        "GRPOGradNormSpike (no reason): reads ['grad/norm', 'loss'], declares ['grad/norm']"]
    assert declaration_problems(rules, CARDS[1:]) == [f"{CARDS[0].name}: a rule without a declaration"]


def test_the_minimum_curves_disarm_the_cards_that_need_only_them() -> None:
    assert disarmed_by("kl/mean") == ["GRPOKLExplosion", "GRPOKLGrowthAccelerating"]
    assert disarmed_by("grad/norm") == ["GRPOGradNormSpike"]
    # The runbook's section lists them: the same names, or the section has drifted.
    section = (ROOT / "docs" / "runbook.md").read_text().split("## GRPOSignalMissing", 1)[1].split("\n## ")[0]
    for key, label in zip(MINIMUM_CURVES, ("reward", "KL", "entropy", "response length", "grad norm")):
        line = next(ln for ln in section.splitlines() if ln.startswith(f"- {label}: "))
        assert line == f"- {label}: " + ", ".join(disarmed_by(key)), line


# -- arming -----------------------------------------------------------------------------------


def test_arming_states_each_reason() -> None:
    one = RunShape(key_ranks={"kl/mean": 1, "reward/mean": 1}, ranks=1, baseline_steps_to_go=50)
    assert arm(CARDS_BY_NAME["GRPOKLExplosion"], one).reason == "armed"  # before the baseline too
    assert arm(CARDS_BY_NAME["GRPOKLGrowthAccelerating"], one) == Armed(
        CARDS_BY_NAME["GRPOKLGrowthAccelerating"], "baseline_pending", steps_to_go=50)
    missing = arm(CARDS_BY_NAME["GRPOEntropyCollapse"], one)
    assert (missing.reason, missing.needs) == ("missing_signal", ("entropy/mean",))
    assert arm(CARDS_BY_NAME["GRPORankStalled"], one).reason == "not_applicable"
    assert arm(CARDS_BY_NAME["GRPORankStalled"], RunShape(ranks=2)).reason == "armed"
    # Three of five: the blow-up card is armed on a run logging KL, length and reward alone.
    three = RunShape(key_ranks={"kl/mean": 1, "reward/mean": 1, "response/len_mean": 1})
    assert arm(CARDS_BY_NAME["GRPOTrainingBlowUp"], three).reason == "armed"
    # KL and reward: the trend path (the reward falling steadily while KL climbs) arms it; the
    # reward alone arms nothing of it, and every other key it reads is named.
    assert arm(CARDS_BY_NAME["GRPOTrainingBlowUp"], one).reason == "armed"
    assert arm(CARDS_BY_NAME["GRPOTrainingBlowUp"], RunShape(key_ranks={"reward/mean": 1})).needs == (
        "entropy/mean", "kl/mean", "grad/norm", "response/len_mean", "response/clip_ratio")
    # A path for runs that log less is not applicable where they log more: the mean-only reward
    # collapse hands a run that logs the spread to the spread's rule.
    spread = RunShape(key_ranks={"reward/mean": 1, "reward/std": 1})
    assert arm(CARDS_BY_NAME["GRPORewardCollapse"], spread).reason == "armed"
    mean_only = next(b for b in CARDS_BY_NAME["GRPORewardCollapse"].branches if b.reason == "mean_only")
    only_mean = CARDS_BY_NAME["GRPORewardCollapse"].__class__(
        "X", "critical", "grpo-alerts.yml", (mean_only,))
    assert arm(only_mean, spread).reason == "not_applicable"
    assert "the run logs reward/std" in arm(only_mean, spread).why
    assert arm(only_mean, RunShape(key_ranks={"reward/mean": 1})).reason == "armed"
    # The armed table says which paths judge a run: the mean alone, or the spread's rule.
    assert arm(CARDS_BY_NAME["GRPORewardCollapse"], RunShape(key_ranks={"reward/mean": 1})).paths == ("mean_only",)
    assert arm(CARDS_BY_NAME["GRPORewardCollapse"], spread).paths == ("",)
    assert arm(CARDS_BY_NAME["GRPOTrainingBlowUp"], one).paths == ("trend",)
    # Alternatives: any one of the mismatch signals arms the card; none: all are named.
    assert arm(CARDS_BY_NAME["GRPORolloutMismatch"], RunShape(key_ranks={"mismatch/is_ess_ratio": 1})).reason == "armed"
    assert arm(CARDS_BY_NAME["GRPORolloutMismatch"], one).needs == (
        "mismatch/kl", "mismatch/chi2_token", "mismatch/is_weight_mean", "mismatch/is_ess_ratio")
    # Straggler: three ranks that log their step time.
    assert arm(CARDS_BY_NAME["GRPORankStraggler"], RunShape(key_ranks={"perf/step_time_s": 2}, ranks=2)).reason == "not_applicable"
    assert arm(CARDS_BY_NAME["GRPORankStraggler"], RunShape(key_ranks={"perf/step_time_s": 3}, ranks=3)).reason == "armed"


def _logged(records: list[dict[str, Any]]) -> set[str]:
    return {key for rec in records for name, v in rec.items()
            if isinstance(v, (int, float)) and (key := canonical_key(name)) is not None}


@pytest.mark.parametrize("name", run_names())
def test_each_real_runs_armed_table_matches_what_it_logs(name: str, tmp_path: Path) -> None:
    records = load(name)
    write_snapshots(records, tmp_path, name)
    store, _ = read(tmp_path)
    (run,) = store.runs()
    logged = _logged(records)
    steps = len({r["step"] for r in records})
    assert {a.card.name for a in run.armed} == {c.name for c in CARDS}
    for a in run.armed:
        if a.reason == "missing_signal":
            assert a.needs and not set(a.needs) & logged, (a.card.name, a.needs)
        elif a.reason == "armed":
            assert a.card.always or any(len(set(b.keys) & logged) >= b.needed
                                        for b in a.card.branches), a.card.name
        elif a.reason == "baseline_pending":
            assert steps < 200 or records[0]["step"] + 200 > records[-1]["step"], a.card.name
        else:  # one rank, no prompt types, no GPU: every shared run is one such
            assert a.reason == "not_applicable" and a.why, a.card.name
    minimum = {k for k in MINIMUM_CURVES if k in run.key_ranks}
    assert minimum == set(MINIMUM_CURVES) & logged


def test_the_real_runs_say_what_they_are_not_watched_for(tmp_path: Path) -> None:
    tables = {}
    for name in ("unsloth-llama32-3b-grpo-gsm8k-500", "trl-dapo-qwen25vl-3b-aokvqa-collapse",
                 "verl-ppo-qwen25-05b-gsm8k", "memredteam-qwen25-3b-grpo-sparse-reward"):
        write_snapshots(load(name), tmp_path / name, name)
        store, _ = read(tmp_path / name)
        (run,) = store.runs()
        tables[name] = (run.framework, {a.card.name: a for a in run.armed})
    framework, unsloth = tables["unsloth-llama32-3b-grpo-gsm8k-500"]
    assert framework == "trl"
    assert unsloth["GRPOEntropyCollapse"].needs == ("entropy/mean",)
    assert unsloth["GRPOGradNormSpike"].needs == ("grad/norm",)
    assert unsloth["GRPOKLExplosion"].reason == "armed"
    _, dapo = tables["trl-dapo-qwen25vl-3b-aokvqa-collapse"]
    assert dapo["GRPOKLExplosion"].needs == ("kl/mean",)
    framework, verl = tables["verl-ppo-qwen25-05b-gsm8k"]
    assert framework == "verl" and verl["GRPOKLExplosion"].reason == verl["GRPOGradNormSpike"].reason == "armed"
    # Steps 1..100: the baseline period is steps 1..200, judged from step 201 on.
    _, short = tables["memredteam-qwen25-3b-grpo-sparse-reward"]
    assert (short["GRPOGradNormSpike"].reason, short["GRPOGradNormSpike"].steps_to_go) == ("baseline_pending", 101)
    assert short["GRPORankStalled"].why == "compares 2 ranks or more, the run has 1"


# -- framework key sets through the exporter and the coverage card ------------------------------

TRL = {"reward": 0.5, "reward_std": 0.3, "frac_reward_zero_std": 0.1, "entropy": 0.8,
       "completions/mean_length": 120.0, "completions/clipped_ratio": 0.0,
       "clip_ratio/region_mean": 0.01, "grad_norm": 0.4, "learning_rate": 1e-6, "loss": 0.01}
# verl logs the reward's mean, min and max (no spread) under critic/score/*.
VERL = {"critic/score/mean": 0.5, "critic/score/min": 0.0, "critic/score/max": 1.0,
        "actor/kl_loss": 0.01, "actor/entropy": 0.8,
        "response_length/mean": 300.0, "actor/grad_norm": 0.5, "actor/pg_loss": 0.0}
OPENRLHF = {"policy_loss": 0.1, "kl": 0.01, "reward": 0.5, "return": 0.4,
            "response_length": 200.0, "total_length": 400.0, "actor_lr": 1e-6}
SIGNAL_MISSING = ',alertname="GRPOSignalMissing"'


def _play(records: dict[str, dict[str, Any]], steps: int, tmp_path: Path, *, verl: bool = False):
    """Each run's flat records (verl: its file logger's lines) for ``steps`` steps, scraped at each."""
    recorder = Recorder(tmp_path)
    paths = {}
    for step in range(1, steps + 1):
        for run, metrics in records.items():
            path = paths.setdefault(run, tmp_path / run / "metrics.jsonl")
            path.parent.mkdir(exist_ok=True)
            line = {"step": step, "data": metrics} if verl and run == "verl" else {"step": step, **metrics}
            with open(path, "a") as fh:
                fh.write(json.dumps(line) + "\n")
        recorder.scrape(step, list(paths.values()))
    return recorder


def test_framework_key_sets_raise_the_coverage_card_they_deserve(tmp_path: Path) -> None:
    runs = {"trl_kl": {**TRL, "kl": 0.02}, "trl_no_kl": TRL, "verl": VERL, "openrlhf": OPENRLHF}
    recorder = _play(runs, 25, tmp_path, verl=True)
    shapes = {run.name: run for run in recorder.store.runs()}
    assert {n: r.framework for n, r in shapes.items()} == {
        "trl_kl": "trl", "trl_no_kl": "trl", "verl": "verl", "openrlhf": ""}
    assert {n: sorted(set(MINIMUM_CURVES) - r.key_ranks.keys()) for n, r in shapes.items()} == {
        "trl_kl": [], "trl_no_kl": ["kl/mean"], "verl": [], "openrlhf": ["entropy/mean", "grad/norm"]}
    played = recorder.played()
    at_19 = played.scrape_steps.index(19)
    text = Check(len(played.scrape_steps) - 1, {"GRPOSignalMissing"}, now=True, only=SIGNAL_MISSING)
    check_cards(played, [
        # Not before 20 logged steps ...
        Check(at_19, set(), now=True, only=SIGNAL_MISSING),
        # ... then once per missing curve: TRL without KL in TRL's words, OpenRLHF in general ones.
        text,
        Check(len(played.scrape_steps) - 1, {"GRPOSignalMissing"}, now=True,
              only=SIGNAL_MISSING + ',run="trl_no_kl",key="kl/mean",reason="trl_beta_zero"'),
        Check(len(played.scrape_steps) - 1, {"GRPOSignalMissing"}, now=True,
              only=SIGNAL_MISSING + ',run="openrlhf",key="grad/norm",reason=""'),
        Check(len(played.scrape_steps) - 1, set(), now=True, only=SIGNAL_MISSING + ',run=~"trl_kl|verl"'),
    ], tmp_path)


def test_a_150_step_run_says_its_baseline_cards_wait(tmp_path: Path) -> None:
    with SnapshotWriter(tmp_path, "short", rank=0, world_size=1) as writer:
        for step in range(1, 151):
            writer.log({"reward/mean": 0.5, "kl/mean": 0.01, "entropy/mean": 1.0,
                        "response/len_mean": 100.0, "grad/norm": 1.0}, step)
    out = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "check", str(tmp_path / "short")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # Steps 1..150 of a 200-step baseline, and the writer closed (its end mark): the cards that
    # wait for the baseline will never judge this run, and check says so.
    assert re.search(r"GRPOGradNormSpike\s+yellow\s+baseline_pending: the run ended 51 steps "
                     r"before its baseline period was complete: never judged", out.stdout), out.stdout
    assert "minimum curves: reward/mean ok, kl/mean ok, entropy/mean ok" in out.stdout


# -- a typo is named everywhere -----------------------------------------------------------------


def test_a_typo_is_named_by_the_sdk_the_exporter_and_check(exporter: Running, snapshot_dir: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="grpo_monitor.runtime.store")
    writer = SnapshotWriter(snapshot_dir, "typo", rank=0, world_size=1)
    with pytest.warns(UnknownKeyWarning, match=r"'reward/meen' maps to no signal .*did you mean 'reward/mean'\?"):
        writer.log({"reward/meen": 0.5, "kl/mean": 0.01}, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per key: the second step warns nothing
        for step in range(2, 5):
            writer.log({"reward/meen": 0.5, "kl/mean": 0.01}, step)
    writer.close()
    quiet = SnapshotWriter(snapshot_dir, "quiet", rank=0, world_size=1, warn_unknown_keys=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet.log({"rewards/format": 1.0}, 1)
    quiet.close()

    exporter.wait_value("grpo_unknown_key_info", 1, run="typo", key="reward/meen", closest="reward/mean")
    samples = exporter.scrape()
    assert value(samples, "grpo_card_armed", run="typo", card="GRPORewardCollapse", severity="critical",
                 reason="missing_signal", needs="reward/mean,reward/std,reward/min,reward/max") == 0
    assert value(samples, "grpo_run_signal_logged", run="typo", key="reward/mean") == 0
    assert value(samples, "grpo_unknown_key_info", run="quiet", key="rewards/format", closest="") == 1
    named = [r.getMessage() for r in caplog.records if "reward/meen" in r.getMessage()]
    assert named == ["run typo logs 'reward/meen', which maps to no signal: did you mean 'reward/mean'? "
                     "It is exported as grpo_metric_value, and no card reads it"]

    out = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "check", str(snapshot_dir)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out  # typo's reward is missing
    assert "reward/meen  <- did you mean reward/mean?" in out.stdout
    assert "minimum curves: reward/mean missing" in out.stdout


def test_closest_names_are_typos_not_other_statistics() -> None:
    assert closest_names("reward/meen") == ["reward/mean"]
    assert closest_names("entorpy/mean") == ["entropy/mean"]
    assert closest_names("grad_nrom") == ["grad_norm"]
    # Names frameworks really log next to the ones mapped: other statistics, or far from any.
    for name in ("completions/min_length", "response_length/min", "clip_ratio/low_mean",
                 "timing_s/gen", "rewards/check_answer", "kl_coef", "epoch"):
        assert closest_names(name) == [], name


def test_check_says_what_a_folder_without_records_is(tmp_path: Path) -> None:
    empty = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "check", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
    missing = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "check", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=60)
    assert (empty.returncode, empty.stdout, empty.stderr.strip()) == (
        2, "", f"grpo-monitor check: no snapshot records in {tmp_path}")
    assert (missing.returncode, missing.stderr.strip()) == (2, f"grpo-monitor check: {tmp_path / 'nope'} is not a folder")



def test_the_report_says_what_it_could_not_judge(tmp_path: Path) -> None:
    from grpo_monitor.tools import report

    name = "unsloth-llama32-3b-grpo-gsm8k-500"
    write_snapshots(load(name), tmp_path, name)
    res = report.build_report(tmp_path / name, tmp_path / "out", plots=False)
    assert res["summary"]["missing_curves"] == ["entropy/mean", "grad/norm"]
    not_judged = {n["verdict"]: n for n in res["summary"]["not_judged"]}
    assert not_judged["entropy_collapse"] == {
        "verdict": "entropy_collapse", "card": "GRPOEntropyCollapse", "reason": "missing_signal",
        "why": "needs entropy/mean"}
    assert "kl_explosion" not in not_judged  # it logs KL, and 500 steps: judged
    assert "minimum curves never logged: entropy/mean, grad/norm (GRPOSignalMissing)" in res["text"]
    assert "  grad_norm_spike (GRPOGradNormSpike): missing_signal, needs grad/norm" in res["text"]


def test_check_and_report_say_the_same_of_an_ended_short_run(tmp_path: Path) -> None:
    # 30 steps and the end mark: the baseline period will never be complete, and both commands
    # say so in the same words, with the same steps.
    import io

    from grpo_monitor.tools import report
    from grpo_monitor.tools.check import check

    run = tmp_path / "short"
    run.mkdir()
    rows = [{"step": s, "reward": 0.5, "kl": 0.01, "grad_norm": 0.3} for s in range(0, 30)]
    rows.append({"step": 29, "events": [{"type": "run_end"}]})
    (run / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = io.StringIO()
    check(run, out)
    said = out.getvalue()
    assert "steps 0..29, 30 logged steps" in said
    line = next(ln for ln in said.splitlines() if "GRPOGradNormSpike" in ln)
    assert line.rstrip().endswith("baseline_pending: the run ended 171 steps before its baseline "
                                  "period was complete: never judged"), line
    assert "steps to go" not in said
    res = report.build_report(run, tmp_path / "out", plots=False)
    assert "30 logged steps [0, 29]" in res["text"]
    assert ("grad_norm_spike (GRPOGradNormSpike): baseline_pending, the run ended 171 steps before "
            "its baseline period was complete: never judged") in res["text"]

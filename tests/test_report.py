"""grpo-monitor report: verdicts on simulated runs, CSV, percentiles, self-contained HTML."""

from __future__ import annotations

import csv
import json
import math
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from promtool_harness import alerts

from grpo_monitor.contract import thresholds as th
from grpo_monitor.runtime.signals import SLOPE_WINDOWS
from grpo_monitor import cli
from grpo_monitor.tools import report
from grpo_monitor.tools.simulate import SCENARIOS, write_run

ROOT = Path(__file__).resolve().parents[1]

# A shorter run, sick from its step 600: the scenarios that turn sick on a healthy run after its
# baseline period, and are caught within 600 steps.
SHORT_STEPS, SHORT_ONSET = 1200, 600
SHORTENED = sorted(name for name, sc in SCENARIOS.items()
                   if sc.alerts and sc.shape is None and sc.onset >= SHORT_ONSET
                   and sc.caught_within < SHORT_STEPS - SHORT_ONSET)


def _ids(res: dict) -> list[str]:
    return [v["id"] for v in res["verdicts"]]


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("snap")
    write_run(root, "healthy", "healthy", steps=3000)
    return report.build_report(root / "healthy", root / "out")


def test_healthy_says_healthy_and_nothing_else(healthy: dict) -> None:
    assert _ids(healthy) == ["healthy"] == list(SCENARIOS["healthy"].verdicts)
    assert healthy["verdicts"][0]["steps"] == [1, 3000]
    verdicts = json.loads(Path(healthy["outputs"]["verdicts"]).read_text())
    assert [v["id"] for v in verdicts] == ["healthy"]
    text = healthy["text"]
    for vid in report.VERDICTS:
        if vid != "healthy":
            assert vid not in text


@pytest.mark.parametrize("scenario", SHORTENED)
def test_sick_scenario_names_its_verdicts_from_the_onset(tmp_path: Path, scenario: str) -> None:
    write_run(tmp_path, scenario, scenario, steps=SHORT_STEPS, onset=SHORT_ONSET)
    res = report.build_report(tmp_path / scenario, tmp_path / "out", plots=False)
    ids = _ids(res)
    # The scenario's own verdicts (a shorter run may not reach them all), nothing else.
    assert ids and set(ids) <= set(SCENARIOS[scenario].verdicts), ids
    for v in res["verdicts"]:
        assert SHORT_ONSET <= v["steps"][0] <= v["steps"][1] <= SHORT_STEPS, v  # after the onset
        assert v["evidence"]
        assert v["id"] in res["text"]
    on_disk = json.loads((tmp_path / "out" / "verdicts.json").read_text())
    assert {"id", "severity", "steps", "evidence"} <= set(on_disk[0])


def test_csv_one_row_per_logged_step(healthy: dict) -> None:
    with open(healthy["outputs"]["csv"], newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3000
    assert [int(r["step"]) for r in rows] == list(range(1, 3001))
    for col in ("step", "reward", "kl", "loss", "sample_acc", "entropy", "response_len",
                "grad_norm", "reward_std"):
        assert col in rows[0], col
    data = healthy["data"]
    assert float(rows[9]["reward"]) == data.train[10]["reward/mean"]
    assert float(rows[9]["kl"]) == data.train[10]["kl/mean"]


def test_percentiles_linear_interpolation() -> None:
    xs = [0.2, 0.3, 0.4, 0.5, 0.9]  # background.md#quantiles-and-spread, by hand
    assert report.percentile(xs, 95) == pytest.approx(0.82)
    assert report.percentile(xs, 50) == pytest.approx(0.4)
    assert report.percentile([3.0], 99) == 3.0
    assert math.isnan(report.percentile([], 50))
    rng = np.random.default_rng(0)
    ys = rng.normal(size=137)
    for p in (5, 25, 50, 95, 99):
        assert report.percentile(ys, p) == pytest.approx(np.percentile(ys, p))
    d = report.describe([0.40, 0.42, 0.44, 0.46, 0.48])
    assert d["stddev"] == pytest.approx(0.0316, abs=1e-3)  # background.md#quantiles-and-spread: smooth rise
    assert report.describe([0.40, 0.60, 0.35, 0.62, 0.38])["stddev"] == pytest.approx(0.13, abs=0.01)


def test_summary_quantiles_match_numpy(healthy: dict) -> None:
    reward = healthy["data"].series("reward/mean")
    run = healthy["summary"]["signals"]["reward/mean"]["run"]
    for p in (5, 50, 95, 99):
        assert run[f"p{p}"] == pytest.approx(np.percentile(reward, p))
    wins = healthy["summary"]["signals"]["reward/mean"]["windows"]
    assert len(wins) == 15 and wins[0]["steps"] == [1, 200]
    assert wins[0]["p50"] == pytest.approx(np.percentile(reward[:200], 50))


def test_html_self_contained_and_escaped(tmp_path: Path) -> None:
    name = "<b onmouseover=alert(1)>x&y"  # a run name is a folder name: no "/"
    write_run(tmp_path, name, "nan_loss", steps=300, onset=200, ranks=1)
    res = report.build_report(tmp_path / name, tmp_path / "out")
    page = Path(res["outputs"]["html"]).read_text()
    assert "<b onmouseover" not in page
    assert "&lt;b onmouseover=alert(1)&gt;x&amp;y" in page
    assert not re.search(r"""(src|href)\s*=\s*['"]?https?://""", page, re.I)
    assert "data:image/png;base64," in page
    assert Path(res["outputs"]["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _write_records(run_dir: Path, rows: list[dict], extra_bad: bool = True) -> None:
    run_dir.mkdir(parents=True)
    with open(run_dir / "rank-0.jsonl", "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
        if extra_bad:
            fh.write("{not json\n")


def _synthetic(n: int, f) -> list[dict]:  # type: ignore[no-untyped-def]
    rng = random.Random(0)
    rows = []
    for step in range(1, n + 1):
        m, bt = f(step, rng)
        rows.append({"step": step, "metrics": m, **({"by_type": bt} if bt else {})})
    return rows


def test_plateau_beta_too_large_and_loss_without_reward(tmp_path: Path) -> None:
    def f(step, rng):  # type: ignore[no-untyped-def]
        return {"reward/mean": 0.3 + rng.gauss(0, 0.01), "kl/mean": 0.001,
                "loss": 0.5 - step / 1000 + rng.gauss(0, 0.01),
                "eval/sample_acc": 0.3 + rng.gauss(0, 0.01)}, None
    _write_records(tmp_path / "r", _synthetic(1000, f))
    res = report.build_report(tmp_path / "r", tmp_path / "out", plots=False)
    assert set(_ids(res)) == {"reward_plateau_beta_too_large", "loss_without_reward"}
    assert res["summary"]["bad_lines"] == 1


def test_plateau_grader_too_loose(tmp_path: Path) -> None:
    def f(step, rng):  # type: ignore[no-untyped-def]
        return {"reward/mean": 0.9 + rng.gauss(0, 0.01), "kl/mean": 0.2 + rng.gauss(0, 0.01),
                "loss": rng.gauss(0, 0.05), "eval/sample_acc": 0.3 + rng.gauss(0, 0.01)}, None
    _write_records(tmp_path / "r", _synthetic(1000, f))
    res = report.build_report(tmp_path / "r", tmp_path / "out", plots=False)
    assert _ids(res) == ["reward_plateau_grader_too_loose"]


def test_shortcut_learning_and_reward_collapse(tmp_path: Path) -> None:
    def f(step, rng):  # type: ignore[no-untyped-def]
        k = max(0, step - 500) / 500
        reward = 0.2 + 0.4 * min(step, 500) / 500 - 0.3 * k
        m = {"reward/mean": reward, "kl/mean": 0.2 * (1 + 30 * k), "loss": rng.gauss(0, 0.05)}
        bt = {"easy": {"reward/mean": 0.6 + 0.3 * k}, "hard": {"reward/mean": 0.3 - 0.2 * k}}
        return m, bt
    _write_records(tmp_path / "r", _synthetic(1000, f))
    ids = _ids(report.build_report(tmp_path / "r", tmp_path / "out", plots=False))
    assert {"shortcut_learning", "reward_collapse_kl_blowup", "kl_explosion"} <= set(ids)


def test_latest_record_per_step_wins_and_segments(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / "rank-0.000001.jsonl").write_text(
        json.dumps({"step": 1, "time": 1.0, "metrics": {"reward/mean": 0.1}}) + "\n")
    (run / "rank-0.jsonl").write_text(
        json.dumps({"step": 1, "time": 2.0, "metrics": {"reward/mean": 0.5}}) + "\n"
        + json.dumps({"step": 2, "time": 3.0, "metrics": {"reward/mean": 0.6}}) + "\n")
    (run / ".hidden.jsonl").write_text(json.dumps({"step": 9, "metrics": {"reward": 9}}) + "\n")
    (run / "rank-1.json").write_text(json.dumps({"step": 2, "metrics": {"perf/step_time_s": 5}}))
    data = report.load_run(run)
    assert data.steps == [1, 2] and data.train[1]["reward/mean"] == 0.5
    assert data.perf[1][2]["perf/step_time_s"] == 5.0


def test_cli_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path, "run", "healthy", steps=300, ranks=1)
    assert cli.main(["report", str(tmp_path / "run"), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [v["id"] for v in out["verdicts"]] == ["healthy"]
    assert (tmp_path / "run" / ".report" / "report.html").exists()
    assert cli.main(["report", str(tmp_path / "nothing")]) == 2


def test_python_m_report_is_the_cli_command(tmp_path: Path) -> None:
    write_run(tmp_path, "run", "healthy", steps=30, ranks=1)
    res = subprocess.run([sys.executable, "-m", "grpo_monitor.tools.report", str(tmp_path / "run"),
                          "--out", str(tmp_path / "out"), "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    printed = json.loads(res.stdout)
    assert printed["outputs"]["verdicts"] == str(tmp_path / "out" / "verdicts.json")
    assert printed["verdicts"] == report.build_report(tmp_path / "run", tmp_path / "again",
                                                      plots=False)["verdicts"]
    # A flag the command does not have is the CLI's own error: one parser, the CLI's.
    res = subprocess.run([sys.executable, "-m", "grpo_monitor.tools.report", str(tmp_path / "run"),
                          "--steps", "3"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("grpo-monitor report: unknown flag --steps"), res.stderr


def test_python_m_report_without_the_extra_says_so_in_one_line(tmp_path: Path) -> None:
    # numpy and matplotlib hidden, as a plain install leaves them out: the package loads its
    # modules on first use, so the command is reached and names the extra, with no traceback.
    write_run(tmp_path, "run", "healthy", steps=5, ranks=1)
    code = ("import runpy, sys; sys.modules.update(numpy=None, matplotlib=None); "
            "runpy.run_module('grpo_monitor.tools.report', run_name='__main__', alter_sys=True)")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    from grpo_monitor.extras import install_hint

    assert res.stderr.splitlines() == [
        "grpo-monitor report needs numpy, matplotlib, which a plain install leaves out (the "
        f"report extra): {install_hint('report')}"], res.stderr


def test_train_demo_loose_grader_is_reward_hacking(tmp_path: Path) -> None:
    # A real tiny GRPO run (about 15 s here) whose grader pays for length from step 200.
    from grpo_monitor.tools.train_demo import Config, train
    train(Config(step_seconds=0.0, snapshot_dir=tmp_path, run="td", steps=300, grader="loose", onset=200))
    res = report.build_report(tmp_path / "td", tmp_path / "out", plots=False)
    assert "reward_hacking" in _ids(res), res["text"]


# Every simulate scenario's report names its sickness (the card's verdict), and only what the
# sickness explains (Scenario.verdicts); the healthy run is tested above.
@pytest.mark.parametrize("scenario", sorted(set(SCENARIOS) - {"healthy"}))
def test_every_scenario_is_named(scenario: str, tmp_path: Path) -> None:
    write_run(tmp_path, scenario, scenario)
    res = report.build_report(tmp_path / scenario, tmp_path / "out", plots=False)
    assert sorted(_ids(res)) == sorted(SCENARIOS[scenario].verdicts), res["text"]


def test_card_windows_are_the_exporters() -> None:
    # The report's step windows and initial mean against the exporter's own features
    # (signals.RankSignals) on one irregularly logged signal: the same numbers at every step.
    from grpo_monitor.runtime.signals import RankSignals

    rng = random.Random(3)
    steps = sorted(rng.sample(range(1, 700), 400))
    values = [rng.uniform(0, 2) for _ in steps]
    sig = RankSignals(th.count("baseline_steps"))
    track = report.Track(np.array(steps), np.array(values), steps[0])
    early, sus, back = (th.count("early_window_steps"), th.count("sustain_steps"),
                        th.count("lookback_steps"))
    p10, p90 = track.rolling(early, "p10"), track.rolling(early, "p90")
    mean, before = track.rolling(sus, "mean"), track.rolling(sus, "mean", offset=back)
    trend_window = SLOPE_WINDOWS[0]
    trend = track.slope(trend_window)
    seen = 0
    for i, (st, v) in enumerate(zip(steps, values)):
        sig.add(st, {"x": v}, stalled=False)
        f = sig.features()
        pct = {w: (lo, hi) for k, w, lo, hi in f.percentiles}
        means = {(w, o): m for k, w, o, m in f.means}
        assert (early in pct) == np.isfinite(p10[i]), st
        if early in pct:
            assert pct[early] == pytest.approx((p10[i], p90[i]))
            seen += 1
        assert means.get((sus, 0), math.nan) == pytest.approx(mean[i], nan_ok=True)
        assert means.get((sus, back), math.nan) == pytest.approx(before[i], nan_ok=True)
        slopes = {w: v for k, w, v in f.slopes}
        assert slopes.get(trend_window, math.nan) == pytest.approx(trend[i], nan_ok=True), st
        if "x" in f.initial:
            assert f.initial["x"] == pytest.approx(track.initial())
    assert seen > 300


def test_the_short_window_is_the_exporters() -> None:
    # The early cards read the exporter's 20-step percentiles and 20-step range; the report
    # reads the table's early_window_steps, which must stay that length.
    from grpo_monitor.runtime import signals

    assert th.count("early_window_steps") in signals.TRAINING_PERCENTILES
    assert th.count("early_window_steps") == signals.RANGE_WINDOW
    assert th.count("sustain_steps") in signals.TRAINING_PERCENTILES
    # The newer cards read the 50-step slope, mean and per-type means (now and 200 steps before).
    sus, back = th.count("sustain_steps"), th.count("lookback_steps")
    assert SLOPE_WINDOWS[0] == sus and (sus, 0) in signals.TRAINING_MEANS
    assert set(signals.PROMPT_TYPE_MEANS) == {(sus, 0), (sus, back)}


def test_every_card_has_its_verdict() -> None:
    training = {r["alert"] for r in alerts("grpo-alerts.yml")}
    cluster = {r["alert"] for r in alerts("grpo-cluster.yml")}
    cards = {kind.card for kind in report.VERDICTS.values() if kind.card is not None}
    assert training <= cards <= training | cluster


def test_every_verdict_is_registered_whole() -> None:
    # Each verdict names its severity and says what it means; only `healthy` stands alone, and a
    # verdict is left out only beside verdicts that exist.
    for vid, kind in report.VERDICTS.items():
        assert kind.id == vid and kind.severity in report.SEVERITY_ORDER, vid
        assert kind.explanation and "\n" not in kind.explanation, vid
        assert kind.explained_by <= set(report.VERDICTS) - {vid}, vid
    assert [vid for vid, kind in report.VERDICTS.items() if kind.alone] == ["healthy"]
    with pytest.raises(ValueError, match="registered twice"):
        report.verdict("healthy", "info", "again")(lambda view: None)


def test_a_run_too_short_for_a_baseline_gets_only_the_early_cards(tmp_path: Path) -> None:
    # 150 steps whose grad norm is 8x its start from step 60: the spike card needs the 200-step
    # baseline, so no verdict; the entropy that falls to 5% of its start is caught from step one.
    def f(step, rng):  # type: ignore[no-untyped-def]
        return {"reward/mean": 0.3 + rng.gauss(0, 0.01), "kl/mean": 0.01,
                "grad/norm": (8 if step > 60 else 1) + rng.gauss(0, 0.01),
                "entropy/mean": 1.0 if step < 50 else 0.05}, None
    _write_records(tmp_path / "r", _synthetic(150, f), extra_bad=False)
    res = report.build_report(tmp_path / "r", tmp_path / "out", plots=False)
    assert _ids(res) == ["entropy_collapse"], res["text"]
    v = res["verdicts"][0]
    # Step 68 is the first whose 20-step window is 90% under 0.1x the initial 1.0.
    assert v["steps"] == [68, 150] and v["evidence"]["initial"] == 1.0
    assert "steps 68-150" in res["text"] and "window_p90" in res["text"]


# -- the newer stacks' signals: rollout vs trainer, dead groups by cause, length bias, the
# entropy's driver, the entropy-reward law, prompt types ---------------------------------------

def _run_of(tmp_path: Path, n: int, extra, by_type=None) -> dict:  # type: ignore[no-untyped-def]
    """A run of ``n`` steps whose reward and KL say nothing (flat reward, a KL well above the
    near-zero line, no loss or accuracy), plus ``extra(step, rng)``'s keys."""
    def f(step, rng):  # type: ignore[no-untyped-def]
        m = {"reward/mean": 0.3 + rng.gauss(0, 0.01), "kl/mean": 0.05 + rng.gauss(0, 0.002),
             **extra(step, rng)}
        return m, (by_type(step, rng) if by_type else None)
    _write_records(tmp_path / "r", _synthetic(n, f), extra_bad=False)
    return report.build_report(tmp_path / "r", tmp_path / "out", plots=False)


def _one(res: dict, vid: str) -> dict:
    found = [v for v in res["verdicts"] if v["id"] == vid]
    assert len(found) == 1, res["text"]
    return found[0]


def test_rollout_mismatch_each_branch_on_its_own_steps(tmp_path: Path) -> None:
    # KL over the line from step 101, the other three from step 201: a 20-step window is 90%
    # over (its p10 above) once 18 of its 20 steps are, at steps 118 and 218; 90% under (p90
    # below) likewise.
    def extra(step, rng):  # type: ignore[no-untyped-def]
        late = step > 200
        return {"mismatch/kl": 0.3 if step > 100 else 0.005,
                "mismatch/chi2_token": 2.5 if late else 0.02,
                "mismatch/is_weight_mean": 0.3 if late else 1.0,
                "mismatch/is_ess_ratio": 0.1 if late else 0.95}
    res = _run_of(tmp_path, 300, extra)
    v = _one(res, "rollout_mismatch")
    assert (v["severity"], v["card"], v["steps"]) == ("warning", "GRPORolloutMismatch", [118, 300])
    ev = v["evidence"]
    assert set(ev) == {"kl", "chi2_token", "is_weight", "ess"}
    assert ev["kl"]["steps"] == [118, 300] and ev["kl"]["above"] == 0.1
    assert ev["kl"]["window_p10"] > 0.1
    for branch in ("chi2_token", "is_weight", "ess"):
        assert ev[branch]["steps"] == [218, 300], branch
    assert ev["is_weight"]["window_p90"] < ev["is_weight"]["below"] == 0.5
    assert ev["ess"]["window_p90"] < 0.3
    assert "rollout_mismatch steps 118-300" in res["text"]
    rows = res["summary"]["rollout_vs_trainer"]["keys"]
    assert rows["mismatch/kl"]["trend"] == "rising" and rows["mismatch/kl"]["last_median"] == 0.3
    assert rows["mismatch/is_weight_mean"]["trend"] == "falling"


def test_a_rollout_that_agrees_with_its_trainer_gets_no_mismatch_verdict(tmp_path: Path) -> None:
    # Healthy vLLM-vs-FSDP levels (KL ~0.005, weights ~1, nine tokens in ten effective), and a
    # trajectory age of two versions: the section lists them, steady, and no card fires.
    def extra(step, rng):  # type: ignore[no-untyped-def]
        return {"mismatch/kl": 0.005 + rng.gauss(0, 0.0005), "mismatch/k3_kl": 0.005,
                "mismatch/chi2_token": 0.02, "mismatch/is_weight_mean": 1 + rng.gauss(0, 0.01),
                "mismatch/is_ess_ratio": 0.95, "staleness/mean": 2.0, "staleness/max": 3.0}
    res = _run_of(tmp_path, 300, extra)
    assert _ids(res) == ["healthy"], res["text"]
    section = res["summary"]["rollout_vs_trainer"]
    assert list(section["keys"]) == ["mismatch/kl", "mismatch/k3_kl", "mismatch/chi2_token",
                                     "mismatch/is_weight_mean", "mismatch/is_ess_ratio",
                                     "staleness/mean", "staleness/max"]  # keys.py's order
    assert {r["trend"] for r in section["keys"].values()} == {"steady"}
    assert section["first_steps"] == [1, 60] and section["last_steps"] == [241, 300]
    assert "verdicts: none, no card fired" in res["text"]


def test_a_slowly_rising_mismatch_is_caught_below_the_level_line(tmp_path: Path) -> None:
    # 0.011 -> 0.036 over 300 steps (the common failure): under the 0.1 line all along, but over
    # twice its start in 90% of 50 steps while its trend still rises.
    def rising(step, rng):  # type: ignore[no-untyped-def]
        return {"mismatch/kl": 0.011 + 0.025 * step / 300 + rng.gauss(0, 0.001)}
    res = _run_of(tmp_path, 300, rising)
    assert "rollout_mismatch" not in _ids(res)
    v = _one(res, "rollout_mismatch_rising")
    kl = v["evidence"]["kl"]
    assert kl["window_p10"] > 2 * kl["initial"] and kl["slope_per_step"] > 0
    assert kl["initial"] == pytest.approx(0.0115, abs=0.001)
    # Twice the start (~0.021) is passed by the window's 10th percentile (the value ~45 steps
    # back, less 1.3 sigma of noise) near step 180.
    assert 160 < kl["steps"][0] < 200 and v["steps"][1] == 300
    # The trend branch sees it first: the 20-step mean past the same line (~10 steps back)
    # while the exporter's trend of the last 30 records rises steadily.
    ramp = v["evidence"]["trend_kl"]
    assert ramp["window_mean"] > 2 * ramp["initial"] and ramp["trend_z"] >= 3
    assert 130 < ramp["steps"][0] < kl["steps"][0] and v["steps"][0] == ramp["steps"][0]
    assert res["summary"]["rollout_vs_trainer"]["keys"]["mismatch/kl"]["trend"] == "rising"


def test_a_flat_or_tiny_mismatch_is_not_rising(tmp_path: Path) -> None:
    # Flat at 0.011; and a KL of 1e-5 that triples (rounding noise, under the 0.001 floor).
    def flat(step, rng):  # type: ignore[no-untyped-def]
        return {"mismatch/kl": 0.011 + rng.gauss(0, 0.001),
                "mismatch/k3_kl": 1e-5 * (1 + 2 * step / 300)}
    res = _run_of(tmp_path, 300, flat)
    assert _ids(res) == ["healthy"], res["text"]


@pytest.mark.parametrize("age, fires", [(6.0, True), (3.0, False)])
def test_stale_rollouts(tmp_path: Path, age: float, fires: bool) -> None:
    def extra(step, rng):  # type: ignore[no-untyped-def]
        return {"staleness/mean": age if step > 100 else 1.0, "staleness/max": 2 * age}
    res = _run_of(tmp_path, 300, extra)
    assert ("stale_rollouts" in _ids(res)) == fires, res["text"]
    if fires:
        v = _one(res, "stale_rollouts")
        assert (v["card"], v["steps"]) == ("GRPOStaleRollouts", [118, 300])
        # Two steps of age 1 left among 20: the 10th percentile is 0.1 x 1 + 0.9 x age.
        assert v["evidence"]["above"] == 4
        assert v["evidence"]["window_p10"] == pytest.approx(0.1 + 0.9 * age)


@pytest.mark.parametrize("key, verdict", [("group/all_wrong_frac", "prompts_too_hard"),
                                          ("group/all_right_frac", "prompts_too_easy")])
def test_dead_groups_by_cause(tmp_path: Path, key: str, verdict: str) -> None:
    # Seven groups in ten all wrong (all right) from step 1: the cause is named from the run's
    # 3rd record, the 20-step window covering the run so far until the run is that long. A flat
    # reward beside it is no plateau of the KL's making.
    def extra(step, rng):  # type: ignore[no-untyped-def]
        return {key: 0.7 + rng.gauss(0, 0.02), "kl/mean": 0.001}
    res = _run_of(tmp_path, 300, extra)
    assert _ids(res) == [verdict], res["text"]
    v = res["verdicts"][0]
    assert v["steps"] == [3, 300] and v["evidence"]["signal"] == key
    assert v["evidence"]["window_p10"] > v["evidence"]["above"] == 0.5


def test_dead_groups_under_half_name_no_cause(tmp_path: Path) -> None:
    def extra(step, rng):  # type: ignore[no-untyped-def]
        return {"group/all_wrong_frac": 0.3 + rng.gauss(0, 0.02),
                "group/all_right_frac": 0.45 + rng.gauss(0, 0.02)}
    assert _ids(_run_of(tmp_path, 300, extra)) == ["healthy"]


@pytest.mark.parametrize("correct_growth, fires", [(0.0, True), (0.5, False)])
def test_length_bias(tmp_path: Path, correct_growth: float, fires: bool) -> None:
    # Wrong answers 200 -> 320 tokens (+60%); right ones flat (a bias), or growing by half as
    # well (harder reasoning all round: no bias).
    def extra(step, rng):  # type: ignore[no-untyped-def]
        k = step / 300
        return {"response/len_incorrect_mean": 200 * (1 + 0.6 * k) + rng.gauss(0, 2),
                "response/len_correct_mean": 150 * (1 + correct_growth * k) + rng.gauss(0, 2)}
    res = _run_of(tmp_path, 300, extra)
    assert ("length_bias" in _ids(res)) == fires, res["text"]
    if fires:
        v = _one(res, "length_bias")
        ev = v["evidence"]
        assert v["card"] == "GRPOLengthBias"
        assert ev["incorrect_growth"] > 0.3 and ev["correct_growth"] < 0.1
        # The 50-step mean of 200 (1 + 0.6 k) passes 1.3x the initial ~200.4 near step 175.
        assert 160 < v["steps"][0] < 200 and v["steps"][1] == 300


@pytest.mark.parametrize("cov_after, initial, entropy_fall, fires", [
    (0.05, 0.01, 0.6, True), (0.02, 0.01, 0.6, False), (0.05, -0.01, 0.6, False),
    (0.05, 0.01, 0.1, False)])
def test_entropy_covariance_surge(tmp_path: Path, cov_after: float, initial: float,
                                  entropy_fall: float, fires: bool) -> None:
    # A covariance five times its start surges while entropy loses 60% in 50 steps; twice its
    # start does not; nor does one that started negative (a multiple of a negative start says
    # nothing), nor a surge while entropy barely moves (10% in 50 steps).
    def extra(step, rng):  # type: ignore[no-untyped-def]
        k = max(0, step - 100)
        return {"entropy/logp_adv_cov": cov_after if step > 100 else initial,
                "entropy/mean": 1.0 * (1 - entropy_fall * min(1.0, k / 50))}
    res = _run_of(tmp_path, 300, extra)
    assert ("entropy_covariance_surge" in _ids(res)) == fires, res["text"]
    if fires:
        v = _one(res, "entropy_covariance_surge")
        assert v["evidence"]["limit"] == pytest.approx(0.03)
        # From the covariance's 20-step p10 over 0.03 (step 118) while entropy's 50-step trend
        # is down over 0.3 of its start; over once entropy has settled (its fall ends at 150).
        assert 118 <= v["steps"][0] < 140 and v["steps"][1] < 200


def _law_run(final_entropy: float, follows_law: bool):  # type: ignore[no-untyped-def]
    """Entropy decaying from 1.5 to ``final_entropy`` over 300 steps; the reward on the law
    R = -0.2 exp(H) + 1.0 (with batch noise), or noise around 0.4 that ignores the entropy."""
    def extra(step, rng):  # type: ignore[no-untyped-def]
        h = final_entropy + (1.5 - final_entropy) * math.exp(-step / 60)
        r = 1.0 - 0.2 * math.exp(h) if follows_law else 0.4
        return {"entropy/mean": h, "reward/mean": r + rng.gauss(0, 0.01)}
    return extra


def test_entropy_reward_law_predicts_the_second_half_and_sees_the_ceiling(tmp_path: Path) -> None:
    # Entropy spent down to 0.2, near the law's ceiling yet above a collapse (0.1 x 1.5).
    res = _run_of(tmp_path, 300, _law_run(0.2, follows_law=True))
    law = res["summary"]["entropy_reward_law"]
    assert law["fitted"] and law["blocks"] == 31  # steps 1-9, 10-19, ..., 300
    half = law["first_half"]
    assert half["steps"] == [1, 149] and half["points"] == 15 and half["law_holds"]
    assert half["a"] == pytest.approx(0.2, rel=0.1) and half["b"] == pytest.approx(1.0, rel=0.05)
    assert half["ceiling"] == pytest.approx(half["b"] - half["a"], abs=1e-5)
    pred = law["prediction"]
    assert pred["steps"] == [150, 300] and pred["blocks"] == 16
    # Ten-step block means carry ~0.003 of batch noise; the law itself is exact.
    assert pred["mean_abs_error"] < 0.01
    assert pred["error_pct_of_range"] == pytest.approx(
        100 * pred["mean_abs_error"] / pred["reward_range"], rel=1e-3)
    assert pred["flat_mean_abs_error"] > pred["mean_abs_error"]
    # The whole-run fit is the exporter's: the same block means, the last (open) block left out.
    from grpo_monitor.runtime.signals import RankSignals
    sig = RankSignals(th.count("baseline_steps"))
    for st in res["data"].steps:
        sig.add(st, res["data"].train[st], stalled=False)
    exporter_law = sig.features().law
    assert exporter_law is not None and law["whole_run"]["points"] == exporter_law.points == 30
    assert law["whole_run"]["a"] == pytest.approx(exporter_law.a, abs=1e-6)
    # (exp(H) - 1) / (exp(1.5) - 1) with H's 50-step mean near 0.21: 0.067, under 0.1.
    assert law["end"]["near_ceiling"] and law["end"]["headroom_ratio"] < 0.1
    v = _one(res, "reward_ceiling_near")
    assert v["card"] == "GRPORewardCeilingNear" and v["steps"][1] == 300
    ev = v["evidence"]
    assert ev["headroom_ratio"] < ev["limit"] == 0.1 and ev["law_r_squared"] >= 0.8
    assert ev["law_scale"] > 0 and ev["entropy/mean:slope_per_step"] < 0
    assert "fit on the first half (steps 1-149, 15 blocks)" in res["text"]
    assert ": near its ceiling" in res["text"]


def test_no_ceiling_while_entropy_is_left_or_the_law_does_not_fit(tmp_path: Path) -> None:
    # Entropy left at 0.8 (headroom ~0.37), and a reward that ignores the entropy (R² ~0): both
    # runs are fitted and predicted, neither is near its ceiling.
    plenty = _run_of(tmp_path / "a", 300, _law_run(0.8, follows_law=True))
    law = plenty["summary"]["entropy_reward_law"]
    assert law["first_half"]["law_holds"] and not law["end"]["near_ceiling"]
    assert law["end"]["headroom_ratio"] > 0.3
    assert "reward_ceiling_near" not in _ids(plenty)
    assert ": not near its ceiling" in plenty["text"]
    unrelated = _run_of(tmp_path / "b", 300, _law_run(0.05, follows_law=False))
    law = unrelated["summary"]["entropy_reward_law"]
    assert not law["first_half"]["law_holds"] and law["first_half"]["r_squared"] < 0.8
    assert math.isfinite(law["prediction"]["mean_abs_error"])
    assert "reward_ceiling_near" not in _ids(unrelated)
    assert "entropy_collapse" in _ids(unrelated)  # 0.05 of 1.5 is a collapse all the same


def test_law_needs_five_blocks_in_the_first_half(tmp_path: Path) -> None:
    res = _run_of(tmp_path, 60, _law_run(0.05, follows_law=True))
    law = res["summary"]["entropy_reward_law"]
    assert not law["fitted"] and law["reason"] == "3 blocks in the first half, 5 needed"
    assert "not fitted: 3 blocks in the first half, 5 needed" in res["text"]
    bare = _run_of(tmp_path / "bare", 60, lambda step, rng: {})
    assert bare["summary"]["entropy_reward_law"]["reason"] == \
        "the run logs no entropy/mean beside reward/mean"
    assert bare["summary"]["rollout_vs_trainer"] is None
    assert "rollout vs trainer: the run logs no mismatch/* or staleness/* key" in bare["text"]


def test_law_plot_and_html_sections(tmp_path: Path) -> None:
    def extra(step, rng):  # type: ignore[no-untyped-def]
        return {**_law_run(0.05, True)(step, rng), "mismatch/kl": 0.005}
    def f(step, rng):  # type: ignore[no-untyped-def]
        return {"kl/mean": 0.05, **extra(step, rng)}, None
    _write_records(tmp_path / "r", _synthetic(300, f), extra_bad=False)
    res = report.build_report(tmp_path / "r", tmp_path / "out")
    assert Path(res["outputs"]["law_png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = Path(res["outputs"]["html"]).read_text()
    assert "<h2>Rollout vs trainer</h2>" in page and "<td>mismatch/kl</td>" in page
    assert "<h2>Entropy-reward law</h2>" in page and "alt='reward against entropy'" in page
    assert page.count("data:image/png;base64,") == 2


def test_shortcut_learning_is_the_cards_rule(tmp_path: Path) -> None:
    # "hard" (started at 0.3) falls by 0.2 from step 101 while "easy" (started at 0.6) rises by
    # 0.2; "low" stays at 0.1. Against the initial values the card fires once the 50-step means
    # have moved by 0.05: 0.2/50 per step, 13 steps in (0.052). Against the 50-step means 200
    # steps before, from step 250, the first whose history reaches back 250 steps.
    def by_type(step, rng):  # type: ignore[no-untyped-def]
        k = 0.2 if step > 100 else 0.0
        return {"easy": {"reward/mean": 0.6 + k}, "hard": {"reward/mean": 0.3 - k},
                "low": {"reward/mean": 0.1}}
    res = _run_of(tmp_path, 300, lambda step, rng: {}, by_type)
    v = _one(res, "shortcut_learning")
    assert (v["card"], v["steps"]) == ("GRPOShortcutLearning", [113, 300])
    first, late = v["evidence"]["against_initial"], v["evidence"]["within_200_steps"]
    # The falling type is named (the alert's prompt_type label), beside the reference of the
    # type that rose from higher up, and each type's initial mean.
    assert first["prompt_types"] == ["hard"] and first["reference_of_a_rising_type"] == pytest.approx(0.6)
    assert first["type_initial"] == {"easy": pytest.approx(0.6), "hard": pytest.approx(0.3),
                                     "low": pytest.approx(0.1)}
    assert first["steps"] == [113, 300]
    assert first["fall"]["hard"] == pytest.approx(0.052) and first["fall"]["easy"] == pytest.approx(-0.052)
    assert late["steps"] == [250, 300] and late["prompt_types"] == ["hard"]


def test_an_easy_type_falling_is_no_shortcut(tmp_path: Path) -> None:
    # The type that started higher fell and the lower one rose: regression on the easy cases,
    # not a shortcut (the card names a falling type only beside a rising one that started higher).
    def by_type(step, rng):  # type: ignore[no-untyped-def]
        k = 0.2 if step > 100 else 0.0
        return {"easy": {"reward/mean": 0.6 - k}, "hard": {"reward/mean": 0.3 + k}}
    assert _ids(_run_of(tmp_path, 300, lambda step, rng: {}, by_type)) == ["healthy"]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario_verdicts_stand_for_its_cards(scenario: str) -> None:
    # The cards a scenario raises live and the verdicts its report names afterwards agree: every
    # verdict's card is one of the scenario's, and every card has its verdict, or a verdict that
    # explains it (a length surge in reward hacking).
    sc = SCENARIOS[scenario]
    named = [report.VERDICTS[vid] for vid in sc.verdicts]
    assert {kind.card for kind in named if kind.card is not None} <= set(sc.alerts)
    for card in sc.alerts:
        assert any(kind.card == card and (kind.id in sc.verdicts or kind.explained_by & set(sc.verdicts))
                   for kind in report.VERDICTS.values()), card


# (scenario, threshold, patched value, the verdict that disappears with the patch): the new
# verdicts read their numbers from the table the cards read.
NEW_READS = [
    ("rollout_mismatch", "mismatch_kl", 1.0, None),
    ("rollout_mismatch", "mismatch_rise_ratio", 1000, "rollout_mismatch_rising"),
    ("mismatch_rising", "mismatch_rise_floor", 1.0, "rollout_mismatch_rising"),
    ("stale_rollouts", "staleness_steps", 20, "stale_rollouts"),
    ("prompts_too_hard", "dead_group_cause_ratio", 0.9, "prompts_too_hard"),
    ("covariance_surge", "entropy_cov_ratio", 100, "entropy_covariance_surge"),
    ("length_bias", "length_bias_growth_ratio", 1.0, "length_bias"),
    ("length_bias", "length_bias_correct_ratio", -0.5, "length_bias"),
    ("reward_ceiling", "ceiling_headroom_ratio", 0.01, "reward_ceiling_near"),
    ("reward_ceiling", "forecast_min_r2", 1.0, "reward_ceiling_near"),
    ("shortcut_learning", "shortcut_delta", 0.5, "shortcut_learning"),
]
_LOADED: dict[str, report.RunData] = {}


@pytest.mark.parametrize("scenario, name, patched, verdict", NEW_READS,
                         ids=[f"{c[0]}-{c[1]}" for c in NEW_READS])
def test_new_verdicts_follow_the_table(scenario: str, name: str, patched: float,
                                       verdict: str | None, monkeypatch: pytest.MonkeyPatch,
                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    from dataclasses import replace

    from grpo_monitor.contract.thresholds import THRESHOLDS

    if scenario not in _LOADED:
        root = tmp_path_factory.mktemp(scenario)
        write_run(root, scenario, scenario)
        _LOADED[scenario] = report.load_run(root / scenario)
    data = _LOADED[scenario]
    before = {v["id"]: v for v in report.diagnose(data)}
    monkeypatch.setitem(THRESHOLDS, name, replace(THRESHOLDS[name], value=patched))
    after = {v["id"]: v for v in report.diagnose(data)}
    if verdict is not None:
        assert verdict in before and verdict not in after, (name, set(before), set(after))
    else:  # the KL branch goes, the other branches of the card stay
        assert "kl" in before["rollout_mismatch"]["evidence"]
        assert "kl" not in after["rollout_mismatch"]["evidence"]


# -- what a person sees: one report per run, the cards' severities, the plot's legend -------------


def test_a_snapshot_folder_is_reported_run_by_run(tmp_path: Path) -> None:
    """Given the snapshot folder (several runs), never one report merged from them: each run its
    own, in its own folder, and the command says where it wrote."""
    write_run(tmp_path / "snaps", "ok", "healthy", steps=300, ranks=1)
    write_run(tmp_path / "snaps", "sick", "nan_loss", steps=300, onset=150, ranks=1)
    res = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "report", str(tmp_path / "snaps")],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert "holds 2 runs (ok, sick): one report each" in res.stderr
    for run, verdict in (("ok", "healthy"), ("sick", "nonfinite")):
        out = tmp_path / "snaps" / run / ".report"
        assert f"report written to {out} (report.html" in res.stdout
        assert [v["id"] for v in json.loads((out / "verdicts.json").read_text())][0] == verdict
    assert re.search(r"run ok: 300 logged steps", res.stdout) and re.search(r"run sick: 300 logged", res.stdout)
    # --out holds one folder per run; json lists each run.
    res = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "report", str(tmp_path / "snaps"),
                          "--out", str(tmp_path / "out"), "--format", "json"],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert [d["run"] for d in json.loads(res.stdout)] == ["ok", "sick"]
    assert (tmp_path / "out" / "sick" / "curves.png").is_file()


def test_verdict_severities_are_the_cards(tmp_path: Path) -> None:
    """A verdict that stands for a card has the card's severity in the rule files, the colour
    Alertmanager shows (GRPORewardHackingSuspected is yellow: so is reward_hacking); the
    severity each verdict declares, shown where no rule file is installed, agrees."""
    from grpo_monitor.tools.report.verdicts import CARD_SEVERITIES
    from grpo_monitor.tools.stack import card_severities

    rules = card_severities(ROOT / "prometheus")
    assert CARD_SEVERITIES == rules and rules["GRPORewardHackingSuspected"] == "warning"
    for kind in report.VERDICTS.values():
        if kind.card is not None:
            assert kind.severity == rules[kind.card], kind.id
    declared = dict(re.findall(r'@verdict\("(\w+)", "(\w+)"', (ROOT / "exporter" / "grpo_monitor" / "tools"
                                                              / "report" / "verdicts.py").read_text()))
    assert {k.id: k.severity for k in report.VERDICTS.values()} == declared


def test_curves_have_one_colour_per_card_colour_and_a_legend(tmp_path: Path) -> None:
    """curves.png: red spans for red cards, yellow for yellow ones (red where both: never a
    blend), host verdicts unshaded, and a legend naming each colour's verdicts."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Polygon, Rectangle

    from grpo_monitor.tools.report import render

    write_run(tmp_path, "r", "healthy", steps=300, ranks=1)
    data = report.load_run(tmp_path / "r")
    verdicts = [{"id": "nonfinite", "severity": "critical", "steps": [150, 200]},
                {"id": "length_shift", "severity": "warning", "steps": [100, 180]},
                {"id": "kl_tail_outliers", "severity": "warning", "steps": [120, 250]},
                {"id": "step_time_drift", "severity": "warning", "steps": [1, 300]}]
    figures: list = []
    real_png = render._png
    render._png = lambda fig, path: figures.append(fig) or b""  # type: ignore[assignment]
    try:
        render.plot_curves(data, verdicts)
    finally:
        render._png = real_png  # type: ignore[assignment]
    (fig,) = figures
    ax = fig.axes[0]
    def extent(patch: Polygon | Rectangle) -> tuple[int, int]:
        if isinstance(patch, Rectangle):  # matplotlib >= 3.9
            return round(patch.get_x()), round(patch.get_x() + patch.get_width())
        xs = [x for x, _ in patch.get_xy()]
        return round(min(xs)), round(max(xs))

    spans = sorted((*extent(p), matplotlib.colors.to_hex(p.get_facecolor()))
                   for p in ax.patches if isinstance(p, (Polygon, Rectangle)))
    red, yellow = render.SPAN_COLOURS["critical"][1], render.SPAN_COLOURS["warning"][1]
    # step_time_drift (a host verdict) is not shaded; the yellow spans stop where the red one is.
    assert spans == [(100, 150, yellow), (150, 200, red), (200, 250, yellow)], spans
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert legend == ["red card: nonfinite", "yellow card: length_shift, kl_tail_outliers"], legend
    plt.close(fig)
    assert (red, yellow) == ("#d62728", "#e6b800")
    doc = (ROOT / "docs" / "report.md").read_text()
    assert "red (critical) or yellow (warning), red where both" in doc


def test_a_rolled_back_run_is_reported_as_its_surviving_steps(tmp_path: Path) -> None:
    """Healthy to 44, the reward collapsed from 45, rolled back at 129 to the step-20 checkpoint,
    healthy to 300: the report judges steps 1..20 and the second pass, says what was undone, and
    finds no reward collapse; the same records without the rollback mark and second pass do."""
    rng = random.Random(1)

    def rec(step: int, reward: float) -> str:
        return json.dumps({"step": step, "metrics": {
            "reward/mean": reward + rng.gauss(0, 0.02), "reward/std": 0.3, "kl/mean": 0.01,
            "entropy/mean": 1.0, "loss": 0.1, "response/len_mean": 300.0}}) + "\n"

    first = "".join(rec(s, 0.8 if s < 45 else 0.02) for s in range(1, 130))
    mark = json.dumps({"step": 20, "metrics": {}, "events": [
        {"type": "rollback", "from_step": 130, "to_step": 20}]}) + "\n"
    second = "".join(rec(s, 0.8) for s in range(21, 301))
    (tmp_path / "rb").mkdir()
    (tmp_path / "rb" / "rank-0.jsonl").write_text(first + mark + second)
    res = report.build_report(tmp_path / "rb", tmp_path / "out", plots=True)
    assert res["summary"]["logged_steps"] == 300 and res["summary"]["steps"] == [1, 300]
    assert res["summary"]["undone"] == [{"steps": [21, 129], "back_to": 20}]
    assert "steps 21-129 were undone (the run went back to step 20)" in res["text"]
    assert "steps 21-129 were undone" in (tmp_path / "out" / "report.html").read_text()
    assert "reward_collapse" not in {v["id"] for v in res["verdicts"]}
    (tmp_path / "sick").mkdir()
    (tmp_path / "sick" / "rank-0.jsonl").write_text(first)
    sick = report.build_report(tmp_path / "sick", tmp_path / "out-sick", plots=False)
    assert "reward_collapse" in {v["id"] for v in sick["verdicts"]}


def test_the_report_never_writes_through_a_link_or_into_a_fifo(tmp_path: Path) -> None:
    """The run folder is a tree others write into: a link at an output's name is replaced (the
    file it points at is untouched), a FIFO there is replaced without being opened, and a
    `.report` that is a link is refused in one line, writing nothing elsewhere."""
    import os

    write_run(tmp_path / "snaps", "run", "healthy", steps=120, ranks=1)
    run = tmp_path / "snaps" / "run"
    outside = tmp_path / "outside.json"
    outside.write_text("keep me")
    (run / ".report").mkdir()
    (run / ".report" / "summary.json").symlink_to(outside)
    os.mkfifo(run / ".report" / "report.txt")
    res = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "report", str(run)],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert outside.read_text() == "keep me"
    assert not (run / ".report" / "summary.json").is_symlink()
    assert json.loads((run / ".report" / "summary.json").read_text())["run"] == "run"
    assert (run / ".report" / "report.txt").is_file()  # a regular file now, no FIFO
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(run / ".report")
    (run / ".report").symlink_to(elsewhere, target_is_directory=True)
    res = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "report", str(run)],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 2 and "cannot write the report" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert list(elsewhere.iterdir()) == []


def test_report_and_check_read_a_huge_file_in_bounded_memory(tmp_path: Path) -> None:
    """A 1 GiB sparse file (NULs, no newline) beside a run's records: report and check stream
    it, skipping it as one oversized line, instead of holding it whole. Each command's peak
    memory is that of the same run without the file, give or take 64 MiB."""
    records = "".join(json.dumps({"step": s, "metrics": {"reward/mean": 0.5, "loss": 0.1}}) + "\n"
                      for s in range(1, 41))
    for name in ("big", "small"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rank-0.jsonl").write_text(records)
    with open(tmp_path / "big" / "rank-1.jsonl", "wb") as fh:
        fh.truncate(1 << 30)
    peak = ("import resource, runpy, sys; sys.argv = ['grpo-monitor', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('grpo_monitor.cli', run_name='__main__')\n"
            "except SystemExit as e:\n    code = e.code\n"
            "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
            "sys.exit(code)")

    def peak_kib(*args: str) -> int:
        res = subprocess.run([sys.executable, "-c", peak, *args], capture_output=True, text=True,
                             timeout=600)
        assert res.returncode in (0, 1), res.stderr[-2000:]
        return int(re.search(r"PEAK (\d+)", res.stderr).group(1))  # type: ignore[union-attr]

    for command in ("report", "check"):
        out = ["--out", str(tmp_path / f"out-{command}")] if command == "report" else []
        small = peak_kib(command, str(tmp_path / "small"), *out)
        big = peak_kib(command, str(tmp_path / "big"), *out)
        assert big - small < 64 * 1024, (command, small, big)
    summary = json.loads((tmp_path / "out-report" / "summary.json").read_text())
    assert summary["logged_steps"] == 40 and summary["bad_lines"] >= 1

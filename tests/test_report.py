"""grpo-monitor report: verdicts on simulated runs, CSV, percentiles, self-contained HTML."""

from __future__ import annotations

import csv
import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

from grpo_monitor import report
from grpo_monitor.simulate import write_run

SCENARIO_VERDICT = {
    "reward_hacking": "reward_hacking",
    "reward_up_accuracy_flat": "reward_hacking",
    "kl_explosion": "kl_explosion",
    "entropy_collapse": "entropy_collapse",
    "nan_loss": "nonfinite",
    "throughput_drop": "throughput_drop",
    "step_time_drift": "step_time_drift",
    "straggler": "rank_straggler",
}


def _ids(res: dict) -> list[str]:
    return [v["id"] for v in res["verdicts"]]


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("snap")
    write_run(root, "healthy", "healthy", steps=3000)
    return report.build_report(root / "healthy", root / "out")


def test_healthy_says_healthy_and_nothing_else(healthy: dict) -> None:
    assert _ids(healthy) == ["healthy"]
    assert healthy["verdicts"][0]["steps"] == [1, 3000]
    verdicts = json.loads(Path(healthy["outputs"]["verdicts"]).read_text())
    assert [v["id"] for v in verdicts] == ["healthy"]
    text = healthy["text"]
    for vid in report._EXPLAIN:
        if vid != "healthy":
            assert vid not in text


@pytest.mark.parametrize("scenario", sorted(SCENARIO_VERDICT))
def test_sick_scenario_names_its_verdict(tmp_path: Path, scenario: str) -> None:
    write_run(tmp_path, scenario, scenario, steps=1200, onset=600)
    res = report.build_report(tmp_path / scenario, tmp_path / "out", plots=False)
    ids = _ids(res)
    assert SCENARIO_VERDICT[scenario] in ids, ids
    assert "healthy" not in ids
    v = next(v for v in res["verdicts"] if v["id"] == SCENARIO_VERDICT[scenario])
    assert 600 <= v["steps"][0] <= v["steps"][1] <= 1200, v  # the sick span starts after onset
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
    xs = [0.2, 0.3, 0.4, 0.5, 0.9]  # seed 001 §2's hand calculation
    assert report.percentile(xs, 95) == pytest.approx(0.82)
    assert report.percentile(xs, 50) == pytest.approx(0.4)
    assert report.percentile([3.0], 99) == 3.0
    assert math.isnan(report.percentile([], 50))
    rng = np.random.default_rng(0)
    ys = rng.normal(size=137)
    for p in (5, 25, 50, 95, 99):
        assert report.percentile(ys, p) == pytest.approx(np.percentile(ys, p))
    d = report.describe([0.40, 0.42, 0.44, 0.46, 0.48])
    assert d["stddev"] == pytest.approx(0.0316, abs=1e-3)  # seed 001 §2: smooth rise
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
    assert report.main(["report", str(tmp_path / "run"), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [v["id"] for v in out["verdicts"]] == ["healthy"]
    assert (tmp_path / "run" / ".report" / "report.html").exists()
    assert report.main(["report", str(tmp_path / "nothing")]) == 2


def test_train_demo_loose_grader_is_reward_hacking(tmp_path: Path) -> None:
    # A real tiny GRPO run (about 15 s here) whose grader pays for length from step 200.
    from grpo_monitor.train_demo import Config, train
    train(Config(snapshot_dir=tmp_path, run="td", steps=300, grader="loose", onset=200))
    res = report.build_report(tmp_path / "td", tmp_path / "out", plots=False)
    assert "reward_hacking" in _ids(res), res["text"]


# Every simulate scenario's report names its sickness (the card's verdict), and only what the
# sickness explains; the healthy run is tested above.
SCENARIO_VERDICTS = {
    "rank_stalled": {"rank_stalled"}, "kl_tail": {"kl_tail_outliers"},
    "length_collapse": {"length_shift"}, "reward_std_rising": {"reward_std_rising"},
    "reward_quantile_extreme": {"reward_quantile_extreme"},
    "advantage_vanishing": {"advantage_vanishing"}, "group_dominated": {"group_dominated"},
    "grad_norm_spike": {"grad_norm_spike"},
    "kl_explosion": {"kl_explosion", "kl_tail_outliers", "kl_growth_accelerating"},
    # The groups turn into duplicates as entropy falls: the dead-signal branch of the vanishing
    # card fires too, once nine groups in ten are.
    "entropy_collapse": {"entropy_collapse", "advantage_vanishing", "dead_learning_signal"},
    "kl_growth": {"kl_growth_accelerating"}, "straggler": {"rank_straggler", "step_time_drift"},
    "step_time_drift": {"step_time_drift"}, "reward_up_accuracy_flat": {"reward_hacking"},
    "throughput_drop": {"throughput_drop", "step_time_drift"},
    # The scenarios that turn sick inside the baseline period, caught from the first steps.
    "early_entropy_collapse": {"entropy_collapse", "dead_learning_signal", "advantage_vanishing"},
    "entropy_explosion": {"entropy_explosion", "reward_collapse", "completions_truncated",
                          "length_shift"},
    # Its quantiles fall by over 3 baseline sigmas within 200 steps, once the baseline is ready:
    # the quantile card fires as well, for a few steps.
    "reward_collapse": {"reward_collapse"},
    "dead_signal": {"dead_learning_signal", "advantage_vanishing"},
    "early_length_collapse": {"length_shift"},
}


@pytest.mark.parametrize("scenario", sorted(SCENARIO_VERDICTS))
def test_every_scenario_is_named(scenario: str, tmp_path: Path) -> None:
    from grpo_monitor.simulate import write_run

    write_run(tmp_path, scenario, scenario)
    res = report.build_report(tmp_path / scenario, tmp_path / "out", plots=False)
    assert set(_ids(res)) == SCENARIO_VERDICTS[scenario], res["text"]


def test_card_windows_are_the_exporters() -> None:
    # The report's step windows, initial and baseline means against the exporter's own features
    # (signals.RankSignals) on one irregularly logged signal: the same numbers at every step.
    from grpo_monitor.signals import RankSignals

    rng = random.Random(3)
    steps = sorted(rng.sample(range(1, 700), 400))
    values = [rng.uniform(0, 2) for _ in steps]
    sig = RankSignals(report.th.count("baseline_steps"))
    track = report.Track(np.array(steps), np.array(values), steps[0])
    early, sus, back = (report.th.count("early_window_steps"), report.th.count("sustain_steps"),
                        report.th.count("lookback_steps"))
    p10, p90 = track.rolling(early, "p10"), track.rolling(early, "p90")
    mean, before = track.rolling(sus, "mean"), track.rolling(sus, "mean", offset=back)
    seen = 0
    for i, (st, v) in enumerate(zip(steps, values)):
        sig.add(st, {"x": v}, paused=False)
        f = sig.features()
        pct = {w: (lo, hi) for k, w, lo, hi in f.percentiles}
        means = {(w, o): m for k, w, o, m in f.means}
        assert (early in pct) == np.isfinite(p10[i]), st
        if early in pct:
            assert pct[early] == pytest.approx((p10[i], p90[i]))
            seen += 1
        assert means.get((sus, 0), math.nan) == pytest.approx(mean[i], nan_ok=True)
        assert means.get((sus, back), math.nan) == pytest.approx(before[i], nan_ok=True)
        assert bool(f.ready) == bool(track.ready()[i])
        if "x" in f.initial:
            assert f.initial["x"] == pytest.approx(track.initial())
    assert seen > 300
    assert f.baseline["x"] == pytest.approx((track.baseline(), track.baseline_stddev()))


def test_the_short_window_is_the_exporters() -> None:
    # The early cards read the exporter's 20-step percentiles and 20-step range; the report
    # reads the table's early_window_steps, which must stay that length.
    from grpo_monitor import signals

    assert report.th.count("early_window_steps") in signals.TRAINING_PERCENTILES
    assert report.th.count("early_window_steps") == signals.RANGE_WINDOW
    assert report.th.count("sustain_steps") in signals.TRAINING_PERCENTILES


def test_every_card_has_its_verdict() -> None:
    import yaml

    rules = Path(__file__).resolve().parents[1] / "prometheus" / "rules"
    def names(rule_file: str) -> set[str]:
        groups = yaml.safe_load((rules / rule_file).read_text())["groups"]
        return {r["alert"] for g in groups for r in g["rules"] if "alert" in r}

    alerts, cluster = names("grpo-alerts.yml"), names("grpo-cluster.yml")
    assert alerts <= set(report.CARD_OF_VERDICT.values())
    assert set(report.CARD_OF_VERDICT.values()) <= alerts | cluster
    assert set(report.CARD_OF_VERDICT) <= set(report._EXPLAIN)
    assert {j.__name__ for j in report.STEP_CARD_VERDICTS} <= set(report.CARD_OF_VERDICT)


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
    assert v["steps"] == [68, 150] and v["evidence"]["entropy_initial"] == 1.0
    assert "steps 68-150" in res["text"] and "entropy_window_p90" in res["text"]

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
    "grad_norm_spike": {"grad_norm_spike"}, "kl_explosion": {"kl_explosion", "kl_tail_outliers"},
    "entropy_collapse": {"entropy_collapse", "advantage_vanishing"},
    "kl_growth": {"kl_explosion"}, "straggler": {"rank_straggler", "step_time_drift"},
    "step_time_drift": {"step_time_drift"}, "reward_up_accuracy_flat": {"reward_hacking"},
    "throughput_drop": {"throughput_drop", "step_time_drift"},
}


@pytest.mark.parametrize("scenario", sorted(SCENARIO_VERDICTS))
def test_every_scenario_is_named(scenario: str, tmp_path: Path) -> None:
    from grpo_monitor.simulate import write_run

    write_run(tmp_path, scenario, scenario)
    res = report.build_report(tmp_path / scenario, tmp_path / "out", plots=False)
    assert set(_ids(res)) == SCENARIO_VERDICTS[scenario], res["text"]

"""`grpo-monitor report` on the shared real runs: the healthy ones read `healthy` (the PPO one,
which spent its entropy, reads that it ends at its reward ceiling), the sick ones get the
verdicts of the cards that catch them, from their first steps and with the numbers behind them;
the entropy-reward law is fitted on every run whose entropy moves.

Each run is written as a trainer would have written it (tests/real_runs.py, the keys as logged)
and the report runs on that snapshot folder through its command line. The expectations follow
what each run's log shows (the collection's README and PROVENANCE.md), not the thresholds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grpo_monitor import cli
from promtool_harness import fired
from real_runs import load, play_real, write_snapshots

HEALTHY = ("unsloth-llama32-3b-grpo-gsm8k-500", "unslothgrpo-llama31-8b-gsm8k-250",
           "verl-grpo-qwen2-7b-gsm8k-megatron-base")
# Healthy too, and it ends at the ceiling its entropy allows: see test_ppo_run_ends_at_its_ceiling.
AT_CEILING = "verl-ppo-qwen25-05b-gsm8k"
COLLAPSE = "trl-dapo-qwen25vl-3b-aokvqa-collapse"
SPARSE = "memredteam-qwen25-3b-grpo-sparse-reward"
# The runs whose entropy moves, logged beside reward: the entropy-reward law is fitted on them.
# The sparse-reward run logs entropy too, but it sits still (see test_a_still_entropy_is_not_fitted).
WITH_ENTROPY = (COLLAPSE, "verl-grpo-qwen2-7b-gsm8k-megatron-base", AT_CEILING)


def _report_json(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """What `grpo-monitor report RUN_DIR --format json` prints for the run."""
    write_snapshots(load(name), tmp_path / "snapshots", name)
    code = cli.main(["report", str(tmp_path / "snapshots" / name), "--out",
                        str(tmp_path / "out"), "--format", "json"])
    assert code == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _report(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The verdicts `grpo-monitor report RUN_DIR --format json` prints for the run."""
    verdicts: list[dict[str, Any]] = _report_json(name, tmp_path, capsys)["verdicts"]
    return verdicts


def _by_id(verdicts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {v["id"]: v for v in verdicts}


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_real_run_reads_healthy(name: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    verdicts = _report(name, tmp_path, capsys)
    assert [(v["id"], v["severity"]) for v in verdicts] == [("healthy", "info")], verdicts


def test_collapsing_run_gets_entropy_collapse_length_shift_and_dead_signal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Logged every 10 steps: entropy 0.96 at step 10, under 0.1x that from step 130; length
    # 53 -> 2.6 tokens by step 20; nine groups in ten with equal rewards from step ~20.
    verdicts = _by_id(_report(COLLAPSE, tmp_path, capsys))
    assert {"entropy_collapse", "length_shift", "dead_learning_signal"} <= set(verdicts)
    assert "healthy" not in verdicts

    entropy = verdicts["entropy_collapse"]
    assert (entropy["severity"], entropy["card"]) == ("critical", "GRPOEntropyCollapse")
    ev = entropy["evidence"]
    assert ev["initial"] == pytest.approx(0.9559, abs=1e-3)  # step 10 alone
    assert ev["window_p90"] < ev["below"] == pytest.approx(0.09559, abs=1e-4)
    assert 130 <= entropy["steps"][0] <= 130 + 50 and entropy["steps"][1] == 490

    length = verdicts["length_shift"]["evidence"]["against_initial"]
    assert length["initial"] == pytest.approx(53.35)
    assert length["ratio_to_initial"] < 0.1  # 2-5 tokens out of 53
    assert 20 <= length["steps"][0] <= 20 + 50

    dead = verdicts["dead_learning_signal"]
    assert dead["card"] == "GRPOAdvantageVanishing"
    assert dead["evidence"]["dead_groups"]["window_mean"] > 0.9
    assert dead["steps"][0] <= 20 + 100  # twenty-step windows of values ten steps apart


def test_sparse_reward_run_gets_the_dead_learning_signal_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Reward 0 at 84 of 100 steps, groups with equal rewards 96% on average, from step 1. The
    # reward is flat and KL near 0 because nothing is learnt: the plateau verdicts, which would
    # blame the KL coefficient, are left out beside the dead signal.
    verdicts = _report(SPARSE, tmp_path, capsys)
    assert [v["id"] for v in verdicts] == ["dead_learning_signal"], verdicts
    dead = verdicts[0]
    assert dead["severity"] == "warning"
    # From its 6th step: the 20-step window covers the run so far, and its first records are
    # already dead (the live card fires there too: tests/test_real_run_cards.py).
    assert dead["steps"] == [6, 100]
    groups, constant = dead["evidence"]["dead_groups"], dead["evidence"]["reward_constant"]
    assert groups["zero_std_share_run_mean"] == pytest.approx(0.96)
    assert groups["window_mean"] > groups["above"]
    assert (constant["steps_with_reward_std_0"], constant["steps_logged"]) == (84, 100)
    assert constant["window_p90"] == constant["below"] == 0


def test_ppo_run_ends_at_its_ceiling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # verl's PPO reference run trades entropy for reward along the law: fitted on its first 22
    # blocks, the law predicts the last 22 within 0.015 (2% of the reward's range). Its entropy
    # falls from 0.51 to a 50-step mean of 0.064 by step 296, where (exp(H) - 1) / (exp(H0) - 1)
    # crosses 0.1 (0.09997) with R² 0.97: from there the ceiling card fires live too (the test
    # below), and the law gives it under a tenth of the gain it had ahead at the start.
    out = _report_json(AT_CEILING, tmp_path, capsys)
    assert [(v["id"], v["severity"]) for v in out["verdicts"]] == [("reward_ceiling_near", "warning")]
    v = out["verdicts"][0]
    assert v["steps"] == [296, 434]
    ev = v["evidence"]
    assert ev["headroom_ratio"] == pytest.approx(0.09997, abs=1e-5)
    assert ev["law_r_squared"] == pytest.approx(0.966, abs=1e-3)
    assert ev["entropy/mean:initial"] == pytest.approx(0.5102, abs=1e-4)
    law = out["summary"]["entropy_reward_law"]
    assert law["end"]["near_ceiling"] and law["end"]["headroom_ratio"] == pytest.approx(0.0873, abs=1e-4)
    assert law["prediction"]["error_pct_of_range"] == pytest.approx(2.15, abs=0.01)


@pytest.mark.parametrize("name", WITH_ENTROPY)
def test_entropy_reward_law_on_the_real_runs(name: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # Fitted on the first half of each run's 10-step blocks, judged on the second: a finite error
    # on the run's own later steps, and the text says so.
    out = _report_json(name, tmp_path, capsys)
    law = out["summary"]["entropy_reward_law"]
    assert law["fitted"], law
    assert law["first_half"]["points"] >= 5
    pred = law["prediction"]
    assert pred["blocks"] >= law["first_half"]["points"]
    assert 0 <= pred["mean_abs_error"] < float("inf") and 0 <= pred["error_pct_of_range"]
    assert pred["steps"][0] > law["first_half"]["steps"][1]
    text = (tmp_path / "out" / "report.txt").read_text()
    assert "its prediction of the rest" in text and "mean absolute error" in text
    assert (tmp_path / "out" / "law.png").is_file()


def test_a_still_entropy_is_not_fitted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The sparse-reward run's entropy block means over its first half: 0.0771 to 0.0828, 7% of
    # the largest, under forecast.MIN_ENTROPY_SPREAD; a law fitted there (a = 3.2 on a reward of
    # 0 to 0.03) would be a line through noise. The section says why, and still gives the end.
    law = _report_json(SPARSE, tmp_path, capsys)["summary"]["entropy_reward_law"]
    assert (law["fitted"], law["blocks"]) == (False, 11)
    assert law["reason"].startswith("over the first half entropy moved by less than 10%")
    assert "prediction" not in law and "whole_run" not in law
    assert not law["end"]["near_ceiling"] and law["end"]["headroom_ratio"] > 1


@pytest.mark.parametrize("name", (COLLAPSE, SPARSE, AT_CEILING))
def test_verdicts_start_where_their_cards_first_fire(name: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # The same run through the exporter and the real rules (promtool): each card that fired has
    # its verdict, whose span starts at the step the card first fired, and no verdict names a
    # card that stayed silent. The report's own three-curve verdicts have no card.
    # The coverage card (a curve the run never logged) is no verdict on the run's health: the
    # report's "not judged" section says what the run could not be judged on.
    cards = {c: s for c, s in fired(play_real(name), tmp_path).items() if c != "GRPOSignalMissing"}
    verdicts = [v for v in _report(name, tmp_path, capsys) if v["card"] is not None]
    assert {v["card"] for v in verdicts} == set(cards), (cards, verdicts)
    for card, spans in cards.items():
        assert min(v["steps"][0] for v in verdicts if v["card"] == card) == spans[0][0], card


def test_the_text_report_names_every_file_it_wrote(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # verl's PPO run has an entropy-reward law, so law.png is written too: the closing line lists
    # what the folder holds, no more, no less; report.html's "Not judged" is a heading line and a
    # list of the cards it could not judge (its heading line no bullet of that list).
    write_snapshots(load(AT_CEILING), tmp_path / "snapshots", AT_CEILING)
    out = tmp_path / "out"
    assert cli.main(["report", str(tmp_path / "snapshots" / AT_CEILING), "--out", str(out)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("report written to"))
    named = set(line.split("(", 1)[1].rstrip(")").split(", "))
    assert "law.png" in named and named == {p.name for p in out.iterdir()}, (line, sorted(out.iterdir()))
    html_text = (out / "report.html").read_text()
    section = html_text.split("<h2>Not judged</h2>", 1)[1].split("<h2>", 1)[0]
    assert section.startswith("<p>") and "<li>not judged" not in section
    assert "<ul><li>" in section

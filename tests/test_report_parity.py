"""The report and the live rules on the rule branches no shared real run exercises.

tests/test_real_run_verdicts.py holds `grpo-monitor report` to the cards the committed rules raise
on every shared real run. A few branches fire on none of them: the mean reward's collapse and its
constant value where a run logs no spread (reasons mean_only, mean_constant), and the entropy
leaving the floor it settled at. Each is a run written here as a trainer's flat log, played as a
real run is (the exporter's ingest and store, one scrape per logged step, the real promtool) and
read by the report: both must name the same card, from about the same step. One more run
crosses the lines of the declared level branches (contract/card_logic.py) that no shared run
crosses: the rollout weights' two-sided level, stale rollouts, prompts too easy and the grad
norm's spike against its baseline, which waits for the baseline period.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from promtool_harness import fired_at, intervals
from real_runs import play_real
from test_real_run_verdicts import PARITY_STEPS, report_cards


def _write(tmp: Path, name: str, rows: list[dict[str, float]]) -> Path:
    path = tmp / name / "derived_steps.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps({"step": i + 1, **r}) + "\n" for i, r in enumerate(rows)))
    return path


def _reward_falls_to_zero() -> list[dict[str, float]]:
    # A loop that logs its batch's mean reward and a loss: 0.6 for 60 steps, then 0 for good.
    rng = random.Random(5)
    return [{"reward": (0.6 + rng.gauss(0, 0.03)) if i < 60 else 0.0, "loss": rng.gauss(0, 0.1)}
            for i in range(140)]


def _reward_stuck() -> list[dict[str, float]]:
    # The same loop whose reward never moves off zero: no group ever scores.
    rng = random.Random(6)
    return [{"reward": 0.0, "loss": rng.gauss(0, 0.01)} for _ in range(80)]


def _entropy_leaves_its_floor() -> list[dict[str, float]]:
    # Entropy 0.4 -> 0.2 over the first 150 steps, flat to step 400, then a plateau at 0.4.
    rng = random.Random(7)
    return [{"entropy": (0.2 + 0.2 * math.exp(-i / 50) if i < 400 else 0.4) * (1 + rng.gauss(0, 0.02))}
            for i in range(480)]


def _levels_crossed() -> list[dict[str, float]]:
    # Grad norm ~1 through its 200-step baseline, 8x from step 231; rollouts 6 versions old from
    # step 101; the mean importance weight 0.4 (under 0.5) from step 151; 60% of the groups all
    # right from step 181.
    rng = random.Random(8)
    return [{"grad/norm": (8.0 if i >= 230 else 1.0) * (1 + rng.gauss(0, 0.05)),
             "staleness/mean": 6.0 if i >= 100 else 1.0,
             "mismatch/is_weight_mean": (0.4 if i >= 150 else 1.0) + rng.gauss(0, 0.01),
             "group/all_right_frac": 0.6 if i >= 180 else 0.1,
             "reward/mean": 0.5 + rng.gauss(0, 0.02)}
            for i in range(280)]


CASES = {
    # (rows, the card both name, the step its sickness starts)
    "mean_only_collapse": (_reward_falls_to_zero, "GRPORewardCollapse", 61),
    "mean_constant": (_reward_stuck, "GRPOAdvantageVanishing", 1),
    "entropy_rebound": (_entropy_leaves_its_floor, "GRPOEntropyRebound", 401),
    "declared_levels": (_levels_crossed, "GRPOGradNormSpike", 231),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_names_the_card_the_rules_raise(case: str, tmp_path: Path) -> None:
    rows, card, onset = CASES[case]
    path = _write(tmp_path / "runs", case, rows())
    played = play_real(path)
    spans = intervals(played.scrape_steps, fired_at(played, tmp_path))
    rules = {c: s[0][0] for c, s in spans.items() if c != "GRPOSignalMissing"}
    assert card in rules and rules[card] >= onset, spans
    named = report_cards(str(path), tmp_path / "report")
    assert set(named) == set(rules), (named, rules)
    assert all(abs(named[c] - rules[c]) <= PARITY_STEPS for c in rules), (named, rules)

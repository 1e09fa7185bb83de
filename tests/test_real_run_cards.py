"""The cards on real runs, replayed exactly as their frameworks logged them.

Each shared run (tests/real_runs.py) is written into a snapshot folder record by record, read by
the exporter's ingest and store, scraped after every logged step and judged by the project's
rule files in the real promtool. A healthy run raises no card at all but the coverage card for a
minimum curve it does not log; a sick one raises the card of its sickness within 50 steps of the onset, inside the 200-step baseline period where
these short runs live, and its red card is still red at the run's last step.

Which cards fired is read from the play's one evaluation in promtool (promtool_harness.check_fired,
fired_at), with staleness markers as the real Prometheus writes them: the session keeps it, and
tests/test_real_run_verdicts.py and tests/test_report_real_runs.py read the same evaluation of
the same play instead of running promtool again (the 2,959-step run: 50-90 s of promtool each).

The cards are not tuned to these six runs: their thresholds are the rules' own (see
docs/signals.md), and the synthetic scenarios (tests/test_scenarios.py) hold each card to the
same standard on sicknesses these runs do not show.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_monitor.contract.cards import MINIMUM_CURVES
from grpo_monitor.contract.keys import canonical_key
from promtool_harness import Check, Played, check_fired, scrape_index_at
from real_runs import load, play_real

HEALTHY = ("unsloth-llama32-3b-grpo-gsm8k-500", "unslothgrpo-llama31-8b-gsm8k-250",
           "verl-ppo-qwen25-05b-gsm8k", "verl-grpo-qwen2-7b-gsm8k-megatron-base",
           "aaipl-gptoss20b-minesweeper-grpo-healthy", "deepgrpo-qwen25-0.5b-gsm8k-verl-healthy",
           "gemma3-1b-gsm8k-unsloth-abdo-healthy", "unsloth-llama31-8b-gsm8k-techtinker-healthy")
# Healthy by their authors, and the yellow cards they raise are true: the Minesweeper run's
# completions sit at the 128-token cap (77-100%) and up to 90% of its groups have one reward.
TRUE_YELLOW = {"aaipl-gptoss20b-minesweeper-grpo-healthy": {"GRPOAdvantageVanishing",
                                                         "GRPOCompletionsTruncated"}}
# Sick, with the step the authors' data put the onset at, and the card that must come within 50
# steps of it (red cards, or the yellow card of the sickness).
SICK_ONSET = {
    # verl, Mixed-CUTS rollouts: entropy, KL and length explode together from step ~48; the
    # length's steady climb (5x over its last records) is its own yellow card.
    "mixedcuts-qwen3-1.7b-math-verl-collapse": (48, {"GRPOTrainingBlowUp", "GRPOResponseLengthShift"}),
    # verl: KL loss 0.16 -> 1.05 and length 1,500 -> 2,600 from step ~63.
    "grpo-qwen3-1.7b-math-verl-klblowup": (63, {"GRPOTrainingBlowUp", "GRPOResponseLengthShift"}),
    # TRL: reward 0 and zero-spread groups from step 1.
    "recall-qwen25-7b-l3-zero-std-dead": (1, {"GRPOAdvantageVanishing"}),
    # verl fork: entropy leaves its 0.15-0.25 band at step 678 for a 0.30-0.45 plateau (1.6-1.9x
    # its floor, the yellow card) and is above 0.35 for good from step 790, 1.0 at 850 (the red
    # card, measured from the start of the explosion).
    "treerl-qwen25-0.5b-gsm8k-verl-entropy-explosion": (678, {"GRPOEntropyRebound"}),
}
# A sickness that worsens: the red card that follows, within 50 steps of its own onset.
WORSENS = {"treerl-qwen25-0.5b-gsm8k-verl-entropy-explosion": (790, {"GRPOEntropyRebound",
                                                                    "GRPOEntropyExplosion"})}
# Dead learning signal from the first step: reward 0 at 84 of 100 steps, 96% of the groups
# with identical rewards.
DEAD = "memredteam-qwen25-3b-grpo-sparse-reward"
# Sick from the start, logged every 10 steps: length 53 -> 2.6 tokens by step 20, entropy
# 0.96 -> 0.11 by step 100 and ~0.03 later, zero-std groups near 100%.
COLLAPSE = "trl-dapo-qwen25vl-3b-aokvqa-collapse"
CAUGHT_WITHIN = 50
# Healthy, and done: verl's PPO reference run spends its entropy (0.52 -> 0.06) on the
# entropy-reward law (R² 0.97 on its 10-step blocks) and plateaus under the law's ceiling (0.755;
# its reward 0.697 at step 250, 0.718 at its last, step 435). The forecast card says so from about
# step 300, a yellow card; no other card, and no red one.
PLATEAUED = {"verl-ppo-qwen25-05b-gsm8k": {"GRPORewardCeilingNear"}}


def last(played: Played) -> int:
    return len(played.scrape_steps) - 1


def coverage(name: str) -> set[str]:
    """The coverage card, for a run that does not log one of the minimum curves (the Unsloth
    runs log no entropy, one of them no grad norm either; the DAPO fork logs no KL): yellow, and
    true."""
    logged = {canonical_key(k) for rec in load(name) for k in rec}
    return {"GRPOSignalMissing"} if set(MINIMUM_CURVES) - logged else set()


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_real_run_raises_no_card(name: str, tmp_path: Path) -> None:
    played = play_real(name)
    expected = PLATEAUED.get(name, set()) | coverage(name) | TRUE_YELLOW.get(name, set())
    check_fired(played, [(last(played), expected), Check(last(played), set(), only=',severity="critical"')],
                tmp_path, what=name)


@pytest.mark.parametrize("every", [1, 5])
def test_dead_learning_signal_is_caught_from_the_first_steps(every: int, tmp_path: Path) -> None:
    # Logged every step as the run was, and thinned to every 5th step: the same card, as soon.
    played = play_real(DEAD, every=every)
    onset = played.scrape_steps[0]
    check_fired(played, [(scrape_index_at(played, onset + CAUGHT_WITHIN), {"GRPOAdvantageVanishing"}),
                         (last(played), {"GRPOAdvantageVanishing"})], tmp_path,
                what=f"{DEAD}, every {every} step(s)")


def test_early_collapse_is_caught_and_the_red_card_holds(tmp_path: Path) -> None:
    played = play_real(COLLAPSE)
    onset = played.scrape_steps[0]  # sick from its first logged step
    check_fired(played, [
        # Within 50 steps: the answers shrank from 53 tokens to 2 against the initial length.
        (scrape_index_at(played, onset + CAUGHT_WITHIN), {"GRPOResponseLengthShift"}),
        # Entropy passes 0.1x its initial value at step 130 (after falling since the start);
        # the red card follows within the next two logged steps ...
        Check(scrape_index_at(played, 150), {"GRPOEntropyCollapse"}, only=',alertname="GRPOEntropyCollapse"'),
        # ... and is still red at the run's last step, 340 steps later.
        Check(last(played), {"GRPOEntropyCollapse"}, now=True, only=',severity="critical"'),
        # By the end: the collapse's cards and the coverage card (no KL), and nothing else.
        (last(played), {"GRPOResponseLengthShift", "GRPOEntropyCollapse", "GRPOAdvantageVanishing"}
         | coverage(COLLAPSE)),
    ], tmp_path, what=COLLAPSE)


@pytest.mark.parametrize("name", sorted(SICK_ONSET))
def test_sick_real_run_is_caught_within_50_steps_of_its_onset(name: str, tmp_path: Path) -> None:
    onset, cards = SICK_ONSET[name]
    played = play_real(name)
    checks = [(onset, cards), *([WORSENS[name]] if name in WORSENS else [])]
    check_fired(played, [Check(min(scrape_index_at(played, step + CAUGHT_WITHIN), last(played)),
                               expected, only=',alertname!="GRPOSignalMissing"')
                         for step, expected in checks], tmp_path, what=name)

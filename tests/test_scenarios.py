"""Every card fires on its sickness, with its severity, and nothing fires on healthy runs.

Each scenario of `grpo-monitor simulate` is played through the SDK, the exporter's ingest and
store, and the real rule files evaluated by promtool (tests/promtool_harness.py). A scenario
starts healthy: no card may fire before its onset; by its end exactly its cards have fired.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_monitor.tools.simulate import SCENARIOS
from promtool_harness import (SEVERITIES, Check, Played, check_cards, play, scrape_index_at,
                              scrape_index_before)

# One scrape every 10 steps: a 5-minute step scraped every 15 s would give one scrape per step,
# a 1.5 s step ten steps per scrape; the cards must not care (see the cadence test below).
SCRAPE_EVERY = 10
# ... but for a run of a few dozen steps, scraped at every step: six scrapes of a 61-step blow-up
# would leave a card that holds for four steps (a length trend that turns into a jump) between
# two of them, and the report, which reads every step, names it.
SHORT_RUN_STEPS = 100


def scrape_every(name: str) -> int:
    return 1 if SCENARIOS[name].steps <= SHORT_RUN_STEPS else SCRAPE_EVERY


def quiet_before_onset(played: Played, onset: int) -> list[tuple[int, set[str]]]:
    """No card by the last scrape before the onset; nothing to check for a run sick from its
    first step."""
    if played.scrape_steps[0] >= onset:
        return []
    return [(scrape_index_before(played, onset), set())]


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "healthy"])
def test_sickness_raises_its_cards_in_time_and_none_before_onset(name: str, tmp_path: Path) -> None:
    sc = SCENARIOS[name]
    played = play(name, scrape_every=scrape_every(name))
    last = len(played.scrape_steps) - 1
    primary = sc.alerts[0]
    red = {a for a in sc.alerts if SEVERITIES[a] == "critical"}
    check_cards(played, [
        *quiet_before_onset(played, sc.onset),
        (last, set(sc.alerts)),
        # Caught in time: its first card by `caught_within` steps after the onset.
        Check(scrape_index_at(played, sc.onset + sc.caught_within), {primary},
              only=f',alertname="{primary}"'),
        # A red card stays red while the sickness lasts: every scenario holds its sickness to
        # its last step, hundreds of steps after the onset.
        Check(last, red, now=True, only=',severity="critical"'),
    ], tmp_path)


# Sicknesses whose first card must come as fast when the trainer logs every 5th or 10th step
# (TRL's logging_steps): the windows count steps, not records.
SPARSE = ("early_entropy_collapse", "entropy_explosion", "early_length_collapse", "dead_signal",
          "kl_explosion", "grad_norm_spike", "nan_loss")


@pytest.mark.parametrize("log_every", [5, 10])
@pytest.mark.parametrize("name", SPARSE)
def test_sparse_logging_raises_the_same_cards_at_the_same_steps(name: str, log_every: int,
                                                                tmp_path: Path) -> None:
    sc = SCENARIOS[name]
    played = play(name, scrape_every=SCRAPE_EVERY, log_every=log_every)
    primary = sc.alerts[0]
    check_cards(played, [
        *quiet_before_onset(played, sc.onset),
        (len(played.scrape_steps) - 1, set(sc.alerts)),
        # One logging interval of slack: the first sick record may be up to k - 1 steps late.
        Check(scrape_index_at(played, sc.onset + sc.caught_within + log_every), {primary},
              only=f',alertname="{primary}"'),
    ], tmp_path)

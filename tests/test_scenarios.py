"""Every card fires on its sickness, with its severity, and nothing fires on healthy runs.

Each scenario of `grpo-monitor simulate` is played through the SDK, the exporter's ingest and
store, and the real rule files evaluated by promtool (tests/scenario_rules.py). A scenario
starts healthy: no card may fire before its onset; by its end exactly its cards have fired.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_monitor.simulate import SCENARIOS
from scenario_rules import SEVERITIES, Played, check_cards, play, scrape_index_at, scrape_index_before

# One scrape every 10 steps: a 5-minute step scraped every 15 s would give one scrape per step,
# a 1.5 s step ten steps per scrape; the cards must not care (see the cadence test below).
SCRAPE_EVERY = 10


def quiet_before_onset(played: Played, onset: int) -> list[tuple[int, set[str]]]:
    """No card by the last scrape before the onset; nothing to check for a run sick from its
    first step."""
    if played.scrape_steps[0] >= onset:
        return []
    return [(scrape_index_before(played, onset), set())]


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "healthy"])
def test_sickness_raises_its_cards_in_time_and_none_before_onset(name: str, tmp_path: Path) -> None:
    sc = SCENARIOS[name]
    played = play(name, scrape_every=SCRAPE_EVERY)
    last = len(played.scrape_steps) - 1
    primary = sc.alerts[0]
    check_cards(played, [*quiet_before_onset(played, sc.onset), (last, set(sc.alerts))], tmp_path)
    # Caught in time: its first card by `caught_within` steps after the onset.
    check_cards(played, [(scrape_index_at(played, sc.onset + sc.caught_within), {primary})],
                tmp_path, only=f',alertname="{primary}"')
    # A red card stays red while the sickness lasts: every scenario holds its sickness to its
    # last step, hundreds of steps after the onset.
    red = {a for a in sc.alerts if SEVERITIES[a] == "critical"}
    check_cards(played, [(last, red)], tmp_path, now=True, only=',severity="critical"')


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
    check_cards(played, [*quiet_before_onset(played, sc.onset),
                         (len(played.scrape_steps) - 1, set(sc.alerts))], tmp_path)
    # One logging interval of slack: the first sick record may be up to k - 1 steps late.
    check_cards(played, [(scrape_index_at(played, sc.onset + sc.caught_within + log_every),
                          {primary})], tmp_path, only=f',alertname="{primary}"')


@pytest.mark.parametrize("scrape_every", [1, 7, 50])
def test_long_healthy_run_raises_nothing_at_any_cadence(scrape_every: int, tmp_path: Path) -> None:
    # 3000 steps: reward rises, KL climbs then flattens, entropy falls ~45% and settles, six
    # checkpoint saves and eight one-step grad-norm spikes. None of that is a card.
    played = play("healthy", scrape_every=scrape_every)
    check_cards(played, [(len(played.scrape_steps) - 1, set())], tmp_path)


@pytest.mark.parametrize("scrape_every", [3, 30])
def test_cards_do_not_depend_on_the_scrape_cadence(scrape_every: int, tmp_path: Path) -> None:
    # The same runs scraped 10x more and 3x less often raise the same cards.
    for name in ("kl_explosion", "step_time_drift", "reward_hacking"):
        played = play(name, scrape_every=scrape_every)
        check_cards(played, [(len(played.scrape_steps) - 1, set(SCENARIOS[name].alerts))], tmp_path)


def test_the_seed_cases_are_scenarios() -> None:
    # Seed 000 §4.1-§4.5, one scenario each.
    sections = {sc.seed_section for sc in SCENARIOS.values()}
    assert {"§4.1", "§4.2", "§4.3", "§4.4", "§4.5"} <= sections
    cards = {card for sc in SCENARIOS.values() for card in sc.alerts}
    import yaml

    def alerts(name: str) -> set[str]:
        rules = yaml.safe_load((Path(__file__).parents[1] / "prometheus/rules" / name).read_text())
        return {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}

    # Every training card has a scenario that proves it; the cluster ones that snapshots can
    # show (a straggler) too. NVML's hardware counters are proven by promtool unit tests.
    assert alerts("grpo-alerts.yml") | {"GRPORankStraggler"} == cards
    assert cards <= alerts("grpo-alerts.yml") | alerts("grpo-cluster.yml")

"""Fast blow-ups in short runs, and the run-level pace the hung card waits for.

The blow-up card (GRPOTrainingBlowUp) judges a run's signals in logged records, not steps, and
needs no baseline: a 60-step run that collapses on every front at step 48 turns red within 3
logged steps, and so does a run logging every 5th step, 40 records long, at its 32nd record.
Played through the SDK, the exporter's ingest and store and the real rules in promtool
(promtool_harness), scraped after every logged record. The run's end mark does not clear the
card: a run that ends sick keeps its red card.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from grpo_monitor.contract import thresholds
from grpo_monitor.contract.snapshot import parse_record
from grpo_monitor.runtime.store import HUNG_RETAIN_UNPACED, PACE_MIN_INTERVALS, RunStore
from grpo_monitor.tools.simulate import SCENARIOS
from promtool_harness import Check, check_cards, play, scrape_index_at, scrape_index_before

CARD = "GRPOTrainingBlowUp"
ONLY = f',alertname="{CARD}",severity="critical"'


@pytest.mark.parametrize(("steps", "onset", "log_every"), [
    (61, 48, 1),    # 61 records, sick from the 48th
    (200, 160, 5),  # 40 records, sick from the 32nd
])
def test_a_short_run_blowing_up_is_red_within_3_logged_steps(steps: int, onset: int, log_every: int,
                                                             tmp_path: Path) -> None:
    played = play("blow_up", scrape_every=1, steps=steps, onset=onset, log_every=log_every,
                  end_mark=True)
    last = len(played.scrape_steps) - 1
    check_cards(played, [
        # Nothing before the onset: no red card, no card at all.
        (scrape_index_before(played, onset), set()),
        # The onset's record and the two after it: red by the third.
        Check(scrape_index_at(played, onset + 2 * log_every), {CARD}, only=ONLY),
        # Red at the last record, and still red once the run has marked its end.
        Check(last - 1, {CARD}, now=True, only=ONLY),
        Check(last, {CARD}, now=True, only=ONLY),
    ], tmp_path)


def test_a_blow_up_in_the_last_steps_is_caught_before_the_run_ends(tmp_path: Path) -> None:
    # The milder sister: KL, grad norm and length over the last 10 steps of 72.
    sc = SCENARIOS["blow_up_late"]
    played = play("blow_up_late", scrape_every=1, end_mark=True)
    last = len(played.scrape_steps) - 1
    check_cards(played, [
        (scrape_index_before(played, sc.onset), set()),
        Check(scrape_index_at(played, sc.onset + sc.caught_within), {CARD}, only=ONLY),
        Check(last, {CARD}, now=True, only=ONLY),
    ], tmp_path)


# -- the pace the hung card waits for ----------------------------------------------------------

def _apply(store: RunStore, step: int, t: float, *, run: str = "r") -> None:
    record: dict[str, Any] = {"run": run, "rank": 0, "step": step, "time": t, "metrics": {"loss": 0.1}}
    store.apply(parse_record(record, run=run, rank=0, mtime=t), wrote_at=t)
    store.flush()


def _interval(store: RunStore, run: str = "r") -> float | None:
    for line in store.render():
        for sample in line.splitlines():
            if sample.startswith(f'grpo_run_log_interval_seconds{{run="{run}"}}'):
                return float(sample.rsplit(" ", 1)[1])
    return None


def test_a_runs_pace_is_published_from_its_third_interval() -> None:
    # A 70B-style run: a record every 10 minutes, every 10th step. Its first intervals say
    # nothing yet, and the hung card waits for its unpaced floor until the pace is published.
    store = RunStore()
    t0 = 1_764_400_000.0
    for i in range(PACE_MIN_INTERVALS + 1):
        assert _interval(store) is None, i
        _apply(store, 10 * (i + 1), t0 + 600 * i)
    assert _interval(store) == 600.0


def test_a_run_without_a_pace_outlives_the_timeout_until_it_can_be_called_hung() -> None:
    # One record, then silence: no pace, so the card judges it against the unpaced floor; the
    # store keeps it HUNG_RETAIN_UNPACED times that long, past --snapshot.run-timeout.
    store = RunStore()
    t0 = time.time() - 10
    _apply(store, 1, t0)
    floor = thresholds.value("run_hung_unpaced_seconds")
    keep = HUNG_RETAIN_UNPACED * floor
    assert keep > floor
    timeout = 3600.0
    assert store.expire(t0 + keep - 1, timeout) == []
    assert store.expire(t0 + keep + 1, timeout) == ["r"]

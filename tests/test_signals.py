"""Step-window features: baselines, windows in steps, restarts, re-baselining."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import Running, parse_samples, value
from grpo_monitor.contract.snapshot import parse_record
from grpo_monitor.runtime.signals import NONFINITE_WINDOW, RankSignals
from grpo_monitor.runtime.store import Limits, RunStore


def feed(sig: RankSignals, steps: range, fn: Callable[[int], dict[str, float]], stalled: set[int] = frozenset()) -> None:  # type: ignore[assignment]
    for s in steps:
        sig.add(s, fn(s), s in stalled)


def test_baseline_is_the_first_steps_and_record_only() -> None:
    sig = RankSignals(baseline_steps=200)
    feed(sig, range(1, 200), lambda s: {"kl/mean": float(s)})
    assert not sig.ready and sig.features().baseline == {}
    feed(sig, range(200, 400), lambda s: {"kl/mean": float(s)})
    f = sig.features()
    assert f.ready
    mean, std = f.baseline["kl/mean"]
    assert mean == pytest.approx(100.5)  # steps 1..200
    assert std == pytest.approx(math.sqrt(sum((x - 100.5) ** 2 for x in range(1, 201)) / 199))


def test_windows_min_max_mean_growth() -> None:
    sig = RankSignals(baseline_steps=10)
    feed(sig, range(1, 401), lambda s: {"entropy/mean": float(s)})
    f = sig.features()
    means = {(w, o): m for k, w, o, m in f.means}
    assert means[(50, 0)] == pytest.approx(375.5)  # steps 351..400
    assert means[(50, 200)] == pytest.approx(175.5)  # steps 151..200
    assert means[(100, 300)] == pytest.approx(50.5)  # steps 1..100
    growth = {o: g for k, o, g in f.growth}
    assert growth[0] == pytest.approx(350.5 / 250.5 - 1)
    extremes = {w: (lo, hi) for k, w, lo, hi in f.extremes}
    assert extremes[50] == (351.0, 400.0)
    # Complete windows 100-199, 200-299, 300-399 (1-99 is partial): the last two rose.
    assert f.rising["entropy/mean"] == 2


def test_a_window_waits_for_enough_history() -> None:
    sig = RankSignals(baseline_steps=10)
    feed(sig, range(1, 150), lambda s: {"loss": 1.0})
    means = {(w, o) for k, w, o, m in sig.features().means}
    assert (50, 0) in means and (100, 0) in means
    assert (50, 200) not in means and (200, 0) not in means


def test_windows_are_in_steps_for_sparse_keys() -> None:
    # Quantiles logged every 100 steps: a 100-step window holds one value, not a hundred.
    sig = RankSignals(baseline_steps=10)
    for s in range(1, 1001):
        sig.add(s, {"reward/p95": float(s)} if s % 100 == 0 else {"loss": 0.0}, False)
    means = {(w, o): m for k, w, o, m in sig.features().means if k == "reward/p95"}
    assert means[(100, 0)] == 1000.0
    assert means[(100, 300)] == 700.0


def test_perf_values_of_checkpoint_steps_are_left_out() -> None:
    sig = RankSignals(baseline_steps=100)
    feed(sig, range(1, 301), lambda s: {"perf/step_time_s": 50.0 if s % 100 == 0 else 5.0},
         stalled={100, 200, 300})
    f = sig.features()
    assert f.baseline["perf/step_time_s"] == (5.0, 0.0)
    assert {w: (lo, hi) for k, w, lo, hi in f.extremes}[50] == (5.0, 5.0)


def test_going_back_in_steps_undoes_the_steps_after_it() -> None:
    """Resumed from the step-300 checkpoint: steps 300..500 are undone. The windows hold the
    surviving steps and the new ones, the NaN of step 480 is gone, the baseline (steps 1..100)
    stands since the rewind does not reach into it."""
    sig = RankSignals(baseline_steps=100)
    feed(sig, range(1, 501), lambda s: {"loss": 1.0})
    sig.add(480, {"loss": math.nan}, False)
    assert sig.features().nonfinite["loss"] == 1
    feed(sig, range(300, 360), lambda s: {"loss": 2.0})
    f = sig.features()
    assert "loss" not in f.nonfinite  # 0: not published
    means = {(w, o): m for k, w, o, m in f.means}
    assert means[(50, 0)] == 2.0 and means[(100, 0)] == pytest.approx((40 * 1.0 + 60 * 2.0) / 100)
    assert f.baseline["loss"] == (1.0, 0.0)


def test_a_baseline_mean_and_ratio_are_published_only_while_the_baseline_is_ready() -> None:
    """GRPOStepTimeDrift and GRPOThroughputDrop wait for the baseline by reading
    grpo_window_baseline_ratio alone (prometheus/rules/grpo-alerts.yml): no rank may publish a
    baseline mean or a ratio to it before its baseline is ready, nor after going back into it."""
    sig = RankSignals(baseline_steps=100)
    feed(sig, range(1, 100), lambda s: {"perf/step_time_s": 10.0, "perf/samples_per_s": 2.0})
    assert not sig.ready and sig.features().baseline == {} and sig.features().baseline_ratios == {}
    feed(sig, range(100, 102), lambda s: {"perf/step_time_s": 10.0, "perf/samples_per_s": 2.0})
    assert sig.ready and set(sig.features().baseline) == {"perf/step_time_s", "perf/samples_per_s"}
    assert sig.features().baseline_ratios == {"perf/step_time_s": 1.0, "perf/samples_per_s": 1.0}
    feed(sig, range(60, 70), lambda s: {"perf/step_time_s": 15.0})  # resumed inside the baseline
    assert not sig.ready and sig.features().baseline == {} and sig.features().baseline_ratios == {}


def test_the_baseline_ratio_is_the_50_step_mean_over_the_baseline_mean() -> None:
    """grpo_window_baseline_ratio as the exposition writes it and as the report reads it: the
    50-step mean of offset 0 over the baseline mean, for a perf key a card reads and a training
    key alike; none for a key whose baseline is 0, nor for a perf key no card reads."""
    sig = RankSignals(baseline_steps=100)
    feed(sig, range(1, 101), lambda s: {"perf/step_time_s": 10.0, "perf/comm_time_s": 1.0,
                                        "kl/mean": 0.02, "reward/mean": 0.0})
    feed(sig, range(101, 161), lambda s: {"perf/step_time_s": 15.0 if s > 120 else 10.0,
                                          "perf/comm_time_s": 2.0, "kl/mean": 0.05, "reward/mean": 0.5})
    f = sig.features()
    means = {(k, w, o): m for k, w, o, m in f.means}
    step_time = means["perf/step_time_s", 50, 0] / f.baseline["perf/step_time_s"][0]
    assert f.baseline_ratios == {"perf/step_time_s": pytest.approx(step_time),
                                 "kl/mean": pytest.approx(means["kl/mean", 50, 0] / 0.02)}
    assert step_time == pytest.approx(1.4)  # 40 of the 50 steps at 15 s against 10 s
    for key, ratio in f.baseline_ratios.items():
        assert sig.reading(key, "baseline_ratio", 50) == ratio
    assert sig.reading("reward/mean", "baseline_ratio", 50) is None
    assert sig.reading("perf/comm_time_s", "baseline_ratio", 50) is None
    assert sig.reading("kl/mean", "baseline_ratio", 20) is None  # only the 50-step window's

    store = RunStore(Limits(baseline_steps=100))
    for s in range(1, 161):
        store.apply(parse_record({"step": s, "metrics": {"perf/step_time_s": 15.0 if s > 120 else 10.0,
                                                         "reward/mean": 0.0 if s <= 100 else 0.5}},
                                 run="r", rank=0, mtime=0.0), wrote_at=0.0)
    store.flush()
    samples = parse_samples("".join(store.render()))
    assert value(samples, "grpo_window_baseline_ratio", run="r", rank="0", key="perf/step_time_s",
                 window_steps="50") == pytest.approx(1.4)
    assert not [labels for name, labels in samples if name == "grpo_window_baseline_ratio"
                and ("key", "reward/mean") in labels]


def test_rebaseline_takes_the_last_steps() -> None:
    sig = RankSignals(baseline_steps=100)
    feed(sig, range(1, 401), lambda s: {"kl/mean": 1.0 if s <= 200 else 3.0})
    assert sig.features().baseline["kl/mean"][0] == 1.0
    sig.rebaseline(100)
    assert sig.features().baseline["kl/mean"] == (3.0, 0.0)
    assert sig.ready


def native(step: int, **metrics: float) -> str:
    return json.dumps({"run": "exp", "rank": 0, "step": step, "metrics": metrics}) + "\n"


def test_nonfinite_unknown_key_reaches_the_red_card_window(exporter: Running, snapshot_dir: Path) -> None:
    path = snapshot_dir / "exp" / "rank-0.jsonl"
    path.parent.mkdir()
    path.write_text('{"step": 1, "metrics": {"reward_raw": NaN, "loss": 0.1}}\n')
    exporter.wait_value("grpo_window_nonfinite", 1, run="exp", rank="0", key="reward_raw", window_steps="50")


def test_rebaseline_command_applies_and_survives_a_restart(
        start_exporter: Callable[..., Running], snapshot_dir: Path) -> None:
    first = start_exporter()
    path = snapshot_dir / "exp" / "rank-0.jsonl"
    path.parent.mkdir()
    path.write_text("".join(native(s, **{"kl/mean": 1.0 if s <= 300 else 4.0}) for s in range(1, 501)))
    first.wait_value("grpo_baseline_mean", 1.0, run="exp", rank="0", key="kl/mean")
    proc = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "rebaseline", "--snapshot.dir",
                           str(snapshot_dir), "exp", "--steps", "100"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "up to step 500" in proc.stdout
    first.wait_value("grpo_baseline_mean", 4.0, run="exp", rank="0", key="kl/mean")
    first.exporter.stop()
    # A restart replays the run and the re-baseline request with it.
    second = start_exporter()
    assert value(second.scrape(), "grpo_baseline_mean", run="exp", rank="0", key="kl/mean") == 4.0


def test_rebaseline_rejects_a_run_without_steps(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "rebaseline", "--snapshot.dir",
                           str(tmp_path), "empty"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no step found" in proc.stderr


def test_initial_value_is_each_keys_first_steps_and_follows_a_rewind() -> None:
    sig = RankSignals(baseline_steps=200, initial_steps=10)
    feed(sig, range(1, 9), lambda s: {"entropy/mean": float(s)})
    assert "entropy/mean" not in sig.features().initial  # its first 10 steps are not past yet
    feed(sig, range(9, 60), lambda s: {"entropy/mean": float(s), **({"eval/sample_acc": 0.5} if s >= 30 else {})})
    f = sig.features()
    assert f.initial["entropy/mean"] == pytest.approx(5.5)  # steps 1..10, before any baseline
    assert f.initial["eval/sample_acc"] == pytest.approx(0.5)  # from its own first step (30)
    feed(sig, range(40, 50), lambda s: {"entropy/mean": 100.0})  # resumed after the initial steps
    assert sig.features().initial["entropy/mean"] == pytest.approx(5.5)
    feed(sig, range(5, 20), lambda s: {"entropy/mean": 100.0})  # resumed inside them: 1..4 stand
    assert sig.features().initial["entropy/mean"] == pytest.approx((1 + 2 + 3 + 4 + 6 * 100) / 10)
    assert "eval/sample_acc" not in sig.keys  # first logged at step 30: undone


def test_initial_value_of_a_sparse_log_counts_steps_not_records() -> None:
    sig = RankSignals(baseline_steps=200, initial_steps=10)
    feed(sig, range(10, 100, 10), lambda s: {"entropy/mean": 1.0 if s == 10 else 0.1})
    assert sig.features().initial["entropy/mean"] == 1.0  # step 10 alone: 20 is past 10 steps


def test_rebaseline_takes_a_new_initial_value_too() -> None:
    sig = RankSignals(baseline_steps=50, initial_steps=10)
    feed(sig, range(1, 101), lambda s: {"entropy/mean": 1.0 if s <= 50 else 0.2})
    sig.rebaseline(20)
    assert sig.features().initial["entropy/mean"] == pytest.approx(0.2)


def test_window_percentiles_tolerate_one_step_in_ten() -> None:
    sig = RankSignals(baseline_steps=200)
    # 2 noisy steps in every 20 at 1.0, the rest at 0.05: the max sees the noise, the p90 not.
    feed(sig, range(1, 101), lambda s: {"entropy/mean": 1.0 if s % 20 in (3, 11) else 0.05})
    f = sig.features()
    p = {w: (lo, hi) for k, w, lo, hi in f.percentiles}
    mx = {w: hi for k, w, lo, hi in f.extremes}
    assert mx[50] == 1.0
    assert p[20][1] < 0.2 and p[50][1] < 0.2
    assert p[20][0] == pytest.approx(0.05)
    # Performance signals keep their small menu: no percentiles for every rank's step time.
    feed(sig, range(101, 160), lambda s: {"perf/step_time_s": 1.0})
    assert all(not k.startswith("perf/") for k, *_ in sig.features().percentiles)


def test_run_range_is_the_highest_and_lowest_20_step_mean_of_the_surviving_steps() -> None:
    sig = RankSignals(baseline_steps=200)
    rewards = [0.2] * 40 + [0.9] * 40 + [0.0] * 40
    feed(sig, range(1, 121), lambda s: {"reward/mean": rewards[s - 1]})
    lo, hi = sig.features().ranges["reward/mean"]
    assert (lo, hi) == (pytest.approx(0.0), pytest.approx(0.9))
    feed(sig, range(90, 100), lambda s: {"reward/mean": 0.5})  # the fall to 0.0 from 81 on undone
    assert sig.features().ranges["reward/mean"] == (pytest.approx(0.2), pytest.approx(0.9))


def test_a_pending_rebaseline_takes_the_prompt_types_to_the_same_step() -> None:
    """A re-baseline asked for a step the rank has not reached applies when the rank writes it,
    to the rank's signals and its prompt types' alike: both initial means end at that step."""
    store = RunStore(Limits(initial_steps=10))
    store.rebaseline("run", at_step=50, steps=20)
    for step in range(1, 51):
        store.apply(parse_record({"step": step, "metrics": {"reward/mean": float(step)},
                                  "by_type": {"math": {"reward/mean": float(step)}}},
                                 run="run", rank=0, mtime=0.0), wrote_at=0.0)
    store.flush()
    body = "".join(store.render())
    lbl = 'run="run",rank="0"'
    assert f'grpo_initial_mean{{{lbl},key="reward/mean"}} 45.5\n' in body  # steps 41..50
    assert f'grpo_prompt_type_initial_mean{{{lbl},prompt_type="math",key="reward/mean"}} 45.5\n' in body


def test_persistence_rests_on_three_records_however_sparse_the_logging() -> None:
    # Entropy logged every 10th step: 20 steps hold two records, so the 20-step percentiles
    # reach back to the last three (steps 80, 90, 100); every 50th step: the last three too.
    for every in (10, 50):
        sig = RankSignals(baseline_steps=200)
        feed(sig, range(every, 5 * every + 1, every), lambda s: {"entropy/mean": float(s)})
        p = {w: (p10, p90) for k, w, p10, p90 in sig.features().percentiles}
        last3 = [3.0 * every, 4.0 * every, 5.0 * every]
        assert p[20] == (pytest.approx(last3[0] + 0.2 * every), pytest.approx(last3[2] - 0.2 * every))
    # Logged every step, the 20-step window is its 20 steps.
    sig = RankSignals(baseline_steps=200)
    feed(sig, range(1, 101), lambda s: {"entropy/mean": float(s)})
    p = {w: (p10, p90) for k, w, p10, p90 in sig.features().percentiles}
    assert p[20] == (pytest.approx(81 + 0.1 * 19), pytest.approx(81 + 0.9 * 19))


def test_record_windows_count_records_not_steps() -> None:
    # The blow-up card's windows: the last 2 records, and up to 10 before the last 5, from 5 on.
    sig = RankSignals(baseline_steps=200)
    feed(sig, range(10, 100, 10), lambda s: {"kl/mean": float(s)})  # 9 records
    windows = {(n, o): (lo, hi, med) for k, n, o, lo, hi, med in sig.features().records}
    assert windows[(2, 0)] == (80.0, 90.0, 85.0)
    assert (10, 5) not in windows  # 4 records before the last 5: too few
    feed(sig, range(100, 200, 10), lambda s: {"kl/mean": float(s)})  # 19 records
    windows = {(n, o): (lo, hi, med) for k, n, o, lo, hi, med in sig.features().records}
    assert windows[(2, 0)] == (180.0, 190.0, 185.0)
    assert windows[(10, 5)] == (50.0, 140.0, 95.0)  # records 5..14 (steps 50..140)


def test_a_nonfinite_streak_is_named_by_the_step_it_began() -> None:
    """The loss NaN from step 102 on, for 300 steps: the count saturates at the window, the
    streak's first step stays 102 (the kept NaN steps reach back only so far). A gap of a
    window ends the streak: a NaN after it starts a new one. A rewind into the streak leaves the
    first step of the NaN steps that stand."""
    sig = RankSignals(baseline_steps=100)
    feed(sig, range(1, 102), lambda s: {"loss": 1.0, "grad/norm": 1.0})
    feed(sig, range(102, 402), lambda s: {"loss": math.nan, "grad/norm": 1.0 if s < 130 else math.inf})
    f = sig.features()
    assert f.nonfinite == {"loss": NONFINITE_WINDOW, "grad/norm": NONFINITE_WINDOW}
    assert f.nonfinite_since == {"loss": 102, "grad/norm": 130}
    feed(sig, range(402, 402 + NONFINITE_WINDOW), lambda s: {"loss": 1.0, "grad/norm": 1.0})
    assert sig.features().nonfinite_since == {}  # the card's window is clean: nothing published
    sig.add(460, {"loss": math.nan}, False)
    assert sig.features().nonfinite_since == {"loss": 460}
    # Back to step 120: the streak of steps 102..120 stands, from its first step.
    sig.add(121, {"loss": 1.0, "grad/norm": 1.0}, False)
    f = sig.features()
    assert f.nonfinite_since == {"loss": 102} and f.nonfinite == {"loss": 19}


def test_a_nonfinite_streak_longer_than_the_kept_steps_after_a_restore() -> None:
    """A state saved before the streak's first step was kept finds it in the kept NaN steps:
    the earliest of those with no window's gap after it."""
    sig = RankSignals(baseline_steps=100)
    feed(sig, range(1, 50), lambda s: {"loss": 1.0})
    feed(sig, range(50, 60), lambda s: {"loss": math.nan})
    sig.keys["loss"].nonfinite_since = None  # as a state of an earlier release loads
    assert sig.features().nonfinite_since == {"loss": 50}

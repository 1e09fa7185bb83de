"""One run's abuse stays its own: whatever one run folder holds, the structures the exporter keeps
for it stay bounded, the features stay those of every point (or the documented approximation),
other runs are left as they were, and every reject is counted. Bounds, not speed: the costs are
measured by bench/bench_abuse.py."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path
from typing import Any

from conftest import Running, value
from timeline_reference import series_lines, surviving

from grpo_monitor.contract.snapshot import parse_record
from grpo_monitor.runtime import state_codec
from grpo_monitor.runtime.signals import (
    HELDOUT_MAX_POINTS,
    HELDOUT_RECENT_POINTS,
    HELDOUT_SMOOTH_POINTS,
    NONFINITE_KEEP,
    STEP_LOG_RUNS,
    HeldOutTracker,
    RankSignals,
    StepLog,
    percentile,
)
from grpo_monitor.runtime.store import Limits, RunStore

KEYS = ("reward/mean", "kl/mean", "entropy/mean", "loss", "grad_norm")
LIMITS = Limits(baseline_steps=50)


# -- the held-out score: 100,000 points ----------------------------------------------------------


def heldout_reference(values: list[float], levels: list[float]) -> dict[str, Any]:
    """The held-out features over every point, computed apart from the tracker
    (docs/signals.md#a-runs-first-records-and-the-held-out-score); the noise over the last
    HELDOUT_MAX_POINTS points, as documented."""
    best_i = max(range(len(values)), key=lambda i: (values[i], -i))  # the first best point
    k = HELDOUT_SMOOTH_POINTS
    means = [sum(values[i:i + k]) / k for i in range(len(values) - k + 1)]
    smooth_i = max(range(len(means)), key=lambda i: (means[i], -i))
    kept = values[-HELDOUT_MAX_POINTS:]
    return {"best": values[best_i], "reward_at_best": levels[best_i],
            "recent": max(values[-HELDOUT_RECENT_POINTS:]), "points": len(values),
            "smooth_best": means[smooth_i], "reward_at_smooth_best": levels[smooth_i + k - 1],
            "smooth_recent": means[-1],
            "noise": percentile([abs(b - a) for a, b in zip(kept, kept[1:])], 0.5)}


def heldout_features(tracker: HeldOutTracker) -> dict[str, Any]:
    f = tracker.features()
    assert f is not None
    return {"best": f.best, "reward_at_best": f.reward_at_best, "recent": f.recent, "points": f.points,
            "smooth_best": f.smooth_best, "reward_at_smooth_best": f.reward_at_smooth_best,
            "smooth_recent": f.smooth_recent, "noise": f.noise}


def test_100000_heldout_points_keep_a_bounded_tracker_and_the_features_of_every_point() -> None:
    rng = random.Random(7)
    n = 100_000
    # The best point and the best 3-point mean early on (point ~40): then a long, lower stretch,
    # as a run whose held-out score peaked and slid; a tracker that forgot its trimmed points
    # would report a lower best smoothed mean and no slide.
    values = [0.5 + (0.4 if 40 <= i < 43 else 0.0) + rng.gauss(0, 0.02) for i in range(n)]
    levels = [0.1 + i * 1e-6 for i in range(n)]
    tracker = HeldOutTracker()
    for i, (v, level) in enumerate(zip(values, levels)):
        tracker.add(10 * (i + 1), v, level)
        assert len(tracker.values) <= HELDOUT_MAX_POINTS
    assert len(tracker.steps) == len(tracker.levels) == HELDOUT_MAX_POINTS
    assert heldout_features(tracker) == heldout_reference(values, levels)


def test_rewinds_of_heldout_points_leave_what_a_fresh_tracker_of_the_rest_gives() -> None:
    rng = random.Random(11)
    tracker = HeldOutTracker()
    points: list[tuple[int, float, float]] = []  # the surviving (step, value, level)
    step = 0
    for _ in range(6_000):
        if points and rng.random() < 0.05:  # a rewind, within the kept points
            deep = 500 if rng.random() < 0.02 else 20
            back = rng.randint(1, min(len(points), deep))
            keep_through = points[-back][0] - 1
            tracker.rewind(keep_through)
            points = [p for p in points if p[0] <= keep_through]
            step = keep_through
        step += rng.randint(1, 3)
        v, level = round(rng.random(), 2), rng.random()  # ties of the best, on purpose
        tracker.add(step, v, level)
        points.append((step, v, level))
    fresh = HeldOutTracker()
    for s, v, level in points:
        fresh.add(s, v, level)
    assert len(points) > HELDOUT_MAX_POINTS  # points were trimmed
    got, want = heldout_features(tracker), heldout_features(fresh)
    # What was trimmed before the rewinds stays trimmed: the fresh tracker trims other points.
    for name in ("best", "reward_at_best", "recent", "smooth_recent", "points"):
        assert got[name] == want[name], name


def test_a_state_saved_before_the_trimmed_points_were_summed_decodes_as_it_was() -> None:
    """The saved state holds the tracker by field name: a state without the new fields takes
    their defaults (no migration), and its features are those of its kept points, as before."""
    decoder = state_codec.Decoder(state_codec.SCHEMA)
    old = decoder._object("heldout_tracker", {  # noqa: SLF001 - the codec's own decoding path
        "steps": (10, 20, 30), "values": (0.5, 0.7, 0.6), "levels": (0.1, 0.2, None),
        "best": 0.7, "reward_at_best": 0.2, "trimmed_best": (0.9, 0.05)})
    assert old.trimmed == 0 and old.trimmed_smooth_best is None
    f = old.features()
    assert f is not None and (f.best, f.points, f.smooth_best) == (0.7, 3, (0.5 + 0.7 + 0.6) / 3)


# -- a storm of rewinds ---------------------------------------------------------------------------


def record(run: str, step: int, rng: random.Random, **extra: Any) -> dict[str, Any]:
    metrics = {k: 0.5 + 0.1 * i + 0.001 * step + rng.gauss(0, 0.05) for i, k in enumerate(KEYS)}
    if step % 10 == 0:
        metrics["eval/heldout_score"] = 0.6 + rng.gauss(0, 0.02)
    return {"run": run, "step": step, "time": 1000.0 + step, "metrics": metrics, **extra}


def storm(rng: random.Random) -> list[dict[str, Any]]:
    """1,200 ordinary steps, then 2,000 rewinds: 1,000 records whose step goes back every record
    (a sawtooth 50 deep), and 1,000 records of 500 steps each undone by a rollback mark."""
    out = [record("storm", s, rng) for s in range(1, 1201)]
    out += [record("storm", 1250 - i % 50, rng) for i in range(1000)]
    for i in range(500):
        step = 1251 + i
        out.append(record("storm", step, rng))
        out.append({"run": "storm", "step": step, "time": 1000.0 + step, "metrics": {},
                    "events": [{"type": "rollback", "from_step": step, "to_step": step - 1}]})
    out.append(record("storm", 1800, rng))
    return out


def served(records: list[dict[str, Any]]) -> dict[str, dict[str, set[str]]]:
    """run -> family -> the series lines a store fed ``records`` serves (counters left out)."""
    store = RunStore(LIMITS)
    for rec in records:
        store.apply(parse_record(rec, run=rec["run"], rank=0, mtime=5000.0), wrote_at=5000.0)
    out: dict[str, dict[str, set[str]]] = {}
    for family, line in series_lines(store):
        run = line.split('run="', 1)[1].split('"', 1)[0]
        out.setdefault(run, {}).setdefault(family, set()).add(line)
    return out


def test_a_storm_of_rewinds_leaves_the_other_run_intact_and_its_own_as_a_fresh_read() -> None:
    rng = random.Random(3)
    stormy = storm(rng)
    victim = [record("victim", s, rng) for s in range(1, 401)]
    victim[300]["metrics"]["loss"] = math.nan
    mixed: list[dict[str, Any]] = []
    for i, rec in enumerate(stormy):  # the victim's records among the storm's
        mixed.append(rec)
        if i % 8 == 0 and victim:
            mixed.append(victim.pop(0))
    mixed += victim
    both = served(mixed)
    alone_victim = served([r for r in mixed if r["run"] == "victim"])["victim"]
    fresh_storm = served(surviving([r for r in mixed if r["run"] == "storm"]))["storm"]
    assert both["victim"] == alone_victim
    assert both["storm"] == fresh_storm
    assert any("grpo_heldout_points" in f for f in both["storm"])  # the held-out points followed too


# -- the same step, again and again --------------------------------------------------------------


def test_one_step_logged_again_and_again_keeps_the_rank_bounded() -> None:
    """20,000 records of one step, inside the baseline period and the initial steps, each with a
    NaN: the second record of a step wins in the baseline and the initial value as in the
    windows, and the NaN steps kept are bounded (grpo_window_nonfinite counts up to them)."""
    sig = RankSignals(baseline_steps=50)
    for s in range(1, 5):
        sig.add(s, {"kl/mean": 0.1 * s}, False)
    for i in range(20_000):
        sig.add(5, {"kl/mean": 0.5 + (i % 3) * 0.1, "loss": math.nan}, False)
    kl, loss = sig.keys["kl/mean"], sig.keys["loss"]
    assert list(kl.baseline_steps) == [1, 2, 3, 4, 5] and len(kl.initial_points) == 5
    last = 0.5 + (19_999 % 3) * 0.1
    assert kl.baseline.n == kl.initial.n == 5
    assert math.isclose(kl.baseline.mean, statistics.fmean([0.1, 0.2, 0.3, 0.4, last]))
    assert math.isclose(kl.initial.mean, kl.baseline.mean)
    assert len(loss.nonfinite_steps) == NONFINITE_KEEP
    assert sig.features().nonfinite["loss"] == NONFINITE_KEEP


def test_steps_at_irregular_intervals_keep_the_step_log_bounded_and_its_count_exact() -> None:
    rng = random.Random(5)
    log, steps, step = StepLog(), [], 0
    for _ in range(50_000):
        step += rng.choice((1, 2, 3, 7))
        log.add(step)
        steps.append(step)
    assert len(log.runs) <= STEP_LOG_RUNS
    assert (log.count, log.first(), log.last()) == (len(steps), steps[0], steps[-1])
    # A rewind within the newest STEP_LOG_RUNS steps is exact.
    for back in (1, 17, STEP_LOG_RUNS // 2):
        keep_through = steps[-back] - 1
        log.rewind(keep_through)
        steps = [s for s in steps if s <= keep_through]
        assert (log.count, log.last()) == (len(steps), steps[-1])


# -- through the exporter: the victim's NaN, and every reject counted ------------------------------


def test_a_storm_beside_a_run_leaves_its_nan_served_and_every_malformed_mark_counted(
        exporter: Running, snapshot_dir: Path) -> None:
    rng = random.Random(9)
    lines = []
    bad = 0
    for rec in storm(rng):
        rec = {k: v for k, v in rec.items() if k != "run"}
        back = next((e for e in rec.get("events", ()) if e["type"] == "rollback"), None)
        if back is not None and rec["step"] % 25 == 0:  # to_step after from_step: undoes nothing
            back["to_step"] = rec["step"] + 5
            bad += 1
        lines.append(json.dumps(rec))
    (snapshot_dir / "storm").mkdir()
    (snapshot_dir / "storm" / "rank-0.jsonl").write_text("\n".join(lines) + "\n")
    (snapshot_dir / "victim").mkdir()
    victim = [record("victim", s, rng) for s in range(1, 31)]
    victim[-1]["metrics"]["loss"] = math.nan
    (snapshot_dir / "victim" / "rank-0.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "run"}) + "\n" for r in victim))
    exporter.wait_value("grpo_nonfinite_values_total", 1, run="victim", rank="0", key="loss")
    exporter.wait_value("grpo_step", 1800, timeout=60, run="storm", rank="0")
    samples = exporter.scrape()
    assert bad == 20 and exporter.errors("invalid_events") == bad
    assert value(samples, "grpo_step", run="victim", rank="0") == 30


def test_a_key_map_rewritten_in_a_storm_is_parsed_once_a_change_and_a_second(
        tmp_path: Path, monkeypatch: Any) -> None:
    """A run folder's key map rewritten on every record costs its run a parse a second at most,
    and an unchanged bad map is counted once, however often its events come."""
    from grpo_monitor.contract import key_map as km
    from grpo_monitor.runtime import ingest as ingest_module
    from grpo_monitor.runtime.health import ExporterHealth
    from grpo_monitor.runtime.ingest import Ingestor

    clock = [1000.0]
    monkeypatch.setattr(ingest_module.time, "monotonic", lambda: clock[0])
    parses = []
    real_parse = km.KeyMap.parse
    monkeypatch.setattr(km.KeyMap, "parse", staticmethod(
        lambda *a, **k: parses.append(1) or real_parse(*a, **k)))
    run = tmp_path / "stormy"
    run.mkdir()
    keys, data = run / km.KEY_MAP_FILE, run / "rank-0.jsonl"
    ingest = Ingestor(tmp_path, RunStore(), ExporterHealth())
    for step in range(1, 201):
        keys.write_text(f'"my_reward_{step}" = "reward/mean"\n')
        ingest.process(keys)
        with data.open("a") as fh:
            fh.write(json.dumps({"step": step, "metrics": {"loss": 0.1}}) + "\n")
        ingest.process(data)
        clock[0] += 0.05  # a record every 50 ms: 10 s in all
    assert 8 <= len(parses) <= 12  # one a second, not one a record
    # The last text written applies once its second is over.
    clock[0] += 1.0
    with data.open("a") as fh:
        fh.write(json.dumps({"step": 201, "metrics": {"my_reward_200": 0.5}}) + "\n")
    ingest.process(data)
    ingest.store.flush()
    assert 'grpo_reward_mean{run="stormy",rank="0"} 0.5' in "".join(ingest.store.render())
    # A bad map's events, its text unchanged: counted once.
    keys.write_text("not = [toml")
    for step in range(202, 212):
        clock[0] += 2.0
        ingest.process(keys)
        with data.open("a") as fh:
            fh.write(json.dumps({"step": step, "metrics": {"loss": 0.1}}) + "\n")
        ingest.process(data)
    errors = ingest.health.registry.get_sample_value("grpo_snapshot_errors_total",
                                                     {"reason": "invalid_key_map"})
    assert errors == 1

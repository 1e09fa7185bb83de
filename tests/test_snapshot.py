"""The contract's pieces that need no exporter: identity from paths, values, shapes, aliases."""

from __future__ import annotations

import math
from pathlib import PurePath

import pytest

from grpo_monitor.contract.keys import ALIASES, SIGNALS, canonical_key
from grpo_monitor.contract.snapshot import RecordError, identity_from_path, parse_number, parse_record

ROOT = PurePath("/snap")


@pytest.mark.parametrize(("path", "expected"), [
    ("/snap/exp-42/rank-3.jsonl", ("exp-42", 3)),
    ("/snap/exp-42/sub/rank_7.jsonl", ("exp-42", 7)),
    ("/snap/exp/rank12.json", ("exp", 12)),
    ("/snap/exp/RANK-2.000004.jsonl", ("exp", 2)),
    ("/snap/exp/metrics.jsonl", ("exp", 0)),
    ("/snap/frank-9.jsonl", ("default", 0)),  # "frank" is not a rank
    ("/snap/rank-1.jsonl", ("default", 1)),
])
def test_identity_from_path(path: str, expected: tuple[str, int]) -> None:
    assert identity_from_path(PurePath(path), ROOT) == expected


def test_parse_number() -> None:
    assert parse_number(1) == 1.0 and parse_number(True) == 1.0 and parse_number(" 0.5 ") == 0.5
    assert math.isnan(parse_number("NaN"))  # type: ignore[arg-type]
    assert parse_number("-Infinity") == -math.inf and parse_number("inf") == math.inf
    assert parse_number(None) is None
    for bad in ("lots", [1], {"a": 1}):
        with pytest.raises((ValueError, TypeError)):
            parse_number(bad)


def test_shapes_detected() -> None:
    kw = {"run": "r", "rank": 0, "mtime": 1.0}
    assert parse_record({"step": 1, "metrics": {}}, **kw).shape == "native"
    assert parse_record({"step": 1, "data": {}}, **kw).shape == "verl"
    assert parse_record({"step": 1, "data": 3}, **kw).shape == "flat"  # data not an object
    assert parse_record({"global_step": 1, "x": 2}, **kw).step == 1


def test_record_errors() -> None:
    kw = {"run": "r", "rank": 0, "mtime": 1.0}
    for bad in ([], 3, {"metrics": {}}, {"step": -1, "metrics": {}}, {"step": 1.5, "x": 1},
                {"step": 1, "rank": -2, "metrics": {}}):
        with pytest.raises(RecordError) as exc:
            parse_record(bad, **kw)
        assert exc.value.reason == "invalid_record"


@pytest.mark.parametrize("record", [
    {"step": 1, "time": "noon", "metrics": {"loss": math.nan}},
    {"step": 1, "time": math.nan, "metrics": {"loss": math.nan}},
    {"step": 1, "time": math.inf, "metrics": {"loss": math.nan}},
    {"step": 1, "_timestamp": -math.inf, "loss": math.nan},
    {"step": 1, "timestamp": [3], "loss": math.nan},
])
def test_a_bad_time_costs_the_time_not_the_metrics(record: dict[str, object]) -> None:
    snap = parse_record(record, run="r", rank=0, mtime=7.0)
    assert snap.time == 7.0 and math.isnan(snap.metrics["loss"])
    assert [reason for reason, _ in snap.problems] == ["invalid_time"]


def test_alias_table_is_unambiguous_and_complete() -> None:
    keys = {s.key for s in SIGNALS}
    assert not keys & ALIASES.keys()
    # Every name of the design's alias table.
    design = {"reward_mean": "reward/mean", "reward": "reward/mean", "critic/score/mean": "reward/mean",
              "rollout/reward_mean": "reward/mean", "reward_std": "reward/std",
              "rollout/reward_std": "reward/std", "critic/score/min": "reward/min",
              "critic/score/max": "reward/max", "reward/median": "reward/p50",
              "group_reward_gap": "group/reward_gap", "group_reward_std": "group/reward_std",
              "frac_reward_zero_std": "group/zero_std_frac", "advantage_mean_abs": "adv/mean_abs",
              "adv_abs_mean": "adv/mean_abs", "kl_mean": "kl/mean", "kl": "kl/mean",
              "actor/kl_loss": "kl/mean", "kl_p95": "kl/p95", "entropy": "entropy/mean",
              "actor/entropy": "entropy/mean", "response_len_mean": "response/len_mean",
              "completions/mean_length": "response/len_mean", "response_length/mean": "response/len_mean",
              "completions/max_length": "response/len_max", "response_length/max": "response/len_max",
              "completions/clipped_ratio": "response/clip_ratio",
              "response_length/clip_ratio": "response/clip_ratio",
              "clip_ratio/region_mean": "policy/clip_frac", "actor/pg_clipfrac": "policy/clip_frac",
              "actor/pg_loss": "loss", "grad_norm": "grad/norm", "grad/grad_norm": "grad/norm",
              "actor/grad_norm": "grad/norm", "lr": "train/lr", "learning_rate": "train/lr",
              "actor/lr": "train/lr", "step_time": "perf/step_time_s",
              "perf/time_per_step": "perf/step_time_s", "timing_s/step": "perf/step_time_s",
              "samples_per_sec": "perf/samples_per_s", "perf/throughput": "perf/tokens_per_s",
              "sample_acc": "eval/sample_acc", "reward_quantiles/25": "reward/p25",
              "train/reward": "reward/mean", "train/loss": "loss"}
    assert {name: canonical_key(name) for name in design} == design
    assert canonical_key("train/lr") == "train/lr" and canonical_key("unheard/of") is None


@pytest.mark.parametrize("to_step", [-1, math.nan, "20", 10**30, 71, None, True, 2.5])
def test_a_malformed_rollback_mark_is_counted_and_undoes_nothing(to_step: object) -> None:
    mark = {"type": "rollback", "from_step": 70}
    if to_step is not None:
        mark["to_step"] = to_step
    snap = parse_record({"step": 70, "metrics": {}, "events": [mark, {"type": "checkpoint_save"}]},
                        run="r", rank=0, mtime=1.0)
    assert [e.type for e in snap.events] == ["checkpoint_save"]
    assert [reason for reason, _ in snap.problems] == ["invalid_events"]
    good = parse_record({"step": 20, "events": [{"type": "rollback", "from_step": 70, "to_step": 20}]},
                        run="r", rank=0, mtime=1.0)
    assert [e.type for e in good.events] == ["rollback"] and not good.problems

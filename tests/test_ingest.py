"""The exporter end to end: files on disk in, a real HTTP scrape out."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Running, value
from polling import wait_for


def append(path: Path, *records: object, raw: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write(raw if raw is not None else "".join(json.dumps(r) + "\n" for r in records))


def native(step: int, run: str = "exp", rank: int = 0, **metrics: float) -> dict[str, object]:
    return {"run": run, "rank": rank, "world_size": 2, "step": step, "time": 1764400000.0 + step,
            "metrics": metrics}


# -- the three record shapes and the alias table -----------------------------------------------


def test_native_record_with_by_type_and_events(exporter: Running, snapshot_dir: Path) -> None:
    rec = native(7, **{"reward/mean": 0.41, "kl/p95": 0.9, "reward/p25": 0.1, "my/custom": 3.5})
    rec["by_type"] = {"hard": {"reward/mean": 0.1}}
    rec["events"] = [{"type": "checkpoint_save", "duration_s": 30}]
    append(snapshot_dir / "exp" / "rank-0.jsonl", rec)
    exporter.wait_value("grpo_step", 7, run="exp", rank="0")
    s = exporter.scrape()
    assert value(s, "grpo_reward_mean", run="exp", rank="0") == 0.41
    assert value(s, "grpo_reward_mean", run="exp", rank="0", prompt_type="hard") == 0.1
    assert value(s, "grpo_kl_quantile", run="exp", rank="0", quantile="0.95") == 0.9
    assert value(s, "grpo_reward_quantile", run="exp", rank="0", quantile="0.25") == 0.1
    assert value(s, "grpo_metric_value", run="exp", rank="0", key="my/custom") == 3.5
    assert value(s, "grpo_events_total", run="exp", rank="0", type="checkpoint_save") == 1
    assert value(s, "grpo_last_snapshot_timestamp_seconds", run="exp", rank="0") == 1764400007.0
    assert value(s, "grpo_world_size", run="exp", rank="0") == 2
    assert value(s, "grpo_snapshots_ingested_total", shape="native") == 1


def test_verl_file_logger_lines(exporter: Running, snapshot_dir: Path) -> None:
    # Key names as verl's trainer logs them (verl/trainer/ppo/metric_utils.py).
    data = {"critic/score/mean": 0.5, "critic/score/max": 1.0, "critic/score/min": 0.0,
            "actor/kl_loss": 0.02, "actor/entropy": 1.2, "actor/pg_clipfrac": 0.03,
            "actor/pg_loss": -0.01, "actor/grad_norm": 0.7, "actor/lr": 1e-6,
            "response_length/mean": 310.0, "response_length/max": 1024.0,
            "response_length/clip_ratio": 0.04, "timing_s/step": 42.0, "perf/throughput": 1800.0,
            "critic/advantages/mean": 0.0}
    path = snapshot_dir / "verl-run" / "rank3.jsonl"
    append(path, {"step": 11, "data": data})
    exporter.wait_value("grpo_step", 11, run="verl-run", rank="3")
    s = exporter.scrape()
    lbl = {"run": "verl-run", "rank": "3"}
    expected = {"grpo_reward_mean": 0.5, "grpo_reward_max": 1.0, "grpo_reward_min": 0.0,
                "grpo_kl_mean": 0.02, "grpo_entropy_mean": 1.2, "grpo_policy_clip_ratio": 0.03,
                "grpo_loss": -0.01, "grpo_grad_norm": 0.7, "grpo_learning_rate": 1e-6,
                "grpo_response_length_mean_tokens": 310.0, "grpo_response_length_max_tokens": 1024.0,
                "grpo_response_truncated_ratio": 0.04, "grpo_step_duration_seconds": 42.0,
                "grpo_throughput_tokens_per_second": 1800.0}
    assert {k: value(s, k, **lbl) for k in expected} == expected
    assert value(s, "grpo_metric_value", key="critic/advantages/mean", **lbl) == 0.0
    # No time in the record: the file's mtime stands in.
    assert value(s, "grpo_last_snapshot_timestamp_seconds", **lbl) == path.stat().st_mtime
    assert value(s, "grpo_snapshots_ingested_total", shape="verl") == 1


def test_flat_trl_keys(exporter: Running, snapshot_dir: Path) -> None:
    # What TRL's GRPOTrainer passes to on_log / wandb (trl/trainer/grpo_trainer.py).
    logs = {"step": 5, "loss": 0.013, "grad_norm": 0.8, "learning_rate": 5e-7, "reward": 0.62,
            "reward_std": 0.21, "frac_reward_zero_std": 0.125, "kl": 0.004, "entropy": 0.9,
            "completions/mean_length": 180.0, "completions/max_length": 512.0,
            "completions/clipped_ratio": 0.02, "clip_ratio/region_mean": 0.01, "step_time": 3.5,
            "rewards/accuracy_reward/mean": 0.55, "train/epoch": 0.1}
    (snapshot_dir / "trl").mkdir()
    (snapshot_dir / "trl" / "metrics.json").write_text(json.dumps(logs))
    exporter.wait_value("grpo_step", 5, run="trl", rank="0")
    s = exporter.scrape()
    lbl = {"run": "trl", "rank": "0"}
    expected = {"grpo_loss": 0.013, "grpo_grad_norm": 0.8, "grpo_learning_rate": 5e-7,
                "grpo_reward_mean": 0.62, "grpo_reward_std": 0.21, "grpo_group_zero_std_ratio": 0.125,
                "grpo_kl_mean": 0.004, "grpo_entropy_mean": 0.9,
                "grpo_response_length_mean_tokens": 180.0, "grpo_response_length_max_tokens": 512.0,
                "grpo_response_truncated_ratio": 0.02, "grpo_policy_clip_ratio": 0.01,
                "grpo_step_duration_seconds": 3.5,
                # TRL's accuracy reward function is the batch's sample accuracy (keys.py)
                "grpo_sample_accuracy_ratio": 0.55}
    assert {k: value(s, k, **lbl) for k in expected} == expected
    assert value(s, "grpo_snapshots_ingested_total", shape="flat") == 1


def test_wandb_prefixed_and_nested_keys(exporter: Running, snapshot_dir: Path) -> None:
    rec = {"_step": 3, "_timestamp": 1764400100.0, "train/reward": 0.3, "train/kl": 0.1,
           "reward_quantiles": {"25": 0.1, "50": 0.2, "75": 0.4, "95": 0.7}}
    append(snapshot_dir / "wb" / "rank-1.jsonl", rec)
    exporter.wait_value("grpo_step", 3, run="wb", rank="1")
    s = exporter.scrape()
    assert value(s, "grpo_reward_mean", run="wb", rank="1") == 0.3
    assert value(s, "grpo_kl_mean", run="wb", rank="1") == 0.1
    assert value(s, "grpo_reward_quantile", run="wb", rank="1", quantile="0.75") == 0.4
    assert value(s, "grpo_last_snapshot_timestamp_seconds", run="wb", rank="1") == 1764400100.0


def test_canonical_key_wins_over_alias(exporter: Running, snapshot_dir: Path) -> None:
    append(snapshot_dir / "x" / "rank-0.jsonl", {"step": 1, "reward": 9.0, "reward/mean": 0.5})
    exporter.wait_value("grpo_reward_mean", 0.5, run="x", rank="0")


def test_latest_value_kept_for_keys_a_record_leaves_out(exporter: Running, snapshot_dir: Path) -> None:
    path = snapshot_dir / "exp" / "rank-0.jsonl"
    append(path, native(100, **{"reward/mean": 0.2, "reward/p95": 0.9}),
           native(101, **{"reward/mean": 0.3}))
    exporter.wait_value("grpo_step", 101, run="exp", rank="0")
    s = exporter.scrape()
    assert value(s, "grpo_reward_mean", run="exp", rank="0") == 0.3
    assert value(s, "grpo_reward_quantile", run="exp", rank="0", quantile="0.95") == 0.9


# -- incremental reading ---------------------------------------------------------------------


def test_partial_jsonl_line_is_held_until_its_newline(exporter: Running, snapshot_dir: Path) -> None:
    path = snapshot_dir / "exp" / "rank-0.jsonl"
    line = json.dumps(native(1, **{"reward/mean": 0.7}))
    append(path, raw=line[:25])
    # Events are handled in order on one thread: once a later file is visible, the partial
    # write has been read too.
    append(snapshot_dir / "other" / "rank-0.jsonl", native(1, run="other"))
    exporter.wait_value("grpo_step", 1, run="other", rank="0")
    assert value(exporter.scrape(), "grpo_step", run="exp", rank="0") is None
    append(path, raw=line[25:] + "\n")
    exporter.wait_value("grpo_reward_mean", 0.7, run="exp", rank="0")
    assert exporter.errors("invalid_json") == 0


def test_half_written_json_is_retried_on_next_change(exporter: Running, snapshot_dir: Path) -> None:
    path = snapshot_dir / "exp" / "latest.json"
    path.parent.mkdir()
    doc = json.dumps(native(4, **{"kl/mean": 0.25}))
    path.write_text(doc[: len(doc) // 2])
    wait_for(lambda: exporter.errors("incomplete") >= 1)
    assert value(exporter.scrape(), "grpo_kl_mean", run="exp", rank="0") is None
    path.write_text(doc)
    exporter.wait_value("grpo_kl_mean", 0.25, run="exp", rank="0")
    assert exporter.errors("invalid_json") == 0


def test_truncation_and_rotation(exporter: Running, snapshot_dir: Path) -> None:
    path = snapshot_dir / "exp" / "rank-0.jsonl"
    append(path, native(1, **{"loss": 1.0}), native(2, **{"loss": 2.0}))
    exporter.wait_value("grpo_loss", 2.0, run="exp", rank="0")
    # Rotation by rename, as the SDK does it: the segment keeps its offset, nothing is re-read.
    path.rename(snapshot_dir / "exp" / "rank-0.000001.jsonl")
    append(path, native(3, **{"loss": 3.0}))
    exporter.wait_value("grpo_loss", 3.0, run="exp", rank="0")
    # Truncation in place: read again from the start.
    path.write_text(json.dumps(native(4, **{"loss": 4.0})) + "\n")
    exporter.wait_value("grpo_loss", 4.0, run="exp", rank="0")
    assert value(exporter.scrape(), "grpo_snapshots_ingested_total", shape="native") == 4


def test_dotfiles_and_tmp_files_are_ignored(exporter: Running, snapshot_dir: Path) -> None:
    append(snapshot_dir / "exp" / ".rank-0.jsonl", native(1))
    append(snapshot_dir / "exp" / "rank-0.jsonl.tmp", native(2))
    append(snapshot_dir / ".cache" / "rank-0.jsonl", native(3))
    append(snapshot_dir / "exp" / "rank-0.jsonl", native(4))
    exporter.wait_value("grpo_step", 4, run="exp", rank="0")
    assert value(exporter.scrape(), "grpo_snapshots_ingested_total", shape="native") == 1


# -- bad input: counted, logged once, never fatal ------------------------------------------


def test_garbage_and_wrong_types_are_counted_and_the_rest_kept(
        exporter: Running, snapshot_dir: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    path = snapshot_dir / "exp" / "rank-0.jsonl"
    append(path, raw="this is not json\n{\"also\": broken\n[1, 2, 3]\n")
    append(path, {"step": "twelve", "metrics": {"loss": 1}}, {"metrics": {"loss": 1}})
    append(path, native(5, **{"loss": [1, 2], "grad/norm": "lots", "reward/mean": 0.5}))
    bad_samples = native(6, **{"kl/mean": 0.1})
    bad_samples["samples"] = [{"no_prompt": True}]
    append(path, bad_samples)
    exporter.wait_value("grpo_step", 6, run="exp", rank="0")
    assert exporter.errors("invalid_json") == 2
    assert exporter.errors("invalid_record") == 3
    assert exporter.errors("invalid_value") == 2
    assert exporter.errors("invalid_samples") == 1
    s = exporter.scrape()
    assert value(s, "grpo_reward_mean", run="exp", rank="0") == 0.5  # the good values of record 5
    assert value(s, "grpo_kl_mean", run="exp", rank="0") == 0.1  # the metrics of record 6
    assert value(s, "grpo_loss", run="exp", rank="0") is None
    # Logged once per file and reason, with the file's name.
    invalid_json_logs = [r for r in caplog.records if "invalid_json" in r.getMessage()]
    assert len(invalid_json_logs) == 1 and str(path) in invalid_json_logs[0].getMessage()


def test_oversized_file_and_line(start_exporter: Callable[..., Running], snapshot_dir: Path) -> None:
    exporter = start_exporter(max_file_bytes=1000, max_line_bytes=500)
    (snapshot_dir / "exp").mkdir()
    (snapshot_dir / "exp" / "big.json").write_text(json.dumps({"step": 1, "pad": "x" * 2000}))
    path = snapshot_dir / "exp" / "rank-1.jsonl"
    append(path, raw=json.dumps({"step": 1, "pad": "y" * 800}) + "\n")
    append(path, native(2, rank=1, **{"loss": 0.5}))
    exporter.wait_value("grpo_loss", 0.5, run="exp", rank="1")
    assert exporter.errors("oversized") == 2


def test_oversized_line_split_across_reads(start_exporter: Callable[..., Running], snapshot_dir: Path) -> None:
    exporter = start_exporter(max_line_bytes=500)
    path = snapshot_dir / "exp" / "rank-0.jsonl"
    append(path, raw='{"step": 1, "pad": "' + "z" * 600)  # no newline yet, already too long
    wait_for(lambda: exporter.errors("oversized") == 1)
    append(path, raw="z" * 600 + '"}\n')
    append(path, native(2, **{"loss": 0.25}))
    exporter.wait_value("grpo_loss", 0.25, run="exp", rank="0")
    assert exporter.errors("oversized") == 1
    assert exporter.errors("invalid_json") == 0


def test_links_are_refused_counted_once_and_serving_goes_on(exporter: Running, snapshot_dir: Path) -> None:
    (snapshot_dir / "exp").mkdir()
    (snapshot_dir / "exp" / "loop.jsonl").symlink_to(snapshot_dir / "exp" / "loop.jsonl")
    (snapshot_dir / "exp" / "up").symlink_to(snapshot_dir, target_is_directory=True)
    append(snapshot_dir / "exp" / "rank-0.jsonl", native(3))
    exporter.wait_value("grpo_step", 3, run="exp", rank="0")
    # A link is never followed, whether it loops or leads up the tree: one reject each.
    wait_for(lambda: exporter.errors("symlink") == 2)
    assert exporter.errors("read_error") == 0
    # The directory loop is not followed: the one record was read once.
    assert value(exporter.scrape(), "grpo_snapshots_ingested_total", shape="native") == 1


def test_snapshot_dir_deleted_and_recreated(exporter: Running, snapshot_dir: Path) -> None:
    append(snapshot_dir / "exp" / "rank-0.jsonl", native(1, **{"loss": 1.0}))
    exporter.wait_value("grpo_loss", 1.0, run="exp", rank="0")
    for p in sorted(snapshot_dir.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    snapshot_dir.rmdir()
    wait_for(lambda: exporter.errors("dir_missing") == 1)
    # The run's folder went first, file by file (rm -r): the run went with it. (A snapshot
    # folder that vanishes at once keeps what was read: the next test.)
    exporter.wait_value("grpo_loss", None, run="exp", rank="0")
    snapshot_dir.mkdir()
    append(snapshot_dir / "exp" / "rank-0.jsonl", native(2, **{"loss": 2.0}))
    exporter.wait_value("grpo_loss", 2.0, run="exp", rank="0")
    exporter.wait_value("grpo_run_logged_steps", 1, run="exp")  # a new run
    append(snapshot_dir / "exp" / "rank-0.jsonl", native(3, **{"loss": 3.0}))
    exporter.wait_value("grpo_loss", 3.0, run="exp", rank="0")
    assert exporter.errors("dir_missing") == 1


# -- non-finite values are signals ---------------------------------------------------------


def test_nan_and_inf_exported_and_counted(exporter: Running, snapshot_dir: Path) -> None:
    path = snapshot_dir / "exp" / "rank-0.jsonl"
    append(path, raw='{"step": 1, "metrics": {"loss": NaN, "grad/norm": Infinity, '
                     '"reward/mean": "nan", "kl/mean": "-inf", "weird": NaN}}\n')
    append(path, raw='{"step": 2, "metrics": {"loss": NaN}}\n')
    exporter.wait_value("grpo_step", 2, run="exp", rank="0")
    s = exporter.scrape()
    lbl = {"run": "exp", "rank": "0"}
    assert math.isnan(value(s, "grpo_loss", **lbl))  # type: ignore[arg-type]
    assert value(s, "grpo_grad_norm", **lbl) == math.inf
    assert math.isnan(value(s, "grpo_reward_mean", **lbl))  # type: ignore[arg-type]
    assert value(s, "grpo_kl_mean", **lbl) == -math.inf
    assert value(s, "grpo_nonfinite_values_total", key="loss", **lbl) == 2
    assert value(s, "grpo_nonfinite_values_total", key="grad/norm", **lbl) == 1
    assert value(s, "grpo_nonfinite_values_total", key="weird", **lbl) == 1
    assert exporter.errors("invalid_value") == 0


# -- cardinality -----------------------------------------------------------------------------


def test_unknown_keys_capped_per_run(start_exporter: Callable[..., Running], snapshot_dir: Path) -> None:
    from grpo_monitor.runtime.store import Limits

    exporter = start_exporter(limits=Limits(max_unknown_keys=3, max_prompt_types=1))
    rec = native(1, **{f"custom/{i}": float(i) for i in range(5)})
    rec["by_type"] = {"easy": {"reward/mean": 0.9}, "hard": {"reward/mean": 0.1}}
    append(snapshot_dir / "exp" / "rank-0.jsonl", rec)
    exporter.wait_value("grpo_step", 1, run="exp", rank="0")
    s = exporter.scrape()
    kept = [k for (name, lbl), _ in s.items() if name == "grpo_metric_value" for k in [dict(lbl)["key"]]]
    assert sorted(kept) == ["custom/0", "custom/1", "custom/2"]
    assert value(s, "grpo_cardinality_dropped_total", run="exp", kind="unknown_key") == 2
    assert value(s, "grpo_cardinality_dropped_total", run="exp", kind="prompt_type") == 1
    assert value(s, "grpo_reward_mean", run="exp", rank="0", prompt_type="easy") == 0.9


# -- life cycle --------------------------------------------------------------------------------


def test_restart_serves_the_same_values(start_exporter: Callable[..., Running], snapshot_dir: Path) -> None:
    first = start_exporter()
    for rank in range(3):
        path = snapshot_dir / "exp" / f"rank-{rank}.jsonl"
        append(path, *(native(s, rank=rank, **{"loss": s / 10, "kl/mean": float("nan") if s == 3 else 0.1})
                       for s in range(1, 6)))
    (snapshot_dir / "exp" / "summary.json").write_text(json.dumps({"step": 9, "custom": 1.5}))
    first.wait_value("grpo_step", 5, run="exp", rank="2")
    first.wait_value("grpo_step", 9, run="exp", rank="0")

    def run_series(s: dict) -> dict:  # type: ignore[type-arg]
        return {k: v for k, v in s.items() if k[0].startswith("grpo_") and ("run", "exp") in k[1]}

    before = run_series(first.scrape())
    first.exporter.stop()
    second = start_exporter()
    after = run_series(second.scrape())
    assert before.keys() == after.keys()
    # NaN != NaN: compare their representations.
    assert {k: repr(v) for k, v in before.items()} == {k: repr(v) for k, v in after.items()}


def test_idle_run_leaves_metrics(start_exporter: Callable[..., Running], snapshot_dir: Path) -> None:
    # Idleness is judged on the files' mtimes, so the old run is laid down before the exporter
    # starts (a live read would see the file's fresh mtime before utime() ages it).
    from grpo_monitor.contract import thresholds
    from grpo_monitor.runtime.store import HUNG_RETAIN_UNPACED

    old = snapshot_dir / "old" / "rank-0.jsonl"
    append(old, native(1, run="old"))
    # Older than a run without a pace (one record) is kept for the hung-run card.
    age = 2 * HUNG_RETAIN_UNPACED * thresholds.value("run_hung_unpaced_seconds")
    os.utime(old, (os.path.getatime(old), os.path.getmtime(old) - age))
    exporter = start_exporter(run_timeout=60.0)
    append(snapshot_dir / "new" / "rank-0.jsonl", native(1, run="new"))
    exporter.wait_value("grpo_step", 1, run="new", rank="0")
    exporter.wait_value("grpo_step", None, run="old", rank="0")
    assert old.exists()
    assert value(exporter.scrape(), "grpo_runs") == 1


def test_polling_observer(start_exporter: Callable[..., Running], snapshot_dir: Path) -> None:
    exporter = start_exporter(poll=True, poll_interval=0.1)
    append(snapshot_dir / "exp" / "rank-0.jsonl", native(1, **{"loss": 0.5}))
    exporter.wait_value("grpo_loss", 0.5, run="exp", rank="0")
    append(snapshot_dir / "exp" / "rank-0.jsonl", native(2, **{"loss": 0.25}))
    exporter.wait_value("grpo_loss", 0.25, run="exp", rank="0")


def test_rank_placement_becomes_rank_info(exporter: Running, snapshot_dir: Path) -> None:
    rec = native(1, **{"loss": 0.1})
    rec.update(host="node-7", local_rank=3, gpu="3", gpu_uuid="GPU-8b1c")
    append(snapshot_dir / "exp" / "rank-11.jsonl", {**rec, "rank": 11})
    exporter.wait_value("grpo_rank_info", 1, run="exp", rank="11", host="node-7", local_rank="3",
                        gpu="3", uuid="GPU-8b1c")


def test_a_file_gets_a_turn_of_bytes_and_is_read_on_after_the_others(tmp_path: Path) -> None:
    """A file with more new bytes than a turn's budget (a huge append, or one that grows faster
    than it is read) is read on at the next turn, from where it stopped: nothing lost, nothing
    twice, and the other files' events are not held up behind it."""
    from grpo_monitor.runtime.health import ExporterHealth
    from grpo_monitor.runtime.ingest import Ingestor
    from grpo_monitor.runtime.store import RunStore

    big, small = tmp_path / "big" / "rank-0.jsonl", tmp_path / "small" / "rank-0.jsonl"
    append(big, *(native(s, run="big", pad="x" * 900) for s in range(1, 401)))  # ~360 KiB
    append(small, native(1, run="small"))
    ingest = Ingestor(tmp_path, RunStore(), ExporterHealth())
    turns = 0
    ingest.process(big, budget=64 << 10)
    ingest.process(small, budget=64 << 10)
    assert ingest.store.max_step("small") == 1
    while ingest.unfinished:
        turns += 1
        for path in list(ingest.unfinished):
            ingest.process(path, budget=64 << 10)
    assert ingest.store.max_step("big") == 400 and turns >= 4
    ingested = ingest.health.registry.get_sample_value("grpo_snapshots_ingested_total",
                                                        {"shape": "native"})
    assert ingested == 400 + 1


def test_a_snapshot_folder_that_vanishes_at_once_keeps_what_was_read(
        exporter: Running, snapshot_dir: Path) -> None:
    """An unmounted volume, or the folder moved away: no run folder was deleted, so every run
    is still served, and followed again once the folder is back."""
    append(snapshot_dir / "exp" / "rank-0.jsonl", native(1, **{"loss": 1.0}))
    exporter.wait_value("grpo_loss", 1.0, run="exp", rank="0")
    away = snapshot_dir.with_name("away")
    snapshot_dir.rename(away)
    wait_for(lambda: exporter.errors("dir_missing") == 1)
    assert value(exporter.scrape(), "grpo_loss", run="exp", rank="0") == 1.0
    away.rename(snapshot_dir)
    append(snapshot_dir / "exp" / "rank-0.jsonl", native(2, **{"loss": 2.0}))
    exporter.wait_value("grpo_loss", 2.0, run="exp", rank="0")
    assert value(exporter.scrape(), "grpo_run_logged_steps", run="exp") == 2


def test_a_heavy_file_yields_its_turn_by_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file read because of an event gets READ_TURN_SECONDS a turn, whatever its size: with
    the turn set to nothing it is read one record a turn (the rest waits in `unfinished`), and a
    record of another run is read in between, never after the whole file."""
    from grpo_monitor.runtime import ingest as ingest_module
    from grpo_monitor.runtime.health import ExporterHealth
    from grpo_monitor.runtime.ingest import Ingestor
    from grpo_monitor.runtime.store import RunStore

    monkeypatch.setattr(ingest_module, "READ_TURN_SECONDS", 0.0)
    root = tmp_path / "snaps"
    flood = root / "flood" / "rank-0.jsonl"
    append(flood, *(native(s, run="flood", **{f"k/{i}": 1.0 for i in range(50)}) for s in range(1, 6)))
    append(root / "victim" / "rank-0.jsonl", native(7, run="victim", loss=math.nan))
    store = RunStore()
    ingestor = Ingestor(root, store, ExporterHealth())
    ingestor.process(flood)
    assert flood in ingestor.unfinished and store.max_step("flood") == 1
    ingestor.process(root / "victim" / "rank-0.jsonl")
    assert store.max_step("victim") == 7
    turns = 1
    while flood in ingestor.unfinished:
        ingestor.process(flood)
        turns += 1
    assert store.max_step("flood") == 5 and turns == 5

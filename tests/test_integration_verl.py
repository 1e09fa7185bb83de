"""verl's `file` logger pointed into the snapshot folder, read by a real exporter as it is.

verl (``trainer.logger=['console','file']``) writes through ``verl.utils.tracking.FileLogger``:
the file named by ``VERL_FILE_LOGGER_PATH`` is opened with ``open(path, "wb", buffering=0)``
(truncated at every start) and each ``log(data, step)`` writes
``orjson.dumps({"step": step, "data": data}, option=OPT_SERIALIZE_NUMPY) + b"\\n"``. The metric
names are those of verl/trainer/ppo/metric_utils.py and the actor's update.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from conftest import Running, value

import numpy as np
import orjson

RUN = "qwen2.5-7b-grpo-gsm8k"


class FileLogger:
    """What verl's FileLogger does with the file (one process, the driver, writes it)."""

    def __init__(self, path: Path) -> None:
        self.fp: BinaryIO = open(path, "wb", buffering=0)  # noqa: SIM115

    def line(self, data: dict[str, Any], step: int) -> bytes:
        return orjson.dumps({"step": step, "data": data}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"

    def log(self, data: dict[str, Any], step: int) -> None:
        self.fp.write(self.line(data, step))

    def finish(self) -> None:
        self.fp.close()


def verl_metrics(step: int, *, test_freq: int = 5, save_freq: int = 5) -> dict[str, Any]:
    """One step of a GRPO run's metrics as verl's RayPPOTrainer.fit() passes them to the logger."""
    f = np.float64
    score = 0.30 + 0.04 * step
    resp_len = 410.0 + 12.0 * step
    t_gen, t_ref, t_old, t_adv, t_upd = 21.5 + step * 0.1, 3.2, 3.4, 0.05, 14.8
    t_step = t_gen + t_ref + t_old + t_adv + t_upd + 0.6
    tokens = 1024 * (180.0 + resp_len)
    data: dict[str, Any] = {
        # compute_data_metrics
        "critic/score/mean": f(score), "critic/score/max": f(1.0), "critic/score/min": f(0.0),
        "critic/rewards/mean": f(score), "critic/rewards/max": f(1.0), "critic/rewards/min": f(0.0),
        "critic/advantages/mean": f(0.0), "critic/advantages/max": f(2.47),
        "critic/advantages/min": f(-2.47),
        "critic/returns/mean": f(0.0), "critic/returns/max": f(2.47), "critic/returns/min": f(-2.47),
        "response_length/mean": f(resp_len), "response_length/max": f(1024.0),
        "response_length/min": f(57.0), "response_length/clip_ratio": f(0.01 * step),
        "prompt_length/mean": f(180.0), "prompt_length/max": f(512.0), "prompt_length/min": f(64.0),
        "prompt_length/clip_ratio": f(0.0),
        # the actor's update (dp_actor.update_policy, averaged over micro-batches)
        "actor/entropy": f(1.10 - 0.03 * step), "actor/kl_loss": f(0.001 * step),
        "actor/kl_coef": 0.001, "actor/pg_loss": f(-0.002 * step), "actor/pg_clipfrac": f(0.0021),
        "actor/pg_clipfrac_lower": f(0.0), "actor/ppo_kl": f(1.2e-4), "actor/grad_norm": f(0.31),
        "actor/lr": 1e-6,
        # compute_timing_metrics
        "timing_s/gen": t_gen, "timing_s/reward": 0.4, "timing_s/old_log_prob": t_old,
        "timing_s/ref": t_ref, "timing_s/adv": t_adv, "timing_s/update_actor": t_upd,
        "timing_s/step": t_step, "timing_per_token_ms/gen": 1000 * t_gen / (1024 * resp_len),
        # compute_throughout_metrics: throughput is tokens/s per GPU (8 GPUs)
        "perf/total_num_tokens": int(tokens), "perf/time_per_step": t_step,
        "perf/throughput": tokens / (t_step * 8),
        "perf/max_memory_allocated_gb": 61.3, "perf/max_memory_reserved_gb": 70.1,
        "perf/cpu_memory_used_gb": 143.9, "perf/mfu/actor": 0.41,
        "training/global_step": step, "training/epoch": 0,
    }
    if step % save_freq == 0:
        data["timing_s/save_checkpoint"] = 38.0
    if step % test_freq == 0:
        data["val-core/openai/gsm8k/reward/mean@1"] = f(0.55 + 0.01 * step)
    return data


def test_verl_file_logger_run_is_ingested_as_it_is(exporter: Running, snapshot_dir: Path) -> None:
    run_dir = snapshot_dir / RUN  # one run per folder: the folder is the run name
    run_dir.mkdir()
    path = run_dir / "verl.jsonl"
    logger = FileLogger(path)  # verl opens the file at start-up, before the first step
    lbl = {"run": RUN, "rank": "0"}

    for step in (1, 2, 3):
        logger.log(verl_metrics(step), step)
    exporter.wait_value("grpo_step", 3, **lbl)

    # Step 4 reaches the disk in two writes: the half line is held, not parsed, not lost.
    line = logger.line(verl_metrics(4), 4)
    logger.fp.write(line[: len(line) // 2])
    # Events are handled in order on one thread: once a later file is visible, so is the half.
    (snapshot_dir / "marker").mkdir()
    (snapshot_dir / "marker" / "rank-0.jsonl").write_text(json.dumps({"step": 1, "x": 1}) + "\n")
    exporter.wait_value("grpo_step", 1, run="marker", rank="0")
    assert value(exporter.scrape(), "grpo_step", **lbl) == 3
    logger.fp.write(line[len(line) // 2:])
    exporter.wait_value("grpo_step", 4, **lbl)

    for step in (5, 6):
        logger.log(verl_metrics(step), step)
    exporter.wait_value("grpo_step", 6, **lbl)
    logger.finish()

    data = verl_metrics(6)
    s = exporter.scrape()
    mapped = {
        "grpo_reward_mean": "critic/score/mean", "grpo_reward_max": "critic/score/max",
        "grpo_reward_min": "critic/score/min", "grpo_kl_mean": "actor/kl_loss",
        "grpo_entropy_mean": "actor/entropy", "grpo_response_length_mean_tokens": "response_length/mean",
        "grpo_response_length_max_tokens": "response_length/max",
        "grpo_response_truncated_ratio": "response_length/clip_ratio",
        "grpo_policy_clip_ratio": "actor/pg_clipfrac", "grpo_loss": "actor/pg_loss",
        "grpo_grad_norm": "actor/grad_norm", "grpo_learning_rate": "actor/lr",
        "grpo_step_duration_seconds": "timing_s/step",
        "grpo_throughput_tokens_per_second": "perf/throughput",
    }
    assert {m: value(s, m, **lbl) for m in mapped} == {m: float(data[k]) for m, k in mapped.items()}
    for key in ("critic/advantages/mean", "critic/advantages/min", "critic/returns/max",
                "critic/rewards/mean", "response_length/min", "prompt_length/mean", "actor/ppo_kl",
                "actor/kl_coef", "actor/pg_clipfrac_lower", "timing_s/gen", "timing_s/ref",
                "timing_s/old_log_prob", "timing_s/update_actor", "timing_per_token_ms/gen",
                "perf/total_num_tokens", "perf/max_memory_allocated_gb", "perf/mfu/actor",
                "training/global_step", "training/epoch"):
        assert value(s, "grpo_metric_value", key=key, **lbl) == float(data[key]), key
    # Keys of some steps only keep the value of the last step that had them.
    step5 = verl_metrics(5)
    key = "timing_s/save_checkpoint"
    assert key not in data
    assert value(s, "grpo_metric_value", key=key, **lbl) == float(step5[key]), key
    # The validation score is the held-out score, read on the steps that log it.
    held = "val-core/openai/gsm8k/reward/mean@1"
    assert held not in data and value(s, "grpo_metric_value", key=held, **lbl) is None
    assert value(s, "grpo_heldout_score", **lbl) == float(step5[held])
    # Aliases never leak into the generic family; perf/time_per_step == timing_s/step.
    for key in [*mapped.values(), "perf/time_per_step"]:
        assert value(s, "grpo_metric_value", key=key, **lbl) is None, key

    # The driver is rank 0 and says nothing of the world size; the record has no clock.
    assert {labels for (name, labels) in s if name == "grpo_step"} == {
        frozenset(lbl.items()), frozenset({("run", "marker"), ("rank", "0")})}
    assert value(s, "grpo_world_size", **lbl) is None
    assert value(s, "grpo_last_snapshot_timestamp_seconds", **lbl) == path.stat().st_mtime
    assert value(s, "grpo_snapshots_ingested_total", shape="verl") == 6
    assert not [k for k in s if k[0] == "grpo_snapshot_errors_total" and s[k]]


def test_verl_nan_is_written_as_null_and_a_resume_truncates(exporter: Running,
                                                            snapshot_dir: Path) -> None:
    """Two caveats of verl's logger that the docs state, pinned here."""
    (snapshot_dir / RUN).mkdir()
    path = snapshot_dir / RUN / "verl.jsonl"
    lbl = {"run": RUN, "rank": "0"}
    logger = FileLogger(path)
    for step in (1, 2, 3):
        logger.log(verl_metrics(step), step)
    # orjson writes NaN as null, which means "not measured": the NaN grad norm is lost and the
    # series keeps step 3's value; no non-finite value is counted.
    bad = verl_metrics(4) | {"actor/grad_norm": np.float64("nan"), "actor/pg_loss": math.nan}
    assert b'"actor/grad_norm":null' in logger.line(bad, 4)
    logger.log(bad, 4)
    exporter.wait_value("grpo_step", 4, **lbl)
    s = exporter.scrape()
    assert value(s, "grpo_grad_norm", **lbl) == 0.31
    assert value(s, "grpo_loss", **lbl) == pytest.approx(-0.006)
    assert value(s, "grpo_nonfinite_values_total", key="grad/norm", **lbl) in (None, 0.0)
    logger.finish()

    # trainer.resume_mode=auto from the step-2 checkpoint: verl reopens the file with "wb"; the
    # exporter follows the truncation and reads the file again from its first line.
    logger = FileLogger(path)
    logger.log(verl_metrics(3), 3)
    exporter.wait_value("grpo_step", 3, **lbl)
    logger.finish()


# -- rollout vs trainer and staleness: verl's own names, read without a mapping by hand --------

STEPS = 25  # past the 20-step window of the mismatch and staleness cards

# verl/trainer/ppo/rollout_corr_helper.py (algorithm.rollout_correction.*; every name prefixed
# rollout_corr/) and verl/utils/debug/metrics.py (rollout.calculate_log_probs=True).
VERL_MISMATCH = {
    "rollout_corr/kl": "grpo_mismatch_kl", "rollout_corr/k3_kl": "grpo_mismatch_k3_kl",
    "rollout_corr/chi2_token": "grpo_mismatch_chi2_token",
    "rollout_corr/chi2_seq": "grpo_mismatch_chi2_sequence",
    "rollout_corr/ppl_ratio": "grpo_mismatch_perplexity_ratio",
    "rollout_corr/rollout_is_mean": "grpo_mismatch_is_weight_mean",
    "rollout_corr/rollout_is_min": "grpo_mismatch_is_weight_min",
    "rollout_corr/rollout_is_max": "grpo_mismatch_is_weight_max",
    "rollout_corr/rollout_is_eff_sample_size": "grpo_mismatch_is_effective_sample_ratio",
    "training/rollout_probs_diff_mean": "grpo_mismatch_prob_abs_diff_mean",
    "training/rollout_probs_diff_max": "grpo_mismatch_prob_abs_diff_max",
    "training/rollout_probs_diff_std": "grpo_mismatch_prob_abs_diff_stddev",
    "training/rollout_actor_probs_pearson_corr": "grpo_mismatch_prob_correlation",
}
# verl/trainer/ppo/v1/trainer_base.py (the trajectories' lag in policy versions) and the
# fully_async trainer / rollouter (running totals).
VERL_STALENESS = {
    "training/off_policy/trajectory_staleness/mean": "grpo_staleness_mean_steps",
    "training/off_policy/trajectory_staleness/max": "grpo_staleness_max_steps",
    "fully_async/count/stale_trajectory_processed": "grpo_staleness_stale_trajectories",
    "fully_async/count/dropped_stale_samples": "grpo_staleness_dropped_samples",
}


def verl_mismatch_metrics(step: int) -> dict[str, Any]:
    """One step with rollout correction on: a vLLM rollout drifting slowly from the trainer."""
    f = np.float64
    kl = 0.002 + 0.0004 * step
    return verl_metrics(step) | {
        "rollout_corr/kl": f(kl), "rollout_corr/k3_kl": f(0.9 * kl),
        "rollout_corr/chi2_token": f(4 * kl), "rollout_corr/chi2_seq": f(0.3 + 0.02 * step),
        "rollout_corr/ppl_ratio": f(1.0 + kl), "rollout_corr/rollout_is_mean": f(1.0 - kl),
        "rollout_corr/rollout_is_min": f(0.01), "rollout_corr/rollout_is_max": f(2.0),
        "rollout_corr/rollout_is_eff_sample_size": f(0.99 - kl),
        "rollout_corr/rollout_is_std": f(0.05), "rollout_corr/training_ppl": f(1.8),
        "training/rollout_probs_diff_valid": 1, "training/rollout_probs_diff_mean": f(0.004),
        "training/rollout_probs_diff_max": f(0.9), "training/rollout_probs_diff_std": f(0.02),
        "training/rollout_actor_probs_pearson_corr": f(0.999 - kl),
    }


def verl_async_metrics(step: int) -> dict[str, Any]:
    """One step of an off-policy run: trajectories a version or two old, counters that grow."""
    lag = np.array([1, 1, 2, 1] if step % 2 else [1, 2, 2, 1])
    return verl_metrics(step) | {
        "training/off_policy/trajectory_staleness/mean": lag.mean(),
        "training/off_policy/trajectory_staleness/max": lag.max(),
        "training/off_policy/trajectory_staleness_worst/mean": lag.mean() + 0.5,
        "fully_async/count/stale_trajectory_processed": 40 * step,
        "fully_async/count/dropped_stale_samples": 3 * step,
        "fully_async/count/current_param_version": step,
    }


def _log_run(snapshot_dir: Path, run: str, metrics: Any) -> Path:
    (snapshot_dir / run).mkdir()
    path = snapshot_dir / run / "verl.jsonl"
    logger = FileLogger(path)
    for step in range(1, STEPS + 1):
        logger.log(metrics(step), step)
    logger.finish()
    return path


def _scrape_mapped(exporter: Running, snapshot_dir: Path, run: str, metrics: Any,
                   mapped: dict[str, str], generic: tuple[str, ...]) -> tuple[Any, dict[str, str]]:
    """Log a run of ``metrics``, scrape it once its last step shows, and check that each key of
    ``mapped`` became its metric (and not the generic family) while each of ``generic`` stayed
    in the generic family; the scrape and the rank's labels, for more checks."""
    _log_run(snapshot_dir, run, metrics)
    lbl = {"run": run, "rank": "0"}
    exporter.wait_value("grpo_step", STEPS, **lbl)
    s = exporter.scrape()
    data = metrics(STEPS)
    assert {m: value(s, m, **lbl) for m in mapped.values()} == {
        m: pytest.approx(float(data[k])) for k, m in mapped.items()}
    for key in mapped:
        assert value(s, "grpo_metric_value", key=key, **lbl) is None, key
    for key in generic:
        assert value(s, "grpo_metric_value", key=key, **lbl) == float(data[key]), key
    return s, lbl


def test_verl_rollout_correction_metrics_become_mismatch_series(exporter: Running,
                                                                snapshot_dir: Path) -> None:
    # verl's neighbours without a canonical key stay in the generic family.
    s, lbl = _scrape_mapped(exporter, snapshot_dir, "verl-mismatch", verl_mismatch_metrics,
                            VERL_MISMATCH, ("rollout_corr/rollout_is_std", "rollout_corr/training_ppl",
                                            "training/rollout_probs_diff_valid"))
    # The step-window feature the level card reads: the KL of steps 6..25.
    window = {**lbl, "key": "mismatch/kl", "window_steps": "20"}
    p10 = value(s, "grpo_window_p10", **window)
    assert p10 is not None and 0.002 + 0.0004 * 6 <= p10 < 0.002 + 0.0004 * 25


def test_verl_off_policy_metrics_become_staleness_series(exporter: Running,
                                                         snapshot_dir: Path) -> None:
    # The lag of the oldest weights a trajectory used, and the policy version: no canonical key.
    s, lbl = _scrape_mapped(exporter, snapshot_dir, "verl-async", verl_async_metrics, VERL_STALENESS,
                            ("training/off_policy/trajectory_staleness_worst/mean",
                             "fully_async/count/current_param_version"))
    # GRPOStaleRollouts reads the 20-step p10 of staleness/mean: 1.25 or 1.5 at every step.
    window = {**lbl, "key": "staleness/mean", "window_steps": "20"}
    assert value(s, "grpo_window_p10", **window) == pytest.approx(1.25)

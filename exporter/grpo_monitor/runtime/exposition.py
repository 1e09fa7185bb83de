"""Prometheus text exposition (format 0.0.4) for the per-run families.

prometheus-client renders about 80k samples/s here, so 1024 ranks x the full signal set (61k
series) would cost ~750 ms a scrape. Instead each (run, rank) keeps its sample lines rendered
once when its snapshot arrives, and a scrape only joins cached strings family by family (the
format requires one family's samples to be contiguous). See docs/benchmarks.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpo_monitor.contract.keys import SIGNALS


@dataclass(frozen=True)
class Family:
    name: str
    type: str  # "gauge" or "counter"
    help: str

    def header(self) -> str:
        return f"# HELP {self.name} {escape_help(self.help)}\n# TYPE {self.name} {self.type}\n"


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value: float) -> str:
    if value != value:
        return "NaN"
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    return repr(float(value))


def labels(**pairs: str) -> str:
    """``{a="x",b="y"}`` for the given label pairs, values escaped, order kept."""
    return "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in pairs.items()) + "}"


# Families whose series carry the labels run and rank (and prompt_type, quantile, key, ...).
STEP = Family("grpo_step", "gauge", "Training step of the newest snapshot.")
LAST_SNAPSHOT = Family(
    "grpo_last_snapshot_timestamp_seconds", "gauge",
    "Trainer clock (unix seconds) of the newest snapshot; the file's mtime when it has no time.")
WORLD_SIZE = Family("grpo_world_size", "gauge", "Number of ranks the trainer reports.")
RANK_INFO = Family(
    "grpo_rank_info", "gauge",
    "Where a rank runs (host, local_rank, gpu index, uuid as NVML reports them); constant 1. "
    "Join with grpo_gpu_* on uuid, or on gpu within the node's instance.")
UNKNOWN_VALUE = Family(
    "grpo_metric_value", "gauge",
    "A numeric snapshot key outside the canonical set, labelled by key (capped per run).")
NONFINITE = Family(
    "grpo_nonfinite_values_total", "counter",
    "NaN or infinite values seen in snapshots, by canonical key.")
EVENTS = Family("grpo_events_total", "counter", "Trainer events seen in snapshots, by type.")
CARDINALITY_DROPPED = Family(
    "grpo_cardinality_dropped_total", "counter",
    "Values not exported because a per-run cardinality cap was reached, by kind.")

# Families with the label run only: the run as a whole (the GRPORunHung card reads them).
RUN_ENDED = Family(
    "grpo_run_ended", "gauge",
    "1 once the run marked its clean end (a run_end event, e.g. SnapshotWriter.close()); 0 while "
    "it runs, and again after a record that continues it.")
RUN_PAUSED = Family(
    "grpo_run_paused", "gauge",
    "1 while a rank of the run says it waits on purpose (a paused event, from "
    "SnapshotWriter.wait_if_paused after a red card) and has written no step since; else 0.")
RUN_LAST_WRITE = Family(
    "grpo_run_last_write_timestamp_seconds", "gauge",
    "When the run last wrote a snapshot, as the exporter sees it: the newest modification time of "
    "the files that fed it (unix seconds, never later than the exporter's clock when read). "
    "Unlike the trainer-clock grpo_last_snapshot_timestamp_seconds, comparable with time().")
RUN_STEP_INTERVAL = Family(
    "grpo_run_step_interval_seconds", "gauge",
    "Typical seconds per training step on the trainer's clock (the exporter's where it went "
    "back): the median of time/step differences over each rank's last 20 logged steps, of the "
    "slowest rank.")
RUN_LOG_INTERVAL = Family(
    "grpo_run_log_interval_seconds", "gauge",
    "Typical seconds between a rank's consecutive records of new steps on the trainer's clock, "
    "the exporter's where it went back (the median over its last 20, of the slowest rank): how "
    "long a silence is ordinary.")
# What the run is watched for (contract/cards.py, docs/coverage.md).
RUN_INFO = Family(
    "grpo_run_info", "gauge",
    "Constant 1: who wrote the run (framework: a native record's own word, else the shape of its "
    "records' key names; empty when unknown) and what it was read from (source: snapshots, or a "
    "logger's files).")
RUN_LOGGED_STEPS = Family(
    "grpo_run_logged_steps", "gauge", "Steps the run has logged a record for (its busiest rank's count).")
SIGNAL_LOGGED = Family(
    "grpo_run_signal_logged", "gauge",
    "1 once a rank of the run has logged the minimum curve `key` (reward, KL, entropy, response "
    "length, grad norm); 0 while none has.")
CARD_ARMED = Family(
    "grpo_card_armed", "gauge",
    "1 when the card can fire on the run now; 0 when it cannot, and why (reason missing_signal: "
    "needs names the keys to log; baseline_pending; not_applicable).")
UNKNOWN_KEY_INFO = Family(
    "grpo_unknown_key_info", "gauge",
    "Constant 1 per key the run logs that maps to no signal (capped like grpo_metric_value), with "
    "the known names it most likely meant (closest, comma-separated; empty when none is close).")
RUN_FAMILIES: tuple[Family, ...] = (
    RUN_ENDED, RUN_PAUSED, RUN_LAST_WRITE, RUN_STEP_INTERVAL, RUN_LOG_INTERVAL, CARDINALITY_DROPPED,
    RUN_INFO, RUN_LOGGED_STEPS, SIGNAL_LOGGED, CARD_ARMED, UNKNOWN_KEY_INFO)

# Step-window features (signals.py); `key` is the canonical snapshot key.
BASELINE_READY = Family(
    "grpo_baseline_ready", "gauge",
    "1 once the rank's baseline period (--signals.baseline-steps) is complete; cards that compare "
    "to a baseline wait for it.")
BASELINE_REMAINING = Family(
    "grpo_baseline_remaining_steps", "gauge",
    "Steps until the rank's baseline is ready (grpo_baseline_ready 1) and the cards that wait for "
    "it can fire; 0 once they can.")
BASELINE_MEAN = Family("grpo_baseline_mean", "gauge", "Mean of the signal over the baseline period.")
BASELINE_STDDEV = Family(
    "grpo_baseline_stddev", "gauge", "Sample standard deviation of the signal over the baseline period.")
WINDOW_MEAN = Family(
    "grpo_window_mean", "gauge",
    "Mean of the signal's last window_steps values, shifted back by offset_steps.")
BASELINE_RATIO = Family(
    "grpo_window_baseline_ratio", "gauge",
    "The signal's window_steps-step mean over its baseline mean (grpo_window_mean / "
    "grpo_baseline_mean: how far the signal runs from its baseline, as a multiple of it), once the "
    "baseline is ready; none where the baseline is 0.")
GROWTH = Family(
    "grpo_window_growth_ratio", "gauge",
    "Growth of the signal's window_steps-step mean over the window before it, both shifted back "
    "by offset_steps (0.2 = +20% per window).")
INITIAL_MEAN = Family(
    "grpo_initial_mean", "gauge",
    "Mean of the signal over its first steps (--signals.initial-steps): the reference of the cards "
    "that work from a run's first steps, before the baseline is ready.")
WINDOW_P10 = Family(
    "grpo_window_p10", "gauge",
    "10th percentile of the signal's last window_steps steps: above x when at least 90% of the "
    "window is (a 'for N consecutive steps' that tolerates a noisy step).")
WINDOW_P90 = Family(
    "grpo_window_p90", "gauge",
    "90th percentile of the signal's last window_steps steps: below x when at least 90% of the "
    "window is.")
RUN_WINDOW_MEAN_MAX = Family(
    "grpo_run_window_mean_max", "gauge",
    "Highest window_steps-step mean of the signal since the run started (its working level).")
RUN_WINDOW_MEAN_MIN = Family(
    "grpo_run_window_mean_min", "gauge",
    "Lowest window_steps-step mean of the signal since the run started (its floor).")
WINDOW_MIN = Family("grpo_window_min", "gauge", "Minimum of the signal's last window_steps values.")
WINDOW_MAX = Family("grpo_window_max", "gauge", "Maximum of the signal's last window_steps values.")
RISING = Family(
    "grpo_rising_windows", "gauge",
    "Consecutive window_steps-step windows whose mean rose over the one before.")
WINDOW_NONFINITE = Family(
    "grpo_window_nonfinite", "gauge", "NaN or infinite values of the signal in its last window_steps steps.")
NONFINITE_SINCE = Family(
    "grpo_window_nonfinite_since_step", "gauge",
    "The step at which the signal's current streak of NaN or infinite values began (no "
    "window_steps-step gap since), beside grpo_window_nonfinite.")
WINDOW_SLOPE = Family(
    "grpo_window_slope", "gauge",
    "Least-squares slope of the signal over its last window_steps steps, in its unit per step: "
    "where it is heading, and how fast.")
# Windows counted in logged records (signals.RECORD_WINDOWS): a record is one logged step of the
# signal, whatever the trainer's logging interval.
RECORDS_MIN = Family(
    "grpo_records_min", "gauge",
    "Minimum of the signal's last `records` logged values, before its newest offset_records ones.")
RECORDS_MAX = Family(
    "grpo_records_max", "gauge",
    "Maximum of the signal's last `records` logged values, before its newest offset_records ones.")
RECORDS_MEDIAN = Family(
    "grpo_records_median", "gauge",
    "Median of the signal's last `records` logged values, before its newest offset_records ones.")
FIRST_RECORDS_MEDIAN = Family(
    "grpo_first_records_median", "gauge",
    "Median of the signal's first 3 logged values other than exactly 0: the reference of the cards "
    "that judge a run from its first records, counted in records, whatever the logging interval.")
# The trend of a signal's last records (trend.py), for the keys a card's trend branch reads.
TREND_Z = Family(
    "grpo_trend_z", "gauge",
    "Mann-Kendall Z of the signal's last `records` logged values (fewer while the run has fewer): "
    "> 0 rising, < 0 falling; |Z| >= 3 is a steady move (p < 0.0013), whatever the scale.")
TREND_SLOPE = Family(
    "grpo_trend_slope", "gauge",
    "Theil's robust slope of the signal over its last `records` logged values, in its unit per step.")
TREND_FACTOR = Family(
    "grpo_trend_factor", "gauge",
    "The Theil line's value at the newest of the signal's last `records` logged values over its "
    "value at the oldest: how many times the signal moved; absent where either is not positive.")
# The held-out score on its own sparse points (signals.HeldOutTracker).
HELDOUT_BEST = Family(
    "grpo_heldout_best_score", "gauge", "Best held-out score the run has logged so far.")
HELDOUT_RECENT = Family(
    "grpo_heldout_recent_score", "gauge",
    "The better of the run's last 2 held-out scores: under a line only when both are.")
HELDOUT_NOISE = Family(
    "grpo_heldout_noise_score", "gauge",
    "Median absolute change between two consecutive held-out scores: their noise.")
HELDOUT_POINTS = Family("grpo_heldout_points", "gauge", "Held-out scores the run has logged.")
HELDOUT_SMOOTH_BEST = Family(
    "grpo_heldout_smoothed_best_score", "gauge",
    "Best mean of 3 consecutive held-out scores the run has logged so far.")
HELDOUT_SMOOTH_RECENT = Family(
    "grpo_heldout_smoothed_recent_score", "gauge", "Mean of the run's last 3 held-out scores.")
HELDOUT_REWARD_AT_SMOOTH_BEST = Family(
    "grpo_heldout_reward_at_smoothed_best", "gauge",
    "The training reward's 20-step mean when the best 3-point mean of the held-out score ended.")
HELDOUT_REWARD_AT_BEST = Family(
    "grpo_heldout_reward_at_best", "gauge",
    "The training reward's 20-step mean when the best held-out score was logged.")
# The entropy-reward law R = -a*exp(H) + b, fitted per rank on 10-step block means (forecast.py).
FORECAST_LAW_SCALE = Family(
    "grpo_forecast_law_scale", "gauge",
    "a of the entropy-reward law R = -a*exp(H) + b fitted on the run so far: the reward a unit of "
    "exp(entropy) costs.")
FORECAST_LAW_OFFSET = Family(
    "grpo_forecast_law_offset", "gauge", "b of the entropy-reward law R = -a*exp(H) + b fitted on the run so far.")
FORECAST_CEILING = Family(
    "grpo_forecast_reward_ceiling", "gauge",
    "The reward the entropy-reward law predicts at zero entropy (b - a): the run's ceiling.")
FORECAST_R2 = Family(
    "grpo_forecast_fit_r_squared", "gauge",
    "Coefficient of determination of the entropy-reward law's fit on its block means (1 = exact).")
FORECAST_POINTS = Family(
    "grpo_forecast_fit_points", "gauge", "10-step blocks the entropy-reward law is fitted on.")
# Per prompt type (the records' by_type), reward/mean only: what the shortcut card compares.
PROMPT_TYPE_WINDOW_MEAN = Family(
    "grpo_prompt_type_window_mean", "gauge",
    "Mean of the prompt type's signal over its last window_steps steps, shifted back by offset_steps.")
PROMPT_TYPE_INITIAL_MEAN = Family(
    "grpo_prompt_type_initial_mean", "gauge", "Mean of the prompt type's signal over its first steps.")
FEATURE_FAMILIES: tuple[Family, ...] = (
    BASELINE_READY, BASELINE_REMAINING, BASELINE_MEAN, BASELINE_STDDEV, INITIAL_MEAN, WINDOW_MEAN, BASELINE_RATIO,
    GROWTH, WINDOW_MIN, WINDOW_MAX, WINDOW_P10, WINDOW_P90, RUN_WINDOW_MEAN_MAX, RUN_WINDOW_MEAN_MIN, RISING,
    WINDOW_NONFINITE, NONFINITE_SINCE, WINDOW_SLOPE, RECORDS_MIN, RECORDS_MAX, RECORDS_MEDIAN, FIRST_RECORDS_MEDIAN,
    TREND_Z, TREND_SLOPE, TREND_FACTOR, HELDOUT_BEST, HELDOUT_RECENT, HELDOUT_NOISE, HELDOUT_POINTS, HELDOUT_REWARD_AT_BEST,
    HELDOUT_SMOOTH_BEST, HELDOUT_SMOOTH_RECENT, HELDOUT_REWARD_AT_SMOOTH_BEST, FORECAST_LAW_SCALE, FORECAST_LAW_OFFSET, FORECAST_CEILING, FORECAST_R2,
    FORECAST_POINTS, PROMPT_TYPE_WINDOW_MEAN, PROMPT_TYPE_INITIAL_MEAN)

# One Family per distinct metric name, in catalog order; the quantile signals share theirs.
# Families with a `quantile` label are typed summary (quantiles only, no _sum/_count): they
# are the quantiles of the step's observations, and promtool rejects the label on a gauge.
SIGNAL_FAMILIES: dict[str, Family] = {}
for _s in SIGNALS:
    unit = "" if _s.unit in ("ratio", "seconds", "tokens", "bytes") else f" Unit: {_s.unit}."
    kind = "summary" if any(k == "quantile" for k, _ in _s.labels) else "gauge"
    SIGNAL_FAMILIES.setdefault(_s.metric, Family(_s.metric, kind, _s.help + unit))

RANK_FAMILIES: tuple[Family, ...] = (
    STEP, LAST_SNAPSHOT, WORLD_SIZE, RANK_INFO, *SIGNAL_FAMILIES.values(), UNKNOWN_VALUE, NONFINITE, EVENTS,
    *FEATURE_FAMILIES)

# The families that need every record of a run, not only its first and last steps. A first start
# that read long files at their head and tail (backfill.py) publishes them for a run once its
# history is read whole: hidden until then rather than approximate, since a counter that jumped
# at that moment would look like new NaNs and events to increase(), and a range, a streak, a
# held-out best or a law fitted on part of a run could fire a card the whole run would not.
WHOLE_HISTORY: frozenset[str] = frozenset(f.name for f in (
    NONFINITE, EVENTS, CARDINALITY_DROPPED, RUN_LOGGED_STEPS, RUN_WINDOW_MEAN_MAX, RUN_WINDOW_MEAN_MIN,
    RISING, HELDOUT_BEST, HELDOUT_RECENT, HELDOUT_NOISE, HELDOUT_POINTS, HELDOUT_REWARD_AT_BEST,
    HELDOUT_SMOOTH_BEST, HELDOUT_SMOOTH_RECENT, HELDOUT_REWARD_AT_SMOOTH_BEST,
    FORECAST_LAW_SCALE, FORECAST_LAW_OFFSET, FORECAST_CEILING, FORECAST_R2, FORECAST_POINTS))

# The families that need a rank's first records: its baseline and initial values. A first start
# that read a rank at its tail alone (a rank of performance signals only: ingest._tail_first)
# publishes them for that rank once the backfill has read it whole, as the WHOLE_HISTORY ones.
NEEDS_HEAD: frozenset[str] = frozenset(f.name for f in (
    BASELINE_READY, BASELINE_REMAINING, BASELINE_MEAN, BASELINE_STDDEV, BASELINE_RATIO, INITIAL_MEAN,
    FIRST_RECORDS_MEDIAN))

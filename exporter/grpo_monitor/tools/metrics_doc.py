"""Render docs/metrics.md from the code's own catalogs, so the reference cannot drift.

``python -m grpo_monitor.tools.metrics_doc > docs/metrics.md`` (``make docs``); a test fails when the
committed file differs from this output.
"""

from __future__ import annotations

from grpo_monitor.contract.cards import MINIMUM_CURVES
from grpo_monitor.contract.keys import SIGNALS
from grpo_monitor.runtime import exposition as ex
from grpo_monitor.runtime import forecast, store, trend
from grpo_monitor.runtime import signals as sig
from grpo_monitor.runtime.collectors import gpu
from grpo_monitor.runtime.config import ExporterConfig
from grpo_monitor.runtime.health import ERROR_REASONS

HEADER = """\
# Metrics reference

Generated from the code by `make docs` (`python -m grpo_monitor.tools.metrics_doc`); do not edit by
hand. The exporter serves them at `/metrics` (default `:9400`). Names follow Prometheus'
conventions: the `grpo_` prefix, base units, `_total` for counters, `_ratio` for 0–1 fractions;
`promtool check metrics` on a scrape prints nothing.

## Labels

| label | meaning |
|---|---|
| `run` | the record's `run`, else the first folder under the snapshot folder (`default` at its top) |
| `rank` | the record's `rank`, else `rank-N` / `rankN` in the file name, else `0` |
| `prompt_type` | present only on the `by_type` breakdown of a record; absent on the overall value |
| `quantile` | on the `*_quantile` families (typed `summary`, quantiles only) |
| `key` | the snapshot key, on the generic and the non-finite families |

Each series holds the newest value its (run, rank[, prompt_type]) reported: a record that leaves
a key out keeps the key's last value (quantiles logged every 100 steps stay visible). A run
whose files have not changed for `--snapshot.run-timeout` (default 1h) leaves `/metrics`.

## Training signals

One gauge per canonical snapshot key; the aliases are the names TRL, verl and OpenRLHF use for
the same signal (older names included), and a key is also recognised with wandb's
`train/` prefix and with spaces around a `/`. When a record carries several names of one key,
the canonical key wins, then the alias listed first here, then the `train/`-prefixed forms;
the order of the record's keys does not matter. An alias marked (×f) is logged in another unit
and multiplied by f. [snapshot-format.md](snapshot-format.md#aliases) says why each name means
what it is mapped to, and which look-alike names are left unmapped.

| metric | labels | unit | canonical key | aliases |
|---|---|---|---|---|
"""

RUN_FAMILIES = """
## Run bookkeeping

| metric | type | labels | meaning |
|---|---|---|---|
| `{step}` | gauge | run, rank | `step` of the newest record |
| `{last}` | gauge | run, rank | the record's `time` (trainer clock, unix seconds); the file's mtime when absent |
| `{world}` | gauge | run, rank | `world_size` as the record states it |
| `{info}` | gauge | run, rank, host, local_rank, gpu, uuid | constant 1: where the rank runs (the record's `host`, `local_rank`, `gpu`, `gpu_uuid`); join with `grpo_gpu_*` on `uuid` |
| `{unknown}` | gauge | run, rank, key[, prompt_type] | any other numeric key, under the per-run cap `--metrics.max-unknown-keys` (default {max_unknown}) |
| `{nonfinite}` | counter | run, rank, key | NaN / ±Inf values seen (they are exported as they are, too) |
| `{events}` | counter | run, rank, type | `events` entries, by `type` (e.g. `checkpoint_save`), capped by `--metrics.max-event-types` |
| `{dropped}` | counter | run, kind | values a cardinality cap dropped: `unknown_key`, `prompt_type`, `event_type` |

## The run as a whole

What the hung-run card (GRPORunHung) reads: has the run ended (or is it paused on purpose), when
did it last write, and how long does it usually take between records.

| metric | type | labels | meaning |
|---|---|---|---|
| `{ended}` | gauge | run | 1 once a record's `events` holds `{{"type": "run_end"}}` (`SnapshotWriter.close()`, the TRL callback's `on_train_end`, or an appended line); back to 0 when a rank that wrote the end writes again, or any rank passes the step the run had reached (a resumed run) |
| `{paused}` | gauge | run | 1 while a rank waits on purpose: its newest record is a `paused` mark (`SnapshotWriter.wait_if_paused()` after a red card), not yet followed by a `resumed` mark or a step |
| `{last_write}` | gauge | run | the newest modification time of the files that fed the run, as the exporter read them (unix seconds, capped at the exporter's clock; no earlier than the exporter's previous read of a file that grew since, whatever the file server's clock says): a silence measured against `time()`, whatever the trainer's clock says |
| `{step_interval}` | gauge | run | typical seconds per training step on the trainer's clock (records' `time`; where it went back, the exporter's between the files' writes): per rank the median of Δtime/Δstep over its last {n} logged steps, the slowest rank's; absent until a rank has {min_intervals} intervals between records (until then the hung-run card waits for its floor for a run without a pace) |
| `{log_interval}` | gauge | run | the same median of Δtime between consecutive records (equal to the step interval when every step is logged; ten times it at `logging_steps=10`) |


## What the run is watched for

Which cards can fire on the run, and what it logs of the minimum curves
([coverage.md](coverage.md), generated from `contract/cards.py` like the table below).

| metric | type | labels | meaning |
|---|---|---|---|
| `{card_armed}` | gauge | run, card, severity, reason, needs | one per card of the catalog: 1 when it can fire on the run now; 0 with `reason` `missing_signal` (`needs`: the keys to log, comma-separated), `baseline_pending` or `not_applicable` |
| `{signal_logged}` | gauge | run, key | per minimum curve ({curves}): 1 once a rank of the run logged it, else 0 (GRPOSignalMissing) |
| `{logged_steps}` | gauge | run | steps the run has logged a record for, its busiest rank's count |
| `{run_info}` | gauge | run, framework, source | constant 1: who wrote the run (a native record's `framework`, else the first key name only one framework logs; empty when unknown), and what it was read from (`source`: `snapshots`, or a logger's files: `wandb`, `tensorboard`, `mlflow`, `trackio`, `jsonl`, `trainer_state`, `csv` — [loggers.md](loggers.md); a run read from a logger's files has no pause gate unless its trainer adds one) |
| `{unknown_info}` | gauge | run, key, closest | constant 1 per key that maps to no signal (under the same cap as `{unknown}`), `closest` the known names it most likely meant (within two edits, not another statistic of a signal), empty when none |

A run that has not ended stays in `/metrics` for at least {retain} of its log intervals (before its
pace is known, {retain_unpaced} times `grpo:threshold:run_hung_unpaced_seconds`), even past
`--snapshot.run-timeout`, so that its silence can raise the hung-run card.
"""

FEATURES = """
## Step-window features

Per (run, rank) and canonical `key`, over the rank's step history (a window counts steps, not
logged values: a key logged every 10 steps has 5 values in a 50-step window; on a run shorter
than a {early}-step window of offset 0, the window is the run so far, from its
{persist}rd record). The alert rules
compare them to the thresholds (`grpo:threshold:*`, generated from
`exporter/grpo_monitor/contract/thresholds.py`); [signals.md](signals.md) explains each.

| metric | labels | meaning |
|---|---|---|
| `{ready}` | run, rank | 1 once the baseline period is complete (`--signals.baseline-steps`, default {baseline}) |
| `{remaining}` | run, rank | steps until the baseline is ready and the cards that wait for it can fire; 0 once they can |
| `{bmean}` | run, rank, key | mean over the baseline period, present only while the baseline is ready |
| `{bstd}` | run, rank, key | sample standard deviation over the baseline period |
| `{imean}` | run, rank, key | mean over the key's first {init} steps (`--signals.initial-steps`): its initial value, present once those steps are past (training keys) |
| `{wmean}` | run, rank, key, window_steps, offset_steps | mean of the last `window_steps` values, shifted back by `offset_steps`; training keys: {train_means}; `perf/*`: {perf_means} |
| `{ratio}` | run, rank, key, window_steps | the {ratio_w}-step mean (offset 0) over the baseline mean, of every training key and of the `perf/*` keys a card reads ({ratio_perf}): how far the signal runs above or below its baseline, as a multiple of it; present only while the baseline is ready, absent where the baseline is 0 (the step-time and throughput cards read it, and wait for the baseline through it) |
| `{growth}` | run, rank, key, window_steps, offset_steps | growth of the {gw}-step mean over the {gw} steps before it, both shifted back by `offset_steps` ({goffs}): the ratio of the two means minus 1, positive while the signal grows (training keys) |
| `{wmin}`, `{wmax}` | run, rank, key, window_steps | min / max of the last `window_steps` values; training keys: {train_ext}; `perf/*`: {perf_ext} |
| `{p10}`, `{p90}` | run, rank, key, window_steps | 10th / 90th percentile of the last `window_steps` steps' values ({train_pct}; training keys), or of the last {persist} records where those steps hold fewer: "in 90% of the window" never rests on one or two logged values |
| `{rmax}`, `{rmin}` | run, rank, key, window_steps | highest / lowest complete {range_w}-step mean since the run started: its working level and its floor (training keys) |
| `{rising}` | run, rank, key, window_steps | consecutive {rising_w}-step windows whose mean rose (training keys) |
| `{nonfinite}` | run, rank, key, window_steps | NaN / ±Inf values in the last {nf_w} steps |
| `{nonfinite_since}` | run, rank, key, window_steps | the step the signal's current streak of NaN / ±Inf values began (no {nf_w}-step gap since), beside `{nonfinite}`: the step the non-finite card names for each key |
| `{slope}` | run, rank, key, window_steps | least-squares slope per step over the last {slope_w} steps: where the signal is heading (training keys) |
| `{rmin_rec}`, `{rmax_rec}`, `{rmed_rec}` | run, rank, key, records, offset_records | min / max / median of the last `records` logged values before the newest `offset_records`, windows counted in records, not steps, for the keys the blow-up card reads ({rec_keys}): {rec_windows} |
| `{first_rec}` | run, rank, key | median of the signal's first {first_n} logged values other than exactly 0 (training keys): the reference of the cards that judge a run from its first records |
| `{trend_z}`, `{trend_slope}`, `{trend_factor}` | run, rank, key, records | the trend of the signal's last `records` ({trend_n}) logged values, fewer early in a run (from {trend_min}), for the keys a trend branch reads ({trend_keys}): Mann–Kendall's Z (> 0 rising, < 0 falling, \\|Z\\| ≥ 3 a steady move), Theil's slope per step, and the factor its Theil line moved by over those records (absent where the line's start or end is not positive) |
| `{h_best}`, `{h_recent}`, `{h_noise}`, `{h_points}`, `{h_reward}` | run, rank | the held-out score (`{h_key}`) on its own sparse points: its best so far, the better of its last {h_recent_n}, the median change between two consecutive points, how many, and the training reward's {h_level}-step mean when the best point was logged |
| `{hs_best}`, `{hs_recent}`, `{hs_reward}` | run, rank | the same smoothed: the best mean of {h_smooth} consecutive held-out points so far, the mean of the last {h_smooth}, and the training reward's {h_level}-step mean when that best ended |
| `{ptmean}` | run, rank, prompt_type, key, window_steps, offset_steps | per prompt type (a record's `by_type`), for {pt_keys}: mean over {pt_means} |
| `{ptinit}` | run, rank, prompt_type, key | per prompt type, for {pt_keys}: mean over the type's first {init} steps |

## The entropy–reward law

Per (run, rank), the law R = −a·exp(H) + b (arXiv 2505.22617) fitted by least squares on the
{block}-step block means of `{law_h}` (H) and `{law_r}` (R), every complete block since the run
started; published once {min_blocks} blocks exist and exp(H) varies across them. A resume to an
earlier step keeps the fit. [signals.md](signals.md#the-entropy-reward-law) explains it.

| metric | labels | meaning |
|---|---|---|
| `{scale}` | run, rank | a: the reward one unit of exp(entropy) costs |
| `{offset}` | run, rank | b |
| `{ceiling}` | run, rank | b − a: the reward the law predicts at zero entropy, the run's ceiling |
| `{r2}` | run, rank | coefficient of determination of the fit on its block means (1 = exact) |
| `{points}` | run, rank | blocks in the fit |

No fit is published while the block means of the entropy span less than {spread:.0%} of their largest value: an entropy that sits still gives a line through noise, whatever its R².

`perf/*` values of steps that carry a `checkpoint_save` (or `checkpoint`, `eval`) event are left
out of windows and baselines: a save stalls the step, and is no drift.
"""

EXPORTER = """
## The exporter's own health

| metric | type | labels | meaning |
|---|---|---|---|
| `grpo_snapshots_ingested_total` | counter | shape | records ingested, by shape: `native`, `verl`, `flat` |
| `grpo_snapshot_errors_total` | counter | reason | input that could not be used, in part or whole (reasons below) |
| `grpo_snapshot_files` | gauge | | snapshot files being followed |
| `grpo_snapshot_event_overflows_total` | counter | | overflows of the kernel's inotify event queue (events lost in a burst, or while the exporter lagged); each starts a full rescan at once |
| `grpo_runs` | gauge | | runs currently exported |
| `grpo_runs_expired_total` | counter | | runs dropped after `--snapshot.run-timeout` |
| `grpo_webhook_requests_total` | counter | outcome | Alertmanager webhook requests (`--web.webhook-token-file`), by outcome: `paused`, `ignored`, `unauthorized`, `bad_request`, `too_large`, `error` |
| `grpo_notifications_total` | counter | outcome | Cards relayed to a person (`--notify.url`), by outcome: `sent`, `failed` (a target did not take it; the webhook answers 502 and Alertmanager retries) |
| `grpo_card_pauses_total` | counter | result | red cards applied to a run of this node (from the webhook or the poll), by result: `paused`, `unchanged` (paused already, or this firing was resumed), `permission_denied`, `refused` (a link on the way), `write_error`; one run's failure stops no other run's pause ([pause.md](pause.md)) |
| `grpo_alertmanager_polls_total` | counter | outcome | Polls of Alertmanager for red cards (`--alertmanager.url`), by outcome: `paused` (a run of this node was paused), `unchanged`, `error` (unreachable or a bad answer; retried at the next poll) |
| `grpo_http_rejects_total` | counter | reason | HTTP requests and connections turned away, by reason: `unauthorized` (basic auth, `--web.config.file`), `request_line_too_long`, `header_too_large`, `too_many_headers`, `read_timeout` (a request not read within `--web.read-timeout`), `write_timeout`, `evicted` (all `--web.max-connections` taken: the one waiting longest for its request), `connection_limit` (all taken by requests being answered), `tls_handshake`, `tls_client_san` ([security.md](security.md)) |
| `grpo_http_connections` | gauge | | open HTTP connections (at most `--web.max-connections`) |
| `grpo_exporter_internal_errors_total` | counter | | unexpected errors in the ingest thread, logged with a traceback; the thread goes on (any is a bug) |
| `grpo_exporter_ready` | gauge | | 1 once the files on disk at start-up are replayed (also `/-/ready`) |
| `grpo_exporter_state_restores_total` | counter | result | start-ups by what became of the saved state (`--storage.path`, [scaling.md](scaling.md#a-restart-that-does-not-re-read-the-history)): `restored`, or `missing`, `stale` (another version or snapshot folder), `corrupt`, `refused` (not a regular file of the exporter's user, writable by no one else) and every file read instead |
| `grpo_exporter_state_saves_total`, `grpo_exporter_state_save_errors_total` | counter | | saved states written, and those that could not be (logged; the previous one stays) |
| `grpo_exporter_state_bytes`, `grpo_exporter_state_last_save_duration_seconds` | gauge | | size of the last saved state, and the time its save took |
| `grpo_exporter_partial_runs`, `grpo_exporter_backfill_bytes` | gauge | | runs a first start serves from their files' heads and tails until it has read the rest of their history, and the bytes it has yet to read (`--snapshot.backfill-above-bytes`, [scaling.md](scaling.md#first-start)); see below for what waits |
| `grpo_exporter_deferred_tail_files` | gauge | | files of ranks that log performance signals only whose newest steps a first start reads right after ready; each rank is served once its tail is read, and the backfill begins after the last |
| `grpo_exporter_partial_ranks` | gauge | | ranks of those runs served from their files' tails alone (performance signals only): their head's families wait for the backfill too (below) |
| `grpo_exporter_partial_families` | gauge | family | runs whose series of this family are withheld until the backfill has read them whole: each family below, listed only while withheld |
| `grpo_exporter_build_info` | gauge | version | constant 1 |
| `process_*`, `python_*` | | | prometheus-client's process and platform collectors |

A first start without a saved state reads a long `*.jsonl` file's head (its rank's baseline
period) and tail (the steps its windows read), is ready, and reads the middle after. Until a
run's history is read whole, every series of the run is what a whole read gives, except these,
which need every record and are not published for the run until then (hidden, not approximate,
so that no card judges part of a run as if whole, and no counter jumps): {whole_history}.
A rank that logs performance signals only is read at its tail alone (after ready), its head with
the backfill: until then its baseline and first-steps families are withheld too: {needs_head}.

Every error is logged once per file and reason, with the file's name; later ones are counted.

| reason | what happened | what is kept |
|---|---|---|
"""

GPU = """
## GPU health (NVML)

The GPU collector (`--collector.gpu`, on by default; `--no-collector.gpu` removes every family
below) reads each GPU through NVML (`pynvml`, from the `nvidia-ml-py` package) every
`--collector.gpu.interval` (default {interval}) in a background thread; a scrape serves the last
collection and never waits on NVML. Per-GPU series carry `gpu` (the NVML index), `uuid` and
`model`, as dcgm-exporter labels them; no host label, Prometheus' `instance` names the node.

A value a GPU does not give (not supported, no permission, or any NVML error on that one call) is
left out alone; the GPU's other series and the other GPUs stay. A GPU that fails on its handle or
falls off the bus is left out of that collection (nothing half-read of it) and counted in
`{failures}`. Without pynvml, the NVML library, the driver or a GPU,
only the collector's own health series are exported, with `{up} 0` (logged
once), and NVML is tried again every {retry} collections.

| metric | type | labels | unit | from (NVML) |
|---|---|---|---|---|
"""

GPU_NOTES = """
- `reason`, one series per clock event reason bit: {reasons}.
- NVLink `type`: {nvlink}; one set per link whose state is enabled (`link` from 0).
- ECC `type`: {ecc}; volatile counters, since the driver was loaded.
- `xid`: the XID code (e.g. 79 fallen off the bus, 48 double-bit ECC error, 13 graphics engine
  exception). Events are read without waiting (`nvmlEventSetWait_v2` with timeout 0 until
  NVML_ERROR_TIMEOUT), counted from the exporter's start, and stay exported after their GPU is
  lost (while the collector is up). A series appears with its first XID.
- The energy, PCIe replay, NVLink and ECC counters are the driver's own (they restart with it).

### The GPU collector's own health

| metric | type | meaning |
|---|---|---|
"""


def _pairs(pairs: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"{w}@{o}" for w, o in pairs) + " (window@offset)"


def render() -> str:
    out = [HEADER]
    for s in SIGNALS:
        labels = "run, rank[, prompt_type]" + "".join(f", {k}=\"{v}\"" for k, v in s.labels)
        aliases = ", ".join([f"`{a}`" for a in s.aliases] + [f"`{a}` (×{f:g})" for a, f in s.scaled]) or "—"
        out.append(f"| `{s.metric}` | {labels} | {s.unit} | `{s.key}` | {aliases} |\n")
    out.append(RUN_FAMILIES.format(
        step=ex.STEP.name, last=ex.LAST_SNAPSHOT.name, world=ex.WORLD_SIZE.name, info=ex.RANK_INFO.name,
        unknown=ex.UNKNOWN_VALUE.name, nonfinite=ex.NONFINITE.name, events=ex.EVENTS.name,
        dropped=ex.CARDINALITY_DROPPED.name, ended=ex.RUN_ENDED.name, paused=ex.RUN_PAUSED.name, last_write=ex.RUN_LAST_WRITE.name,
        step_interval=ex.RUN_STEP_INTERVAL.name, log_interval=ex.RUN_LOG_INTERVAL.name,
        n=store.INTERVAL_STEPS, retain=store.HUNG_RETAIN_INTERVALS,
        min_intervals=store.PACE_MIN_INTERVALS, retain_unpaced=store.HUNG_RETAIN_UNPACED,
        card_armed=ex.CARD_ARMED.name, signal_logged=ex.SIGNAL_LOGGED.name,
        logged_steps=ex.RUN_LOGGED_STEPS.name, run_info=ex.RUN_INFO.name,
        unknown_info=ex.UNKNOWN_KEY_INFO.name, curves=", ".join(f"`{k}`" for k in MINIMUM_CURVES),
        max_unknown=store.Limits.max_unknown_keys))
    out.append(FEATURES.format(
        ready=ex.BASELINE_READY.name, baseline=store.Limits.baseline_steps,
        remaining=ex.BASELINE_REMAINING.name,
        bmean=ex.BASELINE_MEAN.name, bstd=ex.BASELINE_STDDEV.name,
        wmean=ex.WINDOW_MEAN.name, ratio=ex.BASELINE_RATIO.name, ratio_w=sig.BASELINE_RATIO_WINDOW,
        ratio_perf=", ".join(f"`{k}`" for k in sorted(sig.RATIO_PERF_KEYS)),
        growth=ex.GROWTH.name, gw=sig.GROWTH_WINDOW,
        goffs=", ".join(map(str, sig.GROWTH_OFFSETS)), wmin=ex.WINDOW_MIN.name, wmax=ex.WINDOW_MAX.name,
        rising=ex.RISING.name, nonfinite=ex.WINDOW_NONFINITE.name,
        nonfinite_since=ex.NONFINITE_SINCE.name,
        train_means=_pairs(sig.TRAINING_MEANS), perf_means=_pairs(sig.PERF_MEANS),
        train_ext=", ".join(map(str, sig.TRAINING_EXTREMES)),
        perf_ext=", ".join(map(str, sig.PERF_EXTREMES)), rising_w=sig.RISING_WINDOW,
        nf_w=sig.NONFINITE_WINDOW, imean=ex.INITIAL_MEAN.name, init=sig.INITIAL_STEPS,
        p10=ex.WINDOW_P10.name, p90=ex.WINDOW_P90.name,
        train_pct=", ".join(map(str, sig.TRAINING_PERCENTILES)), rmax=ex.RUN_WINDOW_MEAN_MAX.name,
        rmin=ex.RUN_WINDOW_MEAN_MIN.name, range_w=sig.RANGE_WINDOW,
        slope=ex.WINDOW_SLOPE.name, slope_w=", ".join(map(str, sig.SLOPE_WINDOWS)),
        persist=sig.PERSISTENCE_RECORDS, rmin_rec=ex.RECORDS_MIN.name, rmax_rec=ex.RECORDS_MAX.name,
        rmed_rec=ex.RECORDS_MEDIAN.name,
        rec_keys=", ".join(f"`{k}`" for k in sorted(sig.RECORD_KEYS)),
        rec_windows=", ".join(f"{n}@{o} (up to {n}, published from {f})"
                              for n, o, f in sig.PUBLISHED_RECORD_WINDOWS)
        + " (records@offset_records)",
        early=" or ".join(map(str, sorted(sig.EARLY_WINDOWS))),
        first_rec=ex.FIRST_RECORDS_MEDIAN.name, first_n=sig.FIRST_RECORDS,
        h_best=ex.HELDOUT_BEST.name, h_recent=ex.HELDOUT_RECENT.name, h_noise=ex.HELDOUT_NOISE.name,
        h_points=ex.HELDOUT_POINTS.name, h_reward=ex.HELDOUT_REWARD_AT_BEST.name,
        h_key=sig.HELDOUT_KEY, h_recent_n=sig.HELDOUT_RECENT_POINTS, h_level=sig.REWARD_LEVEL_WINDOW,
        hs_best=ex.HELDOUT_SMOOTH_BEST.name, hs_recent=ex.HELDOUT_SMOOTH_RECENT.name,
        hs_reward=ex.HELDOUT_REWARD_AT_SMOOTH_BEST.name, h_smooth=sig.HELDOUT_SMOOTH_POINTS,
        trend_z=ex.TREND_Z.name, trend_slope=ex.TREND_SLOPE.name, trend_factor=ex.TREND_FACTOR.name,
        trend_n=trend.TREND_RECORDS, trend_min=trend.TREND_MIN_RECORDS,
        trend_keys=", ".join(f"`{k}`" for k in sorted(sig.TREND_KEYS)),
        ptmean=ex.PROMPT_TYPE_WINDOW_MEAN.name, ptinit=ex.PROMPT_TYPE_INITIAL_MEAN.name,
        pt_keys=", ".join(f"`{k}`" for k in sig.PROMPT_TYPE_KEYS), pt_means=_pairs(sig.PROMPT_TYPE_MEANS),
        block=forecast.BLOCK_STEPS, law_h=sig.LAW_ENTROPY, law_r=sig.LAW_REWARD,
        min_blocks=forecast.MIN_BLOCKS, scale=ex.FORECAST_LAW_SCALE.name,
        offset=ex.FORECAST_LAW_OFFSET.name, ceiling=ex.FORECAST_CEILING.name,
        r2=ex.FORECAST_R2.name, points=ex.FORECAST_POINTS.name, spread=forecast.MIN_ENTROPY_SPREAD))
    out.append(EXPORTER.format(whole_history=", ".join(f"`{name}`" for name in sorted(ex.WHOLE_HISTORY)),
                               needs_head=", ".join(f"`{name}`" for name in sorted(ex.NEEDS_HEAD))))
    for reason, (what, kept) in ERROR_REASONS.items():
        out.append(f"| `{reason}` | {what} | {kept} |\n")
    out.append(GPU.format(interval=f"{ExporterConfig.gpu_interval:g}s", failures=gpu.FAILURES.name,
                          up=gpu.UP.name, retry=gpu.INIT_RETRY_EVERY))
    for fam in gpu.GPU_FAMILIES:
        labels = ", ".join((*gpu.GPU_LABELS, *fam.labels))
        out.append(f"| `{fam.name}` | {fam.type} | {labels} | {fam.unit or '—'} | {fam.source} |\n")
    out.append(GPU_NOTES.format(
        reasons=", ".join(f"`{r}`" for r, _ in gpu.CLOCK_EVENT_REASONS),
        nvlink=", ".join(f"`{t}`" for t, _ in gpu.NVLINK_ERROR_TYPES),
        ecc=", ".join(f"`{t}`" for t, _ in gpu.ECC_TYPES)))
    for fam in gpu.HEALTH_FAMILIES:
        out.append(f"| `{fam.name}` | {fam.type} | {fam.help} |\n")
    return "".join(out)


if __name__ == "__main__":
    print(render(), end="")

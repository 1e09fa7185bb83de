"""Render docs/metrics.md from the code's own catalogs, so the reference cannot drift.

``python -m grpo_monitor.metrics_doc > docs/metrics.md`` (``make docs``); a test fails when the
committed file differs from this output.
"""

from __future__ import annotations

from grpo_monitor import exposition as ex
from grpo_monitor import signals as sig
from grpo_monitor.collectors import gpu
from grpo_monitor.config import ExporterConfig
from grpo_monitor.health import ERROR_REASONS
from grpo_monitor.keys import SIGNALS

HEADER = """\
# Metrics reference

Generated from the code by `make docs` (`python -m grpo_monitor.metrics_doc`); do not edit by
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

One gauge per canonical snapshot key; the aliases are the names TRL, verl, OpenRLHF and the
seeds use for the same signal, and a key is also recognised with wandb's `train/` prefix. When a
record carries both a canonical key and one of its aliases, the canonical key wins.

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
| `{unknown}` | gauge | run, rank, key[, prompt_type] | any other numeric key, under the per-run cap `--metrics.max-unknown-keys` (default 256) |
| `{nonfinite}` | counter | run, rank, key | NaN / ±Inf values seen (they are exported as they are, too) |
| `{events}` | counter | run, rank, type | `events` entries, by `type` (e.g. `checkpoint_save`), capped by `--metrics.max-event-types` |
| `{dropped}` | counter | run, kind | values a cardinality cap dropped: `unknown_key`, `prompt_type`, `event_type` |
"""

FEATURES = """
## Step-window features

Per (run, rank) and canonical `key`, over the rank's step history (a window counts the key's
last N logged values; trainers log every step). The alert rules compare them to the thresholds;
[signals.md](signals.md) explains each and ties it to its seed section.

| metric | labels | meaning |
|---|---|---|
| `{ready}` | run, rank | 1 once the baseline period is complete (`--signals.baseline-steps`, default 200) |
| `{bmean}` | run, rank, key | mean over the baseline period (present once ready) |
| `{bstd}` | run, rank, key | sample standard deviation over the baseline period |
| `{wmean}` | run, rank, key, window_steps, offset_steps | mean of the last `window_steps` values, shifted back by `offset_steps`; training keys: {train_means}; `perf/*`: {perf_means} |
| `{growth}` | run, rank, key, window_steps, offset_steps | growth of the {gw}-step mean over the {gw} steps before it, both shifted back by `offset_steps` ({goffs}); 0.2 = +20% per {gw} steps (training keys) |
| `{wmin}`, `{wmax}` | run, rank, key, window_steps | min / max of the last `window_steps` values; training keys: {train_ext}; `perf/*`: {perf_ext} |
| `{rising}` | run, rank, key, window_steps | consecutive {rising_w}-step windows whose mean rose (training keys) |
| `{nonfinite}` | run, rank, key, window_steps | NaN / ±Inf values in the last {nf_w} steps |

`perf/*` values of steps that carry a `checkpoint_save` (or `checkpoint`, `eval`) event are left
out of windows and baselines: a save stalls the step, and is no drift (seed 000 §4.5).
"""

EXPORTER = """
## The exporter's own health

| metric | type | labels | meaning |
|---|---|---|---|
| `grpo_snapshots_ingested_total` | counter | shape | records ingested, by shape: `native`, `verl`, `flat` |
| `grpo_snapshot_errors_total` | counter | reason | input that could not be used, in part or whole (reasons below) |
| `grpo_snapshot_files` | gauge | | snapshot files being followed |
| `grpo_runs` | gauge | | runs currently exported |
| `grpo_runs_expired_total` | counter | | runs dropped after `--snapshot.run-timeout` |
| `grpo_webhook_requests_total` | counter | outcome | Alertmanager webhook requests (`--web.webhook-token-file`), by outcome: `paused`, `ignored`, `unauthorized`, `bad_request`, `too_large`, `error` |
| `grpo_notifications_total` | counter | outcome | Cards relayed to a person (`--notify.url`), by outcome: `sent`, `failed` (a target did not take it; the webhook answers 502 and Alertmanager retries) |
| `grpo_exporter_internal_errors_total` | counter | | unexpected errors in the ingest thread, logged with a traceback; the thread goes on (any is a bug) |
| `grpo_exporter_ready` | gauge | | 1 once the files on disk at start-up are replayed (also `/-/ready`) |
| `grpo_exporter_build_info` | gauge | version | constant 1 |
| `process_*`, `python_*` | | | prometheus-client's process and platform collectors |

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
        aliases = ", ".join(f"`{a}`" for a in s.aliases) or "—"
        out.append(f"| `{s.metric}` | {labels} | {s.unit} | `{s.key}` | {aliases} |\n")
    out.append(RUN_FAMILIES.format(
        step=ex.STEP.name, last=ex.LAST_SNAPSHOT.name, world=ex.WORLD_SIZE.name, info=ex.RANK_INFO.name,
        unknown=ex.UNKNOWN_VALUE.name, nonfinite=ex.NONFINITE.name, events=ex.EVENTS.name,
        dropped=ex.CARDINALITY_DROPPED.name))
    out.append(FEATURES.format(
        ready=ex.BASELINE_READY.name, bmean=ex.BASELINE_MEAN.name, bstd=ex.BASELINE_STDDEV.name,
        wmean=ex.WINDOW_MEAN.name, growth=ex.GROWTH.name, gw=sig.GROWTH_WINDOW,
        goffs=", ".join(map(str, sig.GROWTH_OFFSETS)), wmin=ex.WINDOW_MIN.name, wmax=ex.WINDOW_MAX.name,
        rising=ex.RISING.name, nonfinite=ex.WINDOW_NONFINITE.name,
        train_means=_pairs(sig.TRAINING_MEANS), perf_means=_pairs(sig.PERF_MEANS),
        train_ext=", ".join(map(str, sig.TRAINING_EXTREMES)),
        perf_ext=", ".join(map(str, sig.PERF_EXTREMES)), rising_w=sig.RISING_WINDOW,
        nf_w=sig.NONFINITE_WINDOW))
    out.append(EXPORTER)
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

"""``grpo-monitor report RUN_DIR``: the offline post-mortem of one run (seed 000 §3.1: quick
decisions with live dashboards, deep attribution with local snapshots).

It reads every snapshot record of the run folder, summarises each core signal by quantiles
rather than means (linear-interpolation percentiles, seed 001 §2), writes ``reward-vs-step.csv``
(seed 001 §3), reads reward, KL and loss together (the three-curve method, seed 001 §1) and
names what it sees as verdicts, each with the steps and numbers that support it.

Outputs (in ``--out``, default ``RUN_DIR/.report`` - a dot folder, which the exporter's ingest
ignores): ``summary.json``, ``verdicts.json``, ``reward-vs-step.csv``, ``report.txt``,
``curves.png``, ``law.png`` (reward against entropy with the fitted entropy-reward law, when it
could be fitted) and ``report.html`` (self-contained, opens offline).

Beyond the verdicts, two sections: rollout vs trainer (the mismatch and staleness keys of the
newer RL stacks, first and last window medians) and the entropy-reward law (fitted on the first
half of the run, judged on the second).
"""

from __future__ import annotations

import argparse
import base64
import csv
import html
import io
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from grpo_monitor import thresholds as th
from grpo_monitor.forecast import (
    BLOCK_STEPS,
    MIN_BLOCKS,
    MIN_ENTROPY_SPREAD,
    LawFit,
    block_means,
    fit_law,
)
from grpo_monitor.keys import SIGNALS
from grpo_monitor.signals import (
    GROWTH_OFFSETS,
    GROWTH_WINDOW,
    INITIAL_STEPS,
    LAW_ENTROPY,
    LAW_REWARD,
    SLOPE_WINDOWS,
    LawTracker,
    slope,
)
from grpo_monitor.snapshot import (
    RecordError,
    as_text,
    decode_record,
    identity_from_path,
    parse_record,
)

# Every number a verdict compares with is read from grpo_monitor.thresholds at each use: the
# card thresholds are the ones the live rules read (grpo-thresholds.yml is generated from the same
# table), so a run the cards caught is not called healthy afterwards; the report's own windows
# and three-curve limits sit in that table's `report` group. The three-curve verdicts compare
# window medians; the cards' verdicts replay each card on its own step windows (STEP_CARD_VERDICTS).

CORE_SIGNALS: tuple[str, ...] = (
    "reward/mean", "reward/std", "reward/p25", "reward/p50", "reward/p75", "kl/mean", "kl/p95",
    "loss", "eval/sample_acc", "entropy/mean", "response/len_mean", "response/clip_ratio",
    "grad/norm", "group/zero_std_frac", "adv/mean_abs", "train/lr",
)
SUMMARY_SIGNALS: tuple[str, ...] = (
    "reward/mean", "reward/std", "kl/mean", "loss", "eval/sample_acc", "entropy/mean",
    "response/len_mean", "grad/norm",
)
CSV_COLUMNS: tuple[tuple[str, str], ...] = (
    ("reward", "reward/mean"), ("kl", "kl/mean"), ("loss", "loss"),
    ("sample_acc", "eval/sample_acc"), ("reward_std", "reward/std"),
    ("reward_p25", "reward/p25"), ("reward_p50", "reward/p50"), ("reward_p75", "reward/p75"),
    ("kl_p95", "kl/p95"), ("entropy", "entropy/mean"), ("response_len", "response/len_mean"),
    ("response_clip_ratio", "response/clip_ratio"), ("grad_norm", "grad/norm"),
    ("group_zero_std_frac", "group/zero_std_frac"), ("adv_mean_abs", "adv/mean_abs"),
    ("lr", "train/lr"),
)
THROUGHPUT_KEYS = ("perf/samples_per_s", "perf/tokens_per_s")
# The rollout-vs-trainer section: every mismatch and staleness key the run logged, in keys.py's
# order.
ROLLOUT_KEYS: tuple[str, ...] = tuple(s.key for s in SIGNALS
                                      if s.key.startswith(("mismatch/", "staleness/")))
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


# -- loading -----------------------------------------------------------------------------


@dataclass
class RunData:
    run: str
    path: Path
    records: int = 0
    bad_lines: int = 0
    # rank 0's training signals: step -> canonical key -> value (latest record per step wins)
    train: dict[int, dict[str, float]] = field(default_factory=dict)
    by_type: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)
    # per rank: step -> perf key -> value
    perf: dict[int, dict[int, dict[str, float]]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return sorted(self.train)

    def series(self, key: str) -> np.ndarray:
        return np.array([self.train[s].get(key, math.nan) for s in self.steps], dtype=float)

    def has(self, key: str) -> bool:
        return any(key in m for m in self.train.values())


def _run_files(run_dir: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(run_dir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or not name.endswith((".jsonl", ".json")):
                continue
            files.append(Path(dirpath) / name)
    return files


def _segment_order(path: Path) -> tuple[str, int]:
    # rank-N.000001.jsonl (rotated, older) before rank-N.jsonl (current).
    parts = path.name.split(".")
    seq = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 1 << 60
    return (str(path.parent / parts[0]), seq)


def load_run(run_dir: Path | str) -> RunData:
    """Every record of the run folder (all ranks, rotated segments, *.json), bad lines skipped."""
    run_dir = Path(run_dir)
    # The name goes into UTF-8 files: one that is not UTF-8 on disk is written escaped.
    data = RunData(run=as_text(run_dir.name), path=run_dir)
    latest: dict[int, tuple[float, int]] = {}  # step -> (time, order) of the record kept
    order = 0
    for path in sorted(_run_files(run_dir), key=_segment_order):
        run, rank = identity_from_path(path, run_dir.parent)
        try:
            mtime = path.stat().st_mtime
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if path.suffix == ".jsonl":
            raws = [ln for ln in text.splitlines() if ln.strip()]
        else:
            raws = [text]
        for raw in raws:
            try:
                obj = decode_record(raw)
                objs = obj if isinstance(obj, list) and path.suffix == ".json" else [obj]
                snaps = [parse_record(o, run=run, rank=rank, mtime=mtime) for o in objs]
            except RecordError:
                data.bad_lines += 1
                continue
            for snap in snaps:
                order += 1
                data.records += 1
                perf = {k: v for k, v in snap.metrics.items() if k.startswith("perf/")}
                if perf:
                    data.perf.setdefault(snap.rank, {}).setdefault(snap.step, {}).update(perf)
                for ev in snap.events:
                    data.events.append({"step": snap.step if ev.step is None else ev.step,
                                        "rank": snap.rank, "type": ev.type})
                train = {k: v for k, v in snap.metrics.items() if not k.startswith("perf/")}
                if snap.rank != 0 or not (train or snap.by_type):
                    continue
                key = (snap.time, order)
                if snap.step in latest and latest[snap.step] > key:
                    continue
                latest[snap.step] = key
                data.train[snap.step] = train
                if snap.by_type:
                    data.by_type[snap.step] = snap.by_type
                else:
                    data.by_type.pop(snap.step, None)
    return data


# -- statistics ----------------------------------------------------------------------------


def percentile(values: Any, p: float) -> float:
    """Linear-interpolation percentile (seed 001 §2): idx=(p/100)*(n-1), NaN for no values."""
    xs = np.sort(np.asarray(values, dtype=float))
    if xs.size == 0:
        return math.nan
    idx = p / 100 * (xs.size - 1)
    lo, hi = math.floor(idx), math.ceil(idx)
    w = idx - lo
    return float(xs[lo] * (1 - w) + xs[hi] * w)


def describe(values: Any) -> dict[str, float]:
    """n, p5, p50, p95, p99, mean, stddev (sample, n-1; 0 under 2 values) of the finite values."""
    xs = np.asarray(values, dtype=float)
    xs = xs[np.isfinite(xs)]
    out: dict[str, float] = {"n": int(xs.size)}
    for p in (5, 50, 95, 99):
        out[f"p{p}"] = percentile(xs, p)
    out["mean"] = float(xs.mean()) if xs.size else math.nan
    out["stddev"] = float(xs.std(ddof=1)) if xs.size >= 2 else 0.0
    return out


def window_size(n_steps: int) -> int:
    return max(th.count("min_window_steps"), min(th.count("baseline_steps"), n_steps // 5))


def windows(steps: list[int], size: int) -> list[tuple[int, int]]:
    """Index ranges [a, b) of consecutive logged steps, ``size`` each (the last one may be short)."""
    return [(a, min(a + size, len(steps))) for a in range(0, len(steps), size)]


def summarize(data: RunData) -> dict[str, Any]:
    steps = data.steps
    size = window_size(len(steps))
    wins = windows(steps, size)
    signals: dict[str, Any] = {}
    for key in SUMMARY_SIGNALS:
        if not data.has(key):
            continue
        s = data.series(key)
        per_window = []
        for a, b in wins:
            d = describe(s[a:b])
            d["steps"] = [steps[a], steps[b - 1]]
            per_window.append(d)
        sds = [w["stddev"] for w in per_window]
        signals[key] = {"run": describe(s), "windows": per_window,
                        "window_stddev": {"min": min(sds), "max": max(sds),
                                          "first": sds[0], "last": sds[-1]}}
    return {"run": data.run, "records": data.records, "bad_lines": data.bad_lines,
            "steps": [steps[0], steps[-1]] if steps else [], "logged_steps": len(steps),
            "ranks": sorted(set(data.perf) | ({0} if data.train else set())),
            "window_steps": size, "signals": signals,
            "rollout_vs_trainer": rollout_section(data) if steps else None,
            "entropy_reward_law": law_section(data)}


# -- verdicts ------------------------------------------------------------------------------


def _med(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else math.nan


def _ratio(a: float, b: float) -> float:
    """a / b as IEEE 754 (and PromQL) has it, where Python's float division raises: +-inf for
    x / 0, NaN for 0 / 0. A KL whose p95 is 0 (no KL term logs zeros) has a tail ratio."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(a) / b)


def _r(x: float) -> float | None:
    return None if not math.isfinite(x) else round(float(x), 6)


def _verdict(vid: str, severity: str, steps: list[int], **evidence: Any) -> dict[str, Any]:
    return {"id": vid, "severity": severity, "steps": [int(steps[0]), int(steps[-1])],
            "card": CARD_OF_VERDICT.get(vid),
            "evidence": {k: (_r(v) if isinstance(v, float) else v) for k, v in evidence.items()}}


def _first_last(steps: list[int], mask: np.ndarray, start: int = 0) -> list[int] | None:
    idx = [i for i in range(start, len(steps)) if mask[i]]
    return [steps[idx[0]], steps[idx[-1]]] if idx else None


# -- the cards' own rules, on the cards' own step windows ---------------------------------------
#
# The verdicts below judge a run as its card judges it live, at every logged step: the same
# features (a signal's initial mean over its first INITIAL_STEPS steps, its baseline mean over
# the baseline period, 10th/90th percentiles and means of windows counted in steps), compared
# with the same thresholds. A verdict names the steps where its card would have been firing.


@dataclass(frozen=True)
class Track:
    """One signal as the exporter's step history holds it: its finite values by logged step."""

    steps: np.ndarray  # ascending logged steps
    values: np.ndarray
    run_first: int  # the run's first step: the baseline period starts there, as the exporter's

    def initial(self) -> float:
        """grpo_initial_mean: the mean over the signal's own first INITIAL_STEPS steps."""
        return float(self.values[self.steps < self.steps[0] + INITIAL_STEPS].mean())

    def baseline(self) -> float:
        """grpo_baseline_mean: the mean over the run's baseline period (NaN if not logged then)."""
        inside = self.steps < self.run_first + th.count("baseline_steps")
        return float(self.values[inside].mean()) if inside.any() else math.nan

    def baseline_stddev(self) -> float:
        """grpo_baseline_stddev: the sample stddev over the baseline period (0 under 2 values)."""
        inside = self.values[self.steps < self.run_first + th.count("baseline_steps")]
        return float(inside.std(ddof=1)) if inside.size > 1 else 0.0

    def ready(self) -> np.ndarray:
        """grpo_baseline_ready at each step: the cards that need the baseline wait for it."""
        return self.steps >= self.run_first + th.count("baseline_steps")

    def rolling(self, window: int, stat: str, offset: int = 0) -> np.ndarray:
        """``stat`` ("mean", "p10", "p90") of the values of steps (t - offset - window, t - offset]
        at each step t; NaN while the history does not reach back that far (signals.KeyHistory)."""
        ends = self.steps - offset
        starts = ends - window
        lo = np.searchsorted(self.steps, starts, side="right")
        hi = np.searchsorted(self.steps, ends, side="right")
        out = np.full(self.steps.size, math.nan)
        full = (self.steps[0] <= starts + 1) & (hi > lo)
        q = {"p10": 10, "p90": 90}.get(stat)
        for i in np.flatnonzero(full):
            chunk = self.values[lo[i]:hi[i]]
            out[i] = chunk.mean() if q is None else percentile(chunk, q)
        return out

    def slope(self, window: int) -> np.ndarray:
        """grpo_window_slope: the least-squares slope per step of the values of steps
        (t - window, t] at each step t, by the exporter's own function; NaN while the history
        does not reach back that far, or the window holds fewer than two steps."""
        starts = self.steps - window
        lo = np.searchsorted(self.steps, starts, side="right")
        hi = np.arange(1, self.steps.size + 1)
        out = np.full(self.steps.size, math.nan)
        for i in np.flatnonzero(self.steps[0] <= starts + 1):
            trend = slope(self.steps[lo[i]:hi[i]].tolist(), self.values[lo[i]:hi[i]].tolist())
            if trend is not None:
                out[i] = trend
        return out

    def asof(self, steps: np.ndarray, series: np.ndarray) -> np.ndarray:
        """``series`` (one value per step of this track) as of each of ``steps``: its newest value
        at or before that step, NaN before the first; a gauge keeps its last value until the
        next record, and a card compares two signals' gauges as they stand."""
        at = np.searchsorted(self.steps, steps, side="right") - 1
        return np.where(at >= 0, series[np.clip(at, 0, None)], math.nan)


def _track(data: RunData, key: str) -> Track | None:
    xs = data.series(key)
    keep = np.isfinite(xs)
    if not keep.any():
        return None
    return Track(np.asarray(data.steps)[keep], xs[keep], data.steps[0])


def _early() -> int:
    return th.count("early_window_steps")


def _flagged(tr: Track, mask: np.ndarray, **at_first: np.ndarray) -> dict[str, Any] | None:
    """Where ``mask`` holds: the first and last step, how many steps, and each of ``at_first``'s
    series at the first one (the values the card fired on)."""
    idx = np.flatnonzero(mask)
    if not idx.size:
        return None
    i = int(idx[0])
    return {"steps": [int(tr.steps[i]), int(tr.steps[idx[-1]])], "steps_flagged": int(idx.size),
            **{k: _r(float(v[i])) for k, v in at_first.items()}}


def _branches(vid: str, severity: str, **found: dict[str, Any] | None) -> dict[str, Any] | None:
    """One verdict from a card's branches (its `reason`s): its span covers every branch that
    fired, and the evidence keeps each branch's own steps and values."""
    hits = {k: v for k, v in found.items() if v is not None}
    if not hits:
        return None
    span = [min(v["steps"][0] for v in hits.values()), max(v["steps"][1] for v in hits.values())]
    return _verdict(vid, severity, span, **hits)


def _entropy_beyond_initial(data: RunData, collapse: bool) -> dict[str, Any] | None:
    """The two entropy cards, one rule mirrored: 90% of the short window below ``ratio`` x the
    initial value (collapse: the window's p90 under it) or above it (explosion: its p10 over)."""
    tr = _track(data, "entropy/mean")
    if tr is None or not tr.initial() > 0:
        return None
    vid, stat = ("entropy_collapse", "p90") if collapse else ("entropy_explosion", "p10")
    limit = th.value(f"{vid}_ratio") * tr.initial()
    window = tr.rolling(_early(), stat)
    with np.errstate(invalid="ignore"):
        beyond = window < limit if collapse else window > limit
    hit = _flagged(tr, beyond, **{f"entropy_window_{stat}": window})
    if hit is None:
        return None
    extreme = {"entropy_min": float(tr.values.min())} if collapse else \
        {"entropy_max": float(tr.values.max())}
    return _verdict(vid, "critical", hit.pop("steps"), entropy_initial=tr.initial(), limit=limit,
                    window_steps=_early(), **hit, **extreme, entropy_last=float(tr.values[-1]))


def entropy_collapse(data: RunData) -> dict[str, Any] | None:
    """GRPOEntropyCollapse: entropy's p90 over the short window below 0.1x its initial value."""
    return _entropy_beyond_initial(data, collapse=True)


def entropy_explosion(data: RunData) -> dict[str, Any] | None:
    """GRPOEntropyExplosion: entropy's p10 over the short window above 5x its initial value."""
    return _entropy_beyond_initial(data, collapse=False)


def reward_collapse(data: RunData) -> dict[str, Any] | None:
    """GRPORewardCollapse: reward's p90 over the sustain window in the lowest quarter of the
    range between the run's floor and working level (its lowest and highest short-window mean
    so far), a range of at least half the largest short-window mean of the reward's
    within-batch stddev so far."""
    tr, std = _track(data, "reward/mean"), _track(data, "reward/std")
    if tr is None or std is None:
        return None
    means = tr.rolling(_early(), "mean")
    with np.errstate(invalid="ignore"):
        top, floor = np.fmax.accumulate(means), np.fmin.accumulate(means)
        spread = np.fmax.accumulate(std.rolling(_early(), "mean"))
    spread_now = std.asof(tr.steps, spread)
    line = floor + th.value("reward_collapse_ratio") * (top - floor)
    needed = th.value("reward_collapse_spread_ratio") * spread_now
    window = th.count("sustain_steps")
    p90 = tr.rolling(window, "p90")
    with np.errstate(invalid="ignore"):
        mask = (p90 < line) & (top - floor > needed)
    hit = _flagged(tr, mask, reward_window_p90=p90, working_level=top, floor=floor, limit=line,
                   range_needed=needed)
    if hit is None:
        return None
    return _verdict("reward_collapse", "critical", hit.pop("steps"), window_steps=window, **hit,
                    reward_last=float(tr.values[-1]))


def dead_learning_signal(data: RunData) -> dict[str, Any] | None:
    """GRPOAdvantageVanishing from the first steps (reasons dead_groups, reward_constant): the
    short-window mean of the zero-std group share over 0.9, or reward/std 0 in 90% of it."""
    dead = reward_constant = None
    zero = _track(data, "group/zero_std_frac")
    if zero is not None:
        mean = zero.rolling(_early(), "mean")
        dead = _flagged(zero, mean > th.value("dead_signal_zero_std_ratio"),
                        zero_std_share_window_mean=mean)
        if dead is not None:
            dead.update(limit=th.value("dead_signal_zero_std_ratio"), window_steps=_early(),
                        zero_std_share_run_mean=_r(float(zero.values.mean())))
    std = _track(data, "reward/std")
    if std is not None:
        p90 = std.rolling(_early(), "p90")
        reward_constant = _flagged(std, p90 <= 0, reward_std_window_p90=p90)
        if reward_constant is not None:
            reward_constant.update(window_steps=_early(),
                                   steps_with_reward_std_0=int((std.values <= 0).sum()),
                                   steps_logged=int(std.values.size))
    return _branches("dead_learning_signal", "warning", dead_groups=dead,
                     reward_constant=reward_constant)


def advantage_vanishing(data: RunData) -> dict[str, Any] | None:
    """GRPOAdvantageVanishing once the baseline is ready: the zero-std group share over 0.5 in
    90% of 50 steps, or |advantage| under 0.2x its baseline mean in 90% of 50 steps."""
    sus = th.count("sustain_steps")
    share = small = None
    zero = _track(data, "group/zero_std_frac")
    if zero is not None:
        p10 = zero.rolling(sus, "p10")
        share = _flagged(zero, zero.ready() & (p10 > th.value("zero_std_group_ratio")),
                         zero_std_share_window_p10=p10)
        if share is not None:
            share.update(limit=th.value("zero_std_group_ratio"), window_steps=sus)
    adv = _track(data, "adv/mean_abs")
    if adv is not None:
        limit = th.value("advantage_vanishing_ratio") * adv.baseline()
        p90 = adv.rolling(sus, "p90")
        small = _flagged(adv, adv.ready() & (p90 < limit), adv_abs_window_p90=p90)
        if small is not None:
            small.update(adv_abs_baseline=_r(adv.baseline()), limit=_r(limit), window_steps=sus)
    return _branches("advantage_vanishing", "warning", zero_std_share=share, advantage_small=small)


def completions_truncated(data: RunData) -> dict[str, Any] | None:
    """GRPOCompletionsTruncated: the truncated share's p10 over the short window above 0.9."""
    tr = _track(data, "response/clip_ratio")
    if tr is None:
        return None
    p10 = tr.rolling(_early(), "p10")
    hit = _flagged(tr, p10 > th.value("truncated_ratio"), truncated_window_p10=p10)
    if hit is None:
        return None
    return _verdict("completions_truncated", "warning", hit.pop("steps"),
                    limit=th.value("truncated_ratio"), window_steps=_early(), **hit,
                    truncated_last=float(tr.values[-1]))


def length_shift(data: RunData) -> dict[str, Any] | None:
    """GRPOResponseLengthShift: the 50-step mean over the one 200 steps before off 1 by more than
    0.5; before that comparison exists, the short window off the initial length by as much in
    90% of its steps (its p90 below, or its p10 above)."""
    tr = _track(data, "response/len_mean")
    if tr is None:
        return None
    shift, sus, back = (th.value("length_shift_ratio"), th.count("sustain_steps"),
                        th.count("lookback_steps"))
    before = tr.rolling(sus, "mean", offset=back)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = tr.rolling(sus, "mean") / before
        low = tr.rolling(_early(), "p90") / tr.initial()
        high = tr.rolling(_early(), "p10") / tr.initial()
    early_ratio = np.where(low < 1, low, np.where(high > 1, high, 1.0))
    late = _flagged(tr, np.abs(ratio - 1) > shift, ratio=ratio)
    early = _flagged(tr, np.isnan(before) & (np.abs(early_ratio - 1) > shift),
                     ratio_to_initial=early_ratio)
    if late is not None:
        late.update(window_steps=sus, lookback_steps=back)
    if early is not None:
        early.update(length_initial=_r(tr.initial()), window_steps=_early())
    return _branches("length_shift", "warning", within_200_steps=late, against_initial=early)


def reward_quantile_extreme(data: RunData) -> dict[str, Any] | None:
    """GRPORewardQuantileExtreme, downward only: once the baseline is ready, a reward quantile's
    50-step mean below its baseline mean - 3 baseline stddevs, or fallen by more than 3 of them
    below its 50-step mean 200 steps before."""
    sigmas, sus, back = (th.value("reward_quantile_sigmas"), th.count("sustain_steps"),
                         th.count("lookback_steps"))
    found: dict[str, dict[str, Any] | None] = {}
    for q in ("reward/p25", "reward/p50", "reward/p75", "reward/p95"):
        tr = _track(data, q)
        if tr is None:
            continue
        drop = sigmas * tr.baseline_stddev()
        mean = tr.rolling(sus, "mean")
        fall = mean - tr.rolling(sus, "mean", offset=back)
        found[q] = _flagged(tr, tr.ready() & ((mean < tr.baseline() - drop) | (fall < -drop)),
                            window_mean=mean, fall_within_200_steps=fall)
        if found[q] is not None:
            found[q].update(baseline_mean=_r(tr.baseline()), allowed_drop=_r(drop),
                            window_steps=sus)
    return _branches("reward_quantile_extreme", "warning", **found)


def kl_explosion(data: RunData) -> dict[str, Any] | None:
    """GRPOKLExplosion: KL's short-window p10 over 10x its baseline mean and over 3x its 50-step
    mean 200 steps before; once raised, the card stays while the 50-step mean is over 10x."""
    tr = _track(data, "kl/mean")
    if tr is None:
        return None
    sus, back = th.count("sustain_steps"), th.count("lookback_steps")
    limit = th.value("kl_explosion_ratio") * tr.baseline()
    p10, mean = tr.rolling(_early(), "p10"), tr.rolling(sus, "mean")
    before = tr.rolling(sus, "mean", offset=back)
    raised = tr.ready() & (p10 > limit) & (p10 > th.value("kl_jump_ratio") * before)
    stays = tr.ready() & (mean > limit)
    firing = raised.copy()
    for i in range(1, firing.size):  # the card's hysteresis: it reads its own ALERTS series
        firing[i] |= firing[i - 1] and stays[i]
    hit = _flagged(tr, firing, kl_window_p10=p10, kl_mean_200_steps_before=before)
    if hit is None:
        return None
    return _verdict("kl_explosion", "critical", hit.pop("steps"), kl_baseline_mean=tr.baseline(),
                    limit=limit, window_steps=_early(), **hit, kl_max=float(tr.values.max()),
                    kl_last=float(tr.values[-1]))


def kl_growth_accelerating(data: RunData) -> dict[str, Any] | None:
    """GRPOKLGrowthAccelerating: KL's 100-step mean up by over 20% per 100 steps in each of the
    last three 100-step windows, and the last increment larger than the one 200 steps before."""
    tr = _track(data, "kl/mean")
    if tr is None:
        return None
    means = [tr.rolling(GROWTH_WINDOW, "mean", offset=o)
             for o in (*GROWTH_OFFSETS, GROWTH_OFFSETS[-1] + GROWTH_WINDOW)]
    with np.errstate(divide="ignore", invalid="ignore"):
        # The exporter publishes no growth over a zero mean: NaN, never a card.
        growth = np.min([np.where(means[j + 1] != 0, means[j] / means[j + 1] - 1, math.nan)
                         for j in range(len(GROWTH_OFFSETS))], axis=0)
    accel = (means[0] - means[1]) - (means[2] - means[3])
    hit = _flagged(tr, tr.ready() & (growth > th.value("kl_growth_ratio")) & (accel > 0),
                   least_growth_per_window=growth, acceleration=accel)
    if hit is None:
        return None
    return _verdict("kl_growth_accelerating", "warning", hit.pop("steps"),
                    limit=th.value("kl_growth_ratio"), window_steps=GROWTH_WINDOW, **hit)


def grad_norm_spike(data: RunData) -> dict[str, Any] | None:
    """GRPOGradNormSpike: grad norm's p10 over 50 steps above 5x its baseline mean."""
    tr = _track(data, "grad/norm")
    if tr is None:
        return None
    sus = th.count("sustain_steps")
    limit = th.value("grad_norm_spike_ratio") * tr.baseline()
    p10 = tr.rolling(sus, "p10")
    hit = _flagged(tr, tr.ready() & (p10 > limit), grad_norm_window_p10=p10)
    if hit is None:
        return None
    return _verdict("grad_norm_spike", "warning", hit.pop("steps"), baseline_mean=tr.baseline(),
                    limit=limit, window_steps=sus, **hit)


# -- the cards of the newer RL stacks' signals: rollout vs trainer, staleness, dead groups by
# cause, the entropy's driver, the length bias, the entropy-reward law, prompt types.


def _beyond(tr: Track, window: np.ndarray, mask: np.ndarray, name: str,
            **extra: Any) -> dict[str, Any] | None:
    """A card branch that fired where ``mask`` holds, with ``window`` (the window statistic it
    compared) at the first such step and the signal's last value."""
    hit = _flagged(tr, mask, **{name: window})
    if hit is not None:
        hit.update({k: _r(v) if isinstance(v, float) else v for k, v in extra.items()},
                   last=_r(float(tr.values[-1])))
    return hit


def _level(data: RunData, key: str, above: float | None = None,
           below: float | None = None) -> dict[str, Any] | None:
    """A level card's branch: ``key`` above ``above`` in 90% of the short window (its p10 over
    the line) or below ``below`` in 90% of it (its p90 under the line)."""
    tr = _track(data, key)
    if tr is None:
        return None
    stats: dict[str, np.ndarray] = {}
    mask = np.zeros(tr.steps.size, dtype=bool)
    with np.errstate(invalid="ignore"):
        if above is not None:
            stats["window_p10"] = tr.rolling(_early(), "p10")
            mask |= stats["window_p10"] > above
        if below is not None:
            stats["window_p90"] = tr.rolling(_early(), "p90")
            mask |= stats["window_p90"] < below
    hit = _flagged(tr, mask, **stats)
    if hit is not None:
        hit.update({k: v for k, v in (("above", above), ("below", below)) if v is not None},
                   window_steps=_early(), last=_r(float(tr.values[-1])))
    return hit


def rollout_mismatch(data: RunData) -> dict[str, Any] | None:
    """GRPORolloutMismatch (reasons kl, chi2_token, is_weight, ess): in 90% of the short window,
    the rollout-to-trainer KL over mismatch_kl, the per-token chi-square over
    mismatch_chi2_token, the mean importance weight outside [mismatch_is_weight_low, _high], or
    the weights' effective sample share under mismatch_ess_ratio."""
    return _branches(
        "rollout_mismatch", "warning",
        kl=_level(data, "mismatch/kl", above=th.value("mismatch_kl")),
        chi2_token=_level(data, "mismatch/chi2_token", above=th.value("mismatch_chi2_token")),
        is_weight=_level(data, "mismatch/is_weight_mean", above=th.value("mismatch_is_weight_high"),
                         below=th.value("mismatch_is_weight_low")),
        ess=_level(data, "mismatch/is_ess_ratio", below=th.value("mismatch_ess_ratio")))


# The mismatch signals whose slow rise the rising card follows, by its reason label.
RISING_MISMATCH: dict[str, str] = {"kl": "mismatch/kl", "k3_kl": "mismatch/k3_kl",
                                   "logprob_diff_mean": "mismatch/logprob_diff_mean"}


def rollout_mismatch_rising(data: RunData) -> dict[str, Any] | None:
    """GRPORolloutMismatchRising: a mismatch signal's 50-step p10 over mismatch_rise_ratio x its
    initial value and over mismatch_rise_floor, while its 50-step slope is still positive."""
    sus, ratio, floor = (th.count("sustain_steps"), th.value("mismatch_rise_ratio"),
                         th.value("mismatch_rise_floor"))
    found: dict[str, dict[str, Any] | None] = {}
    for reason, key in RISING_MISMATCH.items():
        tr = _track(data, key)
        if tr is None:
            continue
        p10, trend = tr.rolling(sus, "p10"), tr.slope(SLOPE_WINDOWS[0])
        with np.errstate(invalid="ignore"):
            mask = (p10 > ratio * tr.initial()) & (p10 > floor) & (trend > 0)
        found[reason] = _beyond(tr, p10, mask, "window_p10", initial=tr.initial(),
                                limit=max(ratio * tr.initial(), floor), window_steps=sus)
        if found[reason] is not None:
            i = int(np.searchsorted(tr.steps, found[reason]["steps"][0]))
            found[reason]["slope_per_step"] = _r(float(trend[i]))
    return _branches("rollout_mismatch_rising", "warning", **found)


def stale_rollouts(data: RunData) -> dict[str, Any] | None:
    """GRPOStaleRollouts: the trajectories' mean age over staleness_steps policy versions in 90%
    of the short window."""
    hit = _level(data, "staleness/mean", above=th.value("staleness_steps"))
    if hit is None:
        return None
    return _verdict("stale_rollouts", "warning", hit.pop("steps"), **hit)


def _dead_cause(data: RunData, vid: str, key: str) -> dict[str, Any] | None:
    hit = _level(data, key, above=th.value("dead_group_cause_ratio"))
    if hit is None:
        return None
    return _verdict(vid, "warning", hit.pop("steps"), signal=key, **hit)


def prompts_too_hard(data: RunData) -> dict[str, Any] | None:
    """GRPOPromptsTooHard: over dead_group_cause_ratio of the groups all wrong in 90% of the
    short window."""
    return _dead_cause(data, "prompts_too_hard", "group/all_wrong_frac")


def prompts_too_easy(data: RunData) -> dict[str, Any] | None:
    """GRPOPromptsTooEasy: over dead_group_cause_ratio of the groups all right in 90% of the
    short window."""
    return _dead_cause(data, "prompts_too_easy", "group/all_right_frac")


def entropy_covariance_surge(data: RunData) -> dict[str, Any] | None:
    """GRPOEntropyCovarianceSurge: the covariance of the sampled tokens' log-probability and
    advantage positive and over entropy_cov_ratio x its (positive) initial value in 90% of the
    short window, while entropy's 50-step trend is down by over entropy_cov_fall_ratio of its
    initial value."""
    tr = _track(data, "entropy/logp_adv_cov")
    if tr is None or not tr.initial() > 0:
        return None
    limit = th.value("entropy_cov_ratio") * tr.initial()
    p10 = tr.rolling(_early(), "p10")
    # Entropy's 50-step trend, as it stood at each of the covariance's steps, against its start.
    ent = _track(data, LAW_ENTROPY)
    if ent is None or not ent.initial() > 0:
        return None
    window = SLOPE_WINDOWS[0]
    fall = ent.asof(tr.steps, ent.slope(window) * window / ent.initial())
    with np.errstate(invalid="ignore"):
        mask = (p10 > 0) & (p10 > limit) & (fall < -th.value("entropy_cov_fall_ratio"))
    hit = _beyond(tr, p10, mask, "window_p10", initial=tr.initial(), limit=limit,
                  window_steps=_early())
    if hit is None:
        return None
    return _verdict("entropy_covariance_surge", "warning", hit.pop("steps"), **hit)


def length_bias(data: RunData) -> dict[str, Any] | None:
    """GRPOLengthBias: the incorrect responses' 50-step mean length grown by over
    length_bias_growth_ratio of its initial value, while the correct ones' grew by under
    length_bias_correct_ratio."""
    wrong, right = _track(data, "response/len_incorrect_mean"), _track(data, "response/len_correct_mean")
    if wrong is None or right is None or not (wrong.initial() > 0 and right.initial() > 0):
        return None
    sus = th.count("sustain_steps")
    grown = wrong.rolling(sus, "mean") / wrong.initial() - 1
    # The correct responses' growth as it stood at each of the incorrect ones' steps.
    right_grown = right.asof(wrong.steps, right.rolling(sus, "mean") / right.initial() - 1)
    with np.errstate(invalid="ignore"):
        mask = (grown > th.value("length_bias_growth_ratio")) & \
            (right_grown < th.value("length_bias_correct_ratio"))
    hit = _beyond(wrong, grown, mask, "incorrect_growth", window_steps=sus,
                  incorrect_initial=wrong.initial(), correct_initial=right.initial(),
                  growth_limit=th.value("length_bias_growth_ratio"),
                  correct_limit=th.value("length_bias_correct_ratio"))
    if hit is None:
        return None
    i = int(np.searchsorted(wrong.steps, hit["steps"][0]))
    hit["correct_growth"] = _r(float(right_grown[i]))
    hit["incorrect_last"] = hit.pop("last")
    return _verdict("length_bias", "warning", hit.pop("steps"), **hit)


def _law_fits(data: RunData) -> list[LawFit | None]:
    """The exporter's entropy-reward law fit (signals.LawTracker: 10-step block means, a block
    counted once a later one starts) as it stood after each logged step of rank 0."""
    law, out = LawTracker(), []
    for st in data.steps:
        law.add(st, data.train[st])
        out.append(law.fit())
    return out


def _ceiling(data: RunData) -> tuple[Track, dict[str, np.ndarray]] | None:
    """GRPORewardCeilingNear's inputs at each step that logged entropy: the law still promises
    (exp(H 50-step mean) - 1) / (exp(H initial) - 1) of the reward it promised at the start
    (the headroom), the fit's a, b and R², the entropy's 50-step slope, and ``near``: headroom
    under ceiling_headroom_ratio, R² at least forecast_min_r2, a > 0, entropy still falling and
    not collapsed."""
    tr = _track(data, LAW_ENTROPY)
    if tr is None or not tr.initial() > 0:
        return None
    fits = _law_fits(data)
    at = np.searchsorted(np.asarray(data.steps), tr.steps)
    law = {name: np.array([getattr(fits[i], name) if fits[i] is not None else math.nan
                           for i in at], dtype=float)
           for name in ("a", "b", "r_squared")}
    mean, trend = tr.rolling(th.count("sustain_steps"), "mean"), tr.slope(SLOPE_WINDOWS[0])
    # A collapsed entropy (the red card's own test) has no ceiling left to forecast.
    collapsed = tr.rolling(th.count("early_window_steps"), "p90") < \
        tr.initial() * th.value("entropy_collapse_ratio")
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        headroom = (np.exp(mean) - 1) / (np.exp(tr.initial()) - 1)
        near = ((headroom < th.value("ceiling_headroom_ratio"))
                & (law["r_squared"] >= th.value("forecast_min_r2")) & (law["a"] > 0) & (trend < 0)
                & ~collapsed)
    return tr, {"headroom": headroom, "entropy_mean": mean, "entropy_slope": trend, **law,
                "near": near}


def reward_ceiling_near(data: RunData) -> dict[str, Any] | None:
    """GRPORewardCeilingNear: by the entropy-reward law fitted on the run so far (R² at least
    forecast_min_r2, a > 0), the reward still to gain is under ceiling_headroom_ratio of what it
    was at the start, and entropy is still falling."""
    found = _ceiling(data)
    if found is None:
        return None
    tr, c = found
    with np.errstate(invalid="ignore"):
        ceiling = c["b"] - c["a"]
    hit = _flagged(tr, c["near"], headroom_ratio=c["headroom"], entropy_window_mean=c["entropy_mean"],
                   entropy_slope_per_step=c["entropy_slope"], law_a=c["a"], law_b=c["b"],
                   reward_ceiling=ceiling, law_r_squared=c["r_squared"])
    if hit is None:
        return None
    return _verdict("reward_ceiling_near", "warning", hit.pop("steps"),
                    entropy_initial=tr.initial(), limit=th.value("ceiling_headroom_ratio"),
                    window_steps=th.count("sustain_steps"), **hit)


def _shortcut_branch(grid: np.ndarray, mean: dict[str, np.ndarray], ref: dict[str, np.ndarray],
                     **extra: Any) -> dict[str, Any] | None:
    """One branch of the shortcut card: at some step a type's 50-step mean reward at least
    shortcut_delta below its reference while another type, higher at its own reference, rose
    by as much over it. The pair the card saw first (the widest split) is the evidence."""
    delta = th.value("shortcut_delta")
    with np.errstate(invalid="ignore"):
        change = {t: mean[t] - ref[t] for t in mean}
        pairs = {(hard, easy): (change[hard] <= -delta) & (change[easy] >= delta)
                 & (ref[easy] > ref[hard])
                 for hard in mean for easy in mean if hard != easy}
    mask = np.zeros(grid.size, dtype=bool)
    for hit in pairs.values():
        mask |= hit
    idx = np.flatnonzero(mask)
    if not idx.size:
        return None
    i = int(idx[0])
    hard, easy = max((p for p, hit in pairs.items() if hit[i]),
                     key=lambda p: change[p[1]][i] - change[p[0]][i])
    return {"steps": [int(grid[i]), int(grid[idx[-1]])], "steps_flagged": int(idx.size),
            "easy_type": easy, "hard_type": hard, "easy_reference": _r(float(ref[easy][i])),
            "hard_reference": _r(float(ref[hard][i])), "easy_change": _r(float(change[easy][i])),
            "hard_change": _r(float(change[hard][i])), "limit": delta, **extra}


def shortcut_learning(data: RunData) -> dict[str, Any] | None:
    """GRPOShortcutLearning, per prompt type's reward (the records' by_type): branch
    `against_initial`, a type's 50-step mean shortcut_delta or more below its initial value
    while a type that started higher rose by as much over its own; branch `within_200_steps`,
    the same against each type's 50-step mean 200 steps before."""
    if not data.by_type:
        return None
    grid = np.asarray(data.steps)
    sus, back = th.count("sustain_steps"), th.count("lookback_steps")
    mean, initial, before = {}, {}, {}
    for t in sorted({t for bt in data.by_type.values() for t in bt}):
        logged = [(st, bt[t]["reward/mean"]) for st, bt in sorted(data.by_type.items())
                  if math.isfinite(bt.get(t, {}).get("reward/mean", math.nan))]
        if not logged:
            continue
        at, xs = zip(*logged)
        tr = Track(np.asarray(at), np.asarray(xs, dtype=float), data.steps[0])
        # Each type's gauges as they stand at every step of the run (a type not in a record
        # keeps its last values, as the exporter keeps publishing them).
        mean[t] = tr.asof(grid, tr.rolling(sus, "mean"))
        initial[t] = np.full(grid.size, tr.initial())
        before[t] = tr.asof(grid, tr.rolling(sus, "mean", offset=back))
    return _branches(
        "shortcut_learning", "warning",
        against_initial=_shortcut_branch(grid, mean, initial, window_steps=sus),
        within_200_steps=_shortcut_branch(grid, mean, before, window_steps=sus,
                                          lookback_steps=back))


# The verdicts judged on the cards' step windows, each as its card judges it.
STEP_CARD_VERDICTS: tuple[Callable[[RunData], dict[str, Any] | None], ...] = (
    kl_explosion, entropy_collapse, entropy_explosion, reward_collapse, kl_growth_accelerating,
    length_shift, completions_truncated, reward_quantile_extreme, dead_learning_signal,
    advantage_vanishing, grad_norm_spike, rollout_mismatch, rollout_mismatch_rising, stale_rollouts,
    prompts_too_hard, prompts_too_easy, entropy_covariance_surge, length_bias, reward_ceiling_near,
    shortcut_learning,
)

# The live card each verdict stands for: a run the card caught gets this verdict afterwards.
# The three-curve verdicts (plateaus, loss without reward, reward collapse with a KL blow-up)
# have no card: they need the whole run.
CARD_OF_VERDICT: dict[str, str] = {
    "nonfinite": "GRPONonFiniteValues",
    "kl_explosion": "GRPOKLExplosion",
    "entropy_collapse": "GRPOEntropyCollapse",
    "entropy_explosion": "GRPOEntropyExplosion",
    "reward_collapse": "GRPORewardCollapse",
    "rank_stalled": "GRPORankStalled",
    "kl_growth_accelerating": "GRPOKLGrowthAccelerating",
    "kl_tail_outliers": "GRPOKLTailOutliers",
    "reward_hacking": "GRPORewardHackingSuspected",
    "length_shift": "GRPOResponseLengthShift",
    "completions_truncated": "GRPOCompletionsTruncated",
    "reward_std_rising": "GRPORewardStdRising",
    "reward_quantile_extreme": "GRPORewardQuantileExtreme",
    "dead_learning_signal": "GRPOAdvantageVanishing",
    "advantage_vanishing": "GRPOAdvantageVanishing",
    "group_dominated": "GRPOGroupDominated",
    "grad_norm_spike": "GRPOGradNormSpike",
    "step_time_drift": "GRPOStepTimeDrift",
    "throughput_drop": "GRPOThroughputDrop",
    "rank_straggler": "GRPORankStraggler",
    "rollout_mismatch": "GRPORolloutMismatch",
    "rollout_mismatch_rising": "GRPORolloutMismatchRising",
    "stale_rollouts": "GRPOStaleRollouts",
    "prompts_too_hard": "GRPOPromptsTooHard",
    "prompts_too_easy": "GRPOPromptsTooEasy",
    "shortcut_learning": "GRPOShortcutLearning",
    "entropy_covariance_surge": "GRPOEntropyCovarianceSurge",
    "reward_ceiling_near": "GRPORewardCeilingNear",
    "length_bias": "GRPOLengthBias",
}
# Verdicts that say "no learning signal": a reward that stays flat is their consequence, so the
# plateau verdicts, which would blame the KL coefficient or the grader, are left out beside them.
NO_SIGNAL_VERDICTS = frozenset({"dead_learning_signal", "advantage_vanishing", "prompts_too_hard",
                                "prompts_too_easy"})
PLATEAU_VERDICTS = frozenset({"reward_plateau_beta_too_large", "reward_plateau_grader_too_loose"})


def diagnose(data: RunData) -> list[dict[str, Any]]:
    """The run's verdicts; ``healthy`` alone when nothing is wrong."""
    steps = data.steps
    out: list[dict[str, Any]] = []
    if not steps:
        return out
    n = len(steps)
    w = window_size(n)
    # A run shorter than one window (w is at least min_window_steps) has one short window.
    base = slice(0, min(w, n))  # baseline window
    ref = slice(w, 2 * w) if n >= 3 * w else base  # reference: the window after it
    last = slice(max(0, n - w), n)
    s = {k: data.series(k) for k in CORE_SIGNALS}
    have = {k: bool(np.isfinite(v).any()) for k, v in s.items()}
    ref_steps, last_steps = [steps[ref.start], steps[ref.stop - 1]], [steps[last.start], steps[-1]]

    # nonfinite: NaN / inf anywhere in a training signal (seed 000 §4.4, §5.1 red card).
    bad_steps, bad_keys = [], set()
    for st in steps:
        for k, v in data.train[st].items():
            if not math.isfinite(v):
                bad_keys.add(k)
                if not bad_steps or bad_steps[-1] != st:
                    bad_steps.append(st)
    if bad_steps:
        out.append(_verdict("nonfinite", "critical", [bad_steps[0], bad_steps[-1]],
                            steps_affected=len(bad_steps), keys=sorted(bad_keys)))

    reward, kl = s["reward/mean"], s["kl/mean"]
    r_ref, r_last = _med(reward[ref]), _med(reward[last])
    gain = r_last - r_ref
    kl_ref, kl_last = _med(kl[ref]), _med(kl[last])
    kl_ratio = kl_last / kl_ref if kl_ref > 0 else (math.inf if kl_last > 0 else math.nan)

    # reward_collapse_kl_blowup (seed 001 §1): reward turns down while KL blows up.
    if have["reward/mean"] and have["kl/mean"]:
        medians = [(_med(reward[a:b]), a, b) for a, b in windows(steps, w)]
        best, a, b = max((m for m in medians if math.isfinite(m[0])), default=(math.nan, 0, 0))
        if best - r_last >= th.value("reward_drop") and kl_ratio >= th.value("kl_explosion_ratio"):
            out.append(_verdict("reward_collapse_kl_blowup", "critical", [steps[b - 1], steps[-1]],
                                reward_best_window_median=best, reward_last_median=r_last,
                                best_window_steps=[steps[a], steps[b - 1]],
                                kl_ref_median=kl_ref, kl_last_median=kl_last, kl_ratio=kl_ratio))

    # reward_hacking (seed 000 §4.1, seed 001 §1): reward up with a length surge, or reward up
    # while sample accuracy stays flat.
    hack_evidence: dict[str, Any] = {}
    hack_span: list[int] | None = None
    if have["reward/mean"] and have["response/len_mean"]:
        ln = s["response/len_mean"]
        l_ref, l_last = _med(ln[ref]), _med(ln[last])
        surge = th.value("hacking_length_ratio")
        if l_ref > 0 and l_last / l_ref >= surge and gain >= th.value("reward_rise_min"):
            hack_span = _first_last(steps, ln > surge * l_ref, ref.stop) or last_steps
            hack_evidence.update(length_ref_median=l_ref, length_last_median=l_last,
                                 length_ratio=l_last / l_ref, reward_ref_median=r_ref,
                                 reward_last_median=r_last)
    if have["reward/mean"] and have["eval/sample_acc"]:
        acc = s["eval/sample_acc"]
        a_last = _med(acc[last])
        best_j = None
        for a, b in windows(steps, w)[1:]:
            if b > last.start:
                break
            rg, ag = r_last - _med(reward[a:b]), a_last - _med(acc[a:b])
            if rg >= th.value("reward_rise") and ag < th.value("acc_flat_fraction") * rg:
                best_j = (rg - ag, a, b, rg, ag)  # the latest such window: where flat begins
        if best_j is not None:
            _, a, b, rg, ag = best_j
            span = [steps[b - 1], steps[-1]]
            hack_span = span if hack_span is None else [min(hack_span[0], span[0]), steps[-1]]
            hack_evidence.update(accuracy_flat_from_steps=[steps[a], steps[b - 1]],
                                 reward_gain=rg, sample_acc_gain=ag)
    if hack_span is not None:
        out.append(_verdict("reward_hacking", "critical", hack_span, **hack_evidence))

    # Plateaus (seed 001 §1): reward flat between the reference and the last window. Flat both
    # ways: a reward that fell is a collapse (its own verdict), and blaming a loose grader or a
    # large KL coefficient for it would send the reader the wrong way.
    if have["reward/mean"] and n >= 3 * w and abs(gain) < th.value("reward_rise_min"):
        ev = dict(reward_ref_median=r_ref, reward_last_median=r_last, reward_gain=gain,
                  reference_steps=ref_steps, last_steps=last_steps)
        if have["kl/mean"] and kl_last < th.value("kl_near_zero"):
            out.append(_verdict("reward_plateau_beta_too_large", "warning",
                                [ref_steps[0], steps[-1]], kl_last_median=kl_last, **ev))
        elif have["eval/sample_acc"] and have["kl/mean"]:
            acc = s["eval/sample_acc"]
            ag = _med(acc[last]) - _med(acc[ref])
            if ag < th.value("acc_flat_abs"):
                out.append(_verdict("reward_plateau_grader_too_loose", "warning",
                                    [ref_steps[0], steps[-1]], kl_last_median=kl_last,
                                    sample_acc_gain=ag, **ev))
        if have["loss"]:
            loss = s["loss"]
            l_ref, l_last = _med(loss[ref]), _med(loss[last])
            sd = float(np.nanstd(loss[ref], ddof=1)) if np.isfinite(loss[ref]).sum() > 1 else 0.0
            if l_ref - l_last > max(th.value("loss_drop_sd") * sd, 1e-12):
                out.append(_verdict("loss_without_reward", "warning", [ref_steps[0], steps[-1]],
                                    loss_ref_median=l_ref, loss_last_median=l_last,
                                    loss_ref_stddev=sd, **ev))

    # The cluster, per rank, checkpoint steps left out (a save stalls on IO), as its cards:
    # throughput_drop (samples/s, else tokens/s, else 1/step time, down by more than the drop
    # ratio), step_time_drift (step time, else 1/throughput, off by more than the drift ratio,
    # either way) and rank_straggler (a rank's step time over the median rank's).
    ckpt = {e["step"] for e in data.events if e["type"] == "checkpoint_save"}
    drop, drift = th.value("throughput_drop_ratio"), th.value("step_time_drift_ratio")
    tests = (("throughput_drop", lambda x, ref: x < (1 - drop) * ref),
             ("step_time_drift", lambda x, ref: np.abs(x / ref - 1) > drift))
    found: dict[str, dict[str, Any]] = {vid: {} for vid, _ in tests}
    spans: dict[str, list[int] | None] = {vid: None for vid, _ in tests}
    own_step_time: dict[str, float] = {}  # rank -> last-window median of its logged step time
    for rank, by_step in sorted(data.perf.items()):
        psteps = [st for st in sorted(by_step) if st not in ckpt]
        key = next((k for k in THROUGHPUT_KEYS if any(k in by_step[st] for st in psteps)), None)
        tput = np.array([by_step[st].get(key, math.nan) if key else
                         (1 / by_step[st]["perf/step_time_s"]
                          if by_step[st].get("perf/step_time_s") else math.nan)
                         for st in psteps], dtype=float)
        stime = np.array([by_step[st].get("perf/step_time_s", math.nan) for st in psteps],
                         dtype=float)
        m = len(psteps)
        if np.isfinite(stime[max(0, m - w):]).any():
            own_step_time[str(rank)] = _med(stime[max(0, m - w):])
        elif key:
            # Only the ratios of step time are compared: seconds per sample (or token) will do.
            with np.errstate(divide="ignore"):
                stime = 1 / tput
        if m < 3 * w:
            continue
        signals = {"throughput_drop": (tput, key or "1/perf/step_time_s"),
                   "step_time_drift": (stime, "perf/step_time_s" if str(rank) in own_step_time
                                       else f"1/{key}")}
        for vid, sick in tests:
            series, signal = signals[vid]
            x_ref, x_last = _med(series[w:2 * w]), _med(series[m - w:])
            if not (x_ref > 0 and sick(x_last, x_ref)):
                continue
            found[vid][str(rank)] = {"signal": signal, "ref_median": _r(x_ref),
                                     "last_median": _r(x_last), "ratio": _r(x_last / x_ref)}
            fl = _first_last(psteps, sick(series, x_ref), 2 * w)
            if fl:
                sp = spans[vid]
                spans[vid] = fl if sp is None else [min(sp[0], fl[0]), max(sp[1], fl[1])]
    for vid, ranks in found.items():
        if ranks:
            out.append(_verdict(vid, "warning", spans[vid] or last_steps, ranks=ranks,
                                checkpoint_steps_excluded=len(ckpt)))
    # The straggler card needs ranks that log their own step time: the inverse of throughput
    # is the same on every rank of a synchronous run, straggler or not.
    if len(own_step_time) >= th.count("straggler_min_ranks"):
        median = float(np.median(list(own_step_time.values())))
        slow = {r: _r(t / median) for r, t in own_step_time.items()
                if median > 0 and t > (1 + th.value("straggler_ratio")) * median}
        if slow:
            out.append(_verdict("rank_straggler", "warning", last_steps, ratio_to_median=slow,
                                median_rank_step_time=median))

    out.extend(_card_verdicts(data, s, have, base, last, last_steps,
                              hacking=any(v["id"] == "reward_hacking" for v in out)))

    if NO_SIGNAL_VERDICTS & {v["id"] for v in out}:
        out = [v for v in out if v["id"] not in PLATEAU_VERDICTS]
    if not out:
        ev: dict[str, Any] = {"reward_ref_median": r_ref, "reward_last_median": r_last}
        if have["kl/mean"]:
            ev.update(kl_ref_median=kl_ref, kl_last_median=kl_last)
        out.append(_verdict("healthy", "info", [steps[0], steps[-1]], **ev))
    out.sort(key=lambda v: (SEVERITY_ORDER[v["severity"]], v["steps"][0]))
    return out


def _card_verdicts(data: RunData, s: dict[str, np.ndarray], have: dict[str, bool], base: slice,
                   last: slice, last_steps: list[int], *, hacking: bool) -> list[dict[str, Any]]:
    """The sicknesses the live cards watch beyond the three curves: those judged on the report's
    windows here, then those judged on the cards' own step windows (STEP_CARD_VERDICTS)."""
    out: list[dict[str, Any]] = []
    s = dict(s)
    for key in ("kl/max", "kl/p95", "reward/p25", "reward/p50", "reward/p75", "reward/p95",
                "group/reward_gap", "group/zero_std_frac", "adv/mean_abs", "reward/std", "grad/norm",
                "response/len_mean"):
        if key not in s:
            s[key] = data.series(key)
            have = {**have, key: bool(np.isfinite(s[key]).any())}
    steps = data.steps
    lasts = {r: max(by) for r, by in data.perf.items() if by}
    if steps:
        lasts[0] = max(lasts.get(0, steps[-1]), steps[-1])
    behind = {str(r): max(lasts.values()) - st for r, st in lasts.items()
              if max(lasts.values()) - st > th.value("rank_lag_steps")}
    if behind:
        out.append(_verdict("rank_stalled", "critical", last_steps, steps_behind=behind))

    def med(key: str, part: slice) -> float:
        return _med(s[key][part]) if have.get(key) else math.nan

    tail_last = _ratio(med("kl/max", last), med("kl/p95", last))
    tail_base = _ratio(med("kl/max", base), med("kl/p95", base))
    if (tail_last > th.value("kl_tail_ratio")
            and tail_last > th.value("kl_tail_baseline_ratio") * tail_base):
        out.append(_verdict("kl_tail_outliers", "warning", last_steps, tail_ratio_last=tail_last,
                            tail_ratio_baseline=tail_base))
    if have.get("reward/std"):
        std, streak, best, prev = s["reward/std"], 0, 0, None
        rw = th.count("rising_window_steps")
        for i in range(0, len(std) - rw + 1, rw):
            m = float(np.nanmean(std[i:i + rw]))
            streak = streak + 1 if prev is not None and m > prev else 0
            best, prev = max(best, streak), m
        if best >= th.value("reward_std_rising_windows"):
            out.append(_verdict("reward_std_rising", "warning", [steps[0], steps[-1]],
                                rising_windows=best))
    gap = med("group/reward_gap", last)
    if have.get("group/reward_gap"):
        gb = s["group/reward_gap"][base]
        gb_sd = float(np.nanstd(gb, ddof=1))
        if (gap > th.value("group_gap_sigmas") * med("reward/std", last)
                and gap > _med(gb) + th.value("group_gap_baseline_sigmas") * gb_sd):
            out.append(_verdict("group_dominated", "warning", last_steps, group_gap_last=gap,
                                reward_std_last=med("reward/std", last)))
    for judge in STEP_CARD_VERDICTS:
        found = judge(data)
        # A length surge that reward hacking explains is that verdict's evidence, not a second
        # sickness.
        if found is not None and not (hacking and found["id"] == "length_shift"):
            out.append(found)
    return out


# -- sections: rollout vs trainer, the entropy-reward law --------------------------------------

# The verdicts the rollout-vs-trainer section points to.
ROLLOUT_VERDICTS: tuple[str, ...] = ("rollout_mismatch", "rollout_mismatch_rising", "stale_rollouts")


def _card_lines() -> dict[str, str]:
    """The line each rollout-vs-trainer card draws for a key, in words (thresholds.py's values)."""
    rise = (f"rising: 50-step p10 > {th.value('mismatch_rise_ratio'):g}x initial and > "
            f"{th.value('mismatch_rise_floor'):g}, slope > 0")
    return {
        "mismatch/kl": f"20-step p10 > {th.value('mismatch_kl'):g}; {rise}",
        "mismatch/k3_kl": rise,
        "mismatch/logprob_diff_mean": rise,
        "mismatch/chi2_token": f"20-step p10 > {th.value('mismatch_chi2_token'):g}",
        "mismatch/is_weight_mean": f"20-step p90 < {th.value('mismatch_is_weight_low'):g} or p10 > "
                                   f"{th.value('mismatch_is_weight_high'):g}",
        "mismatch/is_ess_ratio": f"20-step p90 < {th.value('mismatch_ess_ratio'):g}",
        "staleness/mean": f"20-step p10 > {th.value('staleness_steps'):g}",
    }


def rollout_section(data: RunData) -> dict[str, Any] | None:
    """Rollout vs trainer: each mismatch / staleness key the run logged, its first- and
    last-window medians, their ratio, the trend they show (``rising``: the last window's median
    above the first window's 95th percentile; ``falling``: below its 5th; else ``steady``) and
    the card line it is judged against. None when the run logs none of them."""
    present = [k for k in ROLLOUT_KEYS if data.has(k)]
    if not present:
        return None
    steps, n = data.steps, len(data.steps)
    w = window_size(n)
    first, last = slice(0, min(w, n)), slice(max(0, n - w), n)
    lines = _card_lines()
    rows: dict[str, dict[str, Any]] = {}
    for key in present:
        x = data.series(key)
        f, la = _med(x[first]), _med(x[last])
        # Against the first window's own spread, whatever the signal's scale: a KL from 0.002
        # to 0.004 and an importance weight from 1.0 to 0.55 both left where they started.
        start = x[first][np.isfinite(x[first])]
        lo, hi = percentile(start, 5), percentile(start, 95)
        if la > hi:
            trend = "rising"
        elif la < lo:
            trend = "falling"
        else:
            trend = "steady" if math.isfinite(la) and start.size else "unknown"
        rows[key] = {"first_median": _r(f), "last_median": _r(la), "ratio": _r(_ratio(la, f)),
                     "trend": trend, "card_line": lines.get(key)}
    return {"first_steps": [steps[first.start], steps[first.stop - 1]],
            "last_steps": [steps[last.start], steps[-1]], "keys": rows}


def _law_blocks(data: RunData) -> tuple[list[int], dict[int, float], dict[int, float], list[int]]:
    """The law's points: the block means of entropy and reward over the steps that logged both
    (the exporter's LawTracker takes the same steps), the block indices in order, and those
    steps."""
    both = [st for st in data.steps
            if math.isfinite(data.train[st].get(LAW_ENTROPY, math.nan))
            and math.isfinite(data.train[st].get(LAW_REWARD, math.nan))]
    entropy = block_means(both, [data.train[st][LAW_ENTROPY] for st in both])
    reward = block_means(both, [data.train[st][LAW_REWARD] for st in both])
    return sorted(entropy), entropy, reward, both


def _block_steps(both: list[int], blocks: list[int]) -> list[int]:
    """The first and last logged step of a run of consecutive blocks."""
    inside = [st for st in both if blocks[0] <= st // BLOCK_STEPS <= blocks[-1]]
    return [inside[0], inside[-1]]


def _law_dict(fit: LawFit) -> dict[str, Any]:
    return {"a": _r(fit.a), "b": _r(fit.b), "ceiling": _r(fit.ceiling),
            "r_squared": _r(fit.r_squared), "points": fit.points}


def law_section(data: RunData) -> dict[str, Any]:
    """The entropy-reward law R = -a exp(H) + b (forecast.fit_law) fitted on the first half of the
    run's 10-step blocks and judged on the second half: the mean absolute error of its
    predictions (also as a % of the range of the run's block-mean reward), against holding the
    last fitted block's reward flat; the fit on the whole run as the exporter has it at the
    end; and whether the run ended near its ceiling (GRPORewardCeilingNear's rule at the last
    step)."""
    out: dict[str, Any] = {"entropy_key": LAW_ENTROPY, "reward_key": LAW_REWARD,
                           "block_steps": BLOCK_STEPS}
    blocks, entropy, reward, both = _law_blocks(data)
    out["blocks"] = len(blocks)
    if not blocks:
        return {**out, "fitted": False,
                "reason": f"the run logs no {LAW_ENTROPY} beside {LAW_REWARD}"}
    # The first half: a forecast is only worth its horizon, and half the run is the longest
    # horizon that still leaves a 100-step run (10 blocks) the MIN_BLOCKS a fit needs.
    half = len(blocks) // 2
    fit_blocks, test_blocks = blocks[:half], blocks[half:]
    fit = fit_law([entropy[b] for b in fit_blocks], [reward[b] for b in fit_blocks])
    out["fitted"] = fit is not None
    if fit is None:
        out["reason"] = (f"{len(fit_blocks)} blocks in the first half, {MIN_BLOCKS} needed"
                         if len(fit_blocks) < MIN_BLOCKS else
                         f"over the first half entropy moved by less than "
                         f"{100 * MIN_ENTROPY_SPREAD:g}% of its largest block mean: a line "
                         "through it would fit noise")
    else:
        errors, flat = [], []
        for b in test_blocks:
            try:
                predicted = fit.predict(entropy[b])
            except OverflowError:  # an entropy past exp()'s range: no prediction, as no fit point
                continue
            errors.append(abs(predicted - reward[b]))
            flat.append(abs(reward[fit_blocks[-1]] - reward[b]))
        finite = [r for r in reward.values() if math.isfinite(r)]
        span = max(finite) - min(finite) if finite else math.nan
        mae = float(np.mean(errors)) if errors else math.nan
        out["first_half"] = {**_law_dict(fit), "steps": _block_steps(both, fit_blocks),
                             "law_holds": bool(fit.a > 0 and fit.r_squared >= th.value("forecast_min_r2"))}
        out["prediction"] = {
            "steps": _block_steps(both, test_blocks), "blocks": len(errors), "mean_abs_error": _r(mae),
            "reward_range": _r(span),
            "error_pct_of_range": _r(100 * _ratio(mae, span)) if span > 0 else None,
            "flat_mean_abs_error": _r(float(np.mean(flat))) if flat else None}
    fits = _law_fits(data)
    if fits and fits[-1] is not None:
        out["whole_run"] = _law_dict(fits[-1])
    ceiling = _ceiling(data)
    if ceiling is not None:
        tr, c = ceiling
        out["end"] = {"step": int(tr.steps[-1]), "headroom_ratio": _r(float(c["headroom"][-1])),
                      "entropy_initial": _r(tr.initial()),
                      "entropy_window_mean": _r(float(c["entropy_mean"][-1])),
                      "entropy_slope_per_step": _r(float(c["entropy_slope"][-1])),
                      "near_ceiling": bool(c["near"][-1])}
    return out


# -- outputs -------------------------------------------------------------------------------


def write_csv(data: RunData, path: Path) -> None:
    cols = [c for c, key in CSV_COLUMNS if data.has(key) or c in ("reward", "kl", "loss",
                                                                   "sample_acc")]
    keys = dict(CSV_COLUMNS)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        wr = csv.writer(fh)
        wr.writerow(["step", *cols])
        for st in data.steps:
            m = data.train[st]
            wr.writerow([st, *(repr(m[keys[c]]) if keys[c] in m else "" for c in cols)])


_EXPLAIN = {
    "healthy": "reward rises, KL stays bounded, nothing sick was found",
    "nonfinite": "NaN or inf in the training signals: roll back to the last good checkpoint",
    "kl_explosion": f"KL jumped over {th.value('kl_explosion_ratio'):g}x its baseline: the "
                    "policy is running away from the reference model",
    "reward_collapse_kl_blowup": "reward turned down while KL blew up: the KL rein is too loose",
    "entropy_collapse": f"entropy stayed below {th.value('entropy_collapse_ratio'):g}x its "
                        f"initial value in 90% of {th.count('early_window_steps')} steps: the "
                        "policy stopped exploring",
    "entropy_explosion": f"entropy stayed above {th.value('entropy_explosion_ratio'):g}x its "
                         f"initial value in 90% of {th.count('early_window_steps')} steps: the "
                         "policy is turning to noise",
    "reward_collapse": "reward fell back to the floor from the level the run had reached",
    "kl_growth_accelerating": f"KL grew by over {100 * th.value('kl_growth_ratio'):g}% per "
                              "100 steps for 300 steps, and faster lately: the policy keeps "
                              "drifting",
    "completions_truncated": f"over {100 * th.value('truncated_ratio'):g}% of the completions "
                             f"were cut at the length limit in 90% of "
                             f"{th.count('early_window_steps')} steps",
    "dead_learning_signal": "from the first steps, nearly every prompt group had equal rewards "
                            "(or the whole batch did): nothing to learn from",
    "reward_hacking": "reward up with a length surge or without sample accuracy: grader exploited",
    "reward_plateau_beta_too_large": "reward flat with KL near 0: beta too large (or temperature "
                                     "too low)",
    "reward_plateau_grader_too_loose": "reward flat, KL normal, sample accuracy flat: the grader "
                                       "is too loose",
    "loss_without_reward": "loss went down while reward stayed flat: shrinking KL, not learning",
    "shortcut_learning": f"a prompt type's 50-step reward fell {th.value('shortcut_delta'):g} or "
                         "more below its start (or its level 200 steps before) while one that was "
                         "higher then rose as much: easy types up, hard ones down, the model "
                         "takes shortcuts",
    "throughput_drop": "samples/s fell on some ranks: look at the cluster, not the curves",
    "step_time_drift": "step time moved away from its reference on some ranks: the cluster "
                       "changed, not the model",
    "rank_straggler": "a rank's steps take far longer than the other ranks': every rank waits "
                      "for it at each gradient sync",
    "rank_stalled": "a rank stopped advancing while the others went on",
    "kl_tail_outliers": "a few samples carry most of the KL: look for reward-hacking prompts",
    "length_shift": f"response length moved by more than "
                    f"{100 * th.value('length_shift_ratio'):g}% (within 200 steps, or early on "
                    "against its initial value)",
    "reward_std_rising": "reward spread kept rising: easy prompts farmed, hard ones abandoned",
    "reward_quantile_extreme": "a reward quantile fell far below its baseline",
    "advantage_vanishing": "after the baseline, most groups had equal rewards or |advantage| "
                           "shrank: advantages vanished",
    "group_dominated": "one response per group dominated the gradient",
    "grad_norm_spike": f"grad norm stayed over {th.value('grad_norm_spike_ratio'):g}x its "
                       f"baseline in 90% of {th.count('sustain_steps')} steps",
    "rollout_mismatch": f"the rollout engine and the trainer disagree on the policy (KL over "
                        f"{th.value('mismatch_kl'):g}, chi-square over "
                        f"{th.value('mismatch_chi2_token'):g}, mean importance weight outside "
                        f"[{th.value('mismatch_is_weight_low'):g}, "
                        f"{th.value('mismatch_is_weight_high'):g}] or effective sample share "
                        f"under {th.value('mismatch_ess_ratio'):g}): the gradient is for a policy "
                        "the samples did not come from",
    "rollout_mismatch_rising": f"a rollout-vs-trainer mismatch rose past "
                               f"{th.value('mismatch_rise_ratio'):g}x its start and is still "
                               "rising: precision drift, a stale weight sync or a growing lag",
    "stale_rollouts": f"the trained trajectories were over {th.value('staleness_steps'):g} policy "
                      "versions old on average: the rollout side has fallen behind",
    "prompts_too_hard": f"over {100 * th.value('dead_group_cause_ratio'):g}% of the prompt groups "
                        "had every answer wrong: the prompts are too hard for the policy (easier "
                        "prompts, a curriculum)",
    "prompts_too_easy": f"over {100 * th.value('dead_group_cause_ratio'):g}% of the prompt groups "
                        "had every answer right: the prompts are solved (drop them, dynamic "
                        "sampling)",
    "entropy_covariance_surge": f"the covariance of token log-probability and advantage rose over "
                                f"{th.value('entropy_cov_ratio'):g}x its start: it drives entropy "
                                "down, a collapse is coming",
    "reward_ceiling_near": f"entropy is nearly spent: the entropy-reward law leaves under "
                           f"{100 * th.value('ceiling_headroom_ratio'):g}% of the reward gain "
                           "it promised at the start; more steps buy little",
    "length_bias": f"wrong answers grew over {100 * th.value('length_bias_growth_ratio'):g}% "
                   f"longer while right ones grew under "
                   f"{100 * th.value('length_bias_correct_ratio'):g}%: the loss's length "
                   "normalisation favours long wrong answers",
}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _cell(v: Any) -> str:
    return "-" if v is None else _fmt(v)


def _rollout_lines(section: dict[str, Any] | None, verdicts: list[dict[str, Any]]) -> list[str]:
    """The rollout-vs-trainer section in words."""
    if section is None:
        return ["rollout vs trainer: the run logs no mismatch/* or staleness/* key"]
    fs, ls = section["first_steps"], section["last_steps"]
    lines = [f"rollout vs trainer (window medians: first steps {fs[0]}-{fs[1]}, last steps "
             f"{ls[0]}-{ls[1]}):",
             f"  {'key':<30}{'first':>10}{'last':>10}{'ratio':>9}  {'trend':<9}card line"]
    for key, row in section["keys"].items():
        lines.append(f"  {key:<30}{_cell(row['first_median']):>10}{_cell(row['last_median']):>10}"
                     f"{_cell(row['ratio']):>9}  {row['trend']:<9}{row['card_line'] or ''}".rstrip())
    fired = [f"{v['id']} steps {v['steps'][0]}-{v['steps'][1]}" for v in verdicts
             if v["id"] in ROLLOUT_VERDICTS]
    lines.append("  verdicts: " + ("; ".join(fired) if fired else "none, no card fired"))
    return lines


def _law_lines(section: dict[str, Any]) -> list[str]:
    """The entropy-reward law section in words."""
    lines = [f"entropy-reward law R = -a*exp(H) + b ({section['block_steps']}-step block means of "
             f"{section['entropy_key']} and {section['reward_key']}, {section['blocks']} blocks):"]
    if not section["fitted"]:
        lines.append(f"  not fitted: {section['reason']}")
    else:
        f, p = section["first_half"], section["prediction"]
        holds = (f"the law holds: a > 0, R^2 >= {th.value('forecast_min_r2'):g}" if f["law_holds"]
                 else f"the law does not hold here: it needs a > 0 and R^2 >= "
                      f"{th.value('forecast_min_r2'):g}")
        lines += [
            f"  fit on the first half (steps {f['steps'][0]}-{f['steps'][1]}, {f['points']} blocks):"
            f" a = {_cell(f['a'])}, b = {_cell(f['b'])}, ceiling b - a = {_cell(f['ceiling'])}, "
            f"R^2 = {_cell(f['r_squared'])} ({holds})",
            f"  its prediction of the rest (steps {p['steps'][0]}-{p['steps'][1]}, {p['blocks']} "
            f"blocks): mean absolute error {_cell(p['mean_abs_error'])} = "
            f"{_cell(p['error_pct_of_range'])}% of the reward's range {_cell(p['reward_range'])} "
            f"(holding the last fitted block's reward instead: {_cell(p['flat_mean_abs_error'])})"]
    if "whole_run" in section:
        w = section["whole_run"]
        lines.append(f"  fit on the whole run (the exporter's at the end): a = {_cell(w['a'])}, "
                     f"b = {_cell(w['b'])}, ceiling b - a = {_cell(w['ceiling'])}, "
                     f"R^2 = {_cell(w['r_squared'])}, {w['points']} blocks")
    if "end" in section:
        e = section["end"]
        verdict = "near its ceiling" if e["near_ceiling"] else "not near its ceiling"
        lines.append(
            f"  at the end (step {e['step']}): headroom (exp(H) - 1) / (exp(H0) - 1) = "
            f"{_cell(e['headroom_ratio'])} (H 50-step mean {_cell(e['entropy_window_mean'])}, "
            f"initial {_cell(e['entropy_initial'])}, slope {_cell(e['entropy_slope_per_step'])} "
            f"per step): {verdict} (near: headroom < {th.value('ceiling_headroom_ratio'):g}, "
            f"R^2 >= {th.value('forecast_min_r2'):g}, a > 0, entropy falling)")
    return lines


def text_report(summary: dict[str, Any], verdicts: list[dict[str, Any]]) -> str:
    lines = [f"run {summary['run']}: {summary['logged_steps']} logged steps "
             f"{_fmt(summary['steps'])}, {summary['records']} records, ranks "
             f"{_fmt(summary['ranks'])}, {summary['bad_lines']} bad lines skipped", "",
             "verdicts:"]
    for v in verdicts:
        lines.append(f"  [{v['severity']}] {v['id']} steps {v['steps'][0]}-{v['steps'][1]}: "
                     f"{_EXPLAIN.get(v['id'], '')}")
        for k, x in v["evidence"].items():
            lines.append(f"      {k} = {_fmt(x)}")
    lines += ["", *_rollout_lines(summary.get("rollout_vs_trainer"), verdicts), "",
              *_law_lines(summary["entropy_reward_law"])]
    lines += ["", f"summary (whole run; window stddev over {summary['window_steps']}-step windows):",
              f"  {'signal':<20}{'p5':>10}{'p50':>10}{'p95':>10}{'p99':>10}{'mean':>10}"
              f"{'stddev':>10}{'win sd first':>14}{'win sd last':>13}"]
    for key, sig in summary["signals"].items():
        r, ws = sig["run"], sig["window_stddev"]
        lines.append(f"  {key:<20}" + "".join(f"{_fmt(r[c]):>10}" for c in
                                              ("p5", "p50", "p95", "p99", "mean", "stddev"))
                     + f"{_fmt(ws['first']):>14}{_fmt(ws['last']):>13}")
    return "\n".join(lines) + "\n"


def plot_curves(data: RunData, verdicts: list[dict[str, Any]], path: Path | None = None) -> bytes:
    """curves.png: reward (p25-p75 band), KL, loss, entropy, length; sick spans shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.array(data.steps, dtype=float)
    panels = [k for k in ("reward/mean", "kl/mean", "loss", "entropy/mean", "response/len_mean")
              if data.has(k)] or ["reward/mean"]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.2 * len(panels)), sharex=True,
                             squeeze=False)
    sick = [v for v in verdicts if v["id"] != "healthy"]
    for ax, key in zip(axes[:, 0], panels):
        y = data.series(key) if steps.size else np.array([])
        if key == "reward/mean" and data.has("reward/p25") and data.has("reward/p75"):
            ax.fill_between(steps, data.series("reward/p25"), data.series("reward/p75"),
                            alpha=0.25, color="tab:blue", label="p25-p75")
        ax.plot(steps, y, lw=0.8, color="tab:blue", label=key)
        for v in sick:
            ax.axvspan(v["steps"][0], max(v["steps"][1], v["steps"][0] + 1), alpha=0.12,
                       color="red" if v["severity"] == "critical" else "orange")
        ax.set_ylabel(key, fontsize=8)
        ax.legend(loc="upper left", fontsize=7)
    axes[-1, 0].set_xlabel("step")
    title = f"{data.run}: " + ", ".join(v["id"] for v in verdicts)
    fig.suptitle(title[:120], fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    png = buf.getvalue()
    if path is not None:
        path.write_bytes(png)
    return png


def plot_law(data: RunData, section: dict[str, Any], path: Path | None = None) -> bytes | None:
    """law.png: the block means of reward against entropy (the fitted half and the predicted
    half), the law fitted on the first half and its ceiling b - a; None when nothing was fitted."""
    if not section.get("fitted"):
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks, entropy, reward, _ = _law_blocks(data)
    fitted = blocks[:len(blocks) // 2]
    f = section["first_half"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for part, color, label in ((fitted, "tab:blue", "fitted (first half)"),
                               (blocks[len(fitted):], "tab:orange", "predicted (second half)")):
        ax.scatter([entropy[b] for b in part], [reward[b] for b in part], s=14, color=color,
                   label=label)
    finite = [entropy[b] for b in blocks if math.isfinite(entropy[b])]
    if finite and f["a"] is not None and f["b"] is not None:
        hs = np.linspace(0, max(max(finite), 0), 100)
        with np.errstate(over="ignore", invalid="ignore"):
            ax.plot(hs, f["b"] - f["a"] * np.exp(hs), color="black", lw=1,
                    label=f"R = -{f['a']:.3g} exp(H) + {f['b']:.3g}, R² {_cell(f['r_squared'])}")
        ax.axhline(f["b"] - f["a"], color="tab:red", ls="--", lw=1,
                   label=f"ceiling b - a = {f['b'] - f['a']:.3g}")
    ax.set_xlabel(f"{LAW_ENTROPY} ({BLOCK_STEPS}-step block mean)", fontsize=8)
    ax.set_ylabel(f"{LAW_REWARD} ({BLOCK_STEPS}-step block mean)", fontsize=8)
    ax.legend(loc="best", fontsize=7)
    ax.set_title(f"{data.run}: entropy-reward law"[:80], fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    png = buf.getvalue()
    if path is not None:
        path.write_bytes(png)
    return png


def html_report(summary: dict[str, Any], verdicts: list[dict[str, Any]], png: bytes,
                law_png: bytes | None = None) -> str:
    e = html.escape
    rows = []
    for key, sig in summary["signals"].items():
        r = sig["run"]
        rows.append("<tr><td>" + e(key) + "</td>" + "".join(
            f"<td>{e(_fmt(r[c]))}</td>" for c in ("p5", "p50", "p95", "p99", "mean", "stddev"))
            + f"<td>{e(_fmt(sig['window_stddev']['first']))}</td>"
              f"<td>{e(_fmt(sig['window_stddev']['last']))}</td></tr>")
    items = []
    for v in verdicts:
        ev = "".join(f"<li>{e(k)} = {e(_fmt(x))}</li>" for k, x in v["evidence"].items())
        items.append(f"<li class='{e(v['severity'])}'><b>{e(v['id'])}</b> ({e(v['severity'])}), "
                     f"steps {v['steps'][0]}-{v['steps'][1]}: {e(_EXPLAIN.get(v['id'], ''))}"
                     f"<ul>{ev}</ul></li>")
    img = base64.b64encode(png).decode("ascii")
    rollout = summary.get("rollout_vs_trainer")
    if rollout is None:
        rollout_html = f"<p>{e(_rollout_lines(None, verdicts)[0])}.</p>"
    else:
        trs = "".join(
            f"<tr><td>{e(k)}</td><td>{e(_cell(r['first_median']))}</td>"
            f"<td>{e(_cell(r['last_median']))}</td><td>{e(_cell(r['ratio']))}</td>"
            f"<td>{e(r['trend'])}</td><td>{e(r['card_line'] or '')}</td></tr>"
            for k, r in rollout["keys"].items())
        rollout_html = (f"<p>Window medians, first steps {rollout['first_steps'][0]}-"
                        f"{rollout['first_steps'][1]}, last steps {rollout['last_steps'][0]}-"
                        f"{rollout['last_steps'][1]}. {e(_rollout_lines(rollout, verdicts)[-1].strip())}"
                        "</p><table><tr><th>key</th><th>first</th><th>last</th><th>ratio</th>"
                        f"<th>trend</th><th>card line</th></tr>{trs}</table>")
    law = "".join(f"<li>{e(line.strip())}</li>" for line in
                  _law_lines(summary["entropy_reward_law"])[1:])
    law_img = ("" if law_png is None else "<img alt='reward against entropy' "
               f"src='data:image/png;base64,{base64.b64encode(law_png).decode('ascii')}'>")
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>grpo-monitor report: {e(summary['run'])}</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:first-child{text-align:left}"
        ".critical{color:#b00}.warning{color:#a60}.info{color:#060}</style></head><body>"
        f"<h1>Run {e(summary['run'])}</h1><p>{summary['logged_steps']} logged steps, "
        f"{summary['records']} records, {summary['bad_lines']} bad lines skipped.</p>"
        f"<h2>Verdicts</h2><ul>{''.join(items)}</ul>"
        f"<h2>Curves</h2><img alt='curves' src='data:image/png;base64,{img}'>"
        f"<h2>Rollout vs trainer</h2>{rollout_html}"
        f"<h2>Entropy-reward law</h2><p>{e(_law_lines(summary['entropy_reward_law'])[0])}</p>"
        f"<ul>{law}</ul>{law_img}"
        f"<h2>Summary</h2><p>Linear-interpolation percentiles; window stddev over "
        f"{summary['window_steps']}-step windows.</p><table><tr><th>signal</th><th>p5</th>"
        "<th>p50</th><th>p95</th><th>p99</th><th>mean</th><th>stddev</th>"
        f"<th>window sd first</th><th>window sd last</th></tr>{''.join(rows)}</table>"
        "</body></html>\n")


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_safe(v) for v in obj]
    return obj


def build_report(run_dir: Path | str, out: Path | str | None = None,
                 plots: bool = True) -> dict[str, Any]:
    """Load, summarise, diagnose and write every output; returns summary, verdicts, paths."""
    run_dir = Path(run_dir)
    out_dir = Path(out) if out is not None else run_dir / ".report"
    data = load_run(run_dir)
    summary = _json_safe(summarize(data))
    verdicts = _json_safe(diagnose(data))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"summary": out_dir / "summary.json", "verdicts": out_dir / "verdicts.json",
             "csv": out_dir / "reward-vs-step.csv", "text": out_dir / "report.txt"}
    paths["summary"].write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    paths["verdicts"].write_text(json.dumps(verdicts, indent=1) + "\n", encoding="utf-8")
    write_csv(data, paths["csv"])
    text = text_report(summary, verdicts)
    paths["text"].write_text(text, encoding="utf-8")
    if plots:
        paths["png"] = out_dir / "curves.png"
        png = plot_curves(data, verdicts, paths["png"])
        law_png = plot_law(data, summary["entropy_reward_law"], out_dir / "law.png")
        if law_png is not None:
            paths["law_png"] = out_dir / "law.png"
        paths["html"] = out_dir / "report.html"
        paths["html"].write_text(html_report(summary, verdicts, png, law_png), encoding="utf-8")
    return {"summary": summary, "verdicts": verdicts, "text": text,
            "outputs": {k: str(v) for k, v in paths.items()}, "data": data}


def cmd_report(args: argparse.Namespace) -> int:
    """Offline post-mortem of one run folder. Exit 0, or 2 when the folder has no records."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        print(f"grpo-monitor report: {run_dir} is not a folder", file=sys.stderr)
        return 2
    try:
        res = build_report(run_dir, args.out, plots=True)
    except OSError as exc:  # the output folder: not writable, a file in its way, a full disk
        print(f"grpo-monitor report: cannot write the report: {exc}", file=sys.stderr)
        return 2
    if not res["data"].records:
        print(f"grpo-monitor report: no records in {run_dir}", file=sys.stderr)
        return 2
    fmt = getattr(args, "format", "text") or "text"
    if fmt == "json":
        print(json.dumps({"summary": res["summary"], "verdicts": res["verdicts"],
                          "outputs": res["outputs"]}, indent=1))
    elif fmt == "html":
        print(res["outputs"]["html"])
    else:
        sys.stdout.write(res["text"])
        print(f"\noutputs in {Path(res['outputs']['verdicts']).parent}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m grpo_monitor.report RUN_DIR``: the CLI's ``report`` command."""
    from grpo_monitor.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    raise SystemExit(main(["report", *sys.argv[1:]]))

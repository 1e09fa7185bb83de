"""``grpo-monitor report RUN_DIR``: the offline post-mortem of one run (seed 000 §3.1: quick
decisions with live dashboards, deep attribution with local snapshots).

It reads every snapshot record of the run folder, summarises each core signal by quantiles
rather than means (linear-interpolation percentiles, seed 001 §2), writes ``reward-vs-step.csv``
(seed 001 §3), reads reward, KL and loss together (the three-curve method, seed 001 §1) and
names what it sees as verdicts, each with the steps and numbers that support it.

Outputs (in ``--out``, default ``RUN_DIR/.report`` - a dot folder, which the exporter's ingest
ignores): ``summary.json``, ``verdicts.json``, ``reward-vs-step.csv``, ``report.txt``,
``curves.png`` and ``report.html`` (self-contained, opens offline).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from grpo_monitor.snapshot import RecordError, identity_from_path, parse_record

# -- thresholds (each with its seed source) ------------------------------------------------

# Seed 000 §3.3: the first 200 steps are the baseline period; comparisons use 200-step windows.
WINDOW_STEPS = 200
# Short runs (train_demo: 300 steps) use a fifth of the run per window, at least this many steps.
MIN_WINDOW_STEPS = 10
# Seed 001 §1: reward "should rise"; a gain below this between the reference and the last
# window is a plateau (reward units, rewards in [0, 1]).
REWARD_RISE_MIN = 0.05
# Seed 000 §4.1 / seed 001 §1: a reward gain at least this large counts as "reward up".
REWARD_RISE = 0.1
# Seed 001 §1: "KL≈0" - the policy cannot move (beta too large / temperature too low).
KL_NEAR_ZERO = 0.01
# Seed 000 §5.1: KL above 10x its baseline is a red card.
KL_EXPLOSION_RATIO = 10.0
# Seed 001 §1: reward "suddenly turns down": a drop of this much from its best window.
REWARD_DROP = 0.1
# Seed 000 table §3.3: response length changing by more than 50% is alarming.
LENGTH_SURGE_RATIO = 1.5
# Seed 001 §1: reward up while sample accuracy does not follow. Accuracy gain below this
# fraction of the reward gain counts as flat (a healthy run's accuracy follows its reward).
ACC_FLAT_FRACTION = 0.25
# Seed 001 §1: sample accuracy gain below this is flat (ratio units).
ACC_FLAT_ABS = 0.02
# Seed 000 table §3.3 / §5.1: entropy down by more than 90% (below 0.1x its start).
ENTROPY_COLLAPSE_RATIO = 0.1
# Seed 001 §1: loss down while reward is flat; "down" is a drop of at least this many
# reference-window standard deviations of the loss.
LOSS_DROP_SD = 1.0
# Seed 000 §5.2: easy prompts up, hard ones down; the change of each, in reward units.
SHORTCUT_DELTA = 0.05
# Seed 000 §2.4 / §4.5: step time drifting more than 20% (samples/s 1.8 -> 1.0 in §4.5).
THROUGHPUT_DROP_FRACTION = 0.2

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
# The live cards' thresholds (prometheus/rules/grpo-thresholds.yml), judged here on medians of
# step windows, so that a run the cards caught is not called healthy afterwards.
RANK_LAG_STEPS = 20  # §2.4
KL_TAIL_RATIO, KL_TAIL_BASELINE_RATIO = 3.0, 1.5  # §2.3
LENGTH_SHIFT = 0.5  # table §3.3
RISING_WINDOW, RISING_WINDOWS = 100, 10  # table §3.3: reward_std rising monotonically
QUANTILE_SIGMAS = 3.0  # §3.3, §5.3
ZERO_STD_SHARE, ADV_VANISHING_RATIO = 0.5, 0.2  # §2.2
GROUP_GAP_SIGMAS, GROUP_GAP_BASELINE_SIGMAS = 2.0, 3.0  # §2.2
GRAD_SPIKE_RATIO, GRAD_SPIKE_STEPS = 5.0, 50  # table §3.3
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
    data = RunData(run=run_dir.name, path=run_dir)
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
                obj = json.loads(raw)
                objs = obj if isinstance(obj, list) and path.suffix == ".json" else [obj]
                snaps = [parse_record(o, run=run, rank=rank, mtime=mtime) for o in objs]
            except (ValueError, RecordError):
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
    return max(MIN_WINDOW_STEPS, min(WINDOW_STEPS, n_steps // 5))


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
            "window_steps": size, "signals": signals}


# -- verdicts ------------------------------------------------------------------------------


def _med(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else math.nan


def _r(x: float) -> float | None:
    return None if not math.isfinite(x) else round(float(x), 6)


def _verdict(vid: str, severity: str, steps: list[int], **evidence: Any) -> dict[str, Any]:
    return {"id": vid, "severity": severity, "steps": [int(steps[0]), int(steps[-1])],
            "evidence": {k: (_r(v) if isinstance(v, float) else v) for k, v in evidence.items()}}


def _first_last(steps: list[int], mask: np.ndarray, start: int = 0) -> list[int] | None:
    idx = [i for i in range(start, len(steps)) if mask[i]]
    return [steps[idx[0]], steps[idx[-1]]] if idx else None


def diagnose(data: RunData) -> list[dict[str, Any]]:
    """The run's verdicts; ``healthy`` alone when nothing is wrong."""
    steps = data.steps
    out: list[dict[str, Any]] = []
    if not steps:
        return out
    n = len(steps)
    w = window_size(n)
    base = slice(0, w)  # baseline window
    ref = slice(w, 2 * w) if n >= 3 * w else slice(0, w)  # reference: the window after it
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

    # kl_explosion (seed 000 §4.2, §5.1): KL over 10x its reference window.
    if have["kl/mean"] and math.isfinite(kl_ref) and kl_ratio >= KL_EXPLOSION_RATIO:
        span = _first_last(steps, kl > KL_EXPLOSION_RATIO * kl_ref, ref.stop) or last_steps
        out.append(_verdict("kl_explosion", "critical", span, kl_ref_median=kl_ref,
                            kl_last_median=kl_last, ratio=kl_ratio, kl_max=float(np.nanmax(kl)),
                            reference_steps=ref_steps, last_steps=last_steps))

    # reward_collapse_kl_blowup (seed 001 §1): reward turns down while KL blows up.
    if have["reward/mean"] and have["kl/mean"]:
        medians = [(_med(reward[a:b]), a, b) for a, b in windows(steps, w)]
        best, a, b = max((m for m in medians if math.isfinite(m[0])), default=(math.nan, 0, 0))
        if best - r_last >= REWARD_DROP and kl_ratio >= KL_EXPLOSION_RATIO:
            out.append(_verdict("reward_collapse_kl_blowup", "critical", [steps[b - 1], steps[-1]],
                                reward_best_window_median=best, reward_last_median=r_last,
                                best_window_steps=[steps[a], steps[b - 1]],
                                kl_ref_median=kl_ref, kl_last_median=kl_last, kl_ratio=kl_ratio))

    # entropy_collapse (seed 000 §4.3, table §3.3): entropy below 0.1x its start.
    if have["entropy/mean"]:
        ent = s["entropy/mean"]
        e_base, e_last = _med(ent[base]), _med(ent[last])
        if e_base > 0 and e_last < ENTROPY_COLLAPSE_RATIO * e_base:
            span = _first_last(steps, ent < ENTROPY_COLLAPSE_RATIO * e_base) or last_steps
            out.append(_verdict("entropy_collapse", "critical", span, entropy_base_median=e_base,
                                entropy_last_median=e_last, ratio=e_last / e_base,
                                entropy_min=float(np.nanmin(ent))))

    # reward_hacking (seed 000 §4.1, seed 001 §1): reward up with a length surge, or reward up
    # while sample accuracy stays flat.
    hack_evidence: dict[str, Any] = {}
    hack_span: list[int] | None = None
    if have["reward/mean"] and have["response/len_mean"]:
        ln = s["response/len_mean"]
        l_ref, l_last = _med(ln[ref]), _med(ln[last])
        if l_ref > 0 and l_last / l_ref >= LENGTH_SURGE_RATIO and gain >= REWARD_RISE_MIN:
            hack_span = _first_last(steps, ln > LENGTH_SURGE_RATIO * l_ref, ref.stop) or last_steps
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
            if rg >= REWARD_RISE and ag < ACC_FLAT_FRACTION * rg:
                best_j = (rg - ag, a, b, rg, ag)  # the latest such window: where flat begins
        if best_j is not None:
            _, a, b, rg, ag = best_j
            span = [steps[b - 1], steps[-1]]
            hack_span = span if hack_span is None else [min(hack_span[0], span[0]), steps[-1]]
            hack_evidence.update(accuracy_flat_from_steps=[steps[a], steps[b - 1]],
                                 reward_gain=rg, sample_acc_gain=ag)
    if hack_span is not None:
        out.append(_verdict("reward_hacking", "critical", hack_span, **hack_evidence))

    # Plateaus (seed 001 §1): reward flat between the reference and the last window.
    if have["reward/mean"] and n >= 3 * w and gain < REWARD_RISE_MIN:
        ev = dict(reward_ref_median=r_ref, reward_last_median=r_last, reward_gain=gain,
                  reference_steps=ref_steps, last_steps=last_steps)
        if have["kl/mean"] and kl_last < KL_NEAR_ZERO:
            out.append(_verdict("reward_plateau_beta_too_large", "warning",
                                [ref_steps[0], steps[-1]], kl_last_median=kl_last, **ev))
        elif have["eval/sample_acc"] and have["kl/mean"]:
            acc = s["eval/sample_acc"]
            ag = _med(acc[last]) - _med(acc[ref])
            if ag < ACC_FLAT_ABS:
                out.append(_verdict("reward_plateau_grader_too_loose", "warning",
                                    [ref_steps[0], steps[-1]], kl_last_median=kl_last,
                                    sample_acc_gain=ag, **ev))
        if have["loss"]:
            loss = s["loss"]
            l_ref, l_last = _med(loss[ref]), _med(loss[last])
            sd = float(np.nanstd(loss[ref], ddof=1)) if np.isfinite(loss[ref]).sum() > 1 else 0.0
            if l_ref - l_last > max(LOSS_DROP_SD * sd, 1e-12):
                out.append(_verdict("loss_without_reward", "warning", [ref_steps[0], steps[-1]],
                                    loss_ref_median=l_ref, loss_last_median=l_last,
                                    loss_ref_stddev=sd, **ev))

    # shortcut_learning (seed 000 §5.2, §2.2): the easiest prompt type up, the hardest down.
    types: dict[str, np.ndarray] = {}
    for t in sorted({t for bt in data.by_type.values() for t in bt}):
        types[t] = np.array([data.by_type.get(st, {}).get(t, {}).get("reward/mean", math.nan)
                             for st in steps], dtype=float)
    types = {t: v for t, v in types.items() if np.isfinite(v[ref]).any() and np.isfinite(v[last]).any()}
    if len(types) >= 2:
        ref_by = {t: _med(v[ref]) for t, v in types.items()}
        easy = "easy" if "easy" in types else max(ref_by, key=ref_by.__getitem__)
        hard = "hard" if "hard" in types else min(ref_by, key=ref_by.__getitem__)
        d_easy = _med(types[easy][last]) - ref_by[easy]
        d_hard = _med(types[hard][last]) - ref_by[hard]
        if easy != hard and d_easy >= SHORTCUT_DELTA and d_hard <= -SHORTCUT_DELTA:
            out.append(_verdict("shortcut_learning", "warning", [ref_steps[0], steps[-1]],
                                easy_type=easy, hard_type=hard, easy_change=d_easy,
                                hard_change=d_hard, reference_steps=ref_steps,
                                last_steps=last_steps))

    # throughput_drop (seed 000 §2.4, §4.5): samples/s per rank, checkpoint steps left out.
    ckpt = {e["step"] for e in data.events if e["type"] == "checkpoint_save"}
    dropped: dict[str, Any] = {}
    span = None
    for rank, by_step in sorted(data.perf.items()):
        psteps = [st for st in sorted(by_step) if st not in ckpt]
        key = next((k for k in THROUGHPUT_KEYS if any(k in by_step[st] for st in psteps)), None)
        tput = np.array([by_step[st].get(key, math.nan) if key else
                         (1 / by_step[st]["perf/step_time_s"]
                          if by_step[st].get("perf/step_time_s") else math.nan)
                         for st in psteps], dtype=float)
        m = len(psteps)
        if m < 3 * w or not np.isfinite(tput).any():
            continue
        t_ref, t_last = _med(tput[w:2 * w]), _med(tput[m - w:])
        if t_ref > 0 and t_last < (1 - THROUGHPUT_DROP_FRACTION) * t_ref:
            dropped[str(rank)] = {"signal": key or "1/perf/step_time_s", "ref_median": _r(t_ref),
                                  "last_median": _r(t_last), "ratio": _r(t_last / t_ref)}
            fl = _first_last(psteps, tput < (1 - THROUGHPUT_DROP_FRACTION) * t_ref, 2 * w)
            if fl:
                span = fl if span is None else [min(span[0], fl[0]), max(span[1], fl[1])]
    if dropped:
        out.append(_verdict("throughput_drop", "warning", span or last_steps, ranks=dropped,
                            checkpoint_steps_excluded=len(ckpt)))

    out.extend(_card_verdicts(data, s, have, base, ref, last, ref_steps, last_steps,
                              hacking=any(v["id"] == "reward_hacking" for v in out)))

    if not out:
        ev: dict[str, Any] = {"reward_ref_median": r_ref, "reward_last_median": r_last}
        if have["kl/mean"]:
            ev.update(kl_ref_median=kl_ref, kl_last_median=kl_last)
        out.append(_verdict("healthy", "info", [steps[0], steps[-1]], **ev))
    out.sort(key=lambda v: (SEVERITY_ORDER[v["severity"]], v["steps"][0]))
    return out


def _card_verdicts(data: RunData, s: dict[str, np.ndarray], have: dict[str, bool], base: slice,
                   ref: slice, last: slice, ref_steps: list[int], last_steps: list[int], *,
                   hacking: bool) -> list[dict[str, Any]]:
    """The sicknesses the live cards watch beyond the three curves."""
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
              if max(lasts.values()) - st > RANK_LAG_STEPS}
    if behind:
        out.append(_verdict("rank_stalled", "critical", last_steps, steps_behind=behind))

    def med(key: str, part: slice) -> float:
        return _med(s[key][part]) if have.get(key) else math.nan

    tail_last = med("kl/max", last) / med("kl/p95", last)
    tail_base = med("kl/max", base) / med("kl/p95", base)
    if tail_last > KL_TAIL_RATIO and tail_last > KL_TAIL_BASELINE_RATIO * tail_base:
        out.append(_verdict("kl_tail_outliers", "warning", last_steps, tail_ratio_last=tail_last,
                            tail_ratio_baseline=tail_base))
    length_ratio = med("response/len_mean", last) / med("response/len_mean", ref)
    if not hacking and abs(length_ratio - 1) > LENGTH_SHIFT:
        out.append(_verdict("length_shift", "warning", [ref_steps[0], last_steps[1]],
                            length_ratio=length_ratio))
    if have.get("reward/std"):
        std, streak, best, prev = s["reward/std"], 0, 0, None
        for i in range(0, len(std) - RISING_WINDOW + 1, RISING_WINDOW):
            m = float(np.nanmean(std[i:i + RISING_WINDOW]))
            streak = streak + 1 if prev is not None and m > prev else 0
            best, prev = max(best, streak), m
        if best >= RISING_WINDOWS:
            out.append(_verdict("reward_std_rising", "warning", [steps[0], steps[-1]],
                                rising_windows=best))
    low = {}
    for q in ("reward/p25", "reward/p50", "reward/p75", "reward/p95"):
        if have.get(q):
            b = s[q][base]
            sd = float(np.nanstd(b, ddof=1))
            limit = _med(b) - QUANTILE_SIGMAS * sd
            # As the card: below baseline - 3σ at the end, or a 50-step mean that fell more
            # than 3σ below the one 200 steps before it, anywhere in the run.
            m50 = np.convolve(np.nan_to_num(s[q]), np.ones(50) / 50, "valid")
            falls = m50[200:] - m50[:-200] if len(m50) > 200 else np.array([])
            if med(q, last) < limit or (falls.size and falls.min() < -QUANTILE_SIGMAS * sd):
                low[q] = {"last_median": _r(med(q, last)), "baseline_limit": _r(limit),
                          "largest_fall_200_steps": _r(float(falls.min())) if falls.size else None}
    if low:
        out.append(_verdict("reward_quantile_extreme", "warning", last_steps, quantiles=low))
    zero, adv = med("group/zero_std_frac", last), med("adv/mean_abs", last)
    if zero > ZERO_STD_SHARE or adv < ADV_VANISHING_RATIO * med("adv/mean_abs", base):
        out.append(_verdict("advantage_vanishing", "warning", last_steps, zero_std_share=zero,
                            adv_abs_last=adv))
    gap = med("group/reward_gap", last)
    if have.get("group/reward_gap"):
        gb = s["group/reward_gap"][base]
        if (gap > GROUP_GAP_SIGMAS * med("reward/std", last)
                and gap > _med(gb) + GROUP_GAP_BASELINE_SIGMAS * float(np.nanstd(gb, ddof=1))):
            out.append(_verdict("group_dominated", "warning", last_steps, group_gap_last=gap,
                                reward_std_last=med("reward/std", last)))
    if have.get("grad/norm"):
        g = s["grad/norm"]
        limit = GRAD_SPIKE_RATIO * _med(g[base])
        above = np.convolve((g > limit).astype(int), np.ones(GRAD_SPIKE_STEPS, int), "valid")
        hit = np.nonzero(above == GRAD_SPIKE_STEPS)[0]
        if hit.size:
            out.append(_verdict("grad_norm_spike", "warning",
                                [steps[int(hit[0])], steps[int(hit[-1]) + GRAD_SPIKE_STEPS - 1]],
                                baseline_median=_med(g[base]), ratio=GRAD_SPIKE_RATIO))
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
    "kl_explosion": "KL ran away from its reference window: the policy is drifting",
    "reward_collapse_kl_blowup": "reward turned down while KL blew up: the KL rein is too loose",
    "entropy_collapse": "entropy fell below a tenth of its start: the policy stopped exploring",
    "reward_hacking": "reward up with a length surge or without sample accuracy: grader exploited",
    "reward_plateau_beta_too_large": "reward flat with KL near 0: beta too large (or temperature "
                                     "too low)",
    "reward_plateau_grader_too_loose": "reward flat, KL normal, sample accuracy flat: the grader "
                                       "is too loose",
    "loss_without_reward": "loss went down while reward stayed flat: shrinking KL, not learning",
    "shortcut_learning": "easy prompt types up, hard ones down: the model takes shortcuts",
    "throughput_drop": "samples/s fell on some ranks: look at the cluster, not the curves",
    "rank_stalled": "a rank stopped advancing while the others went on",
    "kl_tail_outliers": "a few samples carry most of the KL: look for reward-hacking prompts",
    "length_shift": "response length moved by more than half",
    "reward_std_rising": "reward spread kept rising: easy prompts farmed, hard ones abandoned",
    "reward_quantile_extreme": "a reward quantile fell far below its baseline",
    "advantage_vanishing": "most groups had equal rewards: advantages vanished",
    "group_dominated": "one response per group dominated the gradient",
    "grad_norm_spike": "grad norm stayed over 5x its baseline for 50 steps",
}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


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


def html_report(summary: dict[str, Any], verdicts: list[dict[str, Any]], png: bytes) -> str:
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
        paths["html"] = out_dir / "report.html"
        paths["html"].write_text(html_report(summary, verdicts, png), encoding="utf-8")
    return {"summary": summary, "verdicts": verdicts, "text": text,
            "outputs": {k: str(v) for k, v in paths.items()}, "data": data}


def cmd_report(args: argparse.Namespace) -> int:
    """Offline post-mortem of one run folder. Exit 0, or 2 when the folder has no records."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        print(f"grpo-monitor report: {run_dir} is not a folder", file=sys.stderr)
        return 2
    res = build_report(run_dir, args.out, plots=True)
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

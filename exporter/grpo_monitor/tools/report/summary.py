"""summary.json: each core signal by quantiles, and the report's two sections.

Each core signal by quantiles rather than means, over the run and per window, and the report's
two sections: rollout vs trainer (the mismatch and staleness keys of the newer RL stacks, first
and last window medians) and the entropy-reward law (fitted on the first half of the run,
judged on the second).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from grpo_monitor.contract import thresholds as th
from grpo_monitor.contract.cards import CARDS_BY_NAME, MINIMUM_CURVES, OPTIONAL_SIGNALS, arm
from grpo_monitor.contract.keys import SIGNALS
from grpo_monitor.runtime.forecast import (
    BLOCK_STEPS,
    MIN_BLOCKS,
    MIN_ENTROPY_SPREAD,
    LawFit,
    score_forecast,
)
from grpo_monitor.runtime.signals import LAW_ENTROPY, LAW_REWARD
from grpo_monitor.tools.report.statistics import (
    RunView,
    run_shape,
    block_steps,
    describe,
    law_blocks,
    median,
    percentile,
    ratio,
    rounded,
    windows,
)
from grpo_monitor.contract.cards import CARDS
from grpo_monitor.tools.report.verdicts import VERDICTS

SUMMARY_SIGNALS: tuple[str, ...] = (
    "reward/mean", "reward/std", "kl/mean", "loss", "eval/sample_acc", "entropy/mean",
    "response/len_mean", "grad/norm",
)
# The rollout-vs-trainer section: every mismatch and staleness key the run logged, in keys.py's
# order.
ROLLOUT_KEYS: tuple[str, ...] = tuple(s.key for s in SIGNALS
                                      if s.key.startswith(("mismatch/", "staleness/")))


def summarize(view: RunView) -> dict[str, Any]:
    data, steps = view.data, view.steps
    signals: dict[str, Any] = {}
    for key in SUMMARY_SIGNALS:
        if not data.has(key):
            continue
        series = view.series(key)
        per_window = []
        for a, b in windows(steps, view.window):
            d = describe(series[a:b])
            d["steps"] = [steps[a], steps[b - 1]]
            per_window.append(d)
        sds = [w["stddev"] for w in per_window]
        signals[key] = {"run": describe(series), "windows": per_window,
                        "window_stddev": {"min": min(sds), "max": max(sds),
                                          "first": sds[0], "last": sds[-1]}}
    return {"run": data.run, "records": data.records, "bad_lines": data.bad_lines,
            "steps": [steps[0], steps[-1]] if steps else [], "logged_steps": len(steps),
            "ranks": sorted(set(data.perf) | ({0} if data.train else set())),
            "window_steps": view.window, "signals": signals,
            "rollout_vs_trainer": rollout_section(view) if steps else None,
            "entropy_reward_law": law_section(view),
            "missing_curves": [k for k in MINIMUM_CURVES if not data.has(k)] if steps else [],
            "not_judged": not_judged(view) if steps else [],
            "undone": [{"steps": [lo, hi], "back_to": back} for lo, hi, back in data.undone]}


# -- what the report could not judge ---------------------------------------------------------------


def not_judged(view: RunView) -> list[dict[str, Any]]:
    """The verdicts of a card the run could not have raised, and why (the card's declaration
    against what the run logged): ``missing_signal`` with the keys it needs, ``baseline_pending``
    (the run is shorter than the baseline period), ``not_applicable``. A card that waits only for
    an optional signal (cards.OPTIONAL_SIGNALS: a held-out score) is left out, as the coverage
    card leaves it out."""
    shape = run_shape(view)
    out = []
    for kind in VERDICTS.values():
        if kind.card is None or kind.card not in CARDS_BY_NAME:
            continue
        armed = arm(CARDS_BY_NAME[kind.card], shape)
        if armed.reason == "missing_signal" and set(armed.needs) <= OPTIONAL_SIGNALS:
            continue  # a held-out score many runs never log: no coverage card says it either
        if armed.reason != "armed":
            out.append({"verdict": kind.id, "card": kind.card, "reason": armed.reason,
                        "why": armed.explanation})
    return out


# -- rollout vs trainer --------------------------------------------------------------------------


def _card_lines() -> dict[str, str]:
    """The lines each rollout-vs-trainer key is judged against, in words: every declared card
    branch that reads it (contract/card_logic.py), with the thresholds table's numbers."""
    lines: dict[str, list[str]] = {}
    for card in CARDS:
        for branch in card.branches:
            if branch.logic is None:
                continue
            name = card.name.removeprefix("GRPO") + (f"/{branch.reason}" if branch.reason else "")
            for key in branch.logic.keys:
                lines.setdefault(key, []).append(f"{name}: {branch.logic.words()}")
    return {key: "; ".join(each) for key, each in lines.items()}


def rollout_section(view: RunView) -> dict[str, Any] | None:
    """Rollout vs trainer: each mismatch / staleness key the run logged, its first- and
    last-window medians, their ratio, the trend they show (``rising``: the last window's median
    above the first window's 95th percentile; ``falling``: below its 5th; else ``steady``) and
    the card line it is judged against. None when the run logs none of them."""
    present = [k for k in ROLLOUT_KEYS if view.data.has(k)]
    if not present:
        return None
    first, last = view.base, view.last
    lines = _card_lines()
    rows: dict[str, dict[str, Any]] = {}
    for key in present:
        x = view.series(key)
        first_median, last_median = median(x[first]), median(x[last])
        # Against the first window's own spread, whatever the signal's scale: a KL from 0.002
        # to 0.004 and an importance weight from 1.0 to 0.55 both left where they started.
        start = x[first][np.isfinite(x[first])]
        lo, hi = percentile(start, 5), percentile(start, 95)
        if last_median > hi:
            trend = "rising"
        elif last_median < lo:
            trend = "falling"
        else:
            trend = "steady" if math.isfinite(last_median) and start.size else "unknown"
        rows[key] = {"first_median": rounded(first_median), "last_median": rounded(last_median),
                     "ratio": rounded(ratio(last_median, first_median)), "trend": trend,
                     "card_line": lines.get(key)}
    return {"first_steps": view.span(first), "last_steps": view.span(last), "keys": rows}


# -- the entropy-reward law ----------------------------------------------------------------------


def _law_dict(fit: LawFit) -> dict[str, Any]:
    return {"a": rounded(fit.a), "b": rounded(fit.b), "ceiling": rounded(fit.ceiling),
            "r_squared": rounded(fit.r_squared), "points": fit.points}


def law_section(view: RunView) -> dict[str, Any]:
    """The entropy-reward law R = -a exp(H) + b (forecast.fit_law) fitted on the first half of the
    run's 10-step blocks (half of its blocks, not of its steps: forecast.score_forecast's cut)
    and judged on the second half: the mean absolute error of its predictions (also as a % of
    the range of the run's block-mean reward), against holding the last fitted block's reward
    flat; the fit on the whole run as the exporter has it at the end; and whether the run ended
    near its ceiling (GRPORewardCeilingNear's rule at the last step)."""
    out: dict[str, Any] = {"entropy_key": LAW_ENTROPY, "reward_key": LAW_REWARD,
                           "block_steps": BLOCK_STEPS}
    blocks, entropy, reward, both = law_blocks(view.data)
    out["blocks"] = len(blocks)
    if not blocks:
        return {**out, "fitted": False,
                "reason": f"the run logs no {LAW_ENTROPY} beside {LAW_REWARD}"}
    # The first half: a forecast is only worth its horizon, and half the run is the longest
    # horizon that still leaves a 100-step run (10 blocks) the MIN_BLOCKS a fit needs.
    score = score_forecast(entropy, reward, len(blocks) // 2)
    fit, fit_blocks = score.fit, list(score.fit_blocks)
    out["fitted"] = fit is not None
    if fit is None:
        out["reason"] = (f"{len(fit_blocks)} blocks in the first half, {MIN_BLOCKS} needed"
                         if len(fit_blocks) < MIN_BLOCKS else
                         f"over the first half entropy moved by less than "
                         f"{100 * MIN_ENTROPY_SPREAD:g}% of its largest block mean: a line "
                         "through it would fit noise")
    else:
        pct = score.mae_pct_of_range
        out["first_half"] = {**_law_dict(fit), "steps": block_steps(both, fit_blocks),
                             "law_holds": bool(fit.a > 0 and fit.r_squared >= th.value("forecast_min_r2"))}
        out["prediction"] = {
            "steps": block_steps(both, list(score.forecast_blocks)), "blocks": len(score.errors),
            "mean_abs_error": rounded(score.mae), "reward_range": rounded(score.reward_range),
            "error_pct_of_range": None if pct is None else rounded(pct),
            "flat_mean_abs_error": rounded(score.flat_mae) if score.flat_errors else None}
    fits = view.law_fits
    if fits and fits[-1] is not None:
        out["whole_run"] = _law_dict(fits[-1])
    ceiling = view.ceiling
    if ceiling is not None:
        tr = ceiling.track
        out["end"] = {"step": int(tr.steps[-1]),
                      "headroom_ratio": rounded(float(ceiling.headroom[-1])),
                      "entropy_initial": rounded(tr.initial()),
                      "entropy_window_mean": rounded(float(ceiling.entropy_mean[-1])),
                      "entropy_slope_per_step": rounded(float(ceiling.entropy_slope[-1])),
                      "near_ceiling": bool(ceiling.near[-1])}
    return out

"""The run's verdicts: what the report names as wrong, each with the steps and numbers behind it.

Every verdict is one small function registered with ``@verdict``: its id, its severity, the live
card it stands for (a run the card caught gets this verdict afterwards) and a one-line
explanation. Each reads the run through one shared ``RunView`` and returns a ``Finding`` (the
sick span and its evidence) or None; ``diagnose`` runs them all.

Two families:

* the three-curve verdicts (reward, KL and loss read together) and the cluster's, on the report's
  windows over the logged steps (base, reference, last; values compared are window medians);
  the report's own (plateaus, loss without reward, reward collapse with a KL blow-up) have no
  card: they need the whole run;
* the cards' verdicts, naming the steps where the card would have been firing: every branch's
  logic is declared once (contract/card_logic.py) and judged by ``declared.judge`` on the
  features the exporter's own code computed as the run was read (``_declared``); the rank lag,
  which only the rule engine computes (it sees every rank), from each rank's last step.

Every number a verdict compares with is read from grpo_monitor.contract.thresholds at each use: the card
thresholds are the ones the live rules read (grpo-thresholds.yml is generated from the same
table), so a run the cards caught is not called healthy afterwards; the report's own windows and
three-curve limits sit in that table's ``report`` group.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from grpo_monitor.contract import thresholds as th
from grpo_monitor.contract.cards import CARDS_BY_NAME, arm
from grpo_monitor.tools.report import declared
from grpo_monitor.tools.report.load import RunData
from grpo_monitor.tools.stack import card_severities
from grpo_monitor.tools.report.statistics import (
    RunView,
    median,
    rounded,
    run_shape,
    windows,
)

Severity = Literal["critical", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"critical": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    """What a verdict found: the first and last step of the sick span, and the numbers behind it
    (floats are rounded when the verdict is written)."""

    steps: list[int]
    evidence: dict[str, Any]


Judge = Callable[[RunView], Finding | None]


def _found(hit: dict[str, Any] | None, first: dict[str, Any] | None = None, **last: Any) -> Finding | None:
    """The Finding of a hit (None for no hit): its steps, and its numbers after ``first`` and
    before ``last``, in the order the verdict lists them."""
    if hit is None:
        return None
    steps = hit.pop("steps")
    return Finding(steps, {**(first or {}), **hit, **last})


@dataclass(frozen=True)
class VerdictKind:
    id: str
    severity: Severity
    explanation: str  # one line, shown beside the verdict in report.txt and report.html
    card: str | None  # the live card it stands for; None for the report's own verdicts
    judge: Judge
    # Verdicts that explain this one: found beside one of them, it is their evidence, not a
    # second sickness, and is left out.
    explained_by: frozenset[str]
    # Given only when no other verdict is: the healthy run.
    alone: bool


# Every verdict, in the order they are judged; verdicts that tie on severity and first step are
# listed in this order.
VERDICTS: dict[str, VerdictKind] = {}


# The live cards' colours, from the rule files Prometheus loads (severity critical = red, warning
# = yellow): a verdict that stands for a card has that card's severity. The severity a verdict
# declares is what an installation without the rule files shows; tests/test_report.py checks
# that the two agree.
CARD_SEVERITIES: dict[str, str] = card_severities()


def verdict(vid: str, severity: Severity, explanation: str, *, card: str | None = None,
            explained_by: Iterable[str] = (), alone: bool = False) -> Callable[[Judge], Judge]:
    """Register the decorated function as the judge of verdict ``vid``."""
    def register(judge: Judge) -> Judge:
        if vid in VERDICTS:
            raise ValueError(f"verdict {vid!r} is registered twice")
        shown = CARD_SEVERITIES.get(card, severity) if card else severity
        VERDICTS[vid] = VerdictKind(vid, shown, explanation, card, judge,  # type: ignore[arg-type]
                                    frozenset(explained_by), alone)
        return judge
    return register


def _written(kind: VerdictKind, found: Finding) -> dict[str, Any]:
    return {"id": kind.id, "severity": kind.severity,
            "steps": [int(found.steps[0]), int(found.steps[-1])], "card": kind.card,
            "evidence": {k: (rounded(v) if isinstance(v, float) else v)
                         for k, v in found.evidence.items()}}


def diagnose(run: RunData | RunView) -> list[dict[str, Any]]:
    """The run's verdicts, most severe (then earliest) first; ``healthy`` alone when nothing is
    wrong; none for a run without steps."""
    view = run if isinstance(run, RunView) else RunView(run)
    if not view.steps:
        return []
    # A card the run could not have raised (its declaration disarmed on this run: a baseline
    # the run never reached, a signal it does not log) is not named: the live rules would not
    # raise it, and the report lists it under "not judged" instead.
    shape = run_shape(view)
    armed = {kind.id for kind in VERDICTS.values()
             if kind.card not in CARDS_BY_NAME or arm(CARDS_BY_NAME[kind.card], shape).reason == "armed"}
    found = {kind.id: _written(kind, finding) for kind in VERDICTS.values()
             if not kind.alone and kind.id in armed and (finding := kind.judge(view)) is not None}
    out = [v for vid, v in found.items() if not VERDICTS[vid].explained_by & found.keys()]
    if not out:
        out = [_written(kind, finding) for kind in VERDICTS.values()
               if kind.alone and (finding := kind.judge(view)) is not None]
    out.sort(key=lambda v: (SEVERITY_ORDER[v["severity"]], v["steps"][0]))
    return out


# -- helpers shared by the verdicts -------------------------------------------------------------


def _branches(**found: dict[str, Any] | None) -> Finding | None:
    """One verdict from a card's branches (its `reason`s): its span covers every branch that
    fired, and the evidence keeps each branch's own steps and values."""
    hits = {k: v for k, v in found.items() if v is not None}
    if not hits:
        return None
    span = [min(v["steps"][0] for v in hits.values()), max(v["steps"][1] for v in hits.values())]
    return Finding(span, hits)


def _with_branches(main: Finding | None, **others: Finding | None) -> Finding | None:
    """A card's main finding with its other branches' (their `reason`s) beside it: its span
    covers every branch that fired, and each other branch keeps its evidence under its name."""
    found = {k: f for k, f in others.items() if f is not None}
    if not found:
        return main
    every = [*([main] if main is not None else []), *found.values()]
    return Finding([min(f.steps[0] for f in every), max(f.steps[1] for f in every)],
                   {**(main.evidence if main is not None else {}),
                    **{k: f.evidence for k, f in found.items()}})


def _declared_each(view: RunView, card: str, reason: str = "") -> dict[str, dict[str, Any] | None]:
    """A declared card branch (contract/card_logic.py) judged on the exporter's features as the
    run was read (declared.judge), for each key it judges, with the signal's last value."""
    hits = declared.judge(view.steps, view.readings, card, reason, view.type_readings,
                          view.any_readings)
    for key, hit in hits.items():
        if hit is not None and (tr := view.track(key)) is not None:
            hit["last"] = float(tr.values[-1])
    return hits


def _declared(view: RunView, card: str, reason: str = "") -> dict[str, Any] | None:
    """A declared branch of one key, judged (``_declared_each``)."""
    (hit,) = _declared_each(view, card, reason).values()
    return hit


# -- the three curves: reward, KL and loss read together, on the report's windows ---------------


@verdict("nonfinite", "critical",
         "NaN or inf in the training signals: roll back to the last good checkpoint",
         card="GRPONonFiniteValues")
def nonfinite(view: RunView) -> Finding | None:
    """GRPONonFiniteValues: NaN / inf in any signal the run logs (its unknown keys too) within
    the last 50 steps. Every key that went so where the card fired is named with the step its
    streak began, earliest first, as the card's description names them."""
    hit = _declared(view, "GRPONonFiniteValues")
    if hit is None:
        return None
    since = hit.get("since_step", {})
    keys = sorted(since, key=lambda k: (since[k], k))
    return Finding(hit["steps"], {"keys": keys, "since_step": {k: int(since[k]) for k in keys},
                                  "steps_flagged": hit["steps_flagged"]})


def _kl_ratio(view: RunView) -> float:
    """KL's last-window median over its reference-window median (inf from a zero reference)."""
    kl_ref, kl_last = view.median("kl/mean", view.reference), view.median("kl/mean", view.last)
    return kl_last / kl_ref if kl_ref > 0 else (math.inf if kl_last > 0 else math.nan)


@verdict("reward_collapse_kl_blowup", "critical",
         "reward turned down while KL blew up: the KL rein is too loose")
def reward_collapse_kl_blowup(view: RunView) -> Finding | None:
    """Reward's last window at least reward_drop under its best window while KL's last window is
    kl_explosion_ratio times its reference window or more."""
    if not (view.has("reward/mean") and view.has("kl/mean")):
        return None
    steps, reward = view.steps, view.series("reward/mean")
    reward_last = view.median("reward/mean", view.last)
    medians = [(median(reward[a:b]), a, b) for a, b in windows(steps, view.window)]
    best, a, b = max((m for m in medians if math.isfinite(m[0])), default=(math.nan, 0, 0))
    kl_ratio = _kl_ratio(view)
    if not (best - reward_last >= th.value("reward_drop")
            and kl_ratio >= th.value("kl_explosion_ratio")):
        return None
    return Finding([steps[b - 1], steps[-1]], {
        "reward_best_window_median": best, "reward_last_median": reward_last,
        "best_window_steps": [steps[a], steps[b - 1]],
        "kl_ref_median": view.median("kl/mean", view.reference),
        "kl_last_median": view.median("kl/mean", view.last), "kl_ratio": kl_ratio})


@verdict("reward_hacking", "warning",
         "reward up with a length surge or without sample accuracy: grader exploited",
         card="GRPORewardHackingSuspected")
def reward_hacking(view: RunView) -> Finding | None:
    """GRPORewardHackingSuspected: once the baseline is ready, the response length's 50-step
    mean over hacking_length_ratio x the one 200 steps before while the reward rose
    (length_surge), or the reward up by hacking_reward_sigmas baseline stddevs within 200 steps
    while the sample accuracy moved by under hacking_accuracy_sigmas of its own (flat_accuracy);
    before any baseline, the reward's trend up steadily while the accuracy's is not (trend)."""
    card = "GRPORewardHackingSuspected"
    return _branches(**{r: _declared(view, card, r) for r in ("length_surge", "flat_accuracy", "trend")})


def _plateau(view: RunView) -> dict[str, Any] | None:
    """The evidence of a reward plateau: reward flat between the reference and the last window,
    within reward_rise_min either way (a reward that fell is a collapse, its own verdict, and
    blaming a loose grader or a large KL coefficient for it would send the reader the wrong
    way); None when the reward moved, or the run has fewer than three windows."""
    gain = view.gain("reward/mean")
    if not (view.has("reward/mean") and len(view.steps) >= 3 * view.window
            and abs(gain) < th.value("reward_rise_min")):
        return None
    return {"reward_ref_median": view.median("reward/mean", view.reference),
            "reward_last_median": view.median("reward/mean", view.last), "reward_gain": gain,
            "reference_steps": view.span(view.reference), "last_steps": view.span(view.last)}


def _plateau_span(view: RunView) -> list[int]:
    return [view.steps[view.reference.start], view.steps[-1]]


# Verdicts that say "no learning signal": a reward that stays flat is their consequence, so the
# plateau verdicts, which would blame the KL coefficient or the grader, are left out beside them.
_NO_LEARNING_SIGNAL = ("dead_learning_signal", "advantage_vanishing", "prompts_too_hard",
                       "prompts_too_easy")


@verdict("reward_plateau_beta_too_large", "warning",
         "reward flat with KL near 0: beta too large (or temperature too low)",
         explained_by=_NO_LEARNING_SIGNAL)
def reward_plateau_beta_too_large(view: RunView) -> Finding | None:
    """A reward plateau with KL's last window under kl_near_zero."""
    plateau = _plateau(view)
    kl_last = view.median("kl/mean", view.last)
    if plateau is None or not (view.has("kl/mean") and kl_last < th.value("kl_near_zero")):
        return None
    return Finding(_plateau_span(view), {"kl_last_median": kl_last, **plateau})


@verdict("reward_plateau_grader_too_loose", "warning",
         "reward flat, KL normal, sample accuracy flat: the grader is too loose",
         explained_by=_NO_LEARNING_SIGNAL)
def reward_plateau_grader_too_loose(view: RunView) -> Finding | None:
    """A reward plateau with KL at work (not under kl_near_zero: that is the other plateau's
    cause) and sample accuracy gaining under acc_flat_abs."""
    plateau = _plateau(view)
    kl_last = view.median("kl/mean", view.last)
    if (plateau is None or not (view.has("eval/sample_acc") and view.has("kl/mean"))
            or kl_last < th.value("kl_near_zero")):
        return None
    acc_gain = view.gain("eval/sample_acc")
    if not acc_gain < th.value("acc_flat_abs"):
        return None
    return Finding(_plateau_span(view),
                   {"kl_last_median": kl_last, "sample_acc_gain": acc_gain, **plateau})


@verdict("loss_without_reward", "warning",
         "loss went down while reward stayed flat: shrinking KL, not learning")
def loss_without_reward(view: RunView) -> Finding | None:
    """A reward plateau while the loss's last window fell more than loss_drop_sd reference
    stddevs under its reference window."""
    plateau = _plateau(view)
    if plateau is None or not view.has("loss"):
        return None
    loss_ref = view.series("loss")[view.reference]
    ref_median, last_median = median(loss_ref), view.median("loss", view.last)
    stddev = float(np.nanstd(loss_ref, ddof=1)) if np.isfinite(loss_ref).sum() > 1 else 0.0
    if not ref_median - last_median > max(th.value("loss_drop_sd") * stddev, 1e-12):
        return None
    return Finding(_plateau_span(view), {"loss_ref_median": ref_median,
                                         "loss_last_median": last_median,
                                         "loss_ref_stddev": stddev, **plateau})


# -- the cluster, per rank, as its cards --------------------------------------------------------


def _each_rank(view: RunView, card: str) -> Finding | None:
    """A declared performance card judged on each rank's own performance steps (declared.judge
    on its readings, checkpoint steps left out as the exporter leaves them out): the ranks it
    fired on, each with its own steps and values; the span covers them all."""
    ranks = {}
    for rank, by_step in sorted(view.data.perf_readings.items()):
        steps = sorted(by_step)
        (hit,) = declared.judge(steps, declared.table(steps, by_step, declared.PERF_READINGS), card).values()
        if hit is not None:
            ranks[str(rank)] = hit
    if not ranks:
        return None
    return Finding([min(h["steps"][0] for h in ranks.values()), max(h["steps"][1] for h in ranks.values())],
                   {"ranks": ranks, "checkpoint_steps_excluded": len(view.checkpoint_steps)})


@verdict("throughput_drop", "warning",
         "samples/s fell on some ranks: look at the cluster, not the curves",
         card="GRPOThroughputDrop")
def throughput_drop(view: RunView) -> Finding | None:
    """GRPOThroughputDrop, per rank: samples/s (or tokens/s) 50-step mean under
    1 - throughput_drop_ratio of its baseline mean, checkpoint steps left out."""
    return _each_rank(view, "GRPOThroughputDrop")


@verdict("step_time_drift", "warning",
         "step time moved away from its reference on some ranks: the cluster changed, not the "
         "model", card="GRPOStepTimeDrift")
def step_time_drift(view: RunView) -> Finding | None:
    """GRPOStepTimeDrift, per rank: the step time's 50-step mean off its baseline mean by more
    than step_time_drift_ratio, either way, checkpoint steps left out."""
    return _each_rank(view, "GRPOStepTimeDrift")


def _at_last_steps(card: str, rows: dict[int, tuple[int, np.ndarray]], reason: str = "") -> dict[str, dict[str, Any]]:
    """A card that compares ranks with one another (its median rank, its count of ranks, the
    lag: the rule engine's), judged once every rank's records are in: each rank's row of
    readings at one step, (step, a row of ``table``'s columns); the ranks it fired for."""
    hits = {}
    for rank, (step, row) in sorted(rows.items()):
        (hit,) = declared.judge([step], row.reshape(1, -1), card, reason).values()
        if hit is not None:
            hits[str(rank)] = hit
    return hits


@verdict("rank_straggler", "warning",
         "a rank's steps take far longer than the other ranks': every rank waits for it at each "
         "gradient sync", card="GRPORankStraggler")
def rank_straggler(view: RunView) -> Finding | None:
    """GRPORankStraggler: a rank's 50-step step time over (1 + straggler_ratio) x the median
    rank's, once straggler_min_ranks ranks have one and the rank's baseline is ready; the median
    and the count of ranks taken from every rank's readings at its last step
    (declared.across_ranks)."""
    last = {rank: max(by_step) for rank, by_step in view.data.perf_readings.items() if by_step}
    rows = declared.across_ranks({rank: view.data.perf_readings[rank][st] for rank, st in last.items()})
    slow = _at_last_steps("GRPORankStraggler", {rank: (last[rank], np.asarray(row)) for rank, row in rows.items()})
    return Finding(view.span(view.last), {"ranks": slow}) if slow else None


@verdict("rank_stalled", "critical", "a rank stopped advancing while the others went on",
         card="GRPORankStalled")
def rank_stalled(view: RunView) -> Finding | None:
    """GRPORankStalled: a rank more than rank_lag_steps behind the run's most advanced rank,
    each rank's lag read from its last step."""
    lasts = {rank: max(by_step) for rank, by_step in view.data.perf.items() if by_step}
    lasts[0] = max(lasts.get(0, view.steps[-1]), view.steps[-1])
    furthest = max(lasts.values())
    rows = {}
    for rank, last in lasts.items():
        row = np.full(len(declared.READINGS), math.nan)
        row[declared.COLUMN[declared.LAG]] = furthest - last
        rows[rank] = (view.steps[-1], row)
    behind = _at_last_steps("GRPORankStalled", rows, "rank_lag")
    if not behind:
        return None
    return Finding(view.span(view.last), {"steps_behind": {rank: int(h["value"]) for rank, h in behind.items()}})


# -- cards judged on the report's windows -------------------------------------------------------


@verdict("kl_tail_outliers", "warning",
         "a few samples carry most of the KL: look for reward-hacking prompts",
         card="GRPOKLTailOutliers")
def kl_tail_outliers(view: RunView) -> Finding | None:
    """GRPOKLTailOutliers: once the baseline is ready, KL's max over its p95 (50-step means)
    over kl_tail_ratio, and over kl_tail_baseline_ratio times that ratio in the baseline."""
    return _found(_declared(view, "GRPOKLTailOutliers"))


@verdict("reward_std_rising", "warning",
         "reward spread kept rising: easy prompts farmed, hard ones abandoned",
         card="GRPORewardStdRising")
def reward_std_rising(view: RunView) -> Finding | None:
    """GRPORewardStdRising: once the baseline is ready, reward/std's mean rising over
    reward_std_rising_windows consecutive windows of rising_window_steps steps, or more."""
    return _found(_declared(view, "GRPORewardStdRising"))


@verdict("group_dominated", "warning", "one response per group dominated the gradient",
         card="GRPOGroupDominated")
def group_dominated(view: RunView) -> Finding | None:
    """GRPOGroupDominated: once the baseline is ready, the within-group reward gap's 50-step
    mean over group_gap_sigmas reward stddevs (50-step mean), and over its baseline mean by
    group_gap_baseline_sigmas baseline stddevs."""
    return _found(_declared(view, "GRPOGroupDominated"))


# -- the cards' own rules, on the cards' own step windows ---------------------------------------


@verdict("kl_explosion", "critical",
         f"KL jumped over {th.value('kl_explosion_ratio'):g}x its baseline (before the baseline: "
         f"its floor, and past {th.value('kl_early_level'):g} nats): the policy is running away "
         "from the reference model", card="GRPOKLExplosion")
def kl_explosion(view: RunView) -> Finding | None:
    """GRPOKLExplosion: KL's short-window p10 over 10x its baseline mean and over 3x its 50-step
    mean 200 steps before; before the baseline, over 10x its floor (or the median of its first
    records, where lower) and over kl_early_level. Once raised, each branch stays while the
    50-step mean is over its line."""
    return _with_branches(_found(_declared(view, "GRPOKLExplosion")),
                          before_baseline=_found(_declared(view, "GRPOKLExplosion", "before_baseline")))


@verdict("entropy_collapse", "critical",
         f"entropy stayed below {th.value('entropy_collapse_ratio'):g}x its initial value in 90% "
         f"of {th.count('early_window_steps')} steps: the policy stopped exploring",
         card="GRPOEntropyCollapse")
def entropy_collapse(view: RunView) -> Finding | None:
    """GRPOEntropyCollapse: entropy's p90 over the short window below 0.1x its initial value;
    or (reason first_records) a cliff in the run's first records."""
    return _with_branches(_found(_declared(view, "GRPOEntropyCollapse")),
                          first_records=_found(_declared(view, "GRPOEntropyCollapse", "first_records")))


@verdict("entropy_explosion", "critical",
         f"entropy stayed above {th.value('entropy_explosion_ratio'):g}x its initial value in 90% "
         f"of {th.count('early_window_steps')} steps: the policy is turning to noise",
         card="GRPOEntropyExplosion")
def entropy_explosion(view: RunView) -> Finding | None:
    """GRPOEntropyExplosion: entropy's p10 over the short window above 5x its initial value; or
    (reason rebound) back above its start and far above the floor it had fallen to."""
    return _with_branches(_found(_declared(view, "GRPOEntropyExplosion")),
                          rebound=_found(_declared(view, "GRPOEntropyExplosion", "rebound")))


@verdict("entropy_rebound", "warning",
         f"entropy stayed above {th.value('entropy_rebound_warn_ratio'):g}x the floor it had "
         f"settled at in 90% of {th.count('early_window_steps')} steps: the policy is leaving "
         "its plateau",
         card="GRPOEntropyRebound")
def entropy_rebound(view: RunView) -> Finding | None:
    """GRPOEntropyRebound: entropy's p10 over the short window above 1.75x its floor, a floor
    between 0.1x and 0.6x its initial value."""
    return _found(_declared(view, "GRPOEntropyRebound"))


@verdict("training_blow_up", "critical",
         f"{th.count('blowup_min_signals')} or more of entropy, KL, grad norm, response length, "
         "reward and the truncated share left the range of their earlier records together within "
         "2 logged records: the run is collapsing", card="GRPOTrainingBlowUp")
def training_blow_up(view: RunView) -> Finding | None:
    """GRPOTrainingBlowUp: at least blowup_min_signals of its signals beyond their earlier
    records together; once raised, held while one signal fewer of the rising ones stays above
    its multiple of its floor. Or its two-signal branches: the crash into the length limit
    (reason truncation_crash) and the slow blow-up on trends (reason trend)."""
    card = "GRPOTrainingBlowUp"
    return _with_branches(_found(_declared(view, card)),
                          truncation_crash=_found(_declared(view, card, "truncation_crash")),
                          trend=_found(_declared(view, card, "trend")))


@verdict("reward_collapse", "critical",
         "reward fell back to the floor from the level the run had reached",
         card="GRPORewardCollapse")
def reward_collapse(view: RunView) -> Finding | None:
    """GRPORewardCollapse: reward's p90 over the sustain window in the lowest quarter of the
    range between the run's floor and working level (its lowest and highest short-window mean
    so far), a range of at least half the largest short-window mean of the reward's
    within-batch stddev so far; where no stddev is logged, reward_range_std_ratio of the range
    between the highest short-window mean of the reward's max and the lowest of its min. Where
    the run logs its mean alone (mean_only), its p90 at or below reward_mean_collapse_ratio of
    its working level, a reward whose lowest short-window mean was never negative."""
    if view.track("reward/mean") is not None and not any(
            view.has(k) for k in ("reward/std", "reward/min", "reward/max")):
        return _found(_declared(view, "GRPORewardCollapse", "mean_only"), {"mean_only": True})
    return _found(_declared(view, "GRPORewardCollapse"))


@verdict("heldout_collapse", "critical",
         f"the held-out score fell under {th.value('heldout_collapse_ratio'):g}x its best in its "
         "last 2 points: what the policy learns no longer transfers", card="GRPOHeldOutCollapse")
def heldout_collapse(view: RunView) -> Finding | None:
    """GRPOHeldOutCollapse: the better of the last 2 held-out points under heldout_collapse_ratio
    of the best so far, and further under it than heldout_noise_factor times the noise."""
    return _found(_declared(view, "GRPOHeldOutCollapse"))


@verdict("reward_over_optimization", "warning",
         "the held-out score fell clearly below its best while the training reward held or rose: "
         "the policy over-optimises its reward", card="GRPORewardOverOptimization")
def reward_over_optimization(view: RunView) -> Finding | None:
    """GRPORewardOverOptimization: the better of the last 2 held-out points more than
    heldout_drop_ratio of the best and heldout_noise_factor times the noise below the best,
    while the training reward's level is at or above its level at the best point; or
    (smoothed) the same on the points' heldout_smooth_points-point means."""
    card = "GRPORewardOverOptimization"
    return _with_branches(_found(_declared(view, card)),
                          smoothed=_found(_declared(view, card, "smoothed")))


@verdict("kl_growth_accelerating", "warning",
         f"KL grew by over {100 * th.value('kl_growth_ratio'):g}% per 100 steps for 300 steps, "
         "and faster lately: the policy keeps drifting", card="GRPOKLGrowthAccelerating")
def kl_growth_accelerating(view: RunView) -> Finding | None:
    """GRPOKLGrowthAccelerating: KL's 100-step mean up by over 20% per 100 steps in each of the
    last three 100-step windows, and the last increment larger than the one 200 steps before."""
    return _found(_declared(view, "GRPOKLGrowthAccelerating"))


@verdict("length_shift", "warning",
         f"response length moved by more than {100 * th.value('length_shift_ratio'):g}% (within "
         "200 steps, or early on against its initial value)", card="GRPOResponseLengthShift",
         # A length surge that reward hacking explains is that verdict's evidence.
         explained_by=("reward_hacking",))
def length_shift(view: RunView) -> Finding | None:
    """GRPOResponseLengthShift: the 50-step mean over the one 200 steps before off 1 by more than
    0.5; before that comparison exists, the short window off the initial length by as much in
    90% of its steps (its p90 below, or its p10 above); or the trend of its last records moved
    by as much, steadily (Mann-Kendall Z beyond trend_z)."""
    card = "GRPOResponseLengthShift"
    return _branches(within_200_steps=_declared(view, card),
                     against_initial=_declared(view, card, "against_initial"),
                     trend=_declared(view, card, "trend"))


@verdict("completions_truncated", "warning",
         f"over {100 * th.value('truncated_ratio'):g}% of the completions were cut at the length "
         f"limit in 90% of {th.count('early_window_steps')} steps", card="GRPOCompletionsTruncated")
def completions_truncated(view: RunView) -> Finding | None:
    """GRPOCompletionsTruncated: the truncated share's p10 over the short window above 0.9."""
    return _found(_declared(view, "GRPOCompletionsTruncated"))


@verdict("reward_quantile_extreme", "warning", "a reward quantile fell far below its baseline",
         card="GRPORewardQuantileExtreme")
def reward_quantile_extreme(view: RunView) -> Finding | None:
    """GRPORewardQuantileExtreme, downward only: once the baseline is ready, a reward quantile's
    50-step mean below its baseline mean - 3 baseline stddevs, or fallen by more than 3 of them
    below its 50-step mean 200 steps before."""
    return _found(_declared(view, "GRPORewardQuantileExtreme"))


@verdict("dead_learning_signal", "warning",
         "from the first steps, nearly every prompt group had equal rewards (or the whole batch "
         "did): nothing to learn from", card="GRPOAdvantageVanishing")
def dead_learning_signal(view: RunView) -> Finding | None:
    """GRPOAdvantageVanishing from the first steps (reasons dead_groups, reward_constant,
    saturated, mean_constant): the short-window mean of the zero-std group share over 0.9;
    reward/std 0 in 90% of the short window; the reward pinned at its working level with almost
    no spread; or, where no spread is logged, the mean reward the same value in 90% of the
    sustain window."""
    std = view.track("reward/std")
    saturated = _declared(view, "GRPOAdvantageVanishing", "saturated")
    mean_constant = _declared(view, "GRPOAdvantageVanishing", "mean_constant")
    dead = _declared(view, "GRPOAdvantageVanishing", "dead_groups")
    if dead is not None and (zero := view.track("group/zero_std_frac")) is not None:
        dead["zero_std_share_run_mean"] = float(zero.values.mean())
    constant = _declared(view, "GRPOAdvantageVanishing", "reward_constant")
    if constant is not None and std is not None:
        constant.update(steps_with_reward_std_0=int((std.values <= 0).sum()),
                        steps_logged=int(std.values.size))
    return _branches(dead_groups=dead, reward_constant=constant, saturated=saturated,
                     mean_constant=mean_constant)


@verdict("advantage_vanishing", "warning",
         "after the baseline, most groups had equal rewards or |advantage| shrank: advantages "
         "vanished", card="GRPOAdvantageVanishing")
def advantage_vanishing(view: RunView) -> Finding | None:
    """GRPOAdvantageVanishing once the baseline is ready: the zero-std group share over 0.5 in
    90% of 50 steps, or |advantage| under 0.2x its baseline mean in 90% of 50 steps."""
    hits = _declared_each(view, "GRPOAdvantageVanishing")
    return _branches(zero_std_share=hits["group/zero_std_frac"], advantage_small=hits["adv/mean_abs"])


@verdict("grad_norm_spike", "warning",
         f"grad norm stayed over {th.value('grad_norm_spike_ratio'):g}x its baseline in 90% of "
         f"{th.count('sustain_steps')} steps", card="GRPOGradNormSpike")
def grad_norm_spike(view: RunView) -> Finding | None:
    """GRPOGradNormSpike: once the baseline is ready, grad norm's p10 over 50 steps above 5x its
    baseline mean."""
    return _found(_declared(view, "GRPOGradNormSpike"))


# -- the cards of the newer RL stacks' signals: rollout vs trainer, staleness, dead groups by
# cause, the entropy's driver, the length bias, the entropy-reward law, prompt types.


@verdict("rollout_mismatch", "warning",
         f"the rollout engine and the trainer disagree on the policy (KL over "
         f"{th.value('mismatch_kl'):g}, chi-square over {th.value('mismatch_chi2_token'):g}, mean "
         f"importance weight outside [{th.value('mismatch_is_weight_low'):g}, "
         f"{th.value('mismatch_is_weight_high'):g}] or effective sample share under "
         f"{th.value('mismatch_ess_ratio'):g}): the gradient is for a policy the samples did not "
         "come from", card="GRPORolloutMismatch")
def rollout_mismatch(view: RunView) -> Finding | None:
    """GRPORolloutMismatch (reasons kl, chi2_token, is_weight, ess): in 90% of the short window,
    the rollout-to-trainer KL over mismatch_kl, the per-token chi-square over
    mismatch_chi2_token, the mean importance weight outside [mismatch_is_weight_low, _high], or
    the weights' effective sample share under mismatch_ess_ratio."""
    return _branches(**{b.reason: _declared(view, "GRPORolloutMismatch", b.reason)
                        for b in CARDS_BY_NAME["GRPORolloutMismatch"].branches})


@verdict("rollout_mismatch_rising", "warning",
         f"a rollout-vs-trainer mismatch rose past {th.value('mismatch_rise_ratio'):g}x its start "
         "and is still rising: precision drift, a stale weight sync or a growing lag",
         card="GRPORolloutMismatchRising")
def rollout_mismatch_rising(view: RunView) -> Finding | None:
    """GRPORolloutMismatchRising: a mismatch signal's 50-step p10 over mismatch_rise_ratio x its
    initial value and over mismatch_rise_floor, while its 50-step slope is still positive; or
    (``trend_<signal>``) its short-window mean over that line while the exporter's trend of its
    last records rises steadily (Z >= trend_z). Each signal's evidence under its name."""
    card = "GRPORolloutMismatchRising"
    return _branches(**{key.split("/", 1)[1]: hit for key, hit in _declared_each(view, card).items()},
                     **{"trend_" + key.split("/", 1)[1]: hit
                        for key, hit in _declared_each(view, card, "trend").items()})


@verdict("stale_rollouts", "warning",
         f"the trained trajectories were over {th.value('staleness_steps'):g} policy versions old "
         "on average: the rollout side has fallen behind", card="GRPOStaleRollouts")
def stale_rollouts(view: RunView) -> Finding | None:
    """GRPOStaleRollouts: the trajectories' mean age over staleness_steps policy versions in 90%
    of the short window."""
    return _found(_declared(view, "GRPOStaleRollouts"))


def _dead_cause(view: RunView, card: str) -> Finding | None:
    (signal,) = declared.LOGIC[card, ""].keys
    return _found(_declared(view, card), {"signal": signal})


@verdict("prompts_too_hard", "warning",
         f"over {100 * th.value('dead_group_cause_ratio'):g}% of the prompt groups had every "
         "answer wrong: the prompts are too hard for the policy (easier prompts, a curriculum)",
         card="GRPOPromptsTooHard")
def prompts_too_hard(view: RunView) -> Finding | None:
    """GRPOPromptsTooHard: over dead_group_cause_ratio of the groups all wrong in 90% of the
    short window."""
    return _dead_cause(view, "GRPOPromptsTooHard")


@verdict("prompts_too_easy", "warning",
         f"over {100 * th.value('dead_group_cause_ratio'):g}% of the prompt groups had every "
         "answer right: the prompts are solved (drop them, dynamic sampling)",
         card="GRPOPromptsTooEasy")
def prompts_too_easy(view: RunView) -> Finding | None:
    """GRPOPromptsTooEasy: over dead_group_cause_ratio of the groups all right in 90% of the
    short window."""
    return _dead_cause(view, "GRPOPromptsTooEasy")


@verdict("entropy_covariance_surge", "warning",
         f"the covariance of token log-probability and advantage rose over "
         f"{th.value('entropy_cov_ratio'):g}x its start: it drives entropy down, a collapse is "
         "coming", card="GRPOEntropyCovarianceSurge")
def entropy_covariance_surge(view: RunView) -> Finding | None:
    """GRPOEntropyCovarianceSurge: the covariance of the sampled tokens' log-probability and
    advantage positive and over entropy_cov_ratio x its (positive) initial value in 90% of the
    short window, while entropy's 50-step trend is down by over entropy_cov_fall_ratio of its
    initial value."""
    return _found(_declared(view, "GRPOEntropyCovarianceSurge"))


@verdict("length_bias", "warning",
         f"wrong answers grew over {100 * th.value('length_bias_growth_ratio'):g}% longer while "
         f"right ones grew under {100 * th.value('length_bias_correct_ratio'):g}%: the loss's "
         "length normalisation favours long wrong answers", card="GRPOLengthBias")
def length_bias(view: RunView) -> Finding | None:
    """GRPOLengthBias: the incorrect responses' 50-step mean length grown by over
    length_bias_growth_ratio of its initial value, while the correct ones' grew by under
    length_bias_correct_ratio."""
    return _found(_declared(view, "GRPOLengthBias"))


@verdict("reward_ceiling_near", "warning",
         f"entropy is nearly spent: the entropy-reward law leaves under "
         f"{100 * th.value('ceiling_headroom_ratio'):g}% of the reward gain it promised at the "
         "start; more steps buy little", card="GRPORewardCeilingNear")
def reward_ceiling_near(view: RunView) -> Finding | None:
    """GRPORewardCeilingNear: by the entropy-reward law fitted on the run so far (R² at least
    forecast_min_r2, a > 0), the reward still to gain is under ceiling_headroom_ratio of what it
    was at the start, and entropy is still falling (not collapsed)."""
    return _found(_declared(view, "GRPORewardCeilingNear"))


@verdict("shortcut_learning", "warning",
         f"a prompt type's 50-step reward fell {th.value('shortcut_delta'):g} or more below its "
         "start (or its level 200 steps before) while one that was higher then rose as much: easy "
         "types up, hard ones down, the model takes shortcuts", card="GRPOShortcutLearning")
def shortcut_learning(view: RunView) -> Finding | None:
    """GRPOShortcutLearning, per prompt type's reward (the records' by_type): branch
    `against_initial`, a type's 50-step mean shortcut_delta or more below its initial value
    while a type that started higher rose by as much over its own; branch `within_200_steps`,
    the same against each type's 50-step mean 200 steps before. Its evidence names the falling
    types (``prompt_types``)."""
    card = "GRPOShortcutLearning"
    return _branches(against_initial=_declared(view, card, "against_initial"),
                     within_200_steps=_declared(view, card, "within_200_steps"))


# -- nothing found ----------------------------------------------------------------------------


@verdict("healthy", "info", "reward rises, KL stays bounded, nothing sick was found", alone=True)
def healthy(view: RunView) -> Finding:
    """No other verdict: the reward and KL medians of the reference and last windows."""
    evidence: dict[str, Any] = {"reward_ref_median": view.median("reward/mean", view.reference),
                                "reward_last_median": view.median("reward/mean", view.last)}
    if view.has("kl/mean"):
        evidence.update(kl_ref_median=view.median("kl/mean", view.reference),
                        kl_last_median=view.median("kl/mean", view.last))
    return Finding(view.whole, evidence)

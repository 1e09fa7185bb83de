"""What every card needs to be able to fire: the signals each rule reads, and what else it waits for.

A card is *armed* on a run when it could fire there now: the run logs the signals one of its rule
branches reads, has the ranks that branch compares, and is past the baseline period if the
branch waits for it. Otherwise it is disarmed, for one reason:

* ``missing_signal``: the run logs none, or too few, of the keys the card reads (``needs`` names
  them; docs/metrics.md lists the aliases each key is also read under);
* ``baseline_pending``: the run logs what the card reads, but the card waits for the baseline
  period (``steps_to_go`` steps more);
* ``not_applicable``: the card compares what the run does not have (ranks with one another,
  prompt types, GPUs).

This table is the one place those inputs are written down: the exporter's armed table
(``grpo_card_armed``), ``grpo-monitor check``, the report's "could not judge" list, the coverage
rules (``prometheus/rules/grpo-coverage.yml``, written by :func:`render`) and
docs/coverage.md (``tools/coverage_doc.py``) all read it, and a test fails when a rule of
prometheus/rules/ reads a signal its card's declaration does not list (or lists one it does not
read). Adding a card is one :class:`Card` entry here next to its rule, then ``make docs``.

Standard library only: the trainer side may import it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Literal

from grpo_monitor.contract import thresholds
from grpo_monitor.contract.card_logic import (
    ANY_KEY,
    Agg,
    AnyOf,
    Const,
    Expr,
    Func,
    Held,
    Lag,
    Level,
    Line,
    Logged,
    Logic,
    Ready,
    Rule,
    Series,
    Threshold,
    above,
    below,
    mean_above,
)

Severity = Literal["critical", "warning"]
Reason = Literal["armed", "missing_signal", "baseline_pending", "not_applicable"]
# Closest to firing first: a disarmed card with several branches reports its nearest one.
REASONS: tuple[Reason, ...] = ("armed", "baseline_pending", "missing_signal", "not_applicable")


@dataclass(frozen=True)
class Branch:
    """One rule of a card (its ``reason`` label), or one alternative within a rule.

    ``keys``: the canonical keys it reads; it needs ``at_least`` of them (all, by default).
    ``baseline``: it waits for the baseline period. ``min_ranks``: ranks logging those keys (or
    any ranks, for a branch without keys) it needs at least. ``prompt_types``: prompt types of
    a record's ``by_type`` it compares. ``gpu``: it reads the GPUs the run's ranks train on
    (the ranks must report their GPU uuid). ``indirect``: keys it reads through a derived
    feature rather than by name (the entropy-reward law's fit reads the reward).
    ``unless_logged``: keys whose presence hands the run to another branch (a path for runs that
    log less: the mean reward's collapse where no spread is logged); such a branch is not
    applicable to a run that logs any of them. ``logic``: the branch's logic, where it is
    declared (contract/card_logic.py): its rule's expression is rendered from it and the report
    evaluates it; see ``_level``.
    """

    keys: tuple[str, ...] = ()
    at_least: int | None = None
    baseline: bool = False
    min_ranks: int = 1
    prompt_types: int = 0
    gpu: bool = False
    reason: str = ""
    indirect: tuple[str, ...] = ()
    unless_logged: tuple[str, ...] = ()
    logic: Logic | None = None

    @property
    def needed(self) -> int:
        return len(self.keys) if self.at_least is None else self.at_least

    @property
    def all_keys(self) -> tuple[str, ...]:
        return (*self.keys, *self.indirect)


@dataclass(frozen=True)
class Card:
    """An alert of prometheus/rules/ (``rule_file``) and the branches any one of which arms it."""

    name: str
    severity: Severity
    rule_file: str
    branches: tuple[Branch, ...]
    # About the exporter or the node, not the run's signals: armed whenever the run is there.
    always: bool = False

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key any branch reads, in declaration order."""
        return tuple(dict.fromkeys(k for b in self.branches for k in b.all_keys))


ALERTS = "grpo-alerts.yml"
CLUSTER = "grpo-cluster.yml"
COVERAGE = "grpo-coverage.yml"
_B = Branch
SHORT = thresholds.count("early_window_steps")  # 20 steps: the level cards' window
SUSTAIN = thresholds.count("sustain_steps")  # 50 steps: a sustained level


def _level(logic: Logic, reason: str = "") -> Branch:
    """A branch whose logic is declared (a level, or levels any one of which fires): it reads
    their keys (any one of several) and waits for the baseline where the logic does."""
    keys = logic.keys
    return Branch(keys, at_least=1 if len(keys) > 1 else None, baseline=logic.baseline,
                  reason=reason, logic=logic)


def _rule(rule: Rule, reason: str = "", *, at_least: int | None = None,
          unless_logged: tuple[str, ...] = (), indirect: tuple[str, ...] = (),
          keys: tuple[str, ...] | None = None, baseline: bool | None = None,
          prompt_types: int = 0) -> Branch:
    """A branch declared as an expression: it reads the keys its series read (all of them, or
    ``at_least``), bar those whose presence hands the run to another branch and those it reads
    through a derived feature; ``keys``: an alternative of a rule that reads either of two sets
    (each its own branch, the rule the same). ``baseline``: it waits for the baseline through a
    series published only once it is ready (a baseline mean), not through the rule's gate."""
    if keys is None:
        keys = tuple(k for k in rule.keys if k not in unless_logged and k not in indirect)
    return Branch(keys, at_least=at_least, baseline=rule.baseline if baseline is None else baseline,
                  reason=reason, prompt_types=prompt_types, unless_logged=unless_logged,
                  indirect=indirect, logic=rule)


LOOKBACK = thresholds.count("lookback_steps")  # 200 steps: "within 200 steps"
T = Threshold


def _mean(key: str | tuple[str, ...], window: int = SUSTAIN, back: int = 0) -> Series:
    """The signal's window mean, ``back`` steps before the newest."""
    return Series("mean", key, window, back)


def _max(e: Expr, keep_key: bool = False) -> Agg:
    """One sample a rank: the highest of ``e``'s (the key kept, with ``keep_key``)."""
    return Agg("max", e, keep_key)


def _mean_of_types(back: int = 0) -> Series:
    """Each prompt type's 50-step mean reward, ``back`` steps before the newest."""
    return Series("type_mean", REWARD, SUSTAIN, back)


def _shortcut(reference: Series) -> Rule:
    """The shortcut card against ``reference`` (each type's own): a type fallen by
    shortcut_delta below it while the highest reference of the types that rose by as much is
    above its own."""
    delta = T("shortcut_delta")
    rose = Agg("rank_max", reference & ((_mean_of_types() - reference) >= delta))
    return Rule(_max((((reference - _mean_of_types()).named("fall")) >= delta)
                     & (reference < rose.named("reference_of_a_rising_type"))))


def _held(feature: str) -> Series:
    """A feature of the held-out score's judgement (runtime/signals.HeldOutTracker)."""
    return Series(f"heldout_{feature}", "eval/heldout_score")


def _rose(keys: str | tuple[str, ...], ratio: str) -> Expr:
    """The blow-up's rise: the last 2 records' lowest over ``ratio`` x the median of the 10
    records before the 5 newest, and over their highest."""
    return (Series("records_min", keys, 2, 0) > Series("records_median", keys, 10, 5) * T(ratio)) \
        > Series("records_max", keys, 10, 5)


def _fell(key: str) -> Expr:
    """The last 2 records' highest under the lowest of the 10 before the 5 newest."""
    return Series("records_max", key, 2, 0) < Series("records_min", key, 10, 5)


def _trend_up(keys: str | tuple[str, ...], factor: str) -> Expr:
    """The trend of the last records climbed by ``factor``, steadily (Mann-Kendall Z)."""
    return (Series("trend_factor", keys) >= T(factor)) & \
        (Series("trend_z", keys) >= T("trend_z"))


KL, ENTROPY, REWARD, LENGTH, CLIPPED = ("kl/mean", "entropy/mean", "reward/mean",
                                       "response/len_mean", "response/clip_ratio")
# The blow-up's signals that rise (the length and the truncated share by their own factors).
BLOWUP_RISING = ("entropy/mean", "kl/mean", "grad/norm")
# KL's line before the baseline: its floor, or the median of its first records where lower (or
# the only one there is), times kl_explosion_ratio.
_KL_EARLY_LINE = ((Series("floor", KL) < Series("first_median", KL)) | Series("first_median", KL)
                  | Series("floor", KL)) * T("kl_explosion_ratio")
_KL_LINE = Series("baseline", KL) * T("kl_explosion_ratio")
_REWARD_SPAN = Series("ceiling", REWARD) - Series("floor", REWARD)
_REWARD_COLLAPSE = Rule(
    _max(Series("p90", REWARD, SUSTAIN) < Series("floor", REWARD) + _REWARD_SPAN * T("reward_collapse_ratio"))
    & (_max(_REWARD_SPAN)
       > (_max(Series("ceiling", "reward/std") * T("reward_collapse_spread_ratio"))
          | _max((Series("ceiling", "reward/max") - Series("floor", "reward/min"))
                 * T("reward_range_std_ratio") * T("reward_collapse_spread_ratio")))))
STEP_TIME, THROUGHPUT = "perf/step_time_s", ("perf/samples_per_s", "perf/tokens_per_s")
COVARIANCE = "entropy/logp_adv_cov"
WRONG_LENGTH, RIGHT_LENGTH = "response/len_incorrect_mean", "response/len_correct_mean"
_QUANTILES = ("reward/p25", "reward/p50", "reward/p75", "reward/p95")
_ACCURACY = "eval/sample_acc"
_TRUNCATED_LEVEL = T("blowup_truncated_ratio")


# The rollout-vs-trainer mismatches whose slow rise GRPORolloutMismatchRising follows.
MISMATCH_RISING = ("mismatch/kl", "mismatch/k3_kl", "mismatch/logprob_diff_mean")


CARDS: tuple[Card, ...] = (
    # -- red cards ------------------------------------------------------------------------------
    # Any key the trainer logs, its unknown ones too; the description names each with the step
    # its streak began.
    Card("GRPONonFiniteValues", "critical", ALERTS, (
        _rule(Rule(Agg("count", Series("nonfinite", ANY_KEY) > 0),
                   evidence=(Series("nonfinite_since", ANY_KEY),))),), always=True),
    # Raised by the short window's p10 past both lines, held while the 50-step mean stays over
    # the line (the card's own ALERTS).
    Card("GRPOKLExplosion", "critical", ALERTS, (
        _rule(Rule(_max(((Series("p10", KL, SHORT) > _KL_LINE)
                         & (Series("p10", KL, SHORT) > _mean(KL, back=LOOKBACK) * T("kl_jump_ratio")))
                        | ((_mean(KL) > _KL_LINE) & Held())), baseline=True)),
        _rule(Rule(_max(((Series("p10", KL, SHORT) > _KL_EARLY_LINE) > T("kl_early_level")).unless(Ready())
                        | (((_mean(KL) > _KL_EARLY_LINE) > T("kl_early_level")) & Held()))),
              "before_baseline"))),
    Card("GRPOEntropyCollapse", "critical", ALERTS, (
        _level(Level("entropy/mean", SHORT, (below("entropy_collapse_ratio", "initial"),))),
        # Each of the last 3 records under the line from the first 3: raised while the run has
        # logged at most first_records_judged steps, held while the records stay under it.
        _rule(Rule(_max(Series("records_max", ENTROPY, 3, 0)
                        < Series("first_median", ENTROPY) * T("entropy_collapse_ratio"), keep_key=True)
                   & ((Logged() <= T("first_records_judged")) | Agg("run_max", Held()))),
              "first_records"))),
    Card("GRPOEntropyExplosion", "critical", ALERTS, (
        _level(Level("entropy/mean", SHORT, (above("entropy_explosion_ratio", "initial"),))),
        # Back above its start and far above the floor it had fallen to: a collapse that
        # rebounds into an explosion never reaches 5x its start.
        _level(Level("entropy/mean", SHORT, (above("entropy_rebound_ratio", "floor"),), gates=(
            Line("p10", ">", reference="initial"),
            Line("floor", "<", "entropy_rebound_floor_ratio", reference="initial"))), "rebound"))),
    # blowup_min_signals of its signals out of the range of their earlier records together (the
    # truncated share only above blowup_truncated_ratio); held while one fewer of the rising
    # ones stays over its factor times its floor.
    Card("GRPOTrainingBlowUp", "critical", ALERTS, (
        _rule(Rule((Agg("count", _rose(BLOWUP_RISING, "blowup_ratio") | _rose(LENGTH, "blowup_length_ratio")
                        | _fell(REWARD) | (_rose(CLIPPED, "blowup_ratio") > _TRUNCATED_LEVEL))
                    >= T("blowup_min_signals"))
                   | ((Agg("count", (Series("records_min", BLOWUP_RISING, 2, 0)
                                     > Series("floor", BLOWUP_RISING) * T("blowup_ratio"))
                           | (Series("records_min", LENGTH, 2, 0)
                              > Series("floor", LENGTH) * T("blowup_length_ratio")))
                       >= T("blowup_min_signals") - 1) & Held())),
              at_least=thresholds.count("blowup_min_signals")),
        # Two signals suffice where they are these two: the reward at a new low while the
        # truncated share reaches a new high above half (a crash into the length limit); held
        # while the truncated share stays above that.
        _rule(Rule((_max((Series("records_min", CLIPPED, 2, 0) > Series("records_max", CLIPPED, 10, 5))
                         > _TRUNCATED_LEVEL) & _max(_fell(REWARD)))
                   | (_max(Series("records_min", CLIPPED, 2, 0) > _TRUNCATED_LEVEL) & Held())),
              "truncation_crash"),
        # The reward falling steadily while another signal climbs steadily or pins at the cap:
        # judged on the trend of the last records (runtime/trend.py), no baseline, no initial;
        # held while the reward's short-window mean stays that low against its working level.
        _rule(Rule((_max((Series("trend_factor", REWARD) <= T("blowup_trend_reward_factor"))
                         & (Series("trend_z", REWARD) <= Const(0) - T("trend_z")))
                    & Agg("count", _trend_up(BLOWUP_RISING, "blowup_ratio")
                          | _trend_up(LENGTH, "blowup_length_ratio")
                          | (Series("p10", CLIPPED, SHORT) >= T("truncated_ratio"))))
                   | ((_max(_mean(REWARD, SHORT)) / _max(Series("ceiling", REWARD) > 0)
                       <= T("blowup_trend_reward_factor")) & Held())),
              "trend", at_least=2))),
    # The reward's spread, or its range where the run logs no spread (verl's default).
    # The reward's 50-step p90 in the lowest quarter of the range between its floor and working
    # level, a range of at least half its largest spread (the stddev's highest 20-step mean, or
    # reward_range_std_ratio of the max's highest less the min's lowest).
    Card("GRPORewardCollapse", "critical", ALERTS, (
        _rule(_REWARD_COLLAPSE, keys=("reward/mean", "reward/std")),
        _rule(_REWARD_COLLAPSE, keys=("reward/mean", "reward/min", "reward/max")),
        # A run that logs its mean reward and nothing beside it: its p90 fallen to a fraction
        # of its best working level (a level that never went below 0).
        _rule(Rule((_max(Series("p90", REWARD, SUSTAIN) <= Series("ceiling", REWARD)
                         * T("reward_mean_collapse_ratio"))
                    & (_max(Series("ceiling", REWARD)) > 0) & (_max(Series("floor", REWARD)) >= 0))
                   .unless(Series("ceiling", ("reward/std", "reward/min", "reward/max")))),
              "mean_only", unless_logged=("reward/std", "reward/min", "reward/max")))),
    # The better of the last 2 held-out points under heldout_collapse_ratio of the best (a
    # positive best), further under it than heldout_noise_factor x the points' noise.
    Card("GRPOHeldOutCollapse", "critical", ALERTS, (
        _rule(Rule((_held("recent") < _held("best") * T("heldout_collapse_ratio"))
                   & (_held("best") - _held("recent") > _held("noise") * T("heldout_noise_factor"))
                   & (_held("best") > 0) & (_held("points") >= T("heldout_min_points")))),)),
    Card("GRPORankStalled", "critical", ALERTS, (
        replace(_rule(Rule(Lag() > T("rank_lag_steps")), "rank_lag"), min_ranks=2),)),
    Card("GRPORunHung", "critical", CLUSTER, (_B(),), always=True),
    Card("GRPOGPUXidError", "critical", CLUSTER, (_B(gpu=True),)),
    # -- yellow cards ---------------------------------------------------------------------------
    # KL's 100-step mean up by over kl_growth_ratio on the one before, in each of the last three
    # 100-step windows, and the last increment larger than the one 200 steps before.
    Card("GRPOKLGrowthAccelerating", "warning", ALERTS, (
        _rule(Rule(_max(Series("least_growth", KL, 100) > T("kl_growth_ratio"))
                   & ((_mean(KL, 100, 0) - _mean(KL, 100, 100)) - (_mean(KL, 100, 200) - _mean(KL, 100, 300))
                      > 0), baseline=True)),)),
    # KL's max over its p95 (50-step means) past kl_tail_ratio, and past that ratio in the
    # baseline times kl_tail_baseline_ratio.
    Card("GRPOKLTailOutliers", "warning", ALERTS, (
        _rule(Rule(_max(_mean("kl/max") > _mean("kl/p95") * T("kl_tail_ratio"))
                   & (_max(_mean("kl/max") / _mean("kl/p95"))
                      > _max(Series("baseline", "kl/max") / Series("baseline", "kl/p95"))
                      * T("kl_tail_baseline_ratio")), baseline=True)),)),
    Card("GRPORewardHackingSuspected", "warning", ALERTS, (
        # The length's 50-step mean over hacking_length_ratio x the one 200 steps before while
        # the reward rose.
        _rule(Rule(_max(_mean(LENGTH) / _mean(LENGTH, back=LOOKBACK) > T("hacking_length_ratio"))
                   & (_mean(REWARD) - _mean(REWARD, back=LOOKBACK) > 0), baseline=True),
              "length_surge"),
        # The reward up by hacking_reward_sigmas baseline stddevs within 200 steps while the
        # accuracy moved by under hacking_accuracy_sigmas of its own.
        _rule(Rule(_max(_mean(REWARD) - _mean(REWARD, back=LOOKBACK)
                        > Series("stddev", REWARD) * T("hacking_reward_sigmas"))
                   & (Func("abs", _mean(_ACCURACY) - _mean(_ACCURACY, back=LOOKBACK))
                      < Series("stddev", _ACCURACY) * T("hacking_accuracy_sigmas")), baseline=True),
              "flat_accuracy"),
        # The same, before any baseline: the reward's trend against the accuracy's.
        _rule(Rule(_max(_trend_up(REWARD, "hacking_trend_reward_factor"))
                   & (Series("trend_z", _ACCURACY) < T("hacking_trend_accuracy_z"))), "trend"))),
    Card("GRPOResponseLengthShift", "warning", ALERTS, (
        # The 50-step mean off the one 200 steps before by over length_shift_ratio.
        _rule(Rule(_max(Func("abs", _mean(LENGTH) / _mean(LENGTH, back=LOOKBACK) - 1)
                        > T("length_shift_ratio")), baseline=True)),
        # Before that exists: the short window off the initial length by as much in 90% of it.
        _rule(Rule(_max(Func("abs", ((((Series("p90", LENGTH, SHORT) / Series("initial", LENGTH)) < 1)
                                      | ((Series("p10", LENGTH, SHORT) / Series("initial", LENGTH)) > 1))
                                     .named("ratio_to_initial")) - 1) > T("length_shift_ratio"))
                   .unless(_mean(LENGTH, back=LOOKBACK))), "against_initial"),
        # The trend of its last records moved by as much, steadily.
        _rule(Rule(_max(((Series("trend_factor", LENGTH) >= Const(1) + T("length_shift_ratio"))
                         & (Series("trend_z", LENGTH) >= T("trend_z")))
                        | ((Series("trend_factor", LENGTH) <= Const(1) - T("length_shift_ratio"))
                           & (Series("trend_z", LENGTH) <= Const(0) - T("trend_z"))))), "trend"))),
    Card("GRPOCompletionsTruncated", "warning", ALERTS, (
        _level(Level("response/clip_ratio", SHORT, (above("truncated_ratio"),))),)),
    # The better of the last 2 held-out points more than heldout_drop_ratio of the best and
    # heldout_noise_factor x the noise below it, while the reward's 20-step mean holds at its
    # level at the best point; or (smoothed) the same on the points' 3-point means, the reward
    # within heldout_reward_hold_ratio of its level there.
    Card("GRPORewardOverOptimization", "warning", ALERTS, (
        _rule(Rule((_held("best") - _held("recent") > Func("abs", _held("best")) * T("heldout_drop_ratio"))
                   & (_held("best") - _held("recent") > _held("noise") * T("heldout_noise_factor"))
                   & (_held("points") >= T("heldout_min_points"))
                   & (_max(_mean(REWARD, SHORT)) >= _held("reward_at_best")))),
        _rule(Rule((_held("smoothed_best") - _held("smoothed_recent")
                    > Func("abs", _held("smoothed_best")) * T("heldout_drop_ratio"))
                   & (_held("smoothed_best") - _held("smoothed_recent")
                      > _held("noise") / Func("sqrt", T("heldout_smooth_points")) * T("heldout_noise_factor"))
                   & (_held("points") >= T("heldout_min_points"))
                   & (_max(_mean(REWARD, SHORT)) >= _held("reward_at_smoothed_best")
                      - Func("abs", _held("reward_at_smoothed_best")) * T("heldout_reward_hold_ratio"))),
              "smoothed"))),
    Card("GRPORewardStdRising", "warning", ALERTS, (
        _level(Level("reward/std", 0, (Line("rising", ">=", "reward_std_rising_windows"),),
                     baseline=True)),)),
    # A quantile's 50-step mean below its baseline by reward_quantile_sigmas baseline stddevs,
    # or fallen by as many within 200 steps.
    Card("GRPORewardQuantileExtreme", "warning", ALERTS, (
        _rule(Rule(_max((_mean(_QUANTILES) < Series("baseline", _QUANTILES) - Series("stddev", _QUANTILES)
                         * T("reward_quantile_sigmas"))
                        | (_mean(_QUANTILES) - _mean(_QUANTILES, back=LOOKBACK)
                           < Series("stddev", _QUANTILES) * Const(-1) * T("reward_quantile_sigmas")),
                        keep_key=True), baseline=True), at_least=1),)),
    Card("GRPOAdvantageVanishing", "warning", ALERTS, (
        _level(Level("group/zero_std_frac", SHORT, (mean_above("dead_signal_zero_std_ratio"),)),
               "dead_groups"),
        _level(Level("reward/std", SHORT, (Line("p90", "<=", constant=0),)), "reward_constant"),
        # The reward pinned near its best working level with almost no spread.
        _rule(Rule(_max(_mean("reward/std", SHORT) < (_mean(REWARD, SHORT) > 0)
                        * T("reward_saturation_std_ratio"))
                   & _max(Series("p10", REWARD, SHORT) >= Series("ceiling", REWARD)
                          * T("reward_saturation_level_ratio"))), "saturated"),
        # The mean reward alone: the same value step after step (exactly 0, or the top).
        _rule(Rule(_max(Series("p90", REWARD, SUSTAIN).eq(Series("p10", REWARD, SUSTAIN)))
                   .unless(Series("ceiling", "reward/std"))),
              "mean_constant", unless_logged=("reward/std",)),
        _level(AnyOf((Level("group/zero_std_frac", SUSTAIN, (above("zero_std_group_ratio"),)),
                      Level("adv/mean_abs", SUSTAIN, (below("advantage_vanishing_ratio", "baseline"),))),
                     baseline=True)))),
    # The within-group reward gap over group_gap_sigmas reward stddevs, and over its baseline
    # by group_gap_baseline_sigmas baseline stddevs (50-step means).
    Card("GRPOGroupDominated", "warning", ALERTS, (
        _rule(Rule(_max(_mean("group/reward_gap") > _mean("reward/std") * T("group_gap_sigmas"))
                   & (_mean("group/reward_gap") > Series("baseline", "group/reward_gap")
                      + Series("stddev", "group/reward_gap") * T("group_gap_baseline_sigmas")),
                   baseline=True)),)),
    Card("GRPOGradNormSpike", "warning", ALERTS, (
        _level(Level("grad/norm", SUSTAIN, (above("grad_norm_spike_ratio", "baseline"),),
                     baseline=True)),)),
    # The performance cards judge every rank, also those that log no training signal (whose
    # run_rank:grpo_baseline_ready:training never is): they wait for the baseline through the
    # ratio of the 50-step mean to the baseline mean, published once the baseline is ready (one
    # series a rank: a rule joining the mean to the baseline cost twice as much at 16,384 ranks).
    # The step time off its baseline by over step_time_drift_ratio either way; samples/s (or
    # tokens/s) under 1 - throughput_drop_ratio of its baseline.
    Card("GRPOStepTimeDrift", "warning", ALERTS, (
        _rule(Rule(_max(Func("abs", Series("baseline_ratio", STEP_TIME, SUSTAIN).named("ratio") - 1)
                        > T("step_time_drift_ratio"))), baseline=True),)),
    Card("GRPOThroughputDrop", "warning", ALERTS, (
        _rule(Rule(_max(Series("baseline_ratio", THROUGHPUT, SUSTAIN).named("ratio")
                        < Const(1) - T("throughput_drop_ratio"), keep_key=True)),
              at_least=1, baseline=True),)),
    Card("GRPORolloutMismatch", "warning", ALERTS, (
        _level(Level("mismatch/kl", SHORT, (above("mismatch_kl"),)), "kl"),
        _level(Level("mismatch/chi2_token", SHORT, (above("mismatch_chi2_token"),)), "chi2_token"),
        _level(Level("mismatch/is_weight_mean", SHORT, (below("mismatch_is_weight_low"),
                                                        above("mismatch_is_weight_high"))),
               "is_weight"),
        _level(Level("mismatch/is_ess_ratio", SHORT, (below("mismatch_ess_ratio"),)), "ess"))),
    # Past mismatch_rise_ratio x its start and over the floor while its slope is still positive;
    # or (trend) the short window's mean past that line while its records rise steadily.
    Card("GRPORolloutMismatchRising", "warning", ALERTS, (
        _level(Level(MISMATCH_RISING, SUSTAIN, (above("mismatch_rise_ratio", "initial"),), gates=(
            above("mismatch_rise_floor"), Line("slope", ">", constant=0)))),
        _level(Level(MISMATCH_RISING, SHORT, (Line("mean", ">", "mismatch_rise_ratio", reference="initial"),),
                     gates=(Line("mean", ">", "mismatch_rise_floor"), Line("trend_z", ">=", "trend_z"))),
               "trend"))),
    Card("GRPOStaleRollouts", "warning", ALERTS, (
        _level(Level("staleness/mean", SHORT, (above("staleness_steps"),))),)),
    Card("GRPOPromptsTooHard", "warning", ALERTS, (
        _level(Level("group/all_wrong_frac", SHORT, (above("dead_group_cause_ratio"),))),)),
    Card("GRPOPromptsTooEasy", "warning", ALERTS, (
        _level(Level("group/all_right_frac", SHORT, (above("dead_group_cause_ratio"),))),)),
    # A prompt type's 50-step mean reward shortcut_delta or more below its reference (its
    # initial mean, or its 50-step mean 200 steps before) while a type that was higher there
    # rose by as much over its own: the card names the falling type (its prompt_type label).
    Card("GRPOShortcutLearning", "warning", ALERTS, (
        _rule(_shortcut(Series("type_initial", REWARD)), "against_initial", prompt_types=2),
        _rule(_shortcut(_mean_of_types(back=LOOKBACK)), "within_200_steps", prompt_types=2))),
    # Entropy climbing off the floor it settled at: the explosion's early sign, no baseline.
    # The floor between 0.1x and 0.6x the start: it settled (not collapsed, whose tiny floor
    # jitters by multiples and has its red card) after spending at least 40% of its entropy.
    Card("GRPOEntropyRebound", "warning", ALERTS, (
        _level(Level("entropy/mean", SHORT, (above("entropy_rebound_warn_ratio", "floor"),), gates=(
            Line("floor", "<", "entropy_rebound_floor_ratio", reference="initial"),
            Line("floor", ">", "entropy_collapse_ratio", reference="initial")))),)),
    # The covariance positive and over entropy_cov_ratio x its (positive) start in 90% of the
    # short window while entropy's 50-step trend fell by over entropy_cov_fall_ratio of its start.
    Card("GRPOEntropyCovarianceSurge", "warning", ALERTS, (
        _rule(Rule(_max(Series("p10", COVARIANCE, SHORT)
                        > ((Series("initial", COVARIANCE) > 0) * T("entropy_cov_ratio")).named("limit"))
                   & (Series("slope", ENTROPY, SUSTAIN) * SUSTAIN / Series("initial", ENTROPY)
                      < Const(-1) * T("entropy_cov_fall_ratio")))),)),
    # The entropy-reward law is fitted on the entropy's and the reward's block means.
    # By the law fitted so far (R² at least forecast_min_r2, a > 0), under
    # ceiling_headroom_ratio of the gain it promised at the start is left, entropy still falling
    # (and not collapsed: that has its red card).
    Card("GRPORewardCeilingNear", "warning", ALERTS, (
        _rule(Rule((_max(((Func("exp", _mean(ENTROPY)) - 1) / (Func("exp", Series("initial", ENTROPY)) - 1))
                         .named("headroom_ratio") < T("ceiling_headroom_ratio").named("limit"))
                    & (Series("law_r_squared", REWARD) >= T("forecast_min_r2"))
                    & (Series("law_scale", REWARD) > 0) & (Series("slope", ENTROPY, SUSTAIN) < 0))
                   .unless(Series("p90", ENTROPY, SHORT)
                           < Series("initial", ENTROPY) * T("entropy_collapse_ratio"))),
              indirect=("reward/mean",)),)),
    # The incorrect responses' 50-step mean length grown by over length_bias_growth_ratio of
    # its start while the correct ones' grew by under length_bias_correct_ratio.
    Card("GRPOLengthBias", "warning", ALERTS, (
        _rule(Rule(_max((_mean(WRONG_LENGTH) / Series("initial", WRONG_LENGTH) - 1).named("incorrect_growth")
                        > T("length_bias_growth_ratio"))
                   & _max((_mean(RIGHT_LENGTH) / Series("initial", RIGHT_LENGTH) - 1).named("correct_growth")
                          < T("length_bias_correct_ratio")))),)),
    Card("GRPOSignalMissing", "warning", COVERAGE, (_B(),), always=True),
    # -- cluster health -------------------------------------------------------------------------
    # A rank's 50-step step time against the run's median rank's, once enough ranks log one.
    Card("GRPORankStraggler", "warning", CLUSTER, (
        replace(_rule(Rule(
            (_max(_mean(STEP_TIME) > Agg("run_median", _mean(STEP_TIME)).named("median_rank")
                                 * (T("straggler_ratio") + 1))
             & (Agg("run_count", _mean(STEP_TIME)) >= T("straggler_min_ranks")))
            & Ready(training=False)), baseline=True),
            min_ranks=thresholds.count("straggler_min_ranks")),)),
    Card("GRPONVLinkErrorsRising", "warning", CLUSTER, (_B(gpu=True),)),
    Card("GRPOPCIeReplayErrorsRising", "warning", CLUSTER, (_B(gpu=True),)),
    Card("GRPOGPUTemperatureHigh", "warning", CLUSTER, (_B(gpu=True),)),
    Card("GRPOGPUIdleDuringTraining", "warning", CLUSTER, (_B(gpu=True),)),
    Card("GRPOExporterDown", "warning", CLUSTER, (_B(),), always=True),
    Card("GRPOExporterSnapshotErrors", "warning", CLUSTER, (_B(),), always=True),
    Card("GRPOExporterInternalError", "warning", CLUSTER, (_B(),), always=True),
)
CARDS_BY_NAME: dict[str, Card] = {c.name: c for c in CARDS}

# The seed's minimum set of curves: a run that does not log one of these is watched with one eye
# closed (background.md#what-to-log). GRPOSignalMissing names each one missing.
MINIMUM_CURVES: tuple[str, ...] = ("reward/mean", "kl/mean", "entropy/mean", "response/len_mean",
                                   "grad/norm")
# Signals many healthy runs never log, whose absence raises no coverage card: a held-out score
# is logged by the runs that evaluate, at their own cadence (every 50 or 500 steps, or never);
# a coverage card on every run that does not would teach people to ignore the coverage card.
# The armed table and `grpo-monitor check` still say which cards they disarm.
OPTIONAL_SIGNALS: frozenset[str] = frozenset({"eval/heldout_score"})


def red_cards_watched() -> list[Card]:
    """The red cards GRPOSignalMissing speaks for beyond the minimum curves: those that read a
    signal which is no minimum curve and not optional (a red card disarmed by a missing minimum
    curve is named in that curve's own coverage card)."""
    return [c for c in CARDS if c.severity == "critical" and not c.always
            and set(c.keys) - set(MINIMUM_CURVES) - OPTIONAL_SIGNALS
            # a card that needs some of many signals is disarmed only when minimum curves are
            # missing too, whose own coverage cards name it
            and all(b.at_least is None for b in c.branches)]


@dataclass(frozen=True)
class RunShape:
    """What arming reads of a run: the canonical keys it logs, by how many ranks; its ranks; the
    steps its baseline period still needs (0 once complete); its prompt types; whether its ranks
    report the GPU they train on."""

    key_ranks: dict[str, int] = field(default_factory=dict)
    ranks: int = 1
    baseline_steps_to_go: int = 0
    prompt_types: int = 0
    gpus: bool = False
    ended: bool = False  # the run wrote its end mark: a pending baseline will never be complete


@dataclass(frozen=True)
class Armed:
    card: Card
    reason: Reason
    needs: tuple[str, ...] = ()  # missing_signal: the keys to log
    steps_to_go: int = 0  # baseline_pending
    why: str = ""  # not_applicable: what the card compares that the run lacks
    ended: bool = False  # baseline_pending on a run that has ended: it never will be complete
    # armed: the branches that can fire on the run, by their rule's reason label ("" for a
    # card's first rule): which path judges it (the mean-only reward collapse, the trend, ...)
    paths: tuple[str, ...] = ()

    @property
    def explanation(self) -> str:
        """The reason in words, for a person."""
        if self.reason == "missing_signal":
            return "needs " + ", ".join(self.needs)
        if self.reason == "baseline_pending":
            if self.ended:
                return (f"the run ended {self.steps_to_go} steps before its baseline period was "
                        "complete: never judged")
            return f"waits for the baseline period, {self.steps_to_go} steps to go"
        return self.why or "armed"


def _branch(card: Card, branch: Branch, shape: RunShape) -> Armed:
    if card.always:
        return Armed(card, "armed")
    if branch.gpu and not shape.gpus:
        return Armed(card, "not_applicable", why="the run's ranks report no GPU")
    if branch.prompt_types and shape.prompt_types < branch.prompt_types:
        return Armed(card, "not_applicable", why=f"compares {branch.prompt_types} prompt types "
                     f"(a record's by_type), the run logs {shape.prompt_types}")
    if not branch.keys and shape.ranks < branch.min_ranks:
        return Armed(card, "not_applicable", why=f"compares {branch.min_ranks} ranks or more, "
                     f"the run has {shape.ranks}")
    logged = [k for k in branch.all_keys if shape.key_ranks.get(k, 0)]
    missing = tuple(k for k in branch.all_keys if k not in logged)
    if len([k for k in branch.keys if k in logged]) < branch.needed or any(
            k not in logged for k in branch.indirect):
        return Armed(card, "missing_signal", missing)
    if branch.keys and (most := max(shape.key_ranks.get(k, 0) for k in branch.keys)) < branch.min_ranks:
        return Armed(card, "not_applicable", why=f"compares {branch.min_ranks} ranks logging "
                     f"{' or '.join(branch.keys)}, the run has {most}")
    if present := [k for k in branch.unless_logged if shape.key_ranks.get(k, 0)]:
        return Armed(card, "not_applicable", why=f"for runs that log no {' or '.join(branch.unless_logged)}; "
                     f"the run logs {', '.join(present)}")
    if branch.baseline and shape.baseline_steps_to_go > 0:
        return Armed(card, "baseline_pending", steps_to_go=shape.baseline_steps_to_go,
                     ended=shape.ended)
    return Armed(card, "armed")


def arm(card: Card, shape: RunShape) -> Armed:
    """Whether ``card`` can fire on a run of this shape: its nearest branch's state. A card none
    of whose branches has its signals needs any of them: ``needs`` lists each missing key once."""
    states = [_branch(card, b, shape) for b in card.branches]
    best = min(states, key=lambda a: REASONS.index(a.reason))
    if best.reason == "armed" and not card.always:
        return replace(best, paths=tuple(dict.fromkeys(
            b.reason for b, st in zip(card.branches, states) if st.reason == "armed")))
    if best.reason == "missing_signal":
        needs = dict.fromkeys(k for a in states if a.reason == "missing_signal" for k in a.needs)
        return Armed(card, "missing_signal", tuple(needs))
    return best


def armed_table(shape: RunShape) -> list[Armed]:
    """Every card's state on the run, in catalog order."""
    return [arm(card, shape) for card in CARDS]


def disarmed_by(key: str) -> list[str]:
    """The cards every branch of which reads ``key``: a run without it disarms them."""
    return [c.name for c in CARDS if not c.always
            and all(key in b.all_keys and b.needed >= len(b.keys) for b in c.branches)]


# -- the coverage card: which minimum curve is missing, and why, where the cause is known ------


@dataclass(frozen=True)
class MissingCause:
    """A known reason why a framework's run lacks a minimum curve, and what to set."""

    framework: str  # grpo_run_info's framework label
    key: str
    reason: str  # the alert's reason label
    hint: str


MISSING_CAUSES: tuple[MissingCause, ...] = (
    MissingCause("trl", "kl/mean", "trl_beta_zero", (
        "TRL logs no KL while beta is 0, GRPOConfig's default (the reference model is then not "
        "even loaded): set beta > 0 (the original GRPO used 0.04, DeepSeek-R1 0.001) to log "
        "kl and anchor the policy, or accept that no KL card can fire on this run.")),
    MissingCause("trl", "entropy/mean", "trl_no_entropy", (
        "Older TRL releases (and the Unsloth notebooks built on them) log no entropy: upgrade "
        "TRL, whose GRPOTrainer logs entropy at every step, or log it yourself.")),
    MissingCause("trl", "grad/norm", "trl_no_grad_norm", (
        "transformers' Trainer logs grad_norm only while it clips gradients: keep max_grad_norm "
        "> 0 (its default is 1.0).")),
    MissingCause("verl", "kl/mean", "verl_no_kl", (
        "verl logs the KL to the reference only when it computes it: "
        "actor_rollout_ref.actor.use_kl_loss=True (actor/kl_loss) or "
        "algorithm.use_kl_in_reward=True (actor/reward_kl_penalty).")),
)


def missing_cause(framework: str, key: str) -> MissingCause | None:
    for cause in MISSING_CAUSES:
        if cause.framework == framework and cause.key == key:
            return cause
    return None


RULE_FILE = "prometheus/rules/grpo-coverage.yml"
_RUNBOOK = '{{ or $externalLabels.grpo_runbook_url "http://localhost:9400/docs/runbook.md" }}'
_DISARMED = ('{{ range printf "grpo_card_armed{run=%q,reason=\\"missing_signal\\",needs=~\\".*%s.*\\"}" '
             '$labels.run $labels.key | query | sortByLabel "card" }} {{ .Labels.card }}{{ end }}')


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _alert(expr: str, reason: str, description: str) -> list[str]:
    lines = ["      - alert: GRPOSignalMissing", "        expr: |"]
    lines += ["          " + line for line in expr.strip().splitlines()]
    lines += ["        labels:", "          severity: warning", "          card: yellow"]
    if reason:
        lines.append(f"          reason: {reason}")
    lines += ["        annotations:",
              "          summary: 'The run does not log a signal the cards need: they cannot fire.'",
              f"          description: {_quote(description)}",
              f"          runbook_url: '{_RUNBOOK}#grposignalmissing'"]
    return lines


def render() -> str:
    """prometheus/rules/grpo-coverage.yml: GRPOSignalMissing, one rule per known cause
    (MISSING_CAUSES, worded for its framework) and one for every other missing minimum curve."""
    # The value is the run's logged steps, the key the curve it lacks. max by (run...): the ranks
    # of a run may be spread over several exporters (one per node), and the node of rank 0 alone
    # sees the training signals.
    steps = ("(max by (run) (grpo_run_logged_steps) >= on() group_left() "
             "grpo:threshold:signal_missing_steps)")
    base = ("(max by (run, key) (grpo_run_signal_logged{{key=\"{key}\"}}) == 0)\n"
            "  + on(run) group_left()\n" + steps)
    head = ("Run {{ $labels.run }} has logged {{ $value }} steps without {{ $labels.key }} (its newest "
            "step is {{ with printf \"max(grpo_step{run=%q})\" $labels.run | query }}{{ . | first | "
            "value | printf \"%.0f\" }}{{ end }}); the cards that read it cannot fire:" + _DISARMED + ".")
    lines = [HEADER.rstrip("\n")]
    known = []
    for cause in MISSING_CAUSES:
        expr = (base.format(key=cause.key)
                + f"\nand on(run) grpo_run_info{{framework=\"{cause.framework}\"}}")
        known.append(f"(max by (run, key) (grpo_run_signal_logged{{key=\"{cause.key}\"}}) and on(run) "
                     f"grpo_run_info{{framework=\"{cause.framework}\"}})")
        lines += _alert(expr, cause.reason, f"{head} {cause.hint}")
    generic = ("(max by (run, key) (grpo_run_signal_logged) == 0)\n"
               "  + on(run) group_left()\n" + steps + "\n"
               + "".join(f"unless on(run, key) {k}\n" for k in known))
    lines += _alert(generic, "", f"{head} Log it under its canonical name or one of the "
                    "names docs/metrics.md lists for it (grpo-monitor check RUN_DIR shows what the "
                    "run logs and what each name is read as).")
    for card in red_cards_watched():
        # The card's own armed state: missing_signal, whatever branch it would need.
        expr = (f"max by (run, card, needs) (grpo_card_armed{{card=\"{card.name}\",reason=\"missing_signal\"}} == 0)\n"
                "  + on(run) group_left()\n" + steps)
        lines += _alert(expr, "red_card_disarmed", (
            f"Run {{{{ $labels.run }}}} has logged {{{{ $value }}}} steps (its newest step is "
            "{{ with printf \"max(grpo_step{run=%q})\" $labels.run | query }}{{ . | first | "
            "value | printf \"%.0f\" }}{{ end }}) and the red card "
            f"{card.name} cannot fire on it: it needs {{{{ $labels.needs }}}} (any one branch's "
            f"set: docs/coverage.md). Log them under a name docs/metrics.md lists, or map the "
            f"run's own names onto them (grpo-monitor check RUN_DIR prints the lines of a key "
            f"map); else this sickness goes unseen on this run."))
    return "\n".join(lines) + "\n"


HEADER = f"""\
# The coverage card: a run that does not log one of the minimum curves (reward, KL, entropy,
# response length, grad norm) is watched with one eye closed, and says so.
#
# Generated from exporter/grpo_monitor/contract/cards.py by `make docs`
# (`python -m grpo_monitor.contract.cards > {RULE_FILE}`); do not edit by hand.
# The exporter publishes grpo_run_signal_logged{{run, key}} for each minimum curve,
# grpo_run_logged_steps{{run}} and grpo_run_info{{run, framework}}; one rule per known cause of a
# missing curve (worded for its framework), one for the rest.
groups:
  - name: grpo-coverage
    rules:
"""


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


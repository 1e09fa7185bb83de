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
from grpo_monitor.contract.card_logic import AnyOf, Level, Line, Logic, above, below, mean_above

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


# The rollout-vs-trainer mismatches whose slow rise GRPORolloutMismatchRising follows.
MISMATCH_RISING = ("mismatch/kl", "mismatch/k3_kl", "mismatch/logprob_diff_mean")


CARDS: tuple[Card, ...] = (
    # -- red cards ------------------------------------------------------------------------------
    Card("GRPONonFiniteValues", "critical", ALERTS, (_B(),), always=True),
    Card("GRPOKLExplosion", "critical", ALERTS, (
        _B(("kl/mean",), baseline=True),
        _B(("kl/mean",), reason="before_baseline"))),
    Card("GRPOEntropyCollapse", "critical", ALERTS, (
        _level(Level("entropy/mean", SHORT, (below("entropy_collapse_ratio", "initial"),))),
        _B(("entropy/mean",), reason="first_records"))),
    Card("GRPOEntropyExplosion", "critical", ALERTS, (
        _level(Level("entropy/mean", SHORT, (above("entropy_explosion_ratio", "initial"),))),
        # Back above its start and far above the floor it had fallen to: a collapse that
        # rebounds into an explosion never reaches 5x its start.
        _level(Level("entropy/mean", SHORT, (above("entropy_rebound_ratio", "floor"),), gates=(
            Line("p10", ">", reference="initial"),
            Line("floor", "<", "entropy_rebound_floor_ratio", reference="initial"))), "rebound"))),
    Card("GRPOTrainingBlowUp", "critical", ALERTS, (
        _B(("entropy/mean", "kl/mean", "grad/norm", "response/len_mean", "reward/mean",
            "response/clip_ratio"),
           at_least=thresholds.count("blowup_min_signals")),
        # Two signals suffice where they are these two: the reward at a new low while the
        # truncated share reaches a new high above half (a crash into the length limit).
        _B(("reward/mean", "response/clip_ratio"), reason="truncation_crash"),
        # The reward falling steadily while another signal climbs steadily or pins at the cap:
        # judged on the trend of the last records (runtime/trend.py), no baseline, no initial.
        _B(("reward/mean", "entropy/mean", "kl/mean", "grad/norm", "response/len_mean",
            "response/clip_ratio"), at_least=2, reason="trend"))),
    # The reward's spread, or its range where the run logs no spread (verl's default).
    Card("GRPORewardCollapse", "critical", ALERTS, (
        _B(("reward/mean", "reward/std")), _B(("reward/mean", "reward/min", "reward/max")),
        # A run that logs its mean reward and nothing beside it.
        _B(("reward/mean",), reason="mean_only",
           unless_logged=("reward/std", "reward/min", "reward/max")))),
    Card("GRPOHeldOutCollapse", "critical", ALERTS, (_B(("eval/heldout_score",)),)),
    Card("GRPORankStalled", "critical", ALERTS, (_B(min_ranks=2, reason="rank_lag"),)),
    Card("GRPORunHung", "critical", CLUSTER, (_B(),), always=True),
    Card("GRPOGPUXidError", "critical", CLUSTER, (_B(gpu=True),)),
    # -- yellow cards ---------------------------------------------------------------------------
    Card("GRPOKLGrowthAccelerating", "warning", ALERTS, (_B(("kl/mean",), baseline=True),)),
    Card("GRPOKLTailOutliers", "warning", ALERTS, (_B(("kl/max", "kl/p95"), baseline=True),)),
    Card("GRPORewardHackingSuspected", "warning", ALERTS, (
        _B(("response/len_mean", "reward/mean"), baseline=True, reason="length_surge"),
        _B(("reward/mean", "eval/sample_acc"), baseline=True, reason="flat_accuracy"),
        # The same, before any baseline: the reward's trend against the accuracy's.
        _B(("reward/mean", "eval/sample_acc"), reason="trend"))),
    Card("GRPOResponseLengthShift", "warning", ALERTS, (
        _B(("response/len_mean",), baseline=True),
        _B(("response/len_mean",), reason="against_initial"),
        _B(("response/len_mean",), reason="trend"))),
    Card("GRPOCompletionsTruncated", "warning", ALERTS, (
        _level(Level("response/clip_ratio", SHORT, (above("truncated_ratio"),))),)),
    Card("GRPORewardOverOptimization", "warning", ALERTS, (
        _B(("eval/heldout_score", "reward/mean")),
        _B(("eval/heldout_score", "reward/mean"), reason="smoothed"))),
    Card("GRPORewardStdRising", "warning", ALERTS, (
        _level(Level("reward/std", 0, (Line("rising", ">=", "reward_std_rising_windows"),),
                     baseline=True)),)),
    Card("GRPORewardQuantileExtreme", "warning", ALERTS, (
        _B(("reward/p25", "reward/p50", "reward/p75", "reward/p95"), at_least=1, baseline=True),)),
    Card("GRPOAdvantageVanishing", "warning", ALERTS, (
        _level(Level("group/zero_std_frac", SHORT, (mean_above("dead_signal_zero_std_ratio"),)),
               "dead_groups"),
        _level(Level("reward/std", SHORT, (Line("p90", "<=", constant=0),)), "reward_constant"),
        _B(("reward/mean", "reward/std"), reason="saturated"),
        # The mean reward alone: the same value step after step (exactly 0, or the top).
        _B(("reward/mean",), reason="mean_constant", unless_logged=("reward/std",)),
        _level(AnyOf((Level("group/zero_std_frac", SUSTAIN, (above("zero_std_group_ratio"),)),
                      Level("adv/mean_abs", SUSTAIN, (below("advantage_vanishing_ratio", "baseline"),))),
                     baseline=True)))),
    Card("GRPOGroupDominated", "warning", ALERTS, (
        _B(("group/reward_gap", "reward/std"), baseline=True),)),
    Card("GRPOGradNormSpike", "warning", ALERTS, (
        _level(Level("grad/norm", SUSTAIN, (above("grad_norm_spike_ratio", "baseline"),),
                     baseline=True)),)),
    Card("GRPOStepTimeDrift", "warning", ALERTS, (_B(("perf/step_time_s",), baseline=True),)),
    Card("GRPOThroughputDrop", "warning", ALERTS, (
        _B(("perf/samples_per_s", "perf/tokens_per_s"), at_least=1, baseline=True),)),
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
    Card("GRPOShortcutLearning", "warning", ALERTS, (
        _B(("reward/mean",), prompt_types=2, reason="against_initial"),
        _B(("reward/mean",), prompt_types=2, reason="within_200_steps"))),
    # Entropy climbing off the floor it settled at: the explosion's early sign, no baseline.
    # The floor between 0.1x and 0.6x the start: it settled (not collapsed, whose tiny floor
    # jitters by multiples and has its red card) after spending at least 40% of its entropy.
    Card("GRPOEntropyRebound", "warning", ALERTS, (
        _level(Level("entropy/mean", SHORT, (above("entropy_rebound_warn_ratio", "floor"),), gates=(
            Line("floor", "<", "entropy_rebound_floor_ratio", reference="initial"),
            Line("floor", ">", "entropy_collapse_ratio", reference="initial")))),)),
    Card("GRPOEntropyCovarianceSurge", "warning", ALERTS, (
        _B(("entropy/logp_adv_cov", "entropy/mean")),)),
    # The entropy-reward law is fitted on the entropy's and the reward's block means.
    Card("GRPORewardCeilingNear", "warning", ALERTS, (
        _B(("entropy/mean",), indirect=("reward/mean",)),)),
    Card("GRPOLengthBias", "warning", ALERTS, (
        _B(("response/len_correct_mean", "response/len_incorrect_mean")),)),
    Card("GRPOSignalMissing", "warning", COVERAGE, (_B(),), always=True),
    # -- cluster health -------------------------------------------------------------------------
    Card("GRPORankStraggler", "warning", CLUSTER, (
        _B(("perf/step_time_s",), baseline=True,
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


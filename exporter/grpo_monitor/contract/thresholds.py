"""Every number a card or a report verdict compares with, in one table.

The alert rules read the card thresholds as constant series (``grpo:threshold:<name>``) from
``prometheus/rules/grpo-thresholds.yml``, which this module writes:

    python -m grpo_monitor.contract.thresholds > prometheus/rules/grpo-thresholds.yml    # make docs

``grpo-monitor report`` reads the same entries, so the live cards and the offline verdicts cannot
disagree on a number. Entries of the ``report`` group are numbers only the report uses (its
windows, its three-curve rules); they are kept here so that one place holds every number, and
are not written to the rule file. A test fails when the committed rule file differs from
:func:`render`, and when a rule file records or reads a threshold this table lacks.

Adding a threshold is one :class:`Threshold` entry in :data:`TABLE`, then ``make docs``.
Standard library only: the report imports it, and so may the trainer side.
"""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import dataclass
from typing import Literal

Group = Literal["red", "yellow", "cluster", "report"]
# The groups written to the rule file, in this order, each under its own heading.
RULE_GROUPS: tuple[Group, ...] = ("red", "yellow", "cluster")
SERIES_PREFIX = "grpo:threshold:"
RULE_FILE = "prometheus/rules/grpo-thresholds.yml"
_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class Threshold:
    """One number: ``name`` as in its series (less the ``grpo:threshold:`` prefix), its value,
    the card group that uses it, and the domain rule it stands for, in words."""

    name: str
    value: float
    group: Group
    why: str

    @property
    def in_rules(self) -> bool:
        """Whether the rule file records it as ``grpo:threshold:<name>``."""
        return self.group in RULE_GROUPS

    @property
    def series(self) -> str:
        return SERIES_PREFIX + self.name


TABLE: tuple[Threshold, ...] = (
    # -- red cards (severity critical) ----------------------------------------------------------
    Threshold("kl_explosion_ratio", 10, "red", """
        KL above this multiple of its baseline in 90% of the last 20 steps: an order-of-magnitude
        jump, the policy running away from the reference model (for example 0.3 to 5 within 100
        steps). One-step spikes are common in healthy runs and do not count. Once raised, the
        card stays while KL's 50-step mean is still over this multiple of the baseline."""),
    Threshold("kl_jump_ratio", 3, "red", """
        ... having grown by at least this factor within 200 steps (against its 50-step mean 200
        steps before): a jump. KL often starts near zero and climbs for hundreds of steps in a
        healthy run; ten times a near-zero baseline reached slowly is the growth card's
        business, not a red card."""),
    Threshold("kl_early_level", 0.5, "red", """
        Before the baseline exists: KL above kl_explosion_ratio times its floor (the lowest
        20-step mean the run has had) in 90% of the last 20 steps, and above this many nats a
        token. KL starts at exactly zero (the policy is the reference) and multiplies many times
        over a healthy run's first steps, so its own early level alone cannot scale it; healthy
        runs keep a per-token KL of about 0.01-0.1 for their first hundreds of steps, and this
        level is five times the top of that range."""),
    Threshold("entropy_collapse_ratio", 0.1, "red", """
        Entropy below this fraction of its initial value (the mean of its first steps) in 90% of
        the last 20 steps: the policy has stopped exploring and gives the same answer every
        time. A healthy run loses 30-60% of its entropy and settles; losing 90% is a collapse.
        Judged against the initial value, not the baseline, so that a run that collapses before
        its baseline period ends is caught."""),
    Threshold("first_records_judged", 20, "red", """
        ... and judged from a run's first records (each of its last 3 below that fraction of the
        median of its first 3) while the run has logged at most this many steps: a cliff in the
        first steps, before the initial value (itself lowered by the fall) can show it. A healthy
        run does not spend most of its entropy so soon; later, the window card judges, and
        a card raised early stays while entropy stays down."""),
    Threshold("entropy_explosion_ratio", 5, "red", """
        Entropy above this multiple of its initial value in 90% of the last 20 steps: the policy
        turning to noise, its answers rambling until the length limit cuts them. Healthy runs
        keep entropy at or below where it started."""),
    Threshold("entropy_rebound_ratio", 2.5, "red", """
        ... or, after a decline, entropy back above its initial value and above this multiple
        of its floor (the lowest 20-step mean the run has had) in 90% of the last 20 steps: a
        policy that had settled turning to noise again. Judged against the start alone, a
        rebound from a low floor never looks like a multiple of where the run began ..."""),
    Threshold("entropy_rebound_floor_ratio", 0.6, "red", """
        ... where that floor is at most this fraction of the initial value: the run had spent at
        least 40% of its entropy (healthy runs spend 30-60% and settle). A run whose entropy
        never declined is judged by the 5x rule alone: methods that raise entropy on purpose
        (clip-higher, an entropy bonus) can lift it past 2.5x a start they never left."""),
    Threshold("blowup_ratio", 3, "red", """
        A blow-up, judged in logged records and with no baseline: entropy, KL or grad norm in
        each of its last 2 records above this multiple of the median of its earlier records (the
        10 before its last 5), and above all of those 10 ..."""),
    Threshold("blowup_length_ratio", 1.5, "red", """
        ... response length likewise above this multiple, or reward in its last 2 records below
        all of those 10 earlier records ..."""),
    Threshold("blowup_min_signals", 3, "red", """
        ... for at least this many of those five signals at once: the run collapsing on several
        fronts within two logged steps, which no healthy run shows (one signal's jump alone is
        common: KL multiplying over a run's first steps, a grad-norm spike). Once raised, the
        card stays while one signal fewer stays above those multiples of its floor (the lowest
        20-step mean the run has had)."""),
    Threshold("reward_collapse_ratio", 0.25, "red", """
        Reward back at its floor: 90% of the last 50 steps in the lowest quarter (this fraction)
        of the range between the lowest and the highest 20-step mean the run has had ..."""),
    Threshold("reward_collapse_spread_ratio", 0.5, "red", """
        ... where that range spans at least this many of the reward's within-batch standard
        deviation (its largest 20-step mean), so that a run that never left its floor is no
        collapse: a binary reward earned at a rate p has a spread of sqrt(p(1-p)), more than
        twice p for any p under 0.2, so a sparse reward and its odd lucky batch never count."""),
    Threshold("reward_range_std_ratio", 0.5, "red", """
        ... and where the run logs no reward spread but its reward's minimum and maximum (verl
        does by default), the spread is taken as this fraction of their range (the highest 20-step
        mean of the maximum less the lowest of the minimum): no distribution's standard deviation
        exceeds half its range, so the stand-in can only make the card later, never wrong."""),
    Threshold("blowup_truncated_ratio", 0.5, "red", """
        ... the share of truncated completions counts as a sixth such signal when, in its last 2
        records, it is above this share as well as above 3x and all of its earlier records: a
        policy that starts to ramble into the length limit while the reward falls."""),
    Threshold("trend_z", 3, "red", """
        A steady move: the Mann-Kendall Z of a signal's last 30 logged records (fewer early in a
        run, from 8 on) at or beyond this, up or down: the values rise (or fall) on nearly every
        record pair, p < 0.0013 one-sided, whatever their scale and however few steps the run
        has. The trend cards pair it with the factor the signal moved by over those records
        (Theil's robust line, runtime/trend.py): steadiness alone is no sickness, and a large
        factor from one jump is no trend."""),
    Threshold("blowup_trend_reward_factor", 0.5, "red", """
        A blow-up judged on trends: the reward falling steadily to this factor of where its
        last records' line began (halved) while entropy, KL or grad norm climb steadily by
        blowup_ratio, response length by blowup_length_ratio, or the truncated share sits at
        truncated_ratio in 90% of the last 20 steps. A healthy run's reward does not halve
        steadily; the signals that climb with it name the way the policy broke. Once raised, the
        card stays while the reward's 20-step mean is at or below this factor of its working
        level."""),
    Threshold("reward_mean_collapse_ratio", 0.1, "red", """
        Reward collapse for a run that logs its mean reward and nothing beside it (no spread, no
        min or max): in 90% of the last 50 steps at or below this fraction of its working level
        (the highest 20-step mean the run has had), a reward that never went negative. The
        reward then pays for nothing of what it paid for before."""),
    Threshold("heldout_collapse_ratio", 0.5, "red", """
        The held-out score (validation accuracy, a gold reward), in both of its last 2 points,
        below this fraction of its best so far, and further below it than heldout_noise_factor
        times its noise: what the policy learned no longer transfers; keep the checkpoint of the
        best point. Judged on the held-out score's own sparse points, from its heldout_min_points-th,
        with no baseline."""),
    Threshold("rank_lag_steps", 20, "red", """
        A rank this many steps behind the run's most advanced rank has stalled while the others
        go on; a lagging rank corrupts the gradient sync."""),
    # -- yellow cards (severity warning) --------------------------------------------------------
    Threshold("kl_growth_ratio", 0.2, "yellow", """
        KL's 100-step mean growing by more than this fraction per 100 steps in each of the last
        three 100-step windows (sustained over 300 steps), and faster than 200 steps before. A
        fast early climb that slows down is healthy; sustained, accelerating growth is a policy
        that keeps drifting."""),
    Threshold("kl_tail_ratio", 3, "yellow", """
        The per-sample KL tail: kl/max above this multiple of kl/p95. A few prompts that carry
        most of the KL are where the policy found something in the reward to exploit."""),
    Threshold("kl_tail_baseline_ratio", 1.5, "yellow", """
        ... and that tail ratio (kl/max over kl/p95) above this multiple of the baseline's, so
        that the card sees a change. Short answers make per-sequence KL heavy-tailed from step
        0 (a one-token answer the reference model dislikes has a large k3), which is no reward
        hacking."""),
    Threshold("hacking_length_ratio", 1.5, "yellow", """
        Response length mean up by more than this ratio within 200 steps while reward rises:
        the policy pads its answers for a grader that pays for length (for example 300 to 900
        tokens in 200 steps)."""),
    Threshold("hacking_reward_sigmas", 3, "yellow", """
        Reward rising by more than this many baseline stddevs within 200 steps while sample
        accuracy moves less than hacking_accuracy_sigmas of its own: reward that accuracy does
        not back comes from the grader, not from the task."""),
    Threshold("hacking_accuracy_sigmas", 1, "yellow", """
        Sample accuracy moving less than this many of its baseline stddevs within those 200
        steps counts as flat, for the reward-without-accuracy test above."""),
    Threshold("hacking_trend_reward_factor", 1.5, "yellow", """
        Before any baseline, judged on the trends of a run's last records (runtime/trend.py):
        the reward's robust line up by this factor or more, rising steadily (Mann–Kendall Z at
        or above trend_z) ..."""),
    Threshold("hacking_trend_accuracy_z", 2, "yellow", """
        ... while the sample accuracy logged beside it shows no steady climb (its Z below this:
        no rise at p < 0.023): a reward that climbs by half in a few dozen records with no
        accuracy behind it is paying for a proxy (compiling, a format, a length). Healthy runs
        whose reward climbs that fast climb in accuracy with it (their accuracy's Z is 2.6 or
        more where the reward's line rises 2-3x)."""),
    Threshold("entropy_rebound_warn_ratio", 1.75, "yellow", """
        Entropy leaving the floor it settled at: after a decline to entropy_rebound_floor_ratio
        of its start or less, above this multiple of its floor in 90% of the last 20 steps, still
        short of the red rebound (back above the start and 2.5x the floor). Healthy runs spend
        30-60% of their entropy and settle; a settled policy whose entropy climbs three quarters
        back above its floor is leaving its plateau, the way an explosion after a long decline
        starts. A floor under entropy_collapse_ratio of the start is a collapse, whose red card
        judges it: its tiny floor jitters by multiples."""),
    Threshold("length_shift_ratio", 0.5, "yellow", """
        Response length mean moving by more than this fraction within 200 steps, up or down; early
        in a run, before a 200-step comparison exists, against its initial value in 90% of the
        last 20 steps. A healthy run's length stays within about 15%; a move by half is a
        changed way of answering (padding, or answers collapsing to a few tokens)."""),
    Threshold("reward_std_rising_windows", 10, "yellow", """
        reward/std rising in this many consecutive 100-step windows: a sustained, monotonic rise
        of the spread, the policy farming easy prompts and giving up on hard ones."""),
    Threshold("reward_quantile_sigmas", 3, "yellow", """
        A reward quantile's 50-step mean below its baseline mean minus this many baseline
        stddevs, or fallen by as many within 200 steps: part of the batch fails badly while the
        mean may look fine. Downward only: an improving run's quantiles rise past baseline + 3σ
        by design, and a reward surge is the hacking card's to judge."""),
    Threshold("zero_std_group_ratio", 0.5, "yellow", """
        Share of prompt groups with zero reward spread above which (in 90% of 50 steps, once the
        baseline is ready) they dominate:
        a group whose responses all score the same has zero advantage, so most of the batch
        teaches nothing and learning stalls."""),
    Threshold("dead_signal_zero_std_ratio", 0.9, "yellow", """
        A dead learning signal from the first steps: the share of prompt groups whose rewards
        are all equal, averaged over 20 steps, above this. Such groups have zero advantage, so
        nearly nothing is left to learn from; an absolute level, it needs no baseline."""),
    Threshold("truncated_ratio", 0.9, "yellow", """
        Share of completions cut at the generation length limit above which (in 90% of the last
        20 steps) nearly every answer is cut: the policy rambles, or the limit is far too short,
        and a cut answer earns nothing for its content."""),
    Threshold("advantage_vanishing_ratio", 0.2, "yellow", """
        Mean |advantage| below this fraction of its baseline for 50 steps: the same stall seen
        from the advantages, for trainers that do not log the zero-spread share."""),
    Threshold("group_gap_sigmas", 2, "yellow", """
        Mean within-group reward gap (best minus worst response of a group) above this many
        reward stddevs over 50 steps: one response per group dominates the gradient."""),
    Threshold("group_gap_baseline_sigmas", 3, "yellow", """
        ... and the gap above its own baseline by this many baseline stddevs: a change, not the
        steady gap of binary rewards at a low pass rate, where gap / std sits near 2 in healthy
        runs."""),
    Threshold("grad_norm_spike_ratio", 5, "yellow", """
        Grad norm above this multiple of its baseline in 90% of the last 50 steps: not a one-step
        spike, which clipping absorbs, but an optimisation that has become unstable, often just
        before NaNs appear."""),
    Threshold("step_time_drift_ratio", 0.2, "yellow", """
        Step time's 50-step mean off its baseline by more than this fraction, either way,
        checkpoint saves excluded: the cluster changed (a slow node, a throttled GPU, a
        congested link), not the model."""),
    Threshold("throughput_drop_ratio", 0.3, "yellow", """
        Throughput's 50-step mean (samples/s or tokens/s) below its baseline by more than
        this fraction, checkpoint saves excluded: the same steps cost far more time (a flaky
        interconnect taking 1.8 samples/s down to 1.0 is a 44% drop)."""),
    Threshold("mismatch_kl", 0.1, "yellow", """
        Rollout vs trainer: the KL from the rollout engine's token distribution to the trainer's
        above this (per token, in 90% of the last 20 steps). verl's rollout-correction guide warns
        past 0.1; healthy vLLM / SGLang rollouts against an FSDP trainer sit near 0.001-0.01.
        The gradient is then computed for a policy the samples did not come from."""),
    Threshold("mismatch_chi2_token", 1, "yellow", """
        ... or the per-token chi-square divergence (E[w^2] - 1 of the importance weights) above
        this: a few tokens carry weights far from 1 (verl's guide warns past 1)."""),
    Threshold("mismatch_is_weight_low", 0.5, "yellow", """
        ... or the mean token importance weight below this ..."""),
    Threshold("mismatch_is_weight_high", 2, "yellow", """
        ... or above this: on average the trainer and the rollout engine disagree on the sampled
        tokens' probability by a factor of two (verl's guide: mean weight outside [0.5, 2])."""),
    Threshold("mismatch_ess_ratio", 0.3, "yellow", """
        ... or the importance weights' effective sample size below this fraction of the tokens:
        an importance-sampling correction would rest on under a third of the batch (verl's guide
        warns below 0.3)."""),
    Threshold("mismatch_rise_ratio", 2, "yellow", """
        The mismatch's slow rise, the common failure (for example 0.011 to 0.036 over a run): a
        mismatch signal (KL, k3 KL, mean |log-prob difference|) above this multiple of its
        initial value in 90% of the last 50 steps while its 50-step trend still points up.
        Precision drift, a stale weight sync or a growing rollout lag rise slowly and pass no
        level threshold until late."""),
    Threshold("mismatch_rise_floor", 0.001, "yellow", """
        ... and above this many nats: a rollout engine that agrees with the trainer to 1e-5
        doubles its rounding noise without harm."""),
    Threshold("staleness_steps", 4, "yellow", """
        Async rollouts: the mean age of the trained trajectories above this many policy
        versions in 90% of the last 20 steps. One or two versions of lag are what asynchronous
        GRPO is designed for (NeMo-RL bounds the age at 1 by default), and PPO's clip absorbs
        them; beyond four the samples come from a policy the clip range no longer covers, and a
        queue that keeps growing means the rollout side has fallen behind."""),
    Threshold("dead_group_cause_ratio", 0.5, "yellow", """
        Dead groups by cause: more than this share of the prompt groups all wrong (the prompts
        are too hard for the policy) or all right (too easy: already solved), in 90% of the last
        20 steps. Both have zero advantage, but the fixes are opposite: easier prompts or a
        curriculum for the first, dropping solved prompts (DAPO's dynamic sampling) for the
        second."""),
    Threshold("shortcut_delta", 0.05, "yellow", """
        Shortcut learning by prompt type: an easy type's 50-step mean reward up by at least this
        much (reward units, rewards in [0, 1]) over its initial value while a harder type's (one
        that started lower) fell by as much, or both moved so within 200 steps (50-step means):
        the model takes shortcuts instead of learning the hard cases. The report applies the
        same two tests."""),
    Threshold("entropy_cov_ratio", 3, "yellow", """
        The covariance that drives entropy (Cov of the sampled tokens' log-probability and their
        advantage): above this multiple of its initial value, and positive, in 90% of the last
        20 steps. Entropy falls by about the step size times this covariance, so a covariance
        that surges announces a collapse before entropy shows it."""),
    Threshold("entropy_cov_fall_ratio", 0.3, "yellow", """
        ... while entropy's 50-step trend (its least-squares slope times 50) is down by more than
        this fraction of its initial value: the covariance is a noisy batch statistic, and a
        healthy run's passes 3x its start now and then with entropy steady (a 50-step trend of
        -0.15x at most on the demo's healthy runs); driving entropy down this fast, it is a
        collapse under way, still ahead of the collapse card."""),
    Threshold("ceiling_headroom_ratio", 0.1, "yellow", """
        The entropy-reward law (R = -a exp(H) + b, arXiv 2505.22617): the reward the law still
        promises, b - a - R(H now), is below this fraction of what it promised at the start, b -
        a - R(H initial), while entropy keeps falling. That ratio is (exp(H now) - 1) / (exp(H
        initial) - 1): the run is near its ceiling and more steps will buy little; raise the
        entropy (temperature, clip-higher, covariance clipping) or stop."""),
    Threshold("forecast_min_r2", 0.8, "yellow", """
        ... and only where the law fits the run: the coefficient of determination of the fit of
        10-step mean reward on exp(10-step mean entropy) at least this, with a > 0 (reward rises as
        entropy falls)."""),
    Threshold("length_bias_growth_ratio", 0.3, "yellow", """
        Dr. GRPO's length bias: the mean length of incorrect responses, over 50 steps, grown by
        more than this fraction over its initial value ..."""),
    Threshold("length_bias_correct_ratio", 0.1, "yellow", """
        ... while correct responses grew by less than this fraction: per-response length
        normalisation penalises each token of a long wrong answer less, so wrong answers grow
        longer and longer (arXiv 2503.20783)."""),
    Threshold("heldout_drop_ratio", 0.1, "yellow", """
        Over-optimisation: the held-out score, in both of its last 2 points, more than this
        fraction below its best so far ..."""),
    Threshold("heldout_noise_factor", 2, "yellow", """
        ... and more than this many times its noise (the median change between two consecutive
        held-out points) below it, so that an evaluation's own scatter is no fall ..."""),
    Threshold("heldout_reward_hold_ratio", 0.1, "yellow", """
        ... or, judged on the held-out points' 3-point means (an evaluation's scatter smoothed as
        the authors of such runs plot it): the latest 3-point mean more than heldout_drop_ratio
        below the best 3-point mean so far and more than heldout_noise_factor times the noise of
        such a mean (the points' noise over the square root of 3), while the training reward's
        20-step mean holds within this fraction of its level at that best: a proxy reward that
        keeps its level while the held-out truth slides."""),
    Threshold("heldout_smooth_points", 3, "yellow", """
        The held-out points a smoothed held-out score averages (the exporter's
        grpo_heldout_smoothed_* series): its noise is the points' noise over the square root of
        this many."""),
    Threshold("heldout_min_points", 4, "yellow", """
        ... judged from this many held-out points on, while the training reward's 20-step mean
        is at or above its level when the best held-out point was logged: the reward still
        rises (or holds) while the truth falls, the policy exploiting its reward (reward-model
        over-optimisation, Gao et al. 2022). No baseline: the held-out score is its own
        reference."""),
    Threshold("reward_saturation_std_ratio", 0.05, "yellow", """
        A dead learning signal at the top: the reward's within-batch spread, over the last 20
        steps, below this fraction of the reward's level ..."""),
    Threshold("reward_saturation_level_ratio", 0.95, "yellow", """
        ... with the reward in 90% of those steps at or above this fraction of the highest 20-step
        mean it has had: every rollout earns the same top reward, so every advantage is zero and
        nothing is learned; the task is solved or the reward is hacked. Needs no baseline."""),
    Threshold("signal_missing_steps", 20, "yellow", """
        A run that has logged this many steps without one of the minimum curves (reward, KL,
        entropy, response length, grad norm) is missing it: a key logged from the first step
        has appeared by then, and every card that reads it is disarmed (GRPOSignalMissing,
        grpo-coverage.yml)."""),
    # -- cluster health -------------------------------------------------------------------------
    Threshold("straggler_ratio", 0.25, "cluster", """
        A rank's 50-step step time above the run's median rank by more than this fraction: a
        straggler, which every other rank waits for at each gradient sync. Needs ranks that log
        their own compute time."""),
    Threshold("straggler_min_ranks", 3, "cluster", """
        ... in a run of at least this many ranks reporting their step time: the fewest whose
        median makes a fair yardstick for a straggler; with two, each is as far from the median
        as the other."""),
    Threshold("gpu_temperature_celsius", 85, "cluster", """
        GPU temperature above which a GPU throttles or fails sooner (data-centre parts start
        slowing down around 87-90 °C; 85 leaves room to act)."""),
    Threshold("gpu_idle_utilization_ratio", 0.1, "cluster", """
        GPU utilization below which a GPU counts as idle while its run advances."""),
    Threshold("run_hung_intervals", 10, "cluster", """
        A run that has not marked its end (run_end) and has written nothing for this many of its
        typical intervals between records (grpo_run_log_interval_seconds, the median of its
        last 20) is hung. A hung all-reduce stops every rank at once; an ordinary slow step (a
        checkpoint save, an eval, a long generation) is a few intervals, and the median over 20
        is not moved by it. Keep it below the exporter's HUNG_RETAIN_INTERVALS (30): a silent
        run stays in /metrics that long, past --snapshot.run-timeout if need be."""),
    Threshold("run_hung_unpaced_seconds", 10800, "cluster", """
        Before the run's pace is known (the exporter publishes grpo_run_log_interval_seconds from
        its third interval between records on), a silence is judged against this floor alone,
        in seconds: 3 hours. A live run cannot be told from a dead one by its first record, and
        a 70B run stepping every 10 minutes and logging every 10th step writes every 100
        minutes; a run that died after its first record is still called hung, later. Keep it
        below the exporter's retention of a run without a pace (3 times this)."""),
    Threshold("run_hung_min_seconds", 300, "cluster", """
        ... and for at least this long, in seconds: a toy run logging every 2 s must not turn
        red over a 20 s pause (an eval, a checkpoint on a slow disk, a scheduler hiccup), and
        NCCL's own watchdog (10 minutes by default in PyTorch) has had half its time to speak.
        Keep it below --snapshot.run-timeout (1 hour by default) or the card cannot fire."""),
    # -- the report's own numbers (not written to the rule file) -------------------------------
    Threshold("baseline_steps", 200, "report", """
        The baseline period: the first 200 logged steps are recorded, never judged. The
        exporter's default (--signals.baseline-steps), and the report's window length: the
        reference and last windows compared with the baseline are as long."""),
    Threshold("min_window_steps", 10, "report", """
        A run shorter than five baseline periods gets windows of a fifth of its length, but
        never shorter than this: fewer steps make a median that one noisy step can move."""),
    Threshold("sustain_steps", 50, "report", """
        "Sustained" in steps, as the cards count it: the exporter's 50-step window, whose 10th
        or 90th percentile says "in 90% of 50 steps" (grad norm spike, the vanishing advantage
        once the baseline is ready), and whose mean smooths step noise (reward quantiles, the
        length shift within 200 steps, KL's level 200 steps back)."""),
    Threshold("early_window_steps", 20, "report", """
        The short window of the cards that act from a run's first steps (entropy collapse and
        explosion, reward collapse, the dead learning signal, truncation, the early length
        shift, the KL jump): its 10th or 90th percentile is "in 90% of the last 20 steps". The
        exporter's own 20-step windows (grpo_window_p10 / _p90, the reward's working level and
        floor) have this length; a test keeps the two equal."""),
    Threshold("lookback_steps", 200, "report", """
        "Within 200 steps", as the cards read it: a 50-step mean compared with the one this
        many steps before it (the fall of a reward quantile, the length shift, the KL jump)."""),
    Threshold("rising_window_steps", 100, "report", """
        The window whose means must keep rising, reward_std_rising_windows times in a row, for
        the rising-spread verdict."""),
    Threshold("reward_rise_min", 0.05, "report", """
        Reward should rise: a gain below this (reward units, rewards in [0, 1]) between the
        reference and the last window is a plateau."""),
    Threshold("acc_flat_abs", 0.02, "report", """
        On a reward plateau with normal KL, a sample-accuracy gain below this (ratio units)
        counts as flat: the grader is too loose to teach anything."""),
    Threshold("kl_near_zero", 0.01, "report", """
        KL below this on a reward plateau: the policy cannot move away from the reference (the
        KL coefficient is too large, or the sampling temperature too low)."""),
    Threshold("reward_drop", 0.1, "report", """
        Reward that turns down by at least this much from its best window while KL blows up:
        the KL rein is too loose and the policy is being pulled off course."""),
    Threshold("loss_drop_sd", 1.0, "report", """
        Loss down while reward stays flat: "down" is a drop of at least this many
        reference-window stddevs of the loss; the loss is shrinking the KL, not learning."""),
)


def _index(table: tuple[Threshold, ...]) -> dict[str, Threshold]:
    out: dict[str, Threshold] = {}
    for t in table:
        # A name is a series name and a dict key: a second entry would silently win.
        if t.name in out:
            raise ValueError(f"threshold {t.name!r} appears twice")
        if not _NAME.fullmatch(t.name):
            raise ValueError(f"threshold name {t.name!r}: lower case, digits and _ only")
        out[t.name] = t
    return out


THRESHOLDS: dict[str, Threshold] = _index(TABLE)


def value(name: str) -> float:
    """The current value of threshold ``name`` (read at each use, so a test can patch it)."""
    return THRESHOLDS[name].value


def count(name: str) -> int:
    """A threshold that counts steps, windows or ranks, as an int."""
    v = value(name)
    if v != int(v):
        raise ValueError(f"threshold {name!r} = {v} is not a whole number")
    return int(v)


def promql_number(v: float) -> str:
    """``10``, ``0.1``, ``1.5``: the shortest literal that reads back as the same float."""
    text = repr(float(v))
    return text[:-2] if text.endswith(".0") else text


HEADER = f"""\
# The yellow and red cards' thresholds, as constant series: the alert rules, the dashboards'
# threshold lines and anyone's PromQL read the same number.
#
# Generated from exporter/grpo_monitor/contract/thresholds.py by `make docs`
# (`python -m grpo_monitor.contract.thresholds > {RULE_FILE}`);
# do not edit by hand.
# To change a threshold, edit its entry in that table and run `make docs`: the rules, the alert
# descriptions, the dashboards' lines and `grpo-monitor report` follow. Window lengths are chosen
# in the alert expressions from the exporter's feature menu (grpo_monitor/runtime/signals.py).
groups:
  - name: grpo-thresholds
    rules:
"""
_HEADINGS: dict[str, str] = {
    "red": "red cards (severity critical)",
    "yellow": "yellow cards (severity warning)",
    "cluster": "cluster health (grpo-cluster.yml)",
}
_INDENT = "      "
_WIDTH = 100


def _comment(text: str) -> list[str]:
    prose = " ".join(textwrap.dedent(text).split())
    return textwrap.wrap(prose, _WIDTH - len(_INDENT) - 2, initial_indent="# ",
                         subsequent_indent="# ", break_on_hyphens=False)


def render(table: tuple[Threshold, ...] | None = None) -> str:
    """The rule file: one ``grpo:threshold:<name>`` record per card threshold, grouped by card,
    each under its ``why`` as comment lines."""
    entries = TABLE if table is None else table
    _index(entries)
    lines = [HEADER.rstrip("\n")]
    for group in RULE_GROUPS:
        members = [t for t in entries if t.group == group]
        if not members:
            continue
        heading = f"# -- {_HEADINGS[group]} "
        lines.append(_INDENT + heading + "-" * (_WIDTH - len(_INDENT) - len(heading)))
        for t in members:
            lines += [_INDENT + c for c in _comment(t.why)]
            lines.append(f"{_INDENT}- record: {t.series}")
            lines.append(f"{_INDENT}  expr: vector({promql_number(t.value)})")
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

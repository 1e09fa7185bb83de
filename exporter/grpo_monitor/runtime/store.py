"""The latest signals per run and rank, and their pre-rendered exposition.

Written by the single ingest thread, read by scrapes. A snapshot merges into its rank's state
(a key a record leaves out keeps its last value: quantiles logged every 100 steps stay visible)
and marks the rank dirty; ``flush()``, called by the ingest thread after each batch of file
events, renders each dirty rank's sample lines once, however many records the batch held. A
scrape only joins rendered lines.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from grpo_monitor.contract import thresholds
from grpo_monitor.contract.cards import MINIMUM_CURVES, Armed, RunShape, armed_table
from grpo_monitor.contract.keys import (
    SIGNALS,
    SIGNALS_BY_KEY,
    closest_names,
    framework_of,
    is_known_unmapped,
)
from grpo_monitor.contract.snapshot import ROLLBACK, Snapshot, rollback_to
from grpo_monitor.runtime import exposition as ex
from grpo_monitor.runtime.signals import (
    BASELINE_RATIO_WINDOW,
    BASELINE_STEPS,
    GROWTH_WINDOW,
    HISTORY,
    INITIAL_STEPS,
    NONFINITE_WINDOW,
    PROMPT_TYPE_KEYS,
    RANGE_WINDOW,
    RISING_WINDOW,
    STALL_EVENTS,
    PromptTypeSignals,
    RankSignals,
    StepLog,
)
from grpo_monitor.runtime.trend import TREND_RECORDS

log = logging.getLogger("grpo_monitor.runtime.store")
# What a first start withholds from a rank read at its tail alone (on every scrape: made once).
_WITHHELD_HEADLESS = ex.WHOLE_HISTORY | ex.NEEDS_HEAD

# The event that marks a run's clean end (SnapshotWriter.close(), the TRL callback's
# on_train_end, or a line a launch script appends for verl / flat-dict runs).
RUN_END = "run_end"
# Events by which a trainer says it waits on purpose (SnapshotWriter.wait_if_paused, after a red
# card) and goes on again: a paused run is silent, and no hung run.
PAUSED, RESUMED = "paused", "resumed"
# Records of these events and no metrics are marks of the run's state, not steps.
MARK_EVENTS = frozenset({RUN_END, PAUSED, RESUMED, ROLLBACK})
# A rank's typical interval is the median over its last INTERVAL_STEPS logged steps: long
# enough that one checkpoint save or eval does not move it, short enough to follow a run
# whose pace changes (longer responses, a new curriculum stage).
INTERVAL_STEPS = 20
# A rank's pace is published from this many intervals on: the first interval or two can be
# anything (an eval at step 0 written seconds before step 1, a first step that also compiled the
# model), and the hung-run card scales its silence by the pace. Before it is known the card
# waits for grpo:threshold:run_hung_unpaced_seconds instead.
PACE_MIN_INTERVALS = 3
# (step, time) pairs kept beyond the pace window, so that a rewind of that many records leaves
# the pace as the surviving records give it.
PACE_REWIND = 64
# A run that has not ended stays in /metrics for at least this many of its log intervals,
# even past --snapshot.run-timeout: a 70B run logging every 10 minutes must be able to raise
# the hung-run card (at grpo:threshold:run_hung_intervals = 10 intervals) and hold it red for
# a while, instead of leaving /metrics first. Keep the threshold below this.
HUNG_RETAIN_INTERVALS = 30
# A run whose pace is not known yet stays as long against the card's floor for that case:
# HUNG_RETAIN_UNPACED times grpo:threshold:run_hung_unpaced_seconds (the same ratio as 30 to 10).
HUNG_RETAIN_UNPACED = 3


@dataclass(frozen=True)
class Limits:
    """Per-run cardinality caps: a trainer must not be able to blow up Prometheus."""

    max_unknown_keys: int = 256
    max_prompt_types: int = 32
    max_event_types: int = 32
    # Runs exported at once: a folder anyone can write into must not grow a scrape without
    # bound. Far above a node's runs; a record of a run beyond it is refused (and counted).
    max_runs: int = 20_000
    # Not limits but the signal settings: the baseline period of background.md#thresholds, and the initial
    # period whose mean the early cards compare with.
    baseline_steps: int = BASELINE_STEPS
    initial_steps: int = INITIAL_STEPS


@dataclass
class RankState:
    run: str
    rank: int
    step: int = 0
    time: float = 0.0
    world_size: int | None = None
    placement: tuple[str, str, str, str] | None = None
    values: dict[str, float] = field(default_factory=dict)
    by_type: dict[str, dict[str, float]] = field(default_factory=dict)
    # (key, prompt_type or "") -> value, for keys outside the canonical set.
    unknown: dict[tuple[str, str], float] = field(default_factory=dict)
    nonfinite: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    events: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    signals: RankSignals = field(default_factory=lambda: RankSignals(BASELINE_STEPS))
    # The step history of each prompt type's PROMPT_TYPE_KEYS (types under the run's cap).
    type_signals: dict[str, PromptTypeSignals] = field(default_factory=dict)
    # A re-baseline asked for a step this rank has not reached yet: (at_step, steps).
    pending_rebaseline: tuple[int, int] | None = None
    blocks: dict[str, str] = field(default_factory=dict)
    # (step, trainer time) of the newest records with new steps: the rank's pace (the last
    # INTERVAL_STEPS + 1 of them; PACE_REWIND more for a rewind).
    pace: deque[tuple[int, float]] = field(
        default_factory=lambda: deque(maxlen=INTERVAL_STEPS + 1 + PACE_REWIND))
    pace_wrote: float = 0.0  # when the newest pace entry's file was written (note_pace)
    intervals_now: tuple[float, float] | None = None  # intervals() as of the last render
    steps_logged: StepLog = field(default_factory=StepLog)  # the surviving steps
    names: dict[str, str] = field(default_factory=dict)  # canonical key -> the name logged
    # The step each newest-value entry outside the canonical histories was first logged at
    # ((key, prompt_type) of `unknown`, (prompt_type, key) of `by_type`): a rewind before it
    # drops the entry, as a fresh read of the surviving records would not have it.
    unknown_first: dict[tuple[str, str], int] = field(default_factory=dict)
    by_type_first: dict[tuple[str, str], int] = field(default_factory=dict)
    counted: set[str] = field(default_factory=set)  # its keys already in the run's key_ranks

    @property
    def logged_steps(self) -> int:
        """The rank's surviving logged steps (a step logged again counts once)."""
        return self.steps_logged.count

    def note_pace(self, step: int, when: float, wrote_at: float) -> None:
        """A new step at the trainer's ``when``, read from a file written at ``wrote_at`` (the
        exporter's view). The trainer's clock counts only while it moves forward; where it went
        back, the time that passed is the exporter's (between the files' writes). So a clock
        that jumps back and forth by an hour yields no hour-long interval (which would hold
        GRPORunHung off for hours), and one that keeps going back no zero one (which would
        raise it on a slow run after the rule's floor)."""
        if self.steps_logged.add(step):
            if self.pace and when < self.pace[-1][1]:
                when = self.pace[-1][1] + max(0.0, wrote_at - self.pace_wrote)
            self.pace_wrote = wrote_at
            self.pace.append((step, when))

    def rewind(self, keep_through: int) -> None:
        """Undo the steps after ``keep_through`` (docs/signals.md#a-runs-timeline): the rank's
        windows, baseline, levels, pace and logged steps become those of the surviving steps;
        its counters (NaNs, events) keep counting, as counters do."""
        self.steps_logged.rewind(keep_through)
        last = self.steps_logged.last()
        self.signals.rewind(keep_through, last)
        for ptype, history in list(self.type_signals.items()):
            history.rewind(keep_through)
            if not history.keys:
                del self.type_signals[ptype]
        while self.pace and self.pace[-1][0] > keep_through:
            self.pace.pop()
        for key in list(self.values):  # the newest surviving value of each key
            h = self.signals.keys.get(key)
            if h is None:
                del self.values[key]
            elif h.steps:
                self.values[key] = h.values[-1]
        for entry in [e for e, first in self.unknown_first.items() if first > keep_through]:
            del self.unknown_first[entry]
            self.unknown.pop(entry, None)
        for ptype, key in [e for e, first in self.by_type_first.items() if first > keep_through]:
            del self.by_type_first[ptype, key]
            values = self.by_type.get(ptype, {})
            values.pop(key, None)
            if not values:
                self.by_type.pop(ptype, None)
        for ptype, history in self.type_signals.items():  # the followed keys: from their history
            for key, h in history.keys.items():
                if h.steps and key in self.by_type.get(ptype, {}):
                    self.by_type[ptype][key] = h.values[-1]
        self.step = last if last is not None else 0

    def rebaseline(self, steps: int) -> None:
        """The last ``steps`` steps become the rank's baseline, and its prompt types' too."""
        self.signals.rebaseline(steps)
        for history in self.type_signals.values():
            history.rebaseline()

    def intervals(self) -> tuple[float, float] | None:
        """(seconds per step, seconds per record): medians over the pace window; None before
        PACE_MIN_INTERVALS intervals (note_pace keeps the pace's clock from going back)."""
        per_step: list[float] = []
        per_record: list[float] = []
        pace = list(self.pace)[-(INTERVAL_STEPS + 1):]
        for (s0, t0), (s1, t1) in zip(pace, pace[1:]):
            per_step.append((t1 - t0) / (s1 - s0))
            per_record.append(t1 - t0)
        if len(per_step) < PACE_MIN_INTERVALS:
            return None
        return statistics.median(per_step), statistics.median(per_record)

    def render(self) -> None:
        self.intervals_now = self.intervals()  # read by the run's render, once per rank change
        base = f'run="{ex.escape_label(self.run)}",rank="{self.rank}"'
        out: dict[str, list[str]] = defaultdict(list)
        out[ex.STEP.name].append(f"{ex.STEP.name}{{{base}}} {self.step}\n")
        out[ex.LAST_SNAPSHOT.name].append(
            f"{ex.LAST_SNAPSHOT.name}{{{base}}} {ex.format_value(self.time)}\n")
        if self.world_size is not None:
            out[ex.WORLD_SIZE.name].append(f"{ex.WORLD_SIZE.name}{{{base}}} {self.world_size}\n")
        if self.placement is not None:
            host, local_rank, gpu, uuid = (ex.escape_label(v) for v in self.placement)
            out[ex.RANK_INFO.name].append(
                f'{ex.RANK_INFO.name}{{{base},host="{host}",local_rank="{local_rank}",gpu="{gpu}",'
                f'uuid="{uuid}"}} 1\n')
        typed = [(f'{base},prompt_type="{ex.escape_label(t)}"', v) for t, v in self.by_type.items()]
        for sig in SIGNALS:
            extra = "".join(f',{k}="{v}"' for k, v in sig.labels)
            lines = out[sig.metric]
            if sig.key in self.values:
                lines.append(f"{sig.metric}{{{base}{extra}}} {ex.format_value(self.values[sig.key])}\n")
            for lbl, vals in typed:
                if sig.key in vals:
                    lines.append(f"{sig.metric}{{{lbl}{extra}}} {ex.format_value(vals[sig.key])}\n")
        for (key, ptype), value in self.unknown.items():
            pt = f',prompt_type="{ex.escape_label(ptype)}"' if ptype else ""
            out[ex.UNKNOWN_VALUE.name].append(
                f'{ex.UNKNOWN_VALUE.name}{{{base},key="{ex.escape_label(key)}"{pt}}} {ex.format_value(value)}\n')
        for key, n in self.nonfinite.items():
            out[ex.NONFINITE.name].append(
                f'{ex.NONFINITE.name}{{{base},key="{ex.escape_label(key)}"}} {n}\n')
        for etype, n in self.events.items():
            out[ex.EVENTS.name].append(f'{ex.EVENTS.name}{{{base},type="{ex.escape_label(etype)}"}} {n}\n')
        self._render_features(base, out)
        self.blocks = {name: "".join(lines) for name, lines in out.items() if lines}

    def _render_features(self, base: str, out: dict[str, list[str]]) -> None:
        f = self.signals.features()
        fv = ex.format_value
        out[ex.BASELINE_READY.name].append(f"{ex.BASELINE_READY.name}{{{base}}} {int(f.ready)}\n")
        out[ex.BASELINE_REMAINING.name].append(
            f"{ex.BASELINE_REMAINING.name}{{{base}}} {self.signals.baseline_steps_to_go}\n")
        for key, (mean, std) in f.baseline.items():
            lbl = f'{base},key="{key}"'
            out[ex.BASELINE_MEAN.name].append(f"{ex.BASELINE_MEAN.name}{{{lbl}}} {fv(mean)}\n")
            out[ex.BASELINE_STDDEV.name].append(f"{ex.BASELINE_STDDEV.name}{{{lbl}}} {fv(std)}\n")
        for key, mean in f.initial.items():
            out[ex.INITIAL_MEAN.name].append(f'{ex.INITIAL_MEAN.name}{{{base},key="{key}"}} {fv(mean)}\n')
        for key, window, offset, mean in f.means:
            out[ex.WINDOW_MEAN.name].append(
                f'{ex.WINDOW_MEAN.name}{{{base},key="{key}",window_steps="{window}",'
                f'offset_steps="{offset}"}} {fv(mean)}\n')
        for key, ratio in f.baseline_ratios.items():
            out[ex.BASELINE_RATIO.name].append(
                f'{ex.BASELINE_RATIO.name}{{{base},key="{key}",window_steps="{BASELINE_RATIO_WINDOW}"}} '
                f'{fv(ratio)}\n')
        for key, offset, g in f.growth:
            out[ex.GROWTH.name].append(
                f'{ex.GROWTH.name}{{{base},key="{key}",window_steps="{GROWTH_WINDOW}",'
                f'offset_steps="{offset}"}} {fv(g)}\n')
        for key, window, lo, hi in f.extremes:
            lbl = f'{base},key="{key}",window_steps="{window}"'
            out[ex.WINDOW_MIN.name].append(f"{ex.WINDOW_MIN.name}{{{lbl}}} {fv(lo)}\n")
            out[ex.WINDOW_MAX.name].append(f"{ex.WINDOW_MAX.name}{{{lbl}}} {fv(hi)}\n")
        for key, window, p10, p90 in f.percentiles:
            lbl = f'{base},key="{key}",window_steps="{window}"'
            out[ex.WINDOW_P10.name].append(f"{ex.WINDOW_P10.name}{{{lbl}}} {fv(p10)}\n")
            out[ex.WINDOW_P90.name].append(f"{ex.WINDOW_P90.name}{{{lbl}}} {fv(p90)}\n")
        for key, (lo, hi) in f.ranges.items():
            lbl = f'{base},key="{key}",window_steps="{RANGE_WINDOW}"'
            out[ex.RUN_WINDOW_MEAN_MAX.name].append(f"{ex.RUN_WINDOW_MEAN_MAX.name}{{{lbl}}} {fv(hi)}\n")
            out[ex.RUN_WINDOW_MEAN_MIN.name].append(f"{ex.RUN_WINDOW_MEAN_MIN.name}{{{lbl}}} {fv(lo)}\n")
        for key, n in f.rising.items():
            out[ex.RISING.name].append(
                f'{ex.RISING.name}{{{base},key="{key}",window_steps="{RISING_WINDOW}"}} {n}\n')
        for key, n in f.nonfinite.items():  # an unknown key's NaN too: its name is the trainer's
            out[ex.WINDOW_NONFINITE.name].append(
                f'{ex.WINDOW_NONFINITE.name}{{{base},key="{ex.escape_label(key)}",'
                f'window_steps="{NONFINITE_WINDOW}"}} {n}\n')
        for key, since in f.nonfinite_since.items():
            out[ex.NONFINITE_SINCE.name].append(
                f'{ex.NONFINITE_SINCE.name}{{{base},key="{ex.escape_label(key)}",'
                f'window_steps="{NONFINITE_WINDOW}"}} {since}\n')
        for key, window, trend in f.slopes:
            out[ex.WINDOW_SLOPE.name].append(
                f'{ex.WINDOW_SLOPE.name}{{{base},key="{key}",window_steps="{window}"}} {fv(trend)}\n')
        for key, count, offset, lo, hi, median in f.records:
            lbl = f'{base},key="{key}",records="{count}",offset_records="{offset}"'
            out[ex.RECORDS_MIN.name].append(f"{ex.RECORDS_MIN.name}{{{lbl}}} {fv(lo)}\n")
            out[ex.RECORDS_MAX.name].append(f"{ex.RECORDS_MAX.name}{{{lbl}}} {fv(hi)}\n")
            out[ex.RECORDS_MEDIAN.name].append(f"{ex.RECORDS_MEDIAN.name}{{{lbl}}} {fv(median)}\n")
        for key, median in f.first_records.items():
            out[ex.FIRST_RECORDS_MEDIAN.name].append(
                f'{ex.FIRST_RECORDS_MEDIAN.name}{{{base},key="{key}"}} {fv(median)}\n')
        for key, t in f.trends.items():
            lbl = f'{base},key="{key}",records="{TREND_RECORDS}"'
            out[ex.TREND_Z.name].append(f"{ex.TREND_Z.name}{{{lbl}}} {fv(t.z)}\n")
            out[ex.TREND_SLOPE.name].append(f"{ex.TREND_SLOPE.name}{{{lbl}}} {fv(t.slope)}\n")
            if (factor := t.factor) is not None:
                out[ex.TREND_FACTOR.name].append(f"{ex.TREND_FACTOR.name}{{{lbl}}} {fv(factor)}\n")
        if (held := f.heldout) is not None:
            for fam, value in ((ex.HELDOUT_BEST, held.best), (ex.HELDOUT_RECENT, held.recent),
                               (ex.HELDOUT_NOISE, held.noise), (ex.HELDOUT_POINTS, held.points),
                               (ex.HELDOUT_REWARD_AT_BEST, held.reward_at_best),
                               (ex.HELDOUT_SMOOTH_BEST, held.smooth_best),
                               (ex.HELDOUT_SMOOTH_RECENT, held.smooth_recent),
                               (ex.HELDOUT_REWARD_AT_SMOOTH_BEST, held.reward_at_smooth_best)):
                if value is not None:
                    out[fam.name].append(f"{fam.name}{{{base}}} {fv(value)}\n")
        if f.law is not None:
            for fam, value in ((ex.FORECAST_LAW_SCALE, f.law.a), (ex.FORECAST_LAW_OFFSET, f.law.b),
                               (ex.FORECAST_CEILING, f.law.ceiling), (ex.FORECAST_R2, f.law.r_squared),
                               (ex.FORECAST_POINTS, f.law.points)):
                out[fam.name].append(f"{fam.name}{{{base}}} {fv(value)}\n")
        for ptype, history in self.type_signals.items():
            lbl = f'{base},prompt_type="{ex.escape_label(ptype)}"'
            for key, window, offset, mean in history.means():
                out[ex.PROMPT_TYPE_WINDOW_MEAN.name].append(
                    f'{ex.PROMPT_TYPE_WINDOW_MEAN.name}{{{lbl},key="{key}",window_steps="{window}",'
                    f'offset_steps="{offset}"}} {fv(mean)}\n')
            for key, mean in history.initial().items():
                out[ex.PROMPT_TYPE_INITIAL_MEAN.name].append(
                    f'{ex.PROMPT_TYPE_INITIAL_MEAN.name}{{{lbl},key="{key}"}} {fv(mean)}\n')


@dataclass
class RunState:
    name: str
    last_write: float = 0.0  # newest mtime of a file that fed this run
    ranks: dict[int, RankState] = field(default_factory=dict)
    unknown_keys: set[str] = field(default_factory=set)
    prompt_types: set[str] = field(default_factory=set)
    event_types: set[str] = field(default_factory=set)
    dropped: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    rebaseline: tuple[int, int] | None = None  # (at_step, steps), from the run's control file
    # The clean end: set by a run_end event, cleared when the run goes on after it (see apply).
    ended: bool = False
    end_step: int = 0
    end_ranks: set[int] = field(default_factory=set)
    # Ranks whose newest record says they wait on purpose (a "paused" mark).
    paused_ranks: set[int] = field(default_factory=set)
    # The slowest rank's typical (seconds per step, seconds per record), as last rendered.
    pace: tuple[float, float] | None = None
    blocks: dict[str, str] = field(default_factory=dict)
    framework: str = ""  # who wrote the run, once known (grpo_run_info)
    # What its first record was read from: a logger's format, or snapshots ("": a state saved
    # before loggers' files were read, when there was nothing but snapshots).
    source: str = ""
    key_ranks: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # canonical key -> ranks
    closest: dict[str, list[str]] = field(default_factory=dict)  # unknown key -> likely meant
    armed: list[Armed] = field(default_factory=list)  # the armed table, as last rendered

    def admit(self, kind: str, seen: set[str], name: str, cap: int) -> bool:
        if name in seen:
            return True
        if len(seen) < cap:
            seen.add(name)
            return True
        self.dropped[kind] += 1
        return False

    def shape(self) -> RunShape:
        """What the armed table reads of the run (contract/cards.py)."""
        ranks = self.ranks.values()
        return RunShape(
            key_ranks=dict(self.key_ranks), ranks=len(self.ranks),
            baseline_steps_to_go=min((r.signals.baseline_steps_to_go for r in ranks), default=0),
            prompt_types=max((len(r.type_signals) for r in ranks), default=0),
            gpus=any(r.placement is not None and r.placement[3] for r in ranks), ended=self.ended)

    def note_keys(self, rank: RankState) -> bool:
        """Count the canonical keys the rank logs for the first time (cheap when none is new);
        whether there was one."""
        keys = rank.signals.keys
        if len(keys) == len(rank.counted):
            return False
        for key in keys.keys() - rank.counted:
            rank.counted.add(key)
            if key in SIGNALS_BY_KEY:
                self.key_ranks[key] += 1
        return True

    def note_unknown(self, name: str) -> None:
        """The first sight of a key that maps to no signal: named once in the log, with the
        names it most likely meant, and kept for grpo_unknown_key_info."""
        if is_known_unmapped(name):  # a framework's own, unmapped on purpose: nothing to say
            self.closest[name] = []
            return
        self.closest[name] = close = closest_names(name)
        if close:
            log.warning("run %s logs %r, which maps to no signal: did you mean %s? It is exported "
                        "as grpo_metric_value, and no card reads it", self.name, name,
                        " or ".join(repr(c) for c in close))
        else:
            log.info("run %s logs %r, which maps to no signal: exported as grpo_metric_value",
                     self.name, name)

    def _coverage_blocks(self, run: str) -> dict[str, str]:
        self.armed = armed_table(self.shape())
        steps = max((r.logged_steps for r in self.ranks.values()), default=0)
        cards = "".join(
            f'{ex.CARD_ARMED.name}{{run="{run}",card="{a.card.name}",severity="{a.card.severity}",'
            f'reason="{a.reason}",needs="{",".join(a.needs)}"}} {int(a.reason == "armed")}\n'
            for a in self.armed)
        logged = "".join(f'{ex.SIGNAL_LOGGED.name}{{run="{run}",key="{k}"}} {int(k in self.key_ranks)}\n'
                         for k in MINIMUM_CURVES)
        unknown = "".join(
            f'{ex.UNKNOWN_KEY_INFO.name}{{run="{run}",key="{ex.escape_label(k)}",'
            f'closest="{ex.escape_label(",".join(c))}"}} 1\n' for k, c in self.closest.items())
        return {ex.RUN_INFO.name: f'{ex.RUN_INFO.name}{{run="{run}",framework="{ex.escape_label(self.framework)}",'
                                  f'source="{self.source or "snapshots"}"}} 1\n',
                ex.RUN_LOGGED_STEPS.name: f'{ex.RUN_LOGGED_STEPS.name}{{run="{run}"}} {steps}\n',
                ex.SIGNAL_LOGGED.name: logged, ex.CARD_ARMED.name: cards, ex.UNKNOWN_KEY_INFO.name: unknown}

    def render(self) -> None:
        run = ex.escape_label(self.name)
        lbl = f'{{run="{run}"}}'
        paces = [p for r in self.ranks.values() if (p := r.intervals_now) is not None]
        # The slowest rank sets the run's pace (the ranks meet in every collective), and the
        # longer interval is the safer one to judge a silence by.
        self.pace = (max(p[0] for p in paces), max(p[1] for p in paces)) if paces else None
        blocks = {
            ex.RUN_ENDED.name: f"{ex.RUN_ENDED.name}{lbl} {int(self.ended)}\n",
            ex.RUN_PAUSED.name: f"{ex.RUN_PAUSED.name}{lbl} {int(bool(self.paused_ranks))}\n",
            ex.RUN_LAST_WRITE.name: f"{ex.RUN_LAST_WRITE.name}{lbl} {ex.format_value(self.last_write)}\n",
        }
        if self.pace is not None:
            blocks[ex.RUN_STEP_INTERVAL.name] = (
                f"{ex.RUN_STEP_INTERVAL.name}{lbl} {ex.format_value(self.pace[0])}\n")
            blocks[ex.RUN_LOG_INTERVAL.name] = (
                f"{ex.RUN_LOG_INTERVAL.name}{lbl} {ex.format_value(self.pace[1])}\n")
        name = ex.CARDINALITY_DROPPED.name
        blocks[name] = "".join(f'{name}{{run="{run}",kind="{k}"}} {n}\n' for k, n in self.dropped.items())
        blocks.update(self._coverage_blocks(run))
        self.blocks = {k: v for k, v in blocks.items() if v}

    def note_end(self, snap: Snapshot, ending: bool) -> None:
        """Track the run's clean end. The ranks' last records may arrive after another rank's
        run_end, so an ordinary record continues a run that ended only when it comes from a
        rank that already wrote its end (a new process: the run was resumed), or is past the
        newest step the run had reached at its end."""
        if ending:
            self.ended = True
            self.end_ranks.add(snap.rank)
            self.end_step = max(self.end_step, snap.step, *(r.step for r in self.ranks.values()))
        elif self.ended and (snap.rank in self.end_ranks or snap.step > self.end_step):
            self.ended = False
            self.end_ranks.clear()


class RunStore:
    """Thread-safe map run -> rank -> latest signals."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._runs: dict[str, RunState] = {}
        self._dirty: set[tuple[str, int]] = set()
        # Ranks changed since the last saved state, which encodes only these again: the dirty
        # ranks of every flush since (saved_state.py). None while nothing saves the store.
        self._unsaved: set[tuple[str, int]] | None = None
        self._lock = threading.Lock()
        # Runs a first start read at their files' heads and tails, until the backfill swaps in
        # the run read whole (adopt): their ex.WHOLE_HISTORY families are not published, nor
        # the ex.NEEDS_HEAD families of the ranks they map to, read at their tails alone.
        self._partial: dict[str, frozenset[int]] = {}
        # Bumped by every change (on the ingest thread): a saved state of the same generation
        # need not be written again (an idle exporter writes nothing).
        self.generation = 0

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store still (no scrape renders meanwhile)."""
        with self._lock:
            yield

    def saved_runs(self) -> dict[str, RunState]:
        """The runs, for a saved state (saved_state.py). Only the ingest thread changes the store,
        and it is the one that saves: what this returns holds still while it is encoded, without
        the lock, so a scrape never waits for a save."""
        return self._runs

    def take_unsaved(self) -> set[tuple[str, int]]:
        """The ranks changed since the last save (rendered since, or waiting to be), now taken
        as saved; ingest thread only."""
        taken, self._unsaved = (self._unsaved or set()) | self._dirty, set()
        return taken

    def untake_unsaved(self, ranks: set[tuple[str, int]]) -> None:
        """A save of ``ranks`` failed: they are unsaved again."""
        self._unsaved = (self._unsaved or set()) | ranks

    def restore(self, runs: dict[str, RunState]) -> None:
        """The runs of a saved state: every rank's series rendered at the next flush, by this
        code (a saved state holds no rendered series)."""
        with self._lock:
            self._runs = dict(runs)
            self._dirty = {(name, rank) for name, run in runs.items() for rank in run.ranks}
            self._unsaved = set(self._dirty)
            self.generation += 1

    def mark_partial(self, runs: dict[str, set[int]]) -> None:
        """These runs were read at their files' heads and tails, the ranks each maps to at
        their tails alone: their ex.WHOLE_HISTORY families, and those ranks' ex.NEEDS_HEAD
        families, wait for adopt()."""
        with self._lock:
            for name, headless in runs.items():
                self._partial[name] = self._partial.get(name, frozenset()) | headless

    def partial_runs(self) -> set[str]:
        """The runs marked partial; ingest thread only, which alone changes them: without the
        lock, so a save never waits for a scrape."""
        return set(self._partial)

    def headless_ranks(self) -> dict[str, frozenset[int]]:
        """The ranks of each partial run read at their tails alone; ingest thread only."""
        return {name: ranks for name, ranks in self._partial.items() if ranks}

    def adopt(self, run: RunState) -> bool:
        """Serve ``run`` in place of the run of its name, which a first start read from its
        files' heads and tails (ingest.py): the same run, read whole (backfill.py). Every rank
        is rendered again at the next flush. False when the run is gone meanwhile."""
        with self._lock:
            self._partial.pop(run.name, None)
            if run.name not in self._runs:
                return False
            self._runs[run.name] = run
            self._dirty = {d for d in self._dirty if d[0] != run.name}
            self._dirty |= {(run.name, rank) for rank in run.ranks}
            self.generation += 1
            return True

    def run_state(self, run_name: str) -> RunState | None:
        """The run of that name, if exported; ingest thread only (it alone changes the store)."""
        return self._runs.get(run_name)

    def baseline_read(self, run_name: str, rank_id: int) -> bool:
        """Whether the rank's records so far hold its whole baseline period (so its initial
        values too): what a first start reads of a long file's head. Ingest thread only."""
        run = self._runs.get(run_name)
        rank = run.ranks.get(rank_id) if run is not None else None
        return rank is not None and rank.signals.ready

    def reach(self, run_name: str, rank_id: int) -> int:
        """Steps back from the rank's newest that its series read (RankSignals.reach)."""
        run = self._runs.get(run_name)
        rank = run.ranks.get(rank_id) if run is not None else None
        return rank.signals.reach() if rank is not None else HISTORY

    def apply(self, snap: Snapshot, wrote_at: float) -> bool:
        """Merge one snapshot; ``wrote_at`` is the mtime of the file it came from. False when it
        is refused: a new run while ``max_runs`` runs are exported."""
        lim = self.limits
        with self._lock:
            self.generation += 1
            run = self._runs.get(snap.run)
            if run is None:
                if len(self._runs) >= lim.max_runs:
                    return False
                run = self._runs[snap.run] = RunState(snap.run)
                # Pre-declare the kinds so that rate() sees a 0 before the first drop.
                run.dropped.update({"unknown_key": 0, "prompt_type": 0, "event_type": 0})
            # Capped at our clock: a file server whose clock runs ahead must not make a run
            # look fresh (or its silence short) for as long as it is ahead.
            run.last_write = max(run.last_write, min(wrote_at, time.time()))
            types = {e.type for e in snap.events}
            ending = RUN_END in types
            if types & MARK_EVENTS and not (snap.metrics or snap.unknown or snap.by_type):
                # A bare mark (the SDK's close() or wait_if_paused(), or a line appended by a
                # launch script, maybe with step 0): it is no step of the rank, and must not
                # move its step, its pace or its windows, nor create a rank the run lacks.
                if ending:
                    run.note_end(snap, True)
                if PAUSED in types:
                    run.paused_ranks.add(snap.rank)
                if RESUMED in types:
                    run.paused_ranks.discard(snap.rank)
                rank = run.ranks.get(snap.rank)
                if rank is not None and ROLLBACK in types:
                    self._rewind(run, rank, snap, step_record=False)
                for event in snap.events if rank is not None else ():
                    if run.admit("event_type", run.event_types, event.type, lim.max_event_types):
                        rank.events[event.type] += 1
                self._dirty.add((snap.run, snap.rank))
                return True
            rank = run.ranks.get(snap.rank)
            if rank is not None and (first := rank.steps_logged.first()) is not None and \
                    snap.step <= first and snap.step < rank.step:
                # The run starts over (a re-run under the same name, a folder deleted and made
                # again): a new run, judged from nothing, its other ranks as they log again.
                log.info("run %s: rank %d logged step %d, at or before its first step %d: the "
                         "run starts over", snap.run, snap.rank, snap.step, first)
                run = self._runs[snap.run] = RunState(snap.run)
                run.dropped.update({"unknown_key": 0, "prompt_type": 0, "event_type": 0})
                run.last_write = min(wrote_at, time.time())
                self._dirty = {d for d in self._dirty if d[0] != snap.run}
                rank = None
            run.source = run.source or snap.source
            run.note_end(snap, ending)
            run.paused_ranks.discard(snap.rank)  # it wrote a step: it is not waiting
            if rank is not None and (snap.step < rank.step or ROLLBACK in types):
                self._rewind(run, rank, snap, step_record=True)
            if rank is None:
                rank = run.ranks[snap.rank] = RankState(
                    snap.run, snap.rank, signals=RankSignals(lim.baseline_steps, lim.initial_steps),
                    pending_rebaseline=run.rebaseline)
            rank.step, rank.time = snap.step, snap.time
            rank.note_pace(snap.step, snap.time, min(wrote_at, time.time()))
            stalled = any(e.type in STALL_EVENTS for e in snap.events)
            rank.signals.add(snap.step, snap.metrics, stalled)
            # What a record's names say (which name a key was logged under, which framework)
            # can only change with a name new to the run: not looked at again per record.
            new_names = run.note_keys(rank)
            if new_names:
                rank.names.update(snap.names)
            if snap.world_size is not None:
                rank.world_size = snap.world_size
            if snap.placement is not None:
                rank.placement = snap.placement
            rank.values.update(snap.metrics)
            self._count_nonfinite(rank, snap.metrics)
            for name, value in snap.unknown.items():
                new = name not in run.unknown_keys
                if run.admit("unknown_key", run.unknown_keys, name, lim.max_unknown_keys):
                    if new:
                        run.note_unknown(name)
                        new_names = True
                    rank.unknown[(name, "")] = value
                    rank.unknown_first.setdefault((name, ""), snap.step)
                    self._count_nonfinite(rank, {name: value}, snap.step)
            if not run.framework and (new_names or snap.framework):
                run.framework = snap.framework or framework_of([*snap.names.values(), *snap.unknown]) or ""
            for ptype in snap.by_type:  # record order: which types a cap keeps is stable
                if not run.admit("prompt_type", run.prompt_types, ptype, lim.max_prompt_types):
                    continue
                typed = snap.by_type.get(ptype, {})
                rank.by_type.setdefault(ptype, {}).update(typed)
                for key in typed:
                    rank.by_type_first.setdefault((ptype, key), snap.step)
                followed = {k: typed[k] for k in PROMPT_TYPE_KEYS if k in typed}
                if followed:
                    history = rank.type_signals.get(ptype)
                    if history is None:
                        history = rank.type_signals[ptype] = PromptTypeSignals(lim.initial_steps)
                    history.add(snap.step, followed)
                self._count_nonfinite(rank, typed, snap.step)
                for name, value in snap.by_type_unknown.get(ptype, {}).items():
                    new = name not in run.unknown_keys
                    if run.admit("unknown_key", run.unknown_keys, name, lim.max_unknown_keys):
                        if new:
                            run.note_unknown(name)
                        rank.unknown[(name, ptype)] = value
                        rank.unknown_first.setdefault((name, ptype), snap.step)
                        self._count_nonfinite(rank, {name: value}, snap.step)
            for event in snap.events:
                if run.admit("event_type", run.event_types, event.type, lim.max_event_types):
                    rank.events[event.type] += 1
            # After the step is in every history (the rank's and its prompt types'): the
            # re-baseline's window ends at this step for all of them.
            if rank.pending_rebaseline and snap.step >= rank.pending_rebaseline[0]:
                rank.rebaseline(rank.pending_rebaseline[1])
                rank.pending_rebaseline = None
            self._dirty.add((snap.run, snap.rank))
            return True

    def flush(self) -> None:
        """Render the ranks (and their runs) changed since the last flush."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            if self._unsaved is not None:
                self._unsaved |= dirty
            self.generation += bool(dirty)
            runs: dict[str, RunState] = {}
            for run_name, rank_id in dirty:
                run = self._runs.get(run_name)
                if run is None:
                    continue  # expired meanwhile
                if rank_id in run.ranks:
                    run.ranks[rank_id].render()
                runs[run_name] = run
            # Once per run, after its ranks: the run's pace reads every rank (1024 ranks
            # rendering the run each would be a million medians a batch).
            for run in runs.values():
                run.render()

    def rebaseline(self, run_name: str, at_step: int, steps: int) -> bool:
        """Make the ``steps`` values up to ``at_step`` each rank's new baseline.

        A rank already past ``at_step`` takes its last ``steps`` values now; one not there yet
        (a replay after a restart, or a step in the future) when it gets there. False when
        refused, as ``apply`` refuses: a new run while ``max_runs`` runs are exported.
        """
        with self._lock:
            self.generation += 1
            run = self._runs.get(run_name)
            if run is None:
                if len(self._runs) >= self.limits.max_runs:
                    return False
                run = self._runs[run_name] = RunState(run_name)
            run.rebaseline = (at_step, steps)
            for rank in run.ranks.values():
                if rank.step >= at_step:
                    rank.rebaseline(steps)
                    rank.pending_rebaseline = None
                    self._dirty.add((run_name, rank.rank))
                else:
                    rank.pending_rebaseline = (at_step, steps)
                    if self._unsaved is not None:
                        self._unsaved.add((run_name, rank.rank))
        return True

    @staticmethod
    def _rewind(run: RunState, rank: RankState, snap: Snapshot, step_record: bool) -> None:
        """Undo what a record says is undone: the steps after a rollback event's ``to_step``,
        and, for a step record older than the rank's newest, those from its own step on (a
        mark's step says nothing: SDK marks carry the rank's step, launch scripts 0)."""
        keep = snap.step - 1 if step_record and snap.step < rank.step else rank.step
        if (back := rollback_to(snap.events)) is not None:
            keep = min(keep, back)
        if keep >= rank.step:
            return
        undone = rank.signals.rebased_at is not None and keep < rank.signals.rebased_at
        rank.rewind(keep)
        # A re-baseline applied at an undone step applies again: now for a rank still past its
        # step (as rebaseline() does), else when the rank gets there.
        if undone and run.rebaseline is not None:
            if rank.step >= run.rebaseline[0]:
                rank.rebaseline(run.rebaseline[1])
            else:
                rank.pending_rebaseline = run.rebaseline

    @staticmethod
    def _count_nonfinite(rank: RankState, values: dict[str, float], step: int | None = None) -> None:
        """Count NaN / Inf; ``step``: also note them in the window that the red card reads (the
        canonical values reach it through RankSignals.add)."""
        for key, value in values.items():
            if not math.isfinite(value):
                rank.nonfinite[key] += 1
                if step is not None:
                    rank.signals.note_nonfinite(key, step)

    def expire(self, now: float, timeout: float) -> list[str]:
        """Drop runs whose files have not been written for ``timeout`` seconds; their names.

        A run that has not ended stays for at least HUNG_RETAIN_INTERVALS of its log
        intervals, or HUNG_RETAIN_UNPACED times the hung card's floor while its pace is not
        known: its silence is what the hung-run card judges, which it cannot do on a run that
        left /metrics."""
        unpaced = HUNG_RETAIN_UNPACED * thresholds.value("run_hung_unpaced_seconds")

        def keep_for(run: RunState) -> float:
            if run.ended:
                return timeout
            if run.pace is None:
                return max(timeout, unpaced)
            return max(timeout, HUNG_RETAIN_INTERVALS * run.pace[1])

        with self._lock:
            gone = [name for name, run in self._runs.items() if now - run.last_write > keep_for(run)]
            for name in gone:
                del self._runs[name]
                self._partial.pop(name, None)
            self.generation += bool(gone)
        return gone

    def forget_run(self, run_name: str) -> bool:
        """Drop a run whose folder is gone (deleted, or renamed: ingest.run_folder_gone);
        whether it was here."""
        with self._lock:
            self.generation += 1
            self._dirty = {d for d in self._dirty if d[0] != run_name}
            self._partial.pop(run_name, None)
            return self._runs.pop(run_name, None) is not None

    def max_step(self, run_name: str) -> int | None:
        """The newest step any rank of the run reported; None for a run not (or no longer) seen."""
        with self._lock:
            run = self._runs.get(run_name)
            return max((r.step for r in run.ranks.values()), default=None) if run else None

    def runs(self) -> list[RunState]:
        """Every run's state, by name: for a tool that reads a folder on one thread (``grpo-monitor
        check``); the exporter's scrapes read the rendered blocks instead."""
        with self._lock:
            return [self._runs[name] for name in sorted(self._runs)]

    def run_count(self) -> int:
        with self._lock:
            return len(self._runs)

    def render(self) -> list[str]:
        """The exposition text of every run family, as chunks to join."""
        chunks: list[str] = []
        with self._lock:
            # Gather each family's blocks by walking the blocks each rank has, rather than asking
            # every rank for every family: a rank has about half of the ~80 families (the windows
            # come with steps), and 1024 ranks x 80 lookups were most of a scrape's time.
            by_family: dict[str, list[str]] = {}
            partial = self._partial
            for run in self._runs.values():
                headless = partial.get(run.name)
                hidden = ex.WHOLE_HISTORY if headless is not None else ()
                for rank_id, r in run.ranks.items():
                    hide = _WITHHELD_HEADLESS if headless and rank_id in headless else hidden
                    for name, block in r.blocks.items():
                        if hide and name in hide:
                            continue
                        if (blocks := by_family.get(name)) is None:
                            by_family[name] = [block]
                        else:
                            blocks.append(block)
            for fam in ex.RANK_FAMILIES:
                if blocks := by_family.get(fam.name):
                    chunks.append(fam.header())
                    chunks.extend(blocks)
            runs = list(self._runs.values())
            for fam in ex.RUN_FAMILIES:
                shown = [run for run in runs if run.name not in partial] \
                    if partial and fam.name in ex.WHOLE_HISTORY else runs
                blocks = [b for run in shown if (b := run.blocks.get(fam.name)) is not None]
                if blocks:
                    chunks.append(fam.header())
                    chunks.extend(blocks)
        return chunks

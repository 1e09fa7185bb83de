"""The cards on every shared real run, against labels: catches, misses, false reds, delays.

Usage: python bench/bench_real_runs.py [RUN ...] [--runs-dir DIR] [--out PATH] [--markdown]

Each run of the shared collection (tests/real_runs.py: ``$GRPO_REAL_RUNS``, else
``../shared/real-runs`` beside the repository) is played through the exporter's ingest and store
and judged by the committed rule files in the real promtool, one scrape per logged step
(``real_runs.play_real``, ``promtool_harness.fired_at``). Each run has a label below (healthy or
sick, the onset, the cards that count as catching its sickness), and the script prints:

* per run: every card that fired, its severity and the step ranges it fired at; whether the
  sickness was caught, by which card, at which step and with what delay;
* per card: the sick runs it caught within CAUGHT_WITHIN steps of the onset, the ones it missed,
  the healthy runs it fired red on (false reds), the sick runs it fired red on before the onset,
  and its delays.

**Leave one repository out.** The claim is that each repository's runs are judged by rules set
without looking at them. Most thresholds come from the domain rules (docs/background.md) and the
synthetic scenarios, but some rule branches were shaped while looking at a shared run (TUNED_ON
names them, with the repositories whose runs were looked at). Each run is therefore judged twice: by the committed
rules, and by the committed rules less every branch tuned on its own repository (the rule files
rewritten without those rules, the same play, the real promtool). The second is the
generalisation figure; both are printed, and a catch that only a branch tuned on the run's own
repository makes is no catch in the second.

It is an evaluation, not a test: it exits 0 whatever the cards did (1 only when the collection
is missing). ``--markdown`` prints the tables of docs/benchmarks.md ("Cards on the real runs")
instead of the plain ones. Writes bench/results/real_runs.json. The data is never copied here.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import real_runs  # noqa: E402
import yaml  # noqa: E402
from promtool_harness import RULE_FILES, RULES_DIR, alerts, fired_at, intervals  # noqa: E402
from results_io import machine, write_result  # noqa: E402

# A catch is a counting card firing at a logged step in [onset, onset + CAUGHT_WITHIN]: the
# standard of tests/test_real_run_cards.py, and most real runs are too short for a later one.
CAUGHT_WITHIN = 50
# The coverage card says a run does not log a signal; true of a healthy run as of a sick one, it
# neither catches a sickness nor counts as a false alarm.
COVERAGE = "GRPOSignalMissing"
# Red cards a replay cannot raise: GRPORunHung reads the files' modification times and
# GRPOGPUXidError NVML's events (tests/test_run_hung.py and tests/test_gpu_collector.py prove
# them). Left out of the per-card table unless they fire; they count like any red card if so.
REPLAY_BLIND = frozenset({"GRPORunHung", "GRPOGPUXidError"})
# Any card whose name starts with this (a held-out score falling) counts for every sickness: a
# policy that stops transferring is sick whatever the cause.
HELD_OUT_PREFIX = "GRPOHeldOut"


def rule_files() -> list[str]:
    """The project's card files: every grpo-*.yml of prometheus/rules that holds an alert (a file
    added there is read the day it is added)."""
    return [p.name for p in sorted(RULES_DIR.glob("grpo-*.yml")) if alerts(p.name)]


def severities() -> dict[str, set[str]]:
    """alert name -> its severities, from the rule files (a name has several rules)."""
    out: dict[str, set[str]] = {}
    for rule in alerts(*rule_files()):
        out.setdefault(rule["alert"], set()).add(rule["labels"]["severity"])
    return out


SEVERITIES = severities()
RED = frozenset(a for a, s in SEVERITIES.items() if "critical" in s)


# -- labels -------------------------------------------------------------------------------------

class Label(NamedTuple):
    verdict: str  # "healthy" or "sick"
    onset: int | None  # the first sick logged step; None for a healthy run
    catches: frozenset[str]  # the yellow cards that name this sickness (any red card counts too)
    reason: str  # where in the run's PROVENANCE.md the verdict and the onset come from


# The yellow cards of each kind of sickness. A card counts when it reads a signal that the run's
# authors (or its data) name as what went wrong.
DEAD_SIGNAL = frozenset({"GRPOAdvantageVanishing",  # zero-std groups: no advantage, no gradient
                         "GRPOPromptsTooHard"})  # all-wrong groups: the reward-0 cause of it
# Length and entropy collapsing together, with the zero-std groups that follow.
COLLAPSE = frozenset({"GRPOResponseLengthShift", "GRPOCompletionsTruncated",
                      "GRPOEntropyCovarianceSurge", "GRPOAdvantageVanishing"})
# KL, length, truncation and the gradient blowing up, and the held-out score falling with them.
# GRPORewardHackingSuspected and GRPORewardOverOptimization read length and the held-out score
# against the reward: the pairs that moved apart in these runs.
DIVERGENCE = frozenset({"GRPOKLGrowthAccelerating", "GRPOKLTailOutliers",
                        "GRPOResponseLengthShift", "GRPOCompletionsTruncated",
                        "GRPOGradNormSpike", "GRPORewardHackingSuspected",
                        "GRPORewardOverOptimization"})
# The reward paying for the wrong thing: reward up while length, the held-out or gold metric, or
# KL to the reference move the wrong way.
REWARD_HACKING = frozenset({"GRPORewardHackingSuspected", "GRPORewardOverOptimization",
                            "GRPOKLGrowthAccelerating", "GRPOKLTailOutliers"})
NONE: frozenset[str] = frozenset()


def healthy(reason: str) -> Label:
    return Label("healthy", None, NONE, reason)


LABELS: dict[str, Label] = {
    # The reason of each label in our words: where its PROVENANCE.md puts the verdict and onset.
    "aaipl-gptoss20b-minesweeper-grpo-healthy": healthy(
        "healthy by its authors; the valid-JSON reward rises over the run"),
    "deepgrpo-qwen25-0.5b-gsm8k-verl-healthy": healthy(
        "healthy: the authors' proposed method; validation accuracy rises over the run"),
    "gemma3-1b-gsm8k-unsloth-abdo-healthy": healthy(
        "healthy by its authors; correctness reward rises over the run"),
    "unsloth-llama31-8b-gsm8k-techtinker-healthy": healthy(
        "no verdict from the author; healthy by its data (reward rises, no instability)"),
    "unsloth-llama32-3b-grpo-gsm8k-500": healthy(
        "healthy tutorial run; its KL spikes are isolated single steps"),
    "unslothgrpo-llama31-8b-gsm8k-250": healthy(
        "no verdict from the author; healthy by its data (reward rises)"),
    "verl-grpo-qwen2-7b-gsm8k-megatron-base": healthy(
        "healthy baseline by its authors (GSM8K about 89%)"),
    "verl-ppo-qwen25-05b-gsm8k": healthy("healthy reference run by its authors"),
    "grpo-qwen3-1.7b-math-verl-klblowup": Label(
        "sick", 63, DIVERGENCE,
        "failed late by its authors: length, truncation and KL blow up; the data first move at "
        "step 63 (grad norm and length above all earlier values)"),
    "mixedcuts-qwen3-1.7b-math-verl-collapse": Label(
        "sick", 48, DIVERGENCE,
        "diverged around step 48 and collapsed within ten steps, by its authors; the data first "
        "move at step 48 (grad norm above all earlier values)"),
    "treerl-qwen25-0.5b-gsm8k-verl-entropy-explosion": Label(
        # Only entropy and validation were committed: the entropy's own yellow card counts.
        "sick", 678, frozenset({"GRPOEntropyRebound"}),
        "filed by its authors under training instability; entropy leaves its band for good at "
        "step 678 and explodes from step 790"),
    "trl-dapo-qwen25vl-3b-aokvqa-collapse": Label(
        "sick", 10, COLLAPSE,
        "degenerate from its first records (length and entropy collapse); onset: the first "
        "logged step"),
    "memredteam-qwen25-3b-grpo-sparse-reward": Label(
        "sick", 1, DEAD_SIGNAL,
        "failed in practice, no learning signal (nearly all groups with one reward); onset: the "
        "first logged step"),
    "recall-qwen25-7b-l3-zero-std-dead": Label(
        "sick", 1, DEAD_SIGNAL,
        "stalled by its authors' own criterion (zero reward spread from step 1); onset: the "
        "first logged step"),
    # The twenty-five runs that joined the collection later.
    "nipsgrpo-qwen25-7b-rho1-seed42-collapse": Label(
        "sick", 135, COLLAPSE | {"GRPORolloutMismatch"},
        "collapsed by its authors (GSM8K 0.005 after training); the data first move at step 135 "
        "(reward 0.38, importance weight 0.28, grad norm above all earlier values); a recovered "
        "excursion of the same shape at steps 40-50 comes before it"),
    "nipsgrpo-qwen25-7b-rho1-seed43-collapse": Label(
        "sick", 25, COLLAPSE | {"GRPORolloutMismatch"},
        "collapsed by its authors (GSM8K 0.0); at step 25 entropy jumps to 1.5 from about 0.2 "
        "and the importance weight to 0.18, and from step 30 reward is near 0 at the length cap"),
    "nipsgrpo-qwen25-7b-rho1-seed44-healthy": healthy(
        "healthy by its authors (GSM8K 0.89) under the same config as two collapsed seeds; "
        "a spell at the length cap (steps 95-125) passes without reward loss"),
    "nipsgrpo-qwen25-7b-rho03-seed42-collapse": Label(
        "sick", 20, COLLAPSE | {"GRPORolloutMismatch"},
        "collapsed by its authors (GSM8K 0.0); at step 20 reward drops to 0.18 as entropy jumps "
        "to 2.8 and 70% of completions hit the cap; from step 115 entropy locks at ~1e-12"),
    "nipsgrpo-qwen25-7b-rho05-seed43-shortcollapse": Label(
        "sick", 35, COLLAPSE | {"GRPOGradNormSpike"},
        "collapsed by its authors (GSM8K 0.015); grad norm jumps to 3.6 at step 35, and from "
        "step 45 answers are 2-18 tokens long with reward near 0"),
    "nipsgrpo-qwen25-7b-rho3-seed42-healthy": healthy(
        "healthy by its authors (GSM8K 0.85) with entropy 0.04-0.09 and length halving"),
    "nipsgrpo-qwen35-9b-rho07-seed44-collapse": Label(
        "sick", 155, COLLAPSE,
        "collapsed late by its authors' training-reward verdict (final reward 0.01); at step 155 "
        "reward halves to 0.41 and entropy reaches 0.9, at 175 entropy is 6.4 with reward 0"),
    "nipsgrpo-qwen35-9b-rho07-seed42-healthy": healthy(
        "healthy by its authors' training-reward verdict (0.90) under the config of a collapsed "
        "seed; length leaves the cap by step 35"),
    "chaos-economy-llama32-grpo-curriculum": healthy(
        "healthy by its authors, its reward swings by design; completions sit at the 512-token "
        "cap from step 65"),
    "rlvr-experiments-qwen3-1.7b-gsm8k-sweep": healthy(
        "a healthy sweep by its authors (14 runs in one file, split by `run`); at lr 1e-5 entropy "
        "falls about 80% while GSM8K accuracy keeps rising"),
    "verl-ppo-gemma2-2b-gsm8k": healthy(
        "healthy reference run by its authors (test 0.64); validation sags 3% after its peak"),
    "verl-grpo-qwen2-7b-gsm8k-fsdp-offpolicy": healthy(
        "healthy by its authors (GSM8K about 89%); step time doubles at each validation step"),
    "tinker-rh-llama32-1b-leetcode-proxy": Label(
        "sick", 9, REWARD_HACKING,
        "reward hacking by construction: the compile-only proxy climbs from step 9 (0.26 to 0.74) "
        "while correctness stays below 0.01"),
    "rhdemo-qwen25-05b-imdb-sentiment-nokl-rewardhack": Label(
        "sick", 20, REWARD_HACKING,
        "reward hacking by its authors: from step 20 the proxy sits at 0.99 with no spread "
        "while held-out perplexity climbs from 4.5 to 18 and KL to the base grows to about 1"),
    "rhdemo-qwen25-05b-imdb-sentiment-kl01-healthy": healthy(
        "healthy by its authors (the KL-penalty fix); held-out perplexity still drifts 4.5 to 6.3 "
        "and levels off"),
    "rhdemo-qwen25-05b-imdb-sentiment-cap09-healthy": healthy(
        "healthy by its authors (the reward-cap fix); 39 steps have zero gradient by design and "
        "held-out perplexity drifts 4.4 to 8.4"),
    "rmoveropt-qwen25-05b-gsm8k-proxyrm-goodhart": Label(
        "sick", 210, REWARD_HACKING,
        "over-optimised by its authors: the proxy reward keeps climbing while gold accuracy peaks "
        "at step 200 and falls back to its starting level; KL to the reference grows 27x"),
    "scratchgrpo-qwen25math-15b-lr1e-4-entropy-collapse": Label(
        "sick", 4, COLLAPSE,
        "collapsed by its author at lr 1e-4: at step 4 entropy falls to 0.1 and length jumps to "
        "the 1024 cap, and held-out accuracy is 0 from step 3"),
    "scratchgrpo-qwen25math-15b-nobaseline-length-collapse": Label(
        "sick", 16, COLLAPSE | {"GRPOGradNormSpike"},
        "collapsed by its author (no baseline): from step 16 grad norm runs above 1 and length "
        "shrinks from 100 to 15-20 tokens while held-out accuracy halves from its step-7 peak"),
    "scratchgrpo-qwen25math-15b-lr3e-5-healthy": healthy(
        "healthy by its author (the chosen learning rate); entropy falls 93% while held-out "
        "accuracy rises to 0.72"),
    "scratchgrpo-qwen25math-15b-reinforce-baseline-healthy": healthy(
        "healthy by its author (the baseline control); early length and grad-norm transients "
        "settle by step 10"),
    "openrlhf-gptoss120b-aime-grpo-a24-truncation-collapse": Label(
        "sick", 16, frozenset({"GRPOCompletionsTruncated", "GRPOResponseLengthShift"}),
        "crashed by its authors at steps 16-17: 86% of answers truncated near the 3072 cap and "
        "reward at its run low, as the learning rate reached its peak"),
    "verl-qwen3-8b-dapomath-grpo-r1-healthy": healthy(
        "healthy control by its authors; its own detector flagged one-update length and "
        "grad-norm excursions that they judged transient"),
    "trl-qwen25-15b-math-grpo-seed42-healthy": healthy(
        "healthy by its authors; tiny batches make reward and zero-advantage groups swing between "
        "updates"),
    "tinker-qwen3-4b-code-rl-binary-flat-healthy": healthy(
        "healthy but flat by its author (held-out pass@1 0.25-0.35 throughout); a single "
        "11-orders loss spike at step 92 recovers at once"),
}


# (alert, its rule's reason label) -> the repositories whose shared runs were looked at when that
# rule branch, or a threshold only it reads, was set. Left out when judging those repositories.
TUNED_ON: dict[tuple[str, str], frozenset[str]] = {
    # The blow-up card in records: set on the two runs whose collapse it describes.
    ("GRPOTrainingBlowUp", ""): frozenset({"dumbkin31/exploration-in-grpo"}),
    # The truncation crash: shaped on the OpenRLHF run that crashes in its last two records.
    ("GRPOTrainingBlowUp", "truncation_crash"): frozenset({"fruitfoxlu/rft"}),
    # The slow blow-up on trends: kept from firing on the healthy seed of the rho sweep.
    ("GRPOTrainingBlowUp", "trend"): frozenset({"Sunshine535/nips-grpo-dynamics"}),
    # The entropy cliff in a run's first records: the DAPO fork's collapse.
    ("GRPOEntropyCollapse", "first_records"): frozenset({"JuncyLu/trl_DAPO"}),
    # The entropy rebound: the TreeRL run's explosion after a long settled phase.
    ("GRPOEntropyExplosion", "rebound"): frozenset({"befocuss/Deep-GRPO"}),
    # The plateau left behind: its 1.75x set between the TreeRL plateau (1.6-1.9x its floor)
    # and the healthy runs that settled (at most 1.5x, the rho sweep's healthy seed).
    ("GRPOEntropyRebound", ""): frozenset({"befocuss/Deep-GRPO"}),
    # The dead learning signal from the first steps: the two zero-spread runs.
    ("GRPOAdvantageVanishing", "dead_groups"): frozenset({"aaravarora01/agent-memory-redteam",
                                                           "aryan-gupta7/round2_sclr"}),
    # The held-out turn on 3-point means: the proxy-reward run's slow slide.
    ("GRPORewardOverOptimization", "smoothed"): frozenset({"Vincethevince/reward-overoptimization"}),
    # The length trend: the run whose answers shrink from their first records.
    ("GRPOResponseLengthShift", "trend"): frozenset({"garg-aayush/building-from-scratch"}),
    # Reward without accuracy on trends: the compile-only proxy's climb (its factor and the
    # accuracy's Z set against the Unsloth runs' format-first climbs, which keep their accuracy).
    ("GRPORewardHackingSuspected", "trend"): frozenset({"rohunagrawal/reward-hacking-entropy"}),
}


def repository(name: str) -> str:
    """The run's repository, as its PROVENANCE.md gives it ("?" when it does not)."""
    path = real_runs.runs_dir() / name / "PROVENANCE.md"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return "?"
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].lower() == "repository":
            return cells[1].split()[0].strip("`")
    return "?"


def rules_without(repo: str, tmp: Path) -> list[Path] | None:
    """The rule files less every rule tuned on ``repo`` (TUNED_ON); None when none was."""
    dropped = {key for key, repos in TUNED_ON.items() if repo in repos}
    if not dropped:
        return None
    folder = tmp / ("loro-" + repo.replace("/", "_"))
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for path in RULE_FILES:
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            group["rules"] = [r for r in group["rules"] if "alert" not in r or
                              (r["alert"], r.get("labels", {}).get("reason", "")) not in dropped]
        out.append(folder / path.name)
        out[-1].write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def is_red(card: str, severity: str) -> bool:
    return severity == "critical" or card in RED


def counts_for(label: Label, card: str, severity: str) -> bool:
    """Whether ``card`` firing is a catch of ``label``'s sickness (outside the window it is not)."""
    if card == COVERAGE:
        return False
    return is_red(card, severity) or card in label.catches or card.startswith(HELD_OUT_PREFIX)


# -- one run --------------------------------------------------------------------------------------

@dataclass
class Hit:
    card: str
    step: int
    delay: int


@dataclass
class RunResult:
    name: str
    label: Label | None
    logged_steps: int
    severity: dict[str, str]  # card -> severity it fired with
    spans: dict[str, list[tuple[int, int]]]  # card -> (first step, last step) of each firing
    steps: dict[str, list[int]]  # card -> every logged step it was firing at
    catch: Hit | None = None  # the first counting card in the window
    late: Hit | None = None  # a missed sickness: the first counting card after the window
    red_before_onset: list[str] = field(default_factory=list)
    false_reds: list[str] = field(default_factory=list)  # red cards on a healthy run
    repository: str = "?"

    def red(self) -> list[str]:
        return sorted(c for c, s in self.severity.items() if is_red(c, s))


def judge(name: str, label: Label | None, scrape_steps: list[int],
          at: list[set[tuple[str, str]]]) -> RunResult:
    steps: dict[str, list[int]] = {}
    severity: dict[str, str] = {}
    for step, firing in zip(scrape_steps, at):
        for card, sev in firing:
            steps.setdefault(card, []).append(step)
            # A name with rules of two severities: the reddest one that fired.
            if severity.get(card) != "critical":
                severity[card] = sev
    result = RunResult(name, label, len(scrape_steps), severity,
                       intervals(scrape_steps, at), steps)
    if label is None:
        return result
    if label.verdict == "healthy":
        result.false_reds = [c for c in result.red() if c != COVERAGE]
        return result
    assert label.onset is not None
    onset, end = label.onset, label.onset + CAUGHT_WITHIN
    hits = [Hit(c, s, s - onset) for c, ss in steps.items() if counts_for(label, c, severity[c])
            for s in ss if s >= onset]
    hits.sort(key=lambda h: (h.step, h.card))
    result.catch = next((h for h in hits if h.step <= end), None)
    if result.catch is None:
        result.late = next(iter(hits), None)
    result.red_before_onset = sorted(c for c in result.red() if c != COVERAGE
                                     and min(steps[c]) < onset)
    return result


def play(name: str, tmp: Path, *, leave_out: bool = True) -> tuple[RunResult, RunResult]:
    """The run judged by the committed rules, and (``leave_out``) by them less the branches tuned
    on its own repository (the same result where none was, or without ``leave_out``)."""
    played = real_runs.play_real(name)
    label = LABELS.get(name)
    result = judge(name, label, played.scrape_steps, fired_at(played, tmp))
    result.repository = repository(name)
    loro_rules = rules_without(result.repository, tmp) if leave_out else None
    if loro_rules is None:
        return result, result
    loro = judge(name, label, played.scrape_steps, fired_at(played, tmp, rule_files=loro_rules))
    loro.repository = result.repository
    return result, loro


# -- per card -------------------------------------------------------------------------------------

@dataclass
class CardStats:
    card: str
    severity: str
    catches: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    false_reds: list[str] = field(default_factory=list)
    red_before_onset: list[str] = field(default_factory=list)
    healthy_fired: list[str] = field(default_factory=list)  # any severity, for a yellow card
    delays: list[int] = field(default_factory=list)


def first_in_window(r: RunResult, card: str) -> int | None:
    """The first step in [onset, onset + CAUGHT_WITHIN] at which ``card`` fired on sick run r."""
    assert r.label is not None and r.label.onset is not None
    onset = r.label.onset
    return next((s for s in r.steps.get(card, []) if onset <= s <= onset + CAUGHT_WITHIN), None)


def per_card(results: list[RunResult]) -> list[CardStats]:
    """One row per card judged: every card that fired, every card a label names, every red card
    a replay can raise; the coverage card is left out."""
    named = {c for label in LABELS.values() for c in label.catches}
    fired = {c for r in results for c in r.severity}
    cards = sorted((fired | named | (RED - REPLAY_BLIND)) - {COVERAGE})
    out: list[CardStats] = []
    for card in cards:
        sev = "critical" if card in RED else next(iter(SEVERITIES.get(card, {"?"})))
        st = CardStats(card, sev)
        for r in results:
            if r.label is None:
                continue
            fired_here = card in r.severity
            if r.label.verdict == "healthy":
                if fired_here:
                    st.healthy_fired.append(r.name)
                if card in r.false_reds:
                    st.false_reds.append(r.name)
                continue
            if card in r.red_before_onset:
                st.red_before_onset.append(r.name)
            if not counts_for(r.label, card, r.severity.get(card, sev)):
                continue
            step, onset = first_in_window(r, card), r.label.onset
            if step is None or onset is None:
                st.misses.append(r.name)
            else:
                st.catches.append(r.name)
                st.delays.append(step - onset)
        out.append(st)
    return out


# -- printing -------------------------------------------------------------------------------------

def spans_text(spans: list[tuple[int, int]]) -> str:
    return ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in spans)


def describe_run(r: RunResult) -> str:
    """The plain per-run block: the label, every card that fired, the verdict on the cards."""
    label = r.label
    head = (f"{r.name}: {r.logged_steps} logged steps, "
            + ("unlabelled" if label is None else
               label.verdict + (f" from step {label.onset}" if label.onset is not None else "")))
    lines = [head]
    for card in sorted(r.spans, key=lambda c: (r.spans[c][0][0], c)):
        lines.append(f"  {card:<30} {r.severity[card]:<9} firing at steps {spans_text(r.spans[card])}")
    if not r.spans:
        lines.append("  no card fired")
    if label is not None and label.verdict == "sick":
        if r.catch:
            lines.append(f"  CAUGHT by {r.catch.card} at step {r.catch.step} "
                         f"(delay {r.catch.delay})")
        else:
            late = (f"; first counting card {r.late.card} at step {r.late.step} "
                    f"(delay {r.late.delay})" if r.late else "")
            lines.append(f"  MISSED: no counting card within {CAUGHT_WITHIN} steps of the onset{late}")
        if r.red_before_onset:
            lines.append(f"  red before onset: {', '.join(r.red_before_onset)}")
    if r.false_reds:
        lines.append(f"  FALSE RED: {', '.join(r.false_reds)}")
    return "\n".join(lines)


def run_row(r: RunResult) -> list[str]:
    """run, verdict, onset, first card and step, delay, red cards."""
    label = r.label
    verdict = "unlabelled" if label is None else label.verdict
    onset = "—" if label is None or label.onset is None else str(label.onset)
    if r.catch:
        first, delay = f"{r.catch.card} @ {r.catch.step}", str(r.catch.delay)
    elif label is not None and label.verdict == "sick":
        first = (f"missed (late: {r.late.card} @ {r.late.step})" if r.late else "missed")
        delay = f"({r.late.delay})" if r.late else "—"
    else:
        first, delay = "—", "—"
    reds = []
    for card in r.red():
        tag = ""
        if card in r.false_reds:
            tag = " (false red)"
        elif card in r.red_before_onset:
            tag = " (before onset)"
        reds.append(f"{card} @ {spans_text(r.spans[card])}{tag}")
    return [r.name, r.repository, verdict, onset, first, delay, "; ".join(reds) or "none"]


def loro_cell(r: RunResult, loro: RunResult) -> str:
    """The leave-one-repository-out verdict beside the committed one."""
    if loro is r:
        return "same (no rule tuned on it)"
    if r.label is None:
        return "—"
    if r.label.verdict == "healthy":
        return f"false red: {', '.join(loro.false_reds)}" if loro.false_reds else "no red"
    if loro.catch:
        return f"{loro.catch.card} @ {loro.catch.step} ({loro.catch.delay})"
    return "missed" + (f" (late: {loro.late.card} @ {loro.late.step})" if loro.late else "")


def card_row(st: CardStats) -> list[str]:
    delays = (f"{min(st.delays)}–{max(st.delays)} (median {statistics.median(st.delays):g})"
              if len(st.delays) > 1 else str(st.delays[0]) if st.delays else "—")
    return [st.card, st.severity, str(len(st.catches)), str(len(st.misses)),
            str(len(st.false_reds)) if st.severity == "critical" else "—",
            str(len(st.red_before_onset)) if st.severity == "critical" else "—",
            str(len(st.healthy_fired)), delays]


RUN_HEAD = ["run", "repository", "verdict", "onset", "first card @ step", "delay", "red cards @ steps",
            "left out its repository's rules: first card @ step (delay)"]
CARD_HEAD = ["card", "severity", "catches", "misses", "false reds", "red before onset",
             "healthy runs fired", "delay"]


def plain_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip()
                     for row in [head, ["-" * w for w in widths], *rows])


def md_table(head: list[str], rows: list[list[str]]) -> str:
    esc = [[x.replace("|", "\\|") for x in row] for row in [head, *rows]]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in esc[1:]])


def totals(results: list[RunResult]) -> dict[str, Any]:
    sick = [r for r in results if r.label and r.label.verdict == "sick"]
    well = [r for r in results if r.label and r.label.verdict == "healthy"]
    return {"sick_runs": len(sick), "caught": sum(1 for r in sick if r.catch),
            "missed": [r.name for r in sick if not r.catch],
            "healthy_runs": len(well),
            # (healthy run, red card) pairs; the runs they fell on
            "false_reds": sum(len(r.false_reds) for r in well),
            "false_red_runs": [r.name for r in well if r.false_reds],
            "red_before_onset": sum(len(r.red_before_onset) for r in sick),
            "logged_steps": sum(r.logged_steps for r in results)}


def summary_line(t: dict[str, Any]) -> str:
    return (f"{t['caught']} of {t['sick_runs']} sick runs caught within {CAUGHT_WITHIN} steps of "
            f"the onset; {t['false_reds']} false red(s) on {len(t['false_red_runs'])} of "
            f"{t['healthy_runs']} healthy runs; {t['red_before_onset']} red card(s) before an "
            f"onset; {t['logged_steps']:,} logged steps")


# -- main -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="run names to play (default: every run)")
    parser.add_argument("--runs-dir", type=Path,
                        help=f"the collection (default: ${real_runs.ENV}, else ../shared/real-runs)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "real_runs.json")
    parser.add_argument("--markdown", action="store_true",
                        help="print the docs/benchmarks.md tables instead of the plain ones")
    args = parser.parse_args(argv)
    if args.runs_dir is not None:
        os.environ[real_runs.ENV] = str(args.runs_dir)  # read by real_runs.runs_dir()
    try:
        names = args.runs or real_runs.run_names()
    except real_runs.RealRunsMissing as exc:
        print(exc, file=sys.stderr)
        return 1
    # With --markdown, stdout is only the tables (ready to paste); the per-run detail goes to stderr.
    detail = sys.stderr if args.markdown else sys.stdout
    unlabelled = [n for n in names if n not in LABELS]
    if unlabelled:
        print(f"no label for {', '.join(unlabelled)}: their cards are listed, not scored",
              file=sys.stderr)
    results: list[RunResult] = []
    loros: list[RunResult] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            try:
                result, loro = play(name, Path(tmp))
            except FileNotFoundError as exc:  # one run missing from a present collection
                print(f"{name}: {exc}", file=sys.stderr)
                continue
            results.append(result)
            loros.append(loro)
            print(describe_run(result), file=detail, flush=True)
    if not results:
        print("no run was played", file=sys.stderr)
        return 1
    cards = per_card(results)
    t = totals(results)
    t_loro = totals(loros)
    run_rows = [run_row(r) + [loro_cell(r, loro)] for r, loro in zip(results, loros)]
    card_rows = [card_row(st) for st in cards]
    summary = (f"Committed rules: {summary_line(t)}.\nEach repository judged without the rules "
               f"tuned on it: {summary_line(t_loro)}.")
    if args.markdown:
        print(md_table(RUN_HEAD, run_rows) + "\n\n" + md_table(CARD_HEAD, card_rows) + "\n\n"
              + summary)
    else:
        print("\n" + plain_table(RUN_HEAD, run_rows) + "\n\n" + plain_table(CARD_HEAD, card_rows)
              + "\n\n" + summary)
    result = {
        "machine": machine(), "caught_within_steps": CAUGHT_WITHIN, "rule_files": rule_files(),
        "totals": t, "totals_leave_one_repository_out": t_loro,
        "runs": [{"run": r.name, "repository": r.repository,
                  "verdict": r.label.verdict if r.label else None,
                  "onset": r.label.onset if r.label else None,
                  "reason": r.label.reason if r.label else None,
                  "logged_steps": r.logged_steps,
                  "fired": {c: {"severity": r.severity[c], "steps": [list(x) for x in s]}
                            for c, s in r.spans.items()},
                  "catch": vars(r.catch) if r.catch else None,
                  "late": vars(r.late) if r.late else None,
                  "red_before_onset": r.red_before_onset, "false_reds": r.false_reds,
                  "leave_one_repository_out": None if loro is r else {
                      "catch": vars(loro.catch) if loro.catch else None,
                      "false_reds": loro.false_reds}}
                 for r, loro in zip(results, loros)],
        "cards": [vars(st) for st in cards],
    }
    # Its "wrote PATH" line must not land in the markdown to paste.
    with contextlib.redirect_stdout(sys.stderr if args.markdown else sys.stdout):
        write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

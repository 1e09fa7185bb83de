"""Render docs/coverage.md from the card declarations (contract/cards.py), so it cannot drift.

``python -m grpo_monitor.tools.coverage_doc > docs/coverage.md`` (``make docs``); a test fails when
the committed file differs from this output.
"""

from __future__ import annotations

from grpo_monitor.contract.cards import CARDS, MINIMUM_CURVES, MISSING_CAUSES, Branch, disarmed_by
from grpo_monitor.contract.keys import SIGNALS_BY_KEY


def _key_names(key: str) -> str:
    sig = SIGNALS_BY_KEY.get(key)
    aliases = ", ".join(f"`{a}`" for a in (sig.aliases if sig else ()))
    return f"`{key}`" + (f" ({aliases})" if aliases else "")


def _branch_text(branch: Branch) -> str:
    parts = []
    if branch.keys:
        names = " and ".join(f"`{k}`" for k in branch.keys) if branch.needed == len(branch.keys) else \
            f"{branch.needed} of " + ", ".join(f"`{k}`" for k in branch.keys)
        parts.append(names)
    if branch.indirect:
        parts.append("through a fitted feature " + ", ".join(f"`{k}`" for k in branch.indirect))
    if branch.baseline:
        parts.append("the baseline period")
    if branch.min_ranks > 1:
        parts.append(f"{branch.min_ranks} ranks" + (" logging it" if branch.keys else ""))
    if branch.prompt_types:
        parts.append(f"{branch.prompt_types} prompt types")
    if branch.gpu:
        parts.append("ranks reporting their GPU")
    if branch.unless_logged:
        parts.append("a run that logs no " + " or ".join(f"`{k}`" for k in branch.unless_logged))
    text = "; ".join(parts) or "nothing but the run's records"
    return f"{text} (`reason=\"{branch.reason}\"`)" if branch.reason else text


def render() -> str:
    """docs/coverage.md: what each card needs, from CARDS; the minimum curves and their aliases."""
    out = [DOC_HEADER]
    for card in CARDS:
        branches = "<br>or ".join(_branch_text(b) for b in card.branches)
        colour = "red" if card.severity == "critical" else "yellow"
        out.append(f"| [{card.name}](runbook.md#{card.name.lower()}) | {colour} | {branches} |\n")
    out.append(DOC_MINIMUM)
    for key in MINIMUM_CURVES:
        cards = ", ".join(disarmed_by(key)) or "none alone"
        out.append(f"| {_key_names(key)} | {cards} |\n")
    out.append(DOC_CAUSES)
    for cause in MISSING_CAUSES:
        out.append(f"| {cause.framework} | `{cause.key}` | `{cause.reason}` | {cause.hint} |\n")
    return "".join(out)


DOC_HEADER = """\
# Coverage: what each card needs, and what a run without it is not watched for

Generated from `exporter/grpo_monitor/contract/cards.py` by `make docs`
(`python -m grpo_monitor.tools.coverage_doc`); do not edit by hand.

A card can only fire on a run that logs what it reads. The exporter publishes, per run and card,
whether the card is armed (`grpo_card_armed{run, card, severity, reason, needs}`: 1 when armed,
else 0 with the reason), the training dashboard shows the table ("What this run is watched
for"), `grpo-monitor check RUN_DIR` prints it, and the report lists the verdicts it could not
judge. Reasons:

- `armed`: the card can fire now;
- `missing_signal`: the run does not log (enough of) the keys the card reads; `needs` names them
  (each is also read under the names [metrics.md](metrics.md) lists for it);
- `baseline_pending`: the card waits for the baseline period
  (`grpo_baseline_remaining_steps` says how many steps to go); a run shorter than the baseline is
  never judged by it;
- `not_applicable`: the card compares what the run does not have: ranks with one another (a
  single-rank run), prompt types (no `by_type`), GPUs (ranks that report none).

A card is armed when any one of its branches is (each line below is a branch: a rule of the card,
its `reason` label, or an alternative within it).

| card | colour | needs |
|---|---|---|
"""

DOC_MINIMUM = """
## The minimum curves

Five curves every GRPO run should log ([what to log](background.md#what-to-log)). A run that has
not logged one of them after `grpo:threshold:signal_missing_steps` logged steps raises the yellow
[GRPOSignalMissing](runbook.md#grposignalmissing), and `grpo-monitor check` exits 1. Without
each, these cards cannot fire at all (cards with another branch stay armed through it):

| key (and the names it is read under) | cards it disarms |
|---|---|
"""

DOC_CAUSES = """
## Known causes

Where the framework that wrote the run is known (`grpo_run_info{run, framework}`: the records'
`framework` field, which the SDK and the TRL callback write, else the shape of their key names),
the card says why the curve is missing and what to set:

| framework | key | reason | what to do |
|---|---|---|---|
"""




if __name__ == "__main__":
    print(render(), end="")

"""Render docs/frameworks.md from contract/framework_names.py, so it cannot drift.

``python -m grpo_monitor.tools.frameworks_doc > docs/frameworks.md`` (``make docs``); a test fails
when the committed file differs from this output.
"""

from __future__ import annotations

import sys

from grpo_monitor.contract.framework_names import FALSE_FRIENDS, FINGERPRINTS, NAMES
from grpo_monitor.contract.keys import FRAMEWORK_MARKERS, HELDOUT_PATTERNS

HEAD = """\
# The frameworks' own names

Generated from `exporter/grpo_monitor/contract/framework_names.py` by `make docs`; do not edit.

A run is read as its framework logs it, with no key map: the names below were read in each
framework's logging code (the file is given; paths are inside the framework's repository), and
each stands for the canonical key beside it, in that key's unit. The frameworks the contract grew
up with (TRL and Unsloth, verl, and the basic names of OpenRLHF and slime) are read by the aliases
listed in [metrics.md](metrics.md) beside each key; names nobody listed are read by the rule of
[snapshot-format.md](snapshot-format.md#names-nobody-listed). A `*` in a name is a segment the
run chooses (prime-rl's agent, rLLM's role).

A held-out score is read by its namespace (`{patterns}`) when its name holds a score word and no
other statistic; pass@k for k above 1 (`pass@8`, `pass_k`, `pass_at_8`, `_pass8`) is never the
score: it reads higher than the accuracy beside it.
"""


def _row(*cells: str) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def render() -> str:
    out = [HEAD.format(patterns="`, `".join(HELDOUT_PATTERNS))]
    frameworks = list(dict.fromkeys(n.framework for n in NAMES))
    for framework in frameworks:
        out.append(f"## {framework}\n")
        out.append(_row("name", "read as", "logged in", "note"))
        out.append(_row("---", "---", "---", "---"))
        for n in NAMES:
            if n.framework == framework:
                note = n.note + (f" (× {n.scale:g})" if n.scale != 1.0 else "")
                out.append(_row(f"`{n.name}`", f"`{n.key}`", f"`{n.source}`", note))
        out.append("")
    out.append("## False friends: never read as the signal they resemble\n")
    out.append("Neither the vocabulary nor `grpo-monitor check` maps or proposes them; a run's key "
               "map may still send one where it belongs (a gold metric to `eval/heldout_score`).\n")
    out.append(_row("name", "framework", "what it is"))
    out.append(_row("---", "---", "---"))
    for f in FALSE_FRIENDS:
        out.append(_row(f"`{f.name}`", f.framework or "any loop", f.why))
    out.append("")
    out.append("## Recognising the framework\n")
    out.append("`check`, the armed table and the coverage card's hints name the framework a run was "
               "written by: the first of these names the run logs, a framework's own names before "
               "those of the family it is built on (EasyR1, ROLL and rLLM log verl's names; "
               "ms-swift and Unsloth TRL's). `check` prints the name that decided.\n")
    out.append(_row("framework", "its own names"))
    out.append(_row("---", "---"))
    for framework in dict.fromkeys(f for f, _ in FINGERPRINTS):
        out.append(_row(framework, ", ".join(f"`{n}`" for f, n in FINGERPRINTS if f == framework)))
    for family in dict.fromkeys(FRAMEWORK_MARKERS.values()):
        out.append(_row(f"{family} (family)", ", ".join(
            f"`{n}`" for n, f in FRAMEWORK_MARKERS.items() if f == family)))
    return "\n".join(out) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

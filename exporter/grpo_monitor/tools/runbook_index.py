"""The runbook's index of cards, generated from the card declarations (contract/cards.py).

docs/runbook.md is written by hand, section by section, but its index of cards is not: a card
added to the catalog and its rule appears in the index by `make docs`
(``python -m grpo_monitor.tools.runbook_index --write``), and a test fails when the committed
index differs from :func:`index`. The index is the run of list items that name the card groups
(the lines from ``- Red cards:`` to the next blank line); what lies around it is left as it is.

Groups, in catalog order: the red cards, the yellow cards on the training signals, and the
yellow cards on the cluster and the exporter (prometheus/rules/grpo-cluster.yml).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from grpo_monitor.contract.cards import CARDS, CLUSTER, Card
from grpo_monitor.runtime.runbook import slug
from grpo_monitor.tools import doc_section

TARGET = Path(__file__).resolve().parents[1] / "runtime" / "runbook.md"
FIRST = "- Red cards:"
WIDTH = 100


def _group(title: str, cards: list[Card]) -> list[str]:
    links = ", ".join(f"[{c.name}](#{slug(c.name)})" for c in cards)
    return textwrap.wrap(f"- {title}: {links}", WIDTH, subsequent_indent="  ",
                         break_long_words=False, break_on_hyphens=False)


def index() -> list[str]:
    """The index's lines: one list item per group, wrapped at WIDTH."""
    red = [c for c in CARDS if c.severity == "critical"]
    yellow = [c for c in CARDS if c.severity == "warning" and c.rule_file != CLUSTER]
    cluster = [c for c in CARDS if c.severity == "warning" and c.rule_file == CLUSTER]
    return [*_group("Red cards", red), *_group("Yellow cards", yellow),
            *_group("Yellow cards on the cluster and the exporter", cluster)]


def render(text: str) -> str:
    """``text`` (the runbook) with its index of cards replaced by :func:`index`."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(FIRST))
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    return "\n".join([*lines[:start], *index(), *lines[end:]])


def main(argv: list[str] | None = None) -> int:
    return doc_section.main(argv, __doc__.splitlines()[0], TARGET, render, index)


if __name__ == "__main__":
    raise SystemExit(main())

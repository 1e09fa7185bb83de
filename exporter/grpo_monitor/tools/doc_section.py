"""The command line of a generated section of a hand-written doc: print it, or ``--write`` it.

Shared by runbook_index and state_format_doc: ``--write`` rewrites the doc in place when the
section changed; without it the section is printed."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def main(argv: list[str] | None, description: str, target: Path,
         render: Callable[[str], str], section: Callable[[], list[str]]) -> int:
    """``render(text)``: the doc's text with its section regenerated; ``section()``: its lines."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", action="store_true", help=f"rewrite {target.parent.name}/{target.name} in place")
    args = parser.parse_args(argv)
    if args.write:
        text = target.read_text(encoding="utf-8")
        if (rendered := render(text)) != text:
            target.write_text(rendered, encoding="utf-8")
    else:
        sys.stdout.write("\n".join(section()) + "\n")
    return 0

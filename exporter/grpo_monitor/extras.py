"""Optional dependencies: a command that needs an extra says so in one line.

``pip install grpo-monitor`` (what the exporter image does) installs what ``serve`` and the other
exporter-side commands need. numpy and matplotlib (``report``) and torch (``train-demo``) are
extras: they are imported where they are used, and a command that needs a missing one stops with
``MissingExtra``, which the CLI prints as a single line naming the extra, never as a traceback.
"""

from __future__ import annotations

import importlib.util

# pip's distribution name differs from the import name for some modules.
_DISTRIBUTION = {"yaml": "pyyaml"}


class MissingExtra(Exception):
    """A command needs a module that this installation does not have."""


def require(command: str, extra: str, *modules: str) -> None:
    """Raise MissingExtra unless every module is importable.

    find_spec, not import: the check costs nothing for modules that are there, and importing a
    heavy module (torch, matplotlib) stays with the code that uses it."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        names = ", ".join(_DISTRIBUTION.get(m, m) for m in missing)
        raise MissingExtra(f"grpo-monitor {command} needs {names}, which a plain install leaves out: "
                           f"pip install 'grpo-monitor[{extra}]'")

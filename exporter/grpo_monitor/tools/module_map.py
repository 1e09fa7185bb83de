"""Render docs/modules.md, the package's module map, from the package's own docstrings.

Each folder of the package is one table, headed by its ``__init__`` docstring's summary, with one
row per module: the summary paragraph of the module's docstring. ``make docs`` writes it
(``python -m grpo_monitor.tools.module_map > docs/modules.md``) and the tests fail when the
committed map is stale.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grpo_monitor

__all__ = ["FOLDERS", "MAY_IMPORT", "render", "summary"]

HEADER = """\
# The package, module by module

<!-- Generated from the modules' docstrings by `make docs`
(`python -m grpo_monitor.tools.module_map > docs/modules.md`); do not edit by hand. -->

The folders, in the order a record travels, and what each may import from the package
(`tests/test_layout.py` holds the imports to it; [architecture.md](architecture.md) says why):

| folder | may import |
|---|---|
"""

# The folders in the order a record travels: the contract it is written to, the trainer side that
# writes it, the runtime that serves it, the tools that read runs back; then the command line.
FOLDERS: tuple[str, ...] = ("contract", "sdk", "integrations", "runtime", "runtime/collectors",
                            "runtime/loggers",
                            "tools", "tools/report", "")

# What each top-level folder may import from the package. The trainer side sees only the contract
# (a training job must not pull in the exporter's dependencies) and extras.py (standard library
# only: it turns a missing extra into one line); the runtime never reaches into
# the tools; the tools sit on top, and ``cli.py`` (with ``__main__`` modules) above them. "<root>"
# is ``grpo_monitor`` itself (``__version__``, ``SnapshotWriter``), "extras" its extras.py.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "contract": ("contract",),
    "sdk": ("contract", "sdk", "extras"),
    "integrations": ("contract", "sdk", "integrations", "extras"),
    "runtime": ("contract", "runtime", "extras", "<root>"),
    "tools": ("contract", "sdk", "runtime", "tools", "extras", "<root>"),
}


def summary(path: Path) -> str:
    """The first paragraph of a module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _folder(relative: Path) -> str:
    return "" if relative == Path(".") else relative.as_posix()


def render(package: Path | None = None) -> str:
    """The module map: a table per folder of ``package`` (default: the installed grpo_monitor)."""
    root = package or Path(grpo_monitor.__file__).parent
    found = {_folder(p.parent.relative_to(root)) for p in root.rglob("__init__.py")}
    if found != set(FOLDERS):
        raise ValueError(f"folders without a place in the map: {sorted(found ^ set(FOLDERS))}")
    out = [HEADER.rstrip("\n")]
    shown = {"<root>": "`grpo_monitor` itself", "extras": "`extras.py`"}
    out += [f"| `{folder}/` | {', '.join(shown.get(name, f'`{name}/`') for name in allowed)} |"
            for folder, allowed in MAY_IMPORT.items()]
    out += [""]
    for folder in FOLDERS:
        where = root / folder
        title = f"`grpo_monitor/{folder + '/' if folder else ''}`"
        out += [f"### {title}", "", summary(where / "__init__.py"), "",
                "| module | one job |", "|---|---|"]
        for path in sorted(where.glob("*.py")):
            if path.name != "__init__.py":
                cell = summary(path).replace("|", "\\|")  # a pipe would end the table cell
                out.append(f"| `{path.name}` | {cell} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())

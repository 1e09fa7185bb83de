"""The package's layout shows its flow: each folder imports only the folders upstream of it, and
docs/modules.md is the package as it is."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import grpo_monitor
from grpo_monitor.tools import module_map

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(grpo_monitor.__file__).parent

MAY_IMPORT = {folder: set(allowed) for folder, allowed in module_map.MAY_IMPORT.items()}


def imported_folders(path: Path) -> set[str]:
    """The package's top-level folders or modules that ``path`` imports, lazy imports included."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = ([f"{node.module}.{a.name}" for a in node.names]
                     if node.module == "grpo_monitor" else [node.module])
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "grpo_monitor":
                continue
            target = parts[1] if len(parts) > 1 else "<root>"
            out.add("<root>" if target in {"__version__", "SnapshotWriter"} else target)
    return out


def test_no_relative_imports() -> None:
    # The layout checks below read absolute imports; a relative one would slip past them.
    relative = [str(p) for p in PACKAGE.rglob("*.py")
                if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(ast.parse(p.read_text())))]
    assert relative == []


@pytest.mark.parametrize("folder", sorted(MAY_IMPORT))
def test_imports_point_one_way(folder: str) -> None:
    wrong = {}
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        allowed = MAY_IMPORT[folder] | ({"cli"} if path.name == "__main__.py" else set())
        if extra := imported_folders(path) - allowed:
            wrong[str(path.relative_to(PACKAGE))] = sorted(extra)
    assert wrong == {}, f"{folder}/ may import only {sorted(MAY_IMPORT[folder])}"


def test_every_folder_has_its_rule() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(MAY_IMPORT)


def test_the_checker_sees_a_wrong_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from grpo_monitor.runtime.store import RunStore\n"
                      "import grpo_monitor.tools.simulate\nfrom grpo_monitor import __version__\n")
    assert imported_folders(source) == {"runtime", "tools", "<root>"}


def test_the_module_map_is_up_to_date() -> None:
    assert (ROOT / "docs" / "modules.md").read_text() == module_map.render(), \
        "docs/modules.md is stale: run `make docs`"


def test_the_module_map_lists_every_module_once() -> None:
    text = module_map.render()
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            heading = f"### `grpo_monitor/{path.parent.relative_to(PACKAGE).as_posix()}/`".replace("/./", "/")
            section = text.split(heading + "\n")[1].split("### ")[0]
            assert section.count(f"| `{path.name}` |") == 1, path
        assert module_map.summary(path), f"{path}: a module says its one job in its docstring"


def test_a_new_folder_must_find_its_place_in_the_map(tmp_path: Path) -> None:
    package = tmp_path / "grpo_monitor"
    for folder in (*module_map.FOLDERS, "newcomer"):
        (package / folder).mkdir(parents=True, exist_ok=True)
        (package / folder / "__init__.py").write_text('"""A folder."""\n')
    with pytest.raises(ValueError, match="newcomer"):
        module_map.render(package)
    (package / "newcomer" / "__init__.py").unlink()
    (package / "tools" / "x.py").write_text('"""Pipes | in a summary.\n\nMore."""\n')
    assert "| `x.py` | Pipes \\| in a summary. |" in module_map.render(package)

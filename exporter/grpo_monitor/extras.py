"""Optional dependencies: a command that needs an extra says so in one line.

``pip install grpo-monitor`` (what the exporter image does) installs what ``serve`` and the other
exporter-side commands need. numpy and matplotlib (``report``) and torch (``train-demo``) are
extras: they are imported where they are used, and a command that needs a missing one stops with
``MissingExtra``, which the CLI prints as a single line naming the extra, never as a traceback.

The line says how to add the extra to *this* installation: pip records where a package came
from (a checkout, a wheel file, a git URL: PEP 610's ``direct_url.json``), so the hint names that
source; no package index holds grpo-monitor.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from urllib.parse import unquote, urlsplit

DISTRIBUTION = "grpo-monitor"
# pip's distribution name differs from the import name for some modules.
_DISTRIBUTION = {"yaml": "pyyaml"}
# The package's own dependencies (pyproject.toml's [project] dependencies), by the module each
# gives: a trainer's environment may install the package without them (`pip install --no-deps`,
# docs/sdk.md#install), which SnapshotWriter and PauseGate never import, and a command that needs
# one then says so in one line. A test keeps this in step with pyproject.toml.
DEPENDENCY_MODULES = {"prometheus_client": "prometheus-client", "watchdog": "watchdog",
                      "pydantic": "pydantic", "pydantic_core": "pydantic", "pynvml": "nvidia-ml-py",
                      "requests": "requests", "orjson": "orjson", "msgpack": "msgpack", "yaml": "pyyaml",
                      "tomli": "tomli", "bcrypt": "bcrypt"}


class MissingExtra(Exception):
    """A command needs a module that this installation does not have."""


def installed_from() -> str | None:
    """Where pip installed this package from, as ``pip install`` takes it again: a folder (``-e
    FOLDER`` for an editable install), a wheel file or a ``git+`` URL with its commit; None when
    pip did not record it (an index, or a checkout on ``sys.path``)."""
    try:
        raw = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        info = json.loads(raw) if raw else None
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    if not isinstance(info, dict) or not isinstance(info.get("url"), str):
        return None
    url: str = info["url"]
    vcs = info.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs") == "git":
        commit = vcs.get("commit_id")
        return f"git+{url}@{commit}" if commit else f"git+{url}"
    parts = urlsplit(url)
    source = unquote(parts.path) if parts.scheme == "file" else url
    editable = isinstance(info.get("dir_info"), dict) and info["dir_info"].get("editable")
    return f"-e {source}" if editable else source


def missing_dependency(exc: ModuleNotFoundError, command: str) -> str | None:
    """The one line for a command that needs a dependency of the package itself, which this
    installation lacks (installed with --no-deps); None for any other missing module."""
    module = (exc.name or "").split(".")[0]
    if module not in DEPENDENCY_MODULES:
        return None
    source = installed_from()
    again = (f"pip install '{source[3:] if source.startswith('-e ') else source}'" if source
             else f"pip install '{DISTRIBUTION} @ <checkout, wheel or git URL>'")
    return (f"grpo-monitor {command} needs {DEPENDENCY_MODULES[module]}, which this installation "
            f"lacks (installed with --no-deps, for a trainer's environment: docs/sdk.md#install); "
            f"install the package with its dependencies: {again}")


def install_hint(extra: str) -> str:
    """The pip command that adds ``extra`` to this installation."""
    source = installed_from()
    if source is None:
        return (f"pip install '{DISTRIBUTION}[{extra}] @ <checkout, wheel or git URL>' "
                "(docs/sdk.md#install)")
    if source.startswith("git+"):
        return f"pip install '{DISTRIBUTION}[{extra}] @ {source}'"
    if source.startswith("-e "):
        return f"pip install -e '{source[3:]}[{extra}]'"
    return f"pip install '{source}[{extra}]'"


def require(command: str, extra: str, *modules: str) -> None:
    """Raise MissingExtra unless every module is importable.

    find_spec, not import: the check costs nothing for modules that are there, and importing a
    heavy module (torch, matplotlib) stays with the code that uses it."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        names = ", ".join(_DISTRIBUTION.get(m, m) for m in missing)
        raise MissingExtra(f"grpo-monitor {command} needs {names}, which a plain install leaves out "
                           f"(the {extra} extra): {install_hint(extra)}")


def import_extra(module: str, extra: str, importer: str) -> object:
    """Import ``module`` for ``importer`` (a module of the SDK), or raise ModuleNotFoundError
    whose message is one line naming the extra and the pip command that adds it (the import
    that failed is not chained: the line is the whole story)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise ModuleNotFoundError(
            f"{importer} needs {_DISTRIBUTION.get(module, module)}, which a plain install leaves "
            f"out (the {extra} extra): {install_hint(extra)}", name=module) from None

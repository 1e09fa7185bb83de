"""`pip install .` and nothing else, as exporter/Dockerfile does: every command still works.

The suite's own virtualenv holds every extra, so it cannot see a module-level import of an
optional dependency. This test builds a fresh virtualenv from the checkout without extras
(non-editable, like the image) and runs, with that interpreter alone: `--version`, every
subcommand's `--help`, `schema`, `serve` publishing a snapshot over a real HTTP scrape, and the
commands that need an extra, which must print one line naming it (no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import scrape, value
from polling import wait_for
from grpo_monitor.cli import build_parser
from grpo_monitor.tools.stack import Child

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("numpy", "matplotlib", "torch", "trl", "transformers", "pytest")


def _subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path of the parser: ("serve",), ("stack",), ("stack", "up"), ..."""
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _subcommands(sub, (*prefix, name))


@pytest.fixture(scope="module")
def plain_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding `pip install .` (copied sources: the checkout stays untouched)."""
    work = tmp_path_factory.mktemp("plain")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "*.egg-info", "__pycache__", ".pytest_cache", "snapshots", "build"))
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    res = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(src)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return venv


def _run(venv: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # A clean environment: no PYTHONPATH (the suite's conftest puts exporter/ on sys.path) and
    # no GRPO_MONITOR_* from the caller.
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("GRPO_MONITOR_")}
    return subprocess.run([str(venv / "bin" / "grpo-monitor"), *args], capture_output=True,
                          text=True, timeout=120, env={**base, **(env or {})}, cwd=venv)


def test_plain_install_has_no_extras(plain_venv: Path) -> None:
    code = ("import importlib.util, json, sys; "
            f"print(json.dumps({{m: importlib.util.find_spec(m) is not None for m in {EXTRAS!r}}}))")
    res = subprocess.run([str(plain_venv / "bin" / "python"), "-c", code], capture_output=True,
                         text=True, timeout=60, cwd=plain_venv)
    present = json.loads(res.stdout)
    assert not any(present.values()), f"a plain install pulled in extras: {present}"


def test_version_and_every_help(plain_venv: Path) -> None:
    from grpo_monitor import __version__

    res = _run(plain_venv, "--version")
    assert (res.returncode, res.stdout.strip()) == (0, f"grpo-monitor {__version__}"), res.stderr
    commands = list(_subcommands(build_parser()))
    assert {("serve",), ("report",), ("train-demo",), ("stack", "up")} <= set(commands)
    for cmd in commands:
        res = _run(plain_venv, *cmd, "--help")
        assert res.returncode == 0, f"{' '.join(cmd)} --help: {res.stderr}"
        assert res.stdout.startswith("usage: grpo-monitor " + " ".join(cmd)), res.stdout[:200]
        assert "Traceback" not in res.stderr


def test_schema(plain_venv: Path) -> None:
    res = _run(plain_venv, "schema")
    assert res.returncode == 0, res.stderr
    assert "NativeRecord" in json.loads(res.stdout)["$defs"]


@pytest.mark.parametrize(("command", "extra"), [("report", "report"), ("train-demo", "torch")])
def test_a_missing_extra_is_one_line(plain_venv: Path, tmp_path: Path, command: str, extra: str) -> None:
    run = tmp_path / "exp"
    run.mkdir()
    (run / "rank-0.jsonl").write_text(json.dumps({"step": 1, "metrics": {"loss": 0.5}}) + "\n")
    args = [str(run)] if command == "report" else ["--snapshot.dir", str(tmp_path), "--steps", "2"]
    res = _run(plain_venv, command, *args)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert f"pip install 'grpo-monitor[{extra}]'" in lines[0] and "Traceback" not in res.stderr


def test_serve_publishes_a_snapshot(plain_venv: Path) -> None:
    # World-readable: the served process is the same user, but keep it out of pytest's 0700 tree
    # so that nothing depends on root's permission override.
    snapshots = Path(tempfile.mkdtemp(prefix="grpo-plain-"))
    try:
        (snapshots / "exp-plain").mkdir()
        (snapshots / "exp-plain" / "rank-0.jsonl").write_text(
            json.dumps({"step": 7, "metrics": {"reward/mean": 0.25, "loss": 0.5}}) + "\n")
        base = {k: v for k, v in os.environ.items()
                if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("GRPO_MONITOR_")}
        served = Child.start(
            "serve", [str(plain_venv / "bin" / "grpo-monitor"), "serve", "--snapshot.dir",
                      str(snapshots), "--web.listen-address", "127.0.0.1:0", "--no-collector.gpu"],
            plain_venv / "serve.log", plain_venv, env={**base, "PYTHONUNBUFFERED": "1"})

        def log() -> str:
            return served.log.read_text(errors="replace")

        try:
            # The exporter logs its URL once it listens.
            match = wait_for(lambda: re.search(r"serving (http://\S+)/metrics", log()), timeout=60)
            url = match.group(1)  # type: ignore[union-attr]
            wait_for(lambda: value(scrape(url), "grpo_step", run="exp-plain", rank="0") == 7, timeout=30)
            assert value(scrape(url), "grpo_reward_mean", run="exp-plain", rank="0") == 0.25
            assert "Traceback" not in log(), log()
        finally:
            served.stop()
            assert served.proc.returncode == 0, log()
    finally:
        shutil.rmtree(snapshots, ignore_errors=True)


def test_make_demo_installs_only_what_the_demo_needs(tmp_path: Path) -> None:
    """`make demo` installs the package alone: no torch, trl, transformers or matplotlib (the test
    extras), and only the two Debian servers the native stack runs."""
    venv = tmp_path / "venv"  # a venv that does not exist yet: make prints every install step
    res = subprocess.run(["make", "-n", "demo", f"VENV={venv}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True)
    installs = [line for line in res.stdout.splitlines() if "pip install" in line or "apt-get install" in line]
    assert installs, res.stdout
    for line in installs:
        for heavy in ("torch", "trl", "transformers", "matplotlib", "[test]", "[report]", "podman"):
            assert heavy not in line, f"make demo installs {heavy}: {line}"
    assert any(line.rstrip().endswith("-e .") for line in installs)
    assert any("prometheus prometheus-alertmanager" in line for line in res.stdout.splitlines())

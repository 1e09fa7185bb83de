"""The install paths of docs/sdk.md#install, each in a fresh virtualenv, the way a user runs it.

The exporter host: `pip install .` and nothing else, as exporter/Dockerfile does: every command
still works. The suite's own virtualenv holds every extra, so it cannot see a module-level import
of an optional dependency. This test builds a fresh virtualenv from the checkout without extras
(non-editable, like the image) and runs, with that interpreter alone: `--version`, every
subcommand's `--help`, `schema`, `serve` publishing a snapshot over a real HTTP scrape, and the
commands that need an extra, which must print one line naming it and the pip command that adds
it to this installation (no traceback).

The trainer's environment: `make dist`'s wheel into another fresh virtualenv: the SDK alone (no
heavy dependency), then the same wheel with `[trl]` (torch held to the suite's pinned wheel by a
constraint, as a trainer keeps its own torch) and a real TRL GRPOTrainer step through the
callback; and the git URL, `pip install 'grpo-monitor @ git+file://...@COMMIT'`.
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
    # The hint installs the extra from where this package came from: no index holds it.
    src = plain_venv.parent / "src"
    assert lines[0].endswith(f"pip install '{src}[{extra}]'"), lines[0]
    assert "Traceback" not in res.stderr


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
    # ARGS=--trainer plays the tiny real trainer: the torch extra too, torch held to the pinned
    # wheel by a constraint, and still no trl, transformers or matplotlib.
    res = subprocess.run(["make", "-n", "demo", f"VENV={venv}", "ARGS=--trainer"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True)
    installs = [line for line in res.stdout.splitlines() if "pip install" in line]
    torch_line = next(line for line in installs if "[torch]" in line)
    assert "-c " in torch_line and "torch==2.13.0" in res.stdout, res.stdout
    for line in installs:
        for heavy in ("trl", "transformers", "matplotlib", "[test]", "[report]"):
            assert heavy not in line, f"make demo ARGS=--trainer installs {heavy}: {line}"


# -- the trainer's environment: the wheel, its extras, a git URL ----------------------------------

TORCH_PIN = "torch==2.13.0"  # the suite's own torch (Makefile TORCH): a CPU wheel on local disk
TRL_STEP = """
import json, sys
from pathlib import Path
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from grpo_monitor.integrations.trl import GRPOMonitorCallback
sys.path.insert(0, sys.argv[2])
from tiny_model import tiny_model_dir

work = Path(sys.argv[1])
model, tokenizer = tiny_model_dir(work)
args = GRPOConfig(output_dir=str(work / "out"), per_device_train_batch_size=4, num_generations=4,
                  max_completion_length=6, max_steps=1, logging_steps=1, report_to=[], use_cpu=True,
                  beta=0.1, save_strategy="no", seed=0, disable_tqdm=True)
trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [len(c) / 6 for c in completions],
                      args=args, train_dataset=Dataset.from_dict({"prompt": ["1+1=?", "ab?"] * 4}),
                      processing_class=tokenizer, callbacks=[GRPOMonitorCallback(work / "snapshots", run="wheel")])
trainer.train()
"""


def _pip(venv: Path, *args: str, timeout: int = 900) -> None:
    # --no-compile: pip would byte-compile every module of torch, transformers and datasets, about
    # half of the install's time here; Python compiles the ones a run imports as it imports them.
    res = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                          "--no-compile", *args], capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stdout + res.stderr


def _python(venv: Path, code: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin" / "python"), "-c", code, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=venv, env=base)


def test_the_wheel_installs_the_sdk_then_trl_beside_the_trainer(tmp_path: Path) -> None:
    """`make dist`, then a trainer's fresh virtualenv: the wheel alone gives the SDK without torch,
    numpy or the exporter's heavy parts; `wheel[trl]` adds TRL (torch pinned by a constraint) and
    a real GRPOTrainer step writes its signals through the callback."""
    built = subprocess.run(["make", "dist", f"DIST={tmp_path / 'dist'}"], cwd=ROOT, capture_output=True,
                           text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("grpo_monitor-*-py3-none-any.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    _pip(venv, str(wheel))
    sdk = _python(venv, (
        "import importlib.util, json, sys; from grpo_monitor import SnapshotWriter; "
        "from grpo_monitor.sdk.pause import PauseGate; "
        "from grpo_monitor.tools.stack import project_config_dir; "
        "w = SnapshotWriter(sys.argv[1], 'sdk'); w.log({'reward/mean': 0.5}, 1); w.close(); "
        f"print(json.dumps({{'absent': [m for m in {EXTRAS!r} if importlib.util.find_spec(m)], "
        "'config': str(project_config_dir())}))"), str(tmp_path / "snaps"))
    assert sdk.returncode == 0, sdk.stderr
    found = json.loads(sdk.stdout)
    assert found["absent"] == [], f"the SDK pulled in {found['absent']}"
    # The wheel carries the stack's configuration: `stack up` works without a checkout.
    assert found["config"].endswith("grpo_monitor/tools/stack_config/prometheus"), found
    assert (Path(found["config"]) / "rules" / "grpo-alerts.yml").is_file()
    assert '"reward/mean":0.5' in (tmp_path / "snaps" / "sdk" / "rank-0.jsonl").read_text()

    # The trainer-side install (docs/sdk.md#install): the wheel without its dependencies.
    # SnapshotWriter, PauseGate and the samples helper work with the standard library alone; a
    # command that needs the exporter's dependencies says so in one line.
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(bare)], check=True, timeout=120)
    _pip(bare, "--no-deps", str(wheel))
    sdk = _python(bare, (
        "import json, sys; from grpo_monitor import SnapshotWriter; "
        "from grpo_monitor.sdk.pause import PauseGate; from grpo_monitor.sdk.samples import replay_samples; "
        "w = SnapshotWriter(sys.argv[1], 'bare'); PauseGate(w, group=False).check(1); "
        "w.log({'reward/mean': 0.5}, 1); w.close(); "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names))))"),
        str(tmp_path / "snaps"))
    assert sdk.returncode == 0, sdk.stderr
    assert [m for m in json.loads(sdk.stdout) if not m.startswith("_")] == ["grpo_monitor"]
    serve = subprocess.run([str(bare / "bin" / "grpo-monitor"), "serve", "--help"], capture_output=True,
                           text=True, timeout=60)
    assert serve.returncode == 2 and len(serve.stderr.strip().splitlines()) == 1, serve.stderr
    assert "grpo-monitor serve needs " in serve.stderr and "--no-deps" in serve.stderr
    assert f"pip install '{wheel}'" in serve.stderr, serve.stderr

    constraint = tmp_path / "constraint.txt"
    constraint.write_text(TORCH_PIN + "\n")
    _pip(venv, "-c", str(constraint), f"{wheel}[trl]")
    step = _python(venv, TRL_STEP, str(tmp_path), str(ROOT / "tests"), timeout=600)
    assert step.returncode == 0, step.stdout[-3000:] + step.stderr[-3000:]
    (record, end) = [json.loads(line) for line in
                     (tmp_path / "snapshots" / "wheel" / "rank-0.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and {"reward/mean", "kl/mean", "loss"} <= record["metrics"].keys()
    assert [e["type"] for e in end["events"]] == ["run_end"]
    version = _python(venv, "import torch; print(torch.__version__)")
    assert version.stdout.startswith(TORCH_PIN.split("==")[1]), version.stdout


def test_the_dependency_table_is_pyprojects() -> None:
    """extras.DEPENDENCY_MODULES names every dependency of pyproject.toml, and nothing else."""
    import tomllib

    from grpo_monitor.extras import DEPENDENCY_MODULES

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower() for d in deps}
    assert names == set(DEPENDENCY_MODULES.values())


def test_a_git_url_installs_the_committed_package(plain_venv: Path, tmp_path: Path) -> None:
    """`pip install 'grpo-monitor @ git+...@COMMIT'`, the repository's URL (a local clone of this
    checkout's commit here), into the plain venv: its dependencies are there already, so pip only
    clones and builds. The hint for a missing extra then names that URL."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True, timeout=30).stdout.strip()
    url = f"git+file://localhost{ROOT}@{commit}"  # pip 23 refuses an empty host in a PEP 508 URL
    _pip(plain_venv, "--force-reinstall", "--no-deps", f"grpo-monitor @ {url}")
    try:
        res = _run(plain_venv, "report", str(tmp_path))
        assert res.returncode == 2
        assert res.stderr.strip().endswith(f"pip install 'grpo-monitor[report] @ {url}'"), res.stderr
    finally:  # the module's other tests see the checkout's install again
        _pip(plain_venv, "--force-reinstall", "--no-deps", str(plain_venv.parent / "src"))

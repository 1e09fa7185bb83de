"""The command line: the registry (flags with dest names, defaults from the models, the old
spellings), environment overrides, schema, and `serve` as a real process."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from conftest import scrape, value
from polling import wait_for
from processes import log_tail, start_listening
from grpo_monitor.cli import COMMANDS, ENV_PREFIX, _config, build_parser, env_name, main
from grpo_monitor.contract import thresholds
from grpo_monitor.runtime.config import ExporterConfig, format_bytes, format_duration, parse_bytes, parse_duration
from grpo_monitor.runtime.signals import BASELINE_STEPS
from grpo_monitor.runtime.store import Limits
from grpo_monitor.tools import train_demo
from grpo_monitor.tools.simulate import write_run
from grpo_monitor.tools.stack import Child, StackConfig

CLI = [sys.executable, "-m", "grpo_monitor.cli"]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_serve_help_explains_every_flag() -> None:
    out = run_cli("serve", "--help").stdout
    for flag in ("--snapshot.dir", "--web.listen-address", "--snapshot.poll", "--no-snapshot.poll",
                 "--snapshot.run-timeout", "--metrics.max-unknown-keys", "--log.level"):
        assert flag in out
    assert "GRPO_MONITOR_SNAPSHOT_DIR" in out and "default: :9400" in out


def test_environment_overrides_and_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_MONITOR_SNAPSHOT_DIR", "/from/env")
    monkeypatch.setenv("GRPO_MONITOR_SNAPSHOT_RUN_TIMEOUT", "2h30m")
    monkeypatch.setenv("GRPO_MONITOR_SNAPSHOT_POLL", "true")
    args = build_parser().parse_args(["serve"])
    assert args.snapshot_dir == Path("/from/env")
    assert args.run_timeout == 9000.0
    assert args.poll is True
    args = build_parser().parse_args(["serve", "--snapshot.dir", "/flag", "--no-snapshot.poll"])
    assert args.snapshot_dir == Path("/flag") and args.poll is False
    assert env_name("--web.listen-address") == "GRPO_MONITOR_WEB_LISTEN_ADDRESS"


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults as the models have them: no GRPO_MONITOR_* (nor GRPO_OWNER) from the outside."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX) or name == "GRPO_OWNER":
            monkeypatch.delenv(name)


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (command path, parser) under the top-level parser."""
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _parsers(sub, (*path, name))


def test_every_command_is_one_registry_entry_and_every_flag_has_a_dest_name(no_env: None) -> None:
    parsers = dict(_parsers(build_parser()))
    leaves = {path for path, p in parsers.items() if p.get_default("func") is not None}
    assert leaves == {tuple(c.name.split()) for c in COMMANDS}
    for command in COMMANDS:
        parser = parsers[tuple(command.name.split())]
        assert parser.get_default("func") is command.handler
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            # A handler reads args.<dest>: a dotted flag must not leave argparse to derive it.
            assert action.dest.isidentifier(), (command.name, action.option_strings, action.dest)
        flags = command.flags()
        assert len({f.dest for f in flags}) == len(flags), command.name  # one flag per attribute


def test_serve_defaults_are_the_config_models(no_env: None) -> None:
    args = build_parser().parse_args(["serve", "--snapshot.dir", "/s"])
    # Each dest is the ExporterConfig (or Limits) field it sets: none is lost on the way.
    fields = {f.name for model in (ExporterConfig, Limits) for f in dataclasses.fields(model)}
    assert set(vars(args)) - fields == {"command", "func", "log_level"}
    assert _config(args) == ExporterConfig(Path("/s"))
    help_text = dict(_parsers(build_parser()))[("serve",)].format_help()
    assert "(default: 16MiB)" in help_text and "(default: 1h)" in help_text


def test_the_other_commands_defaults_are_their_models(no_env: None) -> None:
    parse = build_parser().parse_args
    stack = parse(["stack", "up", "--snapshot.dir", "/s"])
    model = StackConfig(Path("/s"), Path("/state"), Path("/config"))
    assert [getattr(stack, f"{n}_port") for n in ("exporter", "prometheus", "alertmanager", "grafana")] == [
        model.exporter_port, model.prometheus_port, model.alertmanager_port, model.grafana_port]
    demo = parse(["train-demo", "--snapshot.dir", "/s"])
    assert train_demo.config_from_args(demo, Path("/s")) == train_demo.Config(Path("/s"))
    sim = parse(["simulate"])
    run_defaults = {n: p.default for n, p in inspect.signature(write_run).parameters.items()
                    if p.default is not inspect.Parameter.empty}
    assert {"scenario": sim.scenario, "steps": sim.simulated_steps, "onset": sim.onset,
            "ranks": sim.ranks, "step_seconds": sim.step_seconds, "realtime": sim.realtime,
            "seed": sim.seed} == run_defaults


def test_one_baseline_length(no_env: None) -> None:
    """The exporter's baseline period, rebaseline's default and the report's window are one number;
    the exporter does not import the report's table, so this test keeps them equal."""
    rebaseline = build_parser().parse_args(["rebaseline", "--snapshot.dir", "/s", "r"])
    assert Limits().baseline_steps == rebaseline.baseline_steps == BASELINE_STEPS
    assert thresholds.count("baseline_steps") == BASELINE_STEPS


@pytest.mark.parametrize(("argv", "new", "dest"), [
    (["demo"], "--simulated-steps", "simulated_steps"),
    (["simulate"], "--simulated-steps", "simulated_steps"),
    (["train-demo", "--snapshot.dir", "/s"], "--training-steps", "steps"),
    (["rebaseline", "--snapshot.dir", "/s", "r"], "--baseline-steps", "baseline_steps"),
])
def test_the_old_steps_spelling_still_works(no_env: None, argv: list[str], new: str, dest: str) -> None:
    parse = build_parser().parse_args
    assert getattr(parse([*argv, "--steps", "7"]), dest) == 7
    assert getattr(parse([*argv, new, "8"]), dest) == 8
    default = getattr(parse(argv), dest)
    assert default not in (7, 8)  # the hidden spelling leaves the default alone when absent
    # Wide enough that argparse wraps no help line (it breaks words at hyphens).
    help_text = run_cli(argv[0], "--help", env={"COLUMNS": "400"}).stdout
    assert new in help_text and "Formerly --steps, which still works." in help_text
    assert "[--steps" not in help_text  # the old spelling is not offered in the usage


def test_simulate_writes_the_same_run_under_either_spelling(tmp_path: Path) -> None:
    for flag, run in (("--steps", "old"), ("--simulated-steps", "new")):
        proc = run_cli("simulate", "--snapshot.dir", str(tmp_path), "--run", run, "--ranks", "1", flag, "3")
        assert proc.returncode == 0 and proc.stdout.startswith("wrote 3 steps"), proc.stdout + proc.stderr
    assert (tmp_path / "old" / "rank-0.jsonl").read_text().count("\n") == (
        tmp_path / "new" / "rank-0.jsonl").read_text().count("\n")


def test_main_runs_a_command_from_its_argv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m grpo_monitor.tools.report` is `main(["report", ...])`."""
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


@pytest.mark.parametrize("seconds", [0.0, 0.5, 1.0, 30.0, 3600.0, 9000.0, 90061.5])
def test_durations_are_shown_as_they_are_typed(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(("size", "shown"), [(16 << 20, "16MiB"), (1 << 20, "1MiB"), (1000, "1000"), (0, "0")])
def test_sizes_are_shown_as_they_are_typed(size: int, shown: str) -> None:
    assert format_bytes(size) == shown and parse_bytes(shown) == size


def test_serve_requires_a_snapshot_dir() -> None:
    proc = run_cli("serve")
    assert proc.returncode == 2 and "--snapshot.dir" in proc.stderr


def test_schema_is_json_schema_for_all_three_shapes() -> None:
    proc = run_cli("schema")
    assert proc.returncode == 0
    schema = json.loads(proc.stdout)
    assert "contract v1" in schema["title"]
    assert {"NativeRecord", "VerlRecord", "FlatRecord"} <= schema["$defs"].keys()
    native = schema["$defs"]["NativeRecord"]
    assert {"step", "metrics"} <= set(native["required"])
    assert "by_type" in native["properties"] and "samples" in native["properties"]


def serve(stack: ExitStack, snapshot_dir: Path, workdir: Path) -> Child:
    """`grpo-monitor serve` as a child process on a free port, its snapshot folder from the
    environment; ``stack`` stops it."""
    # Root reads any file whatever its mode: drop the capabilities that let it, so that an
    # unreadable file is unreadable to the exporter as it is for a normal user.
    prefix = (["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
              if os.geteuid() == 0 else [])
    env = {**os.environ, "GRPO_MONITOR_SNAPSHOT_DIR": str(snapshot_dir), "PYTHONUNBUFFERED": "1"}
    child, _ = start_listening(
        stack, "serve",
        lambda port: [*prefix, *CLI, "serve", "--web.listen-address", f"127.0.0.1:{port}"],
        workdir, env=env)
    return child


def test_serve_process_unreadable_file_and_promtool(world_readable_dir: Path,
                                                    tmp_path: Path) -> None:
    run = world_readable_dir / "exp"
    run.mkdir(mode=0o777)
    secret = run / "rank-1.jsonl"
    secret.write_text(json.dumps({"step": 2, "metrics": {"loss": 0.5}}) + "\n")
    secret.chmod(0o000)
    (run / "rank-0.jsonl").write_text(json.dumps({"step": 1, "metrics": {
        "loss": float("nan"), "reward/p50": 0.3, "kl/p95": 0.2, "odd key": 1}}) + "\n")
    with ExitStack() as stack:
        served = serve(stack, world_readable_dir, tmp_path)
        # It says where it serves, and what it reads (logged once its server is up, so it may
        # follow the first ready answer).
        said = f"serving {served.url}/metrics for snapshots under {world_readable_dir}"
        wait_for(lambda: said in served.log.read_text(), what=said,
                 diagnose=lambda: log_tail(served))
        wait_for(lambda: value(scrape(served.url), "grpo_step", run="exp", rank="0") == 1)
        s = scrape(served.url)
        assert value(s, "grpo_snapshot_errors_total", reason="read_error") == 1
        assert value(s, "grpo_step", run="exp", rank="1") is None
        assert sum("rank-1.jsonl" in line and "read_error" in line
                   for line in served.log.read_text().splitlines()) == 1
        # promtool's linter on a real scrape prints nothing.
        body = requests.get(f"{served.url}/metrics", timeout=5).content
        lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True,
                              timeout=30)
        assert (lint.returncode, lint.stdout, lint.stderr) == (0, b"", b"")
        # Made readable, the file is read on its attribute-change event.
        secret.chmod(0o644)
        wait_for(lambda: value(scrape(served.url), "grpo_step", run="exp", rank="1") == 2)
        assert requests.get(f"{served.url}/-/healthy", timeout=2).text == "OK\n"
        # A clean exit on SIGTERM, not the SIGKILL that follows a hung shutdown.
        served.stop()
        assert served.proc.returncode == 0, log_tail(served)


@pytest.mark.parametrize("command", ["demo", "simulate"])
def test_an_unknown_scenario_is_a_usage_error(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([command, "--scenario", "kl_explosoin"])
    assert exc.value.code == 2
    assert "invalid choice: 'kl_explosoin'" in capsys.readouterr().err


# -- errors a person can act on: one line, exit 2, no traceback --------------------------------


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_an_unknown_flag_names_the_closest_one() -> None:
    # Before the required flag it hides: argparse alone would complain about --snapshot.dir.
    line = one_line_error(run_cli("serve", "--snapshot.dri", "/x"))
    assert "unknown flag --snapshot.dri; did you mean --snapshot.dir?" in line, line
    line = one_line_error(run_cli("stack", "up", "--snapshot.dir", "/s", "--prometheus.prot", "1"))
    assert line.startswith("grpo-monitor stack up: unknown flag --prometheus.prot; did you mean "
                           "--prometheus.port?"), line
    assert "unexpected argument 'extra'" in one_line_error(run_cli("report", "/r", "extra"))


def test_serve_on_a_busy_port_says_so_in_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line_error(run_cli("serve", "--snapshot.dir", str(tmp_path), "--no-collector.gpu",
                                      "--web.listen-address", f"127.0.0.1:{port}"))
    assert line == (f"grpo-monitor serve: cannot listen on 127.0.0.1:{port}: address already in "
                    "use; pick another with --web.listen-address"), line


def test_a_missing_snapshot_folder_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    for argv, said in ((["replay", "--snapshot.dir", str(missing), "r"], "no snapshot folder"),
                       (["resume", "--snapshot.dir", str(missing), "r"], "no run 'r'"),
                       (["rebaseline", "--snapshot.dir", str(missing), "r"], "no run folder"),
                       (["report", str(missing)], "is not a folder")):
        assert said in one_line_error(run_cli(*argv)), argv


def test_resume_refuses_a_run_that_is_not_paused(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from grpo_monitor.contract.control import ControlRecord, read_control, write_control

    (tmp_path / "never").mkdir()
    (tmp_path / "never" / "rank-0.jsonl").write_text('{"step": 3, "metrics": {"loss": 1}}\n')
    resume = ["resume", "--snapshot.dir", str(tmp_path)]
    # Never paused: nothing is written, and it says so.
    assert main([*resume, "never"]) == 2
    assert "run 'never' has no pause record here" in capsys.readouterr().err
    assert read_control(tmp_path, "never") is None
    # Paused, resumed, resumed again: the second is refused.
    write_control(tmp_path, "never", ControlRecord(state="paused", run="never", alertname="X"))
    assert main([*resume, "never"]) == 0
    assert "'never': paused -> running" in capsys.readouterr().out
    assert main([*resume, "never"]) == 2
    assert "is not paused (running since 20" in capsys.readouterr().err
    # --force writes a running record all the same.
    assert main([*resume, "never", "--force"]) == 0
    assert "not paused (--force) -> running" in capsys.readouterr().out
    # No record here, but the run's rank here waits (PauseGate's mark ends its file): a fleet whose
    # card reached another node's folder. Resumed without --force.
    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet" / "rank-3.jsonl").write_text(
        '{"step": 9, "metrics": {"loss": 1}}\n{"step": 9, "metrics": {}, "events": [{"type": "paused"}]}\n')
    assert main([*resume, "fleet"]) == 0
    assert "paused (rank 3 waits here" in capsys.readouterr().out
    assert read_control(tmp_path, "fleet").state == "running"  # type: ignore[union-attr]


def test_a_missing_extra_names_the_installation_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hint is the pip command that adds the extra where this package came from (PEP 610):
    no index holds grpo-monitor."""
    from grpo_monitor import extras

    cases = {
        '{"url": "file:///src/grpo-monitor", "dir_info": {"editable": true}}':
            "pip install -e '/src/grpo-monitor[report]'",
        '{"url": "file:///w/grpo_monitor-0.1.0-py3-none-any.whl", "archive_info": {}}':
            "pip install '/w/grpo_monitor-0.1.0-py3-none-any.whl[report]'",
        '{"url": "https://git.example/grpo-monitor", "vcs_info": {"vcs": "git", "commit_id": "abc"}}':
            "pip install 'grpo-monitor[report] @ git+https://git.example/grpo-monitor@abc'",
    }
    for direct_url, hint in cases.items():
        dist = SimpleNamespace(read_text=lambda name, raw=direct_url: raw if name == "direct_url.json" else None)
        monkeypatch.setattr(extras.importlib.metadata, "distribution", lambda _name, d=dist: d)
        assert extras.install_hint("report") == hint
    monkeypatch.setattr(extras.importlib.metadata, "distribution",
                        lambda _name: SimpleNamespace(read_text=lambda _n: None))
    assert "docs/sdk.md#install" in extras.install_hint("report")


def test_check_and_report_take_a_relative_run_folder(tmp_path: Path) -> None:
    """`grpo-monitor check .` in a run folder, `report run` beside it: the same run as its full
    path gives (the ingest's root is the folder above it, whatever the path looks like)."""
    from grpo_monitor.sdk.writer import SnapshotWriter

    writer = SnapshotWriter(tmp_path, "myrun")
    for step in range(1, 30):
        writer.log({"reward/mean": 0.01 * step, "loss": 0.5}, step)
    writer.close()
    for cwd, arg in ((tmp_path / "myrun", "."), (tmp_path, "myrun")):
        for command in (["check", arg], ["report", arg, "--out", str(tmp_path / "out")]):
            res = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", *command], cwd=cwd,
                                 capture_output=True, text=True, timeout=120)
            assert res.returncode in (0, 1), (command, res.stderr)
            assert "run myrun: 29 logged steps" in res.stdout or \
                "run myrun: 1 rank(s) [0], steps 1..29" in res.stdout, (command, res.stdout)

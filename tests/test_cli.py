"""The command line: flags, environment overrides, schema, and `serve` as a real process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from conftest import scrape, value, wait_for
from grpo_monitor.cli import build_parser, env_name

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
    args = vars(build_parser().parse_args(["serve"]))
    assert args["snapshot.dir"] == Path("/from/env")
    assert args["snapshot.run_timeout"] == 9000.0
    assert args["snapshot.poll"] is True
    args = vars(build_parser().parse_args(["serve", "--snapshot.dir", "/flag", "--no-snapshot.poll"]))
    assert args["snapshot.dir"] == Path("/flag") and args["snapshot.poll"] is False
    assert env_name("--web.listen-address") == "GRPO_MONITOR_WEB_LISTEN_ADDRESS"


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


class Served:
    """`grpo-monitor serve` as a child process; its URL is read from its own log line."""

    def __init__(self, snapshot_dir: Path) -> None:
        # Root reads any file whatever its mode: drop the capabilities that let it, so that an
        # unreadable file is unreadable to the exporter as it is for a normal user.
        prefix = (["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
                  if os.geteuid() == 0 else [])
        env = {**os.environ, "GRPO_MONITOR_SNAPSHOT_DIR": str(snapshot_dir),
               "GRPO_MONITOR_WEB_LISTEN_ADDRESS": "127.0.0.1:0", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([*prefix, *CLI, "serve"], env=env, stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True)
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        try:
            match = wait_for(lambda: next((m for line in self.log
                                           if (m := re.search(r"serving (http://\S+)/metrics", line))), None))
            self.url = match.group(1)  # type: ignore[union-attr]
            wait_for(lambda: requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200)
        except AssertionError:
            self.stop()
            raise AssertionError("grpo-monitor serve did not get ready:\n" + "".join(self.log)) from None

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout=10)


def test_serve_process_unreadable_file_and_promtool(world_readable_dir: Path) -> None:
    run = world_readable_dir / "exp"
    run.mkdir(mode=0o777)
    secret = run / "rank-1.jsonl"
    secret.write_text(json.dumps({"step": 2, "metrics": {"loss": 0.5}}) + "\n")
    secret.chmod(0o000)
    (run / "rank-0.jsonl").write_text(json.dumps({"step": 1, "metrics": {
        "loss": float("nan"), "reward/p50": 0.3, "kl/p95": 0.2, "odd key": 1}}) + "\n")
    served = Served(world_readable_dir)
    try:
        wait_for(lambda: value(scrape(served.url), "grpo_step", run="exp", rank="0") == 1)
        s = scrape(served.url)
        assert value(s, "grpo_snapshot_errors_total", reason="read_error") == 1
        assert value(s, "grpo_step", run="exp", rank="1") is None
        assert sum("rank-1.jsonl" in line and "read_error" in line for line in served.log) == 1
        # promtool's linter on a real scrape prints nothing.
        body = requests.get(f"{served.url}/metrics", timeout=5).content
        lint = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True,
                              timeout=30)
        assert (lint.returncode, lint.stdout, lint.stderr) == (0, b"", b"")
        # Made readable, the file is read on its attribute-change event.
        secret.chmod(0o644)
        wait_for(lambda: value(scrape(served.url), "grpo_step", run="exp", rank="1") == 2)
        assert requests.get(f"{served.url}/-/healthy", timeout=2).text == "OK\n"
    finally:
        assert served.stop() == 0

"""Names that round-trip: a run folder whose name is not UTF-8 is exported under a label that
carries its bytes as \\udcXX escapes, and that label leads back to the folder, so the run can be
paused (webhook), resumed, re-baselined, replayed and reported, under a strict UTF-8 stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import requests
from conftest import Running, value

from grpo_monitor.contract.control import read_control
from grpo_monitor.contract.run_layout import folder_name, is_run_label, run_label

TOKEN = "names-token"
RAW = b"caf\xff-run"
CLI = [sys.executable, "-m", "grpo_monitor.cli"]
STRICT = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def test_a_label_leads_back_to_its_folder_and_no_two_folders_share_one() -> None:
    names = [os.fsdecode(raw) for raw in (RAW, b"a\\b", b"a\\udcff", b"a\xff", b"plain run",
                                          b"x\\\\y\xfe", "日本".encode())]
    labels = [run_label(name) for name in names]
    assert labels[0] == "caf\\udcff-run" and labels[4] == "plain run" and labels[6] == "日本"
    assert len(set(labels)) == len(names)
    assert [folder_name(label) for label in labels] == names
    for bad in ("a\\b", "a\\b\\", "..\\udcff", ".\\udcff", "\\udc41x/y", "x\\udc7f", "a\\qb"):
        assert not is_run_label(bad), bad


def test_a_run_whose_folder_is_not_utf8_can_be_paused_resumed_replayed_and_reported(
        start_exporter: Callable[..., Running], snapshot_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    folder = os.fsencode(snapshot_dir) + b"/" + RAW
    os.mkdir(folder)
    sample = {"prompt": "1+1=", "responses": [{"text": "2", "reward": 1.0}]}
    with open(folder + b"/rank-0.jsonl", "w") as fh:
        for step in range(1, 31):
            fh.write(json.dumps({"step": step, "metrics": {"reward/mean": 0.5, "loss": 0.1},
                                 **({"samples": [sample]} if step == 10 else {})}) + "\n")
    exporter = start_exporter(webhook_token_file=tmp_path / "token", gpu_collector=False,
                              enable_replay=True)
    label = run_label(os.fsdecode(RAW))
    exporter.wait_value("grpo_step", 30, run=label, rank="0")
    # The card carries the label the exporter published; the pause lands in the folder.
    card = {"status": "firing", "labels": {"alertname": "GRPONonFiniteValues", "run": label,
                                          "severity": "critical"},
            "startsAt": "2025-01-01T00:00:00Z", "fingerprint": "fp"}
    r = requests.post(exporter.url + "/-/alertmanager/webhook", timeout=10,
                      json={"version": "4", "alerts": [card]},
                      headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.text.startswith("paused: "), r.text
    assert os.path.exists(folder + b"/.grpo-control.json")
    record = read_control(snapshot_dir, label)
    assert record is not None and record.state == "paused" and record.run == label
    assert value(exporter.scrape(), "grpo_card_pauses_total", result="paused") == 1
    # A person copies the label from a dashboard.
    for args in (["resume", label, "--snapshot.dir", str(snapshot_dir)],
                 ["rebaseline", label, "--snapshot.dir", str(snapshot_dir), "--baseline-steps", "10"],
                 ["replay", label, "--snapshot.dir", str(snapshot_dir), "--step", "10"],
                 ["report", os.fsdecode(folder), "--out", str(tmp_path / "out")]):
        res = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=180, env=STRICT)
        assert res.returncode == 0, (args[0], res.stdout[-1000:], res.stderr[-2000:])
    record = read_control(snapshot_dir, label)
    assert record is not None and record.state == "running"
    assert os.path.exists(folder + b"/.grpo-baseline.json")
    page = requests.get(exporter.url + "/replay", params={"run": label, "format": "json"}, timeout=10)
    assert page.status_code == 200 and page.json()["samples"][0]["prompt"] == "1+1=", page.text

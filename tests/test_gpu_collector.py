"""The NVML GPU collector: real scrapes of an exporter with the fake pynvml injected, a golden
exposition file, and the real pynvml on this GPU-less machine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest

import fake_pynvml as nv
from conftest import Running, Samples, parse_samples, value
from fake_pynvml import FakeDevice, FakeNVML
from polling import wait_for
from grpo_monitor.cli import _config, build_parser
from grpo_monitor.runtime.collectors.gpu import CLOCK_EVENT_REASONS, GPU_FAMILIES, HEALTH_FAMILIES, GPUCollector
from grpo_monitor.runtime.config import ExporterConfig

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "fixtures" / "gpu_exposition.prom"
U0 = "GPU-5f2a9c3e-1b7d-4e80-a6f1-3c9d2b8e7a10"
U1 = "GPU-c81e4d07-92ab-4f3c-b5d6-0e7f18a29c44"
H100 = "NVIDIA H100 80GB HBM3"
G0 = {"gpu": "0", "uuid": U0, "model": H100}
G1 = {"gpu": "1", "uuid": U1, "model": H100}
EXTRA_LABELS = {f.name: set(f.labels) for f in GPU_FAMILIES}
HEALTH = {f.name for f in HEALTH_FAMILIES}


def two_gpus() -> list[FakeDevice]:
    """GPU 0 trains with NVLink links 0 and 1 active and link 2 down; GPU 1 idles, no NVLink."""
    return [
        FakeDevice(U0, nvlink_links=3, nvlink={0: (1, 0, 3, 0), 1: (0, 0, 0, 2)}, ecc=(12, 0),
                   pcie_replays=4),
        FakeDevice(U1, utilization=0, memory_used=553_648_128, temperature=41, power_mw=71_230,
                   energy_mj=1_234_567_890, sm_clock_mhz=345, clock_reasons=nv.nvmlClocksEventReasonGpuIdle),
    ]


def gpu_series(samples: Samples) -> dict[str, list[dict[str, str]]]:
    """Per-GPU series (health series left out): name -> label sets."""
    out: dict[str, list[dict[str, str]]] = {}
    for name, labels in samples:
        if name.startswith("grpo_gpu_") and name not in HEALTH:
            out.setdefault(name, []).append(dict(labels))
    return out


def of_gpu(samples: Samples, uuid: str) -> set[str]:
    return {name for name, ls in gpu_series(samples).items() for labels in ls if labels["uuid"] == uuid}


def start_gpu(start_exporter: Callable[..., Running], fake: FakeNVML, **kw: object) -> Running:
    run = start_exporter(gpu_nvml=fake, gpu_interval=kw.pop("gpu_interval", 0.05), **kw)
    run.wait_value("grpo_gpu_collector_up", 1.0)
    return run


def scrape_until(run: Running, ok: Callable[[Samples], bool]) -> Samples:
    box: list[Samples] = []

    def check() -> bool:
        box[:] = [run.scrape()]
        return ok(box[0])

    wait_for(check)
    return box[0]


def render(collector: GPUCollector) -> str:
    """The collector's families alone, as /metrics has them; the clock-dependent values masked."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return re.sub(r"^(grpo_gpu_collector_(?:last_success_timestamp|duration)_seconds) \S+$",
                  r"\1 <varies>", text, flags=re.MULTILINE)


def samples_of(collector: GPUCollector) -> Samples:
    registry = CollectorRegistry()
    registry.register(collector)
    return parse_samples(generate_latest(registry).decode())


def test_every_series_with_base_units_and_gpu_labels(start_exporter: Callable[..., Running]) -> None:
    fake = FakeNVML(two_gpus())
    fake.xid(1, 79)
    run = start_gpu(start_exporter, fake)
    s = run.wait_value("grpo_gpu_xid_errors_total", 1.0, **G1, xid="79") and run.scrape()
    assert value(s, "grpo_gpu_info", **G0, driver_version="550.90.07") == 1
    assert value(s, "grpo_gpu_info", **G1, driver_version="550.90.07") == 1
    assert value(s, "grpo_gpu_utilization_ratio", **G0) == 0.97
    assert value(s, "grpo_gpu_utilization_ratio", **G1) == 0.0
    assert value(s, "grpo_gpu_memory_used_bytes", **G0) == 71_437_467_648
    assert value(s, "grpo_gpu_memory_total_bytes", **G1) == 85_520_809_984
    assert value(s, "grpo_gpu_temperature_celsius", **G0) == 64
    assert value(s, "grpo_gpu_power_watts", **G0) == 612.345
    assert value(s, "grpo_gpu_power_watts", **G1) == 71.23
    assert value(s, "grpo_gpu_energy_joules_total", **G0) == 9_876_543.21
    assert value(s, "grpo_gpu_sm_clock_hertz", **G0) == 1.98e9
    assert value(s, "grpo_gpu_sm_clock_hertz", **G1) == 345e6
    for reason, _ in CLOCK_EVENT_REASONS:
        assert value(s, "grpo_gpu_clock_event_reasons", **G0, reason=reason) == (reason == "sw_power_cap")
        assert value(s, "grpo_gpu_clock_event_reasons", **G1, reason=reason) == (reason == "gpu_idle")
    assert value(s, "grpo_gpu_pcie_replay_errors_total", **G0) == 4
    assert value(s, "grpo_gpu_ecc_errors_total", **G0, type="corrected") == 12
    assert value(s, "grpo_gpu_ecc_errors_total", **G0, type="uncorrected") == 0
    # NVLink: the two active links of GPU 0, four error types each; link 2 is down, GPU 1 has none.
    nvlink = {(ls["gpu"], ls["link"], ls["type"]) for ls in gpu_series(s)["grpo_gpu_nvlink_errors_total"]}
    assert nvlink == {("0", link, t) for link in ("0", "1") for t in ("crc_flit", "crc_data", "replay", "recovery")}
    assert value(s, "grpo_gpu_nvlink_errors_total", **G0, link="0", type="crc_flit") == 3
    assert value(s, "grpo_gpu_nvlink_errors_total", **G0, link="0", type="replay") == 1
    assert value(s, "grpo_gpu_nvlink_errors_total", **G0, link="1", type="crc_data") == 2
    # Every per-GPU series carries exactly gpu, uuid, model and its own labels: no host label.
    for name, label_sets in gpu_series(s).items():
        family = name if name in EXTRA_LABELS else None
        assert family, f"{name} is not a documented GPU family"
        for labels in label_sets:
            assert set(labels) == {"gpu", "uuid", "model"} | EXTRA_LABELS[family], (name, labels)
    assert set(gpu_series(s)) == {f.name for f in GPU_FAMILIES}
    assert value(s, "grpo_gpu_collector_failures_total") == 0
    assert value(s, "grpo_gpu_collector_last_success_timestamp_seconds") > 1.7e9  # type: ignore[operator]
    assert 0 < value(s, "grpo_gpu_collector_duration_seconds") < 1  # type: ignore[operator]


def test_golden_exposition() -> None:
    fake = FakeNVML(two_gpus())
    fake.xid(0, 13)
    fake.xid(1, 79)
    fake.xid(0, 13)
    collector = GPUCollector(nvml=fake)
    collector.collect_once()
    text = render(collector)
    if os.environ.get("GRPO_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "GPU exposition changed: check it, then GRPO_UPDATE_GOLDEN=1 pytest"


def test_unsupported_fields_are_skipped_alone(start_exporter: Callable[..., Running]) -> None:
    devices = two_gpus()
    devices[1].errors = {
        "nvmlDeviceGetPowerUsage": nv.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetTotalEccErrors": nv.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetPcieReplayCounter": nv.NVML_ERROR_NO_PERMISSION,
        "nvmlDeviceGetTotalEnergyConsumption": nv.NVML_ERROR_UNKNOWN,
        "nvmlDeviceGetTemperatureV": nv.NVML_ERROR_FUNCTION_NOT_FOUND,  # an older driver
        "nvmlDeviceRegisterEvents": nv.NVML_ERROR_NOT_SUPPORTED,
    }
    devices[0].errors = {"nvmlDeviceGetNvLinkErrorCounter": nv.NVML_ERROR_NOT_SUPPORTED}
    fake = FakeNVML(devices)
    fake.xid(1, 48)  # GPU 1 could not register for events: never delivered
    fake.xid(0, 31)
    run = start_gpu(start_exporter, fake)
    s = run.wait_value("grpo_gpu_xid_errors_total", 1.0, **G0, xid="31") and run.scrape()
    assert of_gpu(s, U1) == {f.name for f in GPU_FAMILIES} - {
        "grpo_gpu_power_watts", "grpo_gpu_ecc_errors_total", "grpo_gpu_pcie_replay_errors_total",
        "grpo_gpu_energy_joules_total", "grpo_gpu_nvlink_errors_total", "grpo_gpu_xid_errors_total"}
    assert of_gpu(s, U0) == {f.name for f in GPU_FAMILIES} - {"grpo_gpu_nvlink_errors_total"}
    assert value(s, "grpo_gpu_temperature_celsius", **G1) == 41  # nvmlDeviceGetTemperature instead
    assert value(s, "grpo_gpu_power_watts", **G0) == 612.345
    assert value(s, "grpo_gpu_collector_up") == 1
    assert value(s, "grpo_gpu_collector_failures_total") == 0

    # A GPU without nvmlDeviceGetTemperatureV is asked it once, then the deprecated call only.
    fake = FakeNVML(devices)
    collector = GPUCollector(nvml=fake)
    for _ in range(3):
        collector.collect_once()
    assert (fake.calls["nvmlDeviceGetTemperatureV"], fake.calls["nvmlDeviceGetTemperature"]) == (3 + 1, 3)


def test_older_bindings_without_the_newer_functions() -> None:
    fake = FakeNVML(two_gpus(), missing={
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperatureV", "nvmlEventSetWait_v2",
        "nvmlDeviceGetIndex", "nvmlDeviceGetTotalEnergyConsumption"})
    fake.xid(1, 79)
    collector = GPUCollector(nvml=fake)
    collector.collect_once()
    s = samples_of(collector)
    assert value(s, "grpo_gpu_clock_event_reasons", **G1, reason="gpu_idle") == 1
    assert value(s, "grpo_gpu_temperature_celsius", **G0) == 64
    assert value(s, "grpo_gpu_xid_errors_total", **G1, xid="79") == 1  # found by its handle
    assert "grpo_gpu_energy_joules_total" not in gpu_series(s)
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2
    assert fake.calls["nvmlEventSetWait"] == 2  # the event, then the timeout


def test_gpu_that_disappears_is_dropped_and_counted(start_exporter: Callable[..., Running]) -> None:
    fake = FakeNVML(two_gpus())
    run = start_gpu(start_exporter, fake)
    gpu = run.exporter.gpu
    assert gpu is not None
    all_families = {f.name for f in GPU_FAMILIES} - {"grpo_gpu_xid_errors_total"}
    assert of_gpu(run.scrape(), U1) == all_families - {"grpo_gpu_nvlink_errors_total"}

    fake.devices[1].lost = True  # fell off the bus: every call on it, its handle too, says so
    s = scrape_until(run, lambda s: not of_gpu(s, U1))
    assert of_gpu(s, U0) == all_families
    assert value(s, "grpo_gpu_collector_up") == 1
    failures = value(s, "grpo_gpu_collector_failures_total") or 0.0
    assert failures >= 1
    run.wait_value("grpo_gpu_collector_failures_total", lambda v: v > failures)  # once per collection

    # Lost in the middle of a collection (its handle still answers): nothing half-read of it.
    fake.devices[1].errors = {"nvmlDeviceGetTotalEnergyConsumption": nv.NVML_ERROR_GPU_IS_LOST}
    fake.devices[1].lost = False
    done = gpu.collections
    wait_for(lambda: gpu.collections >= done + 2)
    s = run.scrape()
    assert not of_gpu(s, U1) and of_gpu(s, U0) == all_families
    fake.devices[1].errors = {}
    run.wait_value("grpo_gpu_memory_total_bytes", 85_520_809_984, **G1)

    # Every GPU gone (the driver unloaded): up 0, nothing per GPU; NVML is started over later.
    for d in fake.devices:
        d.lost = True
    run.wait_value("grpo_gpu_collector_up", 0.0)
    assert not gpu_series(run.scrape())
    for d in fake.devices:
        d.lost = False
    run.wait_value("grpo_gpu_collector_up", 1.0)
    assert of_gpu(run.scrape(), U0) == all_families
    assert fake.calls["nvmlInit"] >= 2 and fake.initialized == 1


def write_snapshot(snapshot_dir: Path) -> None:
    path = snapshot_dir / "exp" / "rank-0.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"run": "exp", "rank": 0, "step": 7, "metrics": {"reward/mean": 0.4}}\n')


def test_nvml_library_missing_serves_everything_else(start_exporter: Callable[..., Running],
                                                       snapshot_dir: Path) -> None:
    write_snapshot(snapshot_dir)
    fake = FakeNVML(two_gpus(), init_error=nv.NVML_ERROR_LIBRARY_NOT_FOUND)
    run = start_exporter(gpu_nvml=fake, gpu_interval=0.05)
    wait_for(lambda: run.exporter.gpu.collections >= 2)  # type: ignore[union-attr]
    s = run.wait_value("grpo_step", 7.0, run="exp", rank="0") and run.scrape()
    assert value(s, "grpo_gpu_collector_up") == 0
    assert value(s, "grpo_gpu_collector_failures_total") == 0  # no library is no failure
    assert value(s, "grpo_gpu_collector_last_success_timestamp_seconds") == 0
    assert not gpu_series(s)
    assert value(s, "grpo_reward_mean", run="exp", rank="0") == 0.4
    assert value(s, "grpo_snapshots_ingested_total", shape="native") == 1


def test_real_pynvml_on_a_gpu_less_machine(exporter: Running, snapshot_dir: Path) -> None:
    import pynvml
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML: the test is for machines without a GPU")
    write_snapshot(snapshot_dir)
    assert exporter.exporter.gpu is not None  # the default config has the collector on
    wait_for(lambda: exporter.exporter.gpu.collections >= 1)  # type: ignore[union-attr]
    s = exporter.wait_value("grpo_step", 7.0, run="exp", rank="0") and exporter.scrape()
    assert value(s, "grpo_gpu_collector_up") == 0
    assert value(s, "grpo_gpu_collector_failures_total") == 0
    assert not gpu_series(s)
    body = requests.get(f"{exporter.url}/metrics", timeout=5).text
    assert "# HELP grpo_gpu_utilization_ratio" not in body  # no empty GPU families either


def test_init_is_retried_every_n_collections(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNVML(two_gpus(), init_error=nv.NVML_ERROR_DRIVER_NOT_LOADED)
    collector = GPUCollector(nvml=fake, init_retry_every=3)
    for _ in range(4):
        collector.collect_once()
    assert fake.calls["nvmlInit"] == 2 and not collector.up
    fake.init_error = None  # the driver comes up
    for _ in range(3):
        collector.collect_once()
    assert collector.up and fake.calls["nvmlInit"] == 3
    assert collector._snapshot.failures == 0

    # An NVML that is there but refuses is a failure; so is a machine with NVML and no GPU, not.
    denied = GPUCollector(nvml=FakeNVML([], init_error=nv.NVML_ERROR_NO_PERMISSION))
    denied.collect_once()
    assert denied._snapshot.failures == 1 and not denied.up
    empty = FakeNVML([])
    no_gpu = GPUCollector(nvml=empty)
    no_gpu.collect_once()
    assert no_gpu._snapshot.failures == 0 and not no_gpu.up and empty.initialized == 0

    # No pynvml installed at all.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    bare = GPUCollector()
    bare.collect_once()
    assert not bare.up and "grpo_gpu_collector_up 0.0" in render(bare)


def test_xid_events_are_drained_without_blocking() -> None:
    fake = FakeNVML(two_gpus())
    for index, xid in ((0, 13), (0, 13), (1, 79), (0, 63)):
        fake.xid(index, xid)
    collector = GPUCollector(nvml=fake)
    collector.collect_once()
    rows = dict(collector._snapshot.rows)["grpo_gpu_xid_errors_total"]
    assert rows == [((*G0.values(), "13"), 2.0), ((*G0.values(), "63"), 1.0), ((*G1.values(), "79"), 1.0)]
    assert not fake.events and set(fake.wait_timeouts) == {0}  # never waits
    assert fake.calls["nvmlEventSetWait_v2"] == 5  # four events, then the timeout ends the drain
    fake.xid(0, 13)
    collector.collect_once()
    collector.collect_once()
    rows = dict(collector._snapshot.rows)["grpo_gpu_xid_errors_total"]
    assert rows[0] == ((*G0.values(), "13"), 3.0)
    assert fake.calls["nvmlEventSetCreate"] == 1 and fake.calls["nvmlDeviceRegisterEvents"] == 2
    collector.stop()
    assert fake.calls["nvmlEventSetFree"] == 1 and fake.calls["nvmlShutdown"] == 1 and fake.initialized == 0


def test_no_collector_gpu_emits_no_gpu_family(start_exporter: Callable[..., Running],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNVML(two_gpus())
    run = start_exporter(gpu_collector=False, gpu_nvml=fake)
    assert run.exporter.gpu is None
    body = requests.get(f"{run.url}/metrics", timeout=5).text
    assert "grpo_exporter_ready" in body and "grpo_gpu_" not in body
    assert sum(fake.calls.values()) == 0

    parse = build_parser().parse_args
    config = _config(parse(["serve", "--snapshot.dir", "/s", "--no-collector.gpu",
                            "--collector.gpu.interval", "15s"]))
    assert (config.gpu_collector, config.gpu_interval) == (False, 15.0)
    config = _config(parse(["serve", "--snapshot.dir", "/s"]))
    assert (config.gpu_collector, config.gpu_interval) == (True, 5.0) == (
        ExporterConfig(Path("/s")).gpu_collector, ExporterConfig(Path("/s")).gpu_interval)
    monkeypatch.setenv("GRPO_MONITOR_COLLECTOR_GPU", "false")
    monkeypatch.setenv("GRPO_MONITOR_COLLECTOR_GPU_INTERVAL", "1m")
    parse = build_parser().parse_args  # the environment is read when the parser is built
    config = _config(parse(["serve", "--snapshot.dir", "/s"]))
    assert (config.gpu_collector, config.gpu_interval) == (False, 60.0)
    assert _config(parse(["serve", "--snapshot.dir", "/s", "--collector.gpu"])).gpu_collector is True


def test_scrapes_never_collect(start_exporter: Callable[..., Running]) -> None:
    fake = FakeNVML(two_gpus())
    run = start_gpu(start_exporter, fake, gpu_interval=3600)
    calls = sum(fake.calls.values())
    for _ in range(20):
        assert value(run.scrape(), "grpo_gpu_utilization_ratio", **G0) == 0.97
    assert sum(fake.calls.values()) == calls
    assert run.exporter.gpu.collections == 1  # type: ignore[union-attr]


def test_promtool_check_metrics_is_clean(start_exporter: Callable[..., Running], snapshot_dir: Path) -> None:
    promtool = shutil.which("promtool") or pytest.fail("promtool not on PATH (make system-deps)")
    write_snapshot(snapshot_dir)
    fake = FakeNVML(two_gpus())
    fake.xid(0, 79)
    run = start_gpu(start_exporter, fake)
    run.wait_value("grpo_gpu_xid_errors_total", 1.0, **G0, xid="79")
    run.wait_value("grpo_step", 7.0, run="exp", rank="0")
    body = requests.get(f"{run.url}/metrics", timeout=5).content
    assert set(gpu_series(run.scrape())) == {f.name for f in GPU_FAMILIES}
    lint = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30,
                          check=False)
    assert (lint.returncode, lint.stdout, lint.stderr) == (0, b"", b"")


def test_metrics_md_documents_every_gpu_family() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    for fam in (*GPU_FAMILIES, *HEALTH_FAMILIES):
        assert f"`{fam.name}`" in text, fam.name

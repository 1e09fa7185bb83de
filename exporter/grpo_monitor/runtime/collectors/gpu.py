"""GPU health from NVML, collected off the scrape path.

A background thread reads every GPU each ``interval`` seconds into an immutable snapshot; a scrape
only turns the newest snapshot into metric families (a prometheus-client custom collector).
``pynvml`` (the ``nvidia-ml-py`` distribution) is imported lazily, in that thread. Without it,
without the driver or without a GPU, the collector exports its health series alone, with
``grpo_gpu_collector_up 0``, and tries NVML again every ``init_retry_every`` collections.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger("grpo_monitor.gpu")

GPU_LABELS: tuple[str, ...] = ("gpu", "uuid", "model")


@dataclass(frozen=True)
class GPUFamily:
    name: str
    type: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...] = ()  # beyond GPU_LABELS on a per-GPU family
    unit: str = ""
    source: str = ""  # the NVML call(s) the value comes from
    per_gpu: bool = True

    def new(self) -> Metric:
        labels = (*GPU_LABELS, *self.labels) if self.per_gpu else self.labels
        if self.type == "counter":
            return CounterMetricFamily(self.name, self.help, labels=labels)
        return GaugeMetricFamily(self.name, self.help, labels=labels)


INFO = GPUFamily(
    "grpo_gpu_info", "gauge", "Constant 1 per GPU NVML reads, labelled with the driver version.",
    ("driver_version",), "", "nvmlDeviceGetUUID, nvmlDeviceGetName, nvmlSystemGetDriverVersion")
UTILIZATION = GPUFamily(
    "grpo_gpu_utilization_ratio", "gauge",
    "Fraction of the last sample period (1/6 s to 1 s) during which a kernel ran on the GPU.",
    (), "ratio", "nvmlDeviceGetUtilizationRates().gpu / 100")
MEMORY_USED = GPUFamily(
    "grpo_gpu_memory_used_bytes", "gauge", "GPU memory allocated.", (), "bytes",
    "nvmlDeviceGetMemoryInfo().used")
MEMORY_TOTAL = GPUFamily(
    "grpo_gpu_memory_total_bytes", "gauge", "GPU memory installed.", (), "bytes",
    "nvmlDeviceGetMemoryInfo().total")
TEMPERATURE = GPUFamily(
    "grpo_gpu_temperature_celsius", "gauge", "GPU die temperature.", (), "celsius",
    "nvmlDeviceGetTemperatureV(NVML_TEMPERATURE_GPU); nvmlDeviceGetTemperature where the driver "
    "or the bindings lack it")
POWER = GPUFamily(
    "grpo_gpu_power_watts", "gauge", "Power draw of the GPU board.", (), "watts",
    "nvmlDeviceGetPowerUsage (mW / 1000)")
ENERGY = GPUFamily(
    "grpo_gpu_energy_joules_total", "counter", "Energy the GPU consumed since the driver was loaded.",
    (), "joules", "nvmlDeviceGetTotalEnergyConsumption (mJ / 1000)")
SM_CLOCK = GPUFamily(
    "grpo_gpu_sm_clock_hertz", "gauge", "Current SM clock.", (), "hertz",
    "nvmlDeviceGetClockInfo(NVML_CLOCK_SM) (MHz x 1e6)")
CLOCK_REASONS = GPUFamily(
    "grpo_gpu_clock_event_reasons", "gauge",
    "1 while the reason holds the GPU clocks down (NVML clock event, formerly throttle, reasons), else 0.",
    ("reason",), "", "nvmlDeviceGetCurrentClocksEventReasons; nvmlDeviceGetCurrentClocksThrottleReasons "
    "on older bindings")
PCIE_REPLAY = GPUFamily(
    "grpo_gpu_pcie_replay_errors_total", "counter", "PCIe replays (link-level retransmissions).",
    (), "", "nvmlDeviceGetPcieReplayCounter")
NVLINK = GPUFamily(
    "grpo_gpu_nvlink_errors_total", "counter", "NVLink data-link errors of each active link, by type.",
    ("link", "type"), "", "nvmlDeviceGetNvLinkErrorCounter, for the links nvmlDeviceGetNvLinkState "
    "reports enabled")
ECC = GPUFamily(
    "grpo_gpu_ecc_errors_total", "counter",
    "Memory ECC errors since the driver was loaded (volatile counters), by type.",
    ("type",), "", "nvmlDeviceGetTotalEccErrors(NVML_VOLATILE_ECC)")
XID = GPUFamily(
    "grpo_gpu_xid_errors_total", "counter",
    "XID critical errors the driver reported since the exporter started, by XID code.",
    ("xid",), "", "nvmlEventSetWait_v2(set, 0) events of type nvmlEventTypeXidCriticalError")
GPU_FAMILIES: tuple[GPUFamily, ...] = (
    INFO, UTILIZATION, MEMORY_USED, MEMORY_TOTAL, TEMPERATURE, POWER, ENERGY, SM_CLOCK, CLOCK_REASONS,
    PCIE_REPLAY, NVLINK, ECC, XID)

UP = GPUFamily(
    "grpo_gpu_collector_up", "gauge",
    "1 when the last GPU collection reached NVML and read a GPU; 0 without pynvml, the NVML "
    "library, the driver or a GPU, or when NVML failed.", per_gpu=False)
LAST_SUCCESS = GPUFamily(
    "grpo_gpu_collector_last_success_timestamp_seconds", "gauge",
    "Unix time of the last GPU collection with grpo_gpu_collector_up 1 (0 before the first).",
    unit="seconds", per_gpu=False)
FAILURES = GPUFamily(
    "grpo_gpu_collector_failures_total", "counter",
    "NVML failures: failed initialisations (a missing library, driver or GPU is no failure), "
    "unexpected collection errors, and GPUs dropped from a collection (one per GPU and collection).",
    per_gpu=False)
DURATION = GPUFamily(
    "grpo_gpu_collector_duration_seconds", "gauge", "Duration of the last GPU collection.",
    unit="seconds", per_gpu=False)
HEALTH_FAMILIES: tuple[GPUFamily, ...] = (UP, LAST_SUCCESS, FAILURES, DURATION)

# nvmlClocksEventReason* bits (nvml.h; the same values as the older nvmlClocksThrottleReason*).
CLOCK_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1), ("applications_clocks_setting", 0x2), ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8), ("sync_boost", 0x10), ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40), ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100))
NVLINK_ERROR_TYPES: tuple[tuple[str, str], ...] = (
    ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT"), ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA"),
    ("replay", "NVML_NVLINK_ERROR_DL_REPLAY"), ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY"))
ECC_TYPES: tuple[tuple[str, str], ...] = (
    ("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"), ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"))
# Collections between two NVML start attempts while it is down (a minute at the default 5 s).
INIT_RETRY_EVERY = 12
# A bound on the events one collection drains, should a driver keep the set full.
MAX_EVENTS_PER_COLLECTION = 10_000

Rows = dict[str, list[tuple[tuple[str, ...], float]]]


@dataclass(frozen=True)
class _Snapshot:
    rows: Rows = field(default_factory=dict)
    up: bool = False
    last_success: float = 0.0
    failures: int = 0
    duration: float = 0.0
    collections: int = 0


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    model: str

    @property
    def labels(self) -> tuple[str, str, str]:
        return (str(self.index), self.uuid, self.model)


class _Lost(Exception):
    """The GPU answered with an error on its handle, or NVML says it fell off the bus."""


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _handle_key(handle: Any) -> object:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


# NVML return codes (nvml.h), matched on NVMLError.value: the subclass names pynvml derives from
# them (NVMLError_GpuIsLost, not ...GPUIsLost) are less stable than the codes.
_ERROR_CODES = {"NVML_ERROR_INVALID_ARGUMENT": 2, "NVML_ERROR_NOT_SUPPORTED": 3,
                "NVML_ERROR_DRIVER_NOT_LOADED": 9, "NVML_ERROR_TIMEOUT": 10,
                "NVML_ERROR_LIBRARY_NOT_FOUND": 12, "NVML_ERROR_GPU_IS_LOST": 15}


def _is(nvml: Any, exc: BaseException, *codes: str) -> bool:
    return getattr(exc, "value", None) in {getattr(nvml, c, _ERROR_CODES[c]) for c in codes}


class GPUCollector:
    """Per-GPU NVML series; a custom collector for a ``CollectorRegistry``.

    ``nvml`` is a ``pynvml``-shaped module (tests inject a fake); None imports ``pynvml``.
    """

    def __init__(self, interval: float = 5.0, *, nvml: Any = None, init_retry_every: int = INIT_RETRY_EVERY,
                 registry: CollectorRegistry | None = None) -> None:
        if interval <= 0:
            raise ValueError(f"GPU collection interval must be > 0, not {interval}")
        self.interval = interval
        self.init_retry_every = max(1, init_retry_every)
        self._module = nvml
        self._nvml: Any = None  # the module while NVML is initialised
        self._devices: list[_Device] = []
        self._driver = ""
        self._events: Any = None
        self._xids: dict[tuple[str, ...], int] = {}
        self._failures = 0
        self._last_success = 0.0
        self._skip_inits = 0
        self._problem: str | None = None  # the NVML state last logged, so each is logged once
        self._lost: set[str] = set()
        self._skipped: set[tuple[str, str]] = set()
        self._temperature_v: dict[str, bool] = {}
        self._snapshot = _Snapshot()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if registry is not None:
            registry.register(self)

    # -- the scrape side: read the snapshot, never NVML ------------------------------------------

    def describe(self) -> Iterator[Metric]:
        for fam in (*GPU_FAMILIES, *HEALTH_FAMILIES):
            yield fam.new()

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot
        for fam in GPU_FAMILIES:
            rows = snap.rows.get(fam.name)
            if rows:
                metric = fam.new()
                for labels, v in rows:
                    metric.add_metric(labels, v)  # type: ignore[attr-defined]
                yield metric
        for fam, v in ((UP, float(snap.up)), (LAST_SUCCESS, snap.last_success),
                       (FAILURES, float(snap.failures)), (DURATION, snap.duration)):
            metric = fam.new()
            metric.add_metric((), v)  # type: ignore[attr-defined]
            yield metric

    @property
    def collections(self) -> int:
        """Collections completed so far."""
        return self._snapshot.collections

    @property
    def up(self) -> bool:
        return self._snapshot.up

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> GPUCollector:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="grpo-gpu", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("GPU collection still running after %.0f s; NVML left initialised", timeout)
                return
        with self._lock:
            self._shutdown()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.collect_once()
            next_at = max(next_at + self.interval, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    # -- the collection --------------------------------------------------------------------------

    def collect_once(self) -> None:
        """One collection into a new snapshot (the background thread calls it every interval)."""
        with self._lock:
            start = time.perf_counter()
            try:
                rows = self._collect()
            except Exception:
                log.exception("GPU collection failed; NVML is initialised again on a later collection")
                self._failures += 1
                self._shutdown()
                self._skip_inits = self.init_retry_every - 1
                rows = None
            if rows is not None:
                self._last_success = time.time()
            self._snapshot = _Snapshot(
                rows or {}, rows is not None, self._last_success, self._failures,
                time.perf_counter() - start, self._snapshot.collections + 1)

    def _collect(self) -> Rows | None:
        if self._nvml is None:
            if self._skip_inits:
                self._skip_inits -= 1
                return None
            if not self._init():
                self._skip_inits = self.init_retry_every - 1
                return None
        self._drain_events()
        rows: Rows = {}
        read = 0
        for dev in self._devices:
            try:
                gpu_rows = self._read(dev)
            except _Lost as exc:
                self._failures += 1
                if dev.uuid not in self._lost:
                    log.warning("GPU %d (%s) is gone from NVML (%s); its series are dropped until it "
                                "answers again", dev.index, dev.uuid, exc)
                    self._lost.add(dev.uuid)
                continue
            if dev.uuid in self._lost:
                log.info("GPU %d (%s) answers NVML again", dev.index, dev.uuid)
                self._lost.discard(dev.uuid)
            read += 1
            for name, labels, v in gpu_rows:
                rows.setdefault(name, []).append((labels, v))
        if not read:
            # Every GPU is gone: the driver may have been unloaded. Start NVML over later.
            self._note("NVML reads no GPU any more", failure=False)
            self._shutdown()
            self._skip_inits = self.init_retry_every - 1
            return None
        if self._xids:
            rows[XID.name] = [(k, float(n)) for k, n in sorted(
                self._xids.items(), key=lambda kv: (kv[0][0].isdigit(), kv[0][0].zfill(8), int(kv[0][3])))]
        self._problem = None
        return rows

    def _note(self, message: str, *, failure: bool) -> None:
        """NVML is unusable: count it if it is a failure, log each new state once."""
        if failure:
            self._failures += 1
        if message != self._problem:
            (log.warning if failure else log.info)(
                "%s; GPU metrics are off (grpo_gpu_collector_up 0), NVML is tried again every %d "
                "collections", message, self.init_retry_every)
            self._problem = message

    def _init(self) -> bool:
        nvml = self._module
        if nvml is None:
            try:
                import pynvml as nvml  # type: ignore[import-not-found,no-redef]
            except ImportError as exc:
                self._note(f"pynvml is not importable ({exc}; pip install nvidia-ml-py)", failure=False)
                return False
            self._module = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            absent = _is(nvml, exc, "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")
            self._note(f"NVML did not initialise: {exc}", failure=not absent)
            return False
        self._nvml = nvml
        try:
            self._driver = _text(nvml.nvmlSystemGetDriverVersion())
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            self._shutdown()
            self._note(f"NVML initialised but failed: {exc}", failure=True)
            return False
        devices = []
        for i in range(count):
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                devices.append(_Device(i, h, _text(nvml.nvmlDeviceGetUUID(h)), _text(nvml.nvmlDeviceGetName(h))))
            except nvml.NVMLError as exc:
                self._failures += 1
                log.warning("GPU %d is not usable (%s); left out until NVML is initialised again", i, exc)
        if not devices:
            self._shutdown()
            self._note(f"NVML finds no usable GPU ({count} present)", failure=False)
            return False
        self._devices = devices
        self._lost.clear()
        self._init_events()
        log.info("NVML: %d GPU(s), driver %s", len(devices), self._driver)
        return True

    def _init_events(self) -> None:
        nvml = self._nvml
        if not hasattr(nvml, "nvmlEventSetCreate") or not hasattr(nvml, "nvmlDeviceRegisterEvents"):
            return
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.info("NVML events are unavailable (%s); no XID errors are counted", exc)
            return
        registered = 0
        for dev in self._devices:
            try:
                nvml.nvmlDeviceRegisterEvents(dev.handle, nvml.nvmlEventTypeXidCriticalError, events)
                registered += 1
            except nvml.NVMLError as exc:
                log.info("GPU %d: XID events are unavailable (%s)", dev.index, exc)
        if registered:
            self._events = events
        else:
            self._quiet(nvml.nvmlEventSetFree, events)

    def _drain_events(self) -> None:
        """Count the XID events queued since the last collection; never waits."""
        nvml = self._nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or getattr(nvml, "nvmlEventSetWait", None)
        if self._events is None or wait is None:
            return
        xid_type = nvml.nvmlEventTypeXidCriticalError
        for _ in range(MAX_EVENTS_PER_COLLECTION):
            try:
                event = wait(self._events, 0)
            except nvml.NVMLError as exc:
                if not _is(nvml, exc, "NVML_ERROR_TIMEOUT"):
                    log.debug("reading NVML events: %s", exc)
                return
            if not getattr(event, "eventType", xid_type) & xid_type:
                continue
            dev = self._device_of(event.device)
            xid = str(int(event.eventData))
            if dev is None:
                log.warning("XID %s from a GPU NVML does not identify", xid)
            key = (*(dev.labels if dev else ("unknown", "", "")), xid)
            self._xids[key] = self._xids.get(key, 0) + 1

    def _device_of(self, handle: Any) -> _Device | None:
        try:
            index = self._nvml.nvmlDeviceGetIndex(handle)
            for dev in self._devices:
                if dev.index == index:
                    return dev
        except (self._nvml.NVMLError, AttributeError, TypeError):
            pass
        key = _handle_key(handle)
        return next((d for d in self._devices if _handle_key(d.handle) == key), None)

    def _shutdown(self) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is None:
            return
        if self._events is not None:
            self._quiet(nvml.nvmlEventSetFree, self._events)
            self._events = None
        self._devices = []
        self._quiet(nvml.nvmlShutdown)

    @staticmethod
    def _quiet(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 (tearing down: nothing left to do about it)
            log.debug("%s: %s", getattr(fn, "__name__", fn), exc)

    # -- one GPU ---------------------------------------------------------------------------------

    def _read(self, dev: _Device) -> list[tuple[str, tuple[str, ...], float]]:
        """Every field of one GPU; a field it does not answer is left out alone."""
        nvml = self._nvml
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(dev.index)
        except nvml.NVMLError as exc:
            raise _Lost(exc) from exc
        base = dev.labels
        out: list[tuple[str, tuple[str, ...], float]] = [(INFO.name, (*base, self._driver), 1.0)]

        def put(fam: GPUFamily, v: float | None, *extra: str) -> None:
            if v is not None:
                out.append((fam.name, (*base, *extra), float(v)))

        util = self._call(dev, "nvmlDeviceGetUtilizationRates", h)
        put(UTILIZATION, None if util is None else util.gpu / 100)
        mem = self._call(dev, "nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            put(MEMORY_USED, mem.used)
            put(MEMORY_TOTAL, mem.total)
        put(TEMPERATURE, self._temperature(dev, h))
        power = self._call(dev, "nvmlDeviceGetPowerUsage", h)
        put(POWER, None if power is None else power / 1000)
        energy = self._call(dev, "nvmlDeviceGetTotalEnergyConsumption", h)
        put(ENERGY, None if energy is None else energy / 1000)
        clock = self._call(dev, "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM)
        put(SM_CLOCK, None if clock is None else clock * 1e6)
        reasons = self._call(dev, "nvmlDeviceGetCurrentClocksEventReasons", h, fallback=(
            "nvmlDeviceGetCurrentClocksThrottleReasons",))
        if reasons is not None:
            for reason, bit in CLOCK_EVENT_REASONS:
                put(CLOCK_REASONS, 1.0 if reasons & bit else 0.0, reason)
        put(PCIE_REPLAY, self._call(dev, "nvmlDeviceGetPcieReplayCounter", h))
        for link in self._active_links(dev, h):
            for kind, const in NVLINK_ERROR_TYPES:
                put(NVLINK, self._call(dev, "nvmlDeviceGetNvLinkErrorCounter", h, link, getattr(nvml, const)),
                    str(link), kind)
        for kind, const in ECC_TYPES:
            put(ECC, self._call(dev, "nvmlDeviceGetTotalEccErrors", h, getattr(nvml, const),
                                nvml.NVML_VOLATILE_ECC), kind)
        return out

    def _call(self, dev: _Device, name: str, *args: Any, fallback: tuple[str, ...] = ()) -> Any:
        """``name(*args)``, else each fallback in turn; None when none answers (logged once)."""
        nvml = self._nvml
        problem = "not in these pynvml bindings"
        for fn_name in (name, *fallback):
            fn = getattr(nvml, fn_name, None)
            if fn is None:
                continue
            try:
                return fn(*args)
            except nvml.NVMLError as exc:
                if _is(nvml, exc, "NVML_ERROR_GPU_IS_LOST"):
                    raise _Lost(exc) from exc
                problem = f"{type(exc).__name__}: {exc}"
        if (dev.uuid, name) not in self._skipped:
            self._skipped.add((dev.uuid, name))
            log.info("GPU %d (%s): %s unavailable (%s); that value is left out", dev.index, dev.uuid,
                     name, problem)
        return None

    def _temperature(self, dev: _Device, h: Any) -> float | None:
        nvml = self._nvml
        sensor = nvml.NVML_TEMPERATURE_GPU
        if self._temperature_v.get(dev.uuid, True) and hasattr(nvml, "nvmlDeviceGetTemperatureV"):
            try:
                t = nvml.nvmlDeviceGetTemperatureV(h, sensor)
                return float(getattr(t, "temperature", t))
            except nvml.NVMLError as exc:
                if _is(nvml, exc, "NVML_ERROR_GPU_IS_LOST"):
                    raise _Lost(exc) from exc
                # An older driver (FunctionNotFound) or a board without it: the deprecated call.
                self._temperature_v[dev.uuid] = False
        return self._call(dev, "nvmlDeviceGetTemperature", h, sensor)

    def _active_links(self, dev: _Device, h: Any) -> list[int]:
        nvml = self._nvml
        state = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
        if state is None:
            return []
        links = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                if state(h, link) == nvml.NVML_FEATURE_ENABLED:
                    links.append(link)
            except nvml.NVMLError as exc:
                if _is(nvml, exc, "NVML_ERROR_GPU_IS_LOST"):
                    raise _Lost(exc) from exc
                if _is(nvml, exc, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT"):
                    break  # no NVLink on this board (link 0), or past its last link
                if (dev.uuid, f"nvlink{link}") not in self._skipped:
                    self._skipped.add((dev.uuid, f"nvlink{link}"))
                    log.info("GPU %d (%s): NVLink %d state unavailable (%s)", dev.index, dev.uuid, link, exc)
        return links

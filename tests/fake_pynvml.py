"""A thin stand-in for the ``pynvml`` module (nvidia-ml-py) on machines without a GPU.

``FakeNVML`` has the module's function names, the constants the GPU collector uses, and NVMLError
with one subclass per NVML_ERROR_* made the way pynvml makes them (``NVMLError(code)`` returns the
subclass). Each ``FakeDevice`` holds what NVML answers for one GPU; the defaults are an H100 SXM
under training load. ``errors`` maps a call's name to the NVML_ERROR_* it raises on that GPU
(NotSupported, NoPermission, ...), ``lost`` makes every call on it raise GpuIsLost, and ``missing``
removes functions from the module as older bindings lack them.
"""

from __future__ import annotations

import string
import sys
from collections import Counter, deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_VOLATILE_ECC = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
nvmlEventTypeXidCriticalError = 0x8
nvmlTemperature_v1 = 0x100000C
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSwThermalSlowdown = 0x20


class NVMLError(Exception):
    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return f"NVML error {self.value}"

    def __eq__(self, other: object) -> bool:
        return self.value == other.value  # type: ignore[attr-defined]


def _extractNVMLErrorsAsClasses() -> None:
    this_module = sys.modules[__name__]
    for err_name in [x for x in dir(this_module) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        err_val = getattr(this_module, err_name)

        def gen_new(val):  # type: ignore[no-untyped-def]
            def new(typ, *args):  # type: ignore[no-untyped-def]
                return NVMLError.__new__(typ, val)
            return new
        new_error_class = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        new_error_class.__module__ = __name__
        setattr(this_module, class_name, new_error_class)
        NVMLError._valClassMapping[err_val] = new_error_class


_extractNVMLErrorsAsClasses()


@dataclass
class FakeDevice:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    utilization: int = 97  # percent, as nvmlDeviceGetUtilizationRates().gpu
    memory_used: int = 71_437_467_648
    memory_total: int = 85_520_809_984  # 81559 MiB
    temperature: int = 64
    power_mw: int = 612_345
    energy_mj: int = 9_876_543_210
    sm_clock_mhz: int = 1980
    clock_reasons: int = nvmlClocksEventReasonSwPowerCap
    pcie_replays: int = 0
    nvlink_links: int = 0  # links the board has; 0: no NVLink (NotSupported)
    nvlink: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # active link ->
    # counters indexed by NVML_NVLINK_ERROR_DL_* (replay, recovery, crc_flit, crc_data)
    ecc: tuple[int, int] = (0, 0)  # corrected, uncorrected
    errors: dict[str, int] = field(default_factory=dict)  # call name -> NVML_ERROR_*
    lost: bool = False


class FakeNVML:
    """``GPUCollector(nvml=FakeNVML([...]))``; ``calls`` counts every NVML call made."""

    def __init__(self, devices: list[FakeDevice], *, driver: str = "550.90.07",
                 init_error: int | None = None, missing: set[str] | None = None) -> None:
        self.devices = devices
        self.driver = driver
        self.init_error = init_error
        self.missing = set(missing or ())
        self.calls: Counter[str] = Counter()
        self.initialized = 0
        self.registered: set[int] = set()
        self.events: deque[SimpleNamespace] = deque()
        self.wait_timeouts: list[int] = []

    def __getattribute__(self, name: str) -> Any:
        if name in object.__getattribute__(self, "__dict__").get("missing", ()):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def xid(self, index: int, xid: int) -> None:
        """Queue an XID critical error event from GPU ``index``."""
        self.events.append(SimpleNamespace(device=self.devices[index], eventType=nvmlEventTypeXidCriticalError,
                                           eventData=xid, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF))

    def _enter(self, fn: str, handle: FakeDevice | None = None) -> FakeDevice:
        self.calls[fn] += 1
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None  # type: ignore[return-value]
        if handle.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in handle.errors:
            raise NVMLError(handle.errors[fn])
        return handle

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        if not 0 <= index < len(self.devices):
            self._enter("nvmlDeviceGetHandleByIndex")
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._enter("nvmlDeviceGetHandleByIndex", self.devices[index])

    def nvmlDeviceGetIndex(self, handle: FakeDevice) -> int:
        return self.devices.index(self._enter("nvmlDeviceGetIndex", handle))

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str:
        return self._enter("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: FakeDevice) -> str:
        return self._enter("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDevice) -> SimpleNamespace:
        d = self._enter("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=d.utilization, memory=d.utilization // 2)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice, version: int | None = None) -> SimpleNamespace:
        d = self._enter("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(total=d.memory_total, free=d.memory_total - d.memory_used, used=d.memory_used)

    def nvmlDeviceGetTemperatureV(self, handle: FakeDevice, sensor: int, version: int = nvmlTemperature_v1) -> int:
        return self._enter("nvmlDeviceGetTemperatureV", handle).temperature

    def nvmlDeviceGetTemperature(self, handle: FakeDevice, sensor: int) -> int:
        return self._enter("nvmlDeviceGetTemperature", handle).temperature

    def nvmlDeviceGetPowerUsage(self, handle: FakeDevice) -> int:
        return self._enter("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeDevice) -> int:
        return self._enter("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetClockInfo(self, handle: FakeDevice, type: int) -> int:
        d = self._enter("nvmlDeviceGetClockInfo", handle)
        if type != NVML_CLOCK_SM:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return d.sm_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeDevice) -> int:
        return self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeDevice) -> int:
        return self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_reasons

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeDevice) -> int:
        return self._enter("nvmlDeviceGetPcieReplayCounter", handle).pcie_replays

    def nvmlDeviceGetNvLinkState(self, device: FakeDevice, link: int) -> int:
        d = self._enter("nvmlDeviceGetNvLinkState", device)
        if not d.nvlink_links:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= d.nvlink_links:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return NVML_FEATURE_ENABLED if link in d.nvlink else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, device: FakeDevice, link: int, counter: int) -> int:
        d = self._enter("nvmlDeviceGetNvLinkErrorCounter", device)
        if link not in d.nvlink:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return d.nvlink[link][counter]

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeDevice, errorType: int, counterType: int) -> int:
        d = self._enter("nvmlDeviceGetTotalEccErrors", handle)
        assert counterType == NVML_VOLATILE_ECC
        return d.ecc[errorType]

    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, handle: FakeDevice, eventTypes: int, eventSet: object) -> None:
        d = self._enter("nvmlDeviceRegisterEvents", handle)
        if eventTypes & nvmlEventTypeXidCriticalError:
            self.registered.add(id(d))

    def nvmlEventSetWait_v2(self, eventSet: object, timeoutms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait_v2")
        return self._next_event(timeoutms)

    def nvmlEventSetWait(self, eventSet: object, timeoutms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait")
        return self._next_event(timeoutms)

    def _next_event(self, timeoutms: int) -> SimpleNamespace:
        self.wait_timeouts.append(timeoutms)
        while self.events:  # only the devices registered on the set deliver
            event = self.events.popleft()
            if id(event.device) in self.registered:
                return event
        raise NVMLError(NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, eventSet: object) -> None:
        self._enter("nvmlEventSetFree")


# The constants and error classes, as attributes of the module stand-in.
for _name, _value in list(globals().items()):
    if _name.startswith(("NVML", "nvml")) and not callable(getattr(FakeNVML, _name, None)):
        setattr(FakeNVML, _name, _value)

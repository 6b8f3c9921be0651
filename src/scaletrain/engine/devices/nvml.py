"""The thin boundary around NVML (pynvml from nvidia-ml-py).

Every field is read on its own and may fail on its own (None = N/A), as nvitop does: an old driver, a MIG
slice, or a permission problem costs one field, never the whole panel. No driver / no GPU is a normal
answer (`DetectionResult.gpus == ()` with the reason), not an exception.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable


@dataclass(frozen=True)
class DetectedGpu:
    index: int
    name: str | None
    memory_total_bytes: int | None
    uuid: str | None = None
    pci_bus_id: str | None = None
    nvlink_active_links: int | None = None   # None = unreadable; 0 = PCIe only
    mig_enabled: bool | None = None

    @property
    def interconnect(self) -> str:
        if self.nvlink_active_links is None:
            return "N/A"
        return f"NVLink ×{self.nvlink_active_links}" if self.nvlink_active_links else "PCIe"


@dataclass(frozen=True)
class DetectionResult:
    gpus: tuple[DetectedGpu, ...]
    driver_version: str | None
    cuda_driver_version: str | None
    error: str | None = None       # why nothing was found ("NVML library not found", ...)

    def to_json(self) -> dict[str, Any]:
        return {
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "error": self.error,
            "gpus": [
                {
                    "index": g.index, "name": g.name, "memory_total_bytes": g.memory_total_bytes, "uuid": g.uuid,
                    "pci_bus_id": g.pci_bus_id, "nvlink_active_links": g.nvlink_active_links,
                    "interconnect": g.interconnect, "mig_enabled": g.mig_enabled,
                }
                for g in self.gpus
            ],
        }


def _field(fn: Callable[[], Any]) -> Any:
    """Read one NVML field; any failure is N/A for that field only."""
    try:
        v = fn()
    except Exception:
        return None
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    return v


def load_nvml() -> Any:
    """pynvml, initialised (ModuleNotFoundError without nvidia-ml-py; NVML's own errors without a driver)."""
    import pynvml  # nvidia-ml-py; imported lazily so planning never pays for it

    pynvml.nvmlInit()
    return pynvml


def detect(loader: Callable[[], Any] = load_nvml) -> DetectionResult:
    """Detect local GPUs. `loader` returns an initialised pynvml-like module (tests inject a replay)."""
    try:
        nv = loader()
    except ModuleNotFoundError:
        return DetectionResult((), None, None, "nvidia-ml-py is not installed")
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return DetectionResult((), None, None, f"NVML unavailable: {e.__class__.__name__}: {e}".strip(": "))
    try:
        count = _field(nv.nvmlDeviceGetCount) or 0
        driver = _field(nv.nvmlSystemGetDriverVersion)
        cuda = _field(nv.nvmlSystemGetCudaDriverVersion_v2)
        if isinstance(cuda, int):
            cuda = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        gpus = []
        for i in range(count):
            h = _field(lambda i=i: nv.nvmlDeviceGetHandleByIndex(i))
            if h is None:
                gpus.append(DetectedGpu(i, None, None))
                continue
            mem = _field(lambda: nv.nvmlDeviceGetMemoryInfo(h))
            gpus.append(DetectedGpu(
                index=i,
                name=_field(lambda: nv.nvmlDeviceGetName(h)),
                memory_total_bytes=int(mem.total) if mem is not None else None,
                uuid=_field(lambda: nv.nvmlDeviceGetUUID(h)),
                pci_bus_id=_field(lambda: nv.nvmlDeviceGetPciInfo(h).busId),
                nvlink_active_links=_nvlink_links(nv, h),
                mig_enabled=_mig(nv, h),
            ))
        return DetectionResult(tuple(gpus), driver, cuda, None if gpus else "no NVIDIA GPU found")
    finally:
        _field(nv.nvmlShutdown)


def _nvlink_links(nv: Any, h: Any) -> int | None:
    links = 0
    readable = False
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        state = _field(lambda link=link: nv.nvmlDeviceGetNvLinkState(h, link))
        if state is None:
            continue
        readable = True
        links += int(bool(state))
    return links if readable else (0 if _field(lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h)) else None)


def _mig(nv: Any, h: Any) -> bool | None:
    mode = _field(lambda: nv.nvmlDeviceGetMigMode(h))
    if mode is None:
        return None
    return bool(mode[0] if isinstance(mode, (tuple, list)) else mode)


@dataclass(frozen=True)
class GpuSample:
    """One NVML reading of one GPU; None = N/A for that field. `error` set = the GPU was lost."""

    index: int
    time_s: float
    utilization_pct: int | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    pids: tuple[int, ...] = field(default_factory=tuple)
    error: str | None = None
    pid_memory_bytes: tuple[int | None, ...] = ()   # beside pids: each process's GPU memory (None = N/A)


def _proc_memory(p: Any) -> int | None:
    """A process's usedGpuMemory; NVML reports N/A (None, or its NVML_VALUE_NOT_AVAILABLE all-ones) in containers
    without the PID namespace and under WDDM."""
    v = getattr(p, "usedGpuMemory", None)
    return int(v) if isinstance(v, int) and 0 <= v < (1 << 63) else None


def sample(nv: Any, count: int, now: Callable[[], float] = time.time) -> list[GpuSample]:
    """Sample `count` GPUs through an initialised pynvml-like module (the monitor's worker calls this)."""
    out = []
    t = now()
    for i in range(count):
        h = _field(lambda i=i: nv.nvmlDeviceGetHandleByIndex(i))
        if h is None:
            out.append(GpuSample(i, t, error="GPU lost or unreadable"))
            continue
        util = _field(lambda: nv.nvmlDeviceGetUtilizationRates(h))
        mem = _field(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        power = _field(lambda: nv.nvmlDeviceGetPowerUsage(h))
        limit = _field(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
        procs = _field(lambda: nv.nvmlDeviceGetComputeRunningProcesses(h)) or []
        out.append(GpuSample(
            index=i, time_s=t,
            utilization_pct=int(util.gpu) if util is not None else None,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            temperature_c=_field(lambda: nv.nvmlDeviceGetTemperature(h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))),
            power_w=power / 1000.0 if power is not None else None,
            power_limit_w=limit / 1000.0 if limit is not None else None,
            pids=tuple(int(p.pid) for p in procs),
            pid_memory_bytes=tuple(_proc_memory(p) for p in procs),
        ))
    return out


def device_handle(nv: Any, index: int) -> Any:
    """The NVML handle of GPU `index` (NVML's numbering: the machine's, not CUDA_VISIBLE_DEVICES')."""
    return nv.nvmlDeviceGetHandleByIndex(index)


def device_reading(nv: Any, h: Any) -> dict[str, Any]:
    """One GPU's fields as a rank reports them about itself (run/rank_telemetry.RankTelemetry's names); a field
    NVML refuses is left out (N/A)."""
    util = _field(lambda: nv.nvmlDeviceGetUtilizationRates(h))
    mem = _field(lambda: nv.nvmlDeviceGetMemoryInfo(h))
    power = _field(lambda: nv.nvmlDeviceGetPowerUsage(h))
    temp = _field(lambda: nv.nvmlDeviceGetTemperature(h, getattr(nv, "NVML_TEMPERATURE_GPU", 0)))
    reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    mask = _field(lambda: reasons(h)) if reasons is not None else None
    out = {"gpu_utilization_pct": float(util.gpu) if util is not None else None,
           "gpu_memory_used_bytes": int(mem.used) if mem is not None else None,
           "gpu_memory_total_bytes": int(mem.total) if mem is not None else None,
           "gpu_temperature_c": float(temp) if isinstance(temp, (int, float)) else None,
           "gpu_power_w": power / 1000.0 if isinstance(power, (int, float)) else None,
           "gpu_throttle_mask": int(mask) if isinstance(mask, int) else None}
    return {k: v for k, v in out.items() if v is not None}


def device_count(nv: Any) -> int:
    return int(_field(nv.nvmlDeviceGetCount) or 0)


def device_name(nv: Any, i: int) -> str | None:
    h = _field(lambda: nv.nvmlDeviceGetHandleByIndex(i))
    return _field(lambda: nv.nvmlDeviceGetName(h)) if h is not None else None


def shutdown(nv: Any) -> None:
    _field(nv.nvmlShutdown)


@dataclass(frozen=True)
class MigSample:
    """One MIG slice: NVML reports memory and processes; utilization is not supported on MIG."""

    parent_index: int
    mig_index: int
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    pids: tuple[int, ...] = ()
    error: str | None = None


def mig_samples(nv: Any, gpus: Iterable[GpuSample]) -> tuple[MigSample, ...]:
    """The MIG slices under each readable GPU in MIG mode (a GPU without MIG has none)."""
    out: list[MigSample] = []
    for g in gpus:
        if g.error:
            continue
        h = _field(lambda: nv.nvmlDeviceGetHandleByIndex(g.index))
        mode = _field(lambda: nv.nvmlDeviceGetMigMode(h)) if h is not None else None
        current = mode[0] if isinstance(mode, (tuple, list)) else mode
        if not current:
            continue
        slots = _field(lambda: nv.nvmlDeviceGetMaxMigDeviceCount(h)) or 0
        for k in range(int(slots)):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except Exception:
                continue  # an empty slot (nvitop stops at the first; slots can be sparse after reconfiguring)
            mem = _field(lambda: nv.nvmlDeviceGetMemoryInfo(mh))
            procs = _field(lambda: nv.nvmlDeviceGetComputeRunningProcesses(mh)) or []
            out.append(MigSample(g.index, k, int(mem.used) if mem is not None else None,
                                 int(mem.total) if mem is not None else None,
                                 tuple(int(p.pid) for p in procs)))
    return tuple(out)

"""Turn an NVML detection into planned Hardware (the catalog entry that matches the detected card)."""

from __future__ import annotations

import os
from dataclasses import replace

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog.hardware import GPU_CATALOG, Hardware, find_gpu, host_cores
from scaletrain.engine.devices.nvml import DetectionResult, detect


def hardware_from_detection(nodes: int | None = None, inter_node_gbps: float | None = None,
                            result: DetectionResult | None = None) -> Hardware:
    res = result if result is not None else detect()
    if not res.gpus:
        raise ScaletrainError(
            f"--gpus auto found no GPU ({res.error or 'none visible'}); name the hardware to plan for, "
            "e.g. --gpus 8xRTX4090 or --gpus 2x8xH100")
    names = {g.name for g in res.gpus if g.name}
    if not names:
        raise ScaletrainError("--gpus auto: NVML could not read the GPU names; pass --gpus explicitly")
    if len(names) > 1:
        raise ScaletrainError(f"--gpus auto found mixed GPUs ({', '.join(sorted(names))}); pass --gpus explicitly")
    name = names.pop()
    mem = res.gpus[0].memory_total_bytes
    try:
        spec = find_gpu(name)
    except ScaletrainError:
        size = f" ({mem / 1024**3:.1f} GiB)" if mem else ""
        raise ScaletrainError(
            f"detected {len(res.gpus)}× {name!r}{size}, which is not in the catalog (its compute and bandwidth are "
            f"not known); plan for the closest catalog card with --gpus {len(res.gpus)}xNAME, NAME one of "
            f"{', '.join(g.key for g in GPU_CATALOG)}") from None
    if mem:
        spec = replace(spec, memory_bytes=mem, name=name)
    hw = Hardware(gpu=spec, gpus_per_node=len(res.gpus), nodes=nodes or 1, source="detected",
                  driver=res.driver_version, host_cores=host_cores())
    if inter_node_gbps is not None:
        hw = replace(hw, inter_node_gbit_s=float(inter_node_gbps))
    return hw


def visible_gpu_count(result: DetectionResult | None = None) -> tuple[int, str | None]:
    """GPUs a process started here can use: NVML's count, narrowed by CUDA_VISIBLE_DEVICES when it is set; and
    NVML's error when it found none."""
    res = result if result is not None else detect()
    count = len(res.gpus)
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        listed = [x for x in cvd.split(",") if x.strip() and x.strip() != "-1"]
        count = min(count, len(listed))
    return count, (res.error if not res.gpus else None)


def require_local_gpus(device: str, gpus_per_node: int, what: str, result: DetectionResult | None = None) -> None:
    """Refuse to run a GPU plan on a machine without its GPUs (it would otherwise run silently on CPU, with every
    rank loading the model into host RAM). `what` names the run for the message."""
    if device != "cuda":
        return
    have, why = visible_gpu_count(result)
    if have < gpus_per_node:
        raise ScaletrainError(
            f"{what} needs {gpus_per_node} GPUs per node and this machine has {have} usable"
            f"{f' ({why})' if why else ''}; run it on the GPU machine, or plan for this one (e.g. --gpus 2xCPU)")


def host_memory_bytes(meminfo: str = "/proc/meminfo", field: str = "MemTotal") -> int | None:
    """This node's total RAM (Linux /proc/meminfo MemTotal; `field` another line of it, MemAvailable); None where it
    cannot be read. The plan's verdict weighs host needs (offloaded states, the end-of-run export) against it for
    plans on this machine."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None

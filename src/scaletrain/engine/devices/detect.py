"""Turn an NVML detection into planned Hardware (the catalog entry that matches the detected card)."""

from __future__ import annotations

from dataclasses import replace

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog.hardware import Hardware, find_gpu
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
    try:
        spec = find_gpu(name)
    except ScaletrainError:
        raise ScaletrainError(f"detected {name!r}, which is not in the catalog; pass --gpus with a catalog name") from None
    mem = res.gpus[0].memory_total_bytes
    if mem:
        spec = replace(spec, memory_bytes=mem, name=name)
    hw = Hardware(gpu=spec, gpus_per_node=len(res.gpus), nodes=nodes or 1, source="detected",
                  driver=res.driver_version)
    if inter_node_gbps is not None:
        hw = replace(hw, inter_node_gbit_s=float(inter_node_gbps))
    return hw

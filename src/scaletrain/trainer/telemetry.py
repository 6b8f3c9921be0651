"""This rank's telemetry (issue 23): its own GPU through NVML, its node, host and local rank, and the phases of its
last optimizer step timed on the host (engine/run/rank_telemetry.py says what each field means).

Nothing here synchronises the GPU: the phases are host clocks around what the loop already does. NVML is read at
most once per TELEMETRY_INTERVAL_S (its handle opened once; a field NVML refuses is N/A, a machine without NVML has
none). The numbers ride on the peaks' all_gather (distributed.peak_memory); the host names are gathered once.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from scaletrain.engine.run.rank_telemetry import TELEMETRY_INTERVAL_S, RankTelemetry


def _env_int(*names: str) -> int | None:
    for n in names:
        v = os.environ.get(n)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


class RankSampler:
    """One per rank: `phase(name)` marks where the loop is; `reading()` is the telemetry of the step just done."""

    def __init__(self, device_index: int | None, interval_s: float = TELEMETRY_INTERVAL_S):
        # torchrun (accelerate's launcher) exports the node's rank as GROUP_RANK; DeepSpeed's launcher as NODE_RANK
        self.node = _env_int("GROUP_RANK", "NODE_RANK")
        self.local_rank = _env_int("LOCAL_RANK")
        self.host = socket.gethostname()
        self.device_index = device_index
        self.interval_s = interval_s
        self._nv: Any = None
        self._handle: Any = None
        self._nvml_tried = False
        self._last_read = -1e18
        self._gpu: dict[str, Any] = {}
        self._phase: str | None = None
        self._since = time.perf_counter()
        self.seconds = {"data": 0.0, "compute": 0.0, "optimizer": 0.0}

    # ---- the step's phases -------------------------------------------------------------------------------------
    def phase(self, name: str) -> None:
        """The loop enters `name` (data, compute, optimizer); the time since the last mark goes to the phase left."""
        now = time.perf_counter()
        if self._phase in self.seconds:
            self.seconds[self._phase] += now - self._since
        self._phase, self._since = name, now

    def reading(self) -> RankTelemetry:
        """The step's phases (then reset) and the latest NVML reading of this rank's GPU."""
        self.phase("between")                    # metrics, checkpoints: no phase of the step
        self._phase = None
        secs, self.seconds = self.seconds, {"data": 0.0, "compute": 0.0, "optimizer": 0.0}
        gpu = self._gpu_fields()
        return RankTelemetry(node=self.node, local_rank=self.local_rank, host=self.host,
                             data_wait_seconds=secs["data"], compute_seconds=secs["compute"],
                             optimizer_seconds=secs["optimizer"], **gpu)

    # ---- NVML --------------------------------------------------------------------------------------------------
    def _gpu_fields(self) -> dict[str, Any]:
        if self.device_index is None:
            return {}
        now = time.monotonic()
        if now - self._last_read < self.interval_s:
            return self._gpu
        self._last_read = now
        if not self._nvml_tried:
            self._nvml_tried = True
            try:
                from scaletrain.engine.devices.nvml import device_handle, load_nvml

                self._nv = load_nvml()
                self._handle = device_handle(self._nv, self._physical_index())
            except Exception:                      # no driver, no nvidia-ml-py: every GPU field is N/A
                self._nv = None
        if self._nv is not None:
            from scaletrain.engine.devices.nvml import device_reading

            self._gpu = device_reading(self._nv, self._handle)
        return self._gpu

    def _physical_index(self) -> int:
        """NVML numbers every GPU on the machine; CUDA_VISIBLE_DEVICES may renumber what this process sees."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        ids = [x.strip() for x in visible.split(",") if x.strip()]
        idx = self.device_index or 0
        if ids and idx < len(ids) and ids[idx].isdigit():
            return int(ids[idx])
        return idx


_HOSTS: list[str] | None = None


def host_names(world: int) -> list[str | None]:
    """Every rank's host name, gathered once (a collective the first time: every rank calls it together)."""
    global _HOSTS
    if _HOSTS is None:
        me = socket.gethostname()
        hosts: list[Any] = [me]
        try:
            import torch.distributed as dist

            if world > 1 and dist.is_available() and dist.is_initialized():
                hosts = [None] * world
                dist.all_gather_object(hosts, me)
        except (RuntimeError, ValueError):
            hosts = [me] if world == 1 else [None] * world
        _HOSTS = [h if isinstance(h, str) else None for h in hosts]
    return list(_HOSTS)

"""One rank's view of its own device and step (issue 23), carried in metrics.jsonl beside that rank's peaks.

Every rank samples its own GPU through NVML (any field may be N/A), its node and host, and the phases of its last
step that can be timed on the host without synchronising the GPU: the wait for the next batch, the time from the
batch to the optimizer step (forward and backward as the host issues them), and the optimizer step. It rides on the
peaks' all_gather the trainer already makes once per optimizer step, as a fixed vector of numbers (VECTOR_FIELDS,
NaN = N/A), so there is no extra collective and its size is bounded: len(VECTOR_FIELDS) float64 per rank. NVML is
read at most once per TELEMETRY_INTERVAL_S on each rank; between readings the last one is sent again. Host names
are strings: they are gathered once, at start.

In metrics.jsonl a rank's record carries `"telemetry": {...}` with the known fields only (None left out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

# NVML at most this often on a rank (issue 23: "≤ 1 Hz"); the peaks are gathered every optimizer step regardless.
TELEMETRY_INTERVAL_S = 1.0

# NVML's clock-event (throttle) reason bits, nvml.h nvmlClocksEventReason*: the names the monitor shows.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x0000000000000002, "app clocks"), (0x0000000000000004, "power cap"), (0x0000000000000008, "HW slowdown"),
    (0x0000000000000020, "SW thermal"), (0x0000000000000040, "HW thermal"), (0x0000000000000080, "power brake"),
    (0x0000000000000100, "display clocks"),
)


def throttle_names(mask: int | None) -> tuple[str, ...] | None:
    """The reasons set in an NVML clock-event mask (None: N/A; idle and sync-boost bits are not throttling)."""
    if mask is None:
        return None
    return tuple(name for bit, name in THROTTLE_REASONS if mask & bit)


@dataclass(frozen=True)
class RankTelemetry:
    """What one rank measured about itself; None is N/A (no NVML on a CPU run, a field NVML refused)."""

    node: int | None = None                     # machine rank (accelerate's --machine_rank)
    local_rank: int | None = None
    host: str | None = None
    gpu_utilization_pct: float | None = None
    gpu_memory_used_bytes: int | None = None    # the whole device as NVML sees it (other processes included)
    gpu_memory_total_bytes: int | None = None
    gpu_temperature_c: float | None = None
    gpu_power_w: float | None = None
    gpu_throttle_mask: int | None = None        # NVML clock-event reasons (THROTTLE_REASONS)
    data_wait_seconds: float | None = None      # the step's waits for its batches
    compute_seconds: float | None = None        # from the first batch to the optimizer step (host-side)
    optimizer_seconds: float | None = None      # the optimizer step and zero_grad (host-side)

    @property
    def throttle_reasons(self) -> tuple[str, ...] | None:
        return throttle_names(self.gpu_throttle_mask)

    @property
    def step_seconds(self) -> float | None:
        parts = (self.data_wait_seconds, self.compute_seconds, self.optimizer_seconds)
        return None if any(p is None for p in parts) else sum(parts)   # type: ignore[arg-type]

    # ---- the gathered vector (float64, NaN = N/A) ----------------------------------------------------------
    def to_vector(self) -> list[float]:
        return [math.nan if getattr(self, k) is None else float(getattr(self, k)) for k in VECTOR_FIELDS]

    @classmethod
    def from_vector(cls, values: list[float], host: str | None = None) -> "RankTelemetry":
        out: dict[str, Any] = {"host": host}
        for k, v in zip(VECTOR_FIELDS, values):
            if v is None or not math.isfinite(v):
                continue
            out[k] = int(v) if k in _INT_FIELDS else float(v)
        return cls(**out)

    # ---- metrics.jsonl ----------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The known fields; seconds to the microsecond (a line per step stays short with 128 ranks)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = round(v, 6) if f.name.endswith("_seconds") else v
        return out

    @classmethod
    def from_json(cls, d: Any) -> "RankTelemetry | None":
        """A record's "telemetry" object; wrong-typed fields are N/A (a damaged line never breaks a viewer)."""
        if not isinstance(d, dict):
            return None
        out: dict[str, Any] = {}
        for f in fields(cls):
            v = d.get(f.name)
            if f.name == "host":
                out["host"] = v if isinstance(v, str) else None
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out[f.name] = int(v) if f.name in _INT_FIELDS else float(v)
        return cls(**out)


VECTOR_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RankTelemetry) if f.name != "host")
_INT_FIELDS = frozenset({"node", "local_rank", "gpu_memory_used_bytes", "gpu_memory_total_bytes",
                         "gpu_throttle_mask"})

"""MemoryBreakdown: what the memory model answers — per-GPU bytes by component at the predicted peak, and the fit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU bytes at the predicted peak moment. `total_bytes` = sum of the six components.

    `overhead_bytes` holds what is not a tensor of the model: the cuBLAS workspaces (allocated through torch's
    allocator, so inside torch.cuda.max_memory_allocated), the CUDA context and NCCL buffers, and the
    caching allocator's reserve above the allocated peak (both outside it).
    """

    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    logits_bytes: int
    overhead_bytes: int
    peak_phase: str                    # "forward" | "loss" | "backward" | "step"
    capacity_bytes: int
    headroom_fraction: float
    phase_peaks: dict[str, int] = field(default_factory=dict)   # allocated bytes at each phase's peak
    model_states_unsharded_bytes: int = 0                         # what one GPU would hold without sharding
    host_bytes_per_gpu: int = 0                                   # CPU RAM for offloaded states, per GPU
    workspace_bytes: int = 0                                      # the part of overhead inside the allocator
    objective: str = "sft"
    # the objective's own terms at the peak, each inside one component: (component, what it is, bytes)
    terms: tuple[tuple[str, str, int], ...] = ()
    outside_allocator_bytes: int = 0                              # a colocated vLLM engine (GRPO), in overhead

    @property
    def allocated_peak_bytes(self) -> int:
        """What torch.cuda.max_memory_allocated reports at the peak (the profiler's peak on CPU)."""
        return self.total_bytes - self.overhead_bytes + self.workspace_bytes

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.logits_bytes + self.overhead_bytes)

    @property
    def usable_bytes(self) -> int:
        return int(self.capacity_bytes * (1.0 - self.headroom_fraction))

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    @property
    def headroom_bytes(self) -> int:
        """Spare bytes below the card's capacity at the peak (negative: over capacity)."""
        return self.capacity_bytes - self.total_bytes

    def components(self) -> dict[str, int]:
        return {
            "weights": self.weights_bytes, "gradients": self.gradients_bytes, "optimizer": self.optimizer_bytes,
            "activations": self.activations_bytes, "logits": self.logits_bytes, "overhead": self.overhead_bytes,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "per_gpu_bytes": {**self.components(), "total": self.total_bytes},
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "peak_phase": self.peak_phase,
            "phase_peak_bytes": dict(self.phase_peaks),
            "capacity_bytes": self.capacity_bytes,
            "usable_bytes": self.usable_bytes,
            "headroom_fraction": self.headroom_fraction,
            "fits": self.fits,
            "headroom_bytes": self.headroom_bytes,
            "model_states_unsharded_bytes": self.model_states_unsharded_bytes,
            "host_bytes_per_gpu": self.host_bytes_per_gpu,
            "workspace_bytes": self.workspace_bytes,
            "objective": self.objective,
            "objective_terms": [{"component": c, "term": t, "bytes": b} for c, t, b in self.terms],
        }

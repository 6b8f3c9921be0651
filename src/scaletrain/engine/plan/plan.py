"""The Plan: one immutable object that flows wizard → estimator → writers → launcher → monitor.

`evaluate(setup)` runs the estimators once; every view (rich table, Textual screens, JSON, config writers)
reads the numbers from here and never recomputes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scaletrain.engine.model.memory import MemoryBreakdown, estimate_memory
from scaletrain.engine.model.setup import TrainingSetup

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Plan:
    setup: TrainingSetup
    memory: MemoryBreakdown
    time: Any = None                       # timing.TimeEstimate, when the time model ran
    explanation: str = ""
    notes: tuple[str, ...] = ()
    name: str = "plan"
    extras: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def to_json(self) -> dict[str, Any]:
        s = self.setup
        hw = s.hardware
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "model": {
                "name": s.model.name,
                "params": s.model.params,
                "trainable_params": s.trainable_params,
                "architecture": s.model.to_json(),
            },
            "hardware": {
                "gpu": hw.gpu.key,
                "gpu_name": hw.gpu.name,
                "gpu_memory_bytes": hw.gpu.memory_bytes,
                "gpus_per_node": hw.gpus_per_node,
                "nodes": hw.nodes,
                "world_size": hw.world_size,
                "interconnect": hw.gpu.interconnect,
                "inter_node_gbps": hw.inter_node_gbit_s,
                "source": hw.source,
            },
            "training": s.to_json(),
            "batch": {
                "micro_batch": s.micro_batch,
                "grad_accum": s.grad_accum,
                "world_size": s.world_size,
                "effective_batch": s.effective_batch,
                "seq_len": s.seq_len,
            },
            "memory": self.memory.to_json(),
            "explanation": self.explanation,
            "notes": list(self.notes),
        }
        if self.time is not None:
            out["time"] = self.time.to_json()
        out.update(self.extras)
        return out


def evaluate(setup: TrainingSetup, *, headroom_fraction: float = 0.10, name: str = "plan",
             explanation: str = "", notes: tuple[str, ...] = (), with_time: bool = True) -> Plan:
    """Run the memory (and, when available, time) model for one fully specified setup."""
    from scaletrain.engine.model.calibration import for_setup
    from scaletrain.engine.model.timing import estimate_time

    mem = estimate_memory(setup, headroom_fraction)
    time_est = estimate_time(setup) if with_time else None
    cal = for_setup(setup)
    if cal is not None:   # both estimators picked the profile up; the plan says so
        notes = (*notes, cal.describe())
    return Plan(setup=setup, memory=mem, time=time_est, explanation=explanation, notes=notes, name=name)

"""The Plan: one immutable object that flows wizard → estimator → writers → launcher → monitor.

`evaluate(setup)` runs the estimators once; every view (rich table, Textual screens, JSON, config writers)
reads the numbers from here and never recomputes them. What the planner adds to a plan — its report on the
search, the learning-rate suggestion, the ranked alternatives and the `--table` rows — are typed fields too,
written to JSON after the estimates in that order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from scaletrain.engine.estimate.calibration import for_setup
from scaletrain.engine.estimate.breakdown import MemoryBreakdown
from scaletrain.engine.estimate.memory import estimate_memory
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.estimate.timing import TimeEstimate, estimate_time
from scaletrain.engine.estimate.traced_blocks import names_without_gradient
from scaletrain.engine.plan.lr import LrSuggestion
from scaletrain.engine.plan.model_notes import model_notes, moe_facts
from scaletrain.engine.plan.rows import AlternativeRow, PlanTable
from scaletrain.engine.request.fields import PIN_FIELDS

SCHEMA_VERSION = 1
# What the planner minimises (said in every report).
OBJECTIVE = "predicted seconds per sample (per optimizer step at a fixed effective batch)"


@dataclass(frozen=True)
class PlannerReport:
    """How the planner chose: the target, what the user fixed, what it searched and how much of it fitted."""

    target_effective_batch: int | None
    fixed: Mapping[str, str | int | bool]         # the request's search fields the user set
    free: tuple[str, ...]                          # the search fields the planner chose
    evaluated: int                                 # memory-model probes
    fitting: int                                   # configurations with a fitting split
    micro_batch_rule: str | None = None            # without a target: how the micro batch was picked
    objective: str = OBJECTIVE

    def to_json(self) -> dict[str, Any]:
        return {"target_effective_batch": self.target_effective_batch, "fixed": dict(self.fixed),
                "free": list(self.free), "evaluated": self.evaluated, "fitting": self.fitting,
                "objective": self.objective, "micro_batch_rule": self.micro_batch_rule}


@dataclass(frozen=True)
class Plan:
    setup: TrainingSetup
    memory: MemoryBreakdown
    time: TimeEstimate | None = None               # None only for the planner's memory-only probes
    explanation: str = ""
    notes: tuple[str, ...] = ()
    name: str = "plan"
    planner: PlannerReport | None = field(default=None, compare=False)     # set when the planner searched
    lr: LrSuggestion | None = field(default=None, compare=False)           # --base-lr/--base-batch given
    alternatives: tuple[AlternativeRow, ...] | None = field(default=None, compare=False)   # --alternatives
    table: PlanTable | None = field(default=None, compare=False)           # --table batch|gpus

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def pins(self) -> dict[str, Any]:
        """The planner's choices behind this plan (PIN_FIELDS) as the PlanRequest fields that pin them: the one
        place a plan's choices turn back into a request (what-if keys, saved presets)."""
        return {name: (str(v) if name == "loss" else v) for name in PIN_FIELDS
                for v in (getattr(self.setup, name),)}

    def to_json(self) -> dict[str, Any]:
        s = self.setup
        hw = s.hardware
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "model": {
                "name": s.model.name,
                "params": s.model.params,
                "active_params": s.model.active_params,
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
                "host_cores": hw.host_cores,
                "cpu_threads_per_process": hw.cpu_threads_per_process,
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
        moe = moe_facts(s)
        if moe is not None:
            out["model"]["moe"] = moe
        unused = names_without_gradient(s)
        if unused:      # trainable, yet a step on text gives them no gradient: the trainer freezes them under DDP
            out["model"]["without_gradient"] = {"names": list(unused)}
        if self.time is not None:
            out["time"] = self.time.to_json()
        if self.planner is not None:
            out["planner"] = self.planner.to_json()
        if self.lr is not None:
            out["lr"] = self.lr.to_json()
        if self.alternatives is not None:
            out["alternatives"] = [a.to_json() for a in self.alternatives]
        if self.table is not None:
            out["table"] = self.table.to_json()
        return out


def evaluate(setup: TrainingSetup, *, headroom_fraction: float = 0.10, name: str = "plan",
             explanation: str = "", notes: tuple[str, ...] = (), with_time: bool = True) -> Plan:
    """Run the memory (and, when available, time) model for one fully specified setup."""
    mem = estimate_memory(setup, headroom_fraction)
    time_est = estimate_time(setup) if with_time else None
    notes = (*notes, *model_notes(setup))
    cal = for_setup(setup)
    if cal is not None:   # both estimators picked the profile up; the plan says so
        notes = (*notes, cal.describe())
    return Plan(setup=setup, memory=mem, time=time_est, explanation=explanation, notes=notes, name=name)

"""The rows the planner's tables hold (`plan --alternatives`, `--table batch`, `--table gpus`): typed, and written
to JSON with the keys and order `plan --json` has always printed. Plain data: the search fills them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scaletrain.engine.vocabulary import Offload, Strategy


@dataclass(frozen=True)
class Choice:
    """One evaluated configuration as the tables show it: the planner's split and its predicted numbers."""

    strategy: Strategy
    offload: Offload
    grad_ckpt: bool
    micro_batch: int
    grad_accum: int
    world_size: int
    effective_batch: int
    per_gpu_bytes: int
    usable_bytes: int
    fits: bool
    peak_phase: str
    step_seconds: float
    tokens_per_second: float
    epoch_seconds: float | None
    mfu: float
    description: str                  # "ZeRO-3, offload optimizer, micro 4 × accum 4, grad-ckpt"

    def to_json(self) -> dict[str, Any]:
        """The choice's numbers (the description is added by the row that shows it)."""
        return {
            "strategy": self.strategy.value, "offload": self.offload.value, "grad_ckpt": self.grad_ckpt,
            "micro_batch": self.micro_batch, "grad_accum": self.grad_accum, "world_size": self.world_size,
            "effective_batch": self.effective_batch, "per_gpu_bytes": self.per_gpu_bytes,
            "usable_bytes": self.usable_bytes, "fits": self.fits, "peak_phase": self.peak_phase,
            "step_seconds": self.step_seconds, "tokens_per_second": self.tokens_per_second,
            "epoch_seconds": self.epoch_seconds, "mfu": self.mfu,
        }

    def search_key(self) -> tuple[Strategy, Offload, bool, int, int]:
        """The planner's search fields (what a row fixes when picked)."""
        return (self.strategy, self.offload, self.grad_ckpt, self.micro_batch, self.grad_accum)


@dataclass(frozen=True)
class AlternativeRow(Choice):
    """One of the ranked fitting options at the plan's effective batch (rank 1 is the fastest)."""

    rank: int = 0
    chosen: bool = False              # the plan's own configuration

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "rank": self.rank, "chosen": self.chosen, "description": self.description}


@dataclass(frozen=True)
class BatchRow:
    """`--table batch`: one micro batch against per-GPU memory at the plan's strategy."""

    micro_batch: int
    grad_accum: int
    effective_batch: int
    keeps_effective_batch: bool
    per_gpu_bytes: int
    activations_bytes: int
    logits_bytes: int
    usable_bytes: int
    fits: bool
    headroom_bytes: int
    step_seconds: float
    tokens_per_second: float
    current: bool                     # the plan's own micro batch

    def to_json(self) -> dict[str, Any]:
        return {
            "micro_batch": self.micro_batch, "grad_accum": self.grad_accum, "effective_batch": self.effective_batch,
            "keeps_effective_batch": self.keeps_effective_batch, "per_gpu_bytes": self.per_gpu_bytes,
            "activations_bytes": self.activations_bytes, "logits_bytes": self.logits_bytes,
            "usable_bytes": self.usable_bytes, "fits": self.fits, "headroom_bytes": self.headroom_bytes,
            "step_seconds": self.step_seconds, "tokens_per_second": self.tokens_per_second, "current": self.current,
        }


@dataclass(frozen=True)
class GpuRow:
    """`--table gpus`: one catalog GPU × count; the planner's choice there, or why there is none."""

    gpu: str
    gpu_memory_bytes: int
    nodes: int
    gpus_per_node: int
    world_size: int
    choice: Choice | None = None      # None: nothing chosen (reason says why)
    reason: str | None = None
    searched: bool = False            # the search ran and nothing fitted (then needs_bytes is its leanest total)
    needs_bytes: int | None = None
    cost: Any = None                  # engine/plan/cost.RunCost of the choice (its GPUs over the plan's steps)

    @property
    def fits(self) -> bool:
        return self.choice is not None

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"gpu": self.gpu, "gpu_memory_bytes": self.gpu_memory_bytes, "nodes": self.nodes,
                               "gpus_per_node": self.gpus_per_node, "world_size": self.world_size, "fits": self.fits}
        if self.choice is not None:
            row.update(self.choice.to_json())
            row["fits"] = True
            row["description"] = self.choice.description
            if self.cost is not None:
                row["cost"] = self.cost.to_json()
            return row
        row["reason"] = self.reason
        if self.searched:
            row["per_gpu_bytes"] = self.needs_bytes
        return row


@dataclass(frozen=True)
class PlanTable:
    """What `--table KIND` adds to a plan."""

    kind: str                                     # "batch" | "gpus"
    rows: tuple[BatchRow, ...] | tuple[GpuRow, ...]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "rows": [r.to_json() for r in self.rows]}

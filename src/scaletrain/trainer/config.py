"""RunConfig: what the training loop needs, read once from the run directory's plan.json (engine.run.plan_document)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from scaletrain.engine.model.numerics import load_dtype
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.run.plan_document import read_plan_document
from scaletrain.engine.vocabulary import (Attention, MasterWeights, Method, Optimizer, OptimizerImpl, Precision,
                                          Strategy)


@dataclass(frozen=True)
class RunConfig:
    """Everything the loop needs, read once from plan.json."""

    run: RunDir
    train: TrainOptions
    model_id: str
    method: Method
    lora_rank: int
    lora_targets: tuple[str, ...]
    base_bits: int
    strategy: Strategy
    precision: Precision
    optimizer: Optimizer
    optimizer_impl: OptimizerImpl
    master_weights: MasterWeights
    attn: Attention
    grad_ckpt: bool
    micro_batch: int
    grad_accum: int
    seq_len: int
    epochs: float
    planned_world_size: int
    # the objective (issue 16): sft runs the bundled loop, reward/dpo/grpo run TRL (trainer/objectives/run.py)
    objective: str = "sft"
    prompt_len: int | None = None
    num_generations: int = 8
    ref_model: str = "none"
    experts_impl: str = "grouped_mm"  # MoE: transformers' experts_implementation the plan counted
    loop: str = "trainer"             # the loop the plan's numbers are for (the bundled trainer runs its own)
    loss: str = "standard"            # standard: B·S·V logits; chunked: lm_head + cross-entropy in token chunks
    offload: str = "none"             # none / optimizer / all (FSDP: "all" is fully_shard's CPUOffloadPolicy)

    @property
    def uses_deepspeed(self) -> bool:
        return self.strategy.uses_deepspeed

    @property
    def quantized_base(self) -> bool:
        return self.method == "qlora" or (self.method == "lora" and self.base_bits in (4, 8))

    @property
    def weights_dtype(self) -> str:
        """The torch dtype (name) the model's weights are built or loaded in: the memory model's rule
        (engine/model/numerics.load_dtype)."""
        return load_dtype(self.method, self.base_bits, self.master_weights, self.strategy, self.precision)


def read_run_config(run_dir: str | os.PathLike[str]) -> RunConfig:
    """The run's plan and train options, checked (one line naming the bad field, or the bad option)."""
    run = RunDir(run_dir)
    doc = read_plan_document(run.plan)
    req, tr, batch, train = doc.request, doc.training, doc.batch, doc.train
    train.check()
    doc.check_weights()                            # edited after writing: custom code is refused before any load
    if train.model_source is None:                 # a plan.json written before weights were resolved
        from dataclasses import replace

        from scaletrain.engine.request.weights import resolve_weights
        train = replace(train, model_source=resolve_weights(None, req.model))
    return RunConfig(
        run=run, train=train, model_id=req.model, method=tr.method, lora_rank=tr.lora_rank or 16,
        lora_targets=tr.lora_targets, base_bits=tr.base_bits, strategy=tr.strategy, precision=tr.precision,
        optimizer=tr.optimizer, optimizer_impl=tr.optimizer_impl, master_weights=tr.master_weights, attn=tr.attn,
        grad_ckpt=tr.grad_ckpt, experts_impl=str(tr.experts_impl), loop=str(tr.loop),
        loss=str(tr.loss), micro_batch=batch.micro_batch,
        grad_accum=batch.grad_accum, seq_len=batch.seq_len, epochs=float(req.epochs or 1.0),
        planned_world_size=batch.world_size, **_objective_fields(doc))


def _objective_fields(doc) -> dict:
    """The objective and its knobs as the plan resolved them (plan.json "training"); sft when absent."""
    rec = doc.recorded
    out = {"objective": rec("objective") or "sft", "prompt_len": rec("prompt_len"),
           "ref_model": rec("ref_model") or "none", "offload": str(rec("offload") or "none")}
    if rec("num_generations"):
        out["num_generations"] = int(rec("num_generations"))
    return out

"""RunConfig: what the training loop needs, read once from the run directory's plan.json (engine.run.plan_document)."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from scaletrain.engine.estimate.numerics import load_dtype
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.run.plan_document import TrainingSection, read_plan_document


@dataclass(frozen=True, kw_only=True)
class RunConfig(TrainingSection):
    """Everything the loop needs, read once from plan.json: its "training" section as it is (the choices, the
    method, strategy, LoRA and loss: engine/run/plan_document.py TrainingSection), and the rest of the run."""

    run: RunDir
    train: TrainOptions
    model_id: str
    micro_batch: int
    grad_accum: int
    seq_len: int
    epochs: float
    planned_world_size: int
    # the objective (issue 16): sft runs the bundled loop, reward/dpo/grpo run TRL (trainer/objective_run.py)
    objective: str = "sft"
    prompt_len: int | None = None
    num_generations: int = 8
    ref_model: str = "none"
    offload: str = "none"             # none / optimizer / all (FSDP: "all" is fully_shard's CPUOffloadPolicy)
    # trainable parameters a step on text gives no gradient, by name (plan.json "model"): frozen under DDP
    without_gradient: tuple[str, ...] = ()

    @property
    def uses_deepspeed(self) -> bool:
        return self.strategy.uses_deepspeed

    @property
    def quantized_base(self) -> bool:
        return self.method == "qlora" or (self.method == "lora" and self.base_bits in (4, 8))

    @property
    def weights_dtype(self) -> str:
        """The torch dtype (name) the model's weights are built or loaded in: the memory model's rule
        (engine/estimate/numerics.load_dtype)."""
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
    section = {f.name: getattr(tr, f.name) for f in fields(TrainingSection)}
    return RunConfig(
        **section, run=run, train=train, model_id=req.model, micro_batch=batch.micro_batch,
        grad_accum=batch.grad_accum, seq_len=batch.seq_len, epochs=float(req.epochs or 1.0),
        planned_world_size=batch.world_size, without_gradient=doc.without_gradient(), **_objective_fields(doc))


def _objective_fields(doc) -> dict:
    """The objective and its knobs as the plan resolved them (plan.json "training"); sft when absent."""
    rec = doc.recorded
    out = {"objective": rec("objective") or "sft", "prompt_len": rec("prompt_len"),
           "ref_model": rec("ref_model") or "none", "offload": str(rec("offload") or "none")}
    if rec("num_generations"):
        out["num_generations"] = int(rec("num_generations"))
    return out

"""What-if keys on a plan: each names one change to the choices behind a plan (the next micro batch that divides
each GPU's share, checkpointing on/off, the next strategy, offload, precision, optimizer, attention, bf16-only
weights, the next objective, the loss: standard ↔ chunked) as PlanRequest fields that pin every other choice; the planner then re-plans. Also the
repair a request needs when a what-if leaves it unplannable (bf16-only weights belong to full fine-tuning).
"""

from __future__ import annotations

from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.plan.search import next_micro_batch
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.vocabulary import Attention, LossImpl, Objective, Offload, Optimizer, OptimizerImpl, Precision, Strategy

# The what-if key cycles the strategy: plain DDP is "stage 0", then the ZeRO stages, then FSDP.
ZERO_CYCLE = (Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3, Strategy.FSDP)
# What-if keys that cycle a plan setting through the CLI's vocabulary (engine/vocabulary.py): change → request field
SETTING_CYCLES = {"precision": ("precision", Precision), "optimizer": ("optimizer", Optimizer),
                  "impl": ("optimizer_impl", OptimizerImpl), "attn": ("attn", Attention), "loss": ("loss", LossImpl)}


def what_if_changes(plan: Plan, change: str) -> dict[str, Any]:
    """The PlanRequest fields one what-if key sets on the choices behind `plan`; every other choice of the plan stays
    fixed (and the effective batch with them).

    Changing the micro batch keeps the effective batch: it moves to the next divisor of each GPU's share, and the
    engine derives the accumulation.
    """
    fixed = plan.pins()              # the planner's choices behind the plan, as the request fields that pin them
    eff = plan.setup.effective_batch
    if change in ("micro+", "micro-"):
        fixed.update(micro_batch=next_micro(plan, up=change == "micro+"), grad_accum=None)
    elif change == "ckpt":
        fixed.update(grad_ckpt=not fixed["grad_ckpt"])
    elif change == "zero":
        cur = fixed["strategy"]
        nxt = ZERO_CYCLE[(ZERO_CYCLE.index(cur) + 1) % len(ZERO_CYCLE)] if cur in ZERO_CYCLE else ZERO_CYCLE[0]
        fixed.update(strategy=nxt, offload=nxt.offload_within(fixed["offload"]))
    elif change in SETTING_CYCLES:
        name, vocab = SETTING_CYCLES[change]
        order = vocab.values()
        cur = str(getattr(plan.setup, name))
        fixed[name] = order[(order.index(cur) + 1) % len(order)] if cur in order else order[0]
    elif change == "offload":
        offloads = tuple(Offload)
        fixed.update(offload=offloads[(offloads.index(fixed["offload"]) + 1) % len(offloads)])
    elif change == "master":
        if plan.setup.method != "full":
            raise ScaletrainError("bf16-only weights apply to full fine-tuning; LoRA adapters stay fp32 (PEFT)")
        bf16 = plan.setup.master_weights != "bf16"
        if bf16 and fixed["strategy"].uses_deepspeed:
            # DeepSpeed always keeps an fp32 master: the nearest strategy that can hold bf16 weights alone
            fixed.update(strategy=Strategy.FSDP if fixed["strategy"].shards_params else Strategy.DDP)
            fixed.update(offload=fixed["strategy"].offload_within(fixed["offload"]))
        fixed.update(master_weights="bf16" if bf16 else "fp32")
    elif change == "objective":
        # sft → reward → dpo → grpo; each objective's knobs go back to TRL's defaults (dpo: reference same)
        order = Objective.values()
        cur = plan.setup.objective
        fixed.update(objective=order[(order.index(cur) + 1) % len(order)], ref_model=None, prompt_len=None,
                     completion_len=None, generation="train")
    else:
        raise ValueError(f"unknown what-if {change!r}")
    return dict(effective_batch=eff, **fixed)


def next_micro(plan: Plan, *, up: bool) -> int:
    """The next micro batch up or down that still divides each GPU's share of the effective batch."""
    s = plan.setup
    nxt = next_micro_batch(s, up=up)
    if nxt is None:
        raise ScaletrainError(
            f"micro batch {s.micro_batch} is already the {'largest' if up else 'smallest'} split of the "
            f"{s.effective_batch // s.world_size} samples each GPU takes per step; change the effective batch on "
            "step 3 for more")
    return nxt


def repaired(request: PlanRequest) -> PlanRequest:
    """The request with a choice no plan can hold undone: bf16-only weights belong to full fine-tuning."""
    if request.master_weights == "bf16" and request.method != "full":
        return request.with_(master_weights="fp32")
    return request

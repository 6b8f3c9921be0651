"""What a plan says about the model itself: total vs active parameters and the experts implementation of an MoE,
and the notes a user of that architecture needs (what LoRA reaches, what ZeRO-3 gathers, what is not offered).
Numbers come from the ModelArch and the setup; the views print these strings and the JSON carries the facts."""

from __future__ import annotations

from typing import Any

from scaletrain.engine.catalog.moe import EXPERTS_TARGET, peft_expert_lora, peft_expert_ranks
from scaletrain.engine.catalog.traced import position_limit
from scaletrain.engine.estimate.moe_time import (moe_layers, rows_text, running_experts_impl, traced_experts,
                                                 traced_rows, uncounted_experts)
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.units import fmt_bytes, fmt_count


def moe_facts(s: TrainingSetup) -> dict[str, Any] | None:
    """The MoE block as the plan counts it (None for a dense model). A traced family's: what its trace found."""
    moe = s.model.moe
    if moe is None:
        return _traced_facts(s)
    return {
        "experts": moe.experts, "top_k": moe.top_k, "expert_intermediate_size": moe.expert_intermediate,
        "shared_expert_intermediate_size": moe.shared_intermediate, "dense_layers": list(moe.dense_layers),
        "experts_implementation": str(s.experts_impl), "router_aux_loss": moe.aux_loss,
        "expert_parallelism": False,
    }


def _traced_facts(s: TrainingSetup) -> dict[str, Any] | None:
    """A traced family's routed experts (measure/trace_experts.py): the most experts a weight holds, the rows a
    token was counted through them, the layers that have them, the parameters a token runs through (the model's
    less the expert weights it is not routed to), and the implementation that runs them."""
    kinds = traced_experts(s)
    if not kinds:
        return None
    idle = sum(k.blocks * sum((E - min(r, E)) * a * b for E, a, b, r in k.counted()) for k in kinds)
    return {"experts": max(E for k in kinds for E, _, _ in k.weights), "rows_per_token": list(traced_rows(s)),
            "moe_layers": moe_layers(s), "active_params": int(s.model.params - idle),
            "experts_implementation": running_experts_impl(s), "counted": not uncounted_experts(s),
            "expert_parallelism": False}


def moe_line(s: TrainingSetup) -> str | None:
    """'MoE: 30,532,122,624 total, 3,348,529,152 active per token · 128 experts, top 8 · experts grouped_mm'; a
    traced family: 'MoE (traced): 1,334,628,352 total, 425,463,808 active per token · 32 experts in 24 of 24
    layers, 8 expert rows per token · experts grouped_mm (transformers' default)'."""
    moe = s.model.moe
    if moe is None:
        f = _traced_facts(s)
        if f is None:
            return None
        rows = rows_text(f["rows_per_token"]) or "uncounted"
        return (f"MoE (traced): {fmt_count(s.model.params)} total, {fmt_count(f['active_params'])} active per token · "
                f"{f['experts']} experts in {f['moe_layers']} of {s.model.num_layers} layers, {rows} expert rows per "
                f"token · experts {f['experts_implementation']} (transformers' default)")
    shared = f" + a shared expert of {moe.shared_intermediate}" if moe.shared_intermediate else ""
    return (f"MoE: {fmt_count(s.model.params)} total, {fmt_count(s.model.active_params)} active per token · "
            f"{moe.experts} experts, top {moe.top_k}{shared} · experts {s.experts_impl}")


def model_notes(s: TrainingSetup) -> tuple[str, ...]:
    """Notes the architecture calls for, in the plan (text and JSON)."""
    m = s.model
    out: list[str] = []
    limit = position_limit(m.trace)
    if limit is not None and limit < PlanRequest.seq_len:
        out.append(f"{m.name} has learned embeddings for {limit:,} positions: no sequence past {limit:,} tokens runs "
                   f"(the default sequence length, {PlanRequest.seq_len:,}, comes down to it)")
    if str(s.experts_impl) != running_experts_impl(s):
        out.append(_experts_impl_unused(s))
    if m.moe is not None:
        out.append("MoE: no expert parallelism — accelerate and DeepSpeed do not offer it for transformers models, "
                   "so every GPU runs every expert of its blocks (data parallelism only)")
        if s.strategy == "zero3" and s.world_size > 1:
            gather = (2 if s.precision != "fp32" else 4) * m.largest_gather_params
            out.append(f"ZeRO-3 gathers each MoE block whole as a leaf module ({fmt_bytes(gather)} per gather): the "
                       "bundled trainer calls deepspeed.utils.set_z3_leaf_modules; a --script must call it too for "
                       "this gather to be the one the plan counts")
        if s.method != "full":
            out.append(_lora_note(s))
        if s.method != "full" and s.base_bits in (4, 8):
            out.append(f"{s.base_bits}-bit base: bitsandbytes quantizes nn.Linear layers only; the fused experts "
                       "stay 16-bit (counted so)")
    quant = (m.config.get("quantization_config") or {}).get("quant_method")
    if quant == "mxfp4":
        out.append("the checkpoint's MXFP4 experts are dequantized to bf16 for training (transformers "
                   "Mxfp4Config(dequantize=True)); the plan counts the bf16 model")
    return tuple(out)


def _experts_impl_unused(s: TrainingSetup) -> str:
    """An experts implementation asked for where it changes nothing: the trainer passes it only to the MoE families
    whose layout the catalog knows (trainer/model.py with_experts_implementation); a traced MoE family runs
    transformers' default (moe_time.running_experts_impl), and a dense model has no experts."""
    runs = running_experts_impl(s)
    what = (f"its experts run transformers' default, {runs} (a traced MoE family: the trainer passes no "
            f"implementation to it, and the plan counts {runs})" if traced_experts(s) else "it has no routed experts")
    return f"--experts-impl {s.experts_impl} changes nothing for {s.model.name}: {what}"


def _lora_note(s: TrainingSetup) -> str:
    """What peft adapts on an MoE block for these targets: its nn.Linear modules, and the fused 3-D experts where
    peft converts the expert projections' names to target_parameters (catalog/moe.py PEFT_EXPERT_TARGETS)."""
    m = s.model
    linears = ", ".join(m.lora_target_shapes(s.lora_targets)) or "no nn.Linear"
    per_block, gate_up, down = peft_expert_lora(m.model_type, m.moe, m.hidden_size, s.lora_rank, s.lora_targets)
    if not per_block:
        return (f"LoRA on {m.model_type} adapts {linears}; the routed experts (fused 3-D parameters) stay frozen "
                "for these targets")
    gu, _ = peft_expert_ranks(m.model_type, m.moe, tuple(s.lora_targets))
    which = " and ".join(n for n, on in ((f"gate_up_proj (rank {'2r' if gu == 2 else 'r'})", gate_up),
                                         ("down_proj", down)) if on)
    how = ("through peft's target_parameters" if EXPERTS_TARGET in s.lora_targets else
           "as peft converts the expert projections to target_parameters")
    return (f"LoRA on {m.model_type} adapts {linears} and, {how}, every expert's {which}: "
            f"{fmt_count(per_block * moe_layers(s))} of the "
            f"{fmt_count(s.trainable_params)} trainable parameters are in the experts")

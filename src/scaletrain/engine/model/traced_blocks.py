"""The activations term of a traced model (no analytic layout): activations.py's two functions, from the trace.

Traced (trainer/trace.py, a slice of the real model at its real widths, exact to the byte at three lengths):
  - each block's saved bytes, attention half and MLP half, as c0 + c1·S + c2·S²: c1 the per-token tensors
    (norm inputs, what the linears keep, q/k/v, MLP intermediates, LoRA's rank-r tensors), c2 what grows with
    S² (eager attention's softmax), c0 the per-block constants (autocast's 16-bit weight copies), which the memory
    model keeps as `weight_copies` since checkpointing recomputes them with the block;
  - outside the blocks: the ids the embedding keeps and the tensors every block receives (rotary cos/sin, masks),
    the final norm's saved tensors and what the output head keeps of its input.
Derived from the traced block's own widths (kernel-level rules the analytic families use too, none of them a
family's layout):
  - forward transient: the block's largest saved per-token tensor alive once more while the next op runs
    (an MLP intermediate; gate_up's 2·I output for fused MLPs), or eager attention's raw and masked fp32 scores;
  - MLP backward transient: the gradients of two of the MLP's largest saved tensors (the B·S·I gradients);
    plus the 16-bit weight gradient of the block's largest linear when autocast trains fp32 weights;
  - attention backward transient: the gradients of q, k, v at every head (CPU sdpa), FlashAttention-2's
    workspace (CUDA), or eager's softmax input/output gradients (2 fp32 B·heads·S² tensors);
  - the autocast cache's share of the weight copies, from the block's real linears (weight_copies_bytes);
  - the output head's 16-bit copy (a V×h linear; the trace's small vocabulary does not show the real one).
The logits and cross-entropy are the engine's generic head terms (objectives.py), as for every family.
tests/test_traced.py checks whole steps against torch.profiler.
"""

from __future__ import annotations

from typing import Any, Callable

from scaletrain.engine.catalog import traced
from scaletrain.engine.model.chunked_loss import chunked, hidden_saved
from scaletrain.engine.model.numerics import numerics
from scaletrain.engine.model.setup import TrainingSetup


def trace_regime(s: TrainingSetup) -> dict[str, Any]:
    """The regime a trace runs in, in trainer/measure.py's names (as trainer/validate.py maps a plan).

    Checkpointing is not part of it: the trace keeps what a block saves when it runs (or is recomputed), and
    the memory model keeps only block inputs between blocks under checkpointing, as for every family. fp16 is
    traced as bf16 (same widths); QLoRA as LoRA on an fp32 base under autocast (its frozen weights' 16-bit copies
    counted: an over-estimate, on the safe side). A sliding window shorter than the planned sequence is traced
    as one shorter than the trace's sequences, so its masks and repeated k/v are in the fit.
    """
    nm = numerics(s)
    if s.precision == "fp32":
        precision = "fp32"
    elif not nm.autocast:
        precision = "bf16-pure"
    else:
        precision = "bf16" if nm.residual == 4 else "bf16-autocast"
    lora = s.method != "full"
    regime: dict[str, Any] = {"method": "lora" if lora else "full", "lora_rank": s.lora_rank if lora else 0,
                              "lora_targets": sorted(s.lora_targets) if lora else None, "precision": precision,
                              "attn": "eager" if s.attn == "eager" else "sdpa"}
    window = s.model.config.get("sliding_window")
    if isinstance(window, int) and not isinstance(window, bool) and 0 < window < s.seq_len:
        regime["windowed"] = True     # traced with a window shorter than its sequences: masks, repeated k/v
    return regime


def prefetch_traces(setups: list[TrainingSetup]) -> None:
    """Trace, in one subprocess, every regime these setups of a traced model need and the cache lacks (a search
    visits several: DeepSpeed's 16-bit weights and accelerate's autocast are different regimes)."""
    from scaletrain.engine.catalog.architectures import analytic_types

    todo = [s for s in setups if s.model.memory_source == "traced"]
    if todo:
        regimes = {_json_key(trace_regime(s)): trace_regime(s) for s in todo}
        traced.prefetch(todo[0].model.config, list(regimes.values()), analytic_types())


def _json_key(regime: dict[str, Any]) -> str:
    import json

    return json.dumps(regime, sort_keys=True)


def _trace(s: TrainingSetup) -> dict[str, Any]:
    from scaletrain.engine.catalog.architectures import analytic_types

    return traced.activations(s.model.config, trace_regime(s), analytic_types())


def _per_layer(s: TrainingSetup, blocks: list[dict]) -> list[dict]:
    """The traced block standing in for each real layer: by layer type when the config has a pattern."""
    types = s.model.config.get("layer_types")
    L = s.model.num_layers
    if not isinstance(types, list) or len(types) < L:
        return [blocks[0]] * L
    by_type = {}
    for blk in blocks:
        by_type.setdefault(blk["type"], blk)
    return [by_type.get(types[j], blocks[0]) for j in range(L)]


def _mean(values: list[int]) -> int:
    """Average over the layers, rounded up (safe side)."""
    return -(-sum(values) // max(len(values), 1))


def traced_block_terms(s: TrainingSetup, micro_batch: int | None, copies: tuple[int, int],
                       flash_backward: Callable[[TrainingSetup, int], int]) -> dict[str, int]:
    """LayerActivations' fields for a traced model (see the module doc for what is traced and what derived)."""
    m = s.model
    nm = numerics(s)
    b = micro_batch or s.micro_batch
    S = s.seq_len
    t = b * S
    c = nm.compute
    layers = _per_layer(s, _trace(s)["blocks"])
    per_token = lambda f: [int(x) for x in f[1:]]   # noqa: E731 - c1, c2 without the constant
    saved_attn = _mean([traced.at([0, *per_token(blk["attn"])], b, S) for blk in layers])
    saved_mlp = _mean([traced.at([0, *per_token(blk["mlp"])], b, S) for blk in layers])
    consts = _mean([int(blk["attn"][0]) + int(blk["mlp"][0]) for blk in layers])
    largest = max(max(int(blk["largest_mlp"]), int(blk["largest_attn"])) for blk in layers)
    # a block whose MLP child the trace could not name kept everything in its attention half: use its largest
    largest_mlp = max(int(blk["largest_mlp"]) for blk in layers) or largest
    s2 = b * m.num_heads * S * S           # attention score elements
    fwd_t = 2 * s2 * 4 if s.attn == "eager" else t * largest
    mlp_bwd_t = 2 * t * largest_mlp
    if s.attn == "eager":
        attn_bwd_t = 2 * s2 * 4
    elif s.device == "cuda":
        attn_bwd_t = t * flash_backward(s, c)
    else:
        attn_bwd_t = 3 * t * m.q_dim * c
    if nm.trainable_copies:
        mlp_bwd_t += c * max(a * o for a, o, _ in m.linear_shapes().values())
    return {"saved_attn": saved_attn, "saved_mlp": saved_mlp, "fwd_transient": fwd_t,
            "mlp_bwd_transient": mlp_bwd_t, "attn_bwd_transient": attn_bwd_t, "weight_copies": consts,
            "cached_copies": min(copies[1], consts)}


def traced_outside_blocks(s: TrainingSetup, micro_batch: int | None = None) -> dict[str, int]:
    """activations.outside_blocks for a traced model: `shared`, `final`, `labels` (see the module doc)."""
    m = s.model
    nm = numerics(s)
    b = micro_batch or s.micro_batch
    S = s.seq_len
    t = b * S
    act = _trace(s)
    shared = traced.at(act["shared"], b, S)
    final = traced.at(act["final_norm"], b, S)
    own_head = not (s.fused_lm_head or chunked(s))   # TRL's fused head, the chunked loss: their own saves
    if own_head:
        final += traced.at([0, *act["head_input"][1:]], b, S)
    head_out = m.vocab_size if m.vocab_head else 1
    if (nm.trainable_copies or nm.fp32_head) and own_head:
        final += 2 * head_out * m.hidden_size
    final += hidden_saved(s, t) if chunked(s) else 0
    return {"shared": shared, "final": final, "labels": 8 * t, "window_mask": 0}

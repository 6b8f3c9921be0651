"""The traced model's structure, on the meta device: its layer kinds by signature, the prefix slice that holds one
of each, the lengths the slice is traced at, and peft's count of LoRA on it (measure/trace.py)."""

from __future__ import annotations

from typing import Any

from scaletrain.measure.saved_activations import decoder_layers
from scaletrain.measure.trace_experts import expert_weights
from scaletrain.measure.trace_fit import TraceError
from scaletrain.measure.trace_layers import block_linears, layer_signatures, meta_model
from scaletrain.measure.trace_slice import (MAX_SLICE_BYTES, SLICE_VOCAB, WINDOWED_TRACE, check_slice_size,
                                            prefix_config, shrink_windows, slice_kinds, slice_of, slice_params,
                                            stacked_config, stacks_of)

# what the structure's importers read from here (measure/trace.py, measure/trace_record.py, the tests)
__all__ = ["ATTN_NAMES", "FIT_TOLERANCE", "MAX_SLICE_BYTES", "MLP_NAMES", "SLICE_VOCAB", "TRACE_BATCH",
           "TRACE_MULTIPLES", "WINDOWED_TRACE", "block_linears", "check_config_kept", "check_slice_size",
           "config_of", "config_sizes", "lora_count", "meta_model", "peft_refuses", "prefix_config",
           "shrink_windows", "slice_kinds", "slice_params", "stacked_config", "stepped_on_full_model", "structure"]

# Trace lengths are granule × these (+ the planned length's residue, engine/catalog/traced.py `granule`): three
# fit, the fourth checks
TRACE_MULTIPLES = (1, 2, 3, 4)
# Sequences per traced forward. At one sequence a `transpose(0, 1)` or `.contiguous()` over the batch dimension is
# a view (a size-1 dimension moves freely), so the copies a real micro-batch makes go unseen: doge's checkpointed
# backward rose 2 272 256 bytes at 2 × 128 tokens but 1 103 360 at 1 × 128 (a hidden-sized copy missing), and
# 4 × 128 is exactly twice 2 × 128 (tests/trainer/test_trace_batch.py).
TRACE_BATCH = 2
# A fitted half may miss the checking length by this share of the slice's saved bytes there (MoE routing of a
# random init moves a few tokens between experts from one length to the next); else the trace refuses.
FIT_TOLERANCE = 0.02
ATTN_NAMES = ("self_attn", "attention", "attn", "self_attention", "mixer", "mamba", "linear_attn", "temporal_block")
MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe")


def stepped_on_full_model(config: dict, gradless_names: list[str], sliced: int) -> tuple[int, int]:
    """The gradless parameters' elements and the largest stepped parameter's (for-loop AdamW's temporaries have its
    size), on the real model built on the meta device: the slice's vocabulary is shrunk (reformer's lm_head.bias: 509
    elements on the slice, 320 in the model). `sliced` and 0 when a name is not the full model's (a LoRA wrapper's)."""
    named = dict(meta_model(config).named_parameters())
    if not all(n in named for n in gradless_names):
        return sliced, 0
    skip = set(gradless_names)
    largest = max((int(p.numel()) for n, p in named.items() if n not in skip), default=0)
    return int(sum(int(named[n].numel()) for n in skip)), largest


def _norm_modules(layer) -> int:
    """Modules of the block that own parameters and are not linears (its norms)."""
    import torch

    return sum(1 for _, m in layer.named_modules() if not isinstance(m, torch.nn.Linear)
               and any(True for _ in m.parameters(recurse=False)))


def _kinds(model, layers, stacked: bool) -> tuple[list[dict], list[int], list[str]]:
    """The layers grouped by signature, in order of first appearance: (kinds, kind of each layer, signatures)."""
    sigs = layer_signatures(model, layers, stacked)
    order: dict[str, int] = {}
    kinds: list[dict] = []
    for i, (sig, layer) in enumerate(zip(sigs, layers)):
        if sig not in order:
            order[sig] = len(kinds)
            params = list(layer.parameters())
            kinds.append({"first": i, "count": 0, "label": type(layer).__name__,
                          "params": sum(int(p.numel()) for p in params), "tensors": len(params),
                          "linears": block_linears(layer), "norms": _norm_modules(layer)})
            experts = expert_weights(layer)     # routed experts' [E, a, b] weights: no nn.Linear (trace_experts)
            if experts:
                kinds[-1]["experts"] = experts
        kinds[order[sig]]["count"] += 1
    return kinds, [order[s] for s in sigs], sigs


def structure(config: dict) -> dict[str, Any]:
    """The real model's parameters, its layer kinds and the slice that holds one of each (meta device)."""
    model = meta_model(config)
    unique = {id(p): p for p in model.parameters()}
    layers = decoder_layers(model)
    if not layers:
        raise TraceError("transformers' model has no list of decoder layers to trace")
    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    emb_params = int(emb.weight.numel()) if emb is not None and hasattr(emb, "weight") else 0
    tied = head is not None and emb is not None and getattr(head, "weight", None) is getattr(emb, "weight", 0)
    head_params = 0 if head is None or tied else sum(int(p.numel()) for p in head.parameters())
    kinds, layer_kinds, sigs = _kinds(model, layers, bool(stacks_of(config)))
    linears: dict[str, list] = {}
    for k in kinds:
        for name, shape in k["linears"].items():
            linears.setdefault(name, shape)
    largest = max(kinds, key=lambda k: (k["params"], k["tensors"]))
    float_buf, other_buf, fixed_elems, fixed_bytes = _buffers(model, unique, config)
    head_w = getattr(head, "weight", None) if head is not None else None
    return {
        "params": int(sum(p.numel() for p in unique.values())),
        # what transformers builds frozen (blt's entropy patcher): no gradient, no optimizer state in a full run
        "frozen_params": int(sum(p.numel() for p in unique.values() if not p.requires_grad)),
        "largest_param": max((int(p.numel()) for p in unique.values()), default=0),
        "embedding_params": emb_params, "lm_head_params": head_params, "tied": bool(tied),
        "block_params": largest["params"], "block_tensors": largest["tensors"], "linears": linears,
        "block_norms": largest["norms"], "tensor_count": len(unique),
        "checkpointing": bool(getattr(model, "supports_gradient_checkpointing", False)),
        "buffer_float_elems": float_buf, "buffer_other_bytes": other_buf,
        "buffer_fixed_elems": fixed_elems, "buffer_fixed_bytes": fixed_bytes,
        # the logits' width: the config's vocabulary, or a head its class sizes its own way (unpadded_vocab_size)
        "head_out": int(head_w.shape[0]) if head_w is not None and head_w.dim() == 2 else None,
        "kinds": kinds, "layer_kinds": layer_kinds, **slice_of(config, sigs, model),
        "attn_implementations": [a for a, flag in (("eager", True), ("sdpa", "_supports_sdpa"),
                                                   ("flash", "_supports_flash_attn"))
                                 if flag is True or getattr(type(model), flag, False)],
        "sizes": _sizes(model, layers),
        "position_table": _position_table(model, config, layers),
    }


def _position_table(model, config: dict, layers: list) -> int | None:
    """The positions a learned table holds outside the layers (gpt2's wpe: n_positions; marian's sinusoidal
    table): a longer sequence indexes past it and fails at the first step. None where positions are computed
    (rotary, ALiBi): a longer sequence runs. A table is one whose rows are a position count of the config (or 2
    more); its usable rows leave out its offset (opt's and bart's first 2) or the rows up to its padding index
    (roberta's positions start after it: 514 rows hold 512)."""
    import torch

    from scaletrain.engine.catalog.traced import config_positions

    values = config_positions(config)
    inside = {id(m) for layer in layers for m in layer.modules()}
    words = model.get_input_embeddings()
    for mod in model.modules():
        if isinstance(mod, torch.nn.Embedding) and mod is not words and id(mod) not in inside:
            rows = int(mod.num_embeddings)
            if any(rows in (v, v + 2) for v in values):
                offset = getattr(mod, "offset", None)
                if isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0:
                    return rows - offset
                return rows - (int(mod.padding_idx) + 1 if mod.padding_idx is not None else 0)
    return None


def _sizes(model, layers: list) -> dict[str, int]:
    """The config's sizes; where its top names none (blt's are its stacks' own configs), those of the pretrained
    stack that holds the most of the layers' parameters (blt's global transformer)."""
    from transformers import PreTrainedModel

    sizes = config_sizes(model.config)
    if "hidden_size" in sizes:
        return sizes
    ids = {id(p): int(p.numel()) for layer in layers for p in layer.parameters()}
    stacks = [m for m in model.modules() if isinstance(m, PreTrainedModel) and m is not model
              and "hidden_size" in config_sizes(m.config)]
    if not stacks:
        return sizes
    owner = max(stacks, key=lambda m: sum(ids.get(id(p), 0) for p in m.parameters()))
    return {**config_sizes(owner.config), **sizes}


def peft_refuses(config: dict, names: list[str]) -> list[str]:
    """The block linears peft will not adapt in this model (its LoRA refuses a mamba mixer's out_proj): left out of
    the default targets, so LoRA adapts what peft adapts. Each name tried alone only when all together fail. Asked
    apart from the structure, by LoRA plans only: importing peft costs more than torch (bitsandbytes, inductor)."""
    def adapts(targets: list[str]) -> bool:
        try:
            lora_count(config, targets, ranks=(1,))
        except (ValueError, TypeError, TraceError):
            return False
        return True

    if not names or adapts(names):
        return []
    return [n for n in names if not adapts([n])]


def _buffers(model, params: dict, config: dict) -> tuple[int, int, int, int]:
    """The model's buffers as built (a causal-mask table, position ids, rotary frequencies): resident beside the
    weights at every moment of a step, in no parameter count. (floating-point elements, which a model built in a
    16-bit dtype holds in that dtype; bytes of the rest; and the floating ones such a build keeps in their own
    dtype, elements and bytes: gptj's and codegen's sin/cos table, max positions × rotary width, is computed in fp32
    whatever the dtype transformers builds the model in, and stayed fp32 beside a bf16 base: LoRA on it was 3.4 %
    under with the table counted in bf16.) The 16-bit build is a second meta build, by buffer name."""
    import torch

    seen: dict[str, object] = {}
    ids: set[int] = set()
    for name, b in model.named_buffers():
        if id(b) not in params and id(b) not in ids:
            seen[name] = b
            ids.add(id(b))
    sixteen = dict(meta_model(config, dtype=torch.bfloat16).named_buffers())
    fixed = [sixteen[n] for n, b in seen.items() if b.is_floating_point() and n in sixteen
             and sixteen[n].is_floating_point() and sixteen[n].dtype != torch.bfloat16]
    floats = sum(int(b.numel()) for b in seen.values() if b.is_floating_point()) - sum(int(b.numel()) for b in fixed)
    other = sum(int(b.numel()) * b.element_size() for b in seen.values() if not b.is_floating_point())
    return floats, other, sum(int(b.numel()) for b in fixed), sum(int(b.numel()) * b.element_size() for b in fixed)


SIZE_NAMES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size")


def config_sizes(conf) -> dict[str, int]:
    """The sizes the engine reads, as transformers' config object answers them (its attribute_map turns GPT-2's
    n_embd, n_layer, n_head into hidden_size, num_hidden_layers, num_attention_heads). A size the config will not
    answer globally is left out: gemma4's per-layer head_dim raises (transformers' heterogeneity configs)."""
    out = {}
    for name in SIZE_NAMES:
        try:
            v = getattr(conf, name)
        except (AttributeError, KeyError, TypeError, ValueError, RuntimeError):
            continue
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            out[name] = v
    return out


def lora_count(config: dict, targets, ranks: tuple[int, ...] = (1, 2)) -> dict[str, int]:
    """peft's own count on the meta-device model: trainable parameters per unit of rank and adapted modules, as the
    trainer's add_lora builds them (checked linear in the rank at ranks 1 and 2)."""
    from peft.tuners.lora import LoraLayer

    from scaletrain.trainer import model as model_lib

    counts, by_layer = [], []
    for rank in ranks:
        model = model_lib.add_lora(meta_model(config), rank=rank, alpha=2 * rank, dropout=0.0,
                                   targets=list(targets) if targets else "all-linear", quantized=False,
                                   grad_ckpt=False)
        trainable = sum(int(p.numel()) for p in model.parameters() if p.requires_grad)
        adapted = sum(1 for _, m in model.named_modules() if isinstance(m, LoraLayer))
        counts.append((trainable, adapted))
        if not by_layer:        # each decoder layer's own adapters, in order (an MoE layer's fused experts hold more)
            by_layer = [sum(int(p.numel()) for p in layer.parameters() if p.requires_grad)
                        for layer in decoder_layers(model)]
    if len(counts) > 1 and counts[1][0] != 2 * counts[0][0]:
        raise TraceError(f"peft's LoRA parameters are not linear in the rank here ({counts[0][0]} at rank 1, "
                         f"{counts[1][0]} at rank 2)")
    if counts[0][1] == 0:
        raise TraceError(f"peft adapts no module of {config.get('model_type')} for the targets "
                         f"{', '.join(targets) if targets else 'all-linear'}")
    return {"per_rank": counts[0][0], "adapted": counts[0][1], "per_rank_by_layer": by_layer}


def config_of(harness) -> dict:
    """The model's config as a dict, before anything runs (check_config_kept's `before`)."""
    config = getattr(harness.model, "config", None)
    return config.to_dict() if config is not None else {}


def check_config_kept(harness, before: dict) -> None:
    """A forward that writes its own config (reformer's LSH attention sets an unset num_buckets from the first
    length it hashes, 2·S / chunk) runs every later length as that one, and a real run as its own first batch:
    what the trace measured is not what the run will. Refused in one line that names the key to set."""
    after = config_of(harness)
    changed = sorted(k for k in after if before.get(k) is None and after[k] is not None)
    if changed:
        raise TraceError(f"its forward sets config {', '.join(changed)} from the length of its first batch "
                         f"({', '.join(f'{k}={after[k]!r}' for k in changed)} here), so its memory depends on that "
                         f"batch; set {', '.join(changed)} in config.json")

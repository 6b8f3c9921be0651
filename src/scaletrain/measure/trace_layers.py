"""A traced model's layers on the meta device: the model built there, its block linears, and each layer's
structural signature (what makes two layers the same kind; measure/trace_structure.py)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from scaletrain.measure.frozen import mark_frozen_stacks
from scaletrain.measure.saved_activations import layer_siblings

# attributes that number a layer rather than shape it (left out of the signature)
_NUMBERING = re.compile(r"idx|index|layer_id|layer_num|layer_no|block_id", re.I)


def meta_model(config: dict, dtype=None):
    """`config` built by transformers on the meta device (no memory, no init), its tied weights tied; in `dtype`
    (a torch dtype) as the trainer builds a 16-bit model, else in transformers' default."""
    import torch

    from scaletrain.trainer import model as model_lib

    conf = model_lib.hf_config(config)
    with torch.device("meta"):
        model = model_lib.causal_lm_from_config(conf, **({"dtype": dtype} if dtype is not None else {}))
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    mark_frozen_stacks(model)
    return model


def block_linears(layer) -> dict[str, list]:
    """name → [in, out, bias] of each nn.Linear in one block: the leaf name (what peft matches a target against
    by suffix), or the path within the block when two linears share a leaf name. Only modules that compute as
    nn.Linear does (`_computes_as_linear`): an MoE router answering a tuple is no LoRA target and no plain GEMM.
    transformers' Conv1D (gpt2, openai-gpt: a linear whose weight is stored transposed, [in, out]) is one too: peft's
    all-linear adapts it and bitsandbytes quantizes it as an nn.Linear."""
    import torch
    from transformers.pytorch_utils import Conv1D

    found = [(n, m) for n, m in layer.named_modules()
             if isinstance(m, Conv1D) or isinstance(m, torch.nn.Linear) and _computes_as_linear(m)]
    leaves = [n.rsplit(".", 1)[-1] for n, _ in found]
    out = {}
    for (path, mod), leaf in zip(found, leaves):
        # a leaf that is a position in a Sequential (ctrl's ffn.0, ffn.2) would name the decoder layers themselves
        # (model.h.0) to peft's suffix match: its path within the block names it alone
        key = leaf if leaves.count(leaf) == 1 and not leaf.isdigit() else path
        in_out = (mod.nx, mod.nf) if isinstance(mod, Conv1D) else (mod.in_features, mod.out_features)
        out[key] = [int(in_out[0]), int(in_out[1]), mod.bias is not None]
    return out


def _computes_as_linear(mod) -> bool:
    """nn.Linear's own forward, or a subclass's that answers like it: a tensor of [..., out_features] for
    [..., in_features] (falcon's FalconLinear: `input @ weight.T + bias`; peft adapts it and bitsandbytes quantizes
    it as any nn.Linear). Not: a router answering a tuple (llama4, phimoe), a grouped projection whose input is
    [..., groups, in_features] (deepseek_v4), a linear that appends features of its own (idefics). Asked where
    the weight is: on the meta device, where a traced structure's layers are built, nothing is computed."""
    import torch

    if type(mod).forward is torch.nn.Linear.forward:
        return True
    weight = mod.weight
    probe = torch.zeros(3, int(mod.in_features), dtype=weight.dtype, device=weight.device)
    try:
        with torch.no_grad():
            out = mod(probe)
    except Exception:        # a forward that cannot take a plain [tokens, in_features] input is no plain linear
        return False
    return isinstance(out, torch.Tensor) and tuple(out.shape) == (3, int(mod.out_features))


def _plain(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str)) or (
        isinstance(v, (tuple, list)) and len(v) <= 16 and all(isinstance(x, (bool, int, float, str)) for x in v))


def layer_signature(layer) -> str:
    """What makes two decoder layers the same kind: classes, plain attributes and parameter shapes of the module
    tree (a layer's number left out)."""
    parts = [type(layer).__name__]
    for name, mod in layer.named_modules():
        attrs = sorted((k, repr(v)) for k, v in vars(mod).items()
                       if not k.startswith("_") and k != "training" and _plain(v) and not _NUMBERING.search(k))
        parts.append(f"{name}:{type(mod).__name__}:{attrs}")
    for name, p in layer.named_parameters():
        parts.append(f"{name}:{tuple(p.shape)}:{p.dtype}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def layer_signatures(model, layers: list, stacked: bool) -> list[str]:
    """Each decoder layer's signature; in a model of several stacks (`stacked`: their depths in their own configs,
    trace_slice.stacks_of), with its
    stack's name, whether it is the stack's first, and the parts beside it in parallel lists: a kind never spans
    two stacks (blt's local encoder and decoder layers have the same shapes; the encoder's cross-attention runs
    once, after its last layer, the decoder's before each of its layers)."""
    import torch

    sigs = [layer_signature(layer) for layer in layers]
    if not layers or not stacked:
        return sigs          # one stack (hrm_text's two lists are one, looped): its layers' kinds as ever
    # a stack's name, and whether the layer is its first: what runs between two stacks (blt's patch projection into
    # the local decoder) is saved in the next stack's first layer, once, not by each of its layers
    where = {id(layer): f"{name}:{j == 0}" for name, mod in model.named_modules()
             if isinstance(mod, torch.nn.ModuleList) for j, layer in enumerate(mod)}
    beside: dict[int, list[str]] = {}
    for name, parts in layer_siblings(model, layers):
        for i, mod in parts.items():
            beside.setdefault(i, []).append(f"{name}:{layer_signature(mod)}")
    joined = ["|".join([sig, where.get(id(layers[i]), ""), *beside.get(i, [])]) for i, sig in enumerate(sigs)]
    return [hashlib.sha256(j.encode()).hexdigest()[:16] for j in joined]

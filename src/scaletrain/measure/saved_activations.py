"""Bytes saved for backward by one forward + loss: the activations term of the memory model, measured exactly.

The model is built as measure.py builds it (build_harness); every tensor autograd packs is counted once by its
storage. torch is imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

from typing import Any

from scaletrain.measure.frozen import FROZEN_STACK
from scaletrain.measure.step import make_batches, storage_key, check_arguments, build_harness


def measure_saved_activation_bytes(hf_config: dict, *, method: str = "full", lora_rank: int = 8,
                                   lora_alpha: int = 16, lora_targets: tuple[str, ...] | None = None,
                                   micro_batch: int = 1, seq_len: int = 128, grad_ckpt: bool = False,
                                   attn: str = "sdpa", precision: str = "fp32", optimizer: str = "adamw",
                                   grad_accum: int = 1, device: str = "cpu", seed: int = 0,
                                   warmup_steps: int = 1, per_layer: bool = False):
    """Bytes saved for backward by one forward + loss (one micro-batch), parameters excluded.

    Uses ``torch.autograd.graph.saved_tensors_hooks``; every packed tensor is deduplicated by its
    storage (device, data_ptr) -- views and the same tensor saved by several nodes count once; a
    storage that is a parameter's (or a buffer's) is excluded.  With ``per_layer=True`` returns
    ``(total, {scope: bytes})`` where scope is ``"pre-layers"`` (embedding: the int64 ids),
    ``"layer{i}"`` (decoder block i; layer0 also gets the rotary cos/sin, first saved there) or
    ``"post-layers"`` (final norm, lm_head, loss), by which forward was running when the storage
    was first saved.  With ``grad_ckpt=True`` torch's non-reentrant checkpoint packs its own hooks
    inside each block, so only what stays saved between forward and backward is seen: the block
    input (b*s*h per layer, saved through the same hook mechanism) plus everything outside blocks.
    ``optimizer``/``grad_accum``/``warmup_steps`` are accepted for signature parity and ignored.

    Verified per decoder layer (llama code path, 7 shapes x 5 modes, exact to the byte), with
    b=micro_batch, s=seq_len, h=hidden, I=intermediate, nh=heads, kvd=kv_heads*head_dim,
    kvr = h if kv_heads > 1 else kvd (eager's repeat_kv copies unless it is a stride-0 view):
      fp32 full sdpa : 4*b*s*(8h + 2kvd + nh + 2 + 4I)
      fp32 full eager: 4*b*s*(8h + 2kvr + nh*s + 2 + 4I)
      fp32 LoRA sdpa : 4*b*s*(6h + 2kvd + nh + 2 + 4I + r*n_adapted)   (eager: same substitution)
      bf16 autocast  : b*s*(30h + 4kvd + 4nh + 8 + 8I) + 2*(linear weights of the block)
    and outside the blocks: ids 8*b*s; final norm + lm_head + log_softmax
    4*b*s*(3h+1 + V) (full) or 4*b*s*(h+1 + V) (LoRA, frozen norm/head) + 8*b*s shifted labels.
    """
    check_arguments(method, attn, precision, optimizer, device, grad_accum, micro_batch, seq_len, warmup_steps)
    import torch

    setup = build_harness(hf_config, method=method, lora_rank=lora_rank, lora_alpha=lora_alpha,
                                 lora_targets=lora_targets, grad_ckpt=grad_ckpt, attn=attn,
                                 precision=precision, optimizer=optimizer, device=device, seed=seed)
    model = setup.model
    excluded = {storage_key(t) for t in list(model.parameters()) + list(model.buffers())}
    (ids,) = make_batches(1, micro_batch, seq_len, setup.vocab_size, setup.device, seed)

    seen: dict[tuple[str, int], int] = {}
    owner: dict[tuple[str, int], str] = {}
    scope = ["pre-layers"]

    def pack(t):
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta":
            k = storage_key(t)
            if k not in excluded:
                nb = t.untyped_storage().nbytes()
                if nb > seen.get(k, 0):
                    seen[k] = nb
                    owner.setdefault(k, scope[-1])
        return t

    hooks = []
    layers = decoder_layers(model)
    def enter(i):
        def hook(module, args):
            scope.append(f"layer{i}")
        return hook

    def leave(last):
        def hook(module, args, output):
            scope.pop()
            if last:
                scope[0] = "post-layers"
        return hook

    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_pre_hook(enter(i)))
        hooks.append(layer.register_forward_hook(leave(i == len(layers) - 1)))
    forward_saving(model, setup.autocast, ids, pack, hooks)
    total = sum(seen.values())
    if not per_layer:
        return total
    by: dict[str, int] = {}
    for k, nb in seen.items():
        by[owner[k]] = by.get(owner[k], 0) + nb
    return total, by


def forward_saving(model, autocast, ids, pack, hooks) -> None:
    """One forward + loss with every tensor autograd saves for backward passed to `pack` (the graph is dropped
    afterwards); the module hooks that scoped it are removed whatever happens."""
    import torch

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with autocast():
                loss = model(input_ids=ids, labels=ids).loss
    finally:
        for h in hooks:
            h.remove()
    del loss


def decoder_layers(model) -> list:
    """The repeated decoder blocks of a (possibly peft-wrapped) causal LM: the module list that holds the most
    parameters (``model.layers`` in most families, ``transformer.h`` in GPT-2's, ``blocks`` in MPT's), leaving out
    lists inside another pretrained model than the decoder (`get_decoder()`) and its parents: a multimodal causal
    LM's towers (phi4_multimodal's audio encoder holds more than its text layers and never runs on text). With it,
    the other lists of the same layer class, in module order: a stack built as two (hrm_text's L and H modules, run
    in turns; the H module's layers, left out, kept their checkpointed inputs unseen: 7.5 % under)."""
    lists = _layer_lists(model, _outside_decoder(model))
    if not lists:       # every stack a pretrained model of its own inside the decoder (blt's three): those stacks
        lists = _layer_lists(model, _outside_decoder(model, within=True))
    if not lists:
        return []
    best = max(lists, key=lambda mod: (sum(p.numel() for p in mod.parameters()), len(mod)))   # the first of equals
    cls = type(best[0])
    return [layer for mod in lists if mod is best or all(type(x) is cls for x in mod) for layer in mod]


def _layer_lists(model, inside_other) -> list:
    """The non-empty module lists a decoder's layers may be, in module order: none inside another pretrained
    model (`inside_other`) or frozen as built."""
    import torch

    return [mod for name, mod in model.named_modules()
            if isinstance(mod, torch.nn.ModuleList) and len(mod) and not inside_other(name)
            and not getattr(mod, FROZEN_STACK, False)]


def layer_siblings(model, layers: list) -> list[tuple[str, dict[int, Any]]]:
    """The other parts of each layer when a family spreads its layers over parallel module lists: lists beside a
    list of the decoder layers (same parent, same length), XLM's `attentions`, `layer_norm1`, `ffns` and
    `layer_norm2`, element j of each run as that list's layer j; blt's local decoder's `cross_attn_layers` beside its
    `layers`, one of its three stacks. (list name, {index in `layers`: its module}) each; none in a family whose
    layer is one module."""
    import torch

    index = {id(layer): i for i, layer in enumerate(layers)}
    out = []
    for holder in model.modules():
        for parent in holder.children():
            if not (isinstance(parent, torch.nn.ModuleList) and len(parent) and id(parent[0]) in index):
                continue
            first = index[id(parent[0])]
            if [index.get(id(m)) for m in parent] != list(range(first, first + len(parent))):
                continue
            out += [(name, {first + j: m for j, m in enumerate(mod)}) for name, mod in holder.named_children()
                    if isinstance(mod, torch.nn.ModuleList) and mod is not parent and len(mod) == len(parent)]
    return out


def _outside_decoder(model, within: bool = False):
    """A test of a module name: is it inside a pretrained model (transformers' PreTrainedModel) that is neither the
    model's decoder nor one of the decoder's parents (`within`: nor inside the decoder)? Nothing is, when the model
    names no decoder."""
    from transformers import PreTrainedModel

    base = model.get_base_model() if hasattr(model, "get_base_model") else model      # under peft: the model
    try:
        decoder = base.get_decoder()
    except Exception:           # noqa: BLE001 - a model without the accessor: no module is left out
        decoder = None
    modules = dict(model.named_modules())
    path = next((n for n, m in modules.items() if m is decoder), None) if decoder is not None else None
    # none, the causal LM itself (llama4's get_decoder returns self), or not a model at all: modernbert-decoder's
    # get_decoder finds its output head, a Linear named `decoder`, and its layers were left out with the rest
    if not path or decoder is base or not isinstance(decoder, PreTrainedModel):
        return lambda name: False
    others = {n for n, m in modules.items()
              if n and isinstance(m, PreTrainedModel) and not (path == n or path.startswith(n + "."))
              and not (within and n.startswith(path + "."))}

    def inside(name: str) -> bool:
        parts = name.split(".")
        return any(".".join(parts[:i]) in others for i in range(1, len(parts)))
    return inside

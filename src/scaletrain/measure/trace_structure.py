"""The traced model's structure, on the meta device: its layer kinds by signature, the prefix slice that holds one
of each, the lengths the slice is traced at, and peft's count of LoRA on it (measure/trace.py)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from scaletrain.engine.catalog.traced import LENGTHS_PER_GRANULE, MAX_GRANULE, granule
from scaletrain.measure.saved_activations import decoder_layers
from scaletrain.measure.trace_fit import TraceError

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
# A sliding window or attention chunk the planned sequences exceed is traced as this one, shorter than the traced
# lengths, so its masks and repeated k/v are in the fit.
WINDOWED_TRACE = 8
# The slice's vocabulary: prime, so no hidden, head or MLP width equals it and the vocabulary-wide tensors
# (logits, log-softmax) can be told apart by their last dimension.
SLICE_VOCAB = 509
# The most the slice's weights may take in the traced dtype on this CPU.
MAX_SLICE_BYTES = 4 << 30
ATTN_NAMES = ("self_attn", "attention", "attn", "self_attention", "mixer", "mamba", "linear_attn", "temporal_block")
MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe")
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "num_decoder_layers")   # the last two: an encoder-decoder family's decoder (prophetnet's), built alone as a causal LM
# attributes that number a layer rather than shape it (left out of the signature)
_NUMBERING = re.compile(r"idx|index|layer_id|layer_num|layer_no|block_id", re.I)


# ---- the model, on the meta device ----------------------------------------------------------------------------

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
    return model


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


def block_linears(layer) -> dict[str, list]:
    """name → [in, out, bias] of each nn.Linear in one block: the leaf name (what peft matches a target against
    by suffix), or the path within the block when two linears share a leaf name. Only modules that compute as
    nn.Linear does: a subclass with its own forward (an MoE router answering a tuple) is no LoRA target."""
    import torch

    # an nn.Linear subclass with its own forward (an MoE router that answers a tuple) is not a linear LoRA can wrap
    found = [(n, m) for n, m in layer.named_modules()
             if isinstance(m, torch.nn.Linear) and type(m).forward is torch.nn.Linear.forward]
    leaves = [n.rsplit(".", 1)[-1] for n, _ in found]
    out = {}
    for (path, mod), leaf in zip(found, leaves):
        # a leaf that is a position in a Sequential (ctrl's ffn.0, ffn.2) would name the decoder layers themselves
        # (model.h.0) to peft's suffix match: its path within the block names it alone
        key = leaf if leaves.count(leaf) == 1 and not leaf.isdigit() else path
        out[key] = [int(mod.in_features), int(mod.out_features), mod.bias is not None]
    return out


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


def _norm_modules(layer) -> int:
    """Modules of the block that own parameters and are not linears (its norms)."""
    import torch

    return sum(1 for _, m in layer.named_modules() if not isinstance(m, torch.nn.Linear)
               and any(True for _ in m.parameters(recurse=False)))


def _kinds(layers) -> tuple[list[dict], list[int], list[str]]:
    """The layers grouped by signature, in order of first appearance: (kinds, kind of each layer, signatures)."""
    sigs = [layer_signature(layer) for layer in layers]
    order: dict[str, int] = {}
    kinds: list[dict] = []
    for i, (sig, layer) in enumerate(zip(sigs, layers)):
        if sig not in order:
            order[sig] = len(kinds)
            params = list(layer.parameters())
            kinds.append({"first": i, "count": 0, "label": type(layer).__name__,
                          "params": sum(int(p.numel()) for p in params), "tensors": len(params),
                          "linears": block_linears(layer), "norms": _norm_modules(layer)})
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
    kinds, layer_kinds, sigs = _kinds(layers)
    linears: dict[str, list] = {}
    for k in kinds:
        for name, shape in k["linears"].items():
            linears.setdefault(name, shape)
    largest = max(kinds, key=lambda k: (k["params"], k["tensors"]))
    float_buf, other_buf, fixed_elems, fixed_bytes = _buffers(model, unique, config)
    head_w = getattr(head, "weight", None) if head is not None else None
    return {
        "params": int(sum(p.numel() for p in unique.values())),
        "largest_param": max((int(p.numel()) for p in unique.values()), default=0),
        "embedding_params": emb_params, "lm_head_params": head_params, "tied": bool(tied),
        "block_params": largest["params"], "block_tensors": largest["tensors"], "linears": linears,
        "block_norms": largest["norms"], "tensor_count": len(unique),
        "checkpointing": bool(getattr(model, "supports_gradient_checkpointing", False)),
        "buffer_float_elems": float_buf, "buffer_other_bytes": other_buf,
        "buffer_fixed_elems": fixed_elems, "buffer_fixed_bytes": fixed_bytes,
        # the logits' width: the config's vocabulary, or a head its class sizes its own way (unpadded_vocab_size)
        "head_out": int(head_w.shape[0]) if head_w is not None and head_w.dim() == 2 else None,
        "kinds": kinds, "layer_kinds": layer_kinds, "slice_layers": _slice_depth(config, sigs),
        "attn_implementations": [a for a, flag in (("eager", True), ("sdpa", "_supports_sdpa"),
                                                   ("flash", "_supports_flash_attn"))
                                 if flag is True or getattr(type(model), flag, False)],
        "sizes": config_sizes(model.config),
    }


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


# ---- the slice ------------------------------------------------------------------------------------------------
# a config whose class derives its depth from its list of layer types (transformers 5.24's NemotronHConfig writes
# layers_block_type and no num_hidden_layers)
LAYER_LIST_KEYS = ("layers_block_type",)


def _depth_key(config: dict) -> str:
    for key in DEPTH_KEYS:
        if isinstance(config.get(key), int) and not isinstance(config.get(key), bool):
            return key
    for key in LAYER_LIST_KEYS:
        if isinstance(config.get(key), list) and config[key]:
            return key
    raise TraceError("config.json names no number of layers (num_hidden_layers, or a layers_block_type list)")


def prefix_config(config: dict, n: int, whole: bool = False) -> dict:
    """The config of the first `n` layers: per-layer lists and strings cut to n, layer-numbered maps and index
    lists kept below n; the vocabulary small, special token ids moved inside it. `whole`: the slice is every layer
    the model builds, and its layers are kept as config.json writes them (dory's counts each layer's attention and
    mlp blocks as two of its num_hidden_layers, and its input/recurrent/output split must sum to that)."""
    cfg = dict(config)
    key = _depth_key(cfg)
    depth = len(cfg[key]) if key in LAYER_LIST_KEYS else cfg[key]
    for k, v in ({} if whole else config).items():
        if isinstance(v, (list, str)) and len(v) == depth and depth > 1 and k not in ("model_type",):
            cfg[k] = v[:n]
        elif isinstance(v, dict) and v and all(str(x).isdigit() for x in v) and "layer" in k:
            cfg[k] = {x: y for x, y in v.items() if int(x) < n}
        elif (isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
              and "layer" in k and max(v) < depth):
            cfg[k] = [x for x in v if x < n]
    if key not in LAYER_LIST_KEYS and not whole:      # a list of layer types is cut to n above
        cfg[key] = n
    for k, v in config.items():
        # marian's decoder_vocab_size (its logits' width) follows vocab_size; gemma3n's per-layer embedding has a row
        # per token id the slice's inputs can hold (262 144 rows kept it 512 MiB at the slice's two layers)
        if (k.endswith("vocab_size") and k != "vocab_size" and v == config.get("vocab_size")) or (
                k == "vocab_size_per_layer_input" and isinstance(v, int) and v > SLICE_VOCAB):
            cfg[k] = SLICE_VOCAB
    cfg["vocab_size"] = SLICE_VOCAB
    defaults = _class_defaults(str(cfg.get("model_type")))
    for k in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        v = cfg.get(k, defaults.get(k))     # a config.json without it gets its class's (Phi3Config: pad 32000)
        if isinstance(v, int) and v >= SLICE_VOCAB:
            cfg[k] = SLICE_VOCAB - 1
        elif isinstance(v, list):
            cfg[k] = [x if not isinstance(x, int) or x < SLICE_VOCAB else SLICE_VOCAB - 1 for x in v]
    return cfg


def _class_defaults(model_type: str) -> dict:
    """The special token ids transformers' config class gives a config.json that names none."""
    try:
        from transformers import AutoConfig

        conf = AutoConfig.for_model(model_type)
    except Exception:          # noqa: BLE001 - a model_type transformers refuses is refused where it is built
        return {}
    return {k: getattr(conf, k, None) for k in ("pad_token_id", "bos_token_id", "eos_token_id",
                                                 "decoder_start_token_id")}


def _slice_depth(config: dict, sigs: list[str]) -> int:
    """The shortest prefix holding every kind whose layers are signed as the real model's first layers."""
    depth = len(sigs)
    firsts = {}
    for i, s in enumerate(sigs):
        firsts.setdefault(s, i)
    n = max(max(firsts.values()) + 1, min(2, depth))
    while n < depth:
        try:
            got = [layer_signature(x) for x in decoder_layers(meta_model(prefix_config(config, n)))]
        except Exception:          # noqa: BLE001 - a prefix transformers refuses: try a longer one
            got = []
        if got == sigs[:n]:
            return n
        n += 1
    return depth


def slice_params(struct: dict) -> int:
    """Parameters of the slice a regime traces: its layers', each counted by its kind."""
    return sum(struct["kinds"][k]["params"] for k in struct["layer_kinds"][:struct["slice_layers"]])


def check_slice_size(struct: dict, precision: str, model_type: str) -> None:
    per = 4 if precision in ("fp32", "bf16") else 2
    n = struct["slice_layers"]
    kinds = struct["kinds"]
    need = per * slice_params(struct)
    if need > MAX_SLICE_BYTES:
        raise TraceError(f"the {n}-layer slice of {model_type} that holds each of its {len(kinds)} layer kinds is "
                         f"{need / 2**30:.1f} GiB in the traced dtype, over the {MAX_SLICE_BYTES >> 30} GiB a trace "
                         "may take on this CPU (no reduced-width trace is proven exact for it)")


def shrink_windows(cfg: dict, regime: dict) -> None:
    """A window or attention chunk shorter than the planned sequences: traced as one shorter than the traced ones.
    A window as long as the planned sequences at least is causal attention there: traced as one longer than the
    traced ones, so the fit never takes in a window the plan does not meet (lfm3's 256 against trace lengths up to
    256 + 63: its fit failed the check and lfm3 was refused; granite_swa's 128 at a planned 128 was 4 % over)."""
    window = cfg.get("sliding_window")
    if regime.get("windowed"):
        cfg["sliding_window"] = WINDOWED_TRACE
    elif isinstance(window, int) and not isinstance(window, bool) and window > 0:
        cfg["sliding_window"] = max(window, LENGTHS_PER_GRANULE * granule(cfg))
    if regime.get("chunked"):
        for k, v in list(cfg.items()):
            if "chunk" in k and isinstance(v, int) and v > MAX_GRANULE:
                cfg[k] = WINDOWED_TRACE


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

"""The slice a traced model is measured on: the first layers that hold one of each kind (a model of several stacks:
the first layers of each), its config (depth cut, vocabulary small, windows shrunk) and its size
(measure/trace_structure.py, measure/trace.py)."""

from __future__ import annotations

from typing import Any

from scaletrain.engine.catalog.traced import LENGTHS_PER_GRANULE, MAX_GRANULE, granule
from scaletrain.measure.frozen import FROZEN_STACK
from scaletrain.measure.saved_activations import decoder_layers
from scaletrain.measure.trace_fit import TraceError
from scaletrain.measure.trace_layers import layer_signature, layer_signatures, meta_model

# A sliding window or attention chunk the planned sequences exceed is traced as this one, shorter than the traced
# lengths, so its masks and repeated k/v are in the fit.
WINDOWED_TRACE = 8
# The slice's vocabulary: prime, so no hidden, head or MLP width equals it and the vocabulary-wide tensors
# (logits, log-softmax) can be told apart by their last dimension.
SLICE_VOCAB = 509
# The most the slice's weights may take in the traced dtype on this CPU.
MAX_SLICE_BYTES = 4 << 30
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "num_decoder_layers")   # the last two: an encoder-decoder family's decoder (prophetnet's), built alone as a causal LM
# a config whose class derives its depth from its list of layer types (transformers 5.24's NemotronHConfig writes
# layers_block_type and no num_hidden_layers)
LAYER_LIST_KEYS = ("layers_block_type",)


def depth_key(config: dict) -> str:
    for key in DEPTH_KEYS:
        if isinstance(config.get(key), int) and not isinstance(config.get(key), bool):
            return key
    for key in LAYER_LIST_KEYS:
        if isinstance(config.get(key), list) and config[key]:
            return key
    raise TraceError("config.json names no number of layers (num_hidden_layers, or a layers_block_type list)")


def has_depth(config: dict) -> bool:
    try:
        depth_key(config)
    except TraceError:
        return False
    return True


def prefix_config(config: dict, n: int, whole: bool = False) -> dict:
    """The config of the first `n` layers: per-layer lists and strings cut to n, layer-numbered maps and index
    lists kept below n; the vocabulary small, special token ids moved inside it. `whole`: the slice is every layer
    the model builds, and its layers are kept as config.json writes them (dory's counts each layer's attention and
    mlp blocks as two of its num_hidden_layers, and its input/recurrent/output split must sum to that)."""
    cfg = dict(config)
    # whole: a config whose depths are its stacks' own (blt's encoder_config, global_config, decoder_config) names
    # none at its top, and nothing is cut
    key = depth_key(cfg) if not whole or has_depth(cfg) else None
    depth = 0 if key is None else len(cfg[key]) if key in LAYER_LIST_KEYS else cfg[key]
    for k, v in ({} if whole else config).items():
        if isinstance(v, (list, str)) and len(v) == depth and depth > 1 and k not in ("model_type",):
            cfg[k] = v[:n]
        elif isinstance(v, dict) and v and all(str(x).isdigit() for x in v) and "layer" in k:
            cfg[k] = {x: y for x, y in v.items() if int(x) < n}
        elif (isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
              and "layer" in k and max(v) < depth):
            cfg[k] = [x for x in v if x < n]
    if key is not None and key not in LAYER_LIST_KEYS and not whole:      # a list of layer types is cut to n above
        cfg[key] = n
    for k, v in config.items():
        # marian's decoder_vocab_size (its logits' width) follows vocab_size; gemma3n's per-layer embedding has a row
        # per token id the slice's inputs can hold (262 144 rows kept it 512 MiB at the slice's two layers)
        if (k.endswith("vocab_size") and k != "vocab_size" and v == config.get("vocab_size")) or (
                k == "vocab_size_per_layer_input" and isinstance(v, int) and v > SLICE_VOCAB):
            cfg[k] = SLICE_VOCAB
        # a stack's own config with the model's vocabulary (blt's local encoder embeds the bytes its decoder predicts)
        elif isinstance(v, dict) and k.endswith("_config") and v.get("vocab_size") == config.get("vocab_size"):
            cfg[k] = {**v, "vocab_size": SLICE_VOCAB}
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


# a stack's own config holds its depth (blt's encoder_config, global_config, decoder_config, patcher_config); the
# slice of such a model keeps this many layers of each stack
STACK_SLICE_DEPTH = 2


def stacks_of(config: dict) -> dict[str, str]:
    """A config whose top names no depth and whose stacks' own configs do: {stack config key: its depth key}."""
    if has_depth(config):
        return {}
    out = {}
    for k, v in config.items():
        if isinstance(v, dict) and k.endswith("_config") and has_depth(v):
            key = depth_key(v)
            if key not in LAYER_LIST_KEYS:
                out[k] = key
    return out


def stacked_config(config: dict, struct: dict) -> dict:
    """The traced config: every layer as config.json writes it (a whole trace), or, for a model of several stacks,
    each stack cut to STACK_SLICE_DEPTH layers and the hash tables the ids are bucketed into (blt's
    encoder_hash_byte_group_vocab: 500 002 rows × 6 groups) no longer than the slice's vocabulary: a lookup saves
    its ids, not its table, and the table's gradient is the parameters' term."""
    cfg = prefix_config(config, len(struct["layer_kinds"]), whole=True)
    stacks = struct.get("slice_stacks") or {}
    for k, key in stacks.items():
        cfg[k] = {**cfg[k], key: min(int(cfg[k][key]), STACK_SLICE_DEPTH)}
    for name, v in config.items() if stacks else ():
        if name.endswith("_vocab") and isinstance(v, int) and not isinstance(v, bool) and v > SLICE_VOCAB:
            cfg[name] = SLICE_VOCAB
    return cfg


def _frozen_stack_keys(model, keys) -> set[str]:
    """The stacks (by config key) whose every layer list transformers built frozen (blt's entropy patcher): traced
    at their own depth. What they save lives to the step's end where a LoRA adapter in them keeps their graph (peft
    adapts the patcher's q_proj too), and is counted once, outside the layers."""
    import torch
    from transformers import PreTrainedModel

    out = set()
    for key in keys:
        conf = getattr(model.config, key, None)
        owner = next((m for m in model.modules() if isinstance(m, PreTrainedModel) and m.config is conf), None)
        lists = [m for m in owner.modules() if isinstance(m, torch.nn.ModuleList)] if owner is not None else []
        if lists and all(getattr(m, FROZEN_STACK, False) for m in lists if len(m)):
            out.add(key)
    return out


def slice_of(config: dict, sigs: list[str], model) -> dict[str, Any]:
    """`slice_layers`; for a model of several stacks, each stack's first layers (`slice_stacks`: stack config key
    → depth key; a frozen stack whole) and the kind of each of the slice's layers (`slice_kinds`), when they hold
    every kind."""
    stacks = stacks_of(config)
    frozen = _frozen_stack_keys(model, stacks)
    stacks = {k: v for k, v in stacks.items() if k not in frozen}
    if not stacks:
        return {"slice_layers": _slice_depth(config, sigs)}
    kinds = {s: k for k, s in enumerate(dict.fromkeys(sigs))}
    try:
        struct = {"layer_kinds": sigs, "slice_stacks": stacks}
        sliced = meta_model(stacked_config(config, struct))
        got = layer_signatures(sliced, decoder_layers(sliced), stacked=True)
    except Exception:          # noqa: BLE001 - a cut transformers refuses: the whole model
        got = []
    if not got or set(got) != set(sigs) or len(got) >= len(sigs):
        return {"slice_layers": len(sigs)}
    return {"slice_layers": len(got), "slice_stacks": stacks, "slice_kinds": [kinds[s] for s in got]}


def slice_kinds(struct: dict) -> list[int]:
    """The kind of each layer the slice traces: its own (a model of several stacks), or the real model's first."""
    return list(struct.get("slice_kinds") or struct["layer_kinds"][:struct["slice_layers"]])


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
    return sum(struct["kinds"][k]["params"] for k in slice_kinds(struct))


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

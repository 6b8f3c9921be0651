"""Tiny configs of every causal LM the installed transformers ships: the config class's own defaults, shrunk.

For the architecture sweep (bench/architecture_sweep.py) and the traced-path tests: cases nobody here designed. Each
config starts from `AutoConfig.for_model(model_type)` (the family's defaults: its layer pattern, MoE layout, mamba
or linear-attention settings), then every size field the families share a name for is shrunk (widths, heads,
experts, ranks, vocabulary), and per-layer lists whose length was the default depth are dropped (so the config
class derives them again for the new depth) or cut. Nothing here is per family but TRANSFORMERS_KEYS: the few
keys transformers itself sets (its model testers, its docs) where the class defaults build no model that trains.
A family whose defaults do not shrink this way is listed by the sweep with transformers' own error.
"""

from __future__ import annotations

from typing import Any

HIDDEN = 64
LAYERS = 6            # covers the layer patterns of the defaults: jamba's attention every 8th from 4, 3:1 hybrids,
#                       first-k-dense MoE stacks, gemma's 5:1 sliding pattern
VOCAB = 512
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
# name → the shrunk value (applied when the default is an int larger than it)
SIZES: dict[str, int] = {
    "hidden_size": HIDDEN, "d_model": HIDDEN, "n_embd": HIDDEN, "embed_dim": HIDDEN, "dim": HIDDEN,
    "intermediate_size": 128, "ffn_hidden_size": 128, "ffn_dim": 128, "n_inner": 128, "d_ff": 128,
    "moe_intermediate_size": 64, "expert_intermediate_size": 64, "shared_expert_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64,
    "shared_experts_intermediate_size": 64, "intermediate_size_mlp": 128, "dense_intermediate_size": 128,
    "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "n_heads": 4,
    "num_key_value_heads": 2, "num_kv_heads": 2, "n_kv_heads": 2, "multi_query_group_num": 2,
    "head_dim": 16, "attention_head_dim": 16,
    "num_hidden_layers": LAYERS, "n_layer": LAYERS, "num_layers": LAYERS, "n_layers": LAYERS,
    "vocab_size": VOCAB, "decoder_vocab_size": VOCAB, "vocab_size_per_layer_input": VOCAB,
    "num_experts": 8, "n_routed_experts": 8, "num_local_experts": 8, "moe_num_experts": 8, "num_experts_total": 8,
    "num_experts_per_tok": 2, "moe_topk": 2, "top_k": 2, "moe_k": 2, "num_selected_experts": 2,
    "n_shared_experts": 1, "num_shared_experts": 1, "moe_num_shared_experts": 1,
    "n_group": 1, "topk_group": 1,
    "q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
    "qk_head_dim": 32, "index_head_dim": 16, "index_n_heads": 2, "index_topk": 16,
    "mamba_d_state": 16, "ssm_state_size": 16, "state_size": 16, "d_state": 16, "mamba_n_heads": 4,
    "mamba_d_head": 32, "mamba_head_dim": 32, "mamba_d_ssm": 128, "mamba_n_groups": 1, "n_groups": 1,
    "mamba_dt_rank": 8,
    "time_step_rank": 8, "mamba_expand": 2, "expand": 2,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "max_position_embeddings": 4096, "n_positions": 4096,
    "num_nextn_predict_layers": 0, "first_k_dense_replace": 1,
}
# per-layer lists kept as the config class wrote them only when their length equals the depth
PER_LAYER_HINTS = ("layer", "block", "pattern", "types")


# How far the shrinking goes, tried in order until transformers builds the config and runs a forward of it: the
# plain shrink first (every family planned before keeps its config), then sizes the class left None (it needs them at
# build: dots1's experts, hunyuan's head_dim, deepseek_v2's top-k) filled, derived widths re-derived (rotary_dim
# within head_dim, a mamba mixer's heads × head width = expand × hidden) and sub-configs shrunk; then per-layer lists
# cut to the new depth rather than dropped (a class that does not derive them again: lfm2_moe); then the default
# depth kept with its lists (a class whose validators tie the depth to other fields: per_layer_config indices,
# gpt_neo's attention_types, dory's input/recurrent/output split).
RUNGS = ({}, {"fill": True}, {"fill": True, "cut": True}, {"fill": True, "keep_depth": True},
         # widths the class derived from its default width at full size, derived again from the shrunk one (zamba2's
         # attention over the concatenated embeddings, 2 × hidden; its mamba heads × head width), cut or deep
         {"fill": True, "cut": True, "derive": True}, {"fill": True, "keep_depth": True, "derive": True},
         # the class's own derivations: built from the shrunk sizes alone (gemma4_unified_assistant's layer types)
         {"fill": True, "from_class": True})
# A rung whose model would hold more parameters than this is not tiny: not built, the next rung tried. The sweep
# measures a full AdamW step of it (16 bytes a parameter, on a 24 GiB machine); the largest config it measured has
# 870 M (phi4_multimodal's towers). blt's plain shrink kept its sub-configs at full width: 1.56 B parameters, and
# building them to see ran the sweep out of memory.
MAX_TINY_PARAMETERS = 1_000_000_000


# Keys transformers itself sets (its model tester, huggingface/transformers tests/models/<family>/test_modeling_
# <family>.py, or its docs) where the config class's defaults build no model that trains, in transformers 5.24 as in
# the published checkpoints: dbrx reads attn_config.rope_theta, which DbrxAttentionConfig does not define, and clamps
# its q/k/v by clip_qkv, None by default (DbrxModelTester: clip_qkv 8, rope_theta 500000, databricks/dbrx's
# values); lfm2_moe indexes layer_types, None by default and derived from nothing (Lfm2MoeModelTester: full
# attention, then a short convolution); cohere_compass_text reads its rotary settings by layer type, and the
# default's are one flat set (CohereCompassTextModelTester: full attention's, theta 10 000). A tuple is a layer
# pattern, repeated over the default depth; a dict is merged into the default's. Applied before any shrinking.
TRANSFORMERS_KEYS: dict[str, dict[str, Any]] = {
    "dbrx": {"attn_config": {"clip_qkv": 8, "rope_theta": 500000}},
    "lfm2_moe": {"layer_types": ("full_attention", "conv")},
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000}}},
    # its sparse attention's indexer, every size None by default (Qwen4ExpTextModelTester's; the index head as wide
    # as the shrunk rotary width, which its validator asks for: the tester's rotary width is a quarter of its head)
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 4,
                       "indexer_compress_ratio": 2},
    # reformer's axial position embeddings train at one length only, prod(axial_pos_shape) (4096 by default):
    # transformers' docs (model_doc/reformer.md) turn them off to train at other lengths. Its LSH attention's
    # num_buckets, None by default, is set by transformers' first forward from that forward's length
    # (LSHSelfAttention._set_num_buckets: 2·S / lsh_attn_chunk_length, a power of 2): written here as that rule
    # gives it at the sweep's 128 tokens and chunk 64, as a trained checkpoint's config.json holds it
    "reformer": {"axial_pos_embds": False, "num_buckets": 4},
}


def config_dict(model_type: str) -> dict[str, Any]:
    """The shrunk config.json dict of `model_type`: the first rung of RUNGS that transformers builds and runs (the
    plain shrink, transformers' error to come, when none does; raises what transformers raises when its own
    defaults cannot be made)."""
    from transformers import AutoConfig

    base = _causal_lm_part(AutoConfig.for_model(model_type), model_type)
    d = base.to_dict()
    for key, value in TRANSFORMERS_KEYS.get(str(getattr(base, "model_type", "")) or model_type, {}).items():
        if isinstance(value, tuple):
            d[key] = [value[i % len(value)] for i in range(_depth(d))]
        elif isinstance(value, dict):
            d[key] = {**(d.get(key) or {}), **value}
        else:
            d[key] = value
    first = None
    for rung in RUNGS:
        out = _rung(base, d, model_type, rung)
        first = first or out
        if out is not None and meta_parameters(out) <= MAX_TINY_PARAMETERS and builds(out):
            return out
    return first


def _causal_lm_part(base: Any, model_type: str) -> Any:
    """The part of a composite config that the family's causal-LM class is built from: its text_config, or the
    sub-config of that class's own config type (musicgen's decoder, beside its text and audio encoders)."""
    text = getattr(base, "text_config", None)
    if text is not None and getattr(text, "model_type", None) and text is not base:
        return text
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    want = getattr(getattr(transformers, name, None), "config_class", None) if isinstance(name, str) else None
    if isinstance(want, type) and not isinstance(base, want):
        return next((v for v in vars(base).values() if isinstance(v, want)), base)
    return base


def _rung(base: Any, d: dict[str, Any], model_type: str, rung: dict[str, bool]) -> dict[str, Any] | None:
    """One rung's config dict of the config object `base` (its dict `d`); None when the class refuses the sizes."""
    if not rung.get("from_class"):
        return shrink(d, model_type, **rung)
    sizes = {k: _shrunk_size(k, v, False) for k, v in d.items() if k in SIZES}
    try:
        derived = type(base)(**{k: v for k, v in sizes.items() if v != d[k]}).to_dict()
    except Exception:          # noqa: BLE001 - the class's validators refuse these sizes: the next rung
        return None
    return shrink(derived, model_type, fill=True)


def shrink(d: dict[str, Any], model_type: str, fill: bool = False, cut: bool = False,
           keep_depth: bool = False, widths: frozenset[int] | None = None, derive: bool = False) -> dict[str, Any]:
    """One rung of the shrinking (RUNGS) of the config class's dict `d`; `widths`: every hidden width of the whole
    config tree (a sub-config names its neighbour's: blt's encoder_config.hidden_size_global is global_config's)."""
    depth = _depth(d)
    widths = _widths(d) if widths is None else widths
    out: dict[str, Any] = {}
    for key, value in d.items():
        if key.startswith("_") or key in ("transformers_version", "architectures", "auto_map", "torch_dtype", "dtype"):
            continue
        if keep_depth and key in DEPTH_KEYS:
            out[key] = value
            continue
        if key in SIZES and isinstance(value, list) and value and all(_ints(v) for v in value):
            value = [_shrunk_size(key, v, fill) for v in value]     # a width per layer (gemma3n's intermediate)
            out[key] = value if keep_depth or len(value) != depth else value[:LAYERS]
            continue
        if isinstance(value, (list, str)) and depth and len(value) == depth and any(h in key for h in PER_LAYER_HINTS):
            if keep_depth:
                out[key] = value
            elif cut and isinstance(value, list):
                out[key] = value[:LAYERS]
            continue        # derived again from the new depth
        if not keep_depth and depth and isinstance(value, dict) and value and all(
                str(k).isdigit() for k in value):      # a map by layer index (dots3's per_layer_config): below the new depth
            out[key] = {k: _shrunk_layer(v, fill) if derive else v for k, v in value.items() if int(k) < LAYERS}
            continue
        if fill and isinstance(value, dict) and _sub_config(value):
            value = shrink(value, model_type, fill=True, widths=widths)
        elif fill and isinstance(value, dict) and value and all(isinstance(v, dict) and _sub_config(v)
                                                                for v in value.values()):
            value = {k: shrink(v, model_type, fill=True, widths=widths)      # dots3's configs by layer type
                     for k, v in value.items()}
        out[key] = _shrunk_size(key, value, fill)
    out["model_type"] = d.get("model_type", model_type)
    _fix_heads(out)
    _same_width(out, d, widths)
    if fill:
        _derive_widths(out, d)
    if derive:
        _derive_multiples(out, d)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        v = out.get(key)
        if isinstance(v, int) and v >= VOCAB:
            out[key] = VOCAB - 1 - ("bos" in key)
        elif isinstance(v, list):
            out[key] = [x if not isinstance(x, int) or x < VOCAB else VOCAB - 1 for x in v]
    if "is_decoder" in out:          # encoder families that transformers also ships as causal LMs
        out["is_decoder"], out["add_cross_attention"] = True, False
    if out.get("default_language") is None and isinstance(out.get("languages"), list) and out["languages"]:
        out["default_language"] = out["languages"][0]   # xmod: what set_default_language() writes; none: no forward
    out["use_cache"] = False
    out["tie_word_embeddings"] = bool(out.get("tie_word_embeddings", False))
    return out


def _shrunk_layer(overrides: Any, fill: bool) -> Any:
    """One layer's overrides of a map by layer index, its sizes shrunk (dots3's 64 heads and kv_lora_rank 1024);
    key/value heads as many as the heads where they were (multi-head latent attention)."""
    if not isinstance(overrides, dict):
        return overrides
    out = {k: _shrunk_size(k, v, fill) for k, v in overrides.items()}
    if "num_key_value_heads" in out and overrides["num_key_value_heads"] == overrides.get("num_attention_heads"):
        out["num_key_value_heads"] = out["num_attention_heads"]
    return out


def _shrunk_size(key: str, value: Any, fill: bool) -> Any:
    if key not in SIZES:
        # a vocabulary under a name of its own (blt's hash n-gram embeddings, encoder_hash_byte_group_vocab 500 002
        # rows per group: the shrunk model kept 4.6 B parameters and its build ran the sweep out of memory)
        if key.endswith("_vocab") and _ints(value) and value > VOCAB:
            return VOCAB
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value > SIZES[key]:
        return SIZES[key]
    if value is None and fill and key not in ("num_key_value_heads", "head_dim"):
        return SIZES[key]
    return value


def _same_width(d: dict[str, Any], default: dict[str, Any], widths: frozenset[int]) -> None:
    """A width the class derives from its hidden size when the config leaves it None (rwkv's attention_hidden_size):
    to_dict() writes the derived full width, which the shrink left at 4096 beside a hidden size of 64 (a 2-layer
    trace of it outgrew 6 GiB). Shrunk with the hidden size, as a real checkpoint's config keeps them equal; so is a
    width that names another part's hidden size (blt's hidden_size_global: the global transformer's, 2048)."""
    wide, hidden = _width(default), _width(d)
    for key, v in default.items():
        if key in SIZES or not _ints(v, hidden):
            continue
        other = v in widths and v != wide        # another part's hidden size
        if key.endswith("_hidden_size") and (v == wide or other) or key.startswith("hidden_size_") and other:
            d[key] = hidden


def _widths(d: dict[str, Any]) -> frozenset[int]:
    """Every hidden width in a config dict and its sub-configs' dicts."""
    found = {w for w in (_width(d),) if w}
    for v in d.values():
        if isinstance(v, dict):
            found |= _widths(v)
    return frozenset(found)


def _width(d: dict[str, Any]) -> int | None:
    """The hidden width under the name the config class uses."""
    return next((d[k] for k in ("hidden_size", "n_embd", "d_model") if _ints(d.get(k))), None)


def _sub_config(v: dict[str, Any]) -> bool:
    """A nested config's dict (dbrx's ffn_config): it carries sizes the plain shrink would leave at full width."""
    return any(k in SIZES for k in v)


def _derive_widths(d: dict[str, Any], default: dict[str, Any]) -> None:
    """Widths the config class checks against others, derived again from the shrunk ones (`default`: the class's
    own values, whose relations hold)."""
    nope, rope = default.get("qk_nope_head_dim"), default.get("qk_rope_head_dim")
    if _ints(nope, rope, default.get("head_dim")) and default["head_dim"] == nope + rope:
        d["head_dim"] = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
    for key in ("n_group", "num_expert_group", "topk_group"):     # one group: top-k within a group fits its experts
        if _ints(d.get(key)):
            d[key] = 1
    heads = next((d[k] for k in ("num_attention_heads", "n_head", "n_heads") if _ints(d.get(k))), None)
    hidden = _width(d)
    if "head_dim" in d and d["head_dim"] is None and _ints(heads, hidden):
        d["head_dim"] = hidden // heads
    wide = _width(default)
    if _ints(d.get("embedding_dim"), wide, hidden) and default["embedding_dim"] == wide:
        d["embedding_dim"] = hidden             # the width under a second name (xlstm's embedding_dim)
    old_heads = next((default[k] for k in ("num_attention_heads", "n_head", "n_heads") if _ints(default.get(k))), None)
    if _ints(d.get("d_head"), wide, old_heads, heads, hidden) and default["d_head"] == wide // old_heads:
        d["d_head"] = hidden // heads           # xlnet's d_head = d_model // n_head, as its validator demands
    if "num_key_value_heads" in d and d["num_key_value_heads"] is None and _ints(d.get("num_attention_heads")):
        d["num_key_value_heads"] = d["num_attention_heads"]     # None read as every head its own (nemotron's class)
    head_dim = d.get("head_dim") or (hidden // heads if _ints(heads, hidden) else None)
    if _ints(d.get("rotary_dim"), head_dim) and d["rotary_dim"] > head_dim:
        d["rotary_dim"] = head_dim
    for n_key, dim_key, expand_key in (("num_heads", "head_dim", "expand"),
                                       ("mamba_n_heads", "mamba_d_head", "mamba_expand")):
        n, expand = d.get(n_key), d.get(expand_key)
        if _ints(n, expand, hidden, d.get(dim_key)) and n * d[dim_key] != hidden * expand:
            d[dim_key] = hidden * expand // n
    if _ints(d.get("mamba_d_ssm"), d.get("mamba_expand"), hidden):
        d["mamba_d_ssm"] = hidden * d["mamba_expand"]


def _derive_multiples(d: dict[str, Any], default: dict[str, Any]) -> None:
    """Widths the class derived from its default width and heads, at their relation to the shrunk ones: a width m
    times the hidden size (zamba's attention_hidden_size, 2 ×), a head width m × hidden / heads (its
    attention_head_dim, kv_channels), a group count equal to the heads (num_query_groups), parts that sum to the width
    (reformer's axial position embeddings) and zamba's mamba head width (n_mamba_heads × mamba_headdim =
    mamba_expand × hidden). That last relation is _derive_widths' kind, kept here: there, the fill + cut rung would
    build zamba2 with its attention still 5120 wide beside a hidden size of 64."""
    wide, hidden = _width(default), _width(d)
    old_heads = next((default[k] for k in ("num_attention_heads", "n_head", "n_heads") if _ints(default.get(k))), None)
    heads = next((d[k] for k in ("num_attention_heads", "n_head", "n_heads") if _ints(d.get(k))), None)
    if not _ints(wide, hidden, old_heads, heads):
        return
    for key, v in default.items():
        if not _ints(v) or key in ("num_attention_heads", "n_head", "n_heads") or any(
                k in key for k in ("layer", "vocab", "position", "experts", "rank", "state", "conv")):
            continue
        for m in (1, 2, 4):
            if "hidden_size" in key and m > 1 and v == m * wide:
                d[key] = m * hidden
            elif key.endswith(("head_dim", "headdim", "channels")) and v * old_heads == m * wide:
                d[key] = m * hidden // heads
        if key.endswith("groups") and v == old_heads and old_heads > 1:
            d[key] = heads
    for key, v in default.items():      # parts of the width in a list
        parts = isinstance(v, (list, tuple)) and len(v) > 1 and all(_ints(x) for x in v)
        if parts and sum(v) == wide and wide % hidden == 0:
            d[key] = [x * hidden // wide for x in v]
    for key, layers in default.items():   # a head width that is some layers' nope + rope (dots3's sliding layers)
        by_index = isinstance(layers, dict) and layers and all(str(k).isdigit() for k in layers)
        if by_index and all(isinstance(v, dict) for v in layers.values()):
            for i, o in layers.items():
                nope, rope = o.get("qk_nope_head_dim"), default.get("qk_rope_head_dim")
                if _ints(nope, rope, default.get("head_dim")) and nope + rope == default["head_dim"] and i in d[key]:
                    d["head_dim"] = d[key][i]["qk_nope_head_dim"] + d["qk_rope_head_dim"]
    n, expand = d.get("n_mamba_heads"), d.get("mamba_expand")
    if _ints(n, expand, d.get("mamba_headdim")):
        d["mamba_headdim"] = hidden * expand // n


def _ints(*vs: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in vs)


def meta_parameters(cfg: dict[str, Any]) -> int:
    """Parameters of `cfg` built on the meta device (no memory, no init); 0 when that build fails (`build_error`
    says why)."""
    import warnings

    from scaletrain.measure.trace_structure import meta_model

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = meta_model(cfg)
    except Exception:          # noqa: BLE001 - the real build reports it
        return 0
    return sum(p.numel() for p in model.parameters())


def builds(cfg: dict[str, Any]) -> bool:
    """Whether transformers builds `cfg` as a causal LM on the CPU and runs a short forward of it."""
    return build_error(cfg) is None


def build_error(cfg: dict[str, Any]) -> str | None:
    """transformers' own error, in one line, when it does not build `cfg` as a causal LM on the CPU or run a short
    forward of it; None when it does."""
    import warnings

    import torch

    from scaletrain.trainer import model as model_lib

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = model_lib.random_init(cfg, "eager", device=None)
            with torch.no_grad():
                model(input_ids=torch.arange(16).unsqueeze(0) % VOCAB)
    except Exception as e:     # noqa: BLE001 - the next rung, or the sweep's row: transformers' own refusal
        return (" ".join(str(e).split()) or type(e).__name__)[:300]
    return None


def _depth(d: dict[str, Any]) -> int:
    for key in DEPTH_KEYS:
        v = d.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return 0


def _fix_heads(d: dict[str, Any]) -> None:
    """Heads that divide the shrunk width; key/value heads that divide the heads."""
    heads = d.get("num_attention_heads")
    kv = d.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and kv and heads % kv:
        d["num_key_value_heads"] = 1
    if d.get("kv_lora_rank") and isinstance(heads, int):
        d["num_key_value_heads"] = heads      # multi-head latent attention: every head has its own key and value
    if isinstance(heads, int) and heads and d.get("head_dim") is None:
        h = d.get("hidden_size")
        if isinstance(h, int) and h % heads:
            d["num_attention_heads"] = 4
    width = d.get("d_model")
    for key in ("decoder_attention_heads", "encoder_attention_heads"):    # bart-style decoders (plbart's 12)
        if _ints(width, d.get(key)) and width % d[key]:
            d[key] = 4

"""Tiny configs of every causal LM the installed transformers ships: the config class's own defaults, shrunk.

For the architecture sweep (bench/architecture_sweep.py) and the traced-path tests: cases nobody here designed. Each
config starts from `AutoConfig.for_model(model_type)` (the family's defaults: its layer pattern, MoE layout, mamba
or linear-attention settings), then every size field the families share a name for is shrunk (widths, heads,
experts, ranks, vocabulary), and per-layer lists whose length was the default depth are dropped (so the config
class derives them again for the new depth) or cut. Nothing here is per family: a family whose defaults do not
shrink this way is listed by the sweep with transformers' own error.
"""

from __future__ import annotations

from typing import Any

HIDDEN = 64
LAYERS = 6            # covers the layer patterns of the defaults: jamba's attention every 8th from 4, 3:1 hybrids,
#                       first-k-dense MoE stacks, gemma's 5:1 sliding pattern
VOCAB = 512
# name → the shrunk value (applied when the default is an int larger than it)
SIZES: dict[str, int] = {
    "hidden_size": HIDDEN, "d_model": HIDDEN, "n_embd": HIDDEN, "embed_dim": HIDDEN, "dim": HIDDEN,
    "intermediate_size": 128, "ffn_hidden_size": 128, "ffn_dim": 128, "n_inner": 128, "d_ff": 128,
    "moe_intermediate_size": 64, "expert_intermediate_size": 64, "shared_expert_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64, "intermediate_size_mlp": 128, "dense_intermediate_size": 128,
    "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "n_heads": 4,
    "num_key_value_heads": 2, "num_kv_heads": 2, "n_kv_heads": 2, "multi_query_group_num": 2,
    "head_dim": 16, "attention_head_dim": 16,
    "num_hidden_layers": LAYERS, "n_layer": LAYERS, "num_layers": LAYERS, "n_layers": LAYERS,
    "vocab_size": VOCAB,
    "num_experts": 8, "n_routed_experts": 8, "num_local_experts": 8, "moe_num_experts": 8, "num_experts_total": 8,
    "num_experts_per_tok": 2, "moe_topk": 2, "top_k": 2, "moe_k": 2, "num_selected_experts": 2,
    "n_shared_experts": 1, "num_shared_experts": 1, "moe_num_shared_experts": 1,
    "n_group": 1, "topk_group": 1,
    "q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
    "qk_head_dim": 32, "index_head_dim": 16, "index_n_heads": 2, "index_topk": 16,
    "mamba_d_state": 16, "ssm_state_size": 16, "state_size": 16, "d_state": 16, "mamba_n_heads": 4,
    "mamba_d_head": 32, "mamba_head_dim": 32, "mamba_n_groups": 1, "n_groups": 1, "mamba_dt_rank": 8,
    "time_step_rank": 8, "mamba_expand": 2, "expand": 2,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "max_position_embeddings": 4096, "n_positions": 4096,
    "num_nextn_predict_layers": 0, "first_k_dense_replace": 1,
}
# per-layer lists kept as the config class wrote them only when their length equals the depth
PER_LAYER_HINTS = ("layer", "block", "pattern", "types")


def config_dict(model_type: str) -> dict[str, Any]:
    """The shrunk config.json dict of `model_type` (raises what transformers raises when it cannot be made)."""
    from transformers import AutoConfig

    base = AutoConfig.for_model(model_type)
    text = getattr(base, "text_config", None)
    if text is not None and getattr(text, "model_type", None) and text is not base:
        base = text
    d = base.to_dict()
    depth = _depth(d)
    out: dict[str, Any] = {}
    for key, value in d.items():
        if key.startswith("_") or key in ("transformers_version", "architectures", "auto_map", "torch_dtype", "dtype"):
            continue
        if isinstance(value, (list, str)) and depth and len(value) == depth and any(h in key for h in PER_LAYER_HINTS):
            continue        # derived again from the new depth (or cut below when the class needs it)
        if isinstance(value, int) and not isinstance(value, bool) and key in SIZES and value > SIZES[key]:
            value = SIZES[key]
        out[key] = value
    out["model_type"] = d.get("model_type", model_type)
    _fix_heads(out)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        v = out.get(key)
        if isinstance(v, int) and v >= VOCAB:
            out[key] = VOCAB - 1 - ("bos" in key)
        elif isinstance(v, list):
            out[key] = [x if not isinstance(x, int) or x < VOCAB else VOCAB - 1 for x in v]
    if "is_decoder" in out:          # encoder families that transformers also ships as causal LMs
        out["is_decoder"], out["add_cross_attention"] = True, False
    out["use_cache"] = False
    out["tie_word_embeddings"] = bool(out.get("tie_word_embeddings", False))
    return out


def _depth(d: dict[str, Any]) -> int:
    for key in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
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

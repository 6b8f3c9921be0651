"""Reading a config.json: the causal LM's part of a (multimodal) config, size fields checked against sane limits,
the file read with one line for every way it can be wrong, and the HF cache looked up without the network."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import read_text_bounded


def text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Multimodal configs (Gemma 3) keep the language model under text_config."""
    cfg = dict(cfg)
    if "text_config" in cfg and isinstance(cfg["text_config"], dict) and "hidden_size" not in cfg:
        text = dict(cfg["text_config"])
        text.setdefault("model_type", str(cfg.get("model_type", "")) + "_text")
        text.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", True))
        return text
    return cfg


REQUIRED_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# Sanity limits on config.json sizes: every released causal LM is far inside them, and a value outside is a typo or
# a damaged file that would otherwise surface as a ZeroDivisionError, an OverflowError or a minutes-long search.
SIZE_LIMITS = {"hidden_size": 1 << 18, "intermediate_size": 1 << 20, "num_hidden_layers": 4096,
               "num_attention_heads": 1 << 12, "num_key_value_heads": 1 << 12, "head_dim": 1 << 14,
               "vocab_size": 1 << 24}
MAX_CONFIG_BYTES = 16 << 20           # a config.json is a few KiB; anything this large is not one
MAX_SPEC_CHARS = 4096                 # PATH_MAX: no catalog id, path or cache id is longer


def size_field(cfg: Mapping[str, Any], key: str, name: str, default: int | None = None) -> int:
    """A positive whole-number size field of config.json (an integral float such as 4096.0 is accepted)."""
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise ScaletrainError(f"{name}: config.json has no {key}")
        return default
    ok = isinstance(v, int) and not isinstance(v, bool)
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v, ok = int(v), True
    limit = SIZE_LIMITS[key]
    if not ok or not 1 <= v <= limit:
        raise ScaletrainError(f"{name}: config.json {key} must be a whole number from 1 to {limit:,} "
                              f"(got {short(cfg.get(key))})")
    return v


def widest_layer(cfg: dict[str, Any]) -> dict[str, Any]:
    """A traced family's per-layer width list (gemma3n's intermediate_size, one per layer) read as its widest layer:
    the trace counts each layer's own parameters; the one number stands for the stack where a width is asked."""
    v = cfg.get("intermediate_size")
    if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
        return {**cfg, "intermediate_size": max(v)}
    return cfg


def short(v: Any, limit: int = 40) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + "…"


def hf_cache_config(model_id: str) -> Path | None:
    """<cache>/models--org--name/snapshots/<rev>/config.json without touching the network (catalog/hub.py)."""
    from scaletrain.engine.catalog.hub import cached_file

    return cached_file(model_id)


def read_config(path: Path, spec: str) -> dict[str, Any]:
    """A config.json as a dict, or one line saying why not (unreadable, too large, not JSON, not an object)."""
    try:
        cfg = json.loads(read_text_bounded(path, MAX_CONFIG_BYTES, "config.json" if str(path) == spec
                                           else f"{spec}:"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else e.__class__.__name__
        where = spec if str(path) == spec else f"{spec} ({path})"
        raise ScaletrainError(f"{where} is not a JSON config.json ({why})") from None
    if not isinstance(cfg, dict):
        raise ScaletrainError(f"{spec} is not a config.json object" if str(path) == spec
                              else f"{spec} ({path}) is not a config.json object")
    check_field_types(cfg, spec)
    if isinstance(cfg.get("text_config"), dict):
        check_field_types(cfg["text_config"], spec)
    return cfg


# Optional config.json fields the planner reads, by the type transformers gives them (null: unset). A value of
# another type (a dict as sliding_window) is refused here, in one line, not met later as a TypeError.
WHOLE_KEYS = ("sliding_window", "max_window_layers", "head_dim", "decoder_sparse_step", "num_experts",
              "num_local_experts", "num_experts_per_tok", "num_experts_per_token")
REAL_KEYS = ("final_logit_softcapping", "attn_logit_softcapping", "rope_theta", "rms_norm_eps")
BOOL_KEYS = ("tie_word_embeddings", "use_sliding_window", "attention_bias", "mlp_bias",
             "output_router_logits")
LIST_KEYS = {"layer_types": str, "mlp_only_layers": int, "architectures": str}


def _whole(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool) and v >= 0) or (
        isinstance(v, float) and math.isfinite(v) and v.is_integer() and v >= 0)


def check_field_types(cfg: Mapping[str, Any], spec: str) -> None:
    """One line for an optional field of the wrong type (whole numbers, finite numbers, booleans, lists)."""
    def bad(key: str, want: str) -> ScaletrainError:
        return ScaletrainError(f"{spec}: config.json's {key} is {short(cfg[key])}; it must be {want} (or null)")

    for key in WHOLE_KEYS:
        if cfg.get(key) is not None and not _whole(cfg[key]):
            raise bad(key, "a whole number ≥ 0")
    for key in REAL_KEYS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise bad(key, "a finite number")
    for key in BOOL_KEYS:
        if cfg.get(key) is not None and not isinstance(cfg[key], bool):
            raise bad(key, "true or false")
    for key, kind in LIST_KEYS.items():
        v = cfg.get(key)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, kind) and not isinstance(x, bool)
                                                              for x in v)):
            raise bad(key, f"a list of {'text' if kind is str else 'whole numbers'}")
    if cfg.get("model_type") is not None and not isinstance(cfg["model_type"], str):
        raise bad("model_type", "text")

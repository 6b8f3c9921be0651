"""Which decoder layers of an analytic family attend through a sliding window, and how wide it is: every spelling the
families' config classes read, derived as transformers 5.24 derives them (models/<family>/configuration_<family>.py
`__post_init__`, and what modeling_<family>.py gives each attention module and mask). A config.json leaves most of
these out, so the config class's own defaults decide, not the absence of a key:

  mistral, mixtral     `sliding_window` (Mistral defaults it to 4096, Mixtral to None): every layer, one mask
                       (modeling: create_sliding_window_causal_mask whenever config.sliding_window is set)
  qwen2, qwen3         `use_sliding_window` (False) gates `sliding_window` (4096); `layer_types`, or the layers from
                       `max_window_layers` (28) on slide
  qwen3_moe            `use_sliding_window` gates `sliding_window`; every layer (no layer_types)
  qwen2_moe            `use_sliding_window` gates `sliding_window`; `layer_types`, or the even-indexed layers below
                       `max_window_layers` slide
  gemma2, gpt_oss      `layer_types`, or every other layer from the first (sliding, full, sliding, ...);
                       `sliding_window` defaults to 4096 (gemma2) and 128 (gpt_oss)
  gemma3_text          `layer_types`, or the pattern `sliding_window_pattern` (6: five sliding then one full; the
                       hub's configs still write it). `_sliding_window_pattern` in a config.json is overwritten by
                       the class (it reads only `sliding_window_pattern`); `use_bidirectional_attention` narrows the
                       window to sliding_window // 2 + 1
  llama, olmo2, olmoe  no window (olmoe passes a stray `sliding_window` to attention, but masks causally only)

tests/engine/test_layer_types.py builds each spelling with AutoConfig.for_model and compares.
"""

from __future__ import annotations

from typing import Any, Mapping

SLIDING = "sliding_attention"
FULL = "full_attention"

# the config classes' defaults for the keys a config.json may leave out (transformers 5.24)
_WINDOW_DEFAULT = {"mistral": 4096, "qwen2": 4096, "qwen3": 4096, "qwen3_moe": 4096, "qwen2_moe": 4096,
                   "gemma2": 4096, "gemma3_text": 4096, "gpt_oss": 128}
_MAX_WINDOW_LAYERS_DEFAULT = 28
_GEMMA3_PATTERN_DEFAULT = 6
_NO_WINDOW = frozenset({"llama", "olmo2", "olmoe"})


def sliding_window(config: Mapping[str, Any], model_type: str) -> int | None:
    """The window the sliding layers use (tokens), or None when no layer slides."""
    if model_type in _NO_WINDOW:
        return None
    window = config.get("sliding_window", _WINDOW_DEFAULT.get(model_type))
    if model_type in ("qwen2", "qwen3", "qwen3_moe", "qwen2_moe") and not config.get("use_sliding_window", False):
        return None
    if model_type == "gemma3_text" and window and config.get("use_bidirectional_attention"):
        window = window // 2 + 1
    return int(window) if window else None


def layer_types(config: Mapping[str, Any], model_type: str, num_layers: int) -> tuple[str, ...]:
    """Each layer's attention kind, as transformers' config class derives it (module doc)."""
    given = config.get("layer_types")
    window = sliding_window(config, model_type)
    if model_type in _NO_WINDOW:
        return (FULL,) * num_layers
    if model_type in ("mistral", "mixtral", "qwen3_moe"):   # no per-layer list: the one window applies everywhere
        return ((SLIDING,) if window else (FULL,)) * num_layers
    if given:
        return tuple(given)
    if model_type in ("qwen2", "qwen3"):
        first = int(config.get("max_window_layers", _MAX_WINDOW_LAYERS_DEFAULT))
        return tuple(SLIDING if window is not None and i >= first else FULL for i in range(num_layers))
    if model_type == "qwen2_moe":
        last = int(config.get("max_window_layers", _MAX_WINDOW_LAYERS_DEFAULT))
        on = bool(config.get("use_sliding_window", False))
        return tuple(SLIDING if (i + 1) % 2 and i < last and on else FULL for i in range(num_layers))
    if model_type == "gemma3_text":
        pattern = int(config.get("sliding_window_pattern", _GEMMA3_PATTERN_DEFAULT))
        return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(num_layers))
    if model_type in ("gemma2", "gpt_oss"):
        return tuple(SLIDING if (i + 1) % 2 else FULL for i in range(num_layers))
    return (FULL,) * num_layers


def windowed_layers(config: Mapping[str, Any], model_type: str, num_layers: int, seq_len: int) -> int:
    """Layers whose window the sequence reaches: transformers builds their explicit mask from a sequence as long as
    the window on (masking_utils._ignore_causal_mask_sdpa: kv_length >= local_attention_size, though at equal
    lengths the window masks nothing; tiny-mistral's LoRA at 512 tokens with its 512-token window was planned 8.7 %
    under when equal lengths were taken for no mask); shorter sequences run sdpa's is_causal."""
    window = sliding_window(config, model_type)
    if not window or seq_len < window:
        return 0
    return sum(1 for kind in layer_types(config, model_type, num_layers) if kind == SLIDING)

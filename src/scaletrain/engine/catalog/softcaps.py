"""The caps a model puts on its attention scores and its logits, tanh(x / cap) · cap, as transformers reads them:
config.json's value, or the config class's default where config.json leaves it out. tanh keeps its output for
backward (engine/estimate/activations.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the config classes' defaults (transformers 5.24): Gemma2Config caps both
_DEFAULTS = {"gemma2": {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}}


def attn_softcap(config: Mapping[str, Any], model_type: str) -> float | None:
    """The cap eager attention puts on its scores (attn_logit_softcapping); sdpa and flash kernels have none."""
    return _cap(config, model_type, "attn_logit_softcapping")


def final_softcap(config: Mapping[str, Any], model_type: str) -> float | None:
    """The cap on the output logits (final_logit_softcapping)."""
    return _cap(config, model_type, "final_logit_softcapping")


def _cap(config: Mapping[str, Any], model_type: str, key: str) -> float | None:
    return config.get(key, _DEFAULTS.get(model_type, {}).get(key))

"""Which layers slide, and how wide their window is (engine/catalog/layer_types.py), against transformers itself: for
every spelling the analytic families' config classes read, the config is built with AutoConfig.for_model and the
model on the meta device, and each layer's window is read where modeling_<family>.py reads it (the attention
module's `sliding_window`; else the mask of the layer's entry in config.layer_types (qwen2_moe); else the config's,
which Mistral/Mixtral pass at call time and whose presence picks their sliding mask)."""

from __future__ import annotations

import warnings

import pytest

from scaletrain.engine.catalog.architectures import arch_from_config
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.catalog.layer_types import SLIDING, layer_types, sliding_window, windowed_layers
from scaletrain.engine.estimate.activations import sliding_layers
from scaletrain.engine.estimate.setup import TrainingSetup

_SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_ALT4 = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]

SPELLINGS = [
    # Gemma 3: the hub's `sliding_window_pattern`, its default (6), an explicit list, and `_sliding_window_pattern`
    # (which the class overwrites: the pattern stays 6)
    ("gemma3_text", dict(num_hidden_layers=12, sliding_window=64, sliding_window_pattern=6)),
    ("gemma3_text", dict(num_hidden_layers=6, sliding_window=64, sliding_window_pattern=2)),
    ("gemma3_text", dict(num_hidden_layers=8, sliding_window=64)),
    ("gemma3_text", dict(num_hidden_layers=8, sliding_window=64, _sliding_window_pattern=3)),
    ("gemma3_text", dict(num_hidden_layers=4, sliding_window=64, layer_types=_ALT4, sliding_window_pattern=6)),
    ("gemma3_text", dict(num_hidden_layers=6, sliding_window=64, use_bidirectional_attention=True)),
    ("gemma2", dict(num_hidden_layers=4, sliding_window=64)),
    ("gemma2", dict(num_hidden_layers=4, sliding_window=64, layer_types=_ALT4)),
    ("gpt_oss", dict(num_hidden_layers=4, num_local_experts=4, num_experts_per_tok=2)),
    ("gpt_oss", dict(num_hidden_layers=4, num_local_experts=4, num_experts_per_tok=2, sliding_window=32,
                     layer_types=_ALT4)),
    # Qwen: `use_sliding_window` gates the window; `max_window_layers` says from which layer on (qwen2/qwen3) or
    # below which the even layers (qwen2_moe) slide; the default window (4096) when config.json omits it
    ("qwen2", dict(num_hidden_layers=4, use_sliding_window=True, sliding_window=64, max_window_layers=2)),
    ("qwen2", dict(num_hidden_layers=4, use_sliding_window=False, sliding_window=64, max_window_layers=2)),
    ("qwen2", dict(num_hidden_layers=4, use_sliding_window=True, max_window_layers=1)),
    ("qwen2", dict(num_hidden_layers=4, use_sliding_window=True, sliding_window=64, layer_types=_ALT4)),
    ("qwen3", dict(num_hidden_layers=4, use_sliding_window=True, sliding_window=64, max_window_layers=3)),
    ("qwen3", dict(num_hidden_layers=4, sliding_window=64)),
    ("qwen2_moe", dict(num_hidden_layers=4, use_sliding_window=True, sliding_window=64, max_window_layers=3,
                       shared_expert_intermediate_size=32, **_MOE)),
    ("qwen2_moe", dict(num_hidden_layers=4, sliding_window=64, shared_expert_intermediate_size=32, **_MOE)),
    ("qwen3_moe", dict(num_hidden_layers=2, use_sliding_window=True, sliding_window=64, **_MOE)),
    ("qwen3_moe", dict(num_hidden_layers=2, sliding_window=64, **_MOE)),
    # Mistral defaults its window to 4096 when config.json omits it; Mixtral to none
    ("mistral", dict(num_hidden_layers=2)),
    ("mistral", dict(num_hidden_layers=2, sliding_window=None)),
    ("mistral", dict(num_hidden_layers=2, sliding_window=64)),
    ("mixtral", dict(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2)),
    ("mixtral", dict(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=64)),
    ("llama", dict(num_hidden_layers=2)),
    ("olmo2", dict(num_hidden_layers=2)),
]


def _transformers_windows(model_type: str, kw: dict) -> tuple[list, list | None]:
    """Each layer's window as the built model uses it (None: full attention), and config.layer_types."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = AutoConfig.for_model(model_type, **_SMALL, **kw)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    types = getattr(cfg, "layer_types", None)
    out = []
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        if hasattr(attn, "sliding_window"):
            window = attn.sliding_window
        elif types is not None:   # qwen2_moe: no attribute on full layers, the mask picked by layer_types[i]
            window = cfg.sliding_window if types[i] == SLIDING else None
        else:                     # mistral, mixtral: config.sliding_window at call time and for the mask
            window = getattr(cfg, "sliding_window", None)
        out.append(window or None)
    return out, types


@pytest.mark.parametrize("model_type,kw", SPELLINGS, ids=[f"{t}-{i}" for i, (t, _) in enumerate(SPELLINGS)])
def test_each_spelling_slides_the_layers_transformers_slides(model_type, kw):
    theirs, their_types = _transformers_windows(model_type, kw)
    n = kw["num_hidden_layers"]
    window = sliding_window(kw, model_type)
    ours = [window if kind == SLIDING else None for kind in layer_types(kw, model_type, n)]
    assert ours == theirs
    if their_types is not None and model_type not in ("mistral", "mixtral", "qwen3_moe"):
        assert list(layer_types(kw, model_type, n)) == list(their_types)


def test_the_plan_counts_the_windowed_layers_of_gemma3s_hub_pattern():
    """google/gemma-3-*'s config.json writes `sliding_window_pattern: 6` and no layer_types: five of every six layers
    are windowed once the sequence reaches the window, none when it is shorter."""
    cfg = dict(model_type="gemma3_text", hidden_size=64, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, vocab_size=128, num_hidden_layers=12, sliding_window=64,
               sliding_window_pattern=6)
    model = arch_from_config(cfg, "test/gemma3-pattern")

    def setup(seq_len):
        return TrainingSetup(model=model, hardware=parse_gpus("1xCPU"), strategy="ddp", precision="fp32",
                             micro_batch=1, seq_len=seq_len, device="cpu")

    assert sliding_layers(setup(128)) == 10
    assert sliding_layers(setup(64)) == 10
    assert sliding_layers(setup(63)) == 0
    assert windowed_layers(cfg, "gemma3_text", 12, 128) == 10


@pytest.mark.parametrize("seq_len", [255, 256, 257, 512])
def test_a_layer_is_windowed_exactly_where_transformers_builds_its_sdpa_mask(seq_len):
    """transformers skips the mask (sdpa's is_causal) only while the sequence is shorter than the window; at equal
    lengths it builds one though the window masks nothing there (masking_utils._ignore_causal_mask_sdpa)."""
    from transformers.masking_utils import _ignore_causal_mask_sdpa

    cfg = dict(model_type="mistral", sliding_window=256)
    builds_mask = not _ignore_causal_mask_sdpa(None, seq_len, seq_len, 0, 0, local_attention_size=256)
    assert (windowed_layers(cfg, "mistral", 4, seq_len) == 4) == builds_mask

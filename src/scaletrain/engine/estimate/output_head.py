"""The output head's weight as the model holds it: what lm_head reads and its backward's gradients are sized by."""

from __future__ import annotations

from typing import Any


def head_weight(m: Any) -> tuple[int, int]:
    """The output head's weight as (parameters, input width): V×h, or a traced model's own from its module tree
    (OPT's lm_head reads word_embed_proj_dim: its tiny config ties a V×768 embedding to a model of h=64, and the
    head's backward holds a V×768 weight gradient beside a B·S·768 input gradient; torch.profiler at the peak)."""
    V, h = m.vocab_size, m.hidden_size
    if m.trace is None or not m.vocab_head:
        return V * h, h
    params = m.embedding_params if m.trace.get("tied", m.tie_embeddings) else m.lm_head_params
    out = int(m.trace.get("head_out") or V)
    if not params or params % out:
        return V * h, h
    return params, params // out


def head_input_width(m: Any) -> int:
    """The width of what lm_head reads (the final hidden states, or OPT's projection of them)."""
    return head_weight(m)[1]

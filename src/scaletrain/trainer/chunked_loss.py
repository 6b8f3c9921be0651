"""`--loss chunked`: the causal-LM loss from the final hidden states, never materialising B·S·V logits.

    causal_lm_loss(model, batch, head, compute_dtype)   the model's forward with lm_head passed through (its
                                  output is the final hidden states), then the loss over chunks of token rows
    chunked_cross_entropy(hidden, weight, labels, ...)  the loss itself: liger-kernel's fused linear cross-entropy
                                  on CUDA when it imports, else ChunkedLinearCrossEntropy (pure torch, any device);
                                  an output head with a bias (git's) adds it to each chunk's logits, and its
                                  gradient is the chunks' logit gradients summed over rows

Semantics are transformers' ForCausalLMLoss: labels shifted left by one (the last position's target is
IGNORE_INDEX), ignore_index −100, the mean over counted tokens, or the sum over `num_items_in_batch` when given.
Logit scaling that is linear (granite's logits_scaling, cohere's logit_scale) is applied by the model to the
passed-through hidden states and so carries over; a final-logit soft cap (gemma 2) is not linear and is refused.
The chunk rule is the memory model's (engine/estimate/chunked_loss.py chunk_rows). torch is imported inside functions.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.estimate.chunked_loss import IGNORE_INDEX, chunk_rows

_WARNED: list[str] = []


def output_head(model: Any) -> Any:
    """lm_head (the output embedding) of a causal LM, through PEFT and accelerate/DeepSpeed wrappers."""
    inner = getattr(model, "module", model)
    head = inner.get_output_embeddings()
    cfg = getattr(inner, "config", None)
    if cfg is not None and getattr(cfg, "final_logit_softcapping", None):
        raise ScaletrainError("--loss chunked: this model soft-caps its logits (final_logit_softcapping), which "
                              "the chunked loss cannot reproduce; use --loss standard")
    if head is None or not hasattr(head, "weight") or hasattr(head, "base_layer"):
        raise ScaletrainError("--loss chunked needs a plain linear lm_head (not a LoRA-adapted one); use "
                              "--loss standard")
    return head


@contextlib.contextmanager
def passthrough(head: Any):
    """lm_head returns its input while the model runs, and the input is kept in the yielded list: the final hidden
    states as the norm returned them (accelerate's convert_outputs_to_fp32 may upcast the output's copy)."""
    seen: list[Any] = []

    def forward(x: Any) -> Any:
        seen.append(x)
        return x

    head.forward = forward
    try:
        yield seen
    finally:
        del head.forward


def causal_lm_loss(model: Any, batch: dict, head: Any, compute_dtype: Any = None,
                   num_items_in_batch: Any = None) -> Any:
    """The model's loss for `batch` (input_ids, labels, optional attention_mask) through the chunked head."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with passthrough(head) as seen:
        model(**inputs)
    if len(seen) != 1:
        raise ScaletrainError(f"--loss chunked: lm_head ran {len(seen)} times in one forward; use --loss standard")
    return chunked_cross_entropy(seen.pop(), head.weight, batch["labels"], compute_dtype, num_items_in_batch,
                                 getattr(head, "bias", None))


def compute_dtype_for(weight: Any, mixed_precision: str | None) -> Any:
    """The dtype lm_head's matmul runs in, as in the standard path: autocast's (accelerate's mixed precision) over
    fp32 weights, else the weight's own."""
    import torch

    if weight.dtype == torch.float32 and mixed_precision in ("bf16", "fp16"):
        return torch.bfloat16 if mixed_precision == "bf16" else torch.float16
    return weight.dtype


def shifted_targets(labels: Any) -> Any:
    """ForCausalLMLoss's targets: labels padded with IGNORE_INDEX and shifted left, flattened to B·S."""
    import torch

    return torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].reshape(-1)


def chunked_cross_entropy(hidden: Any, weight: Any, labels: Any, compute_dtype: Any = None,
                          num_items_in_batch: Any = None, bias: Any = None) -> Any:
    """Mean (or sum / num_items_in_batch) cross-entropy of hidden @ weightᵀ (+ bias) against the shifted labels."""
    import torch

    h = hidden.reshape(-1, hidden.shape[-1])
    targets = shifted_targets(labels).to(h.device)
    cdt = compute_dtype if compute_dtype is not None else weight.dtype
    if num_items_in_batch is None:
        divisor = (targets != IGNORE_INDEX).sum()
    else:
        divisor = torch.as_tensor(num_items_in_batch, device=h.device)
    liger = _liger() if h.is_cuda else None
    if liger is not None:
        with torch.autocast("cuda", dtype=cdt, enabled=cdt != weight.dtype):
            return liger(weight, h, targets, bias) / divisor.to(torch.float32)
    rows = chunk_rows(h.shape[0], weight.shape[0], weight.shape[1])
    return ChunkedLinearCrossEntropy.apply(h, weight, targets, divisor.to(torch.float32), rows, cdt, bias)


def _liger() -> Any:
    """liger-kernel's fused linear cross-entropy (sum), or None with one line saying the pure-torch one runs."""
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError as e:
        if not _WARNED:
            _WARNED.append("liger")
            print(f"scaletrain: note: --loss chunked on CUDA without liger-kernel ({e.__class__.__name__}: {e}); "
                  "using the pure-torch chunked loss (slower; pip install liger-kernel)", file=sys.stderr,
                  flush=True)
        return None
    return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")


def _chunk_forward(x: Any, w: Any, cdt: Any, b: Any = None) -> Any:
    """One chunk's fp32 logits (x cast to the compute dtype, w and b already in it; the bias added in it, as
    nn.Linear's addmm adds it under autocast)."""
    z = x.to(cdt) @ w.t()
    if b is not None:
        z += b
    return z.float()


def _make_function() -> Any:
    import torch

    class _Chunked(torch.autograd.Function):
        """forward: chunks of rows through the head and an fp32 log-sum-exp, keeping the hidden states, targets and
        log-normalisers; backward: each chunk's logits recomputed and turned into their gradient in place,
        accumulating grad_hidden and (when the head trains) an fp32 grad_weight (and grad_bias)."""

        @staticmethod
        def forward(ctx, hidden, weight, targets, divisor, rows, cdt, bias=None):
            with torch.autocast(hidden.device.type, enabled=False):
                w = weight.to(cdt)
                b = None if bias is None else bias.to(cdt)
                lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
                total = torch.zeros((), dtype=torch.float32, device=hidden.device)
                for a in range(0, hidden.shape[0], rows):
                    z = _chunk_forward(hidden[a:a + rows], w, cdt, b)
                    t = targets[a:a + rows]
                    lse[a:a + rows] = torch.logsumexp(z, dim=-1)
                    valid = t != IGNORE_INDEX
                    picked = z.gather(1, t.clamp(min=0).unsqueeze(1)).squeeze(1)
                    total += ((lse[a:a + rows] - picked) * valid).sum()
                    del z
            ctx.save_for_backward(hidden, weight, targets, lse, divisor, bias)
            ctx.rows, ctx.cdt = rows, cdt
            return total / divisor

        @staticmethod
        def backward(ctx, grad_out):
            hidden, weight, targets, lse, divisor, bias = ctx.saved_tensors
            rows, cdt = ctx.rows, ctx.cdt
            need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            need_b = bias is not None and ctx.needs_input_grad[6]
            scale = (grad_out.float() / divisor)
            with torch.autocast(hidden.device.type, enabled=False):
                w = weight.to(cdt)
                b = None if bias is None else bias.to(cdt)
                gh = torch.empty_like(hidden) if need_h else None
                gw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
                gb = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
                for a in range(0, hidden.shape[0], rows):
                    x = hidden[a:a + rows]
                    t = targets[a:a + rows]
                    g = _chunk_forward(x, w, cdt, b)
                    g.sub_(lse[a:a + rows].unsqueeze(1)).exp_()              # softmax, in place
                    valid = t != IGNORE_INDEX
                    idx = torch.nonzero(valid).squeeze(1)
                    g[idx, t[idx]] -= 1.0
                    g.mul_((valid.float() * scale).unsqueeze(1))
                    if need_h:          # into grad_hidden's rows: no chunk-sized product beside them
                        if cdt == hidden.dtype:
                            torch.matmul(g.to(cdt), w, out=gh[a:a + rows])
                        else:
                            gh[a:a + rows].copy_(g.to(cdt) @ w)
                    if need_w:
                        gw.addmm_(g.t(), x.float())
                    if need_b:
                        gb += g.sum(0)
                    del g
            if gw is not None and gw.dtype != weight.dtype:
                gw = gw.to(weight.dtype)
            if gb is not None and gb.dtype != bias.dtype:
                gb = gb.to(bias.dtype)
            return gh, gw, None, None, None, None, gb

    return _Chunked


class _Lazy:
    """ChunkedLinearCrossEntropy.apply without importing torch at module import."""

    _fn: Any = None

    def apply(self, *args: Any) -> Any:
        if _Lazy._fn is None:
            _Lazy._fn = _make_function()
        return _Lazy._fn.apply(*args)


ChunkedLinearCrossEntropy = _Lazy()

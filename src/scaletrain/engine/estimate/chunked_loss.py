"""The chunked causal-LM loss (`--loss chunked`): what it keeps instead of B·S·V logits, and its chunk rule.

One rule for the trainer and the model: `chunk_rows` is liger-kernel's (0.8.5, liger_kernel/ops/
fused_linear_cross_entropy.py `fused_linear_cross_entropy_forward` with its default _CHUNK_MEM_CONST = 1):
inc_factor = ⌈V / h⌉, chunk = min(next_power_of_2(⌈N / inc_factor⌉), N) token rows, so one chunk's logits
(chunk × V) are about the size of the hidden states (N × h), at most twice. The bundled trainer's pure-torch function (trainer/chunked_loss.py) uses it on the
CPU and wherever liger-kernel is missing; liger uses it itself on CUDA.

What a step keeps (`chunked_head`), per micro-step of N = B·S positions (every position, the last one's target
ignored, as transformers' ForCausalLMLoss shifts its labels):

  pure torch (trainer/chunked_loss.py, the CPU; checked against torch.profiler, bench/cpu_groundtruth.py)
      forward    per chunk: the chunk's logits in the compute dtype (+ their fp32 copy under 16-bit compute) and
                 logsumexp's fp32 temporary; the 16-bit cast of an fp32 lm_head weight (autocast) for the whole
                 loop. Saved: nothing new (the hidden states are lm_head's input, which the model keeps anyway when
                 the head trains; the int64 targets and the fp32 log-normaliser are 12 bytes a position).
      backward   grad_hidden (N × h, the hidden dtype) and, when lm_head trains, its fp32 gradient (V × h), then
                 per chunk: the recomputed logits turned into their gradient in place (fp32), its cast to the
                 compute dtype for the grad_hidden matmul, the chunk's fp32 hidden for the weight gradient.
  liger-kernel (CUDA) computes the gradients during the forward: grad_input (N × h) and grad_weight (V × h, the
      weight's dtype) from the start, one chunk of logits (compute dtype) turned into its gradient in place;
      backward only scales them. Read from liger's source, not measured here (no GPU lent). A CUDA plan holds
      for either implementation (the trainer falls back to pure torch, saying so, when liger does not import).
"""

from __future__ import annotations

import math
from typing import Any

from scaletrain.engine.estimate.numerics import numerics
from scaletrain.engine.estimate.output_head import head_input_width

# transformers' cross-entropy ignore label (ForCausalLMLoss ignore_index)
IGNORE_INDEX = -100


def chunk_rows(tokens: int, vocab: int, hidden: int) -> int:
    """Token rows per chunk (liger-kernel's rule, see the module doc); at least 1, at most `tokens`."""
    inc = max(1, -(-vocab // max(hidden, 1)))
    rows = max(1, -(-tokens // inc))
    return max(1, min(1 << math.ceil(math.log2(rows)), tokens))


def n_chunks(tokens: int, vocab: int, hidden: int) -> int:
    return -(-tokens // chunk_rows(tokens, vocab, hidden))


# logsumexp over a chunk's fp32 logits (aten logsumexp: max, then exp(z − max) summed): one fp32 chunk-sized
# temporary besides the logits (torch.profiler on the loss alone, bench/cpu_groundtruth.py loss=chunked rows)
CPU_LSE_TILES = 1


def head_weight_bytes(s: Any) -> int:
    """lm_head's weight bytes per element as the model holds it: full fine-tuning's weight, else the frozen base's
    (fp32 for a QLoRA / 8-bit / fp32 base)."""
    nm = numerics(s)
    return nm.weight if s.method == "full" else (nm.frozen or nm.compute)


def chunked_head(s: Any, tokens: int) -> dict[str, int]:
    """The chunked loss over `tokens` positions (see the module doc): the HeadCost fields, in bytes.

    CUDA plans hold for either implementation the trainer may run: liger when it imports, the pure-torch one
    otherwise (it says so in one line), whichever needs more at each moment."""
    m = s.model
    nm = numerics(s)
    c, r = nm.compute, nm.residual
    V, h = m.vocab_size, head_input_width(m)        # h: lm_head's input width (OPT's word_embed_proj_dim)
    rows = chunk_rows(tokens, V, h)
    trains = s.method == "full"
    hw = head_weight_bytes(s)
    w_cast = c * V * h if hw != c else 0              # weight.to(compute dtype), or autocast's cast (CUDA)
    logits = c * rows * V + (4 * rows * V if c != 4 else 0)       # the chunk's logits and their fp32 copy
    x_cast = c * rows * h if r != c else 0
    fwd = w_cast + x_cast + logits + CPU_LSE_TILES * 4 * rows * V
    grad_hidden = r * tokens * h
    grad_weight = 4 * V * h if trains else 0
    # backward chunk: the fp32 logits become their gradient in place (+ their compute-dtype product first when
    # c < 4), its compute-dtype cast for grad_hidden's matmul, the fp32 hidden chunk for grad_weight's
    bwd_chunk = 4 * rows * V + (c * rows * V if c != 4 else 0) + x_cast + (4 * rows * h if r != 4 and trains else 0)
    back_cast = hw * V * h if (trains and hw != 4) else 0        # grad_weight.to(weight dtype) at return
    bwd = w_cast + grad_hidden + grad_weight + max(bwd_chunk, back_cast)
    out = {"forward_transient": fwd, "saved": 4 * tokens, "backward_transient": bwd, "output_grad": grad_hidden}
    if s.device != "cuda":
        return out
    # liger: grad_input (the input's dtype: `hidden_saved` stands for it once forward returns) and grad_weight
    # (the weight's dtype) filled during forward and kept until backward scales them; one chunk of logits
    # (compute dtype) turned into its gradient in place
    held = hw * V * h if trains else 0
    liger_fwd = r * tokens * h + c * rows * V + w_cast + c * rows * h
    return {"forward_transient": max(fwd, liger_fwd), "saved": 4 * tokens + held,
            "backward_transient": max(0, bwd - held), "output_grad": grad_hidden}

def chunked(s: Any) -> bool:
    """The plan's loss is the chunked one (sft only: setup.py refuses it elsewhere)."""
    return str(getattr(s, "loss", "standard")) == "chunked"


def hidden_saved(s: Any, tokens: int) -> int:
    """What the chunked loss keeps of lm_head's input instead of lm_head's own saved input and autocast's weight
    copy: the final hidden states as the norm returns them (the pure-torch function's save_for_backward; liger's
    grad_input, of the same size and dtype, once its forward returns)."""
    return numerics(s).residual * tokens * head_input_width(s.model)

def recomputes_head(s: Any) -> bool:
    """The pure-torch chunked loss runs lm_head's forward GEMM again in backward (2·t·h·V FLOPs); liger computes the
    gradients during its forward and recomputes nothing."""
    return chunked(s) and s.device != "cuda"


def bytes_per_logit(s: Any) -> int:
    """Memory traffic per logit element (B·S·V) of the chunked loss, compute dtype c (the GEMMs' own reads aside).

    liger (CUDA): the projection writes the chunk (c), the cross-entropy kernel reads it and overwrites it with its
    gradient in place (2c). Pure torch: forward writes the chunk (c), upcasts it (c + 4 when c < 4), logsumexp reads
    it twice and writes one temporary (12); backward writes it again (c), upcasts it, subtracts, exponentiates and
    scales in place (three read-writes: 24) and casts the gradient back for the grad_hidden GEMM (4 + c when c < 4).
    """
    c = numerics(s).compute
    if s.device == "cuda":
        return 3 * c
    up = c + 4 if c < 4 else 0
    return (c + up + 12) + (c + up + 24 + up)

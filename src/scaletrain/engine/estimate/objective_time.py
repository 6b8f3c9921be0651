"""What each objective adds to a step's time (TRL 1.16 on transformers 5), term by term.

  head        sft: lm_head's three GEMMs over every token and the cross-entropy's passes over B·S·V logits (with
              `--loss chunked`: chunks of them, and the pure-torch loss's recomputed projection, chunked_loss.py).
              reward: a score head (h×1), nothing over the vocabulary. dpo/grpo: TRL's fused log-prob head over the
              scored tokens (completions only on CUDA): its forward projects tiles of the head, its backward
              recomputes them and turns each into the logits' gradient in place, then the hidden-state and weight
              gradients (trl/kernels/chunked_logprob.py); the tile buffer is written and read a few times.
  reference   dpo `same` / grpo with beta > 0: a no-grad forward of a frozen copy of the policy on the same tokens.
  generation  grpo in the training process: transformers' generate over micro × accumulation completions once per
              optimizer step (TRL's steps_per_generation): a prefill over the prompts, then one decode step per
              completion token that reads every weight and the KV cache, bounded by HBM or by the host dispatching
              a whole forward per token; colocated vLLM decodes without the host bound (CUDA graphs); vLLM on
              other GPUs costs the learner nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from scaletrain.engine.estimate.chunked_loss import bytes_per_logit, chunked, recomputes_head
from scaletrain.engine.estimate.moe_time import routed_matmul_seconds
from scaletrain.engine.estimate.numerics import numerics
from scaletrain.engine.estimate.objectives import scored_tokens, sequences
from scaletrain.engine.estimate.output_head import head_input_width
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.estimate.time_constants import LOSS_BYTES_PER_LOGIT_FP32, TimeConstants

# TRL's fused head, per logit of the scored tokens: the tile written by the projection and read by the fold in
# forward; recomputed, read, overwritten with its gradient and read by the two gradient GEMMs in backward.
FUSED_HEAD_PASSES = 6

Gemm = Callable[[float, float, float], float]


@dataclass(frozen=True)
class HeadTime:
    matmul: float   # the head's GEMMs
    loss: float     # passes over logits (or their tiles)


def head_seconds(s: TrainingSetup, t: int, gemm: Gemm, hbm: float) -> HeadTime:
    """The objective's loss head for one micro-step of `t` tokens (all sequences)."""
    m = s.model
    V, h = m.vocab_size, head_input_width(m)           # h: lm_head's input width (OPT's word_embed_proj_dim)
    full = s.method == "full"
    c = numerics(s).compute
    if s.objective == "reward":
        return HeadTime(0.0, 0.0)
    if s.fused_lm_head:   # dpo, grpo, and sft under TRL's SFTTrainer
        n = scored_tokens(s)
        mm = 2 * gemm(n, V, h) + gemm(n, h, V) + (gemm(V, h, n) if full else 0.0)   # forward, recompute, grads
        return HeadTime(mm, n * V * FUSED_HEAD_PASSES * c / hbm)
    mm = gemm(t, V, h) + gemm(t, h, V) + (gemm(V, h, t) if full else 0.0)
    if chunked(s):   # --loss chunked: no B·S·V tensor, chunks of it; pure torch recomputes the projection
        return HeadTime(mm + (gemm(t, V, h) if recomputes_head(s) else 0.0), t * V * bytes_per_logit(s) / hbm)
    per_logit = LOSS_BYTES_PER_LOGIT_FP32 + (2 * (c + 4) if c < 4 else 0)
    return HeadTime(mm, t * V * per_logit / hbm)


def tokens_per_micro_step(s: TrainingSetup) -> int:
    """Tokens through the model in one micro-step: pairs double the sequences (chosen and rejected)."""
    return sequences(s) * min(s.sample_tokens, s.seq_len)


def runs_reference(s: TrainingSetup) -> bool:
    return s.objective.log_probs and s.ref_model == "same"


@dataclass(frozen=True)
class GenerationTime:
    """GRPO's generation per optimizer step, on this GPU."""

    completions: int
    prefill: float
    decode: float           # completion_len decode steps
    host_bound: bool
    where: str              # "in the training process" | "colocated vLLM" | "vLLM on other GPUs"

    @property
    def seconds(self) -> float:
        return self.prefill + self.decode


def generation_seconds(s: TrainingSetup, c: TimeConstants, gemm: Gemm, forward_kernels: int) -> GenerationTime:
    """GRPO's generation (see the module doc); zero for the other objectives."""
    if s.objective != "grpo" or s.device != "cuda":
        return GenerationTime(0, 0.0, 0.0, False, "")
    n = s.micro_batch * s.grad_accum
    if s.generation == "server":
        return GenerationTime(n, 0.0, 0.0, False, "vLLM on other GPUs")
    m = s.model
    nm = numerics(s)
    g = s.hardware.gpu
    hbm = g.hbm_gbps * 1e9 * c.hbm_efficiency
    prompt = s.prompt_len or 0
    comp = s.completion_len or 0
    prefill = 0.0
    if prompt:      # the prompts' forward: every block linear, and an MoE's experts at their rows
        prefill = sum(blocks * sum(gemm(n * prompt, o, i) for i, o, _ in lin.values())
                      for blocks, lin in m.linear_kinds()) + routed_matmul_seconds(s, n * prompt, gemm, True)
    weights = nm.compute * m.params                     # every weight is read once per decode step
    kv_mean = m.num_layers * 2 * m.kv_dim * nm.compute * n * (prompt + comp / 2)
    device = comp * (weights + kv_mean) / hbm
    if s.generation == "colocate":
        return GenerationTime(n, prefill, device, False, "colocated vLLM")
    host = comp * m.num_layers * forward_kernels * c.host_seconds_per_kernel
    return GenerationTime(n, prefill, max(device, host), host > device, "in the training process")

"""Time of a mixture-of-experts block's routed experts, beside the dense terms of device_time.py and timing.py.

A token runs through the router (one h×E matmul, an fp32 softmax, top-k) and `top_k` of the E experts; the
FLOPs are the *active* parameters', not the total's. The experts' GEMMs run at their real shapes: with tokens
spread evenly (the load-balancing assumption, said in the plan), each expert sees t·k/E rows, thin on small
micro batches, where `gemm` (device_time._gemm_seconds) loses efficiency or turns memory-bound. Around them the
block permutes the k routed copies of every token (a gather, the routing weights, the un-permute and the sum over
k) as memory-bound traffic, and the eager implementation launches one chain of kernels per expert it hits.

A traced family (no analytic layout) has no MoeSpec: its experts are what its trace found (measure/trace_experts.py),
per layer kind — each expert weight's [E, a, b] and the expert rows a token runs through, counted in a real forward
(top-k for a routed block; llama4's transformers experts run every token through every expert, E). Its GEMMs are
taken the same way, each weight at t·rows/E rows per expert, in transformers' default implementation (grouped_mm:
the trainer passes no experts implementation to a family it has no layout for).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from scaletrain.engine.estimate.numerics import numerics
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.estimate.traced_blocks import routed_experts

# Kernels a routed-experts block adds to a dense block, forward and backward: aten ops counted with torch.profiler
# on transformers 5.24 (tiny qwen3_moe against the same qwen3 block with a dense MLP, 64 tokens, fp32): grouped_mm
# adds 31 forward / 22 backward ops to the dense 79 / 171; eager adds 16 / 24 ops more per expert it hits.
# Scaled by the dense block's kernels per op (KERNELS_PER_BLOCK 38/79 forward, 100/171 backward; views launch
# nothing) to kernels.
KERNELS_PER_GROUPED_MOE = (15, 13)
KERNELS_PER_EAGER_EXPERT = (8, 14)
LOAD_BALANCE_ASSUMPTION = "MoE: tokens spread evenly over the experts (t·k/E rows per expert GEMM; a skewed router " \
                          "makes the busiest expert's GEMM the block's)"


TRACED_EXPERTS_UNCOUNTED = ("the routed experts' GEMMs are not in this time: the trace could not count the expert "
                            "rows a token runs through (its forward did not run under torch's FLOP counter)")


@dataclass(frozen=True)
class TracedExperts:
    """One layer kind of a traced model with routed experts (measure/trace_experts.py)."""

    blocks: int                                    # layers of the kind in the real model
    weights: tuple[tuple[int, int, int], ...]      # [E, a, b] of each expert weight: E experts of a·b
    rows: tuple[float | None, ...]                 # per weight: the rows a token runs through it (None: not counted)

    def counted(self) -> tuple[tuple[int, int, int, float], ...]:
        """(E, a, b, rows per token) of each weight whose rows were counted."""
        return tuple((*w, r) for w, r in zip(self.weights, self.rows) if r)


def traced_experts(s: TrainingSetup) -> tuple[TracedExperts, ...]:
    """A traced model's kinds with routed experts; empty for an analytic layout (its MoeSpec) or a dense model."""
    if s.model.moe is not None or s.model.trace is None:
        return ()
    return tuple(TracedExperts(blocks, tuple(tuple(int(d) for d in w) for w in weights),
                               tuple(float(r) if r else None for r in rows))
                 for blocks, rows, weights in routed_experts(s))


def uncounted_experts(s: TrainingSetup) -> bool:
    """A traced model whose experts' rows could not be counted: its time lacks their GEMMs, and says so."""
    return any(r is None for k in traced_experts(s) for r in k.rows)


def traced_rows(s: TrainingSetup) -> tuple[float, ...]:
    """The rows a token runs through a traced model's routed experts (weights over E ≥ 2 experts), for the plan."""
    return tuple(sorted({r for k in traced_experts(s) for E, _, _, r in k.counted() if E > 1}))


def rows_text(rows: tuple[float, ...] | list[float]) -> str:
    """'8' or '2 / 8': traced_rows as the plan's time assumptions and its MoE line write them ('' for none)."""
    return " / ".join(f"{r:g}" for r in rows)


def moe_layers(s: TrainingSetup) -> int:
    """Blocks with routed experts (the rest are dense MLP blocks: mlp_only_layers / decoder_sparse_step)."""
    m = s.model
    if m.moe is None:
        return sum(k.blocks for k in traced_experts(s))
    return m.num_layers - len(m.moe.dense_layers)


def routed_flops_per_token(s: TrainingSetup) -> float:
    """Forward FLOPs per token of one MoE block's router and its top-k experts (gate/up and down)."""
    moe = s.model.moe
    h, i = s.model.hidden_size, moe.expert_intermediate
    return 2.0 * (moe.experts * h + moe.top_k * 3 * h * i)


def routed_sample_flops(s: TrainingSetup, tokens: int) -> tuple[float, float, float]:
    """(forward, backward, recompute) FLOPs of all MoE blocks' routers and experts for `tokens` tokens: backward is
    the input gradients plus the weight gradients of trained experts (full fine-tuning); frozen experts (LoRA) pass
    gradients through without their own."""
    if s.model.moe is None:
        fwd = float(tokens * sum(k.blocks * sum(2 * a * b * r for _, a, b, r in k.counted())
                                 for k in traced_experts(s)))
    else:
        fwd = routed_flops_per_token(s) * tokens * moe_layers(s)
    bwd = fwd * (2 if s.method == "full" else 1)
    return fwd, bwd, (fwd if s.grad_ckpt else 0.0)


def experts_dtype_bytes(s: TrainingSetup) -> int:
    """Bytes per element the routed experts compute in. grouped_mm is not autocast-enabled (transformers
    integrations/moe.py casts the input to the weights' dtype, pytorch#174763): fp32 expert weights (full
    fine-tuning with fp32 master weights under accelerate's autocast, or a LoRA fp32 base) run the experts in fp32;
    eager's F.linear and batched_mm's bmm follow autocast."""
    nm = numerics(s)
    weights = nm.weight if s.method == "full" else nm.frozen
    return weights if running_experts_impl(s) == "grouped_mm" else nm.compute


def running_experts_impl(s: TrainingSetup) -> str:
    """The experts implementation that runs: the plan's for an analytic MoE layout, transformers' default
    (grouped_mm) for a traced family or a dense model, to which the trainer passes none."""
    return str(s.experts_impl) if s.model.moe is not None else "grouped_mm"


def routed_matmul_seconds(s: TrainingSetup, t: int, gemm: Callable[[float, float, float], float],
                          forward_only: bool = False) -> float:
    """The experts' and router's GEMMs of all MoE blocks for `t` tokens, each expert at t·k/E rows (`gemm` at the
    experts' own dtype, see experts_dtype_bytes)."""
    m = s.model
    moe = m.moe
    if moe is None:
        return _traced_matmul_seconds(s, t, gemm, forward_only)
    h, i, E = m.hidden_size, moe.expert_intermediate, moe.experts
    rows = t * moe.top_k / E
    full = s.method == "full"
    passes = 1 if forward_only else (2 if s.grad_ckpt else 1)
    per_block = passes * (E * (gemm(rows, 2 * i, h) + gemm(rows, h, i)) + gemm(t, E, h))
    if not forward_only:
        per_block += E * (gemm(rows, h, 2 * i) + gemm(rows, i, h)) + gemm(t, h, E)         # input gradients
        if full:
            per_block += E * (gemm(2 * i, h, rows) + gemm(h, i, rows)) + gemm(E, h, t)     # weight gradients
    return moe_layers(s) * per_block


def _traced_matmul_seconds(s: TrainingSetup, t: int, gemm: Callable[[float, float, float], float],
                           forward_only: bool) -> float:
    """A traced model's expert GEMMs for `t` tokens: each [E, a, b] weight at t·rows/E rows per expert, forward
    (twice under checkpointing), input gradients, and weight gradients when trained (full fine-tuning)."""
    full = s.method == "full"
    passes = 1 if forward_only else (2 if s.grad_ckpt else 1)
    total = 0.0
    for kind in traced_experts(s):
        block = 0.0
        for E, a, b, r in kind.counted():
            rows = t * r / E
            block += passes * E * gemm(rows, a, b)
            if not forward_only:
                block += E * gemm(rows, b, a) + (E * gemm(a, b, rows) if full else 0.0)
        total += kind.blocks * block
    return total


def traced_traffic_per_token(s: TrainingSetup) -> int:
    """Bytes per token the memory-bound kernels around a traced model's experts move in forward, per MoE block on
    average over its kinds, as routed_traffic_per_token counts them: the router's softmax and top-k over E, the
    gather and un-permute of each routed row, the activation over its expert width (the narrowest side of a weight
    that is not the hidden size), the weighting and the sum."""
    m = s.model
    kinds = [k for k in traced_experts(s) if any(E > 1 for E, _, _, _ in k.counted())]
    if not kinds:
        return 0
    c, mlp = numerics(s).compute, numerics(s).mlp_bytes
    h = m.hidden_size
    total = 0
    for kind in kinds:
        routed = [w for w in kind.counted() if w[0] > 1]
        E, k = max(w[0] for w in routed), max(w[3] for w in routed)
        width = min((b if a == h else a) for _, a, b, _ in routed)
        per = E * (c + 12) + k * h * 4 * c + k * 5 * mlp * width + k * h * 3 * c + h * c
        total += kind.blocks * int(per)
    return total // sum(kind.blocks for kind in kinds)


def routed_traffic_per_token(s: TrainingSetup) -> int:
    """Bytes per token one MoE block's memory-bound kernels move in forward, beyond the dense block's norms and
    attention: the router's fp32 softmax and top-k over E, the gather of k copies of the hidden state, the
    activation and product over k·I, the routing weights' multiply, the un-permute and the sum over k."""
    m = s.model
    moe = m.moe
    nm = numerics(s)
    c = nm.compute
    h, i, k, E = m.hidden_size, moe.expert_intermediate, moe.top_k, moe.experts
    router = E * (c + 4 + 4 + 4)                        # logits, fp32 softmax read/write, top-k read
    permute = k * h * (c + c) * 2                       # gather in, un-permute out
    act = k * 5 * nm.mlp_bytes * i                      # act(gate), act·up (as the dense MLP's 5 passes)
    weighting = k * h * (2 * c) + k * h * c + h * c     # weight multiply, sum over k, the block output
    return router + permute + act + weighting


def routed_kernels(s: TrainingSetup, t: int) -> tuple[int, int]:
    """Kernels one MoE block adds, forward and backward: a fixed chain for grouped_mm / batched_mm, one chain per
    expert hit for eager (every expert is hit once t·k ≥ E, the usual case)."""
    if not moe_layers(s):
        return 0, 0
    f, b = KERNELS_PER_GROUPED_MOE
    if running_experts_impl(s) == "eager":
        hit = min(s.model.moe.experts, t * s.model.moe.top_k)
        f, b = f + hit * KERNELS_PER_EAGER_EXPERT[0], b + hit * KERNELS_PER_EAGER_EXPERT[1]
    return f, b

"""What an MoE block's MLP half saves for backward, per token, as transformers 5.24 runs it on torch 2.13.

The router (F.linear on a bare weight, then an fp32 softmax and top-k, or gpt_oss's top-k of the logits and a
softmax over those), then the experts by `experts_implementation` (transformers/integrations/moe.py):

- grouped_mm (the default): the k·t token-expert pairs are sorted by expert (`perm`, `perm // k`, `inv_perm`:
  int64 each), the sorted inputs cast to the experts' dtype (grouped_mm is not autocast-enabled, so fp32 experts
  under autocast compute in fp32), gate_up, act(gate), act·up, the down output, the sorted routing weights, and the
  per-expert offsets (int32, per block);
- eager: a Python loop over the hit experts: each pair's gathered input (or autocast's 16-bit cast of it, F.linear
  being autocast-enabled), the same intermediates in the linear's dtype, its token index and top-k position, its
  routing weight, and the source index_add_ keeps, in the block's dtype;
- batched_mm: the pairs' inputs repeated and each pair's expert weights gathered for a bmm (k·(2I·h + I·h) per
  token, 16-bit under autocast: bmm is autocast-enabled); no sorting.

Under LoRA, a frozen expert weight saves nothing of its input; where peft adapts the fused experts (the expert
names it converts on qwen3_moe, olmoe and mixtral, catalog/moe.py PEFT_EXPERT_TARGETS, or the target `experts` on
every family through target_parameters) its ParamWrapper computes W + ΔW, which the experts save whole (a per-block
constant; gpt_oss's frozen biases add nothing, and the adapters' rank changes nothing saved). Every
term is checked byte for byte against torch's saved-tensor hooks in tests/engine/test_moe_memory.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.engine.estimate.numerics import Numerics
from scaletrain.engine.estimate.setup import TrainingSetup


@dataclass(frozen=True)
class MoeHalf:
    per_token: int        # saved bytes per token of the MoE MLP half (after the pre-MLP norm)
    const: int            # saved bytes per block independent of tokens (offsets, frozen expert copies)
    fwd_transient: int    # per token: the largest temporaries alive while the experts run
    bwd_transient: int    # per token: gradients of the routed intermediates during the block's backward
    weight_copies: int    # autocast's 16-bit copies of the router (and eager's per-expert weights), per block
    cached_copies: int    # the part autocast's cache holds until forward returns (trainable fp32 weights)
    # the experts' backward moments as (bytes per token, bytes per block), when they are not one per-token rise:
    # grouped_mm's down and gate/up backward, eager's and batched_mm's, with peft's gradients of its merged weights
    bwd_moments: tuple[tuple[int, int], ...] = ()
    # per token: what the half's first node in backward writes before it reads a saved tensor, so alive while a
    # checkpointed block is recomputed (grouped_mm's `weighted_out[inv_perm]`: IndexBackward0's k·h gradient)
    first_backward: int = 0
    # per token, batched_mm under autocast over fp32 expert weights: what is alive at down's gather beyond the
    # half's saved tensors (both weights gathered per token-expert pair in fp32 beside gate_up's saved 16-bit cast)
    gather_rise: int = 0

    def backward_bytes(self, tokens: int) -> int:
        """The largest rise over the block's saved tensors while its MoE half runs backward, for `tokens`."""
        return max([tokens * self.bwd_transient, *(tokens * p + c for p, c in self.bwd_moments)])


def _dtypes(nm: Numerics, full: bool) -> tuple[int, int, int]:
    """(x, ew, lc): bytes of the block's input to the experts (the norm's output, in the residual dtype), of the
    expert weights (trained, or the frozen base), and of an autocast-enabled linear's output (the router logits,
    eager's per-expert F.linear)."""
    ew = nm.weight if full else (nm.frozen or nm.compute)
    return nm.residual, ew, 2 if nm.autocast else ew


def moe_half(s: TrainingSetup, nm: Numerics, full: bool, readers_saved) -> MoeHalf:
    """The MoE MLP half of one block. `readers_saved(width, src_bytes, readers, adapted)` is activations.py's
    _reader_saved bound to this setup (what linears reading one tensor save of it)."""
    m = s.model
    moe = m.moe
    h, E, k, i = m.hidden_size, moe.experts, moe.top_k, moe.expert_intermediate
    x, ew, lc = _dtypes(nm, full)
    lg = lc                                           # the router logits: F.linear
    impl = str(s.experts_impl)
    targets = set() if full else set(s.lora_targets)
    sb = 4 if moe.scores_fp32 else lg                 # routing weights: mixtral keeps them fp32
    out = 0
    # -- router: F.linear on the block input (its own 16-bit cast under autocast), then the routing tensors
    n_sh = sum(1 for t in ("gate_proj", "up_proj", "shared_expert_gate") if t in targets)
    # qwen2_moe's shared expert (gate_proj, up_proj) and shared_expert_gate read the same tensor as the router
    out += readers_saved(h, x, 4, n_sh) if moe.shared_intermediate else readers_saved(h, x, 1, 0)
    if moe.router == "topk_softmax":
        out += 8 * k + lg * k                         # top-k indices, softmax output over the top-k logits
    else:
        out += 4 * E + 8 * k                          # fp32 softmax output, top-k indices
        if moe.norm_topk:
            out += 4 * k + 4                          # top-k values and their sum, kept by the division
    # -- the routed experts: a weight that trains (full, or peft's adapters on it) needs its input
    _, gu, dn = m.expert_lora(s.lora_rank, s.lora_targets) if not full else (0, True, True)
    gating = (4 if moe.gate == "clamped_swiglu" else 1) * i      # what act(gate)·up keeps besides gate_up
    if impl == "eager":
        # gpt_oss adds its biases after each matmul: an fp32 bias promotes the autocast output back to fp32
        li = max(lc, ew) if moe.expert_bias else lc
        pair = li * (2 * i + gating) + (lc * i if dn else 0)     # gate_up, gating, act·up (down's input)
        pair += ((2 if (nm.autocast and x == 4) else x) * h) if gu else 0     # the linear's input
        pair += li * h                                 # down output, kept by the routing-weight multiply
        pair += x * h                                  # the source index_add_ keeps (block dtype)
        pair += 8 + 8 + sb                             # token index, top-k position, routing weight
    else:
        # grouped_mm is not autocast-enabled (the experts' dtype); batched_mm's bmm is (16-bit under autocast)
        mm = lc if impl == "batched_mm" else ew
        pair = mm * (2 * i + gating + (i if dn else 0) + (h if gu else 0) + h) + sb   # ... sorted input, down out
        if impl == "batched_mm":
            pair += mm * 3 * i * h                     # the gathered expert weights
            if moe.router == "topk_softmax":
                pair -= sb                             # its routing weights are the router's saved softmax output
        else:
            pair += 8 + 8 + 8                          # perm // k, perm, inv_perm
        if moe.expert_bias and impl != "batched_mm" and full:
            pair += 8                                  # the expert ids indexing the (trained) biases
    out += k * pair
    # -- qwen2_moe's shared expert: a dense MLP of shared_intermediate and sigmoid(shared_expert_gate(x))
    if moe.shared_intermediate:
        si = moe.shared_intermediate
        mb = nm.mlp_bytes
        out += 3 * mb * si + (mb * si if full else readers_saved(si, mb, 1, int("down_proj" in targets)))
        out += lc * h + lc                             # shared output and the gate's sigmoid, kept by the multiply
    const = 4 * E if impl == "grouped_mm" else 0       # int32 offsets per expert
    merged = 0 if full else ew * E * h * ((2 * i if gu else 0) + (i if dn else 0))   # peft's adapted W + ΔW
    if impl != "batched_mm" and not (impl == "eager" and nm.autocast and ew == 4):
        # peft's ParamWrapper adds the adapters' delta to a frozen expert weight: W + ΔW is saved (eager under
        # autocast saves the 16-bit cast of each expert's slice instead, one of weight_copies)
        const += merged
    fwd = k * ew * 2 * i
    bwd = max(2 * k * ew * 2 * i, _routing_multiply_backward(impl, k, h, ew, lc, sb))
    moments: tuple[tuple[int, int], ...] = ()
    if impl == "grouped_mm" and moe.gate != "clamped_swiglu":
        moments = _grouped_backward(k, h, i, E, (x, ew, sb), (gu, dn, full), bool(moe.shared_intermediate))
        bwd = _routing_multiply_backward(impl, k, h, ew, lc, sb)
    elif impl == "eager" and not full and (gu or dn):
        # the per-expert loop indexes peft's merged weights W + ΔW one expert at a time: each select's backward
        # writes a gradient of the whole merged weight, added into its accumulated gradient; both accumulated
        # gradients and one such write stand at the loop's last expert (torch.profiler, olmoe 32 experts, h 128,
        # i 256, 64 tokens, LoRA + checkpointing: -18 % without them)
        moments = ((bwd, merged + ew * E * h * (2 * i if gu else i)),)
    elif impl == "batched_mm" and (full or dn):
        # each pair's gathered down weight gets its own gradient (k·h·i per token) before the index backward sums
        # it into the expert's (the same shape; the timeline holds both, net one over the saved gathered weights:
        # olmoe 32 experts, h 128, i 256, 64 tokens, LoRA + checkpointing, -11 % without it)
        moments = ((bwd + k * h * i * lc, 0),)
    if moe.gate == "clamped_swiglu" and impl != "eager":
        # gpt_oss clamps gate and up taken as interleaved columns of gate_up: at the gate_up backward torch.profiler
        # holds the gate_up, gate and up gradients with the sorted input's k·h gradient and the block's incoming
        # t·h one (the sweep's h 64, i 128, 8 experts top-2, LoRA + checkpointing: -2.1 % without the last two)
        bwd = 2 * k * ew * 2 * i + k * h * ew + x * h
    copies = cached = 0
    if nm.autocast and ew == 4:                        # fp32 weights under autocast: F.linear casts them
        router = 2 * E * h                             # weights only: a bias is added, not cast and saved
        experts = 2 * E * 3 * i * h if impl == "eager" else 0
        copies = router + experts
        cached = copies if nm.trainable_copies else 0
    first = k * h * max(ew, sb) if impl == "grouped_mm" else 0
    rise = 0
    if impl == "batched_mm" and lc < ew:
        # autocast over fp32 expert weights: batched_mm gathers gate_up's and down's weights per token-expert pair
        # in fp32 and its autocast bmm casts each to 16 bits, the casts saved (counted in `pair`): at down's gather
        # gate_up's fp32 gather (a local until the function returns), its cast and down's fp32 gather are alive
        # (torch.profiler, full bf16 autocast: tiny-qwen3-moe + checkpointing peaks there in the recompute, planned
        # 42 % under without it; tiny-gpt-oss without checkpointing in the last block's forward, 19 % under)
        rise = k * i * h * (3 * ew - lc)           # 3·ew gathered + 2·lc cast alive, 3·lc of casts in `pair`
    return MoeHalf(out, const, fwd, bwd, copies, cached, moments, first, rise)


def _grouped_backward(k: int, h: int, i: int, E: int, dtypes: tuple[int, int, int], adapted: tuple[bool, bool, bool],
                      shared: bool) -> tuple[tuple[int, int], ...]:
    """grouped_mm's experts backward, past the routing multiply, as (per token, per block) over the saved tensors,
    read from torch.profiler's timeline (the sweep's mixtral, olmoe and qwen2_moe, LoRA + checkpointing):

    - down's backward: the multiply's two k·h gradients wait beside the k·i gradient of down's input;
    - the gate/up backward: the gradients of act(gate), up and gate (three k·i), down's input (act·up, saved when
      down's weight trains) and output freed;
    - LoRA on the experts: peft's ParamWrapper computes W + ΔW, which the experts save whole; each grouped_mm
      backward writes the whole gradient of its merged weight, and ΔW's backward (a baddbmm) a copy of it, while
      the merged weights it read are freed: net E·h·i at down's (2·E·h·i written, its E·h·i freed) and at
      gate_up's E·h·(4i - 2i - i if down's was freed too) (olmoe with 64 experts, h 256, i 512, LoRA +
      checkpointing, 64 tokens: two 64 MiB gradients at the peak, the step planned 3.7 % under without them);
      full fine-tuning writes the weights' own gradients (counted with the gradients);
    - a shared expert runs after the routed ones in forward, so first in backward: the gradient it gives the
      experts' input (waiting to be summed with theirs) and its gated product's (two t·h) stand beside them.

    The bound these replace, two gate_up-sized gradients per token on top of everything saved, put mixtral's
    LoRA + checkpointing step 4.8 % over and olmoe's 3.9 %, and left the merged weights' gradients out."""
    x, ew, sb = dtypes
    gu, dn, full = adapted
    beside = 2 * x * h if shared else 0
    down = 2 * k * h * max(ew, sb) + k * i * ew + beside
    gate_up = 3 * k * i * ew - k * ew * ((i if dn else 0) + h) + beside
    lora = not full
    return ((down, ew * E * h * i if (lora and dn) else 0),
            (max(gate_up, 0), ew * E * h * i * (1 if dn else 2) if (lora and gu) else 0))


def _routing_multiply_backward(impl: str, k: int, h: int, ew: int, lc: int, sb: int) -> int:
    """Per token: the gradients alive while the routing-weight multiply `proj_out * sample_weights` runs backward,
    on top of the block's saved tensors (torch.profiler's timeline at the peak of qwen3_moe, 32 experts top-8, h 512,
    expert intermediate 256, seq 1024: IndexBackward0's k·h gradient and MulBackward0's two k·h tensors, the
    gradient of proj_out and the product with proj_out that sums to the routing weights' gradient). grouped_mm
    restores the pairs' order with `weighted_out[inv_perm]`, whose backward writes a fresh S×h gradient, so three
    k·h tensors; batched_mm sums an unpermuted view (its gradient an expanded view of the block's), so two
    (transformers/integrations/moe.py). k·h exceeds the gate/up gradients whenever h > 4i/3, as in every
    published MoE (Qwen3-30B-A3B: h 2048, i 768). The product is in the wider of the experts' output and the
    routing weights' dtype (Mixtral's fp32 scores promote it). Eager's per-expert loop multiplies one expert's rows
    at a time (not counted here)."""
    if impl == "eager":
        return 0
    mm = lc if impl == "batched_mm" else ew
    return (3 if impl == "grouped_mm" else 2) * k * h * max(mm, sb)

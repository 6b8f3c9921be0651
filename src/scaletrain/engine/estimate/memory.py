"""Per-GPU memory model, readable top to bottom.

The peak of a training step is the largest of a few moments, not the sum of every buffer ever allocated:

  forward      model states + activations saved so far + the layer being computed
  loss         ... + logits and the fp32 log-softmax of cross-entropy (the spike hand guides miss)
  backward     ... all activations still saved + the cross-entropy gradient (3 fp32 B·S·V tensors), then
               activations are freed layer by layer while gradients appear (under checkpointing each block's
               forward runs again first, its transients on top of its saved tensors and the incoming gradient)
  step         model states + gradients + the optimizer's temporaries

The parts, in reading order: numerics.py says which dtype every tensor has in the launched stack; states.py the
weights, optimizer states and gradients per GPU; activations.py lists, per token, what one decoder block saves for
backward under those dtypes (checked byte for byte against torch's saved-tensor hooks on CPU,
tests/trainer/test_memory_saved.py) and what lives outside the blocks. Here, `simulate_step` walks the moments above for
one micro-batch and `estimate_memory` reports the breakdown at the peak, plus CUDA context, workspaces and the
allocator reserve. Every term is named after what it is; every constant says where it came from.
Ground truth: tests/trainer/test_memory_groundtruth.py compares whole steps against torch.profiler on CPU, and
bench/results/h100-2026-11-23.json against torch.cuda.max_memory_allocated on an H100.
"""

from __future__ import annotations

from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.estimate.activations import block_activations, eager_attention, eager_masks, outside_blocks
from scaletrain.engine.estimate.breakdown import MemoryBreakdown
from scaletrain.engine.estimate.numerics import numerics, uses_deepspeed
from scaletrain.engine.estimate.objectives import (generation_cost, head_cost, held_outputs_bytes, objective_terms,
                                                reference_forward_bytes, reference_weight_bytes, sequences)
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.estimate.states import DS_PREFETCH_BUCKET_ELEMS, ModelStates, model_states
from scaletrain.engine.estimate.traced_blocks import unmodeled_checkpointing

# ---- constants (each one named, sourced, and overridable by calibration later) --------------------------------
GiB = 1024**3
MiB = 1024**2

# CUDA context + module images created by the first kernels, torch 2.x with lazy module loading: not in
# torch.cuda.max_memory_allocated, only in nvidia-smi / NVML. HF model-memory-anatomy doc: 1.3 GB on V100 with
# eager loading; ~0.5 GiB on A100/H100 with lazy loading. The H100 run of 2026-11-23 saw 483 MiB in use before the
# first step (../shared/measurements/h100-2026-11-23/e2e-monitor-headless.txt). Calibrated by `validate --save`.
CUDA_CONTEXT_BYTES = 512 * MiB
# NCCL communicator buffers per process when world > 1 (NCCL_BUFFSIZE 4 MiB × channels × peers, order 100s MiB).
NCCL_BUFFER_BYTES = 256 * MiB
# Caching-allocator reserve above the allocated peak (cached free blocks, fragmentation). On the H100
# (accuracy-sweep.json, max_memory_reserved / max_memory_allocated − 1): 4-19 % with plain PyTorch (median 10 %),
# 25-41 % with DeepSpeed, on a card with room to spare: the allocator grows its cache rather than search it while
# cudaMalloc succeeds, and frees cached blocks and retries before it reports an OOM, so reserved memory overstates
# what a run needs. We plan with the plain-PyTorch median; `validate --save` stores the measured value.
ALLOCATOR_RESERVE_FRACTION = 0.10
# cuBLAS workspace, allocated through torch's caching allocator (so inside max_memory_allocated) once per
# (thread, stream) handle: torch sets CUBLAS_WORKSPACE_CONFIG ":4096:8" (32 MiB) on Hopper and newer and
# ":4096:2:16:8" (~8 MiB) before (aten/src/ATen/cuda/CublasHandlePool.cpp). Forward runs on the Python thread,
# backward on autograd's device thread: two handles.
CUBLAS_WORKSPACE_BYTES = {"hopper": 32 * MiB, "blackwell": 32 * MiB}
CUBLAS_WORKSPACE_BYTES_OLDER = 8 * MiB + 128 * 1024
# Checkpointing keeps the CPU generator's state beside each checkpointed block's input until that block is
# recomputed: torch.utils.checkpoint (non-reentrant, preserve_rng_state=True, as transformers calls it) stores
# torch.get_rng_state(), a uint8 tensor of the mt19937 state (aten/src/ATen/CPUGeneratorImpl.cpp, 5056 bytes in
# torch 2.13). On a GPU it is host memory (the CUDA generator's state is a CPU tensor too): counted on CPU only.
CPU_RNG_STATE_BYTES = 5056
CUBLAS_HANDLES = 2


# ---- the step, moment by moment --------------------------------------------------------------------------------
def _refuse_unmodeled(s: TrainingSetup) -> None:
    """A setup the model does not count (a looped stack's checkpointing, traced_blocks.py) in one line."""
    why = unmodeled_checkpointing(s)
    if why:
        raise ScaletrainError(f"{s.model.name} ({s.model.model_type}) with --grad-ckpt: {why}; plan it without "
                              "--grad-ckpt")


def simulate_step(s: TrainingSetup, micro_batch: int | None = None) -> dict[str, Any]:
    """Walk one (last) micro-step and the optimizer step; return the peak of each phase and the peak's parts."""
    m = s.model
    nm = numerics(s)
    b = micro_batch or s.micro_batch
    seqs = sequences(s, b)             # reward/dpo: chosen + rejected of every pair; grpo: completions
    t = seqs * s.seq_len
    c = nm.compute
    ms = model_states(s)
    layer = block_activations(s, seqs)
    head = head_cost(s, b)
    out = outside_blocks(s, seqs)
    L = m.num_layers
    h = m.hidden_size
    full = s.method == "full"
    ref_weights = reference_weight_bytes(s)
    static = ms.weights + ms.optimizer + ref_weights

    gather_block, gather_head, grad_gather_block, root = _gathers(s, head.weight_params)

    # what checkpointing keeps per block, and what recomputing one block costs in backward
    mask = seqs * s.seq_len * s.seq_len * nm.residual * eager_masks(s) if eager_attention(s) else 0
    recompute = s.grad_ckpt
    block_input = layer.checkpointed_input or t * h * nm.residual     # the hidden states a block receives
    per_block_saved = block_input + rng_state_bytes(s) if recompute else layer.saved + layer.weight_copies

    # eager attention: transformers builds one additive causal mask (B×1×S×S, residual dtype) for all blocks; it lives
    # through backward only when checkpointing saves it as a block input (a traced model's `shared` holds it)
    shared = out["shared"] + (mask if s.grad_ckpt and m.memory_source != "traced" else 0)
    final = out["final"]

    grads = ms.gradients_persistent
    # accelerate-loop: the previous micro-step's outputs during forward, this one's from the loss to the next forward
    peaks = _Peaks(static, held_outputs_bytes(s, b), root)
    mark = peaks.mark

    # GRPO: the completions are generated (no grad) before the first micro-step of the optimizer step
    gen = generation_cost(s)
    if gen.peak:
        # ZeRO-3 generates with the whole model gathered (in gen.peak), not one block at a time
        mark("generation", gen.peak, 0, grads, gather=0 if gen.gathered_weights else gather_block)
    if s.objective == "grpo" and s.ref_model == "same":   # reference log-probs of the completions, micro by micro
        mark("generation", shared + reference_forward_bytes(s, layer.fwd_transient, b), 0, grads)

    # forward: blocks one by one. Under checkpointing, autocast's cache still holds every cast trainable weight
    # until forward returns (saved copies count in per_block_saved otherwise); the eager mask lives until then too;
    # a traced checkpointed block runs beside what the one before it left (fwd_left: held by the stack's loop)
    acts, cache = _blocks_forward(mark, layer, L, (shared, 0 if s.grad_ckpt else mask), per_block_saved,
                                  layer.cached_copies if recompute else 0, grads, gather_block)
    acts += final
    # loss: the head's forward (sft: logits + fp32 copy + log_softmax output; dpo/grpo: TRL's log-prob tiles)
    acts += head.labels
    mark("loss", acts + cache, head.forward_transient + head.saved + head.input_live, grads, gather=gather_head)
    if s.objective == "dpo":   # the reference's no-grad forward runs while the policy's graph is alive
        mark("loss", acts + reference_forward_bytes(s, layer.fwd_transient, b), head.saved, grads)
    # backward through the loss (sft: log_softmax's saved output + its grad + the input grad; TRL's fused head:
    # the recomputed tiles, with the fp32 weight gradient allocated up front)
    head_grad_gather = gather_head if full and s.strategy == "zero3" else 0   # the unsharded head gradient (FSDP:
    # counted whole by _grad_share)
    mark("backward", acts, head.saved + head.backward_transient, grads, gather=gather_head)
    # head backward: its output's gradient (compute dtype) is consumed; the head's weight gradient appears
    # (16-bit under autocast, then converted to the fp32 gradient)
    head_grad = (_grad_share(head.weight_params, s, root=True)
                 if full and not (uses_deepspeed(s) and s.precision != "fp32") else 0)
    head_cast = c * head.weight_params if (full and nm.trainable_copies and not head.weight_grad_early) else 0
    if ms.grows_in_backward:
        mark("backward", acts, head.output_grad + head.input_grad, grads + head_grad, opt_extra=head_cast,
             gather=gather_head + head_grad_gather)
        grads += head_grad
    else:   # the buffers (accumulation, DDP buckets, DeepSpeed) already hold it
        mark("backward", acts, head.output_grad + head.input_grad, ms.gradients_backward, opt_extra=head_cast,
             gather=gather_head + head_grad_gather)
        grads = ms.gradients_backward + (head_grad if (m.tie_embeddings and m.vocab_head) else 0)   # tied: below
    # between the head and the last block (traced: the final norm's backward, a head transform's): its rise over
    # the head's input gradient, the saved tensors it reads still alive
    if out.get("tail_bwd"):
        mark("backward", acts, head.input_grad + out["tail_bwd"], grads, gather=gather_head)
    acts -= final + head.labels
    block_grad = _grad_share(m.block_params() if full else s.trainable_params // max(L, 1), s)
    acts, grads = _blocks_backward(s, mark, layer, out["window_mask"], acts, grads, block_grad,
                                   per_block_saved, (gather_block, grad_gather_block), block_input,
                                   ms.grows_in_backward)
    grads = max(grads, ms.gradients_backward)
    # traced: what runs backward before the stack, at its peak beyond the ids (the stack's saved tensors released)
    if out.get("front_bwd"):
        mark("backward", min(acts, 8 * t) + out["front_bwd"], 0, grads)
    # the embedding's backward writes a dense V×h gradient; with tied embeddings autograd adds it to lm_head's,
    # which waits in the engine's input buffer from the head's backward on (beside an accumulation buffer too): out of place (a third V×h tensor) unless lm_head's gradient is a
    # fresh fp32 copy of autocast's 16-bit one, which the engine may add into (torch/csrc/autograd/input_buffer.cpp)
    tied = m.tie_embeddings and m.vocab_head
    embed_bwd = (_grad_share(m.embedding_params, s, root=True) * (1 if nm.trainable_copies else 2)
                 if (full and tied) else 0)
    # it runs last: every other saved tensor's reader has run its backward and freed it; the ids it keeps remain
    # (torch.profiler, OPT full + checkpointing: project_in's saved B·S·768 input is gone by then)
    mark("backward", min(acts, 8 * t), 0, grads, opt_extra=embed_bwd)
    # optimizer step
    mark("step", 0, 0, ms.gradients_step, opt_extra=ms.step_temporaries)
    if not gen.peak:
        del peaks.phase_peaks["generation"]
    return {"phase_peaks": peaks.phase_peaks, "parts": peaks.parts, "states": ms, "head": head, "generation": gen}


def _blocks_forward(mark: Any, layer: Any, L: int, start: tuple[int, int], per_block_saved: int,
                    cached_per_block: int, grads: int, gather: int) -> tuple[int, int]:
    """The blocks' forward, one by one from (saved bytes, autocast's cache) at `start`: each block's rise on top
    of what the blocks before it keep; returns both after the last block."""
    acts, cache = start
    for i in range(L):
        left = layer.fwd_left if i else 0       # what the block before left, until this one returns
        mark("forward", acts + cache + left + layer.fwd_transient, 0, grads, gather=gather)
        acts += per_block_saved + layer.fwd_kept    # what outlives the forward stays to the end of backward
        cache += cached_per_block
    return acts, cache


def _blocks_backward(s: TrainingSetup, mark: Any, layer: Any, window_mask: int, acts: int, grads: int,
                     block_grad: int, per_block_saved: int, gathers: tuple[int, int], block_input: int,
                     grows: bool) -> tuple[int, int]:
    """Backward through the blocks, last first; `big` is a block's moment as its largest kind's (a stack of unlike
    layers; a traced one whose order is known is walked layer by layer: _stack_backward). Under checkpointing the
    block's own tensors (and autocast's weight copies) are recomputed on top of its saved input. FSDP: a block's
    own gradients are in bwd_peak as in one process; the reduce-scatter input of the
    block before it in backward (its whole gradients) is kept until this block's post-backward
    (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py post_backward: reduce_scatter_states)."""
    gather_block, grad_gather_block = gathers
    fsdp = s.strategy == "fsdp"
    if layer.looped and not fsdp:       # a looped stack: walked run by run
        return _looped_backward(s, mark, layer, window_mask, acts, grads, block_grad, per_block_saved,
                                gather_block, block_input, grows)
    if layer.stack and not fsdp:        # a traced stack of unlike layers, walked layer by layer
        return _stack_backward(s, mark, layer.stack, window_mask, acts, grads, gather_block, block_input, grows,
                               layer.bwd_carry)
    left = layer.bwd_left
    big = layer.worst or layer
    recompute = s.grad_ckpt
    # the same for every block: its gradient waiting, what recomputing it adds, its own backward and recompute peaks
    waiting = _waiting_grad(s, block_input) if (fsdp or recompute) else 0
    recomputed = per_block_saved + big.weight_copies + window_mask if recompute else 0
    own_bwd, own_recompute = big.bwd_peak, big.saved + big.recompute_transient
    # what the running block holds is in own_bwd: below it, the others' saved tensors. A stack of unlike layers
    # takes the largest block as the running one (its own saved, not the average, comes off), with every other
    # block's still alive: exact when it runs first in backward (gemma4's wide-headed last layer), else over
    own_saved = per_block_saved if recompute else big.saved + big.weight_copies
    for k in range(s.model.num_layers):
        acts += layer.bwd_carry if k == 1 else 0     # the first block's backward left it for the whole stack
        held = (grad_gather_block if k else 0) if fsdp else grad_gather_block
        below = max(acts - own_saved, 0)
        mark("backward", below + recomputed + own_bwd, 0, grads, gather=gather_block + held)
        if fsdp:   # the block's post-backward: its whole gradients and their copy in the reduce-scatter input
            mark("backward", below + waiting, 0, grads, gather=gather_block + 2 * grad_gather_block)
        if recompute:   # the recompute's forward at down_proj, the gradient of the block's output waiting
            mark("backward", below + recomputed + own_recompute + waiting,
                 0, grads, gather=gather_block + (held if fsdp else 0))
        acts += left - per_block_saved
        if grows:
            grads += block_grad
    return acts, grads


def _looped_backward(s: TrainingSetup, mark: Any, layer: Any, window_mask: int, acts: int, grads: int,
                     block_grad: int, per_block_saved: int, gather_block: int, block_input: int,
                     grows: bool) -> tuple[int, int]:
    """Backward through a looped stack (a layer runs several times in one forward), its runs with gradients last
    first: each run's backward moment over what the runs before it keep, a run's saved bytes its layer's over its
    runs. A layer's gradients appear at its first run in backward, its last in forward: the first runs in backward
    make most of them while the stack's earlier runs still hold their saved tensors (hrm_text: every block's
    gradients beside 3 of its 5 runs' inputs)."""
    order = layer.looped
    L = max(s.model.num_layers, 1)
    per_run = -(-per_block_saved * L // len(order))
    big = layer.worst or layer
    recompute = s.grad_ckpt
    waiting = _waiting_grad(s, block_input) if recompute else 0
    moment = (big.weight_copies + window_mask + big.bwd_peak if recompute
              else max(big.bwd_peak - big.saved, 0))
    seen: set[int] = set()
    for i in reversed(order):
        mark("backward", acts + moment, 0, grads, gather=gather_block)
        if recompute:
            mark("backward", acts + moment + waiting, 0, grads, gather=gather_block)
        acts -= per_run
        if i not in seen:
            seen.add(i)
            acts += layer.bwd_left
            grads += block_grad if grows else 0
    return max(acts, 0), grads


def _stack_backward(s: TrainingSetup, mark: Any, stack: tuple[tuple[int, int, int, int], ...], window_mask: int,
                    acts: int, grads: int, gather_block: int, block_input: int, grows: bool,
                    carry: int = 0) -> tuple[int, int]:
    """Backward through a traced stack of unlike layers, last first, each layer as its kind: below it, what the
    layers before it keep; its own backward moment (under checkpointing on top of its recomputed input, and then
    with its output's gradient waiting); its own parameters' gradients after it (LoRA: the adapters' share)."""
    recompute = s.grad_ckpt
    waiting = _waiting_grad(s, block_input) if recompute else 0
    full = s.method == "full"
    # LoRA: each layer's own adapters (peft's count per layer: beam's MoE layers, whose backward runs first, hold 10×
    # its dense layers'; the average put its LoRA + checkpointing step 2.3 % under), else the average
    by_layer = s.model.lora_params_by_layer(s.lora_rank, s.lora_targets) if not full else ()
    if len(by_layer) != len(stack):
        by_layer = (s.trainable_params // max(s.model.num_layers, 1),) * len(stack)
    rng = rng_state_bytes(s)           # kept beside each checkpointed layer's input (forward: per_block_saved)
    for k, ((keep, moment, params, left), adapters) in enumerate(zip(reversed(stack), reversed(by_layer))):
        keep += rng
        acts += carry if k == 1 else 0     # the first layer's backward left it for the whole stack
        below = max(acts - keep, 0)
        recomputed = keep + window_mask if recompute else 0
        mark("backward", below + recomputed + moment, 0, grads, gather=gather_block)
        if recompute:
            mark("backward", below + recomputed + moment + waiting, 0, grads, gather=gather_block)
        acts += left - keep
        if grows:
            grads += _grad_share(params if full else adapters, s)
    return acts, grads


def rng_state_bytes(s: TrainingSetup) -> int:
    """What checkpointing keeps per block besides its input: the CPU generator's state, on a CPU device."""
    return CPU_RNG_STATE_BYTES if (s.grad_ckpt and s.device == "cpu") else 0


def _waiting_grad(s: TrainingSetup, block_input: int) -> int:
    """The gradient of a recomputed block's output while the block is recomputed: the shape of its input
    (`block_input` bytes in the residual dtype), and with a 16-bit residual also its fp32 form from the next
    RMSNorm's backward (torch.profiler, bf16 LoRA without autocast, bench/cpu_groundtruth.py)."""
    r = numerics(s).residual
    return block_input + (block_input * 4 // r if r < 4 else 0)


class _Peaks:
    """The step's running peaks: each phase's highest total, and the parts of the highest of all."""

    def __init__(self, static: int, held_logits: int = 0, root: int = 0):
        self.static = static
        self.held_logits = held_logits   # logits a loop keeps at every moment, counted with the logits
        self.root = root                 # FSDP: the root unit, whole from the first forward to the end of backward
        self._highest: tuple[int, str, int, int, int, int] = (-1, "", 0, 0, 0, 0)
        self.phase_peaks = {"generation": 0, "forward": 0, "loss": 0, "backward": 0, "step": 0}

    @property
    def parts(self) -> dict[str, Any]:
        """The highest moment of all, by part."""
        total, phase, act, logit, grad, opt = self._highest
        return {"total": total, "phase": phase, "activations": act, "logits": logit, "gradients": grad,
                "optimizer_extra": opt}

    def mark(self, phase: str, act: int, logit: int, grad: int, opt_extra: int = 0, gather: int = 0) -> None:
        logit += self.held_logits
        gather += self.root if phase in ("forward", "loss", "backward") else 0
        total = self.static + grad + act + logit + opt_extra + gather
        if total > self.phase_peaks[phase]:
            self.phase_peaks[phase] = total
        if total > self._highest[0]:       # a tuple, not a dict: the search marks this hundreds of thousands of times
            self._highest = (total, phase, act + gather, logit, grad, opt_extra)


def _gathers(s: TrainingSetup, head_weight_params: int) -> tuple[int, int, int, int]:
    """ZeRO-3 / FSDP: the gathered 16-bit copy of the block being computed plus the prefetched next one; the
    embedding matrix is gathered for the lookup and again (tied) for the output head; full fine-tuning's block
    gradient is unsharded too. (block, head, block gradient, root) bytes; zeros for other strategies."""
    m = s.model
    if not (s.strategy in ("zero3", "fsdp") and s.world_size > 1):
        return 0, 0, 0, 0
    gb = 2 if s.precision != "fp32" else 4
    blk = m.block_params()
    if s.strategy == "fsdp":
        return _fsdp_gathers(s, gb, blk)
    prefetch = min(blk, DS_PREFETCH_BUCKET_ELEMS)
    gather_head = gb * (m.embedding_params if m.tie_embeddings or not m.vocab_head else head_weight_params)
    return gb * (blk + prefetch), gather_head, gb * blk if s.method == "full" else 0, 0


def _fsdp_gathers(s: TrainingSetup, gb: int, blk: int) -> tuple[int, int, int, int]:
    """FSDP2 as the trainer wraps it (trainer/fsdp.py: fully_shard on every decoder block, then on the root), read off
    torch.profiler's memory timeline of 2-rank gloo steps (bench/cpu_groundtruth.py, the FSDP rows; torch 2.13's
    torch/distributed/fsdp/_fully_shard says why):
      root      every parameter outside the blocks (embeddings, final norm, lm_head) is one unit that FSDP2 does not
                reshard after forward: whole from the first forward to the end of backward;
      block     the block being computed is whole, and beside it one more block-sized buffer: in forward the flat
                all-gather output FSDP2 keeps until the next all-gather (comm_ctx.all_gather_state), in backward the
                next block, prefetched;
      head      between the last block's forward and the first block's backward (the loss) that last all-gather
                buffer: one block;
      gradient  a block's unsharded gradients before its reduce-scatter (the adapters' under LoRA).
    LoRA's adapters are sharded with their block, so each block gathers them too."""
    m = s.model
    adapters = s.trainable_params // max(m.num_layers, 1) if s.method != "full" else 0
    unit = gb * (blk + adapters)
    root = gb * max(0, m.params - sum(m.block_params(dense) * n for dense, n in m.block_kinds()))
    return 2 * unit, unit, gb * (blk if s.method == "full" else adapters), root


def _grad_share(n_params: int, s: TrainingSetup, root: bool = False) -> int:
    """Gradient bytes a group of parameters adds on this GPU as backward reaches it. FSDP's root unit (embeddings,
    lm_head) keeps its gradients whole until its reduce-scatter at the end of backward (`root`)."""
    nm = numerics(s)
    if s.method != "full":
        return nm.adapter * n_params
    per = nm.weight
    if s.strategy in ("zero2", "zero3") or (s.strategy == "fsdp" and not root):
        return per * n_params // s.world_size
    return per * n_params


def workspace_bytes(s: TrainingSetup) -> int:
    """cuBLAS workspaces inside the allocator (see CUBLAS_WORKSPACE_BYTES)."""
    if s.device == "cpu":
        return 0
    per = CUBLAS_WORKSPACE_BYTES.get(s.hardware.gpu.arch, CUBLAS_WORKSPACE_BYTES_OLDER)
    return CUBLAS_HANDLES * per


def overhead_bytes(s: TrainingSetup, allocated_peak: int) -> int:
    """CUDA context, NCCL buffers and the caching allocator's reserve above the allocated peak."""
    if s.device == "cpu":
        return 0
    from scaletrain.engine.estimate.calibration import for_setup

    cal = for_setup(s)   # `scaletrain validate --save` measured these on this GPU kind and stack
    ctx = CUDA_CONTEXT_BYTES + (NCCL_BUFFER_BYTES if s.world_size > 1 else 0)
    reserve = ALLOCATOR_RESERVE_FRACTION
    if cal is not None:
        ctx = cal.context_bytes if cal.context_bytes is not None else ctx
        reserve = cal.allocator_reserve_fraction if cal.allocator_reserve_fraction is not None else reserve
    return ctx + int(reserve * allocated_peak)


def estimate_memory(s: TrainingSetup, headroom_fraction: float = 0.10,
                    micro_batch: int | None = None) -> MemoryBreakdown:
    _refuse_unmodeled(s)
    sim = simulate_step(s, micro_batch)
    ms: ModelStates = sim["states"]
    parts = sim["parts"]
    ws = workspace_bytes(s)
    allocated = parts["total"] + ws
    vllm = sim["generation"].vllm_share    # a colocated vLLM engine allocates outside torch's allocator
    overhead = ws + overhead_bytes(s, allocated) + vllm
    return MemoryBreakdown(
        weights_bytes=ms.weights + reference_weight_bytes(s),
        gradients_bytes=parts["gradients"],
        optimizer_bytes=ms.optimizer + parts["optimizer_extra"],
        activations_bytes=parts["activations"],
        logits_bytes=parts["logits"],
        overhead_bytes=overhead,
        peak_phase=parts["phase"],
        capacity_bytes=s.hardware.memory_per_process_bytes,
        headroom_fraction=headroom_fraction,
        phase_peaks={k: v + ws for k, v in sim["phase_peaks"].items()} if ws else sim["phase_peaks"],
        model_states_unsharded_bytes=ms.unsharded,
        host_bytes_per_gpu=ms.host,
        workspace_bytes=ws,
        objective=str(s.objective),
        terms=objective_terms(s, sim["head"], parts["phase"]),
        outside_allocator_bytes=vllm,
    )

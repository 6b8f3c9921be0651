"""Per-GPU memory model, readable top to bottom.

The peak of a training step is the largest of a few moments, not the sum of every buffer ever allocated:

  forward      model states + activations saved so far + the layer being computed
  loss         ... + logits and the fp32 log-softmax of cross-entropy (the spike hand guides miss)
  backward     ... all activations still saved + the cross-entropy gradient (3 fp32 B·S·V tensors), then
               activations are freed layer by layer while gradients appear
  step         model states + gradients + the optimizer's temporaries

`simulate_step` walks these moments for one micro-batch with the tensors the stack really keeps (see the
per-term docstrings), and `estimate_memory` reports the breakdown at the peak moment, plus the CUDA
context and allocator reserve. Every term is named after what it is; every constant says where it came from.
Ground truth: tests/test_memory_groundtruth.py compares against torch.profiler on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scaletrain.engine.model.breakdown import MemoryBreakdown
from scaletrain.engine.model.setup import TrainingSetup, quantized_linear_bytes

# ---- constants (each one named, sourced, and overridable by calibration later) --------------------------------
GiB = 1024**3
MiB = 1024**2

# CUDA context + cuBLAS/cuDNN workspaces created by the first kernels, torch 2.x with lazy module loading.
# HF model-memory-anatomy doc: 1.3 GB on V100 (eager module loading); torch ≥ 2.1 loads kernels lazily:
# ~0.5 GiB seen on A100/H100 in nvidia-smi after the first matmul. Calibrated per GPU by `validate --save`.
CUDA_CONTEXT_BYTES = 512 * MiB
# NCCL communicator buffers per process when world > 1 (NCCL_BUFFSIZE 4 MiB × channels × peers, order 100s MiB).
NCCL_BUFFER_BYTES = 256 * MiB
# Caching-allocator reserve above the allocated peak (fragmentation). AnswerAI Llama-2-7B LoRA: 8.28 GiB
# allocated vs 10.24 GiB reserved (24 %); Megatron uses ×1.05. We take 8 % until a GPU calibration replaces it.
ALLOCATOR_RESERVE_FRACTION = 0.08
# DeepSpeed bucket defaults as our ds_config writer emits them (writers read the same numbers from here).
DS_REDUCE_BUCKET_ELEMS = 200_000_000     # ipg / reduce bucket, elements (DeepSpeed default 5e8; we write 2e8)
DS_ALLGATHER_BUCKET_ELEMS = 200_000_000  # ZeRO-1/2 all-gather bucket after the step
DS_SUB_GROUP_ELEMS = 1_000_000_000       # ZeRO-3 optimizer sub-group (DeepSpeed default 1e9)
DS_PREFETCH_BUCKET_ELEMS = 50_000_000    # ZeRO-3 stage3_prefetch_bucket_size (DeepSpeed default 5e7)


# ---- model states ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelStates:
    """Bytes one GPU keeps for the whole step (weights, optimizer) and the gradient bytes of a full step."""

    weights: int              # trained model's weights resident on this GPU (+ resident inference models)
    optimizer: int            # optimizer states incl. fp32 master copies kept by the optimizer
    gradients_full: int       # gradient bytes once backward finished (what the step reads)
    gradients_persistent: int # gradient buffers alive during forward as well (accumulation, DeepSpeed partitions)
    step_temporaries: int     # extra bytes the optimizer step allocates
    host: int                 # bytes offloaded to CPU RAM
    unsharded: int            # weights + grads + optimizer with no sharding at all


def _compute_bytes(s: TrainingSetup) -> int:
    return s.precision.compute_bytes


def _uses_deepspeed(s: TrainingSetup) -> bool:
    return s.strategy.uses_deepspeed


def _master_in_model(s: TrainingSetup) -> bool:
    """accelerate/FSDP mixed precision keep fp32 weights in the model and autocast; DeepSpeed keeps 16-bit
    weights and an fp32 master copy inside its optimizer."""
    return s.precision == "fp32" or not _uses_deepspeed(s)


def optimizer_state_bytes_per_param(optimizer: str) -> float:
    """States per trainable parameter, excluding any fp32 master copy.

    AdamW: exp_avg + exp_avg_sq in fp32 (8 B). bitsandbytes 8-bit AdamW: two uint8 states (2 B) plus an fp32
    absmax per 256-value block for each (8/256 B). SGD with momentum: one fp32 buffer (4 B).
    """
    return {"adamw": 8.0, "adamw-8bit": 2.0 + 8.0 / 256, "sgd": 4.0}[optimizer]


def model_states(s: TrainingSetup) -> ModelStates:
    m = s.model
    n = s.world_size
    P = m.params
    T = s.trainable_params
    cb = _compute_bytes(s)
    opt_pp = optimizer_state_bytes_per_param(s.optimizer)
    ds = _uses_deepspeed(s)
    shard_opt = s.strategy.shards_optimizer
    shard_grad = s.strategy.shards_gradients
    shard_param = s.strategy.shards_params

    # -- weights ------------------------------------------------------------------------------------------------
    if s.method == "full":
        wbytes_pp = 4 if _master_in_model(s) else cb
        frozen_bytes = 0
        trainable_weight_bytes = wbytes_pp * P
    else:
        # Frozen base: targeted linears quantized (QLoRA NF4 / 8-bit) or 16-bit; the rest (embeddings, norms,
        # lm_head) stays 16-bit, except that peft's prepare_model_for_kbit_training upcasts it to fp32.
        lin = m.targeted_linear_params(s.lora_targets)
        rest = P - lin
        lin_bytes = quantized_linear_bytes(lin, s.base_bits) if s.base_bits in (4, 8) else cb * lin
        rest_bytes = (4 if s.base_bits in (4, 8) else cb) * rest
        frozen_bytes = lin_bytes + rest_bytes
        # PEFT keeps adapters in fp32 (autocast_adapter_dtype=True); DeepSpeed casts the module to 16-bit.
        wbytes_pp = cb if ds and s.precision != "fp32" else 4
        trainable_weight_bytes = wbytes_pp * T
    weights = trainable_weight_bytes + frozen_bytes
    if shard_param:
        weights = weights // n
    if s.offload == "all":
        host_weights, weights = weights, 0
    else:
        host_weights = 0
    weights += sum(r.weight_bytes() for r in s.residents)

    # -- optimizer (+ DeepSpeed's fp32 master) -----------------------------------------------------------------
    master_pp = 4 if (ds and s.precision != "fp32") else 0
    optimizer = int((opt_pp + master_pp) * T)
    if shard_opt:
        optimizer //= n
    if s.device == "cpu" and s.optimizer == "adamw" and not ds:
        # torch keeps AdamW's `step` as a 0-dim fp32 tensor per parameter tensor, on the host (so it only
        # counts against memory when the host is the device)
        optimizer += 4 * (m.tensor_count if s.method == "full" else 2 * len(s.lora_targets) * m.num_layers)
    host_opt = 0
    if s.offload.moves_optimizer:
        host_opt, optimizer = optimizer, 0

    # -- gradients -------------------------------------------------------------------------------------------------
    # gradients take the trainable weights' dtype: fp32 under accelerate/FSDP mixed precision and for PEFT's
    # fp32 adapters, 16-bit inside a DeepSpeed model
    grad_pp = cb if ds and s.precision != "fp32" else 4
    if ds and s.precision != "fp32":
        # DeepSpeed: 16-bit grads for the ipg bucket + an fp32 gradient partition for the step (ZeRO-1/2);
        # ZeRO-3 keeps the grad partition in 16-bit and converts one optimizer sub-group to fp32 at the step.
        if s.strategy == "zero3":
            grads_full = cb * T // n
            grads_persistent = grads_full
            step_fp32_grad = 4 * min(T // n, DS_SUB_GROUP_ELEMS)
        elif s.strategy == "zero2":
            grads_full = 4 * T // n + cb * min(T, DS_REDUCE_BUCKET_ELEMS)
            grads_persistent = 4 * T // n
            step_fp32_grad = 0
        else:  # zero1: full 16-bit grads all-reduced, fp32 partition for the step
            grads_full = cb * T + 4 * T // n
            grads_persistent = 4 * T // n
            step_fp32_grad = 0
        if s.offload.moves_optimizer:
            # with the optimizer on the host, DeepSpeed copies each reduced gradient partition to pinned CPU
            # memory (fp32) as backward produces it; the GPU keeps only the reduce bucket in flight
            host_opt += 4 * T // n
            grads_full = cb * min(T, DS_REDUCE_BUCKET_ELEMS)
            grads_persistent = 0
            step_fp32_grad = 0
    else:
        grads_full = grad_pp * T
        if shard_grad:
            grads_full //= n
        # DDP (world > 1) allocates its all-reduce buckets when it wraps the model and the trainer makes the
        # gradients views into them (gradient_as_bucket_view): gradient memory is there from the first forward.
        ddp_buckets = s.strategy == "ddp" and n > 1
        grads_persistent = grads_full if s.grad_accum > 1 or ddp_buckets else 0
        step_fp32_grad = 0

    # -- optimizer step temporaries ----------------------------------------------------------------------------
    # torch AdamW on CUDA runs the multi-tensor (foreach) path: _foreach_sqrt(exp_avg_sqs) allocates one fp32
    # tensor per parameter at once (+4 B/trainable param). On CPU it runs the single-tensor path, whose
    # `exp_avg_sq.sqrt() / bias_correction2_sqrt` holds two temporaries of the largest parameter at a time.
    # DeepSpeed's fused/CPU Adam works in place.
    if s.offload != "none" or ds or s.optimizer != "adamw":
        step_temp = step_fp32_grad
    elif s.device == "cpu":
        largest = m.embedding_params if s.method == "full" else _largest_lora_tensor(s)
        step_temp = 2 * 4 * largest
    else:
        step_temp = 4 * T // (n if shard_opt else 1)

    unsharded = (trainable_weight_bytes + frozen_bytes + int((opt_pp + master_pp) * T)
                 + (grad_pp if not ds else cb + 4) * T)
    return ModelStates(weights, optimizer, grads_full, grads_persistent, step_temp, host_weights + host_opt,
                       unsharded)


def _largest_lora_tensor(s: TrainingSetup) -> int:
    shapes = s.model.linear_shapes()
    return max(s.lora_rank * max(shapes[t][0], shapes[t][1]) for t in s.lora_targets)


# ---- activations -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerActivations:
    """Bytes one decoder block keeps for backward, split at the attention/MLP boundary.

    Backward runs the MLP half first and frees its tensors before the attention half runs, so the block's
    backward peak is max(everything + MLP-gradient temporaries, attention half + attention temporaries).
    """

    saved_attn: int      # block input, attention-side norms, q/k/v, attention output, softmax (eager)
    saved_mlp: int       # residual after attention, MLP-side norms, the four B·S·I MLP tensors
    fwd_transient: int   # extra bytes alive while the block runs forward
    mlp_bwd_transient: int
    attn_bwd_transient: int

    @property
    def saved(self) -> int:
        return self.saved_attn + self.saved_mlp

    @property
    def bwd_peak(self) -> int:
        """Peak bytes of this block's own tensors during its backward (saved + gradient temporaries)."""
        return max(self.saved + self.mlp_bwd_transient, self.saved_attn + self.attn_bwd_transient)


def autocast_regime(s: TrainingSetup) -> bool:
    """accelerate mixed precision on fp32 weights (full fine-tuning under DDP): torch.autocast casts each
    linear's input and weight to 16-bit per call, so the residual stream stays fp32 and every linear saves its
    own 16-bit copies for backward. DeepSpeed, FSDP's MixedPrecision and 16-bit LoRA bases compute in a
    16-bit model instead."""
    return s.precision in ("bf16", "fp16") and s.method == "full" and s.strategy == "ddp"


def autocast_weight_copies_bytes(s: TrainingSetup) -> int:
    """16-bit copies of one block's linear weights that autocast makes (and backward keeps) per forward."""
    if not autocast_regime(s):
        return 0
    return 2 * sum(a * b for a, b, _ in s.model.linear_shapes().values())


def block_activations(s: TrainingSetup, micro_batch: int | None = None) -> LayerActivations:
    """Tensors a decoder block saves for backward, per micro-batch (HF Llama-style eager/sdpa blocks).

    Residual stream, norms, q/k/v after RoPE, the attention output, and four B·S·I MLP tensors
    (gate, up, act(gate), act·up). Eager attention also keeps the fp32 softmax probabilities (B·heads·S²).
    Under mixed precision, RMSNorm's fp32 upcast is saved as well; LoRA adds its rank-r intermediates.
    """
    m = s.model
    b = micro_batch or s.micro_batch
    t = b * s.seq_len
    h, i, qd, kvd = m.hidden_size, m.intermediate_size, m.q_dim, m.kv_dim
    e = _compute_bytes(s)
    full = s.method == "full"
    norm_upcast = 4 if e == 2 else 0   # RMSNorm: hidden.to(float32) is a new tensor only for 16-bit inputs
    fam = m.family
    s2 = b * m.num_heads * s.seq_len * s.seq_len   # attention score elements

    def norm_saved(width: int) -> int:
        # pow(2) and x*rsqrt save the (upcast) input; weight*y saves y only if the norm weight trains
        return t * width * (norm_upcast + (e if full else 0))

    def lora_saved(targets: set[str]) -> int:
        if full:
            return 0
        shapes = m.linear_shapes()
        mine = [x for x in s.lora_targets if x in targets]
        out = len(mine) * t * s.lora_rank * 4                           # lora_A output (fp32 adapters)
        if e == 2:
            out += sum(t * shapes[x][0] * e for x in mine)              # input cast for the fp32 adapter path
        return out

    amp = autocast_regime(s)
    res = 4 if amp else e                              # residual stream bytes: fp32 under autocast (fp32 weights)

    def norms(kinds: tuple[str, ...], readers: int) -> int:
        """Norm tensors on one side of the block; `readers` linears read the pre-norm output (q,k,v or gate,up)."""
        out = 0
        for kind in fam["norms"]:
            if kind not in kinds:
                continue
            if not amp:
                out += norm_saved(h) + t * h * e       # pre-norm output (linear input) / post-norm input
            elif kind.startswith("pre"):
                out += t * h * 4 + readers * t * h * e  # fp32 y, and each reader's own 16-bit cast of the output
            else:
                out += t * h * (4 + 4)                 # 16-bit sublayer output upcast, fp32 y
        if amp and not any(k.startswith("pre") and k in kinds for k in fam["norms"]):
            out += readers * t * h * e                 # no pre-norm (OLMo 2): readers cast the fp32 residual
        return out

    # -- attention half ----------------------------------------------------------------------------------------
    attn = t * h * res                                 # block input (residual stream)
    attn += norms(("pre_attn", "post_attn"), 3)
    if fam["qk_norm"]:
        attn += norm_saved(qd + kvd) + t * (qd + kvd) * e
    repeat_kv = s.attn == "eager"                      # sdpa on torch ≥ 2.5 passes enable_gqa (no repeat)
    k_saved = qd if repeat_kv else kvd
    attn += t * (qd + 2 * k_saved) * e                 # q, k, v after RoPE (k, v repeated to all heads: eager)
    attn += t * qd * e                                 # attention output as o_proj input
    if s.attn == "eager":
        attn += s2 * (4 + (e if e == 2 else 0))        # fp32 softmax (+ its 16-bit cast under mixed precision)
    else:
        attn += t * qd * e                             # sdpa keeps its output for backward
        attn += b * m.num_heads * s.seq_len * 4        # flash/efficient kernels keep the fp32 logsumexp
    attn += lora_saved({"q_proj", "k_proj", "v_proj", "o_proj"})

    # -- MLP half ------------------------------------------------------------------------------------------------
    mlp = t * h * res                                  # residual after attention
    mlp += norms(("pre_mlp", "post_mlp"), 2)
    mlp += 4 * t * i * e                               # gate, up, act(gate), act·up
    mlp += lora_saved({"gate_proj", "up_proj", "down_proj"})

    # forward: eager holds the raw scores and the masked scores (fp32) while softmax runs
    fwd_t = 2 * s2 * 4 if s.attn == "eager" else t * i * e
    # backward: gradients of the B·S·I intermediates; eager's softmax input/output gradients (2 × B·heads·S²)
    mlp_bwd_t = 2 * t * i * e
    attn_bwd_t = 2 * s2 * 4 if s.attn == "eager" else 3 * t * qd * e
    return LayerActivations(attn, mlp, fwd_t, mlp_bwd_t, attn_bwd_t)


def logits_bytes(s: TrainingSetup, micro_batch: int | None = None) -> dict[str, int]:
    """Cross-entropy over the vocabulary, as transformers' ForCausalLMLoss runs it.

    lm_head writes B·S·V logits in the compute dtype; the loss upcasts them to fp32 (a copy under 16-bit) and
    log_softmax keeps its fp32 output for backward. Backward then holds that output, its incoming gradient and
    the gradient it produces: three fp32 B·S·V tensors at once.
    """
    b = micro_batch or s.micro_batch
    tv = b * s.seq_len * s.model.vocab_size
    e = _compute_bytes(s)
    saved = 4 * tv                                   # log_softmax output
    fwd = e * tv + (4 * tv if e == 2 else 0)         # logits (+ fp32 copy) while log_softmax runs
    bwd = 4 * tv + 4 * tv                            # grad of log_softmax output, grad of its input
    return {"saved": saved, "forward_transient": fwd, "backward_transient": bwd}


# ---- the step, moment by moment --------------------------------------------------------------------------------
def simulate_step(s: TrainingSetup, micro_batch: int | None = None) -> dict[str, Any]:
    """Walk one (last) micro-step and the optimizer step; return the peak of each phase and the peak's parts."""
    m = s.model
    b = micro_batch or s.micro_batch
    t = b * s.seq_len
    e = _compute_bytes(s)
    ms = model_states(s)
    layer = block_activations(s, b)
    lg = logits_bytes(s, b)
    n = s.world_size
    L = m.num_layers
    static = ms.weights + ms.optimizer

    # ZeRO-3 / FSDP: the gathered 16-bit copy of the block being computed plus the prefetched next one;
    # the embedding matrix is gathered for the lookup and again (tied) for lm_head.
    if s.strategy.shards_params and n > 1:
        gb = 2 if s.precision != "fp32" else 4
        blk = m.block_params()
        prefetch = min(blk, DS_PREFETCH_BUCKET_ELEMS) if s.strategy == "zero3" else blk
        gather_block = gb * (blk + prefetch)
        gather_head = gb * (m.embedding_params if m.tie_embeddings else m.vocab_size * m.hidden_size)
        grad_gather_block = gb * blk if s.method == "full" else 0
    else:
        gather_block = gather_head = grad_gather_block = 0

    # what checkpointing keeps per block, and what recomputing one block costs in backward
    res = 4 if autocast_regime(s) else e
    mask = b * s.seq_len * s.seq_len * res if s.attn == "eager" else 0
    wcopy = autocast_weight_copies_bytes(s)   # autocast's cast cache: held through forward; saved without ckpt
    if s.grad_ckpt:
        per_block_saved = t * m.hidden_size * res
        recompute = True
    else:
        per_block_saved = layer.saved + wcopy
        recompute = False

    # eager attention: transformers builds one additive causal mask (B×1×S×S, residual dtype) for all blocks;
    # it lives through backward only when checkpointing saves it as a block input, else until forward returns
    embed_out = mask if s.grad_ckpt else 0
    if autocast_regime(s):   # fp32 input and y, the lm_head input cast, lm_head's own weight copy
        final_norm = t * m.hidden_size * (4 + 4 + e) + 2 * m.vocab_size * m.hidden_size
    else:
        final_norm = t * m.hidden_size * (e + (4 if e == 2 else 0) + (e if s.method == "full" else 0))

    grads = ms.gradients_persistent
    acts = 0
    parts_at_peak: dict[str, Any] = {}
    phase_peaks = {"forward": 0, "loss": 0, "backward": 0, "step": 0}

    def mark(phase: str, act: int, logit: int, grad: int, opt_extra: int = 0, gather: int = 0) -> None:
        total = static + grad + act + logit + opt_extra + gather
        if total > phase_peaks[phase]:
            phase_peaks[phase] = total
        if total > parts_at_peak.get("total", -1):
            parts_at_peak.update(total=total, phase=phase, activations=act + gather, logits=logit,
                                 gradients=grad, optimizer_extra=opt_extra)

    # forward: blocks one by one
    acts = embed_out
    cache = 0 if s.grad_ckpt else mask        # alive only until the forward returns: autocast copies (ckpt), mask
    for _ in range(L):
        mark("forward", acts + cache + layer.fwd_transient, 0, grads, gather=gather_block)
        acts += per_block_saved
        cache += wcopy if recompute else 0
    acts += final_norm
    # loss: logits + fp32 copy + log_softmax output while it runs
    mark("loss", acts + cache, lg["forward_transient"] + lg["saved"], grads, gather=gather_head)
    # backward through cross-entropy: saved output + its grad + input grad
    mark("backward", acts, lg["saved"] + lg["backward_transient"], grads, gather=gather_head)
    # lm_head backward: logits grad (compute dtype) is consumed, the lm_head/embedding weight grad appears
    head_grad = 0
    if s.method == "full" and not (s.strategy.uses_deepspeed and s.precision != "fp32"):
        head_grad = _grad_share(m.vocab_size * m.hidden_size, s)
    head_grad_gather = gather_head if s.method == "full" else 0   # ZeRO-3/FSDP: the unsharded lm_head grad
    mark("backward", acts, e * t * m.vocab_size, grads, gather=gather_head + head_grad_gather)
    if ms.gradients_persistent == 0:   # else the buffers (accumulation, DDP buckets) already hold it
        grads += head_grad
    acts -= final_norm
    block_grad = _grad_share(m.block_params() if s.method == "full" else s.trainable_params // max(L, 1), s)
    for _ in range(L):
        # under checkpointing the block's own tensors are recomputed on top of its saved input
        below = acts - per_block_saved
        mark("backward", below + (per_block_saved if recompute else 0) + layer.bwd_peak, 0, grads,
             gather=gather_block + grad_gather_block)
        acts -= per_block_saved
        if ms.gradients_persistent == 0:
            grads += block_grad
    grads = max(grads, ms.gradients_full) if ms.gradients_persistent == 0 else ms.gradients_full
    mark("backward", 0, 0, grads)
    # optimizer step
    mark("step", 0, 0, grads, opt_extra=ms.step_temporaries)
    return {"phase_peaks": phase_peaks, "parts": parts_at_peak, "states": ms}


def _grad_share(n_params: int, s: TrainingSetup) -> int:
    """Gradient bytes a group of parameters adds on this GPU as backward reaches it."""
    if s.method != "full":
        return 4 * n_params
    per = 4 if _master_in_model(s) else _compute_bytes(s)
    if s.strategy.shards_gradients:
        return per * n_params // s.world_size
    return per * n_params


def overhead_bytes(s: TrainingSetup, allocated_peak: int) -> int:
    """CUDA context, NCCL buffers and the caching allocator's reserve above the allocated peak."""
    if s.device == "cpu":
        return 0
    from scaletrain.engine.model.calibration import for_setup

    cal = for_setup(s)   # `scaletrain validate --save` measured these on this GPU kind and stack
    ctx = CUDA_CONTEXT_BYTES + (NCCL_BUFFER_BYTES if s.world_size > 1 else 0)
    reserve = ALLOCATOR_RESERVE_FRACTION
    if cal is not None:
        ctx = cal.context_bytes if cal.context_bytes is not None else ctx
        reserve = cal.allocator_reserve_fraction if cal.allocator_reserve_fraction is not None else reserve
    return ctx + int(reserve * allocated_peak)


def estimate_memory(s: TrainingSetup, headroom_fraction: float = 0.10,
                    micro_batch: int | None = None) -> MemoryBreakdown:
    sim = simulate_step(s, micro_batch)
    ms: ModelStates = sim["states"]
    parts = sim["parts"]
    allocated = parts["total"]
    overhead = overhead_bytes(s, allocated)
    return MemoryBreakdown(
        weights_bytes=ms.weights,
        gradients_bytes=parts["gradients"],
        optimizer_bytes=ms.optimizer + parts["optimizer_extra"],
        activations_bytes=parts["activations"],
        logits_bytes=parts["logits"],
        overhead_bytes=overhead,
        peak_phase=parts["phase"],
        capacity_bytes=s.hardware.gpu.memory_bytes,
        headroom_fraction=headroom_fraction,
        phase_peaks=sim["phase_peaks"],
        model_states_unsharded_bytes=ms.unsharded,
        host_bytes_per_gpu=ms.host,
    )

"""Per-GPU memory model, readable top to bottom.

The peak of a training step is the largest of a few moments, not the sum of every buffer ever allocated:

  forward      model states + activations saved so far + the layer being computed
  loss         ... + logits and the fp32 log-softmax of cross-entropy (the spike hand guides miss)
  backward     ... all activations still saved + the cross-entropy gradient (3 fp32 B·S·V tensors), then
               activations are freed layer by layer while gradients appear
  step         model states + gradients + the optimizer's temporaries

`numerics` says which dtype every tensor has in the launched stack; `block_activations` lists, per token, what
one decoder block saves for backward under those dtypes (checked byte for byte against torch's saved-tensor hooks
on CPU, tests/test_memory_saved.py); `simulate_step` walks the moments above for one micro-batch and
`estimate_memory` reports the breakdown at the peak, plus CUDA context, workspaces and the allocator reserve.
Every term is named after what it is; every constant says where it came from.
Ground truth: tests/test_memory_groundtruth.py compares whole steps against torch.profiler on CPU, and
bench/results/h100-2026-11-23.json against torch.cuda.max_memory_allocated on an H100.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .setup import TrainingSetup, quantized_linear_bytes

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
CUBLAS_HANDLES = 2
# DeepSpeed bucket defaults as our ds_config writer emits them (writers read the same numbers from here).
DS_REDUCE_BUCKET_ELEMS = 200_000_000     # ipg / reduce bucket, elements (DeepSpeed default 5e8; we write 2e8)
DS_ALLGATHER_BUCKET_ELEMS = 200_000_000  # ZeRO-1/2 all-gather bucket after the step
DS_SUB_GROUP_ELEMS = 1_000_000_000       # ZeRO-3 optimizer sub-group (DeepSpeed default 1e9)
DS_PREFETCH_BUCKET_ELEMS = 50_000_000    # ZeRO-3 stage3_prefetch_bucket_size (DeepSpeed default 5e7)
DS_STRATEGIES = ("zero1", "zero2", "zero3")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU bytes at the predicted peak moment. `total_bytes` = sum of the six components.

    `overhead_bytes` holds what is not a tensor of the model: the cuBLAS workspaces (allocated through torch's
    allocator, so inside torch.cuda.max_memory_allocated), the CUDA context and NCCL buffers, and the
    caching allocator's reserve above the allocated peak (both outside it).
    """

    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    logits_bytes: int
    overhead_bytes: int
    peak_phase: str                    # "forward" | "loss" | "backward" | "step"
    capacity_bytes: int
    headroom_fraction: float
    phase_peaks: dict[str, int] = field(default_factory=dict)   # allocated bytes at each phase's peak
    model_states_unsharded_bytes: int = 0                         # what one GPU would hold without sharding
    host_bytes_per_gpu: int = 0                                   # CPU RAM for offloaded states, per GPU
    workspace_bytes: int = 0                                      # the part of overhead inside the allocator

    @property
    def allocated_peak_bytes(self) -> int:
        """What torch.cuda.max_memory_allocated reports at the peak (the profiler's peak on CPU)."""
        return self.total_bytes - self.overhead_bytes + self.workspace_bytes

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.logits_bytes + self.overhead_bytes)

    @property
    def usable_bytes(self) -> int:
        return int(self.capacity_bytes * (1.0 - self.headroom_fraction))

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    @property
    def headroom_bytes(self) -> int:
        """Spare bytes below the card's capacity at the peak (negative: over capacity)."""
        return self.capacity_bytes - self.total_bytes

    def components(self) -> dict[str, int]:
        return {
            "weights": self.weights_bytes, "gradients": self.gradients_bytes, "optimizer": self.optimizer_bytes,
            "activations": self.activations_bytes, "logits": self.logits_bytes, "overhead": self.overhead_bytes,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "per_gpu_bytes": {**self.components(), "total": self.total_bytes},
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "peak_phase": self.peak_phase,
            "phase_peak_bytes": dict(self.phase_peaks),
            "capacity_bytes": self.capacity_bytes,
            "usable_bytes": self.usable_bytes,
            "headroom_fraction": self.headroom_fraction,
            "fits": self.fits,
            "headroom_bytes": self.headroom_bytes,
            "model_states_unsharded_bytes": self.model_states_unsharded_bytes,
            "host_bytes_per_gpu": self.host_bytes_per_gpu,
            "workspace_bytes": self.workspace_bytes,
        }


# ---- numerics: the dtype of every kind of tensor in the launched stack ----------------------------------------
@dataclass(frozen=True)
class Numerics:
    """Bytes per element of each kind of tensor, as the stack the plan launches really keeps them."""

    compute: int             # linear outputs, attention tensors, MLP intermediates, logits
    residual: int            # the residual stream between blocks, and what the RMSNorms return
    autocast: bool           # torch.autocast (accelerate's mixed precision) casts each linear's input per call
    weight: int              # a trainable weight of full fine-tuning as the model holds it
    frozen: int              # a frozen base weight outside quantized linears (LoRA / QLoRA)
    adapter: int             # a LoRA adapter weight (PEFT keeps fp32; DeepSpeed casts the module to 16-bit)
    trainable_copies: bool   # fp32 trainable weights under autocast: a 16-bit copy per forward, cached, saved
    frozen_copies: bool      # fp32 frozen block linears under autocast: a 16-bit copy per call, saved for backward
    fp32_head: bool          # a frozen fp32 lm_head under autocast: its 16-bit copy is saved for backward
    state: int               # an optimizer-state element: fp32, or bf16 when torch AdamW runs on bf16 weights
    mlp: int = 0             # the MLP's gate/up/act tensors: bitsandbytes' 4/8-bit linears return their input's
                             # dtype (fp32 under QLoRA's fp32 residual); the compute dtype otherwise (0: compute)

    @property
    def mlp_bytes(self) -> int:
        return self.mlp or self.compute


def uses_deepspeed(s: TrainingSetup) -> bool:
    return s.strategy in DS_STRATEGIES


def numerics(s: TrainingSetup) -> Numerics:
    """Which dtypes the launched stack uses (accelerate + DeepSpeed/FSDP + transformers + PEFT).

    accelerate's mixed precision keeps the model's own weights and wraps forward in torch.autocast; DeepSpeed
    casts the module to 16-bit and keeps an fp32 master in its optimizer; FSDP2's MixedPrecisionPolicy gathers
    16-bit copies of fp32 shards; `--master-weights bf16` trains bf16 weights with no fp32 copy at all. PEFT keeps
    adapters in fp32 and prepare_model_for_kbit_training upcasts every non-quantized weight to fp32 (QLoRA).
    """
    if s.precision == "fp32":
        return Numerics(4, 4, False, 4, 4, 4, False, False, False, 4)
    c = 2
    if s.method == "full":
        if uses_deepspeed(s):
            return Numerics(c, c, False, c, 0, 0, False, False, False, 4)
        if s.master_weights == "bf16":
            return Numerics(c, c, False, c, 0, 0, False, False, False, c)
        if s.strategy == "fsdp":
            return Numerics(c, c, False, 4, 0, 0, False, False, False, 4)
        return Numerics(c, 4, True, 4, 0, 0, True, False, False, 4)
    if uses_deepspeed(s):
        return Numerics(c, c, False, 0, c, c, False, False, False, 4)
    fp32_base = s.base_bits in (4, 8, 32)          # QLoRA: upcast by prepare_model_for_kbit_training
    if s.strategy == "fsdp":
        return Numerics(c, c, True, 0, c, 4, False, False, False, 4)
    quantized = s.base_bits in (4, 8)
    return Numerics(c, 4 if fp32_base else c, True, 0, 4 if fp32_base else c, 4, False, s.base_bits == 32,
                    fp32_base, 4, mlp=4 if quantized else 0)


def autocast_regime(s: TrainingSetup) -> bool:
    """fp32 weights computed in 16-bit by torch.autocast (accelerate mixed precision on an fp32 model)."""
    nm = numerics(s)
    return nm.autocast and nm.residual == 4


# ---- model states ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelStates:
    """Bytes one GPU keeps for weights and optimizer, and its gradient bytes at each moment of a step."""

    weights: int              # trained model's weights resident on this GPU (+ resident inference models)
    optimizer: int            # optimizer states incl. fp32 master copies kept by the optimizer
    gradients_persistent: int # gradient buffers alive during forward (accumulation, DDP buckets, ZeRO-3 partition)
    gradients_backward: int   # gradient bytes once backward finished
    gradients_step: int       # gradient bytes while the optimizer steps (DeepSpeed's fp32 conversion included)
    step_temporaries: int     # extra bytes the optimizer step allocates
    host: int                 # bytes offloaded to CPU RAM
    unsharded: int            # weights + grads + optimizer with no sharding at all
    grows_in_backward: bool   # gradients appear block by block in backward (else they sit in buffers from the start)

    @property
    def gradients_full(self) -> int:
        return self.gradients_backward


def optimizer_state_bytes_per_param(optimizer: str, state_bytes: int = 4) -> float:
    """States per trainable parameter, excluding any fp32 master copy.

    AdamW: exp_avg + exp_avg_sq in the state dtype (fp32: 8 B; torch AdamW on bf16 weights keeps bf16 states: 4 B).
    bitsandbytes 8-bit AdamW: two uint8 states (2 B) plus an fp32 absmax per 256-value block for each (8/256 B).
    SGD with momentum: one buffer in the state dtype.
    """
    return {"adamw": 2.0 * state_bytes, "adamw-8bit": 2.0 + 8.0 / 256, "sgd": float(state_bytes)}[optimizer]


def _ds_bucket(s: TrainingSetup, cb: int) -> int:
    """One DeepSpeed ipg/reduce bucket (16-bit), never larger than what it collects."""
    return cb * min(s.trainable_params, DS_REDUCE_BUCKET_ELEMS)


def model_states(s: TrainingSetup) -> ModelStates:
    m = s.model
    n = s.world_size
    P = m.params
    T = s.trainable_params
    nm = numerics(s)
    cb = nm.compute
    opt_pp = optimizer_state_bytes_per_param(s.optimizer, nm.state)
    ds = uses_deepspeed(s)
    shard_opt = s.strategy in ("zero1", "zero2", "zero3", "fsdp")
    shard_grad = s.strategy in ("zero2", "zero3", "fsdp")
    shard_param = s.strategy in ("zero3", "fsdp")

    # -- weights ------------------------------------------------------------------------------------------------
    if s.method == "full":
        trainable_weight_bytes = nm.weight * P
        frozen_bytes = 0
    else:
        # Frozen base: targeted linears quantized (QLoRA NF4 / 8-bit) or in the base dtype; the rest (embeddings,
        # norms, lm_head) in the base dtype, fp32 under QLoRA (prepare_model_for_kbit_training).
        lin = m.targeted_linear_params(s.lora_targets)
        lin_bytes = quantized_linear_bytes(lin, s.base_bits) if s.base_bits in (4, 8) else nm.frozen * lin
        frozen_bytes = lin_bytes + nm.frozen * (P - lin)
        trainable_weight_bytes = nm.adapter * T
    weights = trainable_weight_bytes + frozen_bytes
    if shard_param:
        weights = weights // n
    host_weights = 0
    if s.offload == "all":
        host_weights, weights = weights, 0
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
    if s.offload in ("optimizer", "all"):
        host_opt, optimizer = optimizer, 0

    # -- gradients -------------------------------------------------------------------------------------------------
    T_local = T // n if shard_opt else T
    grows = True
    if ds and s.precision != "fp32":
        # DeepSpeed keeps gradients in the model dtype (data_types.grad_accum_dtype unset) and converts its own
        # partition to fp32 only inside step() (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py, 0.19).
        part = cb * T // n
        if s.strategy == "zero3":
            # grad_partitions_flat_buffer and the ipg bucket are allocated when the engine is built; the step
            # flattens one sub-group's partition (16-bit) and converts it to fp32, one sub-group at a time
            persistent = part + _ds_bucket(s, cb)
            backward, grows = persistent, False
            sub = min(T // n, DS_SUB_GROUP_ELEMS)
            step = persistent + (cb + 4) * sub
        elif s.strategy == "zero2":
            # grads_in_partition (16-bit, the whole partition at the first bucket flush) + the ipg bucket during
            # backward; released after the step unless the next micro-step accumulates into it
            persistent = part if s.grad_accum > 1 else 0
            backward = part + _ds_bucket(s, cb)
            step = part + 4 * T // n
        else:
            # ZeRO-1: param.grad accumulates in full 16-bit; step flattens this rank's partition and converts it
            persistent = cb * T if s.grad_accum > 1 else 0
            backward = cb * T
            step = cb * T // n + part + 4 * T // n
        if s.offload in ("optimizer", "all"):
            # with the optimizer on the host, DeepSpeed copies each reduced gradient partition to pinned CPU
            # memory (fp32) as backward produces it; the GPU keeps only the reduce bucket in flight
            host_opt += 4 * T // n
            persistent, backward, step, grows = 0, _ds_bucket(s, cb), 0, False
        step_temp = 0
        if s.offload == "none" and s.optimizer != "adamw-8bit" and s.optimizer_impl != "fused":
            # DeepSpeed calls the client optimizer on its flat fp32 partition (ZeRO-3: one sub-group at a time):
            # foreach AdamW's _foreach_sqrt copies it once
            step_temp = 4 * (min(T // n, DS_SUB_GROUP_ELEMS) if s.strategy == "zero3" else T // n)
    else:
        grad_pp = nm.weight if s.method == "full" else nm.adapter
        backward = grad_pp * T
        if shard_grad:
            backward //= n
        # DDP (world > 1) allocates its all-reduce buckets when it wraps the model and the trainer makes the
        # gradients views into them (gradient_as_bucket_view): gradient memory is there from the first forward.
        ddp_buckets = s.strategy == "ddp" and n > 1
        persistent = backward if s.grad_accum > 1 or ddp_buckets else 0
        grows = persistent == 0
        step = backward
        step_temp = _optimizer_step_temporaries(s, nm, T_local)

    unsharded = (trainable_weight_bytes + frozen_bytes + int((opt_pp + master_pp) * T)
                 + ((nm.weight if s.method == "full" else nm.adapter) if not ds else cb + 4) * T)
    return ModelStates(weights, optimizer, persistent, backward, step, step_temp, host_weights + host_opt,
                       unsharded, grows)


def _optimizer_step_temporaries(s: TrainingSetup, nm: Numerics, T_local: int) -> int:
    """Extra bytes torch's optimizer allocates during step(), by implementation (torch/optim/adamw.py, sgd.py).

    fused: one kernel updates in place. foreach AdamW: `_foreach_sqrt(exp_avg_sqs)` copies every second moment at
    once (+1 state element per trainable parameter). for-loop AdamW: `exp_avg_sq.sqrt() / bias_correction2_sqrt`
    holds two temporaries of the largest parameter tensor at a time. SGD's momentum and bitsandbytes' 8-bit AdamW
    update in place. Offloaded optimizers step on the host.
    """
    if s.offload != "none" or s.optimizer != "adamw" or s.optimizer_impl == "fused":
        return 0
    if s.optimizer_impl == "foreach":
        return nm.state * T_local
    largest = s.model.embedding_params if s.method == "full" else _largest_lora_tensor(s)
    return 2 * nm.state * largest


def _largest_lora_tensor(s: TrainingSetup) -> int:
    shapes = s.model.linear_shapes()
    return max(s.lora_rank * max(shapes[t][0], shapes[t][1]) for t in s.lora_targets)


# ---- activations -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerActivations:
    """Bytes one decoder block keeps for backward, split at the attention/MLP boundary.

    Backward runs the MLP half first and frees its tensors before the attention half runs, so the block's
    backward peak is max(everything + MLP-gradient temporaries, attention half + attention temporaries).
    `weight_copies` are the 16-bit copies of fp32 weights autocast makes for this block (saved for backward).
    """

    saved_attn: int      # norms, what the q/k/v readers keep, q/k/v, attention output, softmax (eager)
    saved_mlp: int       # norms, what gate/up keep, the four B·S·I MLP tensors (three under LoRA + the adapter's)
    fwd_transient: int   # extra bytes alive while the block runs forward
    mlp_bwd_transient: int
    attn_bwd_transient: int
    weight_copies: int = 0
    cached_copies: int = 0   # the part autocast's cache holds until forward returns (trainable fp32 weights)

    @property
    def saved(self) -> int:
        return self.saved_attn + self.saved_mlp

    @property
    def bwd_peak(self) -> int:
        """Peak bytes of this block's own tensors during its backward (saved + gradient temporaries)."""
        return max(self.saved + self.mlp_bwd_transient, self.saved_attn + self.attn_bwd_transient)


def _norm_saved(width: int, rows: int, in_bytes: int, trainable: bool, style: str) -> int:
    """Per token: what one RMSNorm over `width` saves for backward (transformers' RMSNorm modules).

    Its input in fp32 (the input itself when it is fp32 already, else an upcast copy) and 1/rms per row; when its
    weight trains, also the normalized value the weight multiplies: `weight * y.to(input dtype)` (Llama, Qwen,
    Mistral) or fp32 y (OLMo 2's `(weight * y).to(dtype)`, Gemma's `y * (1 + weight)`).
    """
    out = 4 * width + 4 * rows
    if trainable:
        out += in_bytes * width if style == "llama" else 4 * width
    return out


def _reader_saved(width: int, src_bytes: int, readers: int, adapted: int, nm: Numerics, full: bool,
                  shared_with_attention: bool = False) -> int:
    """Per token: what the linears reading one tensor of `width` (`src_bytes` per element) save of it.

    Full fine-tuning: each weight gradient needs the input. Under autocast an fp32 input is cast per linear (one
    16-bit copy each); otherwise all readers share the tensor (`shared_with_attention`: sdpa already keeps it).
    LoRA: frozen base linears save nothing of their input (torch saves only what a needed gradient reads); each
    adapter saves what lora_A multiplies: its own 16-bit cast under autocast, else PEFT's cast to the adapter
    dtype (a no-op, so one shared tensor, when the dtypes already agree).
    """
    if full:
        if nm.autocast and src_bytes == 4:
            return readers * 2 * width
        return 0 if shared_with_attention else src_bytes * width
    if adapted == 0:
        return 0
    if nm.autocast:
        return adapted * 2 * width
    if src_bytes == nm.adapter:
        return 0 if shared_with_attention else src_bytes * width
    return adapted * nm.adapter * width


def block_activations(s: TrainingSetup, micro_batch: int | None = None) -> LayerActivations:
    """Tensors one HF decoder block (Llama/Qwen/Mistral/Gemma/OLMo 2 layout) saves for backward, per micro-batch.

    Per token: each RMSNorm's fp32 input and 1/rms (+ the normalized value when its weight trains), what the
    linears keep of their inputs (see _reader_saved), q/k/v as attention receives them (sdpa/flash keep k and v at
    the kv-head width and an fp32 log-sum-exp; eager repeats k and v to all heads and keeps the fp32 softmax and its
    16-bit cast), the attention output, and the MLP's gate, up, act(gate) and act·up. LoRA adds each adapter's
    rank-r intermediate. Checked byte for byte against torch's saved-tensor hooks (tests/test_memory_saved.py).
    """
    m = s.model
    nm = numerics(s)
    b = micro_batch or s.micro_batch
    t = b * s.seq_len
    S = s.seq_len
    h, i, qd, kvd = m.hidden_size, m.intermediate_size, m.q_dim, m.kv_dim
    nh, nkv = m.num_heads, m.num_kv_heads
    c, r = nm.compute, nm.residual
    fam = m.family
    style = fam.get("norm_style", "llama")
    full = s.method == "full"
    targets = set() if full else set(s.lora_targets)

    def n_adapted(*names: str) -> int:
        return sum(1 for x in names if x in targets)

    def adapter_out(*names: str) -> int:
        return n_adapted(*names) * s.lora_rank * (2 if nm.autocast else nm.adapter)

    # -- attention half (per token) ------------------------------------------------------------------------------
    attn = 0
    if "pre_attn" in fam["norms"]:
        attn += _norm_saved(h, 1, r, full, style)
    attn += _reader_saved(h, r, 3, n_adapted("q_proj", "k_proj", "v_proj"), nm, full)
    qk = fam["qk_norm"]
    if qk:
        qk_style = "gemma" if style == "gemma" else ("olmo" if style == "olmo" else "llama")
        rows_q, rows_k = (nh, nkv) if qk == "head" else (1, 1)
        attn += _norm_saved(qd, rows_q, c, full, qk_style) + _norm_saved(kvd, rows_k, c, full, qk_style)
    if s.attn == "eager":
        # q, k and v repeated to every head, fp32 softmax (+ its 16-bit cast), the transposed output for o_proj
        attn += 3 * c * qd + nh * S * (4 + (c if c < 4 else 0))
        attn += _reader_saved(qd, c, 1, n_adapted("o_proj"), nm, full)
    else:
        attn += c * (qd + 2 * kvd) + 4 * nh + c * qd       # q, k, v, fp32 log-sum-exp, output (o_proj's input)
        attn += _reader_saved(qd, c, 1, n_adapted("o_proj"), nm, full, shared_with_attention=True)
    windowed = sliding_layers(s)
    if windowed and s.attn != "eager":
        # a sliding-window layer passes sdpa a mask, so transformers repeats k and v to every head
        # (integrations/sdpa_attention.py use_gqa_in_sdpa): the extra width, averaged over the blocks
        attn += windowed * 2 * c * (qd - kvd) // m.num_layers
    attn += adapter_out("q_proj", "k_proj", "v_proj", "o_proj")
    if "post_attn" in fam["norms"]:
        attn += _norm_saved(h, 1, c, full, style)

    # -- MLP half (per token) -------------------------------------------------------------------------------------
    mlp = 0
    if "pre_mlp" in fam["norms"]:
        mlp += _norm_saved(h, 1, r, full, style)
    mlp += _reader_saved(h, r, 2, n_adapted("gate_proj", "up_proj"), nm, full)
    mb = nm.mlp_bytes
    mlp += 3 * mb * i                                    # gate (act input), up, act(gate)
    mlp += mb * i if full else _reader_saved(i, mb, 1, n_adapted("down_proj"), nm, full)   # act·up for down_proj
    mlp += adapter_out("gate_proj", "up_proj", "down_proj")
    if "post_mlp" in fam["norms"]:
        mlp += _norm_saved(h, 1, c, full, style)

    # -- per block, independent of tokens --------------------------------------------------------------------------
    const = 0
    if style == "gemma":   # each norm keeps its fp32 (1 + weight)
        const += 4 * h * len(fam["norms"]) + (8 * m.head_dim if qk == "head" else 0)
    copies, cached = weight_copies_bytes(s)

    s2 = b * nh * S * S   # attention score elements
    # forward: eager holds the raw scores and the masked scores (fp32) while softmax runs
    fwd_t = 2 * s2 * 4 if s.attn == "eager" else t * i * mb
    # backward: gradients of the B·S·I intermediates; eager's softmax input/output gradients (2 × B·heads·S²);
    # sdpa's gradients of q, k, v (CPU kernels) or FlashAttention-2's (CUDA, see _flash_backward_bytes)
    mlp_bwd_t = 2 * t * i * mb
    if s.attn == "eager":
        attn_bwd_t = 2 * s2 * 4
    elif s.device == "cuda":
        attn_bwd_t = t * _flash_backward_bytes(s, c)
    else:
        attn_bwd_t = 3 * t * qd * c
    if nm.trainable_copies:   # the 16-bit weight gradient of the largest linear before its fp32 conversion
        mlp_bwd_t += c * max(a * o for a, o, _ in m.linear_shapes().values())
    return LayerActivations(t * attn + const, t * mlp, fwd_t, mlp_bwd_t, attn_bwd_t, copies, cached)


def sliding_layers(s: TrainingSetup) -> int:
    """Blocks whose attention is windowed at this sequence length (Gemma 3's local layers, Mistral v0.1): they
    need an explicit mask once the sequence is longer than the window."""
    cfg = s.model.config
    window = cfg.get("sliding_window")
    if not window or s.seq_len <= int(window):
        return 0
    types = cfg.get("layer_types")
    if types:
        return sum(1 for x in types if x == "sliding_attention")
    if s.model.model_type == "mistral" or cfg.get("use_sliding_window"):
        return s.model.num_layers
    return 0


def _flash_backward_bytes(s: TrainingSetup, c: int) -> int:
    """Per token: what FlashAttention-2's backward allocates (flash_api.cpp mha_bwd, used by torch's sdpa on CUDA).

    dq, dk, dv (dk/dv at all heads when kv heads are shared, then summed to the kv width), the fp32 dq accumulator
    and the fp32 softmax row sums.
    """
    m = s.model
    qd, kvd, nh = m.q_dim, m.kv_dim, m.num_heads
    grads = c * 3 * qd + (c * 2 * kvd if m.num_kv_heads < nh else 0)
    return grads + 4 * qd + 4 * nh


def weight_copies_bytes(s: TrainingSetup) -> tuple[int, int]:
    """16-bit copies of one block's fp32 weights that autocast makes per forward and backward keeps: (all, cached).

    Trainable fp32 weights (full fine-tuning under accelerate's mixed precision) are cast once per forward and
    cached until forward returns; frozen fp32 base linears (LoRA on an fp32 base) are cast at every call and
    not cached (torch caches only leaves that require grad); PEFT's fp32 adapters under autocast are cached.
    """
    nm = numerics(s)
    block_w = sum(a * o for a, o, _ in s.model.linear_shapes().values())
    cached = 2 * block_w if nm.trainable_copies else 0
    if s.method != "full" and nm.autocast and nm.adapter == 4:
        cached += 2 * s.trainable_params // max(s.model.num_layers, 1)
    return cached + (2 * block_w if nm.frozen_copies else 0), cached


def outside_blocks(s: TrainingSetup, micro_batch: int | None = None) -> dict[str, int]:
    """What the step keeps outside the decoder blocks, per micro-batch.

    `shared`: rotary cos/sin (one set; Gemma 3 has a local and a global one), the token ids and a sliding-window
    mask; `final`: the final norm and what lm_head keeps of its input, plus autocast's 16-bit copy of an fp32
    lm_head; `labels`: the shifted labels cross-entropy keeps (int64).
    """
    m = s.model
    nm = numerics(s)
    b = micro_batch or s.micro_batch
    t = b * s.seq_len
    h = m.hidden_size
    full = s.method == "full"
    style = m.family.get("norm_style", "llama")
    rope_sets = 2 if m.model_type == "gemma3_text" else 1
    shared = rope_sets * 2 * t * m.head_dim * nm.residual + 8 * t
    window_mask = b * s.seq_len * s.seq_len * nm.compute if (s.attn != "eager" and sliding_layers(s)) else 0
    final = t * _norm_saved(h, 1, nm.residual, full, style)
    if full:
        final += t * _reader_saved(h, nm.residual, 1, 0, nm, True)
    if nm.trainable_copies or nm.fp32_head:
        final += 2 * m.vocab_size * h
    # the window mask sdpa keeps for backward (cast to the q dtype): through backward without checkpointing, with
    # it only while a block is recomputed
    return {"shared": shared + (0 if s.grad_ckpt else window_mask), "final": final, "labels": 8 * t,
            "window_mask": window_mask}


def logits_bytes(s: TrainingSetup, micro_batch: int | None = None) -> dict[str, int]:
    """Cross-entropy over the vocabulary, as transformers' ForCausalLMLoss runs it.

    lm_head writes B·S·V logits in the compute dtype; the loss upcasts them to fp32 (a copy under 16-bit) and
    log_softmax keeps its fp32 output for backward. Backward then holds that output, its incoming gradient and
    the gradient it produces: three fp32 B·S·V tensors at once.
    """
    b = micro_batch or s.micro_batch
    tv = b * s.seq_len * s.model.vocab_size
    c = numerics(s).compute
    saved = 4 * tv                                   # log_softmax output
    fwd = c * tv + (4 * tv if c == 2 else 0)         # logits (+ fp32 copy) while log_softmax runs
    bwd = 4 * tv + 4 * tv                            # grad of log_softmax output, grad of its input
    return {"saved": saved, "forward_transient": fwd, "backward_transient": bwd}


# ---- the step, moment by moment --------------------------------------------------------------------------------
def simulate_step(s: TrainingSetup, micro_batch: int | None = None) -> dict[str, Any]:
    """Walk one (last) micro-step and the optimizer step; return the peak of each phase and the peak's parts."""
    m = s.model
    nm = numerics(s)
    b = micro_batch or s.micro_batch
    t = b * s.seq_len
    c = nm.compute
    ms = model_states(s)
    layer = block_activations(s, b)
    lg = logits_bytes(s, b)
    out = outside_blocks(s, b)
    n = s.world_size
    L = m.num_layers
    V, h = m.vocab_size, m.hidden_size
    full = s.method == "full"
    static = ms.weights + ms.optimizer

    # ZeRO-3 / FSDP: the gathered 16-bit copy of the block being computed plus the prefetched next one;
    # the embedding matrix is gathered for the lookup and again (tied) for lm_head.
    if s.strategy in ("zero3", "fsdp") and n > 1:
        gb = 2 if s.precision != "fp32" else 4
        blk = m.block_params()
        prefetch = min(blk, DS_PREFETCH_BUCKET_ELEMS) if s.strategy == "zero3" else blk
        gather_block = gb * (blk + prefetch)
        gather_head = gb * (m.embedding_params if m.tie_embeddings else m.vocab_size * m.hidden_size)
        grad_gather_block = gb * blk if full else 0
    else:
        gather_block = gather_head = grad_gather_block = 0

    # what checkpointing keeps per block, and what recomputing one block costs in backward
    mask = b * s.seq_len * s.seq_len * nm.residual if s.attn == "eager" else 0
    wcopy = layer.weight_copies
    if s.grad_ckpt:
        per_block_saved = t * h * nm.residual
        recompute = True
    else:
        per_block_saved = layer.saved + wcopy
        recompute = False

    # eager attention: transformers builds one additive causal mask (B×1×S×S, residual dtype) for all blocks;
    # it lives through backward only when checkpointing saves it as a block input, else until forward returns
    shared = out["shared"] + (mask if s.grad_ckpt else 0)
    final = out["final"]

    grads = ms.gradients_persistent
    parts_at_peak: dict[str, Any] = {}
    phase_peaks = {"forward": 0, "loss": 0, "backward": 0, "step": 0}

    def mark(phase: str, act: int, logit: int, grad: int, opt_extra: int = 0, gather: int = 0) -> None:
        total = static + grad + act + logit + opt_extra + gather
        if total > phase_peaks[phase]:
            phase_peaks[phase] = total
        if total > parts_at_peak.get("total", -1):
            parts_at_peak.update(total=total, phase=phase, activations=act + gather, logits=logit,
                                 gradients=grad, optimizer_extra=opt_extra)

    # forward: blocks one by one. Under checkpointing, autocast's cache still holds every cast trainable weight
    # until forward returns (saved copies count in per_block_saved otherwise); the eager mask lives until then too
    acts = shared
    cache = 0 if s.grad_ckpt else mask
    for _ in range(L):
        mark("forward", acts + cache + layer.fwd_transient, 0, grads, gather=gather_block)
        acts += per_block_saved
        cache += layer.cached_copies if recompute else 0
    acts += final
    # loss: logits + fp32 copy + log_softmax output while it runs; shifted labels
    acts += out["labels"]
    mark("loss", acts + cache, lg["forward_transient"] + lg["saved"], grads, gather=gather_head)
    # backward through cross-entropy: saved output + its grad + input grad
    mark("backward", acts, lg["saved"] + lg["backward_transient"], grads, gather=gather_head)
    # lm_head backward: the logits' gradient (compute dtype) is consumed; the head's weight gradient appears
    # (16-bit under autocast, then converted to the fp32 gradient)
    head_grad = 0
    if full and not (uses_deepspeed(s) and s.precision != "fp32"):
        head_grad = _grad_share(V * h, s)
    head_cast = c * V * h if (full and nm.trainable_copies) else 0
    head_grad_gather = gather_head if full else 0   # ZeRO-3/FSDP: the unsharded lm_head grad
    if ms.grows_in_backward:
        mark("backward", acts, c * t * V, grads + head_grad, opt_extra=head_cast,
             gather=gather_head + head_grad_gather)
        grads += head_grad
    else:   # the buffers (accumulation, DDP buckets, DeepSpeed) already hold it
        mark("backward", acts, c * t * V, ms.gradients_backward, opt_extra=head_cast,
             gather=gather_head + head_grad_gather)
        grads = ms.gradients_backward
    acts -= final + out["labels"]
    block_grad = _grad_share(m.block_params() if full else s.trainable_params // max(L, 1), s)
    for _ in range(L):
        # under checkpointing the block's own tensors (and autocast's weight copies) are recomputed on top of
        # its saved input
        below = acts - per_block_saved
        recomputed = per_block_saved + wcopy + out["window_mask"] if recompute else 0
        mark("backward", below + recomputed + layer.bwd_peak, 0, grads, gather=gather_block + grad_gather_block)
        acts -= per_block_saved
        if ms.grows_in_backward:
            grads += block_grad
    grads = max(grads, ms.gradients_backward)
    # the embedding's backward writes a dense V×h gradient; with tied embeddings autograd adds it to lm_head's,
    # which waits in the engine's input buffer: out of place (a third V×h tensor) unless lm_head's gradient is a
    # fresh fp32 copy of autocast's 16-bit one, which the engine may add into (torch/csrc/autograd/input_buffer.cpp)
    embed_bwd = _grad_share(V * h, s) * (1 if nm.trainable_copies else 2) if (full and m.tie_embeddings) else 0
    mark("backward", acts, 0, grads, opt_extra=embed_bwd)
    # optimizer step
    mark("step", 0, 0, ms.gradients_step, opt_extra=ms.step_temporaries)
    return {"phase_peaks": phase_peaks, "parts": parts_at_peak, "states": ms}


def _grad_share(n_params: int, s: TrainingSetup) -> int:
    """Gradient bytes a group of parameters adds on this GPU as backward reaches it."""
    nm = numerics(s)
    if s.method != "full":
        return nm.adapter * n_params
    per = nm.weight
    if s.strategy in ("zero2", "zero3", "fsdp"):
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
    from .calibration import for_setup

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
    ws = workspace_bytes(s)
    allocated = parts["total"] + ws
    overhead = ws + overhead_bytes(s, allocated)
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
        phase_peaks={k: v + ws for k, v in sim["phase_peaks"].items()} if ws else sim["phase_peaks"],
        model_states_unsharded_bytes=ms.unsharded,
        host_bytes_per_gpu=ms.host,
        workspace_bytes=ws,
    )

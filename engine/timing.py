"""Time model: where the seconds of an optimizer step go, term by term, and what that means per epoch.

One optimizer step is `grad_accum` micro-steps plus what happens once per step. A micro-step keeps two
queues busy, and takes as long as the slower of them:

  device   matmuls (forward, input gradients, weight gradients of trained weights, the recomputed forward under
           checkpointing) at an efficiency that falls with thin shapes; attention (FlashAttention-2 for sdpa on
           CUDA, batched matmuls + fp32 softmax for eager); memory-bound work at HBM bandwidth (RMSNorms, rotary,
           residual adds, autocast's casts, the MLP's activation, LoRA's adapters); the loss (B·S·V logits
           written, upcast, log-softmax, its gradient); a fixed cost per kernel; QLoRA's dequantization;
           ZeRO-3/FSDP parameter gathers
  host     Python, autograd and the kernel launches: a cost per dispatched op (small models on fast GPUs are
           host-bound); DeepSpeed's per-parameter and per-module hooks
  step     the optimizer update (bytes per trainable parameter by implementation: fused, foreach, for-loop),
           gradient clipping, DeepSpeed's gradient flattening and fp32 conversion, collectives not hidden behind
           backward, and CPU-Adam plus host copies under offload

Every constant is named with its source: a datasheet figure, a published kernel benchmark, an op count taken
with torch.profiler, or a fit to the H100 measurements in ../shared/measurements/h100-2026-11-23/ (bench/
fit_time.py reproduces those fits; bench/results/h100-2026-11-23.json holds the re-predicted sweep). `TimeConstants`
holds them all so a calibration (`validate --save`) can replace what it measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from .memory import numerics, uses_deepspeed
from .setup import TrainingSetup, quantized_linear_bytes

# ---- device constants -------------------------------------------------------------------------------------------
# Fraction of the dense tensor peak a large bf16 cuBLAS GEMM sustains, per GPU generation. Hopper: fitted to the
# H100 sweep (bench/fit_time.py: 0.60 of 989 TFLOP/s ≈ 590 TFLOP/s, in the range of public cuBLAS bf16 results on
# H100 SXM); Ampere/Ada/Volta: A100 cuBLAS reaches ~80 % of its 312 TFLOP/s, GeForce Ada and Volta a little less
# (NVIDIA's published GEMM benchmarks). Not yet measured here; `validate --save` calibrates them.
GEMM_EFFICIENCY: Mapping[str, float] = MappingProxyType({
    "hopper": 0.60, "ampere": 0.78, "ada": 0.70, "volta": 0.70,
})
# Thin matrices waste tensor-core tiles (128-256 wide) and waves: each GEMM dimension d contributes d / (d + 64).
# A 4096-wide dimension loses 1.5 %, the 128-wide k_proj of a GQA model a third.
GEMM_HALF_DIM = 64
# FlashAttention-2 as torch's sdpa runs it, fraction of the dense peak, forward / backward (FlashAttention-3 paper,
# Shah et al. 2024, Fig. 5-6: FA2 on H100 SXM reaches 300-350 TFLOP/s forward, 200-290 backward at head dims 64-128;
# FlashAttention-2 paper, Dao 2023: 50-73 % of A100's peak forward, ~40-60 % backward).
FLASH_EFFICIENCY: Mapping[str, tuple[float, float]] = MappingProxyType({
    "hopper": (0.33, 0.25), "ampere": (0.60, 0.45), "ada": (0.55, 0.40), "volta": (0.40, 0.30),
})
# Causal attention: flash / memory-efficient kernels skip the masked upper triangle; eager computes all of it.
CAUSAL_ATTENTION_FRACTION = 0.5
# FlashAttention-2's backward does 5 matmuls to the forward's 2.
FLASH_BACKWARD_FLOPS_RATIO = 2.5
# Streaming elementwise kernels: fraction of datasheet HBM bandwidth they sustain. Fitted to the H100 sweep
# (bench/fit_time.py: 0.90 of 3.35 TB/s); STREAM-like copies on H100 reach ~90 %.
HBM_EFFICIENCY = 0.90
# Backward of a memory-bound op reads the incoming gradient and the saved inputs and writes the input gradients:
# about twice its forward traffic (unary: 2 → 3 passes, binary mul: 3 → 5, a cast: 2 → 2).
BACKWARD_TRAFFIC_RATIO = 2.0
# Kernels per decoder block, forward and backward, counted with torch.profiler on transformers 5.23 (Qwen2 block,
# full fine-tuning: 38 forward / ~100 backward; each LoRA adapter adds 6 forward / 9 backward; a Qwen3/Gemma
# q/k norm pair 16 / 23; Gemma's two extra norms 22 / 36).
KERNELS_PER_BLOCK = (38, 100)
KERNELS_PER_ADAPTER = (6, 9)
KERNELS_PER_QK_NORM = (16, 23)
KERNELS_PER_EXTRA_NORM = (11, 18)
# Device-side cost of each kernel beyond its bytes and FLOPs: launch latency, ramp-up and tail (Nsight traces of
# back-to-back small kernels on A100/H100 show 2-4 µs between dependent kernels).
KERNEL_SECONDS = 3e-6
# Host time per counted kernel in eager PyTorch with autograd (views, Python module calls, the dispatcher,
# autocast, the launch itself). Fitted to the H100 sweep (bench/fit_time.py: 55 µs; the 0.5B run without
# checkpointing and the 1.5B LoRA runs are bound by it). The host CPU decides it: this project's 2-core dev VM
# spends 8-12 µs per op on CPU tensors, where no launch is paid. `validate --save` calibrates it per machine.
HOST_SECONDS_PER_KERNEL = 55e-6
# Loss bytes per logit (B·S·V element), compute dtype c: upcast (c + 4), log_softmax (two reads + a write: 12),
# accelerate's convert_outputs_to_fp32 of the logits (c + 4), nll's zero-filled gradient (4), log_softmax's
# backward (three reads + a write: 16), the cast back (4 + c).
LOSS_BYTES_PER_LOGIT_FP32 = 12 + 4 + 16
# Optimizer passes over each trainable parameter's weight, gradient and state elements (torch/optim/adamw.py,
# sgd.py): fused AdamW reads weight, gradient and both moments and writes weight and moments once (2, 1, 4);
# foreach and for-loop AdamW run eight passes (decay, lerp, mul, addcmul, sqrt, div, add, addcdiv: weight 4,
# gradient 2, moments and the sqrt temporary 14); SGD with momentum (2, 1, 3); bitsandbytes' 8-bit AdamW is one
# fused kernel over 1-byte states. Gradient clipping reads the gradients for the norm and scales them in place.
OPTIMIZER_PASSES: Mapping[str, tuple[int, int, int]] = MappingProxyType({
    "fused": (2, 1, 4), "foreach": (4, 2, 14), "for-loop": (4, 2, 14), "sgd": (2, 1, 3), "adamw-8bit": (2, 1, 4),
})
CLIP_GRADIENT_PASSES = 3

# ---- DeepSpeed and FSDP on top of the model -------------------------------------------------------------------
# ZeRO-1/2: DeepSpeed's gradient hook runs per parameter tensor in every backward (bucket bookkeeping, copies into
# the partition). Solved on the H100 ZeRO-2 run (bench/fit_time.py: 52 µs per tensor).
DS_GRAD_HOOK_SECONDS = 52e-6
# ZeRO-3: a fetch/release per submodule per pass (forward, recomputed forward, backward) whose waits on the
# gather stream serialise host and device. Solved on the H100 ZeRO-3 run (bench/fit_time.py: 0.44 ms per module).
DS_ZERO3_MODULE_SECONDS = 440e-6
# Bytes DeepSpeed moves per trainable parameter per step besides the optimizer itself (16-bit model, c = 2):
# gradients copied into the ipg bucket and the partition in backward (2 × (c + c)), the partition flattened and
# converted to fp32 (c + c, c + 4), the fp32 master copied back to the 16-bit weights (4 + c).
DS_STEP_BYTES_PER_PARAM = 8 + 4 + 6 + 6

# ---- links (multi-GPU) ------------------------------------------------------------------------------------------
# Achievable NCCL bus bandwidth as a fraction of the nominal per-GPU one-way link (hardware.py catalog).
# nccl-tests all_reduce_perf busbw: DGX-H100 ~360 of 450 GB/s without NVLS, DGX-A100 ~230 of 300 GB/s,
# DGX-1V ~120 of 150 GB/s; PCIe switches with P2P reach ~70 % of x16 line rate.
LINK_EFFICIENCY: Mapping[str, float] = MappingProxyType({
    "nvlink4": 0.80, "nvlink3": 0.78, "nvlink2": 0.80, "pcie5": 0.70, "pcie4": 0.70, "pcie3": 0.70,
})
# GeForce cards have P2P disabled: NCCL stages every hop through pinned host memory (SHM transport, two copies
# over PCIe and the root complex). nccl-tests issues #269/#270 and NCCL #1530 report 8×RTX 4090 ring all-reduce
# far below line rate; we plan with a quarter of the x16 one-way rate.
NO_P2P_LINK_EFFICIENCY = 0.25
# Inter-node: a single HDR/NDR port reaches ~90 % of line rate in nccl-tests across nodes; the ring crosses each
# node's NIC once per direction, so the slower of the NIC and the intra-node link bounds the bus bandwidth.
INTER_NODE_EFFICIENCY = 0.90
# Host link of NVLink boards (GPU↔CPU still goes over PCIe): H100/H200 SXM gen5, A100 gen4, V100 gen3.
HOST_LINK_GBPS: Mapping[str, float] = MappingProxyType({
    "nvlink4": 64.0, "nvlink3": 32.0, "nvlink2": 16.0, "pcie5": 64.0, "pcie4": 32.0, "pcie3": 16.0,
})
# Pinned-memory cudaMemcpy reaches ~70-80 % of PCIe x16 one-way; several GPUs share a socket's root complex.
HOST_LINK_EFFICIENCY = 0.70
# Fraction of a compute window that can hide communication. DDP buckets all-reduce behind backward
# (torch DDP, bucket_cap_mb 25); DeepSpeed overlap_comm does the same for ZeRO-1/2 reduction; ZeRO-3 and FSDP
# prefetch the next gathers behind the current block's compute but stall on the first gather of each pass.
OVERLAP_FRACTION: Mapping[str, float] = MappingProxyType({
    "ddp": 0.90, "zero1": 0.85, "zero2": 0.85, "zero3": 0.80, "fsdp": 0.80,
})
# CPU-Adam under offload is host-memory-bound (~30 B per parameter). ZeRO-Offload (Ren et al. 2021) reports
# roughly 0.2-0.3 s per billion parameters on a dual-socket Xeon, i.e. ~100 GB/s effective; the GPUs of a node
# share it.
CPU_ADAM_BYTES_PER_PARAM = 30.0
HOST_MEMORY_GBPS = 100.0
# QLoRA: bitsandbytes dequantizes each quantized linear to 16-bit before every GEMM (forward, backward input
# gradient, and the recomputed forward): read packed weights, write a 16-bit copy, the GEMM reads it back.
# The effective bandwidth is set so Qwen-7B on one A100 reproduces the Q-LoRA vs LoRA gap in the Qwen README
# (3.0 vs 1.2 s/iter at 256 tokens, batch 1 × accumulation 8, checkpointing on: ~0.22 s per micro-step).
DEQUANT_HBM_EFFICIENCY = 0.20

# ---- CPU runs (tests, the CPU trainer): torch on a few cores, gloo over loopback ----------------------------------
CPU_MATMUL_FLOPS = 5.0e10
CPU_GLOO_BYTES_PER_SECOND = 1.0e9
# Small models on CPU are bound by elementwise passes over activations and logits, not by FLOPs: each saved
# byte is written in forward, then read and its gradient written in backward (3 passes). Measured on this
# project's 2-core dev VM (torch 2.13, 1 thread, scaletrain/tiny-qwen2 fp32, micro 4-16 × seq 128-512):
# fwd+bwd time = 3 × (saved activations + logits tensors) at 1.6-2.2 GB/s.
CPU_ACTIVATION_PASSES = 3
CPU_ELEMENTWISE_BYTES_PER_SECOND = 1.8e9


@dataclass(frozen=True)
class TimeConstants:
    """Every tunable of the time model in one place; calibration returns a replaced copy."""

    gemm_efficiency: Mapping[str, float] = field(default_factory=lambda: GEMM_EFFICIENCY)
    gemm_half_dim: int = GEMM_HALF_DIM
    flash_efficiency: Mapping[str, tuple[float, float]] = field(default_factory=lambda: FLASH_EFFICIENCY)
    hbm_efficiency: float = HBM_EFFICIENCY
    backward_traffic_ratio: float = BACKWARD_TRAFFIC_RATIO
    kernel_seconds: float = KERNEL_SECONDS
    host_seconds_per_kernel: float = HOST_SECONDS_PER_KERNEL
    ds_grad_hook_seconds: float = DS_GRAD_HOOK_SECONDS
    ds_zero3_module_seconds: float = DS_ZERO3_MODULE_SECONDS
    link_efficiency: Mapping[str, float] = field(default_factory=lambda: LINK_EFFICIENCY)
    no_p2p_link_efficiency: float = NO_P2P_LINK_EFFICIENCY
    inter_node_efficiency: float = INTER_NODE_EFFICIENCY
    host_link_efficiency: float = HOST_LINK_EFFICIENCY
    overlap: Mapping[str, float] = field(default_factory=lambda: OVERLAP_FRACTION)
    dequant_hbm_efficiency: float = DEQUANT_HBM_EFFICIENCY
    host_memory_gbps: float = HOST_MEMORY_GBPS
    compute_scale: float = 1.0                  # measured / predicted micro-step time from `validate --save`

    def with_(self, **changes: Any) -> "TimeConstants":
        return replace(self, **changes)


DEFAULT_CONSTANTS = TimeConstants()


@dataclass(frozen=True)
class MicroStep:
    """Seconds of one micro-step per GPU, by where they go."""

    matmul: float            # GEMMs, recomputation included
    attention: float         # the attention core (flash or eager)
    memory_bound: float      # norms, rotary, residual adds, casts, activations, LoRA adapters, weight casts
    loss: float              # logits' upcast, log-softmax, its gradient
    kernel_overhead: float   # fixed device cost per kernel
    dequant: float           # QLoRA / 8-bit base dequantization
    gathers: float           # ZeRO-3 / FSDP parameter gathers (copies even on one GPU)
    host: float              # host dispatch: Python, autograd, launches, DeepSpeed hooks
    serial_host: bool        # host and device wait on each other (ZeRO-3) instead of overlapping

    @property
    def device(self) -> float:
        return (self.matmul + self.attention + self.memory_bound + self.loss + self.kernel_overhead + self.dequant
                + self.gathers)

    @property
    def seconds(self) -> float:
        return self.device + self.host if self.serial_host else max(self.device, self.host)

    @property
    def host_bound(self) -> bool:
        return not self.serial_host and self.host > self.device


@dataclass(frozen=True)
class TimeEstimate:
    """Predicted seconds for one optimizer step and what follows from it. All per-step numbers are per GPU."""

    step_seconds: float
    compute_seconds: float            # all micro-steps (device or host, whichever bound them)
    dequant_seconds: float            # QLoRA dequantization, all micro-steps (inside compute_seconds)
    communication_seconds: float      # all collectives of the step, as if nothing overlapped
    exposed_communication_seconds: float  # the part compute does not hide
    optimizer_seconds: float          # update on GPU (+ clipping, DeepSpeed's step copies), or CPU-Adam under offload
    offload_seconds: float            # host↔device copies under offload
    flops_per_step: float             # per GPU, recomputation included
    model_flops_per_step: float       # per GPU, without recomputation (what MFU conventionally counts)
    tokens_per_step: int              # all GPUs
    mfu: float                        # model FLOPs over the predicted step time and the dense peak
    peak_flops: float                 # per GPU, dense, compute dtype
    bus_bandwidth_bytes_per_second: float
    micro: MicroStep | None = None
    steps_per_epoch: int | None = None
    total_steps: int | None = None
    epoch_seconds: float | None = None
    total_seconds: float | None = None
    assumptions: tuple[str, ...] = ()
    constants: TimeConstants = field(default=DEFAULT_CONSTANTS, compare=False, repr=False)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.step_seconds if self.step_seconds > 0 else 0.0

    @property
    def end_to_end_mfu(self) -> float:
        return self.mfu

    def breakdown(self) -> dict[str, float]:
        """Seconds of one optimizer step by where they go (micro-step terms × accumulation, then per-step terms)."""
        out: dict[str, float] = {}
        if self.micro is not None:
            ga = self.compute_seconds / self.micro.seconds if self.micro.seconds > 0 else 0.0
            u = self.micro
            out.update(matmul=ga * u.matmul, attention=ga * u.attention, memory_bound=ga * u.memory_bound,
                       loss=ga * u.loss, kernel_overhead=ga * u.kernel_overhead, dequant=ga * u.dequant,
                       gathers=ga * u.gathers, host=ga * u.host)
        out.update(compute=self.compute_seconds, optimizer=self.optimizer_seconds,
                   communication=self.communication_seconds,
                   exposed_communication=self.exposed_communication_seconds, offload=self.offload_seconds)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "step_seconds": self.step_seconds,
            "tokens_per_second": self.tokens_per_second,
            "steps_per_epoch": self.steps_per_epoch,
            "total_steps": self.total_steps,
            "epoch_seconds": self.epoch_seconds,
            "total_seconds": self.total_seconds,
            "mfu": self.mfu,
            "end_to_end_mfu": self.end_to_end_mfu,
            "tokens_per_step": self.tokens_per_step,
            "host_bound": bool(self.micro and self.micro.host_bound),
            "breakdown_seconds": self.breakdown(),
            "flops_per_step": self.flops_per_step,
            "model_flops_per_step": self.model_flops_per_step,
            "peak_flops": self.peak_flops,
            "bus_bandwidth_bytes_per_second": self.bus_bandwidth_bytes_per_second,
            "assumptions": list(self.assumptions),
        }


# ---- FLOPs -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SampleFlops:
    """FLOPs for one sample of `tokens` tokens on one GPU, split the way the overlap rules need them."""

    forward: float
    backward: float
    recompute: float

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute


def sample_flops(s: TrainingSetup, tokens: int) -> SampleFlops:
    """Forward 2·W per token over block linears and the LM head, the attention core, LoRA adapters; backward
    = input gradients (= forward) + weight gradients of trained weights; checkpointing re-runs block forwards."""
    m = s.model
    shapes = m.linear_shapes()
    L = m.num_layers
    block_w = sum(i * o for i, o, _ in shapes.values())
    head_w = m.vocab_size * m.hidden_size
    causal = 1.0 if s.attn == "eager" else CAUSAL_ATTENTION_FRACTION
    # QK^T and attention·V: 2 FLOPs × tokens attended × q width, each
    attn_fwd = 2 * 2 * tokens * causal * m.q_dim * L * tokens
    lin_fwd = 2.0 * block_w * L * tokens
    head_fwd = 2.0 * head_w * tokens
    full = s.method == "full"
    if full:
        adapter_fwd = 0.0
    else:
        adapter_fwd = 2.0 * L * tokens * sum(s.lora_rank * (shapes[t][0] + shapes[t][1]) for t in s.lora_targets)
    forward = lin_fwd + head_fwd + attn_fwd + adapter_fwd
    wgrad = (lin_fwd + head_fwd) if full else 0.0
    backward = (lin_fwd + head_fwd) + wgrad + 2 * attn_fwd + 2 * adapter_fwd
    recompute = (lin_fwd + attn_fwd + adapter_fwd) if s.grad_ckpt else 0.0
    return SampleFlops(forward, backward, recompute)


# ---- hardware rates ----------------------------------------------------------------------------------------------
def gpu_class(s: TrainingSetup) -> str:
    return s.hardware.gpu.arch


def bus_bandwidth(s: TrainingSetup, c: TimeConstants = DEFAULT_CONSTANTS) -> tuple[float, str]:
    """Achievable collective bus bandwidth per GPU in bytes/s, and a description of the bottleneck."""
    hw = s.hardware
    g = hw.gpu
    if s.device == "cpu":
        return CPU_GLOO_BYTES_PER_SECOND, "gloo over loopback"
    if g.p2p:
        intra = g.link_gbps * c.link_efficiency.get(g.interconnect, 0.7) * 1e9
        what = f"{g.interconnect}"
    else:
        intra = g.link_gbps * c.no_p2p_link_efficiency * 1e9
        what = f"{g.interconnect}, no P2P: staged through host memory"
    if hw.nodes > 1:
        inter = hw.inter_node_gbit_s / 8 * c.inter_node_efficiency * 1e9
        if inter < intra:
            return inter, f"inter-node link {hw.inter_node_gbit_s:g} Gb/s"
        return intra, what + f" (inter-node {hw.inter_node_gbit_s:g} Gb/s is faster)"
    return intra, what


def _host_bandwidth(s: TrainingSetup, c: TimeConstants) -> float:
    g = s.hardware.gpu
    return HOST_LINK_GBPS.get(g.interconnect, 16.0) * c.host_link_efficiency * 1e9


def _param_bytes_gathered(s: TrainingSetup) -> int:
    """Bytes of the full model as ZeRO-3/FSDP gathers it: 16-bit weights (packed 4/8-bit under QLoRA)."""
    m = s.model
    cb = 4 if s.precision == "fp32" else 2
    if s.method == "full":
        return cb * m.params
    base = cb * m.params
    if s.base_bits in (4, 8):
        lin = m.targeted_linear_params(s.lora_targets)
        base = quantized_linear_bytes(lin, s.base_bits) + cb * (m.params - lin)
    return base + cb * s.trainable_params


def calibrated_constants(s: TrainingSetup) -> TimeConstants:
    """The default constants, with the compute scale `validate --save` measured on this GPU kind, if any."""
    from .calibration import for_setup

    cal = for_setup(s)
    return DEFAULT_CONSTANTS if cal is None else DEFAULT_CONSTANTS.with_(compute_scale=cal.compute_scale)


# ---- one micro-step on the device ---------------------------------------------------------------------------------
def _gemm_seconds(M: float, N: float, K: float, peak: float, hbm: float, c: TimeConstants, arch: str) -> float:
    """A GEMM at its shape's efficiency, or at HBM speed when its operands outweigh its FLOPs (a roofline)."""
    d = c.gemm_half_dim
    eff = c.gemm_efficiency.get(arch, 0.7) * (M / (M + d)) * (N / (N + d)) * (K / (K + d))
    return max(2.0 * M * N * K / (peak * eff), 2.0 * (M * K + K * N + M * N) / hbm)


def _matmul_seconds(s: TrainingSetup, t: int, peak: float, hbm: float, c: TimeConstants) -> float:
    """Block linears (forward, input gradient, weight gradient when trained, recomputed forward) and the LM head.
    LoRA's rank-r matmuls are memory-bound and counted with the adapters' traffic."""
    m = s.model
    arch = s.hardware.gpu.arch
    full = s.method == "full"
    passes = 2 if s.grad_ckpt else 1
    block = 0.0
    for i, o, _ in m.linear_shapes().values():
        block += passes * _gemm_seconds(t, o, i, peak, hbm, c, arch) + _gemm_seconds(t, i, o, peak, hbm, c, arch)
        if full:
            block += _gemm_seconds(o, i, t, peak, hbm, c, arch)
    V, h = m.vocab_size, m.hidden_size
    head = _gemm_seconds(t, V, h, peak, hbm, c, arch) + _gemm_seconds(t, h, V, peak, hbm, c, arch)
    if full:
        head += _gemm_seconds(V, h, t, peak, hbm, c, arch)
    return m.num_layers * block + head


def _attention_seconds(s: TrainingSetup, peak: float, hbm: float, c: TimeConstants) -> float:
    """The attention core of all blocks: FlashAttention-2 (sdpa/flash on CUDA) at its measured fraction of peak, or
    eager's two batched matmuls over all S² scores plus its fp32 softmax, mask and cast at HBM speed."""
    m = s.model
    b, S, L = s.micro_batch, s.seq_len, m.num_layers
    passes = 2 if s.grad_ckpt else 1
    if s.attn == "eager":
        flops = 2 * 2 * b * S * S * m.q_dim * L
        scores = b * m.num_heads * S * S
        cb = numerics(s).compute
        # scores written, masked, softmax in fp32, cast: ~ (c + c + c + 4 + 4 + c) forward, twice that backward
        traffic = scores * (4 * cb + 8) * (passes + c.backward_traffic_ratio) * L
        arch = s.hardware.gpu.arch
        gemm_rate = peak * c.gemm_efficiency.get(arch, 0.7)
        return flops * (passes + 2) / gemm_rate + traffic / hbm
    fwd_eff, bwd_eff = c.flash_efficiency.get(s.hardware.gpu.arch, (0.4, 0.3))
    flops = 2 * 2 * b * S * S * CAUSAL_ATTENTION_FRACTION * m.q_dim * L
    return passes * flops / (peak * fwd_eff) + FLASH_BACKWARD_FLOPS_RATIO * flops / (peak * bwd_eff)


def block_forward_traffic(s: TrainingSetup) -> int:
    """Bytes per token one decoder block's memory-bound kernels read and write in forward.

    RMSNorms (upcast, square, mean, scale, downcast, weight: ~20 fp32 passes over the width plus the dtype
    changes), autocast's per-linear input casts of an fp32 residual, rotary on q and k (mul, neg, cat, mul, add;
    fp32 when the residual is, then cast for attention), the residual adds, the MLP's activation and product, and
    each LoRA adapter (PEFT's cast to fp32, autocast's cast back, the rank-r matmuls, scaling, the add).
    """
    m = s.model
    nm = numerics(s)
    c, r = nm.compute, nm.residual
    h, i, qd, kvd = m.hidden_size, m.intermediate_size, m.q_dim, m.kv_dim
    fam = m.family

    def norm(width: int, in_b: int, out_b: int) -> int:
        cast = (in_b + 4) + (4 + in_b) if in_b != 4 else 0
        return width * (cast + 20 + in_b + out_b)

    out = len(fam["norms"]) * norm(h, r, r)
    if fam["qk_norm"]:
        out += norm(qd, c, c) + norm(kvd, c, c)
    if nm.autocast and r == 4:
        out += 5 * 6 * h                                   # q, k, v, gate, up cast their fp32 input
    rot = 4 if r == 4 else c                               # rotary runs in the residual's dtype (cos/sin)
    out += (qd + kvd) * (5 * c + 5 * rot + (6 if rot == 4 else 0))
    out += 2 * h * (c + 2 * r)                             # residual adds
    out += 5 * nm.mlp_bytes * i                            # act(gate), act·up
    if s.method != "full":
        for name in s.lora_targets:
            a, o, _ = m.linear_shapes()[name]
            bf16_input = name in ("o_proj", "down_proj") or r != 4
            if nm.autocast:
                cast = (6 * a if bf16_input else 0) + 6 * a   # PEFT's fp32 cast, autocast's 16-bit cast
            else:
                cast = 0 if c == nm.adapter else 6 * a
            out += cast + 2 * a + 4 * s.lora_rank + 12 * o    # lora_A reads x, lora_B writes, scale, add
    return out


def block_kernels(s: TrainingSetup) -> tuple[int, int]:
    """Kernels one decoder block launches, forward and backward (KERNELS_PER_* counts)."""
    m = s.model
    fam = m.family
    f, b = KERNELS_PER_BLOCK
    if fam["qk_norm"]:
        f, b = f + KERNELS_PER_QK_NORM[0], b + KERNELS_PER_QK_NORM[1]
    extra = max(0, len(fam["norms"]) - 2)
    f, b = f + extra * KERNELS_PER_EXTRA_NORM[0], b + extra * KERNELS_PER_EXTRA_NORM[1]
    if s.method != "full":
        n = len(s.lora_targets)
        f, b = f + n * KERNELS_PER_ADAPTER[0], b + n * KERNELS_PER_ADAPTER[1]
    return f, b


def micro_step(s: TrainingSetup, c: TimeConstants = DEFAULT_CONSTANTS) -> MicroStep:
    """Seconds of one micro-step on one GPU, term by term."""
    m = s.model
    g = s.hardware.gpu
    nm = numerics(s)
    tokens = min(s.sample_tokens, s.seq_len)
    t = s.micro_batch * tokens
    L = m.num_layers
    passes = 2 if s.grad_ckpt else 1
    peak = g.peak_tflops(s.precision) * 1e12
    hbm = g.hbm_gbps * 1e9 * c.hbm_efficiency
    matmul = _matmul_seconds(s, t, peak, hbm, c)
    attention = _attention_seconds(s, peak, hbm, c)
    traffic = L * t * block_forward_traffic(s) * (passes + c.backward_traffic_ratio)
    block_w = sum(i * o for i, o, _ in m.linear_shapes().values())
    if nm.trainable_copies or nm.frozen_copies:
        traffic += passes * 6 * L * block_w                # autocast casts fp32 weights each forward (4 → 2 B)
    if nm.trainable_copies:
        traffic += 6 * m.params                            # 16-bit weight gradients converted to fp32
    memory_bound = traffic / hbm
    loss_bytes = LOSS_BYTES_PER_LOGIT_FP32 + 2 * (nm.compute + 4) if nm.compute < 4 else LOSS_BYTES_PER_LOGIT_FP32
    loss = t * m.vocab_size * loss_bytes / hbm
    kf, kb = block_kernels(s)
    kernels = L * (passes * kf + kb)
    dequant = 0.0
    if s.method != "full" and s.base_bits in (4, 8):
        lin = m.targeted_linear_params(s.lora_targets)
        per_pass = quantized_linear_bytes(lin, s.base_bits) + 2 * 2 * lin
        dequant = (passes + 1) * per_pass / (g.hbm_gbps * 1e9 * c.dequant_hbm_efficiency)
    gathers = 0.0
    host = kernels * c.host_seconds_per_kernel
    serial = False
    if s.strategy in ("zero3", "fsdp"):
        # every pass gathers the 16-bit parameters into full tensors (a copy even on one GPU) and the backward
        # reduce-scatters the gradients
        gathers = (passes + 1) * 2 * _param_bytes_gathered(s) / max(s.world_size, 1) / hbm
        if s.strategy == "zero3":
            modules = L * (len(m.linear_shapes()) + len(m.family["norms"]))
            host += modules * (passes + 1) * c.ds_zero3_module_seconds
            serial = True
    elif uses_deepspeed(s):
        host += m.tensor_count * c.ds_grad_hook_seconds
    scale = c.compute_scale
    return MicroStep(matmul * scale, attention * scale, memory_bound * scale, loss * scale,
                     kernels * c.kernel_seconds * scale, dequant * scale, gathers * scale, host * scale, serial)


def _optimizer_device_seconds(s: TrainingSetup, c: TimeConstants) -> float:
    """The update, gradient clipping, and DeepSpeed's per-step copies, on the GPU (bytes at HBM speed)."""
    nm = numerics(s)
    g = s.hardware.gpu
    hbm = g.hbm_gbps * 1e9 * c.hbm_efficiency
    n = s.world_size
    shard = s.strategy in ("zero1", "zero2", "zero3", "fsdp")
    T_local = s.trainable_params / n if shard else s.trainable_params
    ds = uses_deepspeed(s) and s.precision != "fp32"
    w = 4 if ds else (nm.weight if s.method == "full" else nm.adapter)   # the tensors the optimizer updates
    grad = 4 if ds else w
    state = 4 if ds else nm.state
    if s.optimizer == "adamw":
        wp, gp, sp = OPTIMIZER_PASSES[s.optimizer_impl]
    else:
        wp, gp, sp = OPTIMIZER_PASSES[s.optimizer]
        state = 1 if s.optimizer == "adamw-8bit" else state
    per_param = wp * w + gp * grad + sp * state + CLIP_GRADIENT_PASSES * grad
    if ds:
        per_param += DS_STEP_BYTES_PER_PARAM
    return T_local * per_param / hbm


# ---- the estimate ------------------------------------------------------------------------------------------------
def estimate_time(s: TrainingSetup, constants: TimeConstants | None = None) -> TimeEstimate:
    """Seconds per optimizer step for one fully specified setup (pure arithmetic, well under a millisecond)."""
    c = constants or calibrated_constants(s)
    hw = s.hardware
    g = hw.gpu
    n = s.world_size
    ga = s.grad_accum
    tokens = min(s.sample_tokens, s.seq_len)
    tokens_micro = s.micro_batch * tokens
    fl = sample_flops(s, tokens)
    peak = CPU_MATMUL_FLOPS if s.device == "cpu" else g.peak_tflops(s.precision) * 1e12
    if s.device == "cpu":
        micro = _cpu_micro_step(s, fl, c)
    else:
        micro = micro_step(s, c)
    compute_micro = micro.seconds
    # the backward window collectives can hide behind (about two thirds of a micro-step's work)
    bwd_micro = compute_micro * 2 / 3

    # communication
    bw, link_what = bus_bandwidth(s, c)
    T = s.trainable_params
    cb = 4 if s.precision == "fp32" else 2
    ring = (n - 1) / n if n > 1 else 0.0
    overlap = c.overlap.get(s.strategy, 0.8)
    comm_micro = comm_step_hidden = comm_step_exposed = 0.0
    exposed_micro = 0.0
    if n > 1:
        if s.strategy == "ddp":
            # DDP all-reduces the gradients in their dtype (fp32 under accelerate's mixed precision), once per step
            gb = numerics(s).weight if s.method == "full" else numerics(s).adapter
            comm_step_hidden = 2 * ring * gb * T / bw
        elif s.strategy == "zero1":
            comm_step_hidden = ring * cb * T / bw           # reduce-scatter of the accumulated 16-bit grads
            comm_step_exposed = ring * cb * T / bw          # all-gather of the updated 16-bit params
        elif s.strategy == "zero2":
            comm_micro = ring * cb * T / bw                 # reduce-scatter in every micro-step's backward
            exposed_micro = max(0.0, comm_micro - overlap * bwd_micro)
            comm_step_exposed = ring * cb * T / bw
        else:  # zero3 / fsdp: gather for forward, backward (and the recomputed forward), reduce-scatter grads
            passes = 2 + (1 if s.grad_ckpt else 0)
            comm_micro = ring * (passes * _param_bytes_gathered(s) + cb * T) / bw
            exposed_micro = max(0.0, comm_micro - overlap * compute_micro)
    exposed_step = comm_step_exposed + max(0.0, comm_step_hidden - overlap * bwd_micro)
    communication = ga * comm_micro + comm_step_hidden + comm_step_exposed
    exposed = ga * exposed_micro + exposed_step

    # optimizer update and offload traffic
    shard_opt = s.strategy in ("zero1", "zero2", "zero3", "fsdp")
    T_local = T / n if shard_opt else T
    offload_micro = offload_step = 0.0
    host_bw = _host_bandwidth(s, c)
    if s.offload in ("optimizer", "all") and s.device != "cpu":
        # CPU-Adam on this node's shards (the node's GPUs share host memory bandwidth), 16-bit grads down and
        # updated 16-bit params up over the host link.
        T_node = T * hw.gpus_per_node / n
        optimizer = T_node * CPU_ADAM_BYTES_PER_PARAM / (c.host_memory_gbps * 1e9)
        offload_step = 2 * cb * T_local / host_bw
        if s.offload == "all":
            passes = 2 + (1 if s.grad_ckpt else 0)
            offload_micro = passes * _param_bytes_gathered(s) / n / host_bw
    elif s.device == "cpu":
        optimizer = T_local * 32.0 / (c.host_memory_gbps * 1e9)
    else:
        optimizer = _optimizer_device_seconds(s, c)

    compute = ga * compute_micro
    offload = ga * offload_micro + offload_step
    step = compute + exposed + optimizer + offload

    tokens_per_step = s.effective_batch * tokens
    flops_step = ga * s.micro_batch * fl.total
    model_flops_step = ga * s.micro_batch * (fl.forward + fl.backward)
    mfu = model_flops_step / (step * peak) if step > 0 and peak > 0 else 0.0
    steps_per_epoch = total_steps = None
    epoch_s = total_s = None
    if s.dataset_size is not None:
        steps_per_epoch = math.ceil(s.dataset_size / s.effective_batch)
        total_steps = math.ceil(steps_per_epoch * s.epochs)
        epoch_s = steps_per_epoch * step
        total_s = total_steps * step

    assumptions = _assumptions(s, micro, peak, tokens, bw, link_what, overlap, optimizer, offload, c)
    return TimeEstimate(
        step_seconds=step, compute_seconds=compute, dequant_seconds=ga * micro.dequant,
        communication_seconds=communication, exposed_communication_seconds=exposed, optimizer_seconds=optimizer,
        offload_seconds=offload, flops_per_step=flops_step, model_flops_per_step=model_flops_step,
        tokens_per_step=tokens_per_step, mfu=mfu, peak_flops=peak, bus_bandwidth_bytes_per_second=bw if n > 1 else 0.0,
        micro=micro, steps_per_epoch=steps_per_epoch, total_steps=total_steps, epoch_seconds=epoch_s,
        total_seconds=total_s, assumptions=assumptions, constants=c,
    )


def _cpu_micro_step(s: TrainingSetup, fl: SampleFlops, c: TimeConstants) -> MicroStep:
    """CPU runs: matmuls at CPU_MATMUL_FLOPS, or the activation/logits traffic, whichever is slower."""
    from .memory import block_activations, logits_bytes

    layer = block_activations(s)
    lg = logits_bytes(s)
    touched = layer.saved * s.model.num_layers + lg["saved"] + lg["forward_transient"] + lg["backward_transient"]
    traffic = CPU_ACTIVATION_PASSES * touched / CPU_ELEMENTWISE_BYTES_PER_SECOND
    flops = s.micro_batch * fl.total / CPU_MATMUL_FLOPS
    scale = c.compute_scale
    if traffic > flops:
        return MicroStep(0.0, 0.0, traffic * scale, 0.0, 0.0, 0.0, 0.0, 0.0, False)
    return MicroStep(flops * scale, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False)


def _assumptions(s: TrainingSetup, micro: MicroStep, peak: float, tokens: int, bw: float, link_what: str,
                 overlap: float, optimizer: float, offload: float, c: TimeConstants) -> tuple[str, ...]:
    """The premises a reader needs to judge the time, in words, numbers from this estimate."""
    out = []
    if s.device == "cpu":
        out.append(f"CPU: matmuls at {peak / 1e9:.0f} GFLOP/s per process, activation traffic at "
                   f"{CPU_ELEMENTWISE_BYTES_PER_SECOND / 1e9:.1f} GB/s, whichever is slower")
    else:
        g = s.hardware.gpu
        arch = g.arch
        fwd, bwd = c.flash_efficiency.get(arch, (0.4, 0.3))
        out.append(f"matmuls at up to {c.gemm_efficiency.get(arch, 0.7):.0%} of the {g.key} dense {s.precision} "
                   f"peak ({peak / 1e12:.0f} TFLOP/s), less for thin shapes; attention at {fwd:.0%}/{bwd:.0%} "
                   f"(forward/backward); memory-bound work at {c.hbm_efficiency:.0%} of {g.hbm_gbps:,.0f} GB/s")
        u = micro
        parts = {"matmul": u.matmul, "attention": u.attention, "memory-bound": u.memory_bound, "loss": u.loss,
                 "kernel overhead": u.kernel_overhead, "dequant": u.dequant, "gathers": u.gathers}
        shown = ", ".join(f"{k} {v * 1000:.0f}" for k, v in parts.items() if v * 1000 >= 0.5)
        if micro.serial_host:
            out.append(f"micro-step {micro.seconds * 1000:.0f} ms = device {micro.device * 1000:.0f} ms ({shown}) "
                       f"+ host {micro.host * 1000:.0f} ms (ZeRO-3's hooks wait on its gathers)")
        elif micro.host_bound:
            out.append(f"micro-step {micro.seconds * 1000:.0f} ms, host-bound: Python/autograd/launches "
                       f"{micro.host * 1000:.0f} ms vs device {micro.device * 1000:.0f} ms ({shown})")
        else:
            out.append(f"micro-step {micro.seconds * 1000:.0f} ms on the device ({shown}); host "
                       f"{micro.host * 1000:.0f} ms overlaps")
    src = "--tokens-per-sample" if s.tokens_per_sample else "the sequence length"
    out.append(f"{tokens:,} tokens per sample ({src})")
    if s.world_size > 1:
        out.append(f"collectives at {bw / 1e9:.1f} GB/s bus bandwidth ({link_what}), "
                   f"{overlap:.0%} of compute can hide them ({s.strategy})")
    if s.grad_ckpt:
        out.append("gradient checkpointing re-runs each block's forward")
    if micro.dequant:
        out.append(f"QLoRA dequantization {micro.dequant * 1000:.0f} ms per micro-step")
    if s.offload != "none":
        out.append(f"offload: CPU-Adam {optimizer:.2f} s + host copies {offload:.2f} s per step")
    elif s.device != "cpu":
        out.append(f"optimizer ({s.optimizer}, {s.optimizer_impl}) {optimizer * 1000:.0f} ms per step")
    return tuple(out)

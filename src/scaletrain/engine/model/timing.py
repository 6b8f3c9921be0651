"""Time model: seconds per optimizer step from FLOPs, links and overlap, and what that means per epoch.

One optimizer step is `grad_accum` micro-steps plus what happens once per step:

  micro-step   forward + backward (+ one more forward under gradient checkpointing) at an assumed utilization
               of the card's dense tensor peak; QLoRA dequantizes the base weights on every pass; ZeRO-3/FSDP
               gather parameters and reduce-scatter gradients (ZeRO-2 reduce-scatters), hidden behind compute
               as far as the strategy overlaps them
  step         DDP all-reduce / ZeRO-1 reduce (both once: gradients accumulate locally), ZeRO-1/2 parameter
               all-gather after the update, the optimizer update itself (GPU memory-bound, or CPU-Adam plus
               host↔device copies under offload)

FLOPs come from the architecture table (ModelArch.linear_shapes), not from 6·P: forward is 2 FLOPs per weight
per token, plus the attention s² term and the logits; backward is the input-gradient GEMMs (same as forward)
plus the weight-gradient GEMMs, which frozen weights under LoRA/QLoRA skip.
Every constant below is named and sourced, and `TimeConstants` lets a calibration replace any of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from scaletrain.engine.model.setup import TrainingSetup, quantized_linear_bytes

# ---- constants (planning values until `validate --save` calibrates them on the user's cards) -------------------
# Achievable fraction of the dense tensor peak for full fine-tuning matmuls in HF transformers + accelerate /
# DeepSpeed stacks. Anchors: llm-analysis reproduces the LLaMA paper's A100 GPU-hours at flops_efficiency 0.5
# (a Megatron-class stack, reference/estimators.md §3); HF-Trainer-class fine-tuning runs below that, and Hopper
# reaches a smaller fraction of its (3× larger) peak with the same kernels. GeForce Ada peaks are already the
# fp32-accumulate rate (catalog), so the same fraction applies.
UTILIZATION_BY_GPU_CLASS: Mapping[str, float] = MappingProxyType({
    "hopper": 0.40, "ampere": 0.45, "ada": 0.40, "volta": 0.35,
})
# Which class each catalog GPU belongs to (unknown keys fall back by interconnect, see gpu_class()).
GPU_CLASS: Mapping[str, str] = MappingProxyType({
    "H200": "hopper", "H100-SXM": "hopper", "H100-PCIe": "hopper", "A100-80GB": "ampere", "A100-40GB": "ampere",
    "A6000": "ampere", "RTX3090": "ampere", "L40S": "ada", "RTX4090": "ada", "L4": "ada", "V100": "volta",
})
# LoRA adds many thin rank-r GEMMs and elementwise casts per linear (PEFT runs adapters in fp32): a lower
# fraction of peak than the base GEMMs alone. QLoRA's dequantization is charged separately (below).
METHOD_UTILIZATION_FACTOR: Mapping[str, float] = MappingProxyType({"full": 1.00, "lora": 0.85, "qlora": 0.80})
# GEMM efficiency falls when a micro-step carries few tokens (thin M dimension): utilization × t / (t + T_half).
# cuBLAS bf16 GEMMs with hidden sizes ≥ 2048 reach most of their plateau from ~1k rows on A100/H100.
TOKENS_AT_HALF_UTILIZATION = 128
# Causal attention: flash / memory-efficient SDPA kernels skip the masked upper triangle (Megatron's FLOPs
# counter uses the same halving); eager attention computes the full s×s score matrix.
CAUSAL_ATTENTION_FRACTION = 0.5

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

# Optimizer update on the GPU is memory-bound: bytes read+written per trainable parameter (fp32 master, grad,
# two Adam moments read and written, 16-bit copy written; torch foreach AdamW adds a temporary).
OPTIMIZER_STEP_BYTES_PER_PARAM: Mapping[str, float] = MappingProxyType({"adamw": 32.0, "adamw-8bit": 18.0,
                                                                         "sgd": 16.0})
HBM_EFFICIENCY = 0.70          # streaming elementwise kernels reach ~70-90 % of datasheet HBM bandwidth
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

# CPU runs (tests, the CPU trainer): torch matmuls on a few cores; gloo over loopback.
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

    utilization: Mapping[str, float] = field(default_factory=lambda: UTILIZATION_BY_GPU_CLASS)
    method_factor: Mapping[str, float] = field(default_factory=lambda: METHOD_UTILIZATION_FACTOR)
    tokens_at_half_utilization: int = TOKENS_AT_HALF_UTILIZATION
    link_efficiency: Mapping[str, float] = field(default_factory=lambda: LINK_EFFICIENCY)
    no_p2p_link_efficiency: float = NO_P2P_LINK_EFFICIENCY
    inter_node_efficiency: float = INTER_NODE_EFFICIENCY
    host_link_efficiency: float = HOST_LINK_EFFICIENCY
    overlap: Mapping[str, float] = field(default_factory=lambda: OVERLAP_FRACTION)
    hbm_efficiency: float = HBM_EFFICIENCY
    dequant_hbm_efficiency: float = DEQUANT_HBM_EFFICIENCY
    host_memory_gbps: float = HOST_MEMORY_GBPS
    utilization_override: float | None = None   # a measured utilization for this exact GPU/method replaces the table
    compute_scale: float = 1.0                  # measured / predicted compute time from `validate --save`

    def with_(self, **changes: Any) -> "TimeConstants":
        return replace(self, **changes)


DEFAULT_CONSTANTS = TimeConstants()


@dataclass(frozen=True)
class TimeEstimate:
    """Predicted seconds for one optimizer step and what follows from it. All per-step numbers are per GPU."""

    step_seconds: float
    compute_seconds: float            # matmul time of all micro-steps (at the assumed utilization)
    dequant_seconds: float            # QLoRA dequantization, all micro-steps
    communication_seconds: float      # all collectives of the step, as if nothing overlapped
    exposed_communication_seconds: float  # the part compute does not hide
    optimizer_seconds: float          # update on GPU, or CPU-Adam under offload
    offload_seconds: float            # host↔device copies under offload
    flops_per_step: float             # per GPU, recomputation included
    model_flops_per_step: float       # per GPU, without recomputation (what MFU conventionally counts)
    tokens_per_step: int              # all GPUs
    mfu: float                        # assumed matmul utilization of the dense peak
    peak_flops: float                 # per GPU, dense, compute dtype
    bus_bandwidth_bytes_per_second: float
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
        """Model FLOPs over the whole step (communication, optimizer and stalls included) vs the peak."""
        denom = self.step_seconds * self.peak_flops
        return self.model_flops_per_step / denom if denom > 0 else 0.0

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
            "breakdown_seconds": {
                "compute": self.compute_seconds, "dequant": self.dequant_seconds,
                "communication": self.communication_seconds,
                "exposed_communication": self.exposed_communication_seconds,
                "optimizer": self.optimizer_seconds, "offload": self.offload_seconds,
            },
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
    g = s.hardware.gpu
    if g.key in GPU_CLASS:
        return GPU_CLASS[g.key]
    return {"nvlink4": "hopper", "nvlink3": "ampere", "nvlink2": "volta"}.get(g.interconnect, "ampere")


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


def _utilization(s: TrainingSetup, tokens_micro: int, c: TimeConstants) -> float:
    if c.utilization_override is not None:
        base = c.utilization_override
    elif s.device == "cpu":
        base = 1.0
    else:
        base = c.utilization.get(gpu_class(s), 0.40) * c.method_factor.get(s.method, 1.0)
    return base * tokens_micro / (tokens_micro + c.tokens_at_half_utilization)


def _cpu_elementwise_seconds(s: TrainingSetup) -> float:
    """One micro-step's activation/logits traffic on CPU (see CPU_ELEMENTWISE_BYTES_PER_SECOND)."""
    from scaletrain.engine.model.memory import block_activations, logits_bytes

    layer = block_activations(s)
    lg = logits_bytes(s)
    touched = layer.saved * s.model.num_layers + lg["saved"] + lg["forward_transient"] + lg["backward_transient"]
    return CPU_ACTIVATION_PASSES * touched / CPU_ELEMENTWISE_BYTES_PER_SECOND


def _param_bytes_gathered(s: TrainingSetup) -> int:
    """Bytes of the full model as ZeRO-3/FSDP gathers it: 16-bit weights (packed 4/8-bit under QLoRA)."""
    m = s.model
    cb = s.precision.compute_bytes
    if s.method == "full":
        return cb * m.params
    base = cb * m.params
    if s.base_bits in (4, 8):
        lin = m.targeted_linear_params(s.lora_targets)
        base = quantized_linear_bytes(lin, s.base_bits) + cb * (m.params - lin)
    return base + cb * s.trainable_params


def calibrated_constants(s: TrainingSetup) -> TimeConstants:
    """The default constants, with the compute scale `validate --save` measured on this GPU kind, if any."""
    from scaletrain.engine.model.calibration import for_setup

    cal = for_setup(s)
    return DEFAULT_CONSTANTS if cal is None else DEFAULT_CONSTANTS.with_(compute_scale=cal.compute_scale)


# ---- the estimate ------------------------------------------------------------------------------------------------
def estimate_time(s: TrainingSetup, constants: TimeConstants | None = None) -> TimeEstimate:
    """Seconds per optimizer step for one fully specified setup (pure arithmetic, microseconds)."""
    c = constants or calibrated_constants(s)
    hw = s.hardware
    g = hw.gpu
    n = s.world_size
    ga = s.grad_accum
    tokens = min(s.sample_tokens, s.seq_len)
    tokens_micro = s.micro_batch * tokens
    fl = sample_flops(s, tokens)
    util = _utilization(s, tokens_micro, c)
    peak = CPU_MATMUL_FLOPS if s.device == "cpu" else g.peak_tflops(s.precision) * 1e12
    rate = peak * util
    fwd_micro = s.micro_batch * (fl.forward + fl.recompute) / rate
    bwd_micro = s.micro_batch * fl.backward / rate
    if s.device == "cpu":
        bound = _cpu_elementwise_seconds(s) / (fwd_micro + bwd_micro)
        if bound > 1.0:
            fwd_micro, bwd_micro = fwd_micro * bound, bwd_micro * bound
    fwd_micro, bwd_micro = fwd_micro * c.compute_scale, bwd_micro * c.compute_scale
    compute_micro = fwd_micro + bwd_micro

    # QLoRA dequantization: every pass over a quantized linear (fwd, bwd, recompute) rebuilds a 16-bit copy.
    dequant_micro = 0.0
    if s.method != "full" and s.base_bits in (4, 8) and s.device != "cpu":
        lin = s.model.targeted_linear_params(s.lora_targets)
        cb = 2
        per_pass = quantized_linear_bytes(lin, s.base_bits) + 2 * cb * lin
        passes = 2 + (1 if s.grad_ckpt else 0)
        dequant_micro = passes * per_pass / (g.hbm_gbps * 1e9 * c.dequant_hbm_efficiency)

    # communication
    bw, link_what = bus_bandwidth(s, c)
    T = s.trainable_params
    cb = s.precision.compute_bytes
    ring = (n - 1) / n if n > 1 else 0.0
    overlap = c.overlap.get(s.strategy, 0.8)
    comm_micro = comm_step_hidden = comm_step_exposed = 0.0
    exposed_micro = 0.0
    if n > 1:
        if s.strategy == "ddp":
            # accelerate keeps fp32 params under autocast, so DDP all-reduces fp32 gradients, once per step
            comm_step_hidden = 2 * ring * 4 * T / bw
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
    shard_opt = s.strategy.shards_optimizer
    T_local = T / n if shard_opt else T
    offload_micro = offload_step = 0.0
    host_bw = _host_bandwidth(s, c)
    if s.offload.moves_optimizer and s.device != "cpu":
        # CPU-Adam on this node's shards (the node's GPUs share host memory bandwidth), 16-bit grads down and
        # updated 16-bit params up over the host link.
        T_node = T * hw.gpus_per_node / n
        optimizer = T_node * CPU_ADAM_BYTES_PER_PARAM / (c.host_memory_gbps * 1e9)
        offload_step = 2 * cb * T_local / host_bw
        if s.offload == "all":
            passes = 2 + (1 if s.grad_ckpt else 0)
            offload_micro = passes * _param_bytes_gathered(s) / n / host_bw
    elif s.device == "cpu":
        optimizer = T_local * OPTIMIZER_STEP_BYTES_PER_PARAM[s.optimizer] / (c.host_memory_gbps * 1e9)
    else:
        optimizer = T_local * OPTIMIZER_STEP_BYTES_PER_PARAM[s.optimizer] / (g.hbm_gbps * 1e9 * c.hbm_efficiency)

    compute = ga * compute_micro
    dequant = ga * dequant_micro
    offload = ga * offload_micro + offload_step
    step = compute + dequant + exposed + optimizer + offload

    tokens_per_step = s.effective_batch * tokens
    flops_step = ga * s.micro_batch * fl.total
    model_flops_step = ga * s.micro_batch * (fl.forward + fl.backward)
    steps_per_epoch = total_steps = None
    epoch_s = total_s = None
    if s.dataset_size is not None:
        steps_per_epoch = math.ceil(s.dataset_size / s.effective_batch)
        total_steps = math.ceil(steps_per_epoch * s.epochs)
        epoch_s = steps_per_epoch * step
        total_s = total_steps * step

    assumptions = _assumptions(s, util, peak, tokens, bw, link_what, overlap, dequant_micro, optimizer, offload)
    return TimeEstimate(
        step_seconds=step, compute_seconds=compute, dequant_seconds=dequant, communication_seconds=communication,
        exposed_communication_seconds=exposed, optimizer_seconds=optimizer, offload_seconds=offload,
        flops_per_step=flops_step, model_flops_per_step=model_flops_step, tokens_per_step=tokens_per_step,
        mfu=util, peak_flops=peak, bus_bandwidth_bytes_per_second=bw if n > 1 else 0.0,
        steps_per_epoch=steps_per_epoch, total_steps=total_steps, epoch_seconds=epoch_s, total_seconds=total_s,
        assumptions=assumptions, constants=c,
    )


def _assumptions(s: TrainingSetup, util: float, peak: float, tokens: int, bw: float, link_what: str,
                 overlap: float, dequant_micro: float, optimizer: float, offload: float) -> tuple[str, ...]:
    """The premises a reader needs to judge the time, in words, numbers from this estimate."""
    out = []
    if s.device == "cpu":
        out.append(f"CPU: matmuls at {peak / 1e9:.0f} GFLOP/s per process, activation traffic at "
                   f"{CPU_ELEMENTWISE_BYTES_PER_SECOND / 1e9:.1f} GB/s, whichever is slower")
    else:
        out.append(f"{util:.0%} of the {s.hardware.gpu.key} dense {s.precision} peak "
                   f"({peak / 1e12:.0f} TFLOP/s) on matmuls ({gpu_class(s)} class, {s.method})")
    src = "--tokens-per-sample" if s.tokens_per_sample else "the sequence length"
    out.append(f"{tokens:,} tokens per sample ({src})")
    if s.world_size > 1:
        out.append(f"collectives at {bw / 1e9:.1f} GB/s bus bandwidth ({link_what}), "
                   f"{overlap:.0%} of compute can hide them ({s.strategy})")
    if s.grad_ckpt:
        out.append("gradient checkpointing re-runs each block's forward")
    if dequant_micro:
        out.append(f"QLoRA dequantization {dequant_micro * 1000:.0f} ms per micro-step")
    if s.offload != "none":
        out.append(f"offload: CPU-Adam {optimizer:.2f} s + host copies {offload:.2f} s per step")
    return tuple(out)

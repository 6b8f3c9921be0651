"""Every constant of the time model, named with its source, and `TimeConstants`, which a calibration replaces.

Sources: datasheets, published kernel benchmarks, op counts taken with torch.profiler, and — where a value could
only come from a measurement — the H100 sweep in ../shared/measurements/h100-2026-11-23/ (bench/fit_time.py
reproduces those fits).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

# ---- device constants -------------------------------------------------------------------------------------------
# Fraction of the dense tensor peak a large bf16 cuBLAS GEMM sustains, per GPU generation. Hopper: fitted to the
# H100 sweep (bench/fit_time.py: 0.60 of 989 TFLOP/s ≈ 590 TFLOP/s, in the range of public cuBLAS bf16 results on
# H100 SXM); Ampere/Ada/Volta: A100 cuBLAS reaches ~80 % of its 312 TFLOP/s, GeForce Ada and Volta a little less
# (NVIDIA's published GEMM benchmarks). Not yet measured here; `validate --save` calibrates them. Blackwell takes
# Hopper's fraction and Turing Volta's until a run on them is measured (no such card has been lent to this project).
GEMM_EFFICIENCY: Mapping[str, float] = MappingProxyType({
    "hopper": 0.60, "ampere": 0.78, "ada": 0.70, "volta": 0.70, "blackwell": 0.60, "turing": 0.70,
})
# Thin matrices waste tensor-core tiles (128-256 wide) and waves: each GEMM dimension d contributes d / (d + 64).
# A 4096-wide dimension loses 1.5 %, the 128-wide k_proj of a GQA model a third.
GEMM_HALF_DIM = 64
# FlashAttention-2 as torch's sdpa runs it, fraction of the dense peak, forward / backward (FlashAttention-3 paper,
# Shah et al. 2024, Fig. 5-6: FA2 on H100 SXM reaches 300-350 TFLOP/s forward, 200-290 backward at head dims 64-128;
# FlashAttention-2 paper, Dao 2023: 50-73 % of A100's peak forward, ~40-60 % backward). Blackwell: Hopper's (FA2
# has no Blackwell-specific kernels either); Turing: Volta's (sdpa's memory-efficient kernel: FA2 needs sm80+).
FLASH_EFFICIENCY: Mapping[str, tuple[float, float]] = MappingProxyType({
    "hopper": (0.33, 0.25), "ampere": (0.60, 0.45), "ada": (0.55, 0.40), "volta": (0.40, 0.30),
    "blackwell": (0.33, 0.25), "turing": (0.40, 0.30),
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
# (That fit awaits a re-fit across both loop kinds on a GPU with bench/fit_time.py: no GPU has been lent since the
# trainer stopped waiting on the device every micro-step (issue 21), so the fitted runs' host time may include
# those waits.)
# Ops each loop kind dispatches per optimizer step, relative to the bundled trainer's (whose runs the constant
# above was fitted to): counted with torch.profiler by bench/kernel_counts.py (tiny-qwen2 full and LoRA, micro 4 ×
# seq 128, accumulation 1 and 2; bench/results/kernel_counts-vm.json), the mean over those cases. The host term is
# HOST_SECONDS_PER_KERNEL × the model's kernels × this ratio. trl: TRL's SFTTrainer is transformers' Trainer with
# its own loss bookkeeping; counted as hf-trainer (its token-accuracy/entropy metric ops are not in the count).
LOOP_HOST_OPS: Mapping[str, float] = MappingProxyType({
    "trainer": 1.0, "hf-trainer": 1.002, "trl": 1.002, "accelerate-loop": 0.988,
})
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
# DGX-1V ~120 of 150 GB/s; PCIe switches with P2P reach ~70 % of x16 line rate; NVLink 5 (B200) as NVLink 4 until
# measured.
LINK_EFFICIENCY: Mapping[str, float] = MappingProxyType({
    "nvlink5": 0.80, "nvlink4": 0.80, "nvlink3": 0.78, "nvlink2": 0.80, "pcie5": 0.70, "pcie4": 0.70, "pcie3": 0.70,
})
# GeForce cards have P2P disabled: NCCL stages every hop through pinned host memory (SHM transport, two copies
# over PCIe and the root complex). nccl-tests issues #269/#270 and NCCL #1530 report 8×RTX 4090 ring all-reduce
# far below line rate; we plan with a quarter of the x16 one-way rate.
NO_P2P_LINK_EFFICIENCY = 0.25
# Inter-node: a single HDR/NDR port reaches ~90 % of line rate in nccl-tests across nodes; the ring crosses each
# node's NIC once per direction, so the slower of the NIC and the intra-node link bounds the bus bandwidth.
INTER_NODE_EFFICIENCY = 0.90
# Host link of NVLink boards (GPU↔CPU still goes over PCIe): B200, H100/H200 SXM gen5, A100 gen4, V100 gen3.
HOST_LINK_GBPS: Mapping[str, float] = MappingProxyType({
    "nvlink5": 64.0, "nvlink4": 64.0, "nvlink3": 32.0, "nvlink2": 16.0, "pcie5": 64.0, "pcie4": 32.0, "pcie3": 16.0,
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
# CPU-Adam's compute per OpenMP thread: DeepSpeed's AVX kernel runs on OMP_NUM_THREADS threads, one per process
# when accelerate launch is left to its default (the launcher now gives each process the node's cores ÷ its
# processes). Measured with DeepSpeedCPUAdam 0.19.8 on this project's 2-core VM (bench/cpu_adam_threads.py,
# bench/results/cpu_adam_threads-vm.json): 4.8e8 fp32 parameters/s on 1 thread (the fastest of 9 steps of 50M
# parameters; the VM's second thread added nothing under the load of other work, so that row is not used). A
# process's update takes the slower of its threads' compute and its share of the node's memory bandwidth above.
CPU_ADAM_PARAMS_PER_THREAD_SECOND = 4.8e8
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
# Both rates above are one thread's. A process given t threads (the launcher's rule: the node's cores ÷ its
# processes, engine/catalog/hardware.threads_per_process) runs 1 + (t − 1) × CPU_THREAD_EFFICIENCY times faster.
# Issue 21's measurement on this 2-core VM (a plain PyTorch loop, 1 process): 0.87 s/step on 1 thread, 0.48 s on 2,
# i.e. ×1.81 for the second thread; bench/host_overhead.py records the plain loop on 1 thread and on all cores.
CPU_THREAD_EFFICIENCY = 0.8


def cpu_thread_speedup(threads: int | None) -> float:
    """How many times one thread's rate a process with `threads` threads reaches (None: not known, one thread)."""
    return 1.0 + (max(1, threads or 1) - 1) * CPU_THREAD_EFFICIENCY


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

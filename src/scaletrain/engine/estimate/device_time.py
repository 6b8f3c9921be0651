"""One micro-step per GPU, by where its time goes: the device's matmuls, attention, memory-bound kernels, loss and
per-kernel costs, against the host's dispatch (Python, autograd, launches, DeepSpeed's hooks); and the optimizer
update on the device. engine/estimate/timing.py composes these into a step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from scaletrain.engine.estimate.moe_time import (experts_dtype_bytes, moe_layers, routed_kernels,
                                              routed_matmul_seconds, routed_traffic_per_token,
                                              traced_traffic_per_token)
from scaletrain.engine.estimate.numerics import numerics, uses_deepspeed
from scaletrain.engine.estimate.objective_time import head_seconds, runs_reference, tokens_per_micro_step
from scaletrain.engine.estimate.objectives import scored_tokens, sequences
from scaletrain.engine.estimate.setup import TrainingSetup, quantized_linear_bytes
from scaletrain.engine.estimate.time_constants import (CAUSAL_ATTENTION_FRACTION,
                                                    CLIP_GRADIENT_PASSES, CPU_ACTIVATION_PASSES,
                                                    CPU_ELEMENTWISE_BYTES_PER_SECOND, CPU_MATMUL_FLOPS,
                                                    DEFAULT_CONSTANTS, DS_STEP_BYTES_PER_PARAM,
                                                    FLASH_BACKWARD_FLOPS_RATIO, KERNELS_PER_ADAPTER, LOOP_HOST_OPS,
                                                    KERNELS_PER_BLOCK, KERNELS_PER_EXTRA_NORM, KERNELS_PER_QK_NORM,
                                                    OPTIMIZER_PASSES, TimeConstants, cpu_thread_speedup)


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
    reference: float = 0.0   # DPO/GRPO: the frozen reference's no-grad forward on the device

    @property
    def device(self) -> float:
        return (self.matmul + self.attention + self.memory_bound + self.loss + self.kernel_overhead + self.dequant
                + self.gathers + self.reference)

    @property
    def seconds(self) -> float:
        return self.device + self.host if self.serial_host else max(self.device, self.host)

    @property
    def host_bound(self) -> bool:
        return not self.serial_host and self.host > self.device


def param_bytes_gathered(s: TrainingSetup) -> int:
    """Bytes of the full model as ZeRO-3/FSDP gathers it: 16-bit weights (packed 4/8-bit under QLoRA)."""
    m = s.model
    cb = 4 if s.precision == "fp32" else 2
    if s.method == "full":
        return cb * m.params
    base = cb * m.params
    if s.base_bits in (4, 8):
        lin = m.linear_weight_params()       # bitsandbytes quantizes every block nn.Linear, whatever LoRA targets
        base = quantized_linear_bytes(lin, s.base_bits) + cb * (m.params - lin)
    return base + cb * s.trainable_params


# ---- one micro-step on the device ---------------------------------------------------------------------------------
def _gemm_seconds(M: float, N: float, K: float, peak: float, hbm: float, c: TimeConstants, arch: str) -> float:
    """A GEMM at its shape's efficiency, or at HBM speed when its operands outweigh its FLOPs (a roofline)."""
    d = c.gemm_half_dim
    eff = c.gemm_efficiency.get(arch, 0.7) * (M / (M + d)) * (N / (N + d)) * (K / (K + d))
    return max(2.0 * M * N * K / (peak * eff), 2.0 * (M * K + K * N + M * N) / hbm)


def gemm_for(s: TrainingSetup, c: TimeConstants, precision: str | None = None) -> Callable[[float, float, float], float]:
    """_gemm_seconds bound to this setup's GPU and constants (at `precision`, default the plan's): (M, N, K) →
    seconds."""
    g = s.hardware.gpu
    peak = g.peak_tflops(precision or s.precision) * 1e12
    hbm = g.hbm_gbps * 1e9 * c.hbm_efficiency
    return lambda M, N, K: _gemm_seconds(M, N, K, peak, hbm, c, g.arch)


def _block_matmul_seconds(s: TrainingSetup, t: int, gemm: Callable[[float, float, float], float],
                          forward_only: bool = False) -> float:
    """Block linears: forward (twice under checkpointing), input gradient, weight gradient when trained. LoRA's
    rank-r matmuls are memory-bound and counted with the adapters' traffic."""
    m = s.model
    full = s.method == "full"
    passes = 1 if forward_only else (2 if s.grad_ckpt else 1)
    total = 0.0
    for blocks, linears in m.linear_kinds():
        block = 0.0
        for i, o, _ in linears.values():
            block += passes * gemm(t, o, i)
            if not forward_only:
                block += gemm(t, i, o) + (gemm(o, i, t) if full else 0.0)
        total += blocks * block
    return total


def _attention_seconds(s: TrainingSetup, peak: float, hbm: float, c: TimeConstants,
                       forward_only: bool = False) -> float:
    """The attention core of all blocks: FlashAttention-2 (sdpa/flash on CUDA) at its measured fraction of peak, or
    eager's two batched matmuls over all S² scores plus its fp32 softmax, mask and cast at HBM speed."""
    m = s.model
    b, S, L = sequences(s), s.seq_len, m.num_layers
    passes = 2 if s.grad_ckpt else 1
    if forward_only:
        passes = 1
    if s.attn == "eager":
        flops = 2 * 2 * b * S * S * m.q_dim * L
        scores = b * m.num_heads * S * S
        cb = numerics(s).compute
        # scores written, masked, softmax in fp32, cast: ~ (c + c + c + 4 + 4 + c) forward, twice that backward
        traffic = scores * (4 * cb + 8) * (passes + c.backward_traffic_ratio) * L
        arch = s.hardware.gpu.arch
        gemm_rate = peak * c.gemm_efficiency.get(arch, 0.7)
        if forward_only:
            return flops / gemm_rate + scores * (4 * cb + 8) * L / hbm
        return flops * (passes + 2) / gemm_rate + traffic / hbm
    fwd_eff, bwd_eff = c.flash_efficiency.get(s.hardware.gpu.arch, (0.4, 0.3))
    flops = 2 * 2 * b * S * S * CAUSAL_ATTENTION_FRACTION * m.q_dim * L
    backward = 0.0 if forward_only else FLASH_BACKWARD_FLOPS_RATIO * flops / (peak * bwd_eff)
    return passes * flops / (peak * fwd_eff) + backward


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
    if m.moe is None:
        out += 5 * nm.mlp_bytes * i                        # act(gate), act·up
        out += moe_layers(s) * traced_traffic_per_token(s) // m.num_layers    # a traced model's routed experts
    else:   # per block on average: dense layers' MLP, MoE blocks' shared expert and routed experts
        n_moe = moe_layers(s)
        per_moe = routed_traffic_per_token(s) + 5 * nm.mlp_bytes * m.moe.shared_intermediate
        out += (n_moe * per_moe + (m.num_layers - n_moe) * 5 * nm.mlp_bytes * i) // m.num_layers
    if s.method != "full":
        for name, (a, o, _) in m.lora_target_shapes(s.lora_targets).items():
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
    t = tokens_per_micro_step(s)
    L = m.num_layers
    passes = 2 if s.grad_ckpt else 1
    peak = g.peak_tflops(s.precision) * 1e12
    hbm = g.hbm_gbps * 1e9 * c.hbm_efficiency
    gemm = gemm_for(s, c)
    head = head_seconds(s, t, gemm, hbm)
    expert_gemm = gemm_for(s, c, "fp32") if experts_dtype_bytes(s) == 4 else gemm
    matmul = _block_matmul_seconds(s, t, gemm) + routed_matmul_seconds(s, t, expert_gemm) + head.matmul
    attention = _attention_seconds(s, peak, hbm, c)
    forward_traffic = L * t * block_forward_traffic(s)
    traffic = forward_traffic * (passes + c.backward_traffic_ratio)
    # autocast casts nn.Linear weights only; a traced model's kinds each by their own
    blocks_w = (m.linear_weight_params() if m.trace is not None
                else L * sum(i * o for i, o, _ in m.linear_shapes().values()))
    if nm.trainable_copies or nm.frozen_copies:
        traffic += passes * 6 * blocks_w                   # autocast casts fp32 weights each forward (4 → 2 B)
    if nm.trainable_copies:
        traffic += 6 * m.params                            # 16-bit weight gradients converted to fp32
    memory_bound = traffic / hbm
    loss = head.loss
    kf, kb = block_kernels(s)
    mf, mb = routed_kernels(s, t)
    kernels = L * (passes * kf + kb) + moe_layers(s) * (passes * mf + mb)
    reference = 0.0
    if runs_reference(s):
        # the frozen reference's forward on the same tokens, nothing saved: GEMMs, attention, traffic, its head
        reference = (_block_matmul_seconds(s, t, gemm, forward_only=True)
                     + routed_matmul_seconds(s, t, expert_gemm, forward_only=True)
                     + gemm(scored_tokens(s), m.vocab_size, m.hidden_size)
                     + _attention_seconds(s, peak, hbm, c, forward_only=True) + forward_traffic / hbm)
        kernels += L * kf
    dequant = 0.0
    if s.method != "full" and s.base_bits in (4, 8):
        lin = m.linear_weight_params()       # every quantized linear is dequantized in each pass
        per_pass = quantized_linear_bytes(lin, s.base_bits) + 2 * 2 * lin
        dequant = (passes + 1) * per_pass / (g.hbm_gbps * 1e9 * c.dequant_hbm_efficiency)
    gathers = 0.0
    host = kernels * c.host_seconds_per_kernel * LOOP_HOST_OPS[s.loop]       # what the loop kind dispatches
    serial = False
    if s.strategy in ("zero3", "fsdp"):
        # every pass gathers the 16-bit parameters into full tensors (a copy even on one GPU) and the backward
        # reduce-scatters the gradients
        gathers = (passes + 1) * 2 * param_bytes_gathered(s) / max(s.world_size, 1) / hbm
        if s.strategy == "zero3":
            modules = L * (len(m.linear_shapes()) + len(m.family["norms"])) + moe_layers(s)   # a leaf MoE block
            host += modules * (passes + 1) * c.ds_zero3_module_seconds
            serial = True
    elif uses_deepspeed(s):
        host += m.tensor_count * c.ds_grad_hook_seconds
    scale = c.compute_scale
    return MicroStep(matmul * scale, attention * scale, memory_bound * scale, loss * scale,
                     kernels * c.kernel_seconds * scale, dequant * scale, gathers * scale, host * scale, serial,
                     reference * scale)


def optimizer_device_seconds(s: TrainingSetup, c: TimeConstants) -> float:
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


def cpu_micro_step(s: TrainingSetup, fl_total: float, c: TimeConstants) -> MicroStep:
    """CPU runs: matmuls at CPU_MATMUL_FLOPS, or the activation/logits traffic, whichever is slower; both per
    thread, times the speedup of the threads each process runs with."""
    from scaletrain.engine.estimate.activations import block_activations, logits_bytes

    layer = block_activations(s)
    lg = logits_bytes(s)
    touched = layer.saved * s.model.num_layers + lg["saved"] + lg["forward_transient"] + lg["backward_transient"]
    speed = cpu_thread_speedup(s.hardware.cpu_threads_per_process)
    traffic = CPU_ACTIVATION_PASSES * touched / (CPU_ELEMENTWISE_BYTES_PER_SECOND * speed)
    flops = s.micro_batch * fl_total / (CPU_MATMUL_FLOPS * speed)
    scale = c.compute_scale
    if traffic > flops:
        return MicroStep(0.0, 0.0, traffic * scale, 0.0, 0.0, 0.0, 0.0, 0.0, False)
    return MicroStep(flops * scale, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False)

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

The terms live in device_time.py, their constants (each named with its source: a datasheet figure, a published
kernel benchmark, an op count taken with torch.profiler, or a fit to the H100 measurements in
../shared/measurements/h100-2026-11-23/, which bench/fit_time.py reproduces) in time_constants.py;
bench/results/h100-2026-11-23.json holds the re-predicted sweep. `TimeConstants` holds them all so a calibration
(`validate --save`) can replace what it measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from scaletrain.engine.estimate.device_time import (MicroStep, block_kernels, cpu_micro_step,
                                                 gemm_for, micro_step, optimizer_device_seconds,
                                                 param_bytes_gathered)
from scaletrain.engine.estimate.objective_time import GenerationTime, generation_seconds
from scaletrain.engine.estimate.chunked_loss import recomputes_head
from scaletrain.engine.estimate.moe_time import (LOAD_BALANCE_ASSUMPTION, TRACED_EXPERTS_UNCOUNTED,
                                              experts_dtype_bytes, moe_layers, routed_sample_flops, rows_text,
                                              traced_rows, uncounted_experts)
from scaletrain.engine.estimate.objectives import sequences
from scaletrain.engine.estimate.numerics import numerics
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.estimate.time_constants import (CAUSAL_ATTENTION_FRACTION, CPU_ADAM_BYTES_PER_PARAM,
                                                    CPU_ADAM_PARAMS_PER_THREAD_SECOND,
                                                    CPU_ELEMENTWISE_BYTES_PER_SECOND, CPU_GLOO_BYTES_PER_SECOND,
                                                    CPU_MATMUL_FLOPS, DEFAULT_CONSTANTS, HOST_LINK_GBPS,
                                                    TimeConstants, cpu_thread_speedup)


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
    generation: GenerationTime | None = None   # GRPO: generating the completions, once per step
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
                       gathers=ga * u.gathers, reference=ga * u.reference, host=ga * u.host)
        if self.generation is not None:
            out["generation"] = self.generation.seconds
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
    L = m.num_layers
    linear_w = m.linear_weight_params()     # every block nn.Linear, each layer kind by its count
    head_w = m.vocab_size * m.hidden_size
    causal = 1.0 if s.attn == "eager" else CAUSAL_ATTENTION_FRACTION
    # QK^T and attention·V: 2 FLOPs × tokens attended × q width, each
    attn_fwd = 2 * 2 * tokens * causal * m.q_dim * L * tokens
    lin_fwd = 2.0 * linear_w * tokens
    head_fwd = 2.0 * head_w * tokens
    full = s.method == "full"
    if full:
        adapter_fwd = 0.0
    else:
        adapter_fwd = 2.0 * tokens * m.lora_params(s.lora_rank, s.lora_targets)
    forward = lin_fwd + head_fwd + attn_fwd + adapter_fwd
    wgrad = (lin_fwd + head_fwd) if full else 0.0
    backward = (lin_fwd + head_fwd) + wgrad + 2 * attn_fwd + 2 * adapter_fwd
    backward += head_fwd if recomputes_head(s) else 0.0    # --loss chunked (pure torch) re-projects each chunk
    recompute = (lin_fwd + attn_fwd + adapter_fwd) if s.grad_ckpt else 0.0
    moe_fwd, moe_bwd, moe_re = routed_sample_flops(s, tokens)     # the router and the top-k experts: active only
    return SampleFlops(forward + moe_fwd, backward + moe_bwd, recompute + moe_re)


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


def calibrated_constants(s: TrainingSetup) -> TimeConstants:
    """The default constants, with the compute scale `validate --save` measured on this GPU kind, if any."""
    from scaletrain.engine.estimate.calibration import for_setup

    cal = for_setup(s)
    return DEFAULT_CONSTANTS if cal is None else DEFAULT_CONSTANTS.with_(compute_scale=cal.compute_scale)


# ---- the estimate ------------------------------------------------------------------------------------------------
def steps_in_epoch(s: TrainingSetup) -> int:
    """Optimizer steps per pass over the data. The bundled trainer shards the rows per rank and drops a last partial
    step (trainer/train.make_schedule); SFT objectives run by TRL, HF Trainer and other loops keep it (ceil)."""
    assert s.dataset_size is not None
    if s.loop == "trainer" and s.objective == "sft":
        return max(1, (s.dataset_size // s.world_size) // s.micro_batch // s.grad_accum)
    return math.ceil(s.dataset_size / s.effective_batch)


def estimate_time(s: TrainingSetup, constants: TimeConstants | None = None) -> TimeEstimate:
    """Seconds per optimizer step for one fully specified setup (pure arithmetic, well under a millisecond)."""
    c = constants or calibrated_constants(s)
    hw = s.hardware
    g = hw.gpu
    n = s.world_size
    ga = s.grad_accum
    tokens = min(s.sample_tokens, s.seq_len)
    fl = sample_flops(s, tokens)
    threads = hw.cpu_threads_per_process
    peak = (CPU_MATMUL_FLOPS * cpu_thread_speedup(threads) if s.device == "cpu"
            else g.peak_tflops(s.precision) * 1e12)
    if s.device == "cpu":
        micro = cpu_micro_step(s, fl.total, c)
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
            comm_micro = ring * (passes * param_bytes_gathered(s) + cb * T) / bw
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
        optimizer = cpu_adam_seconds(s, c)
        offload_step = 2 * cb * T_local / host_bw
        if s.offload == "all":
            passes = 2 + (1 if s.grad_ckpt else 0)
            offload_micro = passes * param_bytes_gathered(s) / n / host_bw
    elif s.device == "cpu":
        optimizer = T_local * 32.0 / (c.host_memory_gbps * 1e9)
    else:
        optimizer = optimizer_device_seconds(s, c)

    compute = ga * compute_micro
    offload = ga * offload_micro + offload_step
    generation = (GenerationTime(0, 0.0, 0.0, False, "") if s.device == "cpu"
                  else generation_seconds(s, c, gemm_for(s, c), block_kernels(s)[0]))
    step = compute + exposed + optimizer + offload + generation.seconds

    seqs = sequences(s) // s.micro_batch           # sequences per sample: 2 for a chosen/rejected pair
    tokens_per_step = s.effective_batch * seqs * tokens
    flops_step = ga * s.micro_batch * seqs * fl.total
    model_flops_step = ga * s.micro_batch * seqs * (fl.forward + fl.backward)
    mfu = model_flops_step / (step * peak) if step > 0 and peak > 0 else 0.0
    steps_per_epoch = total_steps = None
    epoch_s = total_s = None
    if s.dataset_size is not None:
        steps_per_epoch = steps_in_epoch(s)
        total_steps = math.ceil(steps_per_epoch * s.epochs)
        epoch_s = steps_per_epoch * step
        total_s = total_steps * step

    assumptions = _assumptions(s, micro, peak, tokens, bw, link_what, overlap, optimizer, offload, c)
    if generation.completions:
        assumptions += (_generation_assumption(s, generation),)
    return TimeEstimate(
        step_seconds=step, compute_seconds=compute, dequant_seconds=ga * micro.dequant,
        communication_seconds=communication, exposed_communication_seconds=exposed, optimizer_seconds=optimizer,
        offload_seconds=offload, flops_per_step=flops_step, model_flops_per_step=model_flops_step,
        tokens_per_step=tokens_per_step, mfu=mfu, peak_flops=peak, bus_bandwidth_bytes_per_second=bw if n > 1 else 0.0,
        micro=micro, generation=generation if generation.completions else None,
        steps_per_epoch=steps_per_epoch, total_steps=total_steps, epoch_seconds=epoch_s,
        total_seconds=total_s, assumptions=assumptions, constants=c,
    )


def cpu_adam_seconds(s: TrainingSetup, c: TimeConstants) -> float:
    """DeepSpeed's CPU-Adam under optimizer offload, per step: each process updates its shard with the threads it
    was given (OpenMP, OMP_NUM_THREADS), and the node's processes together stream through host memory; the slower
    of the two. Threads not known (named GPUs: the launcher divides the node's cores at launch): the node's memory
    bandwidth, which a full share of its cores reaches."""
    hw = s.hardware
    T_node = s.trainable_params * hw.gpus_per_node / s.world_size
    memory = T_node * CPU_ADAM_BYTES_PER_PARAM / (c.host_memory_gbps * 1e9)
    threads = hw.cpu_threads_per_process
    if threads is None:
        return memory
    compute = (s.trainable_params / s.world_size) / (threads * CPU_ADAM_PARAMS_PER_THREAD_SECOND)
    return max(memory, compute)


def _generation_assumption(s: TrainingSetup, gen: GenerationTime) -> str:
    return (f"GRPO generates {gen.completions} completions per step {gen.where}: "
            + (f"{gen.seconds:.2f} s (prefill {gen.prefill * 1000:.0f} ms, {s.completion_len} decode "
               f"steps {'bound by the host' if gen.host_bound else 'reading every weight'})"
               if gen.seconds else "not on this GPU's clock"))


def _assumptions(s: TrainingSetup, micro: MicroStep, peak: float, tokens: int, bw: float, link_what: str,
                 overlap: float, optimizer: float, offload: float, c: TimeConstants) -> tuple[str, ...]:
    """The premises a reader needs to judge the time, in words, numbers from this estimate."""
    out = []
    if s.device == "cpu":
        threads = s.hardware.cpu_threads_per_process or 1
        speed = cpu_thread_speedup(threads)
        out.append(f"CPU: {threads} thread{'s' if threads > 1 else ''} per process, matmuls at {peak / 1e9:.0f} "
                   f"GFLOP/s, activation traffic at {CPU_ELEMENTWISE_BYTES_PER_SECOND * speed / 1e9:.1f} GB/s per "
                   "process, whichever is slower")
    else:
        g = s.hardware.gpu
        arch = g.arch
        fwd, bwd = c.flash_efficiency.get(arch, (0.4, 0.3))
        out.append(f"matmuls at up to {c.gemm_efficiency.get(arch, 0.7):.0%} of the {g.key} dense {s.precision} "
                   f"peak ({peak / 1e12:.0f} TFLOP/s), less for thin shapes; attention at {fwd:.0%}/{bwd:.0%} "
                   f"(forward/backward); memory-bound work at {c.hbm_efficiency:.0%} of {g.hbm_gbps:,.0f} GB/s")
        u = micro
        parts = {"matmul": u.matmul, "attention": u.attention, "memory-bound": u.memory_bound, "loss": u.loss,
                 "kernel overhead": u.kernel_overhead, "dequant": u.dequant, "gathers": u.gathers,
                 "reference forward": u.reference}
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
    fp32_experts = ("; the experts compute in fp32 (grouped_mm ignores autocast over fp32 weights)"
                    if experts_dtype_bytes(s) == 4 and s.precision != "fp32" else "")
    if s.model.moe is not None:
        out.append(LOAD_BALANCE_ASSUMPTION + f"; FLOPs of the {s.model.active_params:,} active parameters"
                   + fp32_experts)
    elif moe_layers(s):
        rows = rows_text(traced_rows(s)) or "no"
        out.append(LOAD_BALANCE_ASSUMPTION + f"; {rows} expert rows per token, as its trace counted them"
                   + fp32_experts)
    if uncounted_experts(s):
        out.append(TRACED_EXPERTS_UNCOUNTED)
    if micro.dequant:
        out.append(f"QLoRA dequantization {micro.dequant * 1000:.0f} ms per micro-step")
    if s.offload != "none":
        threads = s.hardware.cpu_threads_per_process
        how = (f"{threads} thread{'s' if threads > 1 else ''} per process" if threads is not None
               else "threads decided at launch, at the node's memory bandwidth")
        out.append(f"offload: CPU-Adam {optimizer:.2f} s ({how}) + host copies {offload:.2f} s per step")
    elif s.device != "cpu":
        out.append(f"optimizer ({s.optimizer}, {s.optimizer_impl}) {optimizer * 1000:.0f} ms per step")
    return tuple(out)

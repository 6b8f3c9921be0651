"""Model states per GPU: weights, optimizer states, and the gradients at each moment of a step.

Gradients follow each stack's code: the trained weights' dtype in plain PyTorch (DDP buckets from the first forward
when world > 1), DeepSpeed's 16-bit partitions and buckets that become fp32 only inside step()
(deepspeed/runtime/zero/stage_1_and_2.py, stage3.py, 0.19), offloaded partitions in pinned host memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.engine.catalog.architectures import BLOCK_LINEARS
from scaletrain.engine.catalog.moe import peft_expert_ranks
from scaletrain.engine.estimate.numerics import Numerics, numerics, uses_deepspeed
from scaletrain.engine.estimate.setup import TrainingSetup, quantized_linear_bytes
from scaletrain.engine.estimate.traced_blocks import gradless_params, largest_stepped_param

# DeepSpeed bucket defaults as our ds_config writer emits them (writers read the same numbers from here).
DS_REDUCE_BUCKET_ELEMS = 200_000_000     # ipg / reduce bucket, elements (DeepSpeed default 5e8; we write 2e8)
DS_ALLGATHER_BUCKET_ELEMS = 200_000_000  # ZeRO-1/2 all-gather bucket after the step
DS_SUB_GROUP_ELEMS = 1_000_000_000       # ZeRO-3 optimizer sub-group (DeepSpeed default 1e9)
DS_PREFETCH_BUCKET_ELEMS = 50_000_000    # ZeRO-3 stage3_prefetch_bucket_size (DeepSpeed default 5e7)


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


def buffer_bytes(s: TrainingSetup) -> int:
    """A traced model's buffers in the weights' dtype (full fine-tuning) or the frozen base's (LoRA): part of
    ModelStates.weights, though no parameter's."""
    nm = numerics(s)
    return s.model.buffer_bytes(nm.weight if s.method == "full" else nm.frozen, cast_whole=uses_deepspeed(s))


def model_states(s: TrainingSetup) -> ModelStates:
    m = s.model
    n = s.world_size
    P = m.params
    T = s.trainable_params
    T_stepped = T - gradless_params(s)      # stepped: a multimodal model's towers get no gradient on text
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
        # Frozen base: bitsandbytes quantizes every block nn.Linear (QLoRA NF4 / 8-bit), whatever LoRA targets;
        # the rest (embeddings, norms, lm_head, MoE's fused experts and router) in the base dtype, fp32 under QLoRA
        # (prepare_model_for_kbit_training). Unquantized, every frozen weight is in the base dtype.
        lin = m.linear_weight_params()
        lin_bytes = quantized_linear_bytes(lin, s.base_bits) if s.base_bits in (4, 8) else nm.frozen * lin
        frozen_bytes = lin_bytes + nm.frozen * (P - lin)
        trainable_weight_bytes = nm.adapter * T
    weights = trainable_weight_bytes + frozen_bytes
    if shard_param:
        weights = weights // n
    host_weights, weights = (weights, 0) if s.offload == "all" else (0, weights)
    weights += buffer_bytes(s) + sum(r.weight_bytes() for r in s.residents)   # buffers: never sharded nor offloaded

    # -- optimizer (+ DeepSpeed's fp32 master) -----------------------------------------------------------------
    master_pp = 4 if (ds and s.precision != "fp32") else 0
    optimizer = int((opt_pp + master_pp) * T_stepped)
    if shard_opt:
        optimizer //= n
    if s.device == "cpu" and s.optimizer == "adamw" and not ds:
        # torch keeps AdamW's `step` as a 0-dim fp32 tensor per parameter tensor, on the host (so it only
        # counts against memory when the host is the device)
        optimizer += 4 * (m.tensor_count if s.method == "full" else   # each adapter's A and B (+ PEFT's score)
                          2 * m.adapted_linears(s.lora_targets) + (1 if m.score_head else 0))
    host_opt = 0
    if s.offload in ("optimizer", "all"):
        host_opt, optimizer = optimizer, 0

    # -- gradients -------------------------------------------------------------------------------------------------
    T_local = T_stepped // n if shard_opt else T_stepped
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
            # grads_in_partition (16-bit, the whole partition at the first bucket flush) + the ipg bucket, both from
            # the first gradient hook on (lm_head's); released after the step unless the next micro-step
            # accumulates into them
            persistent = part if s.grad_accum > 1 else 0
            backward, grows = part + _ds_bucket(s, cb), False
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
        backward = grad_pp * T_stepped
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
    holds two temporaries of the largest parameter tensor at a time (`largest_param_elems`). SGD's momentum and
    bitsandbytes' 8-bit AdamW update in place. Offloaded optimizers step on the host.
    """
    if s.offload != "none" or s.optimizer != "adamw" or s.optimizer_impl == "fused":
        return 0
    if s.optimizer_impl == "foreach":
        return nm.state * T_local
    largest = largest_stepped_param(s) if s.method == "full" else _largest_lora_tensor(s)
    return 2 * nm.state * largest


def _largest_lora_tensor(s: TrainingSetup) -> int:
    m = s.model
    r = s.lora_rank
    shapes = {**m.lora_target_shapes(s.lora_targets, dense=True), **m.lora_target_shapes(s.lora_targets)}
    largest = max((r * max(a, o) for a, o, _ in shapes.values()), default=0)
    gu, dn = peft_expert_ranks(m.model_type, m.moe, tuple(s.lora_targets) or BLOCK_LINEARS)   # in units of r
    if m.moe is not None and (gu or dn):   # peft's adapters of the fused experts: lora_A (R·E, in), lora_B (out, R·E)
        E, h, i = m.moe.experts, m.hidden_size, m.moe.expert_intermediate
        largest = max(largest, gu * r * E * max(h, 2 * i), dn * r * E * max(h, i))
    return largest

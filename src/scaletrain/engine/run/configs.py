"""Plan → accelerate's YAML and DeepSpeed's JSON for a run directory.

Every number written here is read from the Plan (micro batch, accumulation, world size, precision, ZeRO stage,
offload) or from a named constant below / in memory.py (bucket sizes the memory model assumes). No torch,
accelerate or DeepSpeed import; the tests check the files with accelerate's and DeepSpeed's own parsers.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import yaml

from scaletrain.engine.estimate.states import (DS_ALLGATHER_BUCKET_ELEMS, DS_PREFETCH_BUCKET_ELEMS,
                                            DS_REDUCE_BUCKET_ELEMS, DS_SUB_GROUP_ELEMS)
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import read_text_bounded
from scaletrain.engine.estimate.setup import check_objective_strategy
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.request.options import TrainOptions

# Rendezvous port: torch.distributed's customary 29500 plus a per-run offset derived from the run directory, so two
# runs on one machine do not collide (accelerate uses 29500 for every run when main_process_port is unset).
MAIN_PROCESS_PORT_BASE = 29500
MAIN_PROCESS_PORT_SPAN = 1000
# accelerate's mixed_precision values ("no" = fp32), src/accelerate/utils/dataclasses.py PrecisionType.
ACCELERATE_MIXED_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}
# DeepSpeed ZeRO-3 defaults (deepspeed/runtime/zero/config.py), written out so no value is implicit.
DS_STAGE3_MAX_LIVE_PARAMS = 1_000_000_000
DS_STAGE3_MAX_REUSE_DISTANCE = 1_000_000_000
# Parameters smaller than this stay whole on every rank (norms, biases); transformers' DeepSpeed integration sets
# it to 10 × hidden_size (integrations/deepspeed.py, trainer_config_finalize), which also lets tiny test models
# really shard their matrices (DeepSpeed's fixed default of 1e5 elements would keep a tiny model whole).
DS_PERSISTENCE_PER_HIDDEN = 10
# HF transformers DeepSpeed guide: "overlap_comm ... uses 4.5x the allgather_bucket_size and reduce_bucket_size".
OVERLAP_COMM_BUCKET_FACTOR = 4.5
# DeepSpeed dynamic fp16 loss scaling defaults (deepspeed/runtime/fp16/loss_scaler.py, config docs).
FP16_INITIAL_SCALE_POWER = 16
FP16_LOSS_SCALE_WINDOW = 1000
FP16_HYSTERESIS = 2
FP16_MIN_LOSS_SCALE = 1
# The trainer writes its own per-step metrics; DeepSpeed's periodic step print would only duplicate them.
DS_STEPS_PER_PRINT = 1_000_000_000


# ---- accelerate ------------------------------------------------------------------------------------------------
def mixed_precision(precision: str, master_weights: str) -> str:
    """accelerate's mixed_precision for a plan: autocast to the compute precision over fp32 weights, or "no" when
    the weights already are the compute precision (`master_weights` bf16: no fp32 copy, no autocast) or fp32."""
    return "no" if master_weights == "bf16" else ACCELERATE_MIXED_PRECISION[precision]


def main_process_port(run: RunDir) -> int:
    return MAIN_PROCESS_PORT_BASE + zlib.crc32(str(run.path).encode()) % MAIN_PROCESS_PORT_SPAN


def distributed_type(plan: Plan) -> str:
    return distributed_type_for(plan.setup.strategy, plan.setup.world_size)


def distributed_type_for(strategy: str, world_size: int) -> str:
    """accelerate's distributed_type for a strategy. FSDP: accelerate's launcher starts the ranks with torchrun
    (as for DDP) and the bundled trainer shards with torch's fully_shard itself (trainer/fsdp.py), on a CPU host
    too, where accelerate's own FSDP plugin would silently become DDP."""
    if strategy in ("zero1", "zero2", "zero3"):
        return "DEEPSPEED"
    if strategy == "fsdp":
        return "FSDP"
    # DDP. On CPU too: accelerate's MULTI_GPU launcher (torchrun) starts N ranks and the trainer's
    # Accelerator(cpu=True) turns the state into MULTI_CPU over gloo (shared/reference/cpu-distributed-notes.md §2).
    return "MULTI_GPU" if world_size > 1 else "NO"


def check_strategy(path: Any, got: Any, strategy: str, world_size: int, objective: str, on_cpu: bool) -> None:
    """A launch's accelerate_config.yaml (distributed_type `got`) must start the plan's strategy: an edited one would
    run another strategy than the plan (the trainer refuses that too, after the ranks start; here it costs
    nothing). TRL's trainers (reward/dpo/grpo) take accelerate's FSDP plugin, which a CPU host drops."""
    want = distributed_type_for(strategy, world_size)
    if got != want:
        raise ScaletrainError(f"{path} has distributed_type {got!r} but the plan's strategy {strategy} on "
                              f"{world_size} process(es) needs {want!r}; restore it, or write the run directory "
                              "again for another strategy")
    check_objective_strategy(objective, strategy, on_cpu)


# The keys of accelerate_config.yaml and ds_config.json whose edit would train another batch, precision or sharding
# than plan.json's numbers are for (the batch keys of ds_config.json: the trainer's _check_ds_config). Tuning keys
# (bucket sizes, overlap) are the user's to change.
PLANNED_KEYS = (("num_processes",), ("num_machines",), ("mixed_precision",))
PLANNED_DS_KEYS = (("zero_optimization", "stage"), ("bf16", "enabled"), ("fp16", "enabled"),
                   ("zero_optimization", "offload_optimizer", "device"), ("zero_optimization", "offload_param", "device"))


def check_planned(run: RunDir, cfg: dict[str, Any], plan: Plan, train: TrainOptions) -> None:
    """A launch's configs start what its plan was made for: num_processes 2 -> 3 by hand trained 3 ranks, a batch of
    24 where the plan's memory, time and epochs were for 16; ZeRO stage 2 -> 3 failed in the ranks on a meta tensor;
    bf16 enabled in an fp32 plan trained in bf16. One line before any process starts."""
    _check_keys(run.accelerate_config, cfg, accelerate_config(plan, run, train), PLANNED_KEYS, absent_unplanned=True)
    ds = deepspeed_config(plan, train)
    if ds is not None and run.ds_config.is_file():
        try:
            got = json.loads(read_text_bounded(run.ds_config, what=run.ds_config.name))
        except (OSError, ValueError) as e:
            raise ScaletrainError(f"{run.ds_config} cannot be read as JSON ({e.__class__.__name__}); restore it, or "
                                  "write it again with scaletrain launch DIR --set KEY=VALUE (any change re-plans "
                                  "and rewrites every file)") from None
        _check_keys(run.ds_config, got, ds, PLANNED_DS_KEYS)


def _at(d: Any, keys: tuple[str, ...]) -> Any:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return None if d == "none" and keys[-1] == "device" else d        # DeepSpeed's "none" device: no offload


def _check_keys(path: Any, got: Any, planned: dict[str, Any], keys: tuple[tuple[str, ...], ...],
                absent_unplanned: bool = False) -> None:
    """Each key as planned; absent_unplanned: a key the writer leaves out (mixed_precision beside a DeepSpeed config
    file) is not checked, else its absence is what was planned (no offload section: no offload)."""
    for k in keys:
        have, want = _at(got, k), _at(planned, k)
        if not (want is None and absent_unplanned) and str(have) != str(want):
            planned_as = repr(want) if want is not None else "it absent"
            raise ScaletrainError(f"{path} has {'.'.join(k)} {have!r} but its plan.json was made with {planned_as} "
                                  "(edited by hand?); restore it, or re-plan it with scaletrain launch DIR "
                                  "--set KEY=VALUE (re-planned, every file rewritten, the old ones kept)")


def _zero3_init(plan: Plan, train: TrainOptions) -> bool:
    """deepspeed.zero.Init while loading: pretrained ZeRO-3 weights are partitioned as they load, so no rank
    materialises the whole model. random-init builds a small model from its config; no need."""
    return plan.setup.strategy == "zero3" and train.model_source != "random-init"


def accelerate_config(plan: Plan, run: RunDir, train: TrainOptions, *,
                      main_process_ip: str | None = None) -> dict[str, Any]:
    """accelerate's ClusterConfig keys only (it rejects unknown keys); num_processes is the total over nodes."""
    s = plan.setup
    hw = s.hardware
    dtype = distributed_type(plan)
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": dtype,
        "enable_cpu_affinity": False,
        "machine_rank": 0,
        "main_process_port": main_process_port(run),
        "main_training_function": "main",
        "num_machines": hw.nodes,
        "num_processes": s.world_size,
        "rdzv_backend": "static",
        "same_network": True,
        # never true, even for CPU runs: use_cpu makes accelerate launch a single process (cpu notes §1)
        "use_cpu": False,
    }
    if main_process_ip:
        cfg["main_process_ip"] = main_process_ip
    if dtype == "DEEPSPEED":
        # With a config file, precision/accumulation/clipping/offload live in the JSON only: accelerate raises if
        # mixed_precision or any of its inline zero keys appear next to deepspeed_config_file.
        ds: dict[str, Any] = {"deepspeed_config_file": str(run.ds_config), "zero3_init_flag": _zero3_init(plan, train)}
        if hw.nodes > 1:
            ds["deepspeed_multinode_launcher"] = "standard"   # torchrun on each node; no pdsh/ssh between nodes
        cfg["deepspeed_config"] = ds
    else:
        cfg["mixed_precision"] = mixed_precision(s.precision, s.master_weights)
    if dtype == "FSDP":
        cfg["fsdp_config"] = _fsdp_config(plan, train)
    return cfg


def _fsdp_config(plan: Plan, train: TrainOptions) -> dict[str, Any]:
    """FSDP2, fully sharded like ZeRO-3 (what the memory model assumes for "fsdp").

    Activation checkpointing stays with the trainer (transformers' gradient_checkpointing_enable), so the plan's
    grad_ckpt means the same thing under every strategy. Offload in FSDP moves parameters, gradients and
    optimizer states together, so any offload choice turns it on.
    """
    s = plan.setup
    return {
        "fsdp_version": 2,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",   # wraps the model's _no_split_modules (decoder blocks)
        "fsdp_reshard_after_forward": True,
        "fsdp_offload_params": s.offload != "none",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": train.model_source != "random-init",
        "fsdp_activation_checkpointing": False,
    }


def render_accelerate_yaml(cfg: dict[str, Any], plan: Plan) -> str:
    s = plan.setup
    head = (f"# accelerate config for scaletrain plan {plan.name!r}: {s.hardware.describe()}, {s.strategy}, "
            f"{s.precision}\n# written by scaletrain; accelerate launch --config_file THIS_FILE ...\n")
    if s.hardware.nodes > 1:
        head += (f"# {s.hardware.nodes} machines × {s.hardware.gpus_per_node} processes; the same file on every node: "
                 "node R adds --machine_rank R (machine_rank below is the head node's)\n")
    return head + yaml.safe_dump(cfg, sort_keys=True)


# ---- DeepSpeed -------------------------------------------------------------------------------------------------
def _overlap_comm(plan: Plan) -> bool:
    """overlap_comm hides reduce/gather behind compute at the price of 4.5× the bucket buffers.

    Off on CPU (gloo runs on the same cores, nothing to overlap) and for one process; on GPUs only where the
    plan's spare memory below the headroom line holds those buffers, so the memory prediction stays true.
    """
    s = plan.setup
    if s.device == "cpu" or s.world_size == 1:
        return False
    elem_bytes = s.precision.compute_bytes
    gather = DS_PREFETCH_BUCKET_ELEMS if s.strategy == "zero3" else DS_ALLGATHER_BUCKET_ELEMS
    extra = int(OVERLAP_COMM_BUCKET_FACTOR * (DS_REDUCE_BUCKET_ELEMS + gather) * elem_bytes)
    return plan.memory.usable_bytes - plan.memory.total_bytes >= extra


def deepspeed_config(plan: Plan, train: TrainOptions) -> dict[str, Any] | None:
    """ds_config.json for ZeRO strategies (None otherwise). Concrete values only: no HF-Trainer "auto"."""
    s = plan.setup
    stage = s.strategy.zero_stage
    if stage is None:
        return None
    pin = s.device == "cuda"        # pinned host buffers speed up offload copies; meaningless without CUDA
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": _overlap_comm(plan),
        "contiguous_gradients": True,      # copy grads into one buffer as they arrive: less fragmentation
        "reduce_bucket_size": DS_REDUCE_BUCKET_ELEMS,
    }
    if stage < 3:
        zero.update(allgather_partitions=True, allgather_bucket_size=DS_ALLGATHER_BUCKET_ELEMS, reduce_scatter=True)
    else:
        zero.update(
            stage3_prefetch_bucket_size=DS_PREFETCH_BUCKET_ELEMS,
            stage3_param_persistence_threshold=DS_PERSISTENCE_PER_HIDDEN * s.model.hidden_size,
            stage3_max_live_parameters=DS_STAGE3_MAX_LIVE_PARAMS,
            stage3_max_reuse_distance=DS_STAGE3_MAX_REUSE_DISTANCE,
            sub_group_size=DS_SUB_GROUP_ELEMS,
            # checkpoints hold a usable 16-bit model, not only the sharded states
            stage3_gather_16bit_weights_on_model_save=True,
        )
    if s.offload.moves_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if s.offload.moves_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    fp16: dict[str, Any] = {"enabled": s.precision == "fp16"}
    if s.precision == "fp16":
        fp16.update(loss_scale=0, initial_scale_power=FP16_INITIAL_SCALE_POWER,
                    loss_scale_window=FP16_LOSS_SCALE_WINDOW, hysteresis=FP16_HYSTERESIS,
                    min_loss_scale=FP16_MIN_LOSS_SCALE)
    ds: dict[str, Any] = {
        "train_batch_size": s.effective_batch,
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": s.grad_accum,
        "gradient_clipping": train.max_grad_norm,
        "bf16": {"enabled": s.precision == "bf16"},
        "fp16": fp16,
        "zero_optimization": zero,
        "steps_per_print": DS_STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
    }
    if s.offload != "none":
        # the trainer may hand DeepSpeed a torch optimizer; with offload DeepSpeed would otherwise insist on its
        # own DeepSpeedCPUAdam (a JIT-built op)
        ds["zero_force_ds_cpu_optimizer"] = False
    if s.optimizer == "adamw-8bit":
        ds["zero_allow_untested_optimizer"] = True    # bitsandbytes AdamW8bit is not on DeepSpeed's tested list
    return ds

"""Plan → files: accelerate YAML, DeepSpeed JSON, launch.sh, sbatch.sh and plan.json in a run directory.

Every number written here is read from the Plan (micro batch, accumulation, world size, precision, ZeRO stage,
offload) or from a named constant below / in memory.py (bucket sizes the memory model assumes). No torch,
accelerate or DeepSpeed import: writing a run directory is as fast as `scaletrain plan`; the tests check the
files with accelerate's and DeepSpeed's own parsers.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import tempfile
import zlib
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.model.memory import (DS_ALLGATHER_BUCKET_ELEMS, DS_PREFETCH_BUCKET_ELEMS, DS_REDUCE_BUCKET_ELEMS,
                     DS_SUB_GROUP_ELEMS)
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.plan.request import PlanRequest
from scaletrain.engine.run.layout import (LINE_PREFIX, LINE_PREFIX_ENV, NODE_STATUS_PREFIX, RunDir, TrainOptions, atomic_write,
                     check_host, default_run_dir, launch_argv)
from scaletrain.engine.units import fmt_seconds

# ---- constants ---------------------------------------------------------------------------------------------------
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
SUPERSEDED_PREFIX = "superseded-"
# Names the run-directory layout owns (rundir.py, plus the trainer's TensorBoard folder); --overwrite moves exactly
# these aside, nothing else.
LAYOUT_NAMES = ("plan.json", "accelerate_config.yaml", "ds_config.json", "launch.sh", "sbatch.sh", "logs",
                "metrics.jsonl", "checkpoints", "status.json", "tensorboard")


# ---- plan.json -------------------------------------------------------------------------------------------------
def plan_document(plan: Plan, request: PlanRequest, train: TrainOptions) -> dict[str, Any]:
    """plan.json: the plan exactly as `plan --json` prints it, plus the request and the trainer's options."""
    doc = plan.to_json()
    doc["request"] = request.to_json()
    doc["train"] = train.to_json()
    return doc


# ---- accelerate ------------------------------------------------------------------------------------------------
def main_process_port(run: RunDir) -> int:
    return MAIN_PROCESS_PORT_BASE + zlib.crc32(str(run.path).encode()) % MAIN_PROCESS_PORT_SPAN


def distributed_type(plan: Plan) -> str:
    s = plan.setup
    if s.strategy.uses_deepspeed:
        return "DEEPSPEED"
    if s.strategy == "fsdp":
        return "FSDP"
    # DDP. On CPU too: accelerate's MULTI_GPU launcher (torchrun) starts N ranks and the trainer's
    # Accelerator(cpu=True) turns the state into MULTI_CPU over gloo (shared/reference/cpu-distributed-notes.md §2).
    return "MULTI_GPU" if s.world_size > 1 else "NO"


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
        cfg["mixed_precision"] = ACCELERATE_MIXED_PRECISION[s.precision]
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


# ---- scripts ---------------------------------------------------------------------------------------------------
_RANK_TOKEN = "__SCALETRAIN_MACHINE_RANK__"
_IP_TOKEN = "__SCALETRAIN_MAIN_PROCESS_IP__"
# SLURM --time: the plan's predicted run time × this margin, plus start-up. The time model is a planning estimate
# (uncalibrated until `scaletrain validate --save` has measured these cards), and SLURM kills a job at its limit,
# losing everything since the last checkpoint: overestimating costs queue priority, underestimating costs the run.
SBATCH_TIME_MARGIN = 1.5
# Start-up the step time does not cover: rendezvous, loading the model from a shared filesystem, the final save.
SBATCH_STARTUP_SECONDS = 15 * 60
# --cpus-per-task: cores per training process for its Python loop, NCCL's proxy thread and data loading (the
# bundled trainer tokenizes up front and loads no worker processes). Override with `sbatch --cpus-per-task=N`.
SBATCH_CPUS_PER_PROCESS = 4
SECONDS_PER_MINUTE = 60
MINUTES_PER_DAY = 24 * 60


def _shell_words(argv: list[str], subst: dict[str, str]) -> str:
    return " ".join(subst.get(a, shlex.quote(a)) for a in argv)


def _node_argv(run: RunDir, doc: dict[str, Any], python: str | None) -> list[str]:
    """launch_argv with placeholders for the machine rank and the head-node address (filled in per node)."""
    argv = launch_argv(run, doc, machine_rank=0, main_process_ip=_IP_TOKEN, python=python)
    argv[argv.index("--machine_rank") + 1] = _RANK_TOKEN
    return argv


def launch_script(plan: Plan, run: RunDir, doc: dict[str, Any], *, main_process_ip: str | None = None,
                  python: str | None = None) -> str:
    """launch.sh: the argument list the launcher runs, runnable by hand (multi-node: one call per node)."""
    s = plan.setup
    hw = s.hardware
    lines = ["#!/usr/bin/env bash",
             f"# scaletrain run {plan.name!r}: {s.model.name} on {hw.describe()} ({s.strategy}, {s.precision}).",
             "# The same argument list `scaletrain launch RUN_DIR` runs."]
    if hw.nodes <= 1:
        argv = launch_argv(run, doc, python=python)
        lines += ["set -euo pipefail", "exec " + _shell_words(argv, {})]
        return "\n".join(lines) + "\n"
    last = hw.nodes - 1
    ip = main_process_ip or ""
    usage = "bash launch.sh MACHINE_RANK [MAIN_PROCESS_IP]"
    lines += [
        f"# Multi-node, {hw.nodes} nodes × {hw.gpus_per_node} processes: the same files on every node, each",
        f"# started with its machine rank (0 on the head node, up to {last}) and the head node's address:",
        f"#   {usage}",
        "# The rank may instead come from $MACHINE_RANK, or $SLURM_NODEID inside an srun task; the address from",
        "# $MAIN_PROCESS_IP" + (f" (default {ip}, given at plan time)." if ip else "."),
        "# `scaletrain launch RUN_DIR --machine-rank R [--main-process-ip HEAD]` does the same with per-rank logs.",
        "set -euo pipefail",
        'MACHINE_RANK="${1:-${MACHINE_RANK:-${SLURM_NODEID:-}}}"',
        f'MAIN_PROCESS_IP="${{2:-${{MAIN_PROCESS_IP:-{ip}}}}}"',          # ip: check_host's characters only
        'case "$MACHINE_RANK" in',
        f"  ''|*[!0-9]*) echo \"launch.sh: which node is this? give its MACHINE_RANK (0 on the head node, up to "
        f"{last}): {usage}\" >&2; exit 2 ;;",
        "esac",
        f'if [ "$MACHINE_RANK" -gt {last} ]; then',
        f'  echo "launch.sh: MACHINE_RANK $MACHINE_RANK is outside this plan\'s {hw.nodes} nodes (0 to {last})" >&2',
        "  exit 2",
        "fi",
        'if [ -z "$MAIN_PROCESS_IP" ]; then',
        f'  echo "launch.sh: give the head node\'s address: {usage} (or set MAIN_PROCESS_IP)" >&2; exit 2',
        "fi",
        f"export {LINE_PREFIX_ENV}={shlex.quote(LINE_PREFIX)}",
        "exec " + _shell_words(_node_argv(run, doc, python),
                               {_RANK_TOKEN: '"$MACHINE_RANK"', _IP_TOKEN: '"$MAIN_PROCESS_IP"'}),
    ]
    return "\n".join(lines) + "\n"


def node_launch_commands(plan: Plan, run: RunDir, *, main_process_ip: str | None = None) -> list[str]:
    """`scaletrain launch` for each node of a multi-node plan, head node first (empty for one node)."""
    nodes = plan.setup.hardware.nodes
    if nodes <= 1:
        return []
    ip = [] if main_process_ip else ["--main-process-ip", "HEAD_ADDRESS"]
    return [shlex.join(["scaletrain", "launch", str(run.path), "--machine-rank", str(r), *ip]) for r in range(nodes)]


def predicted_run_seconds(plan: Plan, train: TrainOptions) -> float | None:
    """What the trainer will run: max_steps × the step time when set, else the plan's epochs (needs a dataset
    size); None when the plan cannot say."""
    t = plan.time
    if t is None:
        return None
    if train.max_steps is not None:
        return train.max_steps * t.step_seconds
    return t.total_seconds


def slurm_time(seconds: float) -> str:
    """SLURM's --time, whole minutes rounded up: HH:MM:SS, or D-HH:MM:SS from a day on."""
    minutes = max(1, math.ceil(seconds / SECONDS_PER_MINUTE))
    days, rest = divmod(minutes, MINUTES_PER_DAY)
    hhmmss = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{hhmmss}" if days else hhmmss


def _sbatch_path(path: Path, pattern: str) -> str:
    """A path with a SLURM filename pattern (%j, %n) appended; a literal % in the path is doubled."""
    return str(path).replace("%", "%%") + "/" + pattern


def _sbatch_arg(text: str) -> str:
    """An #SBATCH value: bare when safe, else in double quotes (sbatch's own directive parser reads those)."""
    return text if re.fullmatch(r"[A-Za-z0-9._/%:=+-]+", text) else '"' + text.replace('"', "") + '"'


def sbatch_script(plan: Plan, run: RunDir, doc: dict[str, Any], *, python: str | None = None) -> str | None:
    """sbatch.sh for multi-node plans: one srun task per node starting that node's `accelerate launch`.

    Head node from the job's node list, c10d rendezvous on the plan's port, the machine rank from each task's
    $SLURM_NODEID (single-quoted `bash -c`, so it expands on the node: shared/reference/tui-launch-monitor.md §4),
    one log per node, --time from the plan's predicted time. None for single-node plans.
    """
    s = plan.setup
    hw = s.hardware
    if hw.nodes <= 1:
        return None
    train = TrainOptions.from_json(doc.get("train"))
    port = main_process_port(run)
    argv = _node_argv(run, doc, python)
    at = argv.index(_IP_TOKEN) + 1
    argv[at:at] = ["--main_process_port", str(port), "--rdzv_backend", "c10d"]
    inner = "exec " + _shell_words(argv, {_RANK_TOKEN: '"$SLURM_NODEID"', _IP_TOKEN: '"$HEAD_NODE"'})
    cpus = SBATCH_CPUS_PER_PROCESS * hw.gpus_per_node
    predicted = predicted_run_seconds(plan, train)
    head = [
        "#!/bin/bash",
        f"# scaletrain plan {plan.name!r}: {s.model.name} on {hw.describe()} ({s.strategy}, {s.precision}), "
        f"{s.world_size} processes.",
        f"# Submit from a login node: sbatch {shlex.quote(str(run.sbatch_sh))}",
        "# Partition and account: sbatch reads them from the environment, so this file needs no edit:",
        f"#   SBATCH_PARTITION=gpu SBATCH_ACCOUNT=myproject sbatch {shlex.quote(str(run.sbatch_sh))}",
        "# (or sbatch -p gpu -A myproject ...), or delete one '#' from the ##SBATCH lines below. Options given to",
        "# sbatch override the #SBATCH lines here (e.g. sbatch --time=2-00:00:00 or --cpus-per-task=N).",
        f"#SBATCH --job-name={re.sub(r'[^A-Za-z0-9._-]', '-', plan.name) or 'scaletrain'}",
        f"#SBATCH --nodes={hw.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if hw.gpu.key != "CPU":
        head.append(f"#SBATCH --gres=gpu:{hw.gpus_per_node}")
    head.append(f"#SBATCH --cpus-per-task={cpus}")
    if predicted is not None:
        head.append(f"#SBATCH --time={slurm_time(predicted * SBATCH_TIME_MARGIN + SBATCH_STARTUP_SECONDS)}")
    head += [f"#SBATCH --output={_sbatch_arg(_sbatch_path(run.logs, 'slurm-%j.out'))}",
             "##SBATCH --partition=YOUR_PARTITION",
             "##SBATCH --account=YOUR_ACCOUNT",
             "#"]
    steps = train.max_steps if train.max_steps is not None else (plan.time.total_steps if plan.time else None)
    if predicted is not None:
        head.append(f"# --time: {steps:,} steps × {fmt_seconds(plan.time.step_seconds)} predicted = "
                    f"{fmt_seconds(predicted)}, × {SBATCH_TIME_MARGIN:g} margin + "
                    f"{fmt_seconds(SBATCH_STARTUP_SECONDS)} start-up, rounded up to the minute.")
    else:
        head.append("# --time: the plan has no run-time estimate (give --dataset-size, or train.max_steps): set "
                    "it with sbatch --time=..., else the partition's default limit applies.")
    head += [f"# --cpus-per-task: {SBATCH_CPUS_PER_PROCESS} cores × {hw.gpus_per_node} processes per node.",
             f"# Every node runs {shlex.quote(argv[0])}: the same environment must exist there (a shared filesystem)."]
    body = [
        "set -euo pipefail",
        ': "${SLURM_JOB_NODELIST:?submit this script with sbatch}"',
        'HEAD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "export HEAD_NODE",
        f"export {LINE_PREFIX_ENV}={shlex.quote(LINE_PREFIX)}      # every line carries its global rank",
        "export PYTHONUNBUFFERED=1",
        f'echo "scaletrain: {hw.nodes} nodes, head node $HEAD_NODE, c10d rendezvous on port {port}; '
        f'logs in {shlex.quote(str(run.logs))}/node-<N>.log"',
        "# One task per node, so $SLURM_NODEID (here equal to $SLURM_PROCID) is the machine rank. The single quotes",
        "# leave $SLURM_NODEID and $HEAD_NODE to each node's own shell.",
        f"srun --nodes={hw.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 "
        f"--output={shlex.quote(_sbatch_path(run.logs, 'node-%n.log'))} bash -c {shlex.quote(inner)}",
    ]
    return "\n".join(head + body) + "\n"


# ---- the run directory -----------------------------------------------------------------------------------------
def checked_train(train: TrainOptions) -> TrainOptions:
    """A given dataset must exist; it is recorded as an absolute path (the trainer runs from anywhere)."""
    from dataclasses import replace

    if train.dataset is None:
        return train
    p = Path(train.dataset).expanduser()
    if not p.is_file():
        raise ScaletrainError(f"dataset {train.dataset} does not exist; give a JSONL file (text, prompt/response or "
                              "messages per line), or leave it unset for the bundled demo data")
    return replace(train, dataset=str(p.resolve()))


def render_run_files(plan: Plan, request: PlanRequest, train: TrainOptions, run: RunDir, *,
                     main_process_ip: str | None = None) -> dict[str, tuple[str, int | None]]:
    """File name → (text, mode) for everything the run directory holds before launch."""
    if main_process_ip is not None:
        main_process_ip = check_host(main_process_ip)
    doc = plan_document(plan, request, train)
    files: dict[str, tuple[str, int | None]] = {
        run.plan.name: (json.dumps(doc, indent=2) + "\n", None),
        run.accelerate_config.name: (render_accelerate_yaml(
            accelerate_config(plan, run, train, main_process_ip=main_process_ip), plan), None),
        run.launch_sh.name: (launch_script(plan, run, doc, main_process_ip=main_process_ip), 0o755),
    }
    ds = deepspeed_config(plan, train)
    if ds is not None:
        files[run.ds_config.name] = (json.dumps(ds, indent=2) + "\n", None)
    sb = sbatch_script(plan, run, doc)
    if sb is not None:
        files[run.sbatch_sh.name] = (sb, 0o755)
    return files


def _existing_plan(run: RunDir) -> dict[str, Any] | None:
    try:
        return json.loads(run.plan.read_text())
    except (OSError, ValueError):
        return None


def _supersede(run: RunDir) -> Path | None:
    """Move the previous run's layout files into superseded-<stamp>/ (kept, never deleted)."""
    present = [run.path / n for n in LAYOUT_NAMES if (run.path / n).exists()]
    present += sorted(run.path.glob(f"{NODE_STATUS_PREFIX}*.json"))          # other nodes' launcher status
    if not present:
        return None
    dest = run.path / f"{SUPERSEDED_PREFIX}{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while dest.exists():
        dest = dest.with_name(f"{dest.name}-{n}")
        n += 1
    dest.mkdir()
    for p in present:
        shutil.move(str(p), str(dest / p.name))
    return dest


def write_run_dir(plan: Plan, request: PlanRequest, train: TrainOptions, run_dir: str | os.PathLike[str] | None = None,
                  *, overwrite: bool = False, main_process_ip: str | None = None) -> RunDir:
    """Write plan.json, the configs and the scripts; refuse a directory holding a different plan.

    A new directory appears whole (written beside it, then renamed); an existing one that holds the same plan is
    rewritten file by file (atomic, with .bak of anything that differs); with overwrite, a different previous run
    is moved to superseded-<stamp>/ first.
    """
    train = checked_train(train)
    run = RunDir(run_dir if run_dir is not None else default_run_dir(plan.name))
    files = render_run_files(plan, request, train, run, main_process_ip=main_process_ip)
    if run.path.exists() and not run.path.is_dir():
        raise ScaletrainError(f"run directory {run.path} exists and is not a directory; choose another --run-dir")
    if not run.path.exists() or not any(run.path.iterdir()):
        _write_fresh(run, files)
        return run
    old = _existing_plan(run)
    new = json.loads(files[run.plan.name][0])
    if old != new:
        if not overwrite:
            what = "a different plan" if old is not None else "files that are not a scaletrain plan"
            raise ScaletrainError(f"{run.path} already holds {what}; choose another --run-dir, or pass --overwrite "
                                  f"(the previous files are moved to {SUPERSEDED_PREFIX}<date>/ inside it)")
        _supersede(run)
    for name, (text, mode) in files.items():
        atomic_write(run.path / name, text, mode=mode)
    run.logs.mkdir(exist_ok=True)
    run.checkpoints.mkdir(exist_ok=True)
    return run


def _write_fresh(run: RunDir, files: dict[str, tuple[str, int | None]]) -> None:
    run.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=run.path.parent, prefix=f".{run.path.name}.", suffix=".tmp"))
    try:
        for name, (text, mode) in files.items():
            (tmp / name).write_text(text)
            if mode is not None:
                os.chmod(tmp / name, mode)
        (tmp / run.logs.name).mkdir()
        (tmp / run.checkpoints.name).mkdir()
        os.chmod(tmp, 0o777 & ~_umask())    # mkdtemp makes it 0o700; a run directory is an ordinary one
        os.replace(tmp, run.path)       # replaces an empty directory too
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- accelerate's default config ---------------------------------------------------------------------------------
def accelerate_default_config_path() -> Path:
    """Where `accelerate launch` looks without --config_file, computed as accelerate does
    (accelerate/commands/config/config_args.py: $HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface),
    but at call time, not at import time."""
    hf_home = os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    return Path(os.path.expanduser(hf_home)) / "accelerate" / "default_config.yaml"


def install_accelerate_default(run: RunDir, dest: Path | None = None) -> tuple[Path, Path | None]:
    """Copy the run's accelerate YAML to accelerate's default location; an existing different file is backed up
    first (returned). Nothing is written when the default already holds the same text."""
    if not run.accelerate_config.is_file():
        raise ScaletrainError(f"{run.path} has no accelerate_config.yaml; write the run directory first")
    target = dest or accelerate_default_config_path()
    backup = atomic_write(target, run.accelerate_config.read_text(), backup=True)
    return target, backup


def written_files(run: RunDir) -> list[Path]:
    """The files of the layout that exist now, in layout order (for summaries)."""
    return [run.path / n for n in LAYOUT_NAMES if (run.path / n).exists()]

"""Who this process is and what it shares with the others: rank and world size (torch.distributed first: under
DeepSpeed on a CPU host accelerate reports one process on every rank), the Accelerator for the plan's strategy,
and the collectives the loop uses (barrier, sums, one step's metrics over every rank)."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.metrics import RankMemory
from scaletrain.engine.run.rank_telemetry import RankTelemetry
from scaletrain.trainer.telemetry import host_names
from scaletrain.trainer.config import RunConfig


def rank_and_world(accelerator: Any) -> tuple[int, int]:
    """torch.distributed when initialised, else the launcher's RANK/WORLD_SIZE, else accelerate's view."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return accelerator.process_index, accelerator.num_processes


def _dist_ready() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    if _dist_ready():
        import torch.distributed as dist
        dist.barrier()


def shutdown() -> None:
    """The last collective: every rank is done before any leaves. The process then ends with os._exit
    (train.py): tearing the objects down could deadlock a gloo rank, its main thread holding the GIL while
    ~ProcessGroupGloo joins a worker thread that needs the GIL to free the last all-reduce's tensors (seen with
    gdb on 2 CPU ranks, torch 2.13: Reducer::~Reducer → ~ProcessGroupGloo → thread::join, the worker in
    ~AsyncAllreduceWork → decref_pyobject → take_gil)."""
    barrier()


# A baton older than this is a dead process's: a live build of DeepSpeed's CPU op (one C++ file) or torch's no-op
# check before loading it takes well under a minute on a 2-core machine.
STALE_BATON_S = 120.0


def load_deepspeed_cpu_comm_op() -> None:
    """DeepSpeed on a CPU builds (or loads) its shared-memory collective op in every rank (deepspeed/comm/torch.py
    build_shm_op, through torch.utils.cpp_extension.load), serialised by torch's FileBaton: a `lock` file made with
    O_EXCL and removed when the holder is done. A rank killed while holding it (Ctrl-C or SIGKILL in a run's first
    seconds) leaves the file, and every later DeepSpeed run on the machine waits on it for ever (seen: a test run
    hung at FileBaton.wait). Here each rank takes an flock first, which the kernel releases when its holder dies;
    under it a baton is another scaletrain rank's only if it is dead, but a process outside scaletrain sharing the
    extensions folder may hold one live: `clear_stale_baton` waits for it, and removes it only once it is older
    than any live build. The op is then built or loaded, and DeepSpeed gets that module instead of taking the
    baton again.

    The build runs the `ninja` first on PATH: this Python's own (its venv's) is put first, as its activate would,
    so every loader (`make ds-op`, a rank under `scaletrain launch` or launch.sh) builds with one ninja. With the
    system's ninja (1.11 here) in one and the venv's (1.13) in another, each rebuilt what the other had built:
    about a minute of g++ each time they alternated."""
    import fcntl
    import importlib
    from pathlib import Path

    tools = os.path.dirname(sys.executable)
    if tools and os.environ.get("PATH", "").split(os.pathsep)[0] != tools:
        os.environ["PATH"] = os.pathsep.join(p for p in (tools, os.environ.get("PATH")) if p)

    from deepspeed.accelerator import get_accelerator
    from torch.utils.cpp_extension import _get_build_directory

    ds_torch = importlib.import_module("deepspeed.comm.torch")   # (the package's `torch` attribute is torch itself)
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None:
        return
    build_dir = Path(_get_build_directory(builder.name, verbose=False))
    with open(build_dir / "scaletrain.flock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        clear_stale_baton(build_dir / "lock")
        module = ds_torch.build_shm_op()
    ds_torch.build_shm_op = lambda: module


def clear_stale_baton(baton: Any, stale_after_s: float = STALE_BATON_S, poll_s: float = 0.5) -> bool:
    """Wait while torch's FileBaton `baton` (a Path) is younger than `stale_after_s` (a live holder removes it when
    done); remove it once it is older: a dead process's. True when this removed it."""
    import time

    said = False
    while True:
        try:
            age_s = time.time() - baton.stat().st_mtime
        except FileNotFoundError:
            return False
        if age_s >= stale_after_s:
            baton.unlink(missing_ok=True)
            print(f"scaletrain: removed {baton}, left {age_s:.0f} s ago by a process killed while building "
                  "DeepSpeed's CPU op", file=sys.stderr, flush=True)
            return True
        if not said:
            print(f"scaletrain: waiting for {baton} (taken {age_s:.0f} s ago; a build holds it, or a killed one "
                  f"left it: removed at {stale_after_s:.0f} s)", file=sys.stderr, flush=True)
            said = True
        time.sleep(poll_s)


def make_accelerator(cfg: RunConfig) -> Any:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    if cfg.precision == "fp16" and not torch.cuda.is_available():
        raise ScaletrainError("precision fp16 needs a CUDA GPU; on CPU use --precision bf16 or fp32")
    if cfg.uses_deepspeed:
        acc = Accelerator(gradient_accumulation_steps=cfg.grad_accum)
        if acc.distributed_type == DistributedType.DEEPSPEED:       # else check_distribution refuses the run
            _check_ds_config(acc, cfg)
        return acc
    # DDP's default keeps a second, flat copy of every gradient in its all-reduce buckets; bucket views make the
    # gradients live inside the buckets instead (torch DDP docs: saves "the total gradients size"). The memory
    # model counts the buckets as persistent gradients (engine/estimate/memory.py).
    # broadcast_buffers off: DDP's default broadcasts rank 0's buffers before every forward (a collective per
    # micro-step, which the host pays on small models: bench/host_overhead.py); the buffers of the models trained
    # here (rotary inv_freq, position tables) are constants every rank computes identically from the config, as HF
    # Trainer's ddp_broadcast_buffers also assumes under gradient checkpointing.
    # The plan's mixed precision, also when accelerate_config.yaml was edited: autocast over fp32 weights, or none
    # for fp32 and for bf16-only weights (master_weights bf16: the model is bf16 and AdamW runs on it).
    from accelerate.utils import DistributedDataParallelKwargs

    from scaletrain.engine.run.configs import mixed_precision

    if cfg.strategy == "fsdp":
        # the trainer shards with fully_shard itself (trainer/fsdp.py): accelerate's own FSDP plugin, which
        # `accelerate launch` turns on from the YAML's distributed_type FSDP, must not wrap the model a second time
        os.environ.pop("ACCELERATE_USE_FSDP", None)

    return Accelerator(cpu=not torch.cuda.is_available(), gradient_accumulation_steps=cfg.grad_accum,
                       mixed_precision=mixed_precision(cfg.precision, cfg.master_weights),
                       kwargs_handlers=[DistributedDataParallelKwargs(gradient_as_bucket_view=True,
                                                                        broadcast_buffers=False)])


def freeze_without_gradient(model: Any, cfg: RunConfig, world: int) -> None:
    """DDP's reducer waits for every trainable parameter's gradient, and the next step fails without it ("Expected
    to have finished reduction in the prior iteration"). The ones a step on text gives none (the plan's
    `without_gradient`, measured by the trace: reformer's unused lm_head bias, a multimodal model's towers) are
    frozen first: no gradient, no update either way. find_unused_parameters instead fails reformer's reversible
    layers, whose gradients its own backward makes ("marked as ready twice")."""
    if cfg.strategy != "ddp" or world < 2 or not cfg.without_gradient:
        return
    names = set(cfg.without_gradient)
    for name, p in model.named_parameters():
        if name in names:
            p.requires_grad_(False)


def check_distribution(cfg: RunConfig, acc: Any, model: Any, world: int) -> str:
    """What this rank got (accelerate's distributed type and the model's wrapper) against the plan's strategy: a
    run that would silently be another strategy (accelerate dropping FSDP or DeepSpeed on a CPU host, an edited
    accelerate_config.yaml, a plain `python -m` start) is refused in one line before the first step. Returns what
    it got, for the log."""
    from accelerate.utils import DistributedType as DT

    dtype, kind = acc.distributed_type, type(model).__name__
    got = f"{dtype.value} with the model in {kind}"
    if cfg.uses_deepspeed:
        stage = model.zero_optimization_stage() if hasattr(model, "zero_optimization_stage") else None
        ok = dtype == DT.DEEPSPEED and stage == cfg.strategy.zero_stage
        got += f" (ZeRO stage {stage})" if stage is not None else ""
    elif cfg.strategy == "fsdp":
        from torch.distributed.tensor import DTensor

        from scaletrain.trainer.fsdp import describe, is_fsdp, mixed_precision_policy

        floating = [p for p in model.parameters() if p.is_floating_point()]
        ok = (is_fsdp(model) and dtype not in (DT.FSDP, DT.DEEPSPEED)
              and bool(floating) and all(isinstance(p, DTensor) for p in floating))
        mp = mixed_precision_policy(cfg)
        cast = (f"; computes in {str(mp.param_dtype).removeprefix('torch.')}, reduces gradients in "
                f"{str(mp.reduce_dtype).removeprefix('torch.')}" if mp.param_dtype is not None else "")
        got = f"{dtype.value}, {describe(model) + cast if is_fsdp(model) else f'the model in {kind} (not sharded)'}"
    else:
        from torch.nn.parallel import DistributedDataParallel

        ok = (isinstance(model, DistributedDataParallel) and dtype in (DT.MULTI_CPU, DT.MULTI_GPU) if world > 1
              else dtype == DT.NO and not hasattr(model, "zero_optimization_stage"))
    if not ok:
        raise ScaletrainError(f"the plan's strategy is {cfg.strategy} on {world} process(es), but this run got "
                              f"{got}; nothing was trained. Launch the run directory with `scaletrain launch` (or "
                              "its launch.sh) and the accelerate_config.yaml scaletrain wrote for it")
    return f"strategy {cfg.strategy}: {got}"


def _check_ds_config(acc: Any, cfg: RunConfig) -> None:
    """Fill 'auto' batch values with the plan's numbers (accelerate would use its own process count) and refuse
    sections that would fight the trainer."""
    ds = acc.state.deepspeed_plugin.deepspeed_config
    for key in ("optimizer", "scheduler"):
        if key in ds:
            raise ScaletrainError(f"ds_config.json has an {key!r} section; the bundled trainer builds the optimizer "
                                  "and LR schedule from the plan, so remove it (or use --script for your own)")
    _, world = rank_and_world(acc)
    wanted = {"train_micro_batch_size_per_gpu": cfg.micro_batch, "gradient_accumulation_steps": cfg.grad_accum,
              "train_batch_size": cfg.micro_batch * cfg.grad_accum * world}
    for key, value in wanted.items():
        have = ds.get(key, "auto")
        if have == "auto":
            ds[key] = value
        elif int(have) != value:
            raise ScaletrainError(f"ds_config.json {key} is {have} but the plan with {world} processes needs "
                                  f"{value}; rewrite the run directory or set it to \"auto\"")
    if ds.get("gradient_clipping", "auto") == "auto":
        ds["gradient_clipping"] = cfg.train.max_grad_norm


@dataclass(frozen=True)
class StepStats:
    """One optimizer step's numbers over every rank: sums of what each rank counted, rank 0's grad norm, and every
    rank's memory peaks."""
    sums: tuple[float, ...]
    grad_norm: float | None
    peaks: tuple[RankMemory, ...]


def step_stats(acc: Any, world: int, counted: list[Any], grad_norm: Any,
               telemetry: RankTelemetry | None = None) -> StepStats:
    """The step's metrics in one collective and one device→host copy: `counted` (tensors kept on the device through
    the micro-steps, or numbers) summed over the ranks, the grad norm (a tensor, a number or None), and each rank's
    peaks (CUDA allocated/reserved where present, host peak RSS always). Every rank calls it. The loop syncs with
    the device here only, once per optimizer step (a float() per micro-step would stall the host on the GPU).
    `telemetry` (this rank's device and step phases, issue 23) rides along as a fixed vector (NaN = N/A): every
    rank's comes back with its peaks, and the host names gathered once (telemetry.host_names)."""
    import resource

    import torch

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux reports kibibytes
    if torch.cuda.is_available():
        mem = [float(torch.cuda.max_memory_allocated()), float(torch.cuda.max_memory_reserved())]
    else:
        mem = [-1.0, -1.0]
    norm = float("nan") if grad_norm is None else grad_norm
    sent = telemetry is not None
    parts = [*counted, norm, *mem, float(rss), *(telemetry.to_vector() if sent else [])]
    # numbers in one tensor, device scalars cast in place: a handful of ops, one copy to the host
    t = torch.tensor([0.0 if torch.is_tensor(p) else float(p) for p in parts], dtype=torch.float64,
                     device=acc.device)
    for i, p in enumerate(parts):
        if torch.is_tensor(p):
            t[i] = p.detach().reshape(())
    if _dist_ready() and world > 1:
        import torch.distributed as dist
        gathered = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(gathered, t)
        rows = torch.stack(gathered).tolist()
    else:
        rows = [t.tolist()]
    n = len(counted)
    sums = tuple(sum(r[i] for r in rows) for i in range(n))
    g = rows[0][n]
    hosts = host_names(world) if sent else [None] * len(rows)
    peaks = tuple(RankMemory(r, int(row[n + 1]) if row[n + 1] >= 0 else None,
                             int(row[n + 2]) if row[n + 2] >= 0 else None, int(row[n + 3]),
                             RankTelemetry.from_vector(row[n + 4:], hosts[r] if r < len(hosts) else None)
                             if sent else None)
                  for r, row in enumerate(rows))
    return StepStats(sums, None if math.isnan(g) else g, peaks)


def all_sum(acc: Any, values: list[float]) -> list[float]:
    import torch

    t = torch.tensor(values, dtype=torch.float64, device=acc.device)
    if _dist_ready():
        import torch.distributed as dist
        dist.all_reduce(t)
    return t.tolist()

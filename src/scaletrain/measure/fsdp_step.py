"""Ground truth for FSDP: one real optimizer step on every rank of a gloo process group, the model wrapped with torch's
`fully_shard` exactly as the trainer wraps it (trainer/fsdp.py `fully_shard_blocks`: every decoder block, then the
root), each rank's allocated peak read from torch.profiler's memory timeline (measure/step.py, the same harness
as the single-process rows).

Each rank builds the same random-init model (one seed) with its checkpointing and LoRA as `build_harness` does, shards
it, builds AdamW over its DTensor shards, runs a warm-up step (optimizer state exists) and profiles one more step on
its own batch. The ranks are started with torch.multiprocessing's spawn (no inherited interpreter state; stdin is not
inherited) and rendezvous through a file in a temporary folder; each writes its MeasuredStep as JSON, read back here.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scaletrain.measure.step import MeasuredStep, build_harness, measure_harness

# seconds the process group waits for a peer before a rank gives up (a rank that died leaves the other waiting)
_GROUP_TIMEOUT_SECONDS = 300
# Profiled steps per rank, the smallest peak kept. Why: gloo's worker threads sometimes drop the last reference to a
# collective's buffer (the work object dies there), and the profiler records allocations and frees on the profiled
# threads only: a free it misses leaves that buffer alive in its record, so a step's reading can only be too high
# (seen: one rank +0.75 MB, the other +5.1 MB on one step of the wide checkpointed llama, the next step exact).
STEP_REPEATS = 2


def measure_fsdp_step(hf_config: dict, *, world: int = 2, method: str = "full", lora_rank: int = 8,
                      lora_alpha: int = 16, lora_targets: tuple[str, ...] | None = None, micro_batch: int = 1,
                      seq_len: int = 128, grad_ckpt: bool = False, attn: str = "sdpa",
                      optimizer_impl: str = "for-loop", grad_accum: int = 1, seed: int = 0,
                      warmup_steps: int = 1) -> list[MeasuredStep]:
    """Every rank's measured step (fp32, AdamW), rank 0 first."""
    kwargs = dict(method=method, lora_rank=lora_rank, lora_alpha=lora_alpha, lora_targets=lora_targets,
                  micro_batch=micro_batch, seq_len=seq_len, grad_ckpt=grad_ckpt, attn=attn,
                  optimizer_impl=optimizer_impl, grad_accum=grad_accum, seed=seed, warmup_steps=warmup_steps)
    return measure_fsdp_steps([(hf_config, kwargs)], world=world)[0]


def measure_fsdp_steps(cases: list[tuple[dict, dict[str, Any]]], world: int = 2) -> list[list[MeasuredStep]]:
    """Several cases (config, measure_rank's keyword arguments) in one process group, one after the other: each
    case's ranks, rank 0 first (the ranks start once: spawning them is most of a small case's time)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="scaletrain-fsdp-measure-") as tmp:
        mp.spawn(_rank_main, args=(world, tmp, cases), nprocs=world, join=True)
        return [[MeasuredStep(**json.loads((Path(tmp) / f"case-{i}-rank-{r}.json").read_text()))
                 for r in range(world)] for i in range(len(cases))]


def _rank_main(rank: int, world: int, tmp: str, cases: list[tuple[dict, dict[str, Any]]]) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=_GROUP_TIMEOUT_SECONDS))
    for i, (hf_config, kwargs) in enumerate(cases):
        measured = measure_rank(hf_config, rank=rank, **kwargs)
        part = Path(tmp) / f"case-{i}-rank-{rank}.json.part"
        part.write_text(json.dumps(asdict(measured)))
        part.replace(part.with_suffix(""))
        dist.barrier()
    # no teardown: a gloo process group's destructor can deadlock on the GIL (trainer/distributed.py shutdown)
    os._exit(0)


def measure_rank(hf_config: dict, *, rank: int, method: str, lora_rank: int, lora_alpha: int,
                 lora_targets: tuple[str, ...] | None, micro_batch: int, seq_len: int, grad_ckpt: bool, attn: str,
                 optimizer_impl: str, grad_accum: int, seed: int, warmup_steps: int) -> MeasuredStep:
    """This rank's step, inside an initialised process group: the harness built, then sharded, then measured."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from scaletrain.trainer.fsdp import fully_shard_blocks

    setup = build_harness(hf_config, method=method, lora_rank=lora_rank, lora_alpha=lora_alpha,
                          lora_targets=lora_targets, grad_ckpt=grad_ckpt, attn=attn, precision="fp32",
                          optimizer="adamw", device="cpu", seed=seed, optimizer_impl=optimizer_impl)
    setup.optimizer = None            # it holds the unsharded parameters: built again over the shards below
    fully_shard_blocks(setup.model, MixedPrecisionPolicy())   # fp32: nothing to cast (trainer/fsdp.py)
    impl = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False},
            "default": {}}[optimizer_impl]
    trainable = [p for p in setup.model.parameters() if p.requires_grad]
    setup.optimizer = torch.optim.AdamW(trainable, lr=1e-4, **impl)
    # each rank its own batch (the data is sharded per rank), the same shapes; STEP_REPEATS steady steps, the lowest
    steps = [measure_harness(setup, micro_batch=micro_batch, seq_len=seq_len, grad_accum=grad_accum,
                             seed=seed + 1000 * rank + k, warmup_steps=warmup_steps if k == 0 else 0)
             for k in range(STEP_REPEATS)]
    return min(steps, key=lambda m: m.peak_allocated_bytes)

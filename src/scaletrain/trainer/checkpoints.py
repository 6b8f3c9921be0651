"""Trainer checkpoints: checkpoints/step-<n>/, written by every rank (DeepSpeed's ZeRO partitions, or accelerate's
state), completed by trainer_state.json written last by rank 0 (layout.RunDir.newest_checkpoint picks those)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import atomic_write
from scaletrain.engine.run.layout import CHECKPOINT_PREFIX, TRAINER_STATE, RunDir, checkpoint_step
from scaletrain.trainer.distributed import barrier

SCHEDULER_STATE = "scheduler.pt"
DS_CHECKPOINT_TAG = "deepspeed"


def save_checkpoint(acc: Any, model: Any, scheduler: Any, run: RunDir, state: dict[str, Any], rank: int,
                    deepspeed: bool) -> Path:
    import torch

    d = run.checkpoints / f"{CHECKPOINT_PREFIX}{state['step']}"
    d.mkdir(parents=True, exist_ok=True)
    if deepspeed:
        model.save_checkpoint(str(d), tag=DS_CHECKPOINT_TAG)    # every rank writes its ZeRO partition
    else:
        acc.save_state(str(d))
    if rank == 0:
        torch.save(scheduler.state_dict(), d / SCHEDULER_STATE)
    barrier()
    if rank == 0:
        atomic_write(d / TRAINER_STATE, json.dumps(state, indent=2) + "\n", backup=False)
    barrier()
    return d


def load_checkpoint(acc: Any, model: Any, scheduler: Any, d: Path, deepspeed: bool) -> dict[str, Any]:
    import torch

    if deepspeed:
        path, _ = model.load_checkpoint(str(d), tag=DS_CHECKPOINT_TAG)
        if path is None:
            raise ScaletrainError(f"{d} has no DeepSpeed checkpoint; it was written by another strategy")
    else:
        if not any(d.glob("model*")):
            raise ScaletrainError(f"{d} holds no accelerate checkpoint; it was written by another strategy")
        acc.load_state(str(d))
    scheduler.load_state_dict(torch.load(d / SCHEDULER_STATE, weights_only=False))
    return json.loads((d / TRAINER_STATE).read_text())


def prune_checkpoints(run: RunDir, keep: int | None, rank: int) -> list[Path]:
    """Keep the newest `keep` complete checkpoints (None: all); older step-<n>/ folders, complete or not, go.
    Each node's local rank 0 prunes (a node without a shared filesystem holds its own ranks' partitions)."""
    if keep is None or int(os.environ.get("LOCAL_RANK", rank)) != 0:
        return []
    complete = sorted((n, d) for d in run.checkpoints.iterdir()
                      if (n := checkpoint_step(d)) is not None and (d / TRAINER_STATE).is_file())
    if len(complete) <= keep:
        return []
    oldest_kept = complete[-keep][0]
    gone = [d for d in run.checkpoints.iterdir() if (n := checkpoint_step(d)) is not None and n < oldest_kept]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone

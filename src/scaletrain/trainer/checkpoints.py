"""Trainer checkpoints: checkpoints/step-<n>/, written by every rank (DeepSpeed's ZeRO partitions, FSDP's DCP shards
under dcp/ (trainer/fsdp.py), or accelerate's state), completed by trainer_state.json written last by rank 0
(layout.RunDir.complete_checkpoints picks those).

Nothing in a checkpoint runs code when it is loaded: the scheduler state and DeepSpeed's partitions are read with
`torch.load(weights_only=True)` (DeepSpeed's own loader passes weights_only=False; its engine's loader is replaced
for the load), accelerate reads its files with weights_only=True itself. trainer_state.json records the size of
every file of the checkpoint, so a damaged (truncated, missing) one is known before any rank starts loading it and
resume falls back to the newest intact checkpoint (resume_from).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import MAX_CONFIG_BYTES, atomic_write, read_text_bounded
from scaletrain.engine.run.layout import CHECKPOINT_PREFIX, TRAINER_STATE, RunDir, checkpoint_step
from scaletrain.trainer.distributed import all_sum, barrier
from scaletrain.trainer.safe_load import safe_load, weights_only_loads  # noqa: F401 (used here and by export)

SCHEDULER_STATE = "scheduler.pt"
DS_CHECKPOINT_TAG = "deepspeed"
MANIFEST_KEY = "files"          # trainer_state.json: relative path → size in bytes of every file written before it


def save_checkpoint(acc: Any, model: Any, scheduler: Any, run: RunDir, state: dict[str, Any], rank: int,
                    deepspeed: bool, optimizer: Any = None) -> Path:
    import torch

    from scaletrain.trainer.fsdp import is_fsdp, save_sharded

    d = run.checkpoints / f"{CHECKPOINT_PREFIX}{state['step']}"
    d.mkdir(parents=True, exist_ok=True)
    if deepspeed:
        model.save_checkpoint(str(d), tag=DS_CHECKPOINT_TAG)    # every rank writes its ZeRO partition
    elif is_fsdp(model):
        save_sharded(model, optimizer, d)                       # every rank writes its DCP shards
    else:
        acc.save_state(str(d))
    if rank == 0:
        torch.save(scheduler.state_dict(), d / SCHEDULER_STATE)
    barrier()
    if rank == 0:
        manifest = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*"))
                    if p.is_file() and p.name != TRAINER_STATE}
        atomic_write(d / TRAINER_STATE, json.dumps({**state, MANIFEST_KEY: manifest}, indent=2) + "\n",
                     backup=False)
    barrier()
    return d


def read_state(d: Path) -> dict[str, Any]:
    """trainer_state.json, checked against the files it lists; ScaletrainError naming what is damaged."""
    try:
        state = json.loads(read_text_bounded(d / TRAINER_STATE, MAX_CONFIG_BYTES, TRAINER_STATE))
    except (OSError, ValueError) as e:
        raise ScaletrainError(f"{d.name}/{TRAINER_STATE} is unreadable ({e.__class__.__name__})") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise ScaletrainError(f"{d.name}/{TRAINER_STATE} has no step")
    manifest = state.get(MANIFEST_KEY)
    for rel, size in (manifest.items() if isinstance(manifest, dict) else ()):
        p = d / rel
        try:
            have = p.stat().st_size
        except OSError:
            raise ScaletrainError(f"{d.name}/{rel} is missing") from None
        if have != size:
            raise ScaletrainError(f"{d.name}/{rel} has {have:,} bytes, {size:,} were written")
    return state


def load_checkpoint(acc: Any, model: Any, scheduler: Any, d: Path, deepspeed: bool,
                    optimizer: Any = None, *, world: int | None = None, run: RunDir | None = None,
                    rank: int = 0) -> dict[str, Any]:
    """Load step-<n>/ into the live model, optimizer and scheduler. `world`: this run's world size; a DeepSpeed
    checkpoint written by another one goes through DeepSpeed's universal checkpoint (trainer/reshard.py, under
    `run`'s checkpoints folder); DDP's full state and FSDP's DCP shards load on any world size as they are."""
    from scaletrain.trainer.fsdp import is_fsdp, load_sharded

    state = read_state(d)
    if is_fsdp(model):
        load_sharded(model, optimizer, d)
    elif deepspeed and world is not None and run is not None and state.get("world_size") not in (None, world):
        from scaletrain.trainer.reshard import load_deepspeed_resharded

        load_deepspeed_resharded(acc, model, d, run, rank)
    elif deepspeed:
        engine = getattr(model, "checkpoint_engine", None)
        if engine is not None:
            engine.load = lambda path, map_location=None: safe_load(path, map_location)
        try:
            path, _ = model.load_checkpoint(str(d), tag=DS_CHECKPOINT_TAG)
        finally:
            if engine is not None:
                del engine.load             # the class's own loader again (for later saves' housekeeping)
        if path is None:
            raise ScaletrainError(f"{d} has no DeepSpeed checkpoint; it was written by another strategy")
    else:
        if not any(d.glob("model*")):
            raise ScaletrainError(f"{d} holds no accelerate checkpoint (model*.safetensors); it was written by "
                                  "another strategy")
        acc.load_state(str(d))
    scheduler.load_state_dict(safe_load(d / SCHEDULER_STATE))
    return state


def resume_from(acc: Any, model: Any, scheduler: Any, run: RunDir, deepspeed: bool,
                main: bool, optimizer: Any = None, *, candidates: list[Path] | None = None,
                world: int | None = None, rank: int = 0) -> tuple[Path, dict[str, Any]] | None:
    """Load the newest checkpoint every rank can load, falling back to older ones past a damaged one; None when
    there is none. The ranks agree on each attempt (a sum of failures), so all of them resume from the same step.
    candidates: the checkpoints to try, newest first (default: the run's own complete ones)."""
    damaged: list[str] = []
    for d in run.complete_checkpoints() if candidates is None else candidates:
        why = ""
        try:
            state = load_checkpoint(acc, model, scheduler, d, deepspeed, optimizer, world=world, run=run, rank=rank)
        except Exception as e:            # a damaged file: truncated, missing, not a checkpoint, a refused pickle
            why = _why(e)
        if all_sum(acc, [1.0 if why else 0.0])[0] == 0:
            return d, state
        damaged.append(d.name)
        if main:
            print(f"scaletrain: warning: checkpoint {d.name} cannot be loaded ({why or 'on another rank'}); "
                  "trying the previous one", flush=True)
    if damaged:
        raise ScaletrainError(f"no checkpoint can be loaded ({', '.join(damaged)} damaged); start a new run "
                              "directory, or launch without --resume to start at step 0")
    return None


def _why(e: Exception) -> str:
    """One short line for a failed load; a refused pickle names what it asked to run."""
    text = " ".join(str(e).split())
    refused = re.search(r"(?:unsupported|Unsupported global:) GLOBAL ([\w.]+)", text)
    if refused:
        return f"a file in it asks to run {refused.group(1)}; refused, nothing from it was executed"
    if "Weights only load failed" in text:
        return "a file in it is not plain tensors and containers; refused, nothing from it was executed"
    return text[:300] or e.__class__.__name__


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

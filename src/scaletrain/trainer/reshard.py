"""Resuming a checkpoint written by another number of ranks, and the checks that make it the same run.

The data order allows it (engine/run/resume_source.py: step k reads the same samples for any split of one effective
batch); the state is re-sharded by each strategy's own format. DDP: accelerate's checkpoint holds the whole model
and optimizer (each rank's RNG file is loaded when there is one). FSDP: DCP re-shards on load (trainer/fsdp.py).
DeepSpeed ZeRO: partitions are per data-parallel rank, so rank 0 converts the checkpoint with DeepSpeed's own
ds_to_universal into checkpoints/.universal-step-<n>/ (every torch.load in it weights-only), and every rank loads
that with DeepSpeed's load_universal; the folder is removed once loaded (the next save is native again).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import time
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.trainer.distributed import all_sum, barrier

# DeepSpeed's ZeRO checkpoint tag inside a step-<n>/ folder (trainer/checkpoints.py writes it).
DS_TAG = "deepspeed"
UNIVERSAL_PREFIX = ".universal-"
# Strategies whose checkpoint this trainer re-shards to another world size.
RESHARDABLE = ("ddp", "fsdp", "zero1", "zero2", "zero3")


def resume_candidates(run: Any, resume_from: str | None) -> list[Path]:
    """The checkpoints to try, newest first: the run's own, else the plan's --resume-from checkpoint."""
    own = run.complete_checkpoints()
    if own or not resume_from:
        return own
    return [Path(resume_from)]


def check_layout(ck: Path, state: dict[str, Any], *, micro_batch: int, grad_accum: int, world: int, rows: int,
                 strategy: str) -> str | None:
    """Refuse a checkpoint whose data layout differs (another effective batch, other data, another strategy's
    format); a world-size change with the same effective batch is allowed. Returns "written by W ranks, read by
    V" when the world size changed, else None."""
    saved_world = state.get("world_size") or 0
    saved_e = (state.get("micro_batch") or 0) * (state.get("grad_accum") or 0) * saved_world
    layout = {"effective batch (micro × accum × world)": (saved_e, micro_batch * grad_accum * world),
              "rows": (state.get("rows"), rows)}
    if state.get("strategy") is not None:
        layout["strategy"] = (state.get("strategy"), strategy)
    changed = {k: ab for k, ab in layout.items() if ab[0] != ab[1]}
    if changed:
        what = ", ".join(f"{k} {a} → {b}" for k, (a, b) in changed.items())
        raise ScaletrainError(f"cannot resume {ck.name}: the data layout changed ({what}); "
                              "start a new run directory instead")
    if saved_world == world:
        return None
    if strategy not in RESHARDABLE:
        raise ScaletrainError(f"cannot resume {ck.name} on {world} ranks: it was written by {saved_world} and "
                              f"strategy {strategy} is not re-sharded; launch it on {saved_world}")
    return f"written by {saved_world} rank{'s' if saved_world != 1 else ''}, read by {world}"


def universal_dir(run: Any, ck: Path) -> Path:
    return run.checkpoints / f"{UNIVERSAL_PREFIX}{ck.name}"


def _convert(ck: Path, out: Path) -> None:
    """DeepSpeed's ds_to_universal (serial workers, so its loads stay in this process and weights-only)."""
    from deepspeed.checkpoint import ds_to_universal

    from scaletrain.trainer.safe_load import weights_only_loads

    shutil.rmtree(out, ignore_errors=True)
    args = argparse.Namespace(input_folder=str(ck / DS_TAG), output_folder=str(out / DS_TAG), num_extract_workers=1,
                              num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True)
    said = io.StringIO()               # its progress bars and banners: kept out of the rank log unless it fails
    try:
        with weights_only_loads(), contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            ds_to_universal.main(args)
    except Exception as e:
        tail = " | ".join(ln.strip() for ln in said.getvalue().splitlines()[-3:] if ln.strip())
        raise RuntimeError(f"{e}{f' (after: {tail})' if tail else ''}") from e


def load_deepspeed_resharded(acc: Any, model: Any, ck: Path, run: Any, rank: int) -> None:
    """Rank 0 converts `ck` to a universal checkpoint, every rank loads it (a collective), rank 0 removes it. A
    failed conversion fails the load on every rank alike (the ranks agree before any loads)."""
    from scaletrain.trainer.safe_load import weights_only_loads

    out = universal_dir(run, ck)
    why = ""
    if rank == 0:
        try:
            t0 = time.perf_counter()
            _convert(ck, out)
            print(f"scaletrain: converted {ck.name} to a DeepSpeed universal checkpoint in {out.name}/ "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
        except Exception as e:           # a damaged or foreign checkpoint: said once, every rank gives up alike
            why = " ".join(str(e).split())[:300] or e.__class__.__name__
    barrier()
    if all_sum(acc, [1.0 if why else 0.0])[0]:
        raise ScaletrainError(f"DeepSpeed's universal-checkpoint conversion of {ck.name} failed"
                              f"{': ' + why if why else ' on rank 0'}")
    config = model._config            # DeepSpeed reads its load_universal switch from here at load time
    config.load_universal_checkpoint = True
    try:
        with weights_only_loads():
            path, _ = model.load_checkpoint(str(out), tag=DS_TAG)
    finally:
        config.load_universal_checkpoint = False
    barrier()
    if rank == 0:
        shutil.rmtree(out, ignore_errors=True)
    if path is None:
        raise ScaletrainError(f"{ck} has no DeepSpeed checkpoint; it was written by another strategy")

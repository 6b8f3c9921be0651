"""The disk a run needs (issue 22): its checkpoints as the trainer writes them, times how many stay on disk, the
export it writes at the end, and the logs; `scaletrain launch` compares it with the free space of the run directory's filesystem before any rank starts.

One checkpoint, by writer (file layouts measured on this project's CPU runs, deepspeed 0.19.8 / accelerate 1.15,
2 ranks; tests/engine/test_disk.py checks the formula against real checkpoints):
  FSDP (the trainer's)    dcp/: DCP shards, every rank its chunk of each tensor of the model's state dict (tied weights
                          under both names) and of AdamW's state (exp_avg, exp_avg_sq; `step` once), a torch.save
                          record per chunk, and .metadata; rng-<rank>.pt per rank (_dcp_tensor_bytes, DCP_ENTRY_BYTES)
  accelerate (DDP)        model.safetensors: the whole state dict as the model holds it (fp32 masters, bf16 weights,
                          a LoRA model's frozen base in its load dtype plus fp32 adapters); optimizer.bin: AdamW's two
                          fp32 moments per trainable weight; random_states_<rank>.pkl per rank
  DeepSpeed ZeRO 1-3      the optimizer partitions: fp32 master, exp_avg, exp_avg_sq per trainable weight (12 bytes);
                          the module states: every weight in the model dtype below stage 3, none of full fine-tuning's
                          at stage 3 (they live in the partitions); zero_to_fp32.py and zero_to_torch.py
  both                    scheduler.pt, trainer_state.json (a few KiB)
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.engine.units import fmt_bytes

KiB = 1024
# Files whose size does not grow with the model (measured, see the module doc): accelerate's random_states_<rank>.pkl
# (14,561 B on CPU; CUDA adds its generator states: counted as 16 KiB), DeepSpeed's copied recovery scripts
# (zero_to_fp32.py 38,580 B + zero_to_torch.py 2,490 B), scheduler.pt + trainer_state.json + `latest` (< 3 KiB).
RNG_STATE_BYTES = 16 * KiB
DS_SCRIPTS_BYTES = 41 * KiB
SMALL_FILES_BYTES = 4 * KiB
# Serialization overhead per file that holds tensors (torch.save's zip records, safetensors' header): measured
# ≤ 1.5 % on the tiny models, where it matters most; counted as 2 % plus 16 KiB per file.
SERIALIZATION_FRACTION = 0.02
PER_FILE_BYTES = 16 * KiB
# Logs: a metrics.jsonl line (~300 B) plus each rank's peaks and telemetry (~250 B), and each rank's log lines
# (~200 B per step: the step line, warnings); TensorBoard events (~150 B per step).
# DCP (trainer/fsdp.py save_sharded, torch 2.13): each stored chunk costs a torch.save record in its rank's .distcp and
# an entry in .metadata, beside its bytes. Measured on the 2-rank cpu-tiny checkpoints (tests/engine/test_disk.py): full
# fine-tuning 210 entries, 323,938 B of records + 55,729 B of .metadata (1.8 KiB each); LoRA 263 entries, 412,643 +
# 89,226 B (1.9 KiB each). Counted as 2 KiB per entry.
DCP_ENTRY_BYTES = 2 * KiB
LOG_BYTES_PER_STEP = 650
LOG_BYTES_PER_RANK_STEP = 450


@dataclass(frozen=True)
class DiskNeed:
    checkpoint_bytes: int             # one complete checkpoint, every rank's files together
    checkpoints_kept: int             # on disk at once at the end (keep_checkpoints, else every one written)
    logs_bytes: int
    steps: int | None                 # the run's optimizer steps (None: unknown, one checkpoint counted)
    export_bytes: int = 0             # the export the trainer writes at the end (export_at_end)
    export_host_bytes: int = 0        # host RAM that export holds on rank 0's node (export_host_bytes)

    @property
    def total_bytes(self) -> int:
        return self.checkpoint_bytes * self.checkpoints_kept + self.export_bytes + self.logs_bytes

    def text(self) -> str:
        """'8.91 MiB (4 checkpoints × 1.99 MiB + export 691 KiB + logs 302 KiB)'."""
        n = self.checkpoints_kept
        export = f" + export {fmt_bytes(self.export_bytes)}" if self.export_bytes else ""
        ram = (f"; the export at the end holds {fmt_bytes(self.export_host_bytes)} of host RAM on rank 0's node"
               if self.export_host_bytes else "")
        return (f"{fmt_bytes(self.total_bytes)} ({n} checkpoint{'s' if n != 1 else ''} × "
                f"{fmt_bytes(self.checkpoint_bytes)}{export} + logs {fmt_bytes(self.logs_bytes)}){ram}")

    def to_json(self) -> dict[str, Any]:
        return {"total_bytes": self.total_bytes, "checkpoint_bytes": self.checkpoint_bytes,
                "checkpoints_kept": self.checkpoints_kept, "export_bytes": self.export_bytes,
                "export_host_bytes": self.export_host_bytes, "logs_bytes": self.logs_bytes}


def checkpoint_bytes(setup: Any) -> int:
    """One checkpoint of this setup, all ranks' files (see the module doc)."""
    from scaletrain.engine.estimate.numerics import numerics, uses_deepspeed

    m = setup.model
    nm = numerics(setup)
    trainable = setup.trainable_params
    world = setup.world_size
    if setup.method == "full":
        weights = nm.weight * m.params
        frozen_bytes = 0
    else:
        frozen = m.params
        if setup.base_bits in (4, 8):
            from scaletrain.engine.estimate.setup import quantized_linear_bytes
            lin = m.linear_weight_params()
            frozen_bytes = quantized_linear_bytes(lin, setup.base_bits) + nm.frozen * (frozen - lin)
        else:
            frozen_bytes = nm.frozen * frozen
        weights = frozen_bytes + nm.adapter * trainable
    if setup.strategy == "fsdp" and setup.objective == "sft":     # the bundled trainer's DCP shards
        tied = m.embedding_params if (m.tie_embeddings and m.vocab_head) else 0
        return _dcp_checkpoint_bytes(setup, weights, (nm.weight if setup.method == "full" else nm.frozen) * tied)
    if uses_deepspeed(setup):
        # stage 3 keeps the trained weights in the partitions; a LoRA model's module states still hold the frozen
        # base and (measured: 99 KB of the tiny LoRA's 167 KB of adapters) adapter-sized records: all counted
        module = weights if setup.strategy != "zero3" or setup.method != "full" else 0
        partitions = 12 * trainable
        files = 2 * world if setup.strategy == "zero3" else 1 + world
        fixed = DS_SCRIPTS_BYTES + SMALL_FILES_BYTES
    else:
        module = weights
        partitions = 8 * trainable
        files = 2
        fixed = RNG_STATE_BYTES * world + SMALL_FILES_BYTES
    tensors = module + partitions
    return int(math.ceil(tensors * (1 + SERIALIZATION_FRACTION))) + PER_FILE_BYTES * files + fixed


def _dcp_checkpoint_bytes(setup: Any, weights: int, tied_bytes: int) -> int:
    """One FSDP checkpoint (trainer/fsdp.py save_sharded): the model's state dict and AdamW's, every tensor chunked over
    the ranks, each chunk with its record and metadata entry (DCP_ENTRY_BYTES); each rank's RNG state; the small
    files. The state dict names tied weights twice (lm_head beside embed_tokens): both are stored."""
    m = setup.model
    world = setup.world_size
    trainable_tensors = m.tensor_count if setup.method == "full" else 2 * m.adapted_linears(setup.lora_targets)
    model_tensors = m.tensor_count + (1 if tied_bytes else 0) + (trainable_tensors if setup.method != "full" else 0)
    tensors = weights + tied_bytes + 8 * setup.trainable_params + 4 * trainable_tensors
    entries = world * (model_tensors + 2 * trainable_tensors) + 2 * trainable_tensors
    return tensors + DCP_ENTRY_BYTES * entries + RNG_STATE_BYTES * world + SMALL_FILES_BYTES


def export_bytes(setup: Any) -> int:
    """What trainer/export.py writes at the end: the model in the training precision (full fine-tuning), or the
    fp32 adapter plus the merged model (LoRA/QLoRA), each with its serialization overhead."""
    per = setup.precision.compute_bytes
    tensors = per * setup.model.params
    if setup.method != "full":
        tensors += 4 * setup.trainable_params
    return int(math.ceil(tensors * (1 + SERIALIZATION_FRACTION))) + 2 * PER_FILE_BYTES + SMALL_FILES_BYTES


def reads_trained_only(setup: Any, train: Any) -> bool:
    """A LoRA/QLoRA export reads only the trained weights from the checkpoint when its frozen base can be built again
    from the run's weights (trainer/export.py): not a random-init base, which FSDP and ZeRO-3 build otherwise than
    the export does (measured: a 1.13 logit difference on tiny-qwen2 under FSDP), so it is read back whole. Train
    options unknown (None): counted whole."""
    return train is not None and setup.method != "full" and getattr(train, "model_source", None) != "random-init"


def export_host_bytes(setup: Any, train: Any) -> int:
    """Host RAM rank 0's export holds at its peak (trainer/export.py): the run's model built on the CPU in its load
    dtype, plus what it reads of the checkpoint, consolidated (DeepSpeed's fp32; accelerate's and DCP's as stored,
    ≤ fp32): every weight, or the trained ones only (`reads_trained_only`: the frozen base is the built model's)."""
    from scaletrain.engine.estimate.numerics import numerics

    nm = numerics(setup)
    built = (nm.weight if setup.method == "full" else nm.frozen) * setup.model.params
    return built + 4 * (setup.trainable_params if reads_trained_only(setup, train) else setup.model.params)


def disk_need(plan: Any, train: Any) -> DiskNeed:
    """What the run leaves on disk at its end: the checkpoints kept (train.keep_checkpoints, else all written at
    every train.checkpoint_every steps and the last) and the logs."""
    from scaletrain.engine.run.run_length import run_length

    steps = run_length(plan, train).steps
    if not train.save_checkpoints:
        kept = 0
    elif steps is None:
        kept = 1
    else:
        written = steps // train.checkpoint_every + (1 if steps % train.checkpoint_every else 0)
        # keep_checkpoints N: the newest is written before the oldest is pruned, so N + 1 exist for a moment
        kept = min(written, train.keep_checkpoints + 1) if train.keep_checkpoints else written
    world = plan.setup.world_size
    logs = (steps or 0) * (LOG_BYTES_PER_STEP + LOG_BYTES_PER_RANK_STEP * world)
    exporting = train.save_checkpoints and getattr(train, "export_at_end", False)
    return DiskNeed(checkpoint_bytes(plan.setup), max(0, kept), logs, steps,
                    export_bytes(plan.setup) if exporting else 0,
                    export_host_bytes(plan.setup, train) if exporting else 0)


def free_bytes(path: Path) -> int | None:
    """Free space of the filesystem holding `path` (its nearest existing folder), for this user; None: unknown.
    The one place scaletrain reads it (launch's check, the status record at the end)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def check_room(run_path: Path, plan: Any, train: Any, written_bytes: int = 0) -> None:
    """Refuse a launch whose checkpoints and logs cannot fit the run directory's filesystem (one line, with the
    doctor's disk remedies); `written_bytes`: what the run already has on disk (a resume's checkpoints)."""
    from scaletrain.engine.errors import ScaletrainError

    need = disk_need(plan, train)
    free = free_bytes(run_path)
    short = need.total_bytes - written_bytes
    if free is None or short <= free:
        return
    raise ScaletrainError(
        f"{run_path} has {fmt_bytes(free)} free on its filesystem but the run needs {need.text()}: free space or "
        "move the run directory to a bigger disk, or write fewer checkpoints (--set train.keep_checkpoints=1, a "
        "larger train.checkpoint_every)")

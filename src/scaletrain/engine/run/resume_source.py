"""Where a re-planned run resumes from: another run's checkpoint, possibly written by another number of ranks.

Why it is safe to resume on another world size: the bundled trainer's data order is one seeded permutation per
epoch split round-robin over the ranks (trainer/data.shard_order), so optimizer step k reads global positions
[k·E, (k+1)·E) of that permutation whatever the split of the effective batch E = micro × accum × world; the steps
per epoch (rows // E) and the LR schedule depend on E only. Keep E and the data, and step k+1 after the resume sees
exactly the samples it would have seen. The weights and optimizer state are re-sharded by the strategy's own
format: DDP's checkpoint is the full state (any world size loads it), FSDP's DCP shards are re-sharded on load, and
DeepSpeed's ZeRO partitions go through DeepSpeed's universal checkpoint (ds_to_universal, then
load_universal), converted by the trainer before it loads.

`train.resume_from` (--resume-from) names a run directory (its newest complete checkpoint) or one
checkpoints/step-<n>/ folder; the plan says "resumes from step N (written by 2 ranks, read by 4)" and `plan --json`
carries it as `resume` (ResumeSource.to_json). The trainer repeats the check against what it really loads.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import MAX_CONFIG_BYTES, read_text_bounded
from scaletrain.engine.run.layout import PLAN, TRAINER_STATE, RunDir, checkpoint_step

# How each strategy's checkpoint reaches another world size (the trainer does what is said here).
RESHARD_HOW = {"ddp": "full-state checkpoint, data re-sharded",
               "fsdp": "DCP shards re-sharded on load",
               "zero1": "DeepSpeed universal checkpoint", "zero2": "DeepSpeed universal checkpoint",
               "zero3": "DeepSpeed universal checkpoint"}
SAME_LAYOUT = "same world size: loaded as written"
# plan.json values of the source run that must match the new plan for its weights to load
MATCHING_SETUP = ("model", "method", "seq_len")


@dataclass(frozen=True)
class ResumeSource:
    """A checkpoint a new plan resumes from, and how its state reaches the new world size."""

    checkpoint: Path
    step: int
    total_steps: int | None
    written_world_size: int
    read_world_size: int
    strategy: str
    effective_batch: int
    how: str

    @property
    def resharded(self) -> bool:
        return self.written_world_size != self.read_world_size

    def line(self) -> str:
        return (f"resumes from step {self.step} (written by {self.written_world_size} rank"
                f"{'s' if self.written_world_size != 1 else ''}, read by {self.read_world_size}; {self.how}) of "
                f"{self.checkpoint}")

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint": str(self.checkpoint), "step": self.step, "total_steps": self.total_steps,
                "written_world_size": self.written_world_size, "read_world_size": self.read_world_size,
                "strategy": self.strategy, "effective_batch": self.effective_batch, "resharded": self.resharded,
                "how": self.how}


def find_checkpoint(path: str | os.PathLike[str]) -> Path:
    """A complete checkpoint: `path` itself (a checkpoints/step-<n>/ folder holding trainer_state.json) or a run
    directory's newest one; one clear line when there is none."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ScaletrainError(f"--resume-from {path}: no such folder; give a run directory or one of its "
                              "checkpoints/step-<n>/ folders")
    if checkpoint_step(p) is not None:
        if not (p / TRAINER_STATE).is_file():
            raise ScaletrainError(f"--resume-from {path}: the checkpoint is incomplete (no {TRAINER_STATE}); give "
                                  "an older step-<n>/ or the run directory")
        return p.resolve()
    newest = RunDir(p).newest_checkpoint()
    if newest is None:
        raise ScaletrainError(f"--resume-from {path}: no complete checkpoint in it (a run directory's "
                              "checkpoints/step-<n>/ with trainer_state.json)")
    return newest


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        d = json.loads(read_text_bounded(path, MAX_CONFIG_BYTES, what))
    except (OSError, ValueError, ScaletrainError) as e:
        raise ScaletrainError(f"--resume-from: cannot read {path} ({e.__class__.__name__})") from None
    if not isinstance(d, dict):
        raise ScaletrainError(f"--resume-from: {path} is not a JSON object")
    return d


def _whole(state: dict[str, Any], key: str, path: Path) -> int:
    v = state.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ScaletrainError(f"--resume-from: {path} has no whole-number {key} (got {str(v)[:40]})")
    return v


def resume_source(path: str | os.PathLike[str], *, strategy: str, world_size: int, micro_batch: int,
                  grad_accum: int, setup: dict[str, Any] | None = None) -> ResumeSource:
    """The checkpoint `path` names, checked against the new plan: the same strategy and effective batch (so the
    same samples per step and LR schedule), and — when the source run's plan.json is beside it — the same model,
    method and sequence length. ScaletrainError (one line) says what differs."""
    ck = find_checkpoint(path)
    state = _read_json(ck / TRAINER_STATE, TRAINER_STATE)
    step, world = _whole(state, "step", ck), _whole(state, "world_size", ck)
    old_e = _whole(state, "micro_batch", ck) * _whole(state, "grad_accum", ck) * world
    new_e = micro_batch * grad_accum * world_size
    old_strategy = str(state.get("strategy") or "")
    if old_strategy != strategy:
        raise ScaletrainError(f"--resume-from {ck}: it was written by strategy {old_strategy or '?'}, this plan runs "
                              f"{strategy}; plan with --strategy {old_strategy or 'of the checkpoint'} to resume it")
    if old_e != new_e:
        raise ScaletrainError(
            f"--resume-from {ck}: its effective batch is {old_e} (micro {state.get('micro_batch')} × accum "
            f"{state.get('grad_accum')} × {world} rank{'s' if world != 1 else ''}), this plan's is {new_e} ({micro_batch} × {grad_accum} × "
            f"{world_size}); plan with --effective-batch {old_e} so every step reads the samples it would have read")
    _check_setup(ck, setup)
    total = state.get("total_steps") if isinstance(state.get("total_steps"), int) else None
    how = RESHARD_HOW.get(strategy, "") if world != world_size else SAME_LAYOUT
    return ResumeSource(ck, step, total, world, world_size, strategy, new_e, how)


def plan_setup(doc: dict[str, Any]) -> dict[str, Any]:
    """What must match between the source run and the new plan, from a plan.json document."""
    model, training = doc.get("model"), doc.get("training")
    model = model if isinstance(model, dict) else {}
    training = training if isinstance(training, dict) else {}
    return {"model": model.get("name"), "method": training.get("method"), "seq_len": training.get("seq_len")}


def _check_setup(ck: Path, setup: dict[str, Any] | None) -> None:
    """The source run's plan.json (run/checkpoints/step-<n>/ → run/plan.json) against the new plan's setup."""
    plan_json = ck.parent.parent / PLAN
    if setup is None or not plan_json.is_file():
        return
    old = plan_setup(_read_json(plan_json, PLAN))
    differ = [f"{k} {old[k]} → {setup.get(k)}" for k in MATCHING_SETUP
              if old.get(k) is not None and setup.get(k) is not None and old[k] != setup[k]]
    if differ:
        raise ScaletrainError(f"--resume-from {ck}: the checkpoint's run differs ({', '.join(differ)}); its weights "
                              "cannot be loaded into this plan")


def resume_for_plan(plan: Any, resume_from: str | os.PathLike[str] | None) -> ResumeSource | None:
    """The plan's resume source (None without --resume-from), checked against the plan's setup."""
    if resume_from is None:
        return None
    s = plan.setup
    objective = str(getattr(s.objective, "value", s.objective) or "sft")
    if objective != "sft":
        raise ScaletrainError(f"--resume-from is for the bundled supervised trainer; --objective {objective} runs TRL's "
                              "trainer, which starts at step 0")
    setup = {"model": s.model.name, "method": str(getattr(s.method, "value", s.method)), "seq_len": s.seq_len}
    return resume_source(resume_from, strategy=str(getattr(s.strategy, "value", s.strategy)),
                         world_size=s.world_size, micro_batch=s.micro_batch, grad_accum=s.grad_accum, setup=setup)

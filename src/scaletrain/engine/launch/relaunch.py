"""Apply a remedy to a run directory and relaunch it from its last checkpoint.

Why a module: a remedy is a few PlanRequest changes, but applying it safely means re-planning on the same
hardware, rewriting every file the plan decides (accelerate YAML, ds_config.json, launch.sh, plan.json) without
losing the old ones, and knowing whether the checkpoint can be resumed under the new plan. What resumes:
the same samples per optimizer step per rank (micro × accum), the same world size and data, and a checkpoint
format the new strategy reads — so a micro-batch split, gradient checkpointing, offload and attention changes
resume; a ZeRO-stage, precision, method or sequence-length change starts over (only with restart=True, and the
old checkpoints and metrics are moved into the attempt's backup, never deleted).

Remedy changes: PlanRequest fields by name, "train.<field>" for TrainOptions, "env.<NAME>" for environment
variables of the relaunched processes (also written to the attempt's record).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import atomic_write
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.fields import HARDWARE_FIELDS, RESUMABLE_FIELDS
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.launch.launcher import LaunchResult, launch
from scaletrain.engine.launch.attempts import backup_attempt
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.run.plan_document import PlanDocument, read_plan_document
from scaletrain.engine.launch.status import read_status
from scaletrain.engine.run.writers import render_run_files

# Train options that only decide which checkpoints are written: the schedule and the data order stay.
RESUMABLE_TRAIN_OPTIONS = frozenset({"checkpoint_every", "keep_checkpoints", "save_checkpoints"})
ENV_PREFIX, TRAIN_PREFIX = "env.", "train."


@dataclass(frozen=True)
class Applied:
    run_dir: Path
    changes: dict[str, Any]
    plan: Plan                         # the new plan
    resume: bool                       # relaunch with --resume (a checkpoint exists and is compatible)
    env: dict[str, str] | None         # the full environment for the relaunch (None: inherit)
    backup_dir: Path
    summary: str


def likely_resumes(changes: dict[str, Any], keeps_effective_batch: bool | None = True) -> bool:
    """A quick field-level answer for views (apply_remedy makes the exact check against the checkpoint)."""
    fields_ = {k for k in changes if not k.startswith(ENV_PREFIX)
               and k.removeprefix(TRAIN_PREFIX) not in RESUMABLE_TRAIN_OPTIONS}
    return fields_ <= RESUMABLE_FIELDS and keeps_effective_batch is not False


def split_changes(changes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """(PlanRequest changes, TrainOptions changes, environment) from a remedy's flat change dict."""
    req_f = PlanRequest.field_names()
    train_f = {f.name for f in fields(TrainOptions)}
    plan_c: dict[str, Any] = {}
    train_c: dict[str, Any] = {}
    env_c: dict[str, str] = {}
    for k, v in changes.items():
        if k.startswith(ENV_PREFIX) and len(k) > len(ENV_PREFIX):
            env_c[k[len(ENV_PREFIX):]] = str(v)
        elif k.startswith(TRAIN_PREFIX) and k[len(TRAIN_PREFIX):] in train_f:
            train_c[k[len(TRAIN_PREFIX):]] = v
        elif k in req_f:
            plan_c[k] = tuple(v) if isinstance(v, list) else v
        else:
            raise ScaletrainError(f"remedy change {k!r} is not a plan field, train.<option> or env.<NAME>; "
                                  f"plan fields: {', '.join(sorted(req_f))}")
    return plan_c, train_c, env_c


def resume_blocker(old: PlanDocument, new_plan: Plan, plan_c: dict[str, Any],
                   train_c: dict[str, Any]) -> str | None:
    """Why the newest checkpoint cannot be resumed under the changed plan (None: it can)."""
    s = new_plan.setup
    ob = old.batch
    if s.world_size != ob.world_size:
        return f"the world size changes ({ob.world_size} → {s.world_size})"
    if s.micro_batch * s.grad_accum != ob.micro_batch * ob.grad_accum:
        return (f"samples per step per rank change ({ob.micro_batch}×{ob.grad_accum} → "
                f"{s.micro_batch}×{s.grad_accum}), so the data order does")
    changed = sorted(k for k in plan_c if k not in RESUMABLE_FIELDS and plan_c[k] != old.recorded(k))
    if changed:
        return f"{', '.join(changed)} change{'s' if len(changed) == 1 else ''} the checkpoint's format or the data"
    schedule = sorted(k for k in train_c if k not in RESUMABLE_TRAIN_OPTIONS)
    if schedule:
        return f"train option {', '.join(schedule)} needs a fresh schedule"
    return None


@dataclass(frozen=True)
class Replanned:
    """A run's plan before and after a remedy's changes, and what that means for its newest checkpoint."""

    old: PlanDocument
    old_request: PlanRequest
    old_plan: Plan
    new_request: PlanRequest
    new_plan: Plan
    train: TrainOptions                # the train options after the change
    plan_changes: dict[str, Any]
    train_changes: dict[str, Any]
    env: dict[str, str]
    checkpoint: Path | None            # the newest complete checkpoint
    blocker: str | None                # why that checkpoint cannot be resumed after the change (None: it can)


def replan_with(run: RunDir, changes: dict[str, Any]) -> Replanned:
    """Re-plan the run with `changes` on its own hardware (no file written): what apply_remedy writes and what
    the monitor's confirmation shows before it does. A hardware change or an unknown field is one clear line."""
    old = read_plan_document(run.plan)
    plan_c, train_c, env_c = split_changes(dict(changes))
    hw = sorted(HARDWARE_FIELDS & set(plan_c))
    if hw:
        raise ScaletrainError(f"changing {', '.join(hw)} changes the hardware; plan a new run directory for it "
                              "(scaletrain --gpus ...), a relaunch runs on the same machines")
    req, old_plan = old.replan()
    new_req = req.with_(**plan_c)
    new_plan = make_plan(new_req, hardware=old_plan.setup.hardware)
    try:
        train = replace(old.train, **train_c)
    except TypeError as e:
        raise ScaletrainError(f"bad train option in remedy: {e}") from None
    ck = run.newest_checkpoint()
    blocker = resume_blocker(old, new_plan, plan_c, train_c) if ck is not None else None
    return Replanned(old, req, old_plan, new_req, new_plan, train, plan_c, train_c, env_c, ck, blocker)


def apply_remedy(run_dir: str | os.PathLike[str], changes: dict[str, Any], *, restart: bool = False,
                 title: str | None = None, how_to_restart: str = "apply it with restart") -> Applied:
    """Re-plan with `changes`, back up the old files, rewrite the run's files; say whether to resume.

    Refuses (one clear line) a running run, a hardware change (that is a new run directory), and — unless
    `restart` — a change the newest checkpoint cannot be resumed under (the line ends with `how_to_restart`: the
    front end's way to ask for the restart).
    """
    run = RunDir(run_dir)
    pid = read_status(run.status).running_elsewhere()
    if pid is not None:
        raise ScaletrainError(f"{run.path} is still running (launcher pid {pid}); stop it before applying a remedy")
    r = replan_with(run, changes)
    new_plan, new_req, train, env_c, ck, blocker = r.new_plan, r.new_request, r.train, r.env, r.checkpoint, r.blocker
    if blocker and not restart:
        raise ScaletrainError(f"cannot resume {ck.name} after this change: {blocker}; {how_to_restart} "
                              "(step 0; the old checkpoints are kept in attempts/)")
    resume = ck is not None and blocker is None
    record = {"title": title, "changes": changes, "resume_from": ck.name if resume else None,
              "restart_reason": blocker, "applied": datetime.now().isoformat(timespec="seconds")}
    move = (run.checkpoints.name, run.metrics.name) if blocker else ()
    backup = backup_attempt(run, record, move)
    files = render_run_files(new_plan, new_req, train, run)
    for name, (text, mode) in files.items():
        atomic_write(run.path / name, text, mode=mode)
    if run.ds_config.name not in files and run.ds_config.exists():
        run.ds_config.unlink()          # the new strategy has no DeepSpeed; the old file is in the backup
    run.checkpoints.mkdir(exist_ok=True)
    env = {**os.environ, **env_c} if env_c else None
    what = ", ".join(f"{k}={v}" for k, v in changes.items()) or "configs rewritten"
    how = f"resuming from {ck.name}" if resume else ("restarting from step 0: " + blocker if blocker
                                                      else "starting from step 0 (no checkpoint yet)")
    summary = f"applied {title or what}; {how}; previous files in {backup.relative_to(run.path)}"
    return Applied(run.path, dict(changes), new_plan, resume, env, backup, summary)


def relaunch(run_dir: str | os.PathLike[str], changes: dict[str, Any], *, restart: bool = False,
             title: str | None = None, **launch_kw: Any) -> tuple[Applied, LaunchResult]:
    """apply_remedy, then run the launcher (resuming when the checkpoint allows) to the end."""
    applied = apply_remedy(run_dir, changes, restart=restart, title=title)
    result = launch(applied.run_dir, resume=applied.resume, env=applied.env, **launch_kw)
    return applied, result

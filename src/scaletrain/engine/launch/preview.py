"""What applying a remedy would change, before anything is written: the confirmation the monitor asks for.

Why here: the monitor must show the plan's fields before → after, the predicted memory and step time before →
after and the step the relaunch resumes from, and those numbers must be the ones apply_remedy would write. Both
come from relaunch.replan_with (the same re-plan on the run's own hardware), so the preview cannot disagree with
the files that confirming writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import Any

from scaletrain.engine.launch.relaunch import ENV_PREFIX, TRAIN_PREFIX, replan_with
from scaletrain.engine.run.layout import RunDir, checkpoint_step


@dataclass(frozen=True)
class FieldChange:
    """One changed field, as words: `micro_batch 4 → 1`."""

    name: str
    before: str
    after: str


@dataclass(frozen=True)
class RemedyPreview:
    title: str
    fields: tuple[FieldChange, ...]
    memory_before_bytes: int            # the plan's predicted per-GPU (per-process on CPU) total, before / after
    memory_after_bytes: int
    usable_bytes: int                   # capacity less the plan's headroom: what "fits" is measured against
    step_before_seconds: float
    step_after_seconds: float
    effective_batch_before: int
    effective_batch_after: int
    resume_step: int | None             # the step the relaunch continues from (None: step 0)
    resume_from: str | None             # that checkpoint's folder name
    restart_reason: str | None          # why it starts from step 0 when a checkpoint exists (it cannot be resumed)
    needs_restart: bool                 # confirming applies it from step 0 (apply_remedy's restart=True)

    @property
    def resume_text(self) -> str:
        if self.resume_from is not None:
            return f"resumes from {self.resume_from} (step {self.resume_step})"
        if self.restart_reason:
            return (f"starts again from step 0: {self.restart_reason} (the old checkpoints and metrics move to "
                    "attempts/)")
        return "starts from step 0 (no checkpoint yet)"


def value_text(v: Any) -> str:
    """A field's value in the words the CLI takes (`on`/`off` for switches, an enum's value)."""
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, Enum):
        return str(v.value)
    if v is None:
        return "unset"
    if isinstance(v, (tuple, list)):
        return ", ".join(value_text(x) for x in v) or "none"
    return str(v)


def _setup_value(plan: Any, request: Any, name: str) -> Any:
    """The value the plan chose (the setup's) where it has the field, else the request's."""
    return getattr(plan.setup, name) if hasattr(plan.setup, name) else getattr(request, name, None)


def preview_remedy(run_dir: str | os.PathLike[str], changes: dict[str, Any],
                   title: str | None = None) -> RemedyPreview:
    """The remedy's effect on this run, read-only (a hardware change or an unknown field: one line, as apply)."""
    run = RunDir(run_dir)
    r = replan_with(run, changes)
    rows = []
    for k, v in changes.items():
        if k.startswith(ENV_PREFIX):
            name = k[len(ENV_PREFIX):]
            rows.append(FieldChange(f"env {name}", os.environ.get(name, "unset"), str(v)))
        elif k.startswith(TRAIN_PREFIX):
            name = k[len(TRAIN_PREFIX):]
            rows.append(FieldChange(f"train.{name}", value_text(getattr(r.old.train, name, None)),
                                    value_text(getattr(r.train, name, None))))
        else:
            rows.append(FieldChange(k, value_text(_setup_value(r.old_plan, r.old_request, k)),
                                    value_text(_setup_value(r.new_plan, r.new_request, k))))
    ck = r.checkpoint
    resumes = ck is not None and r.blocker is None
    return RemedyPreview(
        title=title or ", ".join(f"{f.name} {f.after}" for f in rows), fields=tuple(rows),
        memory_before_bytes=r.old_plan.memory.total_bytes, memory_after_bytes=r.new_plan.memory.total_bytes,
        usable_bytes=int(r.new_plan.memory.capacity_bytes * (1.0 - r.new_plan.memory.headroom_fraction)),
        step_before_seconds=r.old_plan.time.step_seconds, step_after_seconds=r.new_plan.time.step_seconds,
        effective_batch_before=r.old_plan.setup.effective_batch, effective_batch_after=r.new_plan.setup.effective_batch,
        resume_step=checkpoint_step(ck) if resumes else None, resume_from=ck.name if resumes else None,
        restart_reason=r.blocker, needs_restart=r.blocker is not None)

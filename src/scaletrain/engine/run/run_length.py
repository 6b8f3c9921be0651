"""How long a written run trains, as the trainer will run it: `train.max_steps` overrides the plan's epochs (a
preset's hidden max_steps must not read as "1 epoch"), and each is shown in the other's unit when the plan knows the
steps per epoch (it needs the dataset size)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RunLength:
    steps: int | None              # optimizer steps the trainer runs (None: unknown without a dataset size)
    epochs: float | None           # passes over the data (None: unknown without a dataset size)
    by_max_steps: bool             # train.max_steps decides, not the plan's epochs

    def text(self) -> str:
        """'6 steps (max_steps) = 6.45 epochs', '2 epochs = 1,258 steps', '1 epoch (steps: give a dataset size)'."""
        if self.by_max_steps:
            head = f"{self.steps:,} step{'s' if self.steps != 1 else ''} (max_steps)"
            return head + (f" = {self.epochs:.3g} epochs" if self.epochs is not None else
                           " (epochs: give a dataset size)")
        ep = f"{self.epochs:g} epoch{'s' if self.epochs != 1 else ''}"
        return ep + (f" = {self.steps:,} steps" if self.steps is not None else " (steps: give a dataset size)")


def run_length(plan: Any, train: Any) -> RunLength:
    """The plan (its setup's epochs, its time's steps per epoch) and the train options (max_steps)."""
    t = plan.time
    per_epoch = t.steps_per_epoch if t is not None else None
    if train.max_steps is not None:
        return RunLength(int(train.max_steps), train.max_steps / per_epoch if per_epoch else None, True)
    return RunLength(t.total_steps if t is not None else None, float(plan.setup.epochs), False)

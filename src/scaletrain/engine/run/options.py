"""TrainOptions: what the bundled trainer needs beyond the plan's numbers (plan.json's "train" section)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError

# The trainer's learning-rate schedules, by the name a preset or --set uses → transformers' scheduler name.
LR_SCHEDULES = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


@dataclass(frozen=True)
class TrainOptions:
    """What the bundled trainer needs beyond the plan's numbers."""

    dataset: str | None = None            # JSONL path; None → the bundled demo data (presets/data/demo.jsonl)
    model_source: str = "random-init"     # "random-init" (from the plan's config) | local path | HF cache id
    lr: float = 2e-5
    lr_schedule: str = "cosine"           # cosine | linear | constant
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0            # gradient clipping (ds_config.json gradient_clipping); 0 = off
    max_steps: int | None = None          # overrides epochs when set
    checkpoint_every: int = 50            # optimizer steps; a final checkpoint is written too (when saving)
    save_checkpoints: bool = True         # false: no checkpoint at all, not even the final one (validation runs)
    keep_checkpoints: int | None = None   # keep only the newest N complete checkpoints; None keeps every one
    seed: int = 0
    packing: bool = True                  # pack samples into seq_len blocks (else pad each sample)
    lora_alpha: int | None = None         # default 2 × rank
    lora_dropout: float = 0.0
    script: str | None = None             # user-script mode: run this instead of the bundled trainer
    script_args: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> "TrainOptions":
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ScaletrainError(f"unknown train option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(known))}")
        if "script_args" in d and d["script_args"] is not None:
            d["script_args"] = tuple(d["script_args"])
        return cls(**d)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["script_args"] = list(self.script_args)
        return d

    def check(self) -> None:
        """The options the training loop reads, checked before any process loads a model."""
        if self.lr_schedule not in LR_SCHEDULES:
            raise ScaletrainError(f"lr_schedule {self.lr_schedule!r} is not accepted; use one of: "
                                  f"{', '.join(LR_SCHEDULES)}")
        if not self.lr > 0:
            raise ScaletrainError(f"lr must be positive (got {self.lr})")
        if not 0 <= self.warmup_ratio < 1:
            raise ScaletrainError(f"warmup_ratio must be in [0, 1) (got {self.warmup_ratio})")
        if self.max_steps is not None and self.max_steps < 1:
            raise ScaletrainError(f"max_steps must be ≥ 1 or unset (got {self.max_steps})")
        if self.checkpoint_every < 1:
            raise ScaletrainError(f"checkpoint_every must be ≥ 1 optimizer step (got {self.checkpoint_every})")
        if not isinstance(self.save_checkpoints, bool):
            raise ScaletrainError(f"save_checkpoints must be true or false (got {self.save_checkpoints!r})")
        k = self.keep_checkpoints
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ScaletrainError(f"keep_checkpoints must be a whole number ≥ 1 or unset (got {k!r})")


def bundled_demo_dataset() -> Path:
    """presets/data/demo.jsonl, the offline demo data shipped with the package (the dataset when none is set)."""
    import scaletrain.presets as presets_pkg

    return Path(presets_pkg.__file__).parent / "data" / "demo.jsonl"

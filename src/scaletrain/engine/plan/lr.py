"""Learning-rate suggestion when the effective batch moves away from the batch a learning rate was tuned for.

Two rules people use, shown side by side because neither is universally right for fine-tuning:
  square-root  lr · sqrt(B / B0)   (Adam-family optimizers; Hoffer et al. 2017, Malladi et al. 2022)
  linear       lr · B / B0         (SGD; Goyal et al. 2017 "ImageNet in 1 hour", with warmup)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from scaletrain.engine.errors import ScaletrainError


@dataclass(frozen=True)
class LrSuggestion:
    base_lr: float
    base_batch: int
    effective_batch: int
    sqrt_lr: float
    linear_lr: float

    @property
    def batch_ratio(self) -> float:
        return self.effective_batch / self.base_batch

    def to_json(self) -> dict[str, Any]:
        return {"base_lr": self.base_lr, "base_batch": self.base_batch, "effective_batch": self.effective_batch,
                "batch_ratio": self.batch_ratio, "sqrt_rule_lr": self.sqrt_lr, "linear_rule_lr": self.linear_lr}

    def describe(self) -> str:
        return (f"learning rate {self.base_lr:g} at batch {self.base_batch} → batch {self.effective_batch} "
                f"(×{self.batch_ratio:g}): square-root rule {self.sqrt_lr:.3g}, linear rule {self.linear_lr:.3g}")


def suggest_lr(base_lr: float | None, base_batch: int | None, effective_batch: int) -> LrSuggestion | None:
    """Both scaling rules for `effective_batch`; None when no reference was given."""
    if base_lr is None and base_batch is None:
        return None
    if base_lr is None or base_batch is None:
        raise ScaletrainError("--base-lr and --base-batch go together: give the learning rate and the effective "
                              "batch it was tuned for (e.g. --base-lr 2e-4 --base-batch 8)")
    if not (isinstance(base_lr, (int, float)) and math.isfinite(base_lr) and base_lr > 0):
        raise ScaletrainError(f"--base-lr must be a positive number (got {base_lr!r})")
    if isinstance(base_batch, bool) or not isinstance(base_batch, int) or base_batch < 1:
        raise ScaletrainError(f"--base-batch must be a whole number ≥ 1 (got {base_batch!r})")
    ratio = effective_batch / base_batch
    return LrSuggestion(float(base_lr), base_batch, effective_batch, base_lr * math.sqrt(ratio), base_lr * ratio)


# ---- the default learning rate by method ---------------------------------------------------------------------------
FULL_FT_LR = 2e-5          # TrainOptions.lr: a usual full fine-tuning rate for 1-70B chat models
LORA_LR = 2e-4             # the QLoRA paper's rate for 7B and 13B adapters (Dettmers et al. 2023, table 9)
LORA_LR_LARGE = 1e-4       # ... and for 33B and 65B
LORA_LARGE_PARAMS = 20e9   # between 13B and 33B


@dataclass(frozen=True)
class DefaultLr:
    lr: float
    why: str


def default_lr(method: str, params: int | None = None) -> DefaultLr:
    """The learning rate a run starts from when none is given: adapters train at 1e-4…2e-4 (an order of magnitude
    above full fine-tuning, as the LoRA and QLoRA papers and PEFT's examples use), full fine-tuning at 2e-5."""
    if method in ("lora", "qlora"):
        large = params is not None and params > LORA_LARGE_PARAMS
        lr = LORA_LR_LARGE if large else LORA_LR
        size = "above 20B parameters" if large else "up to 20B parameters"
        return DefaultLr(lr, f"LoRA rule: adapters train at 1e-4…2e-4; {lr:g} {size} (QLoRA paper)")
    return DefaultLr(FULL_FT_LR, "full fine-tuning default")

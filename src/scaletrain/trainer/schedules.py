"""The learning-rate schedules (linear, cosine, constant, each after a linear warmup), as torch LambdaLRs.

Why not `transformers.get_scheduler`: importing it imports transformers.trainer_utils, which imports peft and
bitsandbytes — about 3.5 CPU seconds in every rank of every run, LoRA or not (measured with -X importtime on the
2-core VM, a 2-rank cpu-tiny launch). The formulas are transformers' own (transformers/optimization.py, 5.24),
step for step: tests/trainer/test_schedules.py compares both over many warmups and lengths.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any


def _linear(step: int, *, warmup_steps: int, total_steps: int) -> float:
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    return max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps)))


def _cosine(step: int, *, warmup_steps: int, total_steps: int) -> float:
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))      # half a cosine wave, down to 0


def _constant(step: int, *, warmup_steps: int, total_steps: int) -> float:
    if step < warmup_steps:
        return float(step) / float(max(1.0, warmup_steps))
    return 1.0


# the schedule names scaletrain accepts (engine/request/options.py LR_SCHEDULES keys)
SCHEDULES = {"linear": _linear, "cosine": _cosine, "constant": _constant}


def lr_scheduler(name: str, optimizer: Any, warmup_steps: int, total_steps: int) -> Any:
    """A LambdaLR over `optimizer` following schedule `name` (a key of SCHEDULES)."""
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, partial(SCHEDULES[name], warmup_steps=warmup_steps, total_steps=total_steps))

"""What pinned choices cost: the plan as pinned against the planner's best with the same inputs left free.

A preset (a seed's setup) or a user may fix choices the planner would otherwise make: the strategy, offload,
gradient checkpointing, micro batch × accumulation, the loss. When the planner's own pick at the same effective
batch is faster (or leaner), the front ends say which pins differ and by how much — "pins DDP, micro 16 × accum 2,
grad-ckpt on: +2.8 s/step vs ZeRO-1, micro 4 × accum 8, grad-ckpt off (6.0 s/step)" — and what each alternative
row differs in. Every number comes from the planner (make_plan) and its rows; nothing is estimated here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scaletrain.engine.catalog.hardware import Hardware
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.fields import PIN_FIELDS
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.units import fmt_bytes, fmt_seconds

# A pin costs something when it is this much slower per step (below it the two are the same speed to the model's
# resolution, and only memory is compared).
SAME_SPEED_FRACTION = 0.01


def _choice_words(s: Any) -> list[str]:
    """'ZeRO-3', 'no offload', 'micro 2 × accum 8', 'grad-ckpt on', 'loss standard': one setup's planner choices."""
    return [s.strategy.label, "no offload" if str(s.offload) == "none" else f"offload {s.offload}",
            f"micro {s.micro_batch} × accum {s.grad_accum}", f"grad-ckpt {'on' if s.grad_ckpt else 'off'}",
            f"loss {s.loss}"]


def _short_words(s: Any) -> list[str]:
    """_choice_words for a table cell: 'ZeRO-3', 'off:all', '2×8', 'ckpt on', 'loss chunked'."""
    return [s.strategy.label, "no offload" if str(s.offload) == "none" else f"off:{s.offload}",
            f"{s.micro_batch}×{s.grad_accum}", f"ckpt {'on' if s.grad_ckpt else 'off'}", f"loss {s.loss}"]


def _differing(pinned: Any, best: Any, *, short: bool = False) -> tuple[list[str], list[str]]:
    """The words of the choices that differ between two setups: (pinned's, best's), in PIN_FIELDS order."""
    words = _short_words if short else _choice_words
    a, b = words(pinned), words(best)
    keys = [(pinned.strategy, best.strategy), (pinned.offload, best.offload),
            ((pinned.micro_batch, pinned.grad_accum), (best.micro_batch, best.grad_accum)),
            (pinned.grad_ckpt, best.grad_ckpt), (str(pinned.loss), str(best.loss))]
    idx = [i for i, (x, y) in enumerate(keys) if x != y]
    return [a[i] for i in idx], [b[i] for i in idx]


@dataclass(frozen=True)
class PinCost:
    """The pinned plan against the planner's best unpinned one at the same effective batch."""

    pinned_fields: tuple[str, ...]        # the request's pinned PIN_FIELDS
    pinned_words: tuple[str, ...]         # the pinned choices that differ from the best ("ZeRO-3", ...)
    best_words: tuple[str, ...]           # the best plan's choices in their place ("FSDP", ...)
    step_seconds: float                   # the pinned plan's
    best_step_seconds: float
    memory_bytes: int                     # per GPU, the pinned plan's
    best_memory_bytes: int
    total_seconds: float | None           # whole run, when the run length is known
    best_total_seconds: float | None

    @property
    def step_delta(self) -> float:
        return self.step_seconds - self.best_step_seconds

    @property
    def costs_time(self) -> bool:
        return self.step_delta > SAME_SPEED_FRACTION * self.best_step_seconds

    @property
    def costs_memory(self) -> bool:
        return self.memory_bytes > self.best_memory_bytes

    @property
    def same_speed(self) -> bool:
        return abs(self.step_delta) <= SAME_SPEED_FRACTION * self.best_step_seconds

    @property
    def costs(self) -> bool:
        """The pins are slower, or as fast and use more memory per GPU."""
        return bool(self.pinned_words) and (self.costs_time or (self.same_speed and self.costs_memory))

    def text(self, whose: str = "the") -> str:
        """"the h200x4-fast preset's pins (DDP, micro 16 × accum 2, grad-ckpt on): +2.8 s/step (+1.2 h in all) vs
        ZeRO-1, micro 4 × accum 8, grad-ckpt off at 6.0 s/step"; or that the pins cost nothing."""
        pins = ", ".join(self.pinned_words) or ", ".join(self.pinned_fields)
        best = ", ".join(self.best_words)
        if not self.costs:
            versus = f" against the planner's best ({best})" if self.best_words else ": the planner picks the same"
            return f"{whose} pins ({pins}) cost no time or memory{versus}"
        if self.costs_time:
            total = ""
            if self.total_seconds is not None and self.best_total_seconds is not None:
                total = f" (+{fmt_seconds(self.total_seconds - self.best_total_seconds)} in all)"
            return (f"{whose} pins ({pins}): +{fmt_seconds(self.step_delta)}/step{total} vs {best} at "
                    f"{fmt_seconds(self.best_step_seconds)}/step")
        return (f"{whose} pins ({pins}): +{fmt_bytes(self.memory_bytes - self.best_memory_bytes)} per GPU at the "
                f"same speed vs {best} ({fmt_bytes(self.best_memory_bytes)})")


def unpinned(request: PlanRequest, plan: Plan) -> PlanRequest:
    """The request with every planner choice free again, at the plan's effective batch."""
    return request.with_(effective_batch=plan.setup.effective_batch, **{f: None for f in PIN_FIELDS})


def pin_cost(request: PlanRequest, plan: Plan, hardware: Hardware | None = None) -> PinCost | None:
    """The cost of `request`'s pins in `plan` (its plan) against the planner's best with them free; None when the
    request pins nothing or the free request cannot be planned."""
    free = unpinned(request, plan)
    # a field the request fills in by itself (a TRL objective's gradient checkpointing) is not a pin
    pinned = tuple(f for f in PIN_FIELDS if getattr(request, f) is not None and getattr(free, f) is None)
    if not pinned:
        return None
    try:
        best = make_plan(free, hardware)
    except ScaletrainError:
        return None
    if best.time is None or plan.time is None:
        return None
    mine, theirs = _differing(plan.setup, best.setup)
    return PinCost(pinned, tuple(mine), tuple(theirs), plan.time.step_seconds, best.time.step_seconds,
                   plan.memory.total_bytes, best.memory.total_bytes, plan.time.total_seconds,
                   best.time.total_seconds)


def row_versus(row: Any, plan: Plan, named: bool = True) -> str:
    """What an alternatives row (engine.plan.rows.AlternativeRow) differs in from the plan on screen, and what that
    changes: "−8.9 s +3.00 GiB: FSDP, 4×4" ('the plan above' for the plan's own choices); `named=False`: the change
    alone ("−8.9 s +3.00 GiB"), where the row's own cells show what differs."""
    s = plan.setup
    mine, _theirs = _differing(row_setup_view(row, s), s, short=True)
    if not mine:
        return "the plan above"
    dt = row.step_seconds - (plan.time.step_seconds if plan.time is not None else row.step_seconds)
    dm = row.per_gpu_bytes - plan.memory.total_bytes
    sign_t = "+" if dt >= 0 else "−"
    sign_m = "+" if dm >= 0 else "−"
    change = f"{sign_t}{fmt_seconds(abs(dt))} {sign_m}{fmt_bytes(abs(dm))}"
    return f"{change}: {', '.join(mine)}" if named else change


@dataclass(frozen=True)
class _RowSetup:
    strategy: Any
    offload: Any
    micro_batch: int
    grad_accum: int
    grad_ckpt: bool
    loss: Any


def row_setup_view(row: Any, s: Any) -> _RowSetup:
    """A row's planner choices in a setup's shape (a row keeps the plan's loss)."""
    return _RowSetup(row.strategy, row.offload, row.micro_batch, row.grad_accum, row.grad_ckpt, s.loss)

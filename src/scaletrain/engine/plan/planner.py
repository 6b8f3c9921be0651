"""The planner: a PlanRequest (what the user fixed) becomes a Plan (everything chosen, explained).

`make_plan(request)` is the single entry point every front end calls: resolve the hardware and model, then
either evaluate the fully fixed setup or search the free choices (search.py) and explain the pick in one
sentence. Whatever the user fixed, the planner keeps.
"""

from __future__ import annotations

from dataclasses import replace

from scaletrain.engine.catalog.hardware import Hardware
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.estimate.traced_blocks import ALSO_LOSSES
from scaletrain.engine.plan.lr import suggest_lr
from scaletrain.engine.plan.plan import Plan, PlannerReport, evaluate
from scaletrain.engine.request.request import PlanRequest, base_setup
from scaletrain.engine.request.fields import SEARCH_FIELDS
from scaletrain.engine.plan.search import (MAX_MICRO_BATCH_WITHOUT_TARGET, STRATEGY_ORDER,
                                           check_generation_batch,
                                           TIE_TOLERANCE, Candidate, SearchResult, SearchValue, search)
from scaletrain.engine.units import fmt_bytes, fmt_seconds
from scaletrain.engine.vocabulary import Offload


def make_plan(req: PlanRequest, hardware: Hardware | None = None) -> Plan:
    """Evaluate what the user fixed; let the planner fill in the rest (target batch, strategy, ...)."""
    setup = base_setup(req, hardware)
    if req.effective_batch is not None and req.micro_batch and req.grad_accum:
        got = req.micro_batch * req.grad_accum * setup.world_size
        if got != req.effective_batch:
            raise ScaletrainError(
                f"micro batch {req.micro_batch} × grad accum {req.grad_accum} × {setup.hardware.devices_text()} = {got}, "
                f"not the effective batch {req.effective_batch}; drop one of them and scaletrain solves it")
    if not _fully_fixed(req):
        return solve(req, setup)
    # every choice fixed: base_setup already holds them, nothing to search
    check_generation_batch(setup, setup.effective_batch)
    return finalize(evaluate(setup, headroom_fraction=req.headroom, name=req.name), req)


def _fully_fixed(req: PlanRequest) -> bool:
    return (req.micro_batch is not None and req.grad_accum is not None and req.strategy is not None
            and req.grad_ckpt is not None and req.offload is not None)


def fixed_fields(req: PlanRequest) -> dict[str, SearchValue]:
    """The SEARCH_FIELDS a PlanRequest set (None means free)."""
    out: dict[str, SearchValue] = {}
    for f in SEARCH_FIELDS:
        v = getattr(req, f)
        if v is not None:
            out[f] = v
    return out


def solve(req: PlanRequest, base: TrainingSetup) -> Plan:
    """Fill in what the request left free; raise ScaletrainError when no split hits the target or nothing fits."""
    fixed = fixed_fields(req)
    target = req.effective_batch
    # a traced model's chunked-loss regimes (_choose_loss searches them next) traced with the standard loss's
    ahead = ALSO_LOSSES.set(("chunked",) if req.loss is None and base.objective == "sft" else ())
    try:
        res = search(base, target=target, fixed=fixed, headroom=req.headroom, name=req.name)
    finally:
        ALSO_LOSSES.reset(ahead)
    res, loss_why = _choose_loss(req, base, res)
    if not res.ranked:
        raise ScaletrainError(_nothing_fits(base, res, req.headroom))
    best = res.ranked[0]
    report = PlannerReport(
        target_effective_batch=target, fixed=fixed, free=tuple(f for f in SEARCH_FIELDS if f not in fixed),
        evaluated=res.evaluated, fitting=len(res.ranked),
        micro_batch_rule=None if target is not None or "micro_batch" in fixed else
        f"largest micro batch that fits, at most {MAX_MICRO_BATCH_WITHOUT_TARGET}")
    return finalize(replace(best.plan, explanation=explain(best, res) + loss_why, planner=report), req)


def _choose_loss(req: PlanRequest, base: TrainingSetup, res: SearchResult) -> tuple[SearchResult, str]:
    """`--loss` left free: the standard loss, unless the chunked one (engine/estimate/chunked_loss.py) fits where it
    does not, or spares the CPU offload it needs, predicted faster. Where it would only let a larger micro batch or
    no checkpointing fit, predicted more than TIE_TOLERANCE faster, the plan says so and keeps the standard loss
    (its liger path is not yet measured on a GPU: the safe side). The chosen search, and what the explanation adds."""
    if req.loss is not None or base.objective != "sft":
        return res, ""
    try:
        chunked = base.with_(loss="chunked")
    except ScaletrainError:
        return res, ""
    alt = search(chunked, target=req.effective_batch, fixed=fixed_fields(req), headroom=req.headroom,
                 name=req.name)
    if not alt.ranked:
        return res, ""
    ck = alt.ranked[0]
    if not res.ranked:
        return alt, " --loss chunked because the standard loss's B·S·V logits fit in no configuration."
    std = res.ranked[0]
    a, b = ck.setup, std.setup
    gain = std.seconds_per_sample / ck.seconds_per_sample - 1
    if a.offload.rank < b.offload.rank and gain > 0:
        spared = "without offload" if a.offload is Offload.NONE else f"offloading only the {a.offload.value} states"
        return alt, (f" --loss chunked because without the B·S·V logits {ck.describe()} fits {spared}, "
                     f"predicted {gain:.0%} faster than the standard loss's best ({std.describe()}).")
    more = a.micro_batch > b.micro_batch or (b.grad_ckpt and not a.grad_ckpt)
    if more and gain > TIE_TOLERANCE:
        return res, (f" With --loss chunked (no B·S·V logits) {ck.describe()} would fit, predicted {gain:.0%} "
                     "faster.")
    return res, ""

def finalize(plan: Plan, req: PlanRequest) -> Plan:
    """Attach what every plan from a request carries: the learning-rate suggestion (when asked for)."""
    lr = suggest_lr(req.base_lr, req.base_batch, plan.setup.effective_batch)
    if lr is None:
        return plan
    return replace(plan, lr=lr, notes=plan.notes + (lr.describe(),))


def leanest_unfitting_plan(req: PlanRequest, hardware: Hardware) -> Plan | None:
    """When nothing the request allows fits: the leanest combination the search saw (memory only), to draw
    over the line. None when something fits, or the request cannot be searched at all."""
    try:
        res = search(base_setup(req, hardware), target=req.effective_batch, fixed=fixed_fields(req),
                     headroom=req.headroom, name=req.name)
    except ScaletrainError:
        return None
    return None if res.ranked or res.leanest is None else res.leanest.plan


def explain(best: Candidate, res: SearchResult) -> str:
    """One sentence: why this strategy, and why this split, from the engine's numbers."""
    s = best.setup
    m = best.plan.memory
    label = s.strategy.label
    usable = fmt_bytes(m.usable_bytes)
    per = s.hardware.device_noun
    if "strategy" in res.fixed:
        why = f"{label} as requested"
    elif s.strategy == "ddp":
        why = (f"DDP because a full replica's model states ({fmt_bytes(m.model_states_unsharded_bytes)}) fit "
               f"within {usable} per {per}")
    else:
        simpler = STRATEGY_ORDER[:STRATEGY_ORDER.index(s.strategy)]
        fitting = {c.setup.strategy for c in res.ranked}
        too_big = [res.leanest_by_strategy[x] for x in simpler
                   if x not in fitting and x in res.leanest_by_strategy]
        reasons = []
        if too_big:
            lean = min(too_big, key=lambda c: c.per_gpu_bytes)
            names = "/".join(c.setup.strategy.label for c in too_big)
            reasons.append(f"model states need {fmt_bytes(m.model_states_unsharded_bytes)} unsharded, so "
                           f"{names} cannot fit in {usable} per {per} ({lean.setup.strategy.label} needs at "
                           f"least {fmt_bytes(lean.per_gpu_bytes)})")
        runner_up = next((c for c in res.ranked if c.setup.strategy != s.strategy), None)
        if runner_up is not None and runner_up.seconds_per_sample <= best.seconds_per_sample * (1 + TIE_TOLERANCE):
            reasons.append(f"it ties with {runner_up.setup.strategy.label} within {TIE_TOLERANCE:.0%} "
                           f"({fmt_seconds(best.step_seconds)}/step) and is the simpler of the two")
        elif runner_up is not None:
            if runner_up.setup.effective_batch == s.effective_batch:
                mine, theirs, unit = best.step_seconds, runner_up.step_seconds, "step"
            else:   # no target: effective batches differ, compare per sample
                mine, theirs, unit = best.seconds_per_sample, runner_up.seconds_per_sample, "sample"
            reasons.append(f"it is predicted fastest of what fits ({fmt_seconds(mine)}/{unit}, "
                           f"{theirs / mine - 1:.0%} ahead of {runner_up.setup.strategy.label})")
        why = f"{label} because " + (" and ".join(reasons) if reasons else "it is the only strategy that fits")
    extras = []
    if s.offload != "none":
        extras.append(f"offload {s.offload}")
    extras.append("grad-ckpt on" if s.grad_ckpt else "grad-ckpt off")
    split = f"micro {s.micro_batch} × accum {s.grad_accum} × {s.hardware.devices_text()} = {s.effective_batch}"
    if res.target is None and "micro_batch" not in res.fixed:
        split += f" (no --effective-batch: the largest micro batch that fits, at most {MAX_MICRO_BATCH_WITHOUT_TARGET})"
    return (f"{why}; {split}, {', '.join(extras)}: {fmt_bytes(m.total_bytes)} of {usable} per {per}, "
            f"{fmt_seconds(best.step_seconds)}/step predicted.")


def _nothing_fits(base: TrainingSetup, res: SearchResult, headroom: float) -> str:
    lean = res.leanest
    where = base.hardware.describe() + (f" at effective batch {res.target}" if res.target else "")
    if lean is None:
        return f"nothing to evaluate on {where}: no strategy/offload combination is valid for these choices"
    usable = fmt_bytes(lean.plan.memory.usable_bytes)
    fixed = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in res.fixed.items())
    hint = f"; or drop {fixed} to let the planner choose" if fixed else ""
    split_fixed = [k for k in ("micro_batch", "grad_accum") if k in res.fixed]
    if res.target is not None and split_fixed:
        # the target itself may be reachable with another split: say which one
        rest = {k: v for k, v in res.fixed.items() if k not in split_fixed}
        alt = search(base, target=res.target, fixed=rest, headroom=headroom)
        if alt.ranked:
            b = alt.ranked[0].setup
            flags = " and ".join(f"--{k.replace('_', '-')}" for k in split_fixed)
            keep = ""
            if split_fixed == ["grad_accum"]:
                # nearest reachable with the user's accumulation: the largest micro batch that fits
                ga = res.fixed["grad_accum"]
                own = search(base, target=None, fixed={**rest, "grad_accum": ga}, headroom=headroom)
                if own.ranked:
                    reach = max(c.setup.effective_batch for c in own.ranked)
                    unit = ga * base.world_size
                    keep = (f", or keep --grad-accum {ga} at effective batch {reach}"
                            + (f" (or a smaller multiple of {unit})" if reach > unit else ""))
            return (f"micro batch {lean.setup.micro_batch} × accum {lean.setup.grad_accum} does not fit on {where} "
                    f"(the leanest option needs {fmt_bytes(lean.per_gpu_bytes)} per GPU, over the {usable} limit); "
                    f"effective batch {res.target} does fit as micro {b.micro_batch} × accum {b.grad_accum} × "
                    f"{b.world_size} GPUs: drop {flags}{keep}")
    return (f"nothing fits on {where}: the leanest option ({lean.describe()}) needs "
            f"{fmt_bytes(lean.per_gpu_bytes)} per GPU, over the {usable} limit ({headroom:.0%} headroom); "
            f"try more GPUs, --method lora or qlora, or a shorter --seq-len{hint}")



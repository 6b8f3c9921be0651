"""Batch planner: effective batch → strategy × micro batch × accumulation × checkpointing × offload.

The seeds do `effective = micro × accum × GPUs` by hand and guess the rest. The planner enumerates every
combination the user left free, keeps those that hit the target exactly and fit under the headroom (memory
model), and picks the fastest (time model). Memory grows with the micro batch and time per sample falls with
it, so each configuration's best split is found by a binary search over the divisors of the per-GPU batch.
What the user fixed is never changed. Alternatives and the `--table` views come from the same search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterable

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog.hardware import GPU_CATALOG, Hardware
from scaletrain.engine.plan.lr import suggest_lr
from scaletrain.engine.model.memory import estimate_memory
from scaletrain.engine.plan.plan import Plan, evaluate
from scaletrain.engine.model.setup import TrainingSetup
from scaletrain.engine.units import fmt_bytes, fmt_seconds
from scaletrain.engine.vocabulary import Offload, Strategy

# simplest first: breaks exact ties (FSDP shards like ZeRO-3 but is one wrapper, no DeepSpeed)
STRATEGY_ORDER = (Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.FSDP, Strategy.ZERO3)
# Without --effective-batch the planner fills each GPU up to this micro batch (seed 003 runs 16 per GPU); past it,
# GEMM utilization gains are small and the implied effective batch stops being a fine-tuning batch.
MAX_MICRO_BATCH_WITHOUT_TARGET = 16
# Largest micro batch a split search considers (divisors above it are skipped; they never fit an LLM step).
MAX_MICRO_BATCH = 1024
TOP_ALTERNATIVES = 5
# Predicted times closer than this are a tie (well inside the time model's error): the simpler setup wins —
# fewer sharding stages, no offload, no checkpointing, then the larger micro batch.
TIE_TOLERANCE = 0.01
# --table gpus: GPUs per node tried for each catalog GPU, then two full nodes (inter-node link in play).
TABLE_GPU_COUNTS = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8))
SEARCH_FIELDS = ("strategy", "offload", "grad_ckpt", "micro_batch", "grad_accum")


# ---- search ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """One evaluated combination."""

    plan: Plan

    @property
    def setup(self) -> TrainingSetup:
        return self.plan.setup

    @property
    def fits(self) -> bool:
        return self.plan.fits

    @property
    def per_gpu_bytes(self) -> int:
        return self.plan.memory.total_bytes

    @property
    def step_seconds(self) -> float:
        return self.plan.time.step_seconds

    @property
    def seconds_per_sample(self) -> float:
        return self.step_seconds / self.setup.effective_batch

    def key(self) -> tuple:
        return search_key(self.setup)

    def rank_key(self) -> tuple:
        s = self.setup
        return (self.seconds_per_sample, STRATEGY_ORDER.index(s.strategy), s.offload.rank,
                s.grad_ckpt, -s.micro_batch)

    def simplicity_key(self) -> tuple:
        s = self.setup
        return (STRATEGY_ORDER.index(s.strategy), s.offload.rank, s.grad_ckpt, -s.micro_batch,
                self.seconds_per_sample)

    def describe(self) -> str:
        s = self.setup
        parts = [s.strategy.label]
        if s.offload != "none":
            parts.append(f"offload {s.offload}")
        parts.append(f"micro {s.micro_batch} × accum {s.grad_accum}")
        parts.append("grad-ckpt" if s.grad_ckpt else "no grad-ckpt")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        s = self.setup
        t = self.plan.time
        return {
            "strategy": s.strategy, "offload": s.offload, "grad_ckpt": s.grad_ckpt,
            "micro_batch": s.micro_batch, "grad_accum": s.grad_accum, "world_size": s.world_size,
            "effective_batch": s.effective_batch, "per_gpu_bytes": self.per_gpu_bytes,
            "usable_bytes": self.plan.memory.usable_bytes, "fits": self.fits, "peak_phase": self.plan.memory.peak_phase,
            "step_seconds": t.step_seconds, "tokens_per_second": t.tokens_per_second,
            "epoch_seconds": t.epoch_seconds, "mfu": t.mfu,
        }


@dataclass(frozen=True)
class SearchResult:
    target: int | None
    ranked: tuple[Candidate, ...]          # fitting candidates, fastest first
    leanest: Candidate | None              # the smallest per-GPU total seen (fitting or not)
    leanest_by_strategy: dict[str, Candidate]
    evaluated: int
    fixed: dict[str, Any]


def search_key(s: TrainingSetup) -> tuple:
    """The SEARCH_FIELDS values of a setup: what the planner chooses."""
    return tuple(getattr(s, f) for f in SEARCH_FIELDS)


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending."""
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


def _nearest(target: int, unit: int) -> list[int]:
    lower = target // unit * unit
    return [x for x in (lower, lower + unit) if x >= unit and x != target]


def check_target(target: int, world: int, micro: int | None = None, accum: int | None = None) -> None:
    """Raise one clear line when micro × accum × world cannot equal `target`."""
    if isinstance(target, bool) or not isinstance(target, int) or target < 1:
        raise ScaletrainError(f"--effective-batch must be a whole number ≥ 1 (got {target!r})")
    if target < world:
        raise ScaletrainError(
            f"effective batch {target} is below the GPU count {world}: every GPU takes at least one sample per "
            f"step, so the smallest reachable effective batch is {world}; or plan for {target} GPU(s) or fewer")
    unit = world * (micro or 1) * (accum or 1)
    if target % unit:
        fixed = " × ".join(x for x in (f"micro batch {micro}" if micro else "", f"grad accum {accum}" if accum else "",
                                       f"{world} GPUs") if x)
        prime = f" ({target} is prime)" if _is_prime(target) else ""
        near = " or ".join(str(x) for x in _nearest(target, unit))
        raise ScaletrainError(
            f"effective batch {target}{prime} is not a multiple of {fixed} = {unit}, so no split hits it exactly; "
            f"nearest reachable: {near}")


def _configs(base: TrainingSetup, fixed: dict[str, Any]) -> Iterable[TrainingSetup]:
    """Every valid strategy × offload × checkpointing setup allowed by what the user fixed."""
    strategies = (fixed["strategy"],) if "strategy" in fixed else STRATEGY_ORDER
    ckpts = (fixed["grad_ckpt"],) if "grad_ckpt" in fixed else (False, True)
    for strategy in strategies:
        # only the offloads the strategy allows: FSDP's CPUOffload moves parameters, gradients and the step
        # together, so the planner proposes FSDP offload as "all" only (Strategy.allows_offload)
        offloads: tuple[str, ...] = Strategy(strategy).offloads()
        if "offload" in fixed:
            offloads = (fixed["offload"],) if fixed["offload"] in offloads or "strategy" in fixed else ()
        for offload in offloads:
            for ckpt in ckpts:
                try:
                    yield base.with_(strategy=strategy, offload=offload, grad_ckpt=ckpt)
                except ScaletrainError:
                    continue   # a combination the stack does not support (e.g. offload with DDP)


def search(base: TrainingSetup, *, target: int | None, fixed: dict[str, Any], headroom: float = 0.10,
           name: str = "plan") -> SearchResult:
    """Best split of every allowed configuration; `fixed` holds the SEARCH_FIELDS the user set.

    For one strategy × offload × checkpointing configuration, memory grows with the micro batch (at a fixed
    accumulation > 1) and predicted time per sample falls with it (better GEMM utilization, fewer gathers per
    sample), so its best split is the largest micro batch that fits: a binary search over the divisors. The
    accumulation-free split has no persistent gradient buffers and is checked on its own.
    """
    world = base.world_size
    mb_fixed, ga_fixed = fixed.get("micro_batch"), fixed.get("grad_accum")
    if target is not None:
        check_target(target, world, mb_fixed, ga_fixed)
    fitting: list[Candidate] = []
    leanest: Candidate | None = None
    leanest_by: dict[str, Candidate] = {}
    probes = 0

    def probe(cfg: TrainingSetup, split: tuple[int, int]) -> Candidate:
        nonlocal leanest, probes
        probes += 1
        setup = cfg.with_(micro_batch=split[0], grad_accum=split[1])
        c = Candidate(Plan(setup=setup, memory=estimate_memory(setup, headroom), name=name))
        if leanest is None or c.per_gpu_bytes < leanest.per_gpu_bytes:
            leanest = c
        cur = leanest_by.get(setup.strategy)
        if cur is None or c.per_gpu_bytes < cur.per_gpu_bytes:
            leanest_by[setup.strategy] = c
        return c

    # the candidate splits depend on the target and the fixed split only: the same for every configuration
    if target is not None:
        per_gpu = target // world
        if mb_fixed:
            splits = [(mb_fixed, per_gpu // mb_fixed)]
        elif ga_fixed:
            splits = [(per_gpu // ga_fixed, ga_fixed)]
        else:
            splits = [(d, per_gpu // d) for d in divisors(per_gpu) if d <= MAX_MICRO_BATCH]
    elif mb_fixed:
        splits = [(mb_fixed, ga_fixed or 1)]
    else:
        splits = [(m, ga_fixed or 1) for m in range(1, MAX_MICRO_BATCH_WITHOUT_TARGET + 1)]
    special = splits[-1] if len(splits) > 1 and splits[-1][1] == 1 and splits[0][1] > 1 else None
    monotone = splits[:-1] if special else splits

    for cfg in _configs(base, fixed):
        best = _largest_fitting(cfg, monotone, probe)
        if special is not None and (best is None or best.setup.micro_batch < special[0]):
            c = probe(cfg, special)
            if c.fits:
                best = c
        if best is not None:
            fitting.append(Candidate(evaluate(best.setup, headroom_fraction=headroom, name=name)))
    return SearchResult(target, _rank(fitting), leanest, leanest_by, probes, dict(fixed))


def _largest_fitting(cfg: TrainingSetup, splits: list[tuple[int, int]], probe) -> Candidate | None:
    """Binary search the last split that fits, assuming memory rises along `splits`."""
    first = probe(cfg, splits[0])
    if not first.fits:
        return None
    lo, hi, best = 0, len(splits), first
    while hi - lo > 1:
        mid = (lo + hi) // 2
        c = probe(cfg, splits[mid])
        if c.fits:
            lo, best = mid, c
        else:
            hi = mid
    return best


def _rank(fitting: list[Candidate]) -> tuple[Candidate, ...]:
    """Fastest first; candidates tied with the fastest (TIE_TOLERANCE) are ordered simplest first."""
    ranked = sorted(fitting, key=Candidate.rank_key)
    if not ranked:
        return ()
    limit = ranked[0].seconds_per_sample * (1.0 + TIE_TOLERANCE)
    n_tied = sum(1 for c in ranked if c.seconds_per_sample <= limit)
    return tuple(sorted(ranked[:n_tied], key=Candidate.simplicity_key) + ranked[n_tied:])


# ---- from a request --------------------------------------------------------------------------------------------
def fixed_fields(req: Any) -> dict[str, Any]:
    """The SEARCH_FIELDS a PlanRequest set (None means free)."""
    return {f: getattr(req, f) for f in SEARCH_FIELDS if getattr(req, f, None) is not None}


def solve(req: Any, base: TrainingSetup) -> Plan:
    """Fill in what the request left free; raise ScaletrainError when no split hits the target or nothing fits."""
    fixed = fixed_fields(req)
    target = req.effective_batch
    res = search(base, target=target, fixed=fixed, headroom=req.headroom, name=req.name)
    if not res.ranked:
        raise ScaletrainError(_nothing_fits(base, res, req.headroom))
    best = res.ranked[0]
    explanation = explain(best, res)
    plan = replace(best.plan, explanation=explanation, extras={
        **best.plan.extras,
        "planner": {
            "target_effective_batch": target,
            "fixed": fixed,
            "free": [f for f in SEARCH_FIELDS if f not in fixed],
            "evaluated": res.evaluated,
            "fitting": len(res.ranked),
            "objective": "predicted seconds per sample (per optimizer step at a fixed effective batch)",
            "micro_batch_rule": None if target is not None or "micro_batch" in fixed else
            f"largest micro batch that fits, at most {MAX_MICRO_BATCH_WITHOUT_TARGET}",
        },
    })
    return finalize(plan, req)


def finalize(plan: Plan, req: Any) -> Plan:
    """Attach what every plan from a request carries: the learning-rate suggestion (when asked for)."""
    lr = suggest_lr(getattr(req, "base_lr", None), getattr(req, "base_batch", None), plan.setup.effective_batch)
    if lr is None:
        return plan
    return replace(plan, extras={**plan.extras, "lr": lr.to_json()}, notes=plan.notes + (lr.describe(),))


def explain(best: Candidate, res: SearchResult) -> str:
    """One sentence: why this strategy, and why this split, from the engine's numbers."""
    s = best.setup
    m = best.plan.memory
    label = s.strategy.label
    usable = fmt_bytes(m.usable_bytes)
    if "strategy" in res.fixed:
        why = f"{label} as requested"
    elif s.strategy == "ddp":
        why = (f"DDP because a full replica's model states ({fmt_bytes(m.model_states_unsharded_bytes)}) fit "
               f"within {usable} per GPU")
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
                           f"{names} cannot fit in {usable} per GPU ({lean.setup.strategy.label} needs at "
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
    split = f"micro {s.micro_batch} × accum {s.grad_accum} × {s.world_size} GPUs = {s.effective_batch}"
    if res.target is None and "micro_batch" not in res.fixed:
        split += f" (no --effective-batch: the largest micro batch that fits, at most {MAX_MICRO_BATCH_WITHOUT_TARGET})"
    return (f"{why}; {split}, {', '.join(extras)}: {fmt_bytes(m.total_bytes)} of {usable} per GPU, "
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


# ---- alternatives and tables -------------------------------------------------------------------------------------
def rank_alternatives(plan: Plan, top: int = TOP_ALTERNATIVES) -> list[dict[str, Any]]:
    """The ranked fitting options at this plan's effective batch, honouring what the user fixed (a fully fixed
    plan frees the search fields, so it gets something to compare against)."""
    fixed = dict(plan.extras.get("planner", {}).get("fixed", {}))
    s = plan.setup
    if set(SEARCH_FIELDS) <= set(fixed):
        fixed = {}
    res = search(s, target=s.effective_batch, fixed=fixed, headroom=plan.memory.headroom_fraction, name=plan.name)
    out = []
    current = search_key(s)
    for rank, c in enumerate(res.ranked[:top], start=1):
        row = c.to_json()
        row["rank"] = rank
        row["chosen"] = c.key() == current
        row["description"] = c.describe()
        out.append(row)
    return out


def batch_table(plan: Plan, max_rows: int = 12) -> list[dict[str, Any]]:
    """Micro batch 1, 2, 4, … vs per-GPU memory and fit for the plan's strategy (seed 004's table), keeping the
    effective batch through accumulation where the micro batch divides it. Stops two rows after the last fit."""
    s = plan.setup
    hr = plan.memory.headroom_fraction
    per_gpu = s.effective_batch // s.world_size
    micros = sorted({2 ** k for k in range(0, 11)} | {s.micro_batch})
    rows: list[dict[str, Any]] = []
    misses = 0
    for mb in micros:
        ga = per_gpu // mb if per_gpu % mb == 0 else s.grad_accum
        p = evaluate(s.with_(micro_batch=mb, grad_accum=ga), headroom_fraction=hr, name=plan.name)
        m = p.memory
        rows.append({
            "micro_batch": mb, "grad_accum": ga, "effective_batch": p.setup.effective_batch,
            "keeps_effective_batch": p.setup.effective_batch == s.effective_batch,
            "per_gpu_bytes": m.total_bytes, "activations_bytes": m.activations_bytes, "logits_bytes": m.logits_bytes,
            "usable_bytes": m.usable_bytes, "fits": m.fits, "headroom_bytes": m.headroom_bytes,
            "step_seconds": p.time.step_seconds, "tokens_per_second": p.time.tokens_per_second,
            "current": mb == s.micro_batch,
        })
        misses = 0 if m.fits else misses + 1
        if (misses >= 2 and mb > s.micro_batch) or len(rows) >= max_rows:
            break
    return rows


def gpus_table(plan: Plan, counts: tuple[tuple[int, int], ...] = TABLE_GPU_COUNTS) -> list[dict[str, Any]]:
    """Each catalog GPU × count at this plan's effective batch: fits?, the planner's choice, its time."""
    s = plan.setup
    return [_gpus_row(plan, Hardware(gpu=gpu, gpus_per_node=per_node, nodes=nodes,
                                     inter_node_gbit_s=s.hardware.inter_node_gbit_s))
            for gpu in GPU_CATALOG for nodes, per_node in counts]


def _gpus_row(plan: Plan, hw: Hardware) -> dict[str, Any]:
    """One `--table gpus` row: the planner's choice on `hw`, or why nothing is chosen."""
    s = plan.setup
    gpu = hw.gpu
    target = s.effective_batch
    row: dict[str, Any] = {"gpu": gpu.key, "gpu_memory_bytes": gpu.memory_bytes, "nodes": hw.nodes,
                           "gpus_per_node": hw.gpus_per_node, "world_size": hw.world_size, "fits": False}
    if s.precision == "bf16" and s.device == "cuda" and not gpu.supports_bf16:
        row["reason"] = "no bf16 support (plan with --precision fp16)"
        return row
    if target % hw.world_size:
        row["reason"] = f"{target} is not a multiple of {hw.world_size} GPUs"
        return row
    try:
        res = search(s.with_(hardware=hw), target=target, fixed={}, headroom=plan.memory.headroom_fraction,
                     name=plan.name)
    except ScaletrainError as e:
        row["reason"] = str(e)
        return row
    if not res.ranked:
        lean = res.leanest
        row["reason"] = f"needs ≥ {fmt_bytes(lean.per_gpu_bytes)} per GPU" if lean else "no valid combination"
        row["per_gpu_bytes"] = lean.per_gpu_bytes if lean else None
        return row
    best = res.ranked[0]
    row.update(best.to_json())
    row["fits"] = True
    row["description"] = best.describe()
    return row


def with_tables(plan: Plan, *, alternatives: bool = False, table: str | None = None) -> Plan:
    """The plan with `alternatives` / `table` added to its extras (and so to `plan --json`)."""
    tables = {"batch": batch_table, "gpus": gpus_table}
    if table is not None and table not in tables:   # refuse before any search runs
        raise ScaletrainError(f"--table {table!r} is not accepted; use batch or gpus")
    extras = dict(plan.extras)
    if alternatives:
        extras["alternatives"] = rank_alternatives(plan)
    if table is not None:
        extras["table"] = {"kind": table, "rows": tables[table](plan)}
    return replace(plan, extras=extras)

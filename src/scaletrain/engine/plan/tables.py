"""What `plan --alternatives` and `plan --table batch|gpus` add to a plan, from the same search as the plan.

    alternatives  the ranked fitting options at the plan's effective batch (what the user fixed stays fixed)
    batch         micro batch 1, 2, 4, … against per-GPU memory and fit at the plan's strategy (seed 004's table)
    gpus          every catalog GPU × count: does it fit, the planner's choice there, its time and cost (--sort
                  time|cost ranks them)
"""

from __future__ import annotations

import math
from dataclasses import replace

from scaletrain.engine.catalog.hardware import GPU_CATALOG, Hardware
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.plan.cost import PriceTable, hardware_cost
from scaletrain.engine.plan.plan import Plan, evaluate
from scaletrain.engine.plan.rows import AlternativeRow, BatchRow, GpuRow, PlanTable
from scaletrain.engine.plan.search import search, search_key
from scaletrain.engine.request.fields import SEARCH_FIELDS
from scaletrain.engine.units import fmt_bytes

TOP_ALTERNATIVES = 5
# --table gpus: GPUs per node tried for each catalog GPU, then two full nodes (inter-node link in play).
TABLE_GPU_COUNTS = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8))
TABLE_KINDS = ("batch", "gpus")
TABLE_SORTS = ("time", "cost")        # --table gpus --sort: fastest or cheapest first


def rank_alternatives(plan: Plan, top: int = TOP_ALTERNATIVES) -> tuple[AlternativeRow, ...]:
    """The ranked fitting options at this plan's effective batch, honouring what the user fixed (a fully fixed
    plan frees the search fields, so it gets something to compare against)."""
    fixed = dict(plan.planner.fixed) if plan.planner is not None else {}
    s = plan.setup
    if set(SEARCH_FIELDS) <= set(fixed):
        fixed = {}
    res = search(s, target=s.effective_batch, fixed=fixed, headroom=plan.memory.headroom_fraction, name=plan.name)
    current = search_key(s)
    return tuple(AlternativeRow(**vars(c.choice()), rank=rank, chosen=c.key() == current)
                 for rank, c in enumerate(res.ranked[:top], start=1))


def batch_table(plan: Plan, max_rows: int = 12) -> tuple[BatchRow, ...]:
    """Micro batch 1, 2, 4, … vs per-GPU memory and fit for the plan's strategy (seed 004's table), keeping the
    effective batch through accumulation where the micro batch divides it. Stops two rows after the last fit."""
    s = plan.setup
    hr = plan.memory.headroom_fraction
    per_gpu = s.effective_batch // s.world_size
    micros = sorted({2 ** k for k in range(0, 11)} | {s.micro_batch})
    rows: list[BatchRow] = []
    misses = 0
    for mb in micros:
        ga = per_gpu // mb if per_gpu % mb == 0 else s.grad_accum
        p = evaluate(s.with_(micro_batch=mb, grad_accum=ga), headroom_fraction=hr, name=plan.name)
        m, t = p.memory, p.time
        assert t is not None
        rows.append(BatchRow(
            micro_batch=mb, grad_accum=ga, effective_batch=p.setup.effective_batch,
            keeps_effective_batch=p.setup.effective_batch == s.effective_batch,
            per_gpu_bytes=m.total_bytes, activations_bytes=m.activations_bytes, logits_bytes=m.logits_bytes,
            usable_bytes=m.usable_bytes, fits=m.fits, headroom_bytes=m.headroom_bytes,
            step_seconds=t.step_seconds, tokens_per_second=t.tokens_per_second, current=mb == s.micro_batch))
        misses = 0 if m.fits else misses + 1
        if (misses >= 2 and mb > s.micro_batch) or len(rows) >= max_rows:
            break
    return tuple(rows)


def gpus_table(plan: Plan, counts: tuple[tuple[int, int], ...] = TABLE_GPU_COUNTS,
               prices: PriceTable | None = None, sort: str | None = None) -> tuple[GpuRow, ...]:
    """Each catalog GPU × count at this plan's effective batch: fits?, the planner's choice, its time and (with
    `prices`) its cost over the plan's steps; `sort` "time" or "cost" ranks the fitting rows (the others follow in
    catalog order)."""
    s = plan.setup
    rows = tuple(_gpus_row(plan, Hardware(gpu=gpu, gpus_per_node=per_node, nodes=nodes,
                                          inter_node_gbit_s=s.hardware.inter_node_gbit_s))
                 for gpu in GPU_CATALOG for nodes, per_node in counts)
    if prices is not None:
        steps = plan.time.total_steps if plan.time is not None else None
        rows = tuple(replace(r, cost=hardware_cost(r.gpu, r.world_size, r.choice.step_seconds * steps
                                                   if steps is not None else None, r.choice.step_seconds, prices))
                     if r.choice is not None else r for r in rows)
    return sort_gpu_rows(rows, sort) if sort else rows


def sort_gpu_rows(rows: tuple[GpuRow, ...], by: str) -> tuple[GpuRow, ...]:
    """Fitting rows fastest first ("time": seconds per optimizer step, the same steps on every row) or cheapest
    first ("cost": the cost of a step; rows without a price after the priced ones); the rest keep their order."""
    if by not in TABLE_SORTS:
        raise ScaletrainError(f"--sort {by!r} is not accepted; use {' or '.join(TABLE_SORTS)}")

    def key(r: GpuRow) -> tuple[float, float]:
        assert r.choice is not None
        step = r.choice.step_seconds
        if by == "time":
            return (step, 0.0)
        per_step = r.cost.per_step if r.cost is not None else None
        return (math.inf, step) if per_step is None else (per_step, step)

    fitting = sorted((r for r in rows if r.choice is not None), key=key)
    return tuple(fitting) + tuple(r for r in rows if r.choice is None)


def _gpus_row(plan: Plan, hw: Hardware) -> GpuRow:
    """One `--table gpus` row: the planner's choice on `hw`, or why nothing is chosen."""
    s = plan.setup
    gpu = hw.gpu
    target = s.effective_batch
    row = GpuRow(gpu=gpu.key, gpu_memory_bytes=hw.memory_per_process_bytes, nodes=hw.nodes,
                 gpus_per_node=hw.gpus_per_node, world_size=hw.world_size)
    if s.precision == "bf16" and s.device == "cuda" and not gpu.supports_bf16:
        return replace(row, reason="no bf16 support (plan with --precision fp16)")
    if target % hw.world_size:
        return replace(row, reason=f"{target} is not a multiple of {hw.world_size} GPUs")
    try:
        res = search(s.with_(hardware=hw), target=target, fixed={}, headroom=plan.memory.headroom_fraction,
                     name=plan.name)
    except ScaletrainError as e:
        return replace(row, reason=str(e))
    if not res.ranked:
        lean = res.leanest
        return replace(row, reason=f"needs ≥ {fmt_bytes(lean.per_gpu_bytes)} per GPU" if lean else
                       "no valid combination", searched=True, needs_bytes=lean.per_gpu_bytes if lean else None)
    return replace(row, choice=res.ranked[0].choice())


def with_tables(plan: Plan, *, alternatives: bool = False, table: str | None = None,
                prices: PriceTable | None = None, sort: str | None = None) -> Plan:
    """The plan with its ranked `alternatives` and/or a `table` (and so `plan --json` with them); `prices` and
    `sort` for the gpus table (cost per row, ranked by time or cost)."""
    if table is not None and table not in TABLE_KINDS:   # refuse before any search runs
        raise ScaletrainError(f"--table {table!r} is not accepted; use batch or gpus")
    if sort is not None and table != "gpus":
        raise ScaletrainError(f"--sort {sort} ranks the rows of --table gpus; give --table gpus too")
    if sort is not None and sort not in TABLE_SORTS:
        raise ScaletrainError(f"--sort {sort!r} is not accepted; use {' or '.join(TABLE_SORTS)}")
    if alternatives:
        plan = replace(plan, alternatives=rank_alternatives(plan))
    if table == "batch":
        plan = replace(plan, table=PlanTable(table, batch_table(plan)))
    elif table == "gpus":
        plan = replace(plan, table=PlanTable(table, gpus_table(plan, prices=prices, sort=sort)))
    return plan

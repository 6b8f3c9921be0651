"""The whole job at its last step: every rank on every node against the plan (issue 23).

The trainer gathers each rank's peaks and telemetry (run/rank_telemetry.py) into metrics.jsonl; this module turns
the latest record into what the monitor and `monitor --headless` show: nodes as rows, one cell per rank, the
stragglers and the memory imbalance named in one line each, and a one-line job summary. Every number here is
computed once, in the engine; the front ends only lay it out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from scaletrain.engine.run.metrics import RankMemory, StepMetrics
from scaletrain.engine.run.plan_document import PlanDocument
from scaletrain.engine.units import fmt_bytes, fmt_seconds

# A straggler's step (or its wait for data) is this fraction of the median step above the median. Synchronous data
# parallelism runs at the slowest rank's pace, so a rank 20 % behind costs the whole job 20 %: worth a line.
STRAGGLER_FRACTION = 0.20
# Data-parallel ranks hold the same states and the same batch shape: peaks further apart than this share of the
# largest are named (uneven sequence lengths, rank 0's extra work, another process on the GPU).
IMBALANCE_FRACTION = 0.10


@dataclass(frozen=True)
class RankCell:
    """One rank as the job grid shows it."""

    rank: int
    node: int | None
    local_rank: int | None
    host: str | None
    measured_bytes: int | None          # allocated peak (GPU) or peak RSS (CPU run)
    predicted_bytes: int | None         # the plan's allocated peak (GPU) or its tensors per process (CPU run)
    on_gpu: bool = True
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None     # NVML: the whole device
    memory_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    throttle: tuple[str, ...] | None = None
    step_seconds: float | None = None
    data_wait_seconds: float | None = None
    straggler: bool = False

    @property
    def of_plan(self) -> float | None:
        """Measured peak ÷ the plan's prediction (a CPU run's RSS holds the Python runtime besides the tensors the
        plan predicts: no ratio)."""
        if not self.on_gpu or self.measured_bytes is None or not self.predicted_bytes:
            return None
        return self.measured_bytes / self.predicted_bytes


@dataclass(frozen=True)
class NodeRow:
    node: int | None
    host: str | None
    cells: tuple[RankCell, ...]


@dataclass(frozen=True)
class JobView:
    nodes: tuple[NodeRow, ...]
    step: int | None = None
    stragglers_line: str | None = None
    imbalance_line: str | None = None
    summary_parts: tuple[str, ...] = ()     # the job line's parts, most important first

    @property
    def summary_line(self) -> str | None:
        return " · ".join(self.summary_parts) if self.summary_parts else None

    @property
    def cells(self) -> tuple[RankCell, ...]:
        return tuple(c for n in self.nodes for c in n.cells)

    @property
    def rank_count(self) -> int:
        return len(self.cells)


def rank_node(rank: int, m: RankMemory, ranks_per_node: int | None) -> int | None:
    """The rank's node: what it reported, else torchrun's node-major numbering (rank = node × per node + local)."""
    if m.node is not None:
        return m.node
    return rank // ranks_per_node if ranks_per_node else None


def job_view(plan: PlanDocument | None, rec: StepMetrics | None) -> JobView:
    """The job at step `rec` (None before the first step: no ranks yet)."""
    if rec is None or not rec.peak_memory:
        return JobView(())
    doc = plan or PlanDocument({})
    per_node = doc.gpus_per_node
    cells = [_cell(m, doc, per_node) for m in sorted(rec.peak_memory, key=lambda m: m.rank)]
    slow = _stragglers(cells)
    cells = [c if c.rank not in slow else _mark(c) for c in cells]
    rows: dict[int | None, list[RankCell]] = {}
    for c in cells:
        rows.setdefault(c.node, []).append(c)
    nodes = tuple(NodeRow(n, next((c.host for c in cs if c.host), None), tuple(cs))
                  for n, cs in sorted(rows.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))
    return JobView(nodes, rec.step, _stragglers_line(cells, slow), _imbalance_line(cells),
                   _summary_parts(nodes, cells, rec))


def _cell(m: RankMemory, doc: PlanDocument, per_node: int | None) -> RankCell:
    on_gpu = m.allocated_bytes is not None
    t = m.telemetry
    return RankCell(
        rank=m.rank, node=rank_node(m.rank, m, per_node),
        local_rank=t.local_rank if t is not None and t.local_rank is not None
        else (m.rank % per_node if per_node else None),
        host=t.host if t is not None else None,
        measured_bytes=m.allocated_bytes if on_gpu else m.host_rss_bytes,
        predicted_bytes=doc.allocated_peak_bytes if on_gpu else doc.predicted_total_bytes, on_gpu=on_gpu,
        utilization_pct=t.gpu_utilization_pct if t else None,
        memory_used_bytes=t.gpu_memory_used_bytes if t else None,
        memory_total_bytes=t.gpu_memory_total_bytes if t else None,
        temperature_c=t.gpu_temperature_c if t else None, power_w=t.gpu_power_w if t else None,
        throttle=t.throttle_reasons if t else None,
        step_seconds=t.step_seconds if t else None, data_wait_seconds=t.data_wait_seconds if t else None)


def _mark(c: RankCell) -> RankCell:
    return replace(c, straggler=True)


def _stragglers(cells: list[RankCell]) -> set[int]:
    """Ranks whose step, or wait for data, is STRAGGLER_FRACTION of the median step above the median."""
    steps = [c.step_seconds for c in cells if c.step_seconds is not None]
    if len(steps) < 2:
        return set()
    med_step = statistics.median(steps)
    waits = [c.data_wait_seconds for c in cells if c.data_wait_seconds is not None]
    med_wait = statistics.median(waits) if waits else 0.0
    margin = STRAGGLER_FRACTION * med_step
    return {c.rank for c in cells
            if (c.step_seconds is not None and c.step_seconds > med_step + margin)
            or (c.data_wait_seconds is not None and c.data_wait_seconds > med_wait + margin)}


def _where(c: RankCell) -> str:
    return f"rank {c.rank}" + (f" (node {c.node})" if c.node is not None else "")


def _stragglers_line(cells: list[RankCell], slow: set[int]) -> str | None:
    if not slow:
        return None
    steps = [c.step_seconds for c in cells if c.step_seconds is not None]
    med = statistics.median(steps)
    parts = []
    for c in (c for c in cells if c.rank in slow):
        what = (f"waits {fmt_seconds(c.data_wait_seconds)} for data" if c.data_wait_seconds is not None
                and c.data_wait_seconds > STRAGGLER_FRACTION * med else f"steps in {fmt_seconds(c.step_seconds or 0)}")
        parts.append(f"{_where(c)} {what}")
    return f"straggler{'s' if len(parts) > 1 else ''}: " + "; ".join(parts) + f" (median step {fmt_seconds(med)})"


def _imbalance_line(cells: list[RankCell]) -> str | None:
    peaks = [c for c in cells if c.measured_bytes is not None]
    if len(peaks) < 2:
        return None
    hi = max(peaks, key=lambda c: c.measured_bytes or 0)
    lo = min(peaks, key=lambda c: c.measured_bytes or 0)
    assert hi.measured_bytes is not None and lo.measured_bytes is not None
    if hi.measured_bytes <= 0 or (hi.measured_bytes - lo.measured_bytes) / hi.measured_bytes <= IMBALANCE_FRACTION:
        return None
    share = hi.measured_bytes / lo.measured_bytes - 1 if lo.measured_bytes else float("inf")
    return (f"memory imbalance: {_where(hi)} peaks at {fmt_bytes(hi.measured_bytes)}, {share:.0%} above "
            f"{_where(lo)}'s {fmt_bytes(lo.measured_bytes)}")


def _summary_parts(nodes: tuple[NodeRow, ...], cells: list[RankCell], rec: StepMetrics) -> tuple[str, ...]:
    """`monitor --headless`'s job line: ranks and nodes, the highest peak against the plan, utilization, steps."""
    n_nodes = len([n for n in nodes if n.node is not None]) or 1
    parts = [f"step {rec.step}: {len(cells)} rank{'s' if len(cells) != 1 else ''}, {n_nodes} "
             f"node{'s' if n_nodes != 1 else ''}"]
    top = max((c for c in cells if c.measured_bytes is not None),
              key=lambda c: (c.of_plan or 0.0, c.measured_bytes or 0), default=None)
    if top is not None and top.measured_bytes is not None:
        where = f"rank {top.rank}" + (f", node {top.node}" if top.node is not None else "")
        parts.append(f"peak {top.of_plan:.0%} of plan: {where}" if top.of_plan is not None
                     else f"highest peak {fmt_bytes(top.measured_bytes)}: {where}")
    utils = [c.utilization_pct for c in cells if c.utilization_pct is not None]
    if utils:
        parts.append(f"util {min(utils):.0f}–{max(utils):.0f} %")
    steps = [c for c in cells if c.step_seconds is not None]
    if steps:
        slowest = max(steps, key=lambda c: c.step_seconds or 0)
        parts.append(f"step median {fmt_seconds(statistics.median(c.step_seconds or 0 for c in steps))}, slowest "
                     f"{_where(slowest)} {fmt_seconds(slowest.step_seconds or 0)}")
    return tuple(parts)

"""What the other ranks measured when one failed (issue 23): the failing rank's node, the surviving ranks' last
peaks against the plan, and the measured ÷ predicted peak that scales the memory remedies.

The trainer logs every rank's peaks (and node, host and device telemetry) at each optimizer step
(run/rank_telemetry.py); the last record before the failure is what the job knew. `job_view` turns it into cells
with their node and their share of the plan, so the doctor and the monitor say the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from scaletrain.engine.doctor.remedies import Remedy
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.run.metrics import StepMetrics
from scaletrain.engine.run.plan_document import PlanDocument
from scaletrain.engine.sampling.job_view import JobView, RankCell, job_view
from scaletrain.engine.units import fmt_bytes

PEERS_SHOWN = 4       # the closest ranks to the plan named in the line; the rest counted


@dataclass(frozen=True)
class PeerReport:
    """The job at its last logged step, seen from the failure."""

    node: int | None                    # the failing rank's node (None: unknown)
    host: str | None
    line: str | None                    # "when rank 3 (node 1) failed: rank 5 (node 1) was at 97 % of the plan, …"
    peak_ratio: float | None            # the highest measured ÷ predicted allocated peak (GPU runs), ≥ 1 only


def peer_report(rank: int | None, doc: PlanDocument | None, last: StepMetrics | None,
                stopped: bool = False) -> PeerReport | None:
    """None when no step was logged (the run died before its first optimizer step). `stopped`: no rank failed (the
    run was stopped from outside): every rank's peak, said as such."""
    view: JobView = job_view(doc, last)
    if not view.cells:
        return None
    me = next((c for c in view.cells if c.rank == rank), None)
    node = me.node if me is not None else (_node_of(rank, doc) if rank is not None else None)
    others = [c for c in view.cells if c.rank != rank and c.measured_bytes is not None]
    others.sort(key=lambda c: -(c.of_plan if c.of_plan is not None else (c.measured_bytes or 0)))
    who = f"rank {rank}" + (f" (node {node})" if node is not None else "") if rank is not None else "a rank"
    parts = [_peer(c) for c in others[:PEERS_SHOWN]]
    if len(others) > PEERS_SHOWN:
        parts.append(f"{len(others) - PEERS_SHOWN} more")
    head = (f"at step {view.step}, when the run was stopped, the ranks' peaks: " if stopped else
            f"at step {view.step}, before {who} failed, the other ranks' peaks: ")
    line = (head + "; ".join(parts)) if parts else None
    ratios = [c.of_plan for c in view.cells if c.of_plan is not None]
    peak_ratio = max(ratios) if ratios else None
    return PeerReport(node, me.host if me is not None else None, line,
                      peak_ratio if peak_ratio is not None and peak_ratio > 1.0 else None)


def _node_of(rank: int, doc: PlanDocument | None) -> int | None:
    per_node = doc.gpus_per_node if doc is not None else None
    return rank // per_node if per_node else None


def _peer(c: RankCell) -> str:
    where = f"rank {c.rank}" + (f" (node {c.node})" if c.node is not None else "")
    if c.of_plan is not None:
        return f"{where} at {c.of_plan:.0%} of the plan ({fmt_bytes(c.measured_bytes or 0)})"
    vs = f" vs {fmt_bytes(c.predicted_bytes)} of tensors planned" if c.predicted_bytes else ""
    return f"{where} {fmt_bytes(c.measured_bytes or 0)} host RSS{vs}"


def scaled_memory(remedies: list[Remedy], plan: Plan | None, ratio: float | None) -> tuple[list[Remedy], tuple[str, ...]]:
    """Each remedy's allocated peak × (the run's highest measured ÷ predicted allocated peak), when the run
    measured more than the model predicted (never scaled down: the step that failed logged no peak, so the
    measured ones are a lower bound for it). Whether a remedy fits is judged again on the scaled number."""
    if ratio is None or plan is None or ratio <= 1.0:
        return remedies, ()
    out = []
    for r in remedies:
        if r.plan is None or r.predicted_per_gpu_bytes is None:
            out.append(r)
            continue
        extra = int((ratio - 1.0) * r.plan.memory.allocated_peak_bytes)
        total = r.predicted_per_gpu_bytes + extra
        usable = r.plan.memory.capacity_bytes * (1.0 - r.plan.memory.headroom_fraction)
        out.append(replace(r, predicted_per_gpu_bytes=total, fits=total <= usable, memory_scale=ratio))
    note = (f"predicted memory is scaled ×{ratio:.2f}: this run's ranks peaked at up to {ratio:.0%} of the "
            "predicted allocated peak before it failed")
    return out, (note,)

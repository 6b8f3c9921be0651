"""The doctor's verdict: the Diagnosis (kind, first failing rank, evidence, fixes) and its one-line summary."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from scaletrain.engine.doctor.signatures import SIGKILL_EXIT
from scaletrain.engine.doctor.remedies import Remedy
from scaletrain.engine.run.plan_document import PlanDocument
from scaletrain.engine.units import fmt_bytes

# Share of the reserved pool that is reserved-but-unallocated above which the summary names fragmentation
# (PyTorch's own hint: "If reserved but unallocated memory is large try ... expandable_segments").
FRAGMENTATION_HINT_FRACTION = 0.25


@dataclass(frozen=True)
class Diagnosis:
    kind: str
    rank: int | None
    gpu: int | None
    summary: str
    evidence: tuple[str, ...]
    remedies: tuple[Remedy, ...] = ()
    details: dict[str, Any] = field(default_factory=dict, compare=False)
    secondary: tuple[str, ...] = ()    # what else was seen (SIGTERMed ranks, NCCL fallout), one line each
    notes: tuple[str, ...] = ()        # about the remedies (e.g. step times scaled by the run's measurement)
    node: int | None = None            # the failing rank's node (its telemetry, else torchrun's numbering)
    peers: str | None = None           # the other ranks' last measured peaks against the plan (peers.py)
    restarts: tuple[str, ...] = ()     # torchelastic's restarts of the run, one line each (restarts.py)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "rank": self.rank, "node": self.node, "gpu": self.gpu, "summary": self.summary,
                "evidence": list(self.evidence), "peers": self.peers, "restarts": list(self.restarts),
                "remedies": [_remedy_json(r) for r in self.remedies], "notes": list(self.notes)}

    def failure_dict(self) -> dict[str, Any]:
        """The failure as the planner's remedy ranking takes it."""
        kind = "cuda_oom" if self.kind.startswith("cuda_oom") else self.kind   # a gather OOM is still an OOM
        return {**self.details, "kind": kind, "rank": self.rank, "gpu": self.gpu}


def _remedy_json(r: Remedy) -> dict[str, Any]:
    """A remedy as `diagnose --json` reports it (the numbers of the plan it leads to; None when unknown)."""
    return {"title": r.title, "changes": dict(r.changes), "predicted_per_gpu_bytes": r.predicted_per_gpu_bytes,
            "predicted_step_seconds": r.predicted_step_seconds, "effective_batch": r.effective_batch,
            "time_scale": r.time_scale, "memory_scale": r.memory_scale}


def with_summary(d: Diagnosis, plan: PlanDocument | None) -> Diagnosis:
    """The diagnosis with its one-line summary, in the words of its kind (and the plan's numbers, when known)."""
    x = d.details
    who = (f"rank {d.rank}" + (f" on node {d.node}" if d.node is not None else "")) if d.rank is not None else "a rank"
    predicted = plan.predicted_total_bytes if plan is not None else None
    if d.kind in ("cuda_oom", "cuda_oom_zero3_gather"):
        where = f"GPU {d.gpu}" if d.gpu is not None else "its GPU"
        s = f"{who} ran out of memory on {where}"
        if d.kind == "cuda_oom_zero3_gather":
            s += " while DeepSpeed ZeRO-3 gathered parameters"
        parts = []
        if "tried_to_allocate_bytes" in x:
            parts.append(f"tried to allocate {fmt_bytes(x['tried_to_allocate_bytes'])}")
        if "gpu_free_bytes" in x:
            parts.append(f"{fmt_bytes(x['gpu_free_bytes'])} free")
        if "gpu_total_bytes" in x:
            parts.append(f"of {fmt_bytes(x['gpu_total_bytes'])}")
        if predicted:
            parts.append(f"plan predicted a {fmt_bytes(predicted)} peak")
        if x.get("reserved_unallocated_bytes") and x.get("allocated_bytes"):
            frag = x["reserved_unallocated_bytes"] / max(1, x["allocated_bytes"] + x["reserved_unallocated_bytes"])
            if frag >= FRAGMENTATION_HINT_FRACTION:
                parts.append(f"{frag:.0%} of reserved memory unallocated (fragmentation)")
        s += (": " + ", ".join(parts)) if parts else ""
    elif d.kind == "host_oom":
        if x.get("from_exit_code") or x.get("exit_code") == SIGKILL_EXIT:
            s = (f"{who} was killed with SIGKILL and printed no traceback: almost always the host (kernel or cgroup) "
                 "OOM killer; a scheduler time limit does the same")
        else:
            s = f"{who} ran out of host memory"
            if x.get("tried_to_allocate_bytes"):
                s += f" (tried to allocate {fmt_bytes(x['tried_to_allocate_bytes'])})"
        host = plan.host_bytes_per_gpu if plan is not None else None
        if host:
            s += f"; plan keeps {fmt_bytes(host)} of offloaded state in host RAM per GPU"
    elif d.kind == "nccl_timeout":
        if "op" in x:
            s = (f"{who}: NCCL {x['op']} (seq {x['seq']}) timed out after {x['ran_ms'] / 1000:.0f} s "
                 f"(limit {x['timeout_ms'] / 1000:.0f} s); a peer stopped taking part")
        else:
            s = f"{who}: the NCCL watchdog took the process down (collective hang)"
    elif d.kind == "nccl_error":
        s = f"{who}: NCCL error"
        if x.get("error"):
            s += f" ({x['error']})"
        if x.get("nccl_class"):
            s += f", {x['nccl_class']}"
        if x.get("last_error"):
            s += f": {x['last_error']}"
    elif d.kind == "fp16_overflow":
        s = f"{who}: fp16 loss scale hit its minimum (gradients overflow at every scale); the run stopped"
    elif d.kind == "interrupted":
        s = ("the run was stopped from outside (Ctrl-C, SIGTERM or a closed terminal), it did not fail"
             + (f": {x['reason']}" if x.get("reason") else "") + "; `scaletrain launch RUN_DIR --resume` continues "
             "from the last checkpoint")
    elif d.kind == "killed":
        s = (f"{who} was killed with SIGKILL and printed no traceback, and the kernel's OOM killer did not act "
             "during the run: something outside killed it (a user's kill -9, a scheduler's time or preemption limit)")
    elif d.kind == "config_error":
        if x.get("trainer"):
            s = f"{who if d.rank is not None else 'the trainer'} refused the run: {x.get('message', '')}"
        else:
            s = f"{who if d.rank is not None else 'launch'}: configuration rejected: {x.get('message', '')}"
    elif d.kind == "export_failed":
        s = (f"the run trained, but its export of step {x.get('step')} at the end failed ({x.get('reason', '')}); the "
             "checkpoint is intact")
    elif d.kind == "disk_full":
        where = f" ({x['path']})" if x.get("path") else ""
        s = (f"{who if d.rank is not None else 'the run'} ran out of disk space"
             f"{' while saving a checkpoint' if x.get('while_saving') else ''}{where}: No space left on device; "
             "free space or move the run directory, and write fewer checkpoints")
        if x.get("disk_free_bytes") is not None:
            s += f" ({fmt_bytes(x['disk_free_bytes'])} free on the run directory's filesystem at the end)"
    else:
        if x.get("silent"):
            s = (f"{who} stopped logging with no error while the other ranks reported {x['peers_saw']}: it died "
                 "first, without a traceback (a SIGKILL, e.g. the host OOM killer, looks like this); its exit code "
                 "is in status.json")
        elif "exception" in x:
            s = f"{who} failed with {x['exception']}: {x.get('message', '')}".rstrip(": ")
        elif "exit_code" in x:
            s = f"{who} exited with {x['exit_code']}" + (" (SIGABRT: a C++ abort)" if x["exit_code"] == -6 else "")
        else:
            s = f"{who} failed"
    return replace(d, summary=s)

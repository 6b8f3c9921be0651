"""What to do about a diagnosed failure: the planner's memory remedies for an OOM, known fixes (environment,
config files, host memory, precision) for the rest, each with the numbers of the plan it leads to."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from scaletrain.engine.doctor.summary import FRAGMENTATION_HINT_FRACTION, Diagnosis
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.doctor.peers import scaled_memory
from scaletrain.engine.doctor.remedies import Remedy, rank_remedies
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.run.plan_document import PlanDocument
from scaletrain.engine.units import fmt_bytes, fmt_seconds
from scaletrain.engine.vocabulary import Offload

# PyTorch's own advice for a fragmented pool (its OOM message); torch 2.13 reads this spelling too.
EXPANDABLE_SEGMENTS_ENV = {"env.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
# NCCL verbose log and flight-recorder dump: what finds the rank a timed-out collective was waiting for.
NCCL_DEBUG_ENV = {"env.NCCL_DEBUG": "INFO", "env.TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                  "env.TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
# Longer collective timeout for slow-but-alive steps (checkpoint saves, first-step compilation); DeepSpeed reads
# DEEPSPEED_TIMEOUT in minutes (deepspeed/constants.py default_pg_timeout, default 10 in 0.19.8).
NCCL_TIMEOUT_MINUTES = 30


def remedies_for(diag: Diagnosis, doc: PlanDocument | None, measured_step_seconds: float | None = None,
                 measured_peak_ratio: float | None = None) -> tuple[list[Remedy], tuple[str, ...]]:
    """Ranked remedies (the planner's for OOMs, known fixes with the plan's numbers for the rest) and notes about
    them. When the failed run logged steady steps, every predicted step time is scaled by what it measured over
    what the model predicts for it (the planner's ranking is unchanged by a common factor), and a note says so; when
    its ranks peaked above the prediction, predicted memory is scaled the same way (peers.scaled_memory)."""
    req: PlanRequest | None = None
    plan: Plan | None = None
    if doc is not None:
        try:
            req, plan = doc.replan()
        except ScaletrainError:
            req = plan = None
    remedies, notes = scaled_by_measurement(_remedies(diag, doc, req, plan), plan, measured_step_seconds)
    remedies, mem_notes = scaled_memory(remedies, plan, measured_peak_ratio)
    return remedies, notes + mem_notes


def scaled_by_measurement(remedies: list[Remedy], plan: Plan | None,
                          measured_step_seconds: float | None) -> tuple[list[Remedy], tuple[str, ...]]:
    """Each remedy's predicted step time × (the run's measured step time ÷ the model's prediction for the run)."""
    if not measured_step_seconds or plan is None or plan.time is None or plan.time.step_seconds <= 0:
        return remedies, ()
    predicted = plan.time.step_seconds
    ratio = measured_step_seconds / predicted
    out = [replace(r, predicted_step_seconds=r.predicted_step_seconds * ratio, time_scale=ratio)
           if r.predicted_step_seconds is not None else r for r in remedies]
    note = (f"predicted step times are scaled ×{ratio:.2f}: this run measured {fmt_seconds(measured_step_seconds)}"
            f"/step after warm-up where the model predicts {fmt_seconds(predicted)}")
    return out, (note,)


def _remedies(diag: Diagnosis, doc: PlanDocument | None, req: PlanRequest | None, plan: Plan | None) -> list[Remedy]:
    k = diag.kind
    if k in ("cuda_oom", "cuda_oom_zero3_gather"):
        out = _planner_remedies(plan, diag) if plan is not None else []
        if k == "cuda_oom_zero3_gather":
            out.append(_known("lower ZeRO-3 gather buffers (stage3_prefetch_bucket_size, stage3_max_live_parameters)",
                              {}, plan, applicable=False,
                              why="DeepSpeed's advice for an OOM inside the parameter all-gather; edit ds_config.json"))
        frag = diag.details.get("reserved_unallocated_bytes", 0)
        if frag and frag / max(1, frag + diag.details.get("allocated_bytes", 0)) >= FRAGMENTATION_HINT_FRACTION:
            out.append(_known("reduce allocator fragmentation (expandable segments)", dict(EXPANDABLE_SEGMENTS_ENV),
                              plan, why="PyTorch's advice when reserved-but-unallocated memory is large"))
        return out
    if k == "host_oom":
        return _host_oom_remedies(req, plan)
    if k == "nccl_timeout":
        out = [_known(f"raise the collective timeout to {NCCL_TIMEOUT_MINUTES} min",
                      {"env.DEEPSPEED_TIMEOUT": str(NCCL_TIMEOUT_MINUTES)}, plan,
                      why="for slow but healthy steps (checkpoint saves, first-step compilation)"),
               _known("find the stalled rank (NCCL debug log + flight recorder dump)", dict(NCCL_DEBUG_ENV), plan,
                      why="the rank that timed out is usually waiting on another rank")]
        if plan is not None and plan.setup.hardware.gpu.interconnect.lower().startswith("pcie"):
            out.append(_known("disable NCCL peer-to-peer on PCIe cards", {"env.NCCL_P2P_DISABLE": "1"}, plan,
                              why="P2P over PCIe without NVLink hangs on some consumer boards"))
        return out
    if k == "nccl_error":
        out = []
        last = str(diag.details.get("last_error", "")) + str(diag.details.get("error", ""))
        if "shm" in last or "shared memory" in last:
            out.append(_known("enlarge /dev/shm (docker --ipc=host or --shm-size=16g)", {}, plan, applicable=False,
                              why="NCCL could not attach its shared-memory segment"))
        out.append(_known("rerun with NCCL debug logging", dict(NCCL_DEBUG_ENV), plan,
                          why="NCCL names the failing call and transport in its INFO log"))
        if plan is not None and plan.setup.hardware.nodes > 1:
            out.append(_known("test without InfiniBand (NCCL_IB_DISABLE=1; then set NCCL_SOCKET_IFNAME)",
                              {"env.NCCL_IB_DISABLE": "1"}, plan, why="multi-node: wrong interface or broken IB"))
        out.append(_known("disable NCCL peer-to-peer", {"env.NCCL_P2P_DISABLE": "1"}, plan,
                          why="rules out a P2P/IOMMU problem on this board"))
        return out
    if k == "fp16_overflow":
        return _fp16_remedies(req, plan, doc)
    if k in ("interrupted", "killed"):
        # applied as a remedy with no change: the same plan, relaunched from its newest checkpoint (the monitor's
        # `a`; it said "a manual step; scaletrain cannot apply it" of its own resume)
        why = "nothing in the run failed; it was stopped" if k == "interrupted" else "it was killed from outside"
        return [_known("resume from the last checkpoint (scaletrain launch RUN_DIR --resume)", {}, plan, why=why)]
    if k == "config_error":
        unsupported = diag.details.get("attn_unsupported")
        if unsupported:
            return _attention_remedies(req, plan, str(unsupported))
        if diag.details.get("trainer"):
            return []           # the trainer's own line says what to change
        return [_known("rewrite the run's configs from the plan (scaletrain writers)", {}, plan,
                       why="a hand-edited or stale accelerate/DeepSpeed config was rejected")]
    if k == "disk_full":
        return _disk_full_remedies(doc)
    if k == "export_failed":
        return _export_remedies(diag, plan, doc)
    return []


def _attention_remedies(req: PlanRequest | None, plan: Plan | None, unsupported: str) -> list[Remedy]:
    """The model class has no `unsupported` attention (gpt_oss: no sdpa): eager runs everywhere; each choice
    re-planned, since eager keeps the S² scores (more memory, slower)."""
    out = []
    for attn in ("eager", "flash"):
        if attn == unsupported or (attn == "flash" and plan is not None and plan.setup.device == "cpu"):
            continue
        new = _try_plan(req, plan, attn=attn) if plan is not None else None
        out.append(_known(f"use {attn} attention (--attn {attn})", {"attn": attn}, new,
                          why=f"transformers builds this model without {unsupported} attention", base=plan))
    return out


# A full disk is a disk problem: these remedies change where and how often checkpoints are written, never the
# per-GPU memory or the step time, so they carry no predicted numbers.
CHECKPOINT_EVERY_FACTOR = 10        # "checkpoint less often": ten times fewer checkpoints


def _export_remedies(diag: Diagnosis, plan: Plan | None, doc: PlanDocument | None = None) -> list[Remedy]:
    """The checkpoint is intact: export it again (on a machine with the host RAM the export needs)."""
    from scaletrain.engine.run.disk import export_host_bytes

    step = diag.details.get("step")
    out = [_disk_remedy(f"export it again: scaletrain export RUN_DIR --step {step}", {},
                        "reads the checkpoint on the CPU in one process; any machine that sees the run directory",
                        applicable=False)]
    if plan is not None:
        need = export_host_bytes(plan.setup, _train_of(doc))
        out.append(_disk_remedy(f"export on a machine with {fmt_bytes(need)} of free host RAM", {},
                                "the model and the consolidated weights are both in host memory while it writes",
                                applicable=False))
    return out


def _disk_remedy(title: str, changes: dict[str, Any], why: str, applicable: bool = True) -> Remedy:
    return Remedy(title, changes, None, None, None, None, None, None, kind="known", detail=why,
                  applicable=applicable)


def _train_of(doc: PlanDocument | None) -> Any:
    """The plan's train options, or None when there is no plan or its train section does not read."""
    try:
        return doc.train if doc is not None else None
    except ScaletrainError:
        return None


def _disk_full_remedies(doc: PlanDocument | None) -> list[Remedy]:
    out = [_disk_remedy("free disk space, or put the run directory on a bigger disk", {},
                        "the disk holding the run directory is full (checkpoints, other runs' files)",
                        applicable=False)]
    train = _train_of(doc)
    if train is None:
        return out + [_disk_remedy("write fewer checkpoints (train options checkpoint_every larger, "
                                   "keep_checkpoints 1)", {}, "each checkpoint holds weights and optimizer states",
                                   applicable=False)]
    if train.keep_checkpoints != 1:
        out.append(_disk_remedy(f"keep only the newest checkpoint (keep_checkpoints 1, was "
                                f"{train.keep_checkpoints or 'all'})", {"train.keep_checkpoints": 1},
                                "older checkpoints are deleted once a newer one is complete"))
    every = train.checkpoint_every * CHECKPOINT_EVERY_FACTOR
    out.append(_disk_remedy(f"checkpoint less often (checkpoint_every {train.checkpoint_every} → {every})",
                            {"train.checkpoint_every": every}, "fewer saves, each as large as before"))
    out.append(_disk_remedy("write no checkpoints (save_checkpoints false; nothing to resume from)",
                            {"train.save_checkpoints": False}, "for short runs and validation"))
    return out


def _known(title: str, changes: dict[str, Any], plan: Plan | None, *, applicable: bool = True, why: str = "",
           base: Plan | None = None) -> Remedy:
    """A known fix, carrying the numbers of the plan it leads to (the current plan when only env/files change)."""
    if plan is None:
        return Remedy(title, changes, None, None, None, None, None, None, kind="known", detail=why,
                      applicable=applicable)
    t = plan.time
    keeps = plan.setup.effective_batch == base.setup.effective_batch if base is not None else True
    return Remedy(title, changes, plan, plan.memory.total_bytes, t.step_seconds if t is not None else None,
                  plan.setup.effective_batch, keeps, plan.fits, kind="known", detail=why, applicable=applicable)


def _planner_remedies(plan: Plan, diag: Diagnosis | None) -> list[Remedy]:
    return rank_remedies(plan, diag.failure_dict() if diag is not None else None)


def _try_plan(req: PlanRequest | None, plan: Plan, **changes: Any) -> Plan | None:
    if req is None:
        return None
    try:
        return make_plan(req.with_(**changes), hardware=plan.setup.hardware)
    except ScaletrainError:
        return None


def _host_oom_remedies(req: PlanRequest | None, plan: Plan | None) -> list[Remedy]:
    if plan is None:
        return [_known("give the job more host RAM", {}, None, applicable=False, why="SLURM: --mem")]
    s = plan.setup
    out: list[Remedy] = []
    if s.device == "cpu":
        # on a CPU run host memory is the device memory: the planner's memory remedies are the fixes
        out += _planner_remedies(plan, None)
    for off in [o for o in reversed(Offload) if o.rank < s.offload.rank]:      # offload less, most first
        p = _try_plan(req, plan, offload=off)
        if p is not None:
            host = p.memory.host_bytes_per_gpu * s.hardware.gpus_per_node
            out.append(_known(f"offload {'only the optimizer' if off == 'optimizer' else 'nothing'} "
                              f"({fmt_bytes(host)} host RAM per node)", {"offload": off}, p, base=plan,
                              why="offloaded states live in pinned host RAM"))
    need = plan.memory.host_bytes_per_gpu * s.hardware.gpus_per_node
    out.append(_known("give the job more host RAM" + (f" (offloaded states alone: {fmt_bytes(need)} per node)"
                                                      if need else ""), {}, plan, applicable=False,
                      why="SLURM: --mem; containers: raise the memory limit"))
    if s.offload != "none":
        out.append(_known("stop pinning offloaded memory (pin_memory: false in ds_config.json)", {}, plan,
                          applicable=False, why="pinned pages cannot be swapped out"))
    return out


def _fp16_remedies(req: PlanRequest | None, plan: Plan | None, doc: PlanDocument | None) -> list[Remedy]:
    if plan is None:
        return [_known("train in bf16 (no loss scaling)", {"precision": "bf16"}, None)]
    out: list[Remedy] = []
    if plan.setup.hardware.gpu.supports_bf16 and plan.setup.precision != "bf16":
        p = _try_plan(req, plan, precision="bf16")
        if p is not None:
            out.append(_known("train in bf16 (no loss scaling needed)", {"precision": "bf16"}, p, base=plan,
                              why="bf16 has fp32's exponent range"))
    lr = doc.train_lr if doc is not None else None
    if lr:
        out.append(_known(f"halve the learning rate ({lr:g} → {lr / 2:g})", {"train.lr": lr / 2}, plan, base=plan,
                          why="a diverging run overflows at every loss scale"))
    p = _try_plan(req, plan, precision="fp32")
    if p is not None:
        out.append(_known("train in fp32", {"precision": "fp32"}, p, base=plan, why="no overflow, more memory"))
    return out

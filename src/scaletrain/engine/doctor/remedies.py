"""Remedy ranking: given a plan (and what went wrong), the changes that fix memory, cheapest first.

Used by the failure doctor after a CUDA OOM and by the wizard when a plan does not fit. Each remedy is one
change (or one change plus re-splitting the micro batch to keep the effective batch), re-evaluated through the
same memory and time models as the plan. Order: remedies predicted to fit before those that do not; among
them, those that keep the effective batch; `--loss chunked` first when the OOM was raised in the loss or the
B·S·V logits are the peak's largest term; then by kind in the order people should reach for them (the chunked
loss, batch split, checkpointing, ZeRO stage, offload — then shorter sequences, QLoRA, more GPUs, which change
the run itself or the hardware bill); then fastest predicted.

An observed OOM says the real peak reached the card's capacity: the gap between that and the plan's prediction
is memory the model did not see, and every remedy's prediction is charged the same gap.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog.hardware import Hardware
from scaletrain.engine.plan.plan import Plan, evaluate
from scaletrain.engine.request.fields import HARDWARE_FIELDS, SEARCH_FIELDS
from scaletrain.engine.plan.search import divisors, search
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.estimate.traced_blocks import unmodeled_checkpointing
from scaletrain.engine.units import fmt_bytes, fmt_seconds
from scaletrain.engine.vocabulary import Method, Offload, Strategy

# Cost tiers: systems changes that keep the training identical on the same hardware (ranked among themselves by
# predicted speed), then shorter sequences (truncate data), then LoRA/QLoRA (change what is trained), then
# more GPUs (change the bill) — the order of the list.
KIND_TIER = {"loss": 0, "split": 0, "checkpointing": 0, "zero_stage": 0, "offload": 0, "replan": 0, "sequence": 1,
             "method": 2, "gpus": 3}
ZERO_LADDER = (Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3)
SEQ_FRACTIONS = (0.75, 0.5)                # shorter --seq-len candidates, as fractions of the current one
MAX_GPUS_PER_NODE = 8                      # "more GPUs" fills a node to 8, then adds nodes


@dataclass(frozen=True)
class Remedy:
    """One fix and what it predicts. The planner's memory remedies come from rank_remedies; the doctor adds known
    fixes (environment, config files, host memory) of the same shape, without numbers when no plan is known."""

    title: str
    changes: dict[str, Any]                # PlanRequest field → new value; also "train.<option>", "env.<NAME>"
    plan: Plan | None                      # the plan the fix leads to (None: no plan to predict with)
    predicted_per_gpu_bytes: int | None    # the re-evaluated plan's total, plus any gap an observed OOM showed
    predicted_step_seconds: float | None
    effective_batch: int | None
    keeps_effective_batch: bool | None
    fits: bool | None
    kind: str = "split"                    # a KIND_TIER key, or "known" for the doctor's known fixes
    detail: str = ""                       # why it helps
    applicable: bool = True                # can a relaunch on the same machines apply it (vs. a manual step)?
    time_scale: float | None = None        # predicted_step_seconds × this: a failed run's measured ÷ predicted
    memory_scale: float | None = None      # allocated peak × this: a failed run's highest measured ÷ predicted peak

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "kind": self.kind, "changes": dict(self.changes),
                "predicted_per_gpu_bytes": self.predicted_per_gpu_bytes,
                "predicted_step_seconds": self.predicted_step_seconds, "effective_batch": self.effective_batch,
                "keeps_effective_batch": self.keeps_effective_batch, "fits": self.fits, "detail": self.detail,
                "time_scale": self.time_scale, "memory_scale": self.memory_scale}

    def numbers(self, unit: str = "GPU") -> list[str]:
        """What the fix predicts, as `scaletrain diagnose` and the monitor show it: memory per GPU (per `unit`: a
        CPU run's is a process), step time (scaled by the failed run's measured ÷ predicted), effective batch."""
        nums = []
        if self.predicted_per_gpu_bytes is not None:
            nums.append(f"{fmt_bytes(self.predicted_per_gpu_bytes)}/{unit}"
                        + (f" (×{self.memory_scale:.2f} as measured)" if self.memory_scale is not None else ""))
        if self.predicted_step_seconds is not None:
            nums.append(f"step {fmt_seconds(self.predicted_step_seconds)}"
                        + (f" (×{self.time_scale:.2f} as measured)" if self.time_scale is not None else ""))
        if self.effective_batch is not None:
            nums.append(f"batch {self.effective_batch}")
        return nums


def observed_gap_bytes(plan: Plan, failure: dict[str, Any] | None) -> tuple[int, int]:
    """(bytes the model missed, capacity to plan against) from an observed failure."""
    capacity = plan.memory.capacity_bytes
    if not failure:
        return 0, capacity
    kind = failure.get("kind", "cuda_oom")
    if kind != "cuda_oom":
        raise ScaletrainError(f"remedies know failure kind 'cuda_oom' only (got {kind!r})")
    total = failure.get("gpu_total_bytes") or capacity
    tried = failure.get("tried_to_allocate_bytes") or 0
    for name, v in (("gpu_total_bytes", total), ("tried_to_allocate_bytes", tried)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ScaletrainError(f"failure {name} must be a byte count ≥ 0 (got {v!r})")
    # the process held (almost) everything and still asked for `tried` more: its real peak ≥ total + tried − a
    # little free slack; we take total as the lower bound (conservative about what was already in use)
    gap = max(0, total - plan.memory.total_bytes)
    return gap, int(total)


def _fits(plan: Plan, gap: int, capacity: int) -> bool:
    return plan.memory.total_bytes + gap <= int(capacity * (1.0 - plan.memory.headroom_fraction))


def _make(title: str, kind: str, changes: dict[str, Any], setup: TrainingSetup, base: Plan, gap: int,
          capacity: int, detail: str = "") -> Remedy:
    p = evaluate(setup, headroom_fraction=base.memory.headroom_fraction, name=base.name)
    return Remedy(title=title, changes=changes, plan=p, predicted_per_gpu_bytes=p.memory.total_bytes + gap,
                  applicable=not (HARDWARE_FIELDS & set(changes)),
                  predicted_step_seconds=p.time.step_seconds, effective_batch=setup.effective_batch,
                  keeps_effective_batch=setup.effective_batch == base.setup.effective_batch,
                  fits=_fits(p, gap, capacity), kind=kind, detail=detail)


def _split_for(setup: TrainingSetup, per_gpu: int, max_micro: int, base: Plan, gap: int,
               capacity: int) -> TrainingSetup | None:
    """The largest micro batch ≤ max_micro dividing the per-GPU batch that fits (keeps the effective batch)."""
    for mb in reversed([d for d in divisors(per_gpu) if d <= max_micro]):
        cand = setup.with_(micro_batch=mb, grad_accum=per_gpu // mb)
        if _fits(evaluate(cand, headroom_fraction=base.memory.headroom_fraction, with_time=False), gap, capacity):
            return cand
    return None


def _plans_checkpointing(s: TrainingSetup) -> bool:
    """Checkpointing is a remedy the memory model can predict for `s`'s model (not a looped stack's, nor a class
    that cannot checkpoint, nor one whose checkpointed trace is refused: git's LoRA)."""
    if not s.model.can_checkpoint:
        return False
    try:
        return unmodeled_checkpointing(s.with_(grad_ckpt=True)) is None
    except ScaletrainError:
        return False


def _with_split(title: str, kind: str, changes: dict[str, Any], setup: TrainingSetup, base: Plan, gap: int,
                capacity: int) -> Remedy:
    """Apply a structural change; if it alone does not fit, also shrink the micro batch (keeping the batch),
    and if that is still not enough, turn checkpointing on as well."""
    s0 = base.setup
    per_gpu = setup.effective_batch // setup.world_size
    if setup.effective_batch % setup.world_size == 0:
        split = _split_for(setup, per_gpu, s0.micro_batch, base, gap, capacity)
        if split is None and not setup.grad_ckpt and _plans_checkpointing(setup):
            split = _split_for(setup.with_(grad_ckpt=True), per_gpu, s0.micro_batch, base, gap, capacity)
            if split is not None:
                changes = {**changes, "grad_ckpt": True}
                title += " + gradient checkpointing"
        if split is not None and split.micro_batch != setup.micro_batch:
            changes = {**changes, "micro_batch": split.micro_batch, "grad_accum": split.grad_accum}
            title += f", micro {split.micro_batch} × accum {split.grad_accum}"
        setup = split or setup
    return _make(title, kind, changes, setup, base, gap, capacity)


def _replan(plan: Plan, gap: int, capacity: int) -> Remedy | None:
    """The planner's best combination at the same effective batch, with the observed gap kept free."""
    s = plan.setup
    usable = min(capacity, plan.memory.capacity_bytes) * (1.0 - plan.memory.headroom_fraction) - gap
    if usable <= 0 or s.effective_batch % s.world_size:
        return None
    headroom = 1.0 - usable / plan.memory.capacity_bytes
    res = search(s, target=s.effective_batch, fixed={}, headroom=headroom, name=plan.name)
    if not res.ranked:
        return None
    b = res.ranked[0].setup
    changes = {k: getattr(b, k) for k in SEARCH_FIELDS if getattr(b, k) != getattr(s, k)}
    if not changes:
        return None
    return _make(f"re-plan: {res.ranked[0].describe()}", "replan", changes, b, plan, gap, capacity)


def rank_remedies(plan: Plan, failure: dict[str, Any] | None = None) -> list[Remedy]:
    """Changes that bring per-GPU memory down, ordered by predicted cost (see the module docstring)."""
    s = plan.setup
    gap, capacity = observed_gap_bytes(plan, failure)
    current = plan.memory.total_bytes + gap
    out: list[Remedy] = []
    world = s.world_size
    per_gpu = s.micro_batch * s.grad_accum

    # 1. smaller micro batch, more accumulation (same effective batch): every divisor below the current one
    for mb in reversed([d for d in divisors(per_gpu) if d < s.micro_batch]):
        out.append(_make(f"micro batch {mb} × accum {per_gpu // mb} (was {s.micro_batch} × {s.grad_accum})",
                         "split", {"micro_batch": mb, "grad_accum": per_gpu // mb},
                         s.with_(micro_batch=mb, grad_accum=per_gpu // mb), plan, gap, capacity))
    # 1b. the chunked loss, where the B·S·V logits are part of the peak (or the OOM was raised in the loss)
    chunked = _chunked_loss(plan, failure, gap, capacity)
    if chunked is not None:
        out.append(chunked)
    # 2. gradient checkpointing
    if not s.grad_ckpt and _plans_checkpointing(s):
        out.append(_with_split("gradient checkpointing on", "checkpointing", {"grad_ckpt": True},
                               s.with_(grad_ckpt=True), plan, gap, capacity))
    # 3. ZeRO stage up (FSDP counts as stage 3)
    if s.strategy in ZERO_LADDER and world > 1:
        for nxt in ZERO_LADDER[ZERO_LADDER.index(s.strategy) + 1:]:
            try:
                cand = s.with_(strategy=nxt)
            except ScaletrainError:
                continue
            out.append(_with_split(f"{nxt.label} instead of {s.strategy.label}", "zero_stage",
                                   {"strategy": nxt}, cand, plan, gap, capacity))
    # 4. offload optimizer states, then parameters too
    for off in (Offload.OPTIMIZER, Offload.ALL):
        if off.rank <= s.offload.rank:
            continue
        strat = s.strategy
        if not strat.allows_offload(off):
            strat = Strategy.ZERO3   # e.g. FSDP has no optimizer-only offload (Strategy.allows_offload)
        changes: dict[str, Any] = {"offload": off}
        title = f"offload {'optimizer states' if off == 'optimizer' else 'optimizer states and parameters'} to CPU"
        if strat != s.strategy:
            changes["strategy"] = strat
            title += f" ({strat.label})"
        try:
            cand = s.with_(strategy=strat, offload=off)
        except ScaletrainError:     # ZeRO-3 where the plan's loss cannot run (--loss chunked reads lm_head whole)
            continue
        out.append(_with_split(title, "offload", changes, cand, plan, gap, capacity))
    # 5. shorter sequences (truncates samples: changes what is trained)
    for frac in SEQ_FRACTIONS:
        seq = int(s.seq_len * frac)
        if seq < 1 or seq == s.seq_len:
            continue
        out.append(_make(f"sequence length {seq} (was {s.seq_len}; longer samples are truncated)", "sequence",
                         {"seq_len": seq}, s.with_(seq_len=seq), plan, gap, capacity))
    # 6. LoRA / QLoRA (changes what is trained)
    for method in (Method.LORA, Method.QLORA):
        if method.rank <= s.method.rank:
            continue
        bits = 4 if method == "qlora" else 16
        try:
            cand = s.with_(method=method, base_bits=bits)
        except ScaletrainError:
            continue
        out.append(_with_split(f"{'QLoRA (4-bit base)' if method == 'qlora' else 'LoRA'} instead of {s.method}"
                               f" fine-tuning, rank {s.lora_rank}", "method",
                               {"method": method, "base_bits": bits}, cand, plan, gap, capacity))
    # 7. more GPUs (same effective batch where it divides)
    for hw in _more_gpus(s.hardware):
        w = hw.world_size
        cand = s.with_(hardware=hw)
        if s.effective_batch % w == 0:
            pg = s.effective_batch // w
            mb = max(d for d in divisors(pg) if d <= s.micro_batch)
            cand = cand.with_(micro_batch=mb, grad_accum=pg // mb)
        out.append(_make(f"{hw.describe()} ({w} GPUs instead of {world})", "gpus",
                         {"gpus": hw.describe(), "micro_batch": cand.micro_batch, "grad_accum": cand.grad_accum},
                         cand, plan, gap, capacity))

    # 8. the planner's best combination (several changes at once) when no single change is enough
    replan = _replan(plan, gap, capacity)
    if replan is not None:
        out.append(replan)

    helpful = [r for r in out if r.predicted_per_gpu_bytes < current]
    first = "loss" if _logits_bound(plan, failure) else None   # an OOM in the loss: the chunked loss leads
    helpful.sort(key=lambda r: (not r.fits, not r.keeps_effective_batch, r.kind != first, KIND_TIER[r.kind],
                                r.predicted_step_seconds / r.effective_batch, r.predicted_per_gpu_bytes))
    seen: set[tuple] = set()
    unique = []
    for r in helpful:   # the re-plan may coincide with a single change: keep the first (better-ranked) one
        ps = r.plan.setup
        key = (ps.strategy, ps.offload, ps.grad_ckpt, ps.micro_batch, ps.grad_accum, ps.seq_len, ps.method,
               ps.hardware.describe(), ps.loss)
        if key not in seen:
            seen.add(key)
            unique.append(r)
    return unique


def _logits_bound(plan: Plan, failure: dict[str, Any] | None) -> bool:
    """The OOM was raised inside the loss, or the logits are the largest term of the plan's peak."""
    m = plan.memory
    others = (m.weights_bytes, m.gradients_bytes, m.optimizer_bytes, m.activations_bytes)
    return bool(failure and failure.get("in_loss")) or (m.logits_bytes > 0 and m.logits_bytes >= max(others))


def _chunked_loss(plan: Plan, failure: dict[str, Any] | None, gap: int, capacity: int) -> Remedy | None:
    """`--loss chunked` (engine/estimate/chunked_loss.py) for a plan whose peak holds the B·S·V logits, or an OOM
    raised inside the loss; None where it does not apply (refused by the setup: not sft, zero3/fsdp …)."""
    s = plan.setup
    in_loss = bool(failure and failure.get("in_loss"))
    if s.loss != "standard" or not (in_loss or plan.memory.logits_bytes > 0 or plan.memory.peak_phase == "loss"):
        return None
    try:
        cand = s.with_(loss="chunked")
    except ScaletrainError:
        return None
    was = fmt_bytes(plan.memory.logits_bytes)
    return _with_split(f"--loss chunked (lm_head + cross-entropy in token chunks; the logits were {was} of the "
                       "peak)", "loss", {"loss": "chunked"}, cand, plan, gap, capacity)


def _more_gpus(hw: Hardware) -> list[Hardware]:
    """The next sizes up: fill the node to 8 GPUs, then double the nodes."""
    if hw.gpus_per_node < MAX_GPUS_PER_NODE and hw.nodes == 1:
        return [replace(hw, gpus_per_node=min(MAX_GPUS_PER_NODE, hw.gpus_per_node * 2))]
    return [hw.with_nodes(hw.nodes * 2)]


def describe(r: Remedy) -> str:
    """One line for a view: what to change and what it predicts."""
    verdict = "fits" if r.fits else "still over"
    batch = "" if r.keeps_effective_batch else f", effective batch {r.effective_batch}"
    return f"{r.title}: {fmt_bytes(r.predicted_per_gpu_bytes)} per GPU ({verdict}){batch}"

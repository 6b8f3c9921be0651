"""The planner's search: every strategy × offload × checkpointing × split the user left free, ranked.

The seeds do `effective = micro × accum × GPUs` by hand and guess the rest. The search enumerates every
combination the user left free, keeps those that hit the target exactly and fit under the headroom (memory
model), and ranks them fastest first (time model). Memory grows with the micro batch and time per sample falls
with it, so each configuration's best split is found by a binary search over the divisors of the per-GPU batch.
What the user fixed is never changed. The planner (planner.py), the alternatives and `--table` views
(tables.py) and the remedies all search through here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.estimate.memory import estimate_memory
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.estimate.traced_blocks import traceable, unmodeled_checkpointing
from scaletrain.engine.plan.plan import Plan, evaluate
from scaletrain.engine.plan.rows import Choice
from scaletrain.engine.request.fields import SEARCH_FIELDS
from scaletrain.engine.vocabulary import Offload, Strategy

# A search field's value: a strategy or offload spelling, checkpointing on/off, a micro batch or accumulation.
SearchValue = str | bool | int

# simplest first: breaks exact ties (FSDP shards like ZeRO-3 but is one wrapper, no DeepSpeed)
STRATEGY_ORDER = (Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.FSDP, Strategy.ZERO3)
# Without --effective-batch the planner fills each GPU up to this micro batch (seed 003 runs 16 per GPU); past it,
# GEMM utilization gains are small and the implied effective batch stops being a fine-tuning batch.
MAX_MICRO_BATCH_WITHOUT_TARGET = 16
# Largest micro batch a split search considers (divisors above it are skipped; they never fit an LLM step).
MAX_MICRO_BATCH = 1024
# Predicted times closer than this are a tie (well inside the time model's error): the simpler setup wins —
# fewer sharding stages, no offload, no checkpointing, then the larger micro batch.
TIE_TOLERANCE = 0.01


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
        assert self.plan.time is not None, "ranked candidates carry the time model"
        return self.plan.time.step_seconds

    @property
    def seconds_per_sample(self) -> float:
        return self.step_seconds / self.setup.effective_batch

    def key(self) -> tuple[SearchValue, ...]:
        return search_key(self.setup)

    def rank_key(self) -> tuple[float, int, int, bool, int]:
        s = self.setup
        return (self.seconds_per_sample, STRATEGY_ORDER.index(s.strategy), s.offload.rank,
                s.grad_ckpt, -s.micro_batch)

    def simplicity_key(self) -> tuple[int, int, bool, int, float]:
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

    def choice(self) -> Choice:
        """The candidate as a table row shows it (needs the time model: a ranked candidate)."""
        s = self.setup
        t = self.plan.time
        assert t is not None, "ranked candidates carry the time model"
        return Choice(strategy=s.strategy, offload=s.offload, grad_ckpt=s.grad_ckpt, micro_batch=s.micro_batch,
                      grad_accum=s.grad_accum, world_size=s.world_size, effective_batch=s.effective_batch,
                      per_gpu_bytes=self.per_gpu_bytes, usable_bytes=self.plan.memory.usable_bytes,
                      fits=self.fits, peak_phase=self.plan.memory.peak_phase, step_seconds=t.step_seconds,
                      tokens_per_second=t.tokens_per_second, epoch_seconds=t.epoch_seconds, mfu=t.mfu,
                      description=self.describe())


@dataclass(frozen=True)
class SearchResult:
    target: int | None
    ranked: tuple[Candidate, ...]          # fitting candidates, fastest first
    leanest: Candidate | None              # the smallest per-GPU total seen (fitting or not)
    leanest_by_strategy: dict[Strategy, Candidate]
    evaluated: int
    fixed: dict[str, SearchValue]


def search_key(s: TrainingSetup) -> tuple[SearchValue, ...]:
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


def check_generation_batch(base: TrainingSetup, effective: int) -> None:
    """GRPO: TRL splits each generation batch (micro × GPUs × steps_per_generation, = the effective batch in
    completions by default) into groups of num_generations completions of one prompt (GRPOConfig.__post_init__
    refuses the rest), so the effective batch must be a multiple of G."""
    g = base.num_generations
    if base.objective != "grpo" or effective % g == 0:
        return
    near = " or ".join(str(x) for x in _nearest(effective, g * base.world_size) or [g * base.world_size])
    raise ScaletrainError(
        f"GRPO trains on groups of --num-generations {g} completions per prompt, so the effective batch "
        f"(completions per step) must be a multiple of {g}; {effective} is not. Nearest on {base.world_size} "
        f"GPU(s): {near}, or change --num-generations")


def _configs(base: TrainingSetup, fixed: Mapping[str, SearchValue]) -> Iterable[TrainingSetup]:
    """Every valid strategy × offload × checkpointing setup allowed by what the user fixed."""
    strategies = (fixed["strategy"],) if "strategy" in fixed else STRATEGY_ORDER
    if base.master_weights == "bf16":     # DeepSpeed always keeps an fp32 master: bf16-only weights are DDP or FSDP
        strategies = tuple(x for x in strategies if not Strategy(x).uses_deepspeed)
    ckpts = (fixed["grad_ckpt"],) if "grad_ckpt" in fixed else (False, True)
    for strategy in strategies:
        # only the offloads the strategy allows: FSDP's CPUOffload moves parameters, gradients and the step
        # together, so the planner proposes FSDP offload as "all" only (Strategy.allows_offload)
        offloads: tuple[Offload, ...] = Strategy(strategy).offloads()
        if "offload" in fixed:
            offloads = (fixed["offload"],) if fixed["offload"] in offloads or "strategy" in fixed else ()
        for offload in offloads:
            for ckpt in ckpts:
                try:
                    yield base.with_(strategy=strategy, offload=offload, grad_ckpt=ckpt)
                except ScaletrainError:
                    continue   # a combination the stack does not support (e.g. offload with DDP)


def search(base: TrainingSetup, *, target: int | None, fixed: Mapping[str, SearchValue], headroom: float = 0.10,
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
        check_generation_batch(base, target)
    fitting: list[Candidate] = []
    leanest: Candidate | None = None
    leanest_by: dict[Strategy, Candidate] = {}
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
    if base.objective == "grpo":      # whole groups of G completions only (check_generation_batch)
        splits = [sp for sp in splits if sp[0] * sp[1] * world % base.num_generations == 0]
        if not splits:
            check_generation_batch(base, (mb_fixed or 1) * (ga_fixed or 1) * world)
            raise ScaletrainError(f"no micro batch up to {MAX_MICRO_BATCH_WITHOUT_TARGET} makes whole groups of "
                                  f"--num-generations {base.num_generations}; give --effective-batch")
    special = splits[-1] if len(splits) > 1 and splits[-1][1] == 1 and splits[0][1] > 1 else None
    monotone = splits[:-1] if special else splits

    configs = list(_configs(base, fixed))
    # a traced model: every regime the search visits, traced in one subprocess; a regime whose trace is refused
    # (git's LoRA + checkpointing) is left out of the search, asked for alone its estimate says why in one line
    configs = traceable(configs)
    # checkpointing the memory model does not count for this model (a looped stack's) is left out of the search;
    # asked for alone (--grad-ckpt), its estimate says why in one line
    configs = [c for c in configs if unmodeled_checkpointing(c) is None] or configs
    for cfg in configs:
        best = _largest_fitting(cfg, monotone, probe)
        if special is not None and (best is None or best.setup.micro_batch < special[0]):
            c = probe(cfg, special)
            if c.fits:
                best = c
        if best is not None:
            fitting.append(Candidate(evaluate(best.setup, headroom_fraction=headroom, name=name)))
    return SearchResult(target, _rank(fitting), leanest, leanest_by, probes, dict(fixed))


def _largest_fitting(cfg: TrainingSetup, splits: list[tuple[int, int]],
                     probe: Callable[[TrainingSetup, tuple[int, int]], Candidate]) -> Candidate | None:
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


def next_micro_batch(setup: TrainingSetup, *, up: bool) -> int | None:
    """The next micro batch up or down that still divides each GPU's share of the effective batch (the
    accumulation follows); None when the current one is already the largest / smallest such split."""
    per_gpu = setup.effective_batch // setup.world_size
    steps = divisors(per_gpu)
    options = [d for d in steps if d > setup.micro_batch] if up else [d for d in steps if d < setup.micro_batch][::-1]
    return options[0] if options else None

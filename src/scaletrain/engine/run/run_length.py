"""How long a written run trains, as the trainer will run it: `train.max_steps` overrides the plan's epochs (a
preset's hidden max_steps must not read as "1 epoch"), and each is shown in the other's unit when the plan knows the
steps per epoch (it needs the dataset size)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any


@dataclass(frozen=True)
class RunLength:
    steps: int | None              # optimizer steps the trainer runs (None: unknown without a dataset size)
    epochs: float | None           # passes over the data (None: unknown without a dataset size)
    by_max_steps: bool             # train.max_steps decides, not the plan's epochs
    warmup_steps: int = 0          # the LR's linear warmup (trainer/train.make_schedule: ceil(ratio × steps))

    def text(self) -> str:
        """'6 steps (max_steps) = 6.45 epochs', '2 epochs = 1,258 steps', '1 epoch (steps: give a dataset size)'."""
        if self.by_max_steps:
            head = f"{self.steps:,} step{'s' if self.steps != 1 else ''} (max_steps)"
            return head + (f" = {self.epochs:.3g} epochs" if self.epochs is not None else
                           " (epochs: give a dataset size)") + self.warmup_text()
        ep = f"{self.epochs:g} epoch{'s' if self.epochs != 1 else ''}"
        return ep + (f" = {self.steps:,} step{'s' if self.steps != 1 else ''}" if self.steps is not None
                     else " (steps: give a dataset size)") + self.warmup_text()

    def warmup_text(self) -> str:
        """A run that never leaves the LR warmup says so: a linear warmup starts at lr 0, so a one-step run (the
        wizard's default batch on the bundled demo data) changes no weight."""
        if not self.steps or self.warmup_steps < self.steps:
            return ""
        if self.steps == 1:
            return (" (its one step is the LR warmup's first, at lr 0: no weight changes; "
                    "--set train.warmup_ratio=0, or more data)")
        return f" (every step in the LR warmup of {self.warmup_steps:,})"


def run_length(plan: Any, train: Any) -> RunLength:
    """The plan (its setup's epochs, its time's steps per epoch) and the train options (max_steps)."""
    t = plan.time
    per_epoch = t.steps_per_epoch if t is not None else None
    ratio = float(getattr(train, "warmup_ratio", 0) or 0)
    if train.max_steps is not None:
        steps = int(train.max_steps)
        return RunLength(steps, train.max_steps / per_epoch if per_epoch else None, True, math.ceil(ratio * steps))
    steps = t.total_steps if t is not None else None
    return RunLength(steps, float(plan.setup.epochs), False, math.ceil(ratio * steps) if steps else 0)


@dataclass(frozen=True)
class KnownLength:
    """The samples a plan counts when the request gave none, and where the count comes from."""

    samples: int | None
    source: str                   # "given", "the bundled demo data (demo.jsonl, 1,000 rows)", "data.jsonl", ...


def known_length(request: Any, train: Any) -> KnownLength:
    """The run's samples: the request's dataset size; else the rows of the data it trains on (the train option
    `dataset`, read offline), or of the bundled data when none is set (what the trainer then trains on). A dataset
    that cannot be read here (a hub id not in the cache) leaves the length unknown."""
    if request.dataset_size is not None:
        return KnownLength(request.dataset_size, "given")
    from scaletrain.engine.errors import ScaletrainError
    from scaletrain.engine.request.options import bundled_dataset

    if train.dataset:
        try:
            rows = _rows(train.dataset)
        except ScaletrainError:
            return KnownLength(None, f"{train.dataset} cannot be counted here")
        blocks = _data_blocks(request, train, str(train.dataset))
        if blocks is not None and rows:
            from scaletrain.engine.request.data_profile import trained_blocks

            trained = trained_blocks(blocks, train.eval_fraction)
            after = f", {trained:,} after {train.eval_fraction:g} held out for eval" if trained != blocks else ""
            return KnownLength(trained, f"{train.dataset}: {rows:,} rows "
                                        f"{_blocked(blocks, rows, request, train)}{after}")
        packed = " counted one sample each (not tokenized here)" if train.packing and rows else ""
        return KnownLength(rows, f"{train.dataset}, {rows:,} rows{packed}" if rows else str(train.dataset))
    path = bundled_dataset(request.objective or "sft")
    try:
        rows = _rows(str(path))
    except ScaletrainError:
        return KnownLength(None, f"the bundled data {path.name} is missing")
    blocks = _bundled_blocks(request, train, str(path))
    if blocks is not None:
        short = request.effective_batch is not None and blocks < request.effective_batch
        how = _blocked(blocks, rows, request, train)
        return KnownLength(blocks, f"the bundled data {path.name}: {rows:,} rows {how}"
                                   f"{', repeated by the trainer to fill one optimizer step' if short else ''}; "
                                   "set the dataset for yours")
    packed = " counted one sample each (the trainer packs them into fewer sequences)" if train.packing else ""
    return KnownLength(rows, f"the bundled data {path.name}, {rows:,} rows{packed}; set the dataset for yours")


def _blocked(blocks: int, rows: int, request: Any, train: Any) -> str:
    """'packed into 31 blocks of 2,048 tokens', 'padded to 512 tokens'."""
    seq = f"{int(request.seq_len):,}"
    if train.packing:
        return f"packed into {blocks:,} blocks of {seq} tokens"
    return f"padded to {seq} tokens" + (f", {blocks:,} of them trained" if blocks != rows else "")


def _data_blocks(request: Any, train: Any, spec: str) -> int | None:
    """The blocks the trainer makes of the run's own data (the train option `dataset`, typed in the wizard), as
    `plan --data` counts them (engine/request/args.py; the caller takes the eval split off): the data profile with
    the run's tokenizer, a subprocess cached per file version. The wizard counted rows where `plan --data` counted
    blocks (10,000 chats of ~500 tokens packed into 2,048-token blocks: four times the steps). None when the
    tokenizer is not on this machine (the profile's note): the rows are counted then."""
    weights = _run_weights(request, train)
    if weights is None:
        return None
    columns = tuple(sorted((train.data_columns or {}).items()))
    return _profiled_blocks(spec, _version(spec), request.model, weights, int(request.seq_len), bool(train.packing),
                            columns)


def _bundled_blocks(request: Any, train: Any, path: str) -> int | None:
    """The blocks the bundled trainer makes of the bundled SFT data, from its own reading (the data profile,
    engine/request/data_profile.py) when the run's tokenizer is the byte tokenizer of random-init weights: no
    download, no torch, ~0.2 s once and cached. The wizard's first run on the CPU planned 7 steps of 1,000 rows
    where the trainer packed them into 31 blocks of 2048 tokens and ran 1 step. A real tokenizer is the Hub's:
    not fetched to count a demo (the rows are counted, and the plan says so). None when not known."""
    from scaletrain.engine.request.weights import RANDOM_INIT

    if (request.objective or "sft") != "sft" or _run_weights(request, train) != RANDOM_INIT:
        return None
    return _profiled_blocks(path, _version(path), request.model, RANDOM_INIT, int(request.seq_len),
                            bool(train.packing), ())


def _run_weights(request: Any, train: Any) -> str | None:
    """The weights the run starts from (engine.request.weights.resolve_weights); None without a model, or for one
    the plan itself refuses, in its own words."""
    from scaletrain.engine.request.weights import resolve_weights

    if not request.model:
        return None
    try:
        return resolve_weights(train.model_source, request.model)
    except Exception:            # noqa: BLE001 - the plan's own refusal says why
        return None


@lru_cache(maxsize=64)
def _profiled_blocks(spec: str, version: tuple, model: str, weights: str, seq_len: int, packing: bool,
                     columns: tuple) -> int | None:
    """The data profile's blocks (engine/request/data_profile.py), once per file version in this process: the
    wizard asks on every what-if key. None when it cannot tell (no tokenizer here, unreadable data)."""
    from scaletrain.engine.errors import ScaletrainError
    from scaletrain.engine.request.data_profile import profile_data

    try:
        profile = profile_data(spec, model, weights, seq_len, packing=packing, columns=dict(columns) or None)
    except ScaletrainError:
        return None
    blocks = profile.blocks
    return blocks if isinstance(blocks, int) and blocks > 0 and not profile.error else None


def _rows(spec: str) -> int | None:
    """The rows of a data file or folder (engine.request.data_source.resolve_data), counted once per file version:
    the wizard asks on every what-if key, and reading the file each time costs milliseconds."""
    return _rows_of(spec, _version(spec))


def _version(spec: str) -> tuple:
    """A data file's or folder's (size, mtime): what a cached count of it is valid for; () for a hub id."""
    import os

    try:
        st = os.stat(os.path.expanduser(spec))
        return (st.st_size, st.st_mtime_ns)
    except (OSError, ValueError):
        return ()             # a hub id: resolve_data looks it up in the cache


@lru_cache(maxsize=64)
def _rows_of(spec: str, version: tuple) -> int | None:
    from scaletrain.engine.request.data_source import resolve_data

    return resolve_data(spec).rows


def with_known_length(request: Any, train: Any) -> Any:
    """The request with its dataset size filled in by known_length (unchanged when it cannot be known)."""
    n = known_length(request, train).samples
    return request if request.dataset_size is not None or n is None else request.with_(dataset_size=n)


@dataclass(frozen=True)
class RunTime:
    """Step, epoch and total time of the run as the trainer runs it (max_steps or the epochs), and the rate."""

    step_seconds: float
    epoch_seconds: float | None
    total_seconds: float | None
    steps: int | None
    hours_per_1000_samples: float

    def text(self) -> str:
        """'8.8 s/step · 2.3 min/epoch · 4.6 min total · 0.019 h per 1,000 samples'."""
        from scaletrain.engine.units import fmt_seconds

        parts = [f"{fmt_seconds(self.step_seconds)}/step"]
        if self.epoch_seconds is not None:
            parts.append(f"{fmt_seconds(self.epoch_seconds)}/epoch")
        parts.append(f"{fmt_seconds(self.total_seconds)} total" if self.total_seconds is not None
                     else "total: give the samples")
        h = self.hours_per_1000_samples          # under 36 s in seconds (a tiny model's "4.73e-05 h" read as noise)
        parts.append(f"{h:.3g} h per 1,000 samples" if h >= 0.01 else f"{fmt_seconds(h * 3600)} per 1,000 samples")
        return " · ".join(parts)


def run_time(plan: Any, train: Any) -> RunTime | None:
    """The plan's time model over the run's length (run_length: train.max_steps overrides the epochs); None when
    the plan has no time estimate. Hours per 1,000 samples: the step time over the samples one step takes."""
    t = plan.time
    if t is None:
        return None
    steps = run_length(plan, train).steps
    total = steps * t.step_seconds if steps is not None else None
    per_1000 = t.step_seconds / plan.setup.effective_batch * 1000 / 3600
    return RunTime(t.step_seconds, t.epoch_seconds, total, steps, per_1000)


@dataclass(frozen=True)
class EvalCost:
    """What the eval split adds to a run: evaluations × seconds each (forward only, every rank its share)."""

    evaluations: int
    samples: int
    seconds_each: float

    @property
    def seconds(self) -> float:
        return self.evaluations * self.seconds_each

    def text(self) -> str:
        from scaletrain.engine.units import fmt_seconds

        return (f"eval: {self.evaluations} pass{'es' if self.evaluations != 1 else ''} × {self.samples:,} samples × "
                f"{fmt_seconds(self.seconds_each)} = {fmt_seconds(self.seconds)}")

    def to_json(self) -> dict[str, Any]:
        return {"evaluations": self.evaluations, "samples": self.samples, "seconds_each": self.seconds_each,
                "seconds": self.seconds}


def eval_cost(plan: Any, train: Any) -> EvalCost | None:
    """The eval passes the trainer will run (every eval_every steps, default checkpoint_every, and at the end),
    each a forward of the split's samples shared by the ranks: the time model's forward share of a micro-step
    (model FLOPs ÷ 3 of the step's FLOPs, backward being twice the forward) per sample. None without a split."""
    t, s = plan.time, plan.setup
    if t is None or not (train.eval_data or train.eval_fraction):
        return None
    if train.eval_data:
        from scaletrain.engine.request.data_source import resolve_data

        samples = resolve_data(train.eval_data).rows
    elif s.dataset_size:
        samples = max(1, math.ceil(train.eval_fraction * s.dataset_size))
    else:
        return None
    steps = run_length(plan, train).steps
    if steps is None:
        return None
    every = train.eval_every or train.checkpoint_every
    evaluations = steps // every + (1 if steps % every else 0)
    forward_share = (t.model_flops_per_step / 3) / t.flops_per_step if t.flops_per_step > 0 else 1 / 3
    per_sample = t.compute_seconds * forward_share / (s.micro_batch * s.grad_accum)
    per_rank = math.ceil(samples / s.world_size)
    return EvalCost(evaluations, samples, per_rank * per_sample)

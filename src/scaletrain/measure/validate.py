"""`scaletrain validate`: run the planned configuration for a few steps and put predicted next to measured.

Memory on CPU comes from the same ground truth as the test suite (measure/step.py: torch.profiler's memory
timeline over one steady-state optimizer step of the plan's per-process configuration). On GPUs it is the
trainer's own `torch.cuda.max_memory_allocated/reserved` per rank, read from metrics.jsonl. Step time is the
median of the bundled trainer's step times after warm-up, in a real run of the plan (random-init weights when
the real ones are absent). `derive_calibration` turns a result into a profile for engine/estimate/calibration.py.

A validation run keeps its logs and metrics but no weights: it runs with save_checkpoints false, and whatever
checkpoint folder its run directory holds afterwards is removed (a GPU's disk fills with a few full checkpoints).
A time budget stops the run (every rank) and raises ValidationTimedOut; a failed run raises ValidationFailed with
its run directory, so a sweep can ask the doctor why.
"""

from __future__ import annotations

import tempfile
import threading
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any, Callable

from scaletrain.engine.estimate.calibration import Calibration, stack_signature
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.plan.plan import Plan, evaluate
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.run.layout import RunDir, check_run_dir_path
from scaletrain.engine.run.metrics import MIN_WARMUP_STEPS, steady_step_seconds
from scaletrain.engine.request.options import TrainOptions

MAX_STEPS = 100_000         # a validation measures a few steps; more is a typo


class ValidationFailed(ScaletrainError):
    """The validation run exited non-zero; `run` is its run directory (logs, status.json for the doctor)."""

    def __init__(self, message: str, run: RunDir):
        super().__init__(message)
        self.run = run


class ValidationTimedOut(ValidationFailed):
    """The run was stopped when its time budget ran out."""


@dataclass(frozen=True)
class ValidationResult:
    plan: Plan
    steps: int
    memory_source: str                     # how the measured peak was read
    predicted_allocated_bytes: int         # total − overhead of the configuration that was measured
    measured_allocated_bytes: int | None
    predicted_reserved_bytes: int | None   # total (GPU: allocated peak + allocator reserve + context)
    measured_reserved_bytes: int | None
    predicted_step_seconds: float | None
    measured_step_seconds: float | None
    run_dir: Path
    notes: tuple[str, ...] = ()

    @staticmethod
    def _err(pred: float | None, meas: float | None) -> float | None:
        if pred is None or not meas:
            return None
        return (pred - meas) / meas

    @property
    def memory_error(self) -> float | None:
        return self._err(self.predicted_allocated_bytes, self.measured_allocated_bytes)

    @property
    def time_error(self) -> float | None:
        return self._err(self.predicted_step_seconds, self.measured_step_seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_json(), "steps": self.steps, "memory_source": self.memory_source,
            "predicted_allocated_bytes": self.predicted_allocated_bytes,
            "measured_allocated_bytes": self.measured_allocated_bytes,
            "predicted_reserved_bytes": self.predicted_reserved_bytes,
            "measured_reserved_bytes": self.measured_reserved_bytes,
            "predicted_step_seconds": self.predicted_step_seconds,
            "measured_step_seconds": self.measured_step_seconds,
            "memory_error": self.memory_error, "time_error": self.time_error,
            "run_dir": str(self.run_dir), "notes": list(self.notes),
        }


def _measure_precision(plan: Plan) -> str:
    """measure/step.py's name for the regime the trainer runs this plan in (weights dtype, autocast or not)."""
    from scaletrain.engine.estimate.numerics import numerics

    s = plan.setup
    if s.precision == "fp32":
        return "fp32"
    nm = numerics(s)
    if not nm.autocast:
        return "bf16-pure"
    return "bf16" if nm.residual == 4 else "bf16-autocast"


def _per_process_setup(plan: Plan) -> tuple[Plan, str | None]:
    """What one CPU process of the plan holds, as the profiler sees it: no DDP buckets, no ZeRO sharding."""
    s = plan.setup
    if s.world_size == 1 and s.strategy == "ddp":
        return plan, None
    one = s.with_(hardware=replace(s.hardware, gpus_per_node=1, nodes=1), strategy="ddp", offload="none")
    note = (f"memory measured for one process without {s.strategy.label} "
            f"(the profiler runs one process); compared with the engine's prediction for that process")
    return evaluate(one, headroom_fraction=plan.memory.headroom_fraction, name=plan.name), note


def measure_cpu_memory(plan: Plan) -> tuple[int, Plan, tuple[str, ...]]:
    from scaletrain.measure.step import measure_step
    from scaletrain.trainer.model import with_experts_implementation

    s = plan.setup
    if s.optimizer == "adamw-8bit":
        raise ScaletrainError("the CPU memory ground truth (measure/step.py) has no adamw-8bit; validate it on a GPU, "
                              "where the trainer's own peaks are the measurement")
    target, note = _per_process_setup(plan)
    if s.objective != "sft":
        return _measure_objective_memory(plan), target, (note,) if note else ()
    m = measure_step(with_experts_implementation(dict(s.model.config), str(s.experts_impl)), method=s.method, lora_rank=s.lora_rank, lora_alpha=2 * s.lora_rank,
                     lora_targets=s.lora_targets if s.method != "full" else None, micro_batch=s.micro_batch,
                     seq_len=s.seq_len, grad_ckpt=s.grad_ckpt, attn=s.attn, precision=_measure_precision(plan),
                     optimizer=s.optimizer, grad_accum=s.grad_accum, device="cpu",
                     optimizer_impl=s.optimizer_impl, loop=str(s.loop),   # the loop the plan's numbers are for
                     loss=str(s.loss))
    return m.peak_allocated_bytes, target, (note,) if note else ()


def _measure_objective_memory(plan: Plan) -> int:
    """Reward/DPO/GRPO: one real TRL step of the plan's per-process configuration under the profiler
    (measure/objective_step.py, the same ground truth as tests/trainer/test_objectives_groundtruth.py)."""
    from scaletrain.engine.choices import choices_of
    from scaletrain.trainer.objective_build import ObjectiveRun
    from scaletrain.measure.objective_step import measure_objective_step
    from scaletrain.trainer.model import with_experts_implementation

    s = plan.setup
    run = ObjectiveRun(
        objective=str(s.objective), model_config=with_experts_implementation(dict(s.model.config), str(s.experts_impl)),
        output_dir="", method=str(s.method),
        lora_rank=s.lora_rank, lora_targets=tuple(s.lora_targets) if s.method != "full" else None,
        **choices_of(s), bf16_weights=s.method == "full" and s.master_weights == "bf16", grad_ckpt=s.grad_ckpt, micro_batch=s.micro_batch, grad_accum=s.grad_accum,
        seq_len=s.seq_len, prompt_len=s.prompt_len, num_generations=s.num_generations, ref_model=str(s.ref_model))
    return measure_objective_step(run).peak_allocated_bytes


def run_steps(request: PlanRequest, train: TrainOptions, steps: int, run_dir: Path,
              on_output: Callable[[int | None, str], None] | None = None, *, plan: Plan | None = None,
              budget_seconds: float | None = None) -> tuple[Plan, list[Any], RunDir]:
    """Write the plan's run directory with max_steps = `steps` and no checkpoints, run it with the bundled trainer
    (stopped after `budget_seconds`), and remove any checkpoint weights it holds afterwards. `plan`: a plan made
    elsewhere from this request (e.g. with setup fields the request cannot name); default make_plan(request)."""
    from scaletrain.engine.launch.launcher import launch, prepare_launch
    from scaletrain.engine.run.metrics import read_metrics
    from scaletrain.engine.run.writers import write_run_dir

    if budget_seconds is not None and not budget_seconds > 0:
        raise ScaletrainError(f"the time budget must be positive seconds (got {budget_seconds})")
    plan = plan or make_plan(request)
    _require_devices(plan)
    # memory and time do not depend on the weights' values: random init unless weights are named (no download)
    train = replace(train, max_steps=steps, save_checkpoints=False, keep_checkpoints=None, script=None,
                    script_args=(), model_source=train.model_source or "random-init")
    run = write_run_dir(plan, request, train, run_dir, overwrite=True, random_quantized_ok=True)
    stop = threading.Event()
    timer = threading.Timer(budget_seconds, stop.set) if budget_seconds else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        # a validation's folder is scratch: what it trains (and what an earlier one left) is removed below, not kept
        result = launch(run.path, on_output=on_output, stop=stop,
                        prepared=prepare_launch(run.path, keep_earlier=False))
    finally:
        if timer is not None:
            timer.cancel()
        run.remove_checkpoints()
    if result.interrupted:
        if stop.is_set():
            raise ValidationTimedOut(f"the validation run did not finish within its {budget_seconds:g} s budget "
                                     f"(stopped); logs in {run.logs}", run)
        raise ValidationFailed(f"the validation run was interrupted; logs in {run.logs}", run)
    if not result.ok:
        raise ValidationFailed(f"the validation run failed with exit code {result.exit_code}"
                               + (f" on rank {result.first_failing_rank}" if result.first_failing_rank is not None
                                  else "") + f"; logs in {run.logs}", run)
    return plan, read_metrics(run.metrics), run


def validate(request: PlanRequest, train: TrainOptions, *, steps: int = 20, run_dir: str | Path | None = None,
             on_output: Callable[[int | None, str], None] | None = None, plan: Plan | None = None,
             budget_seconds: float | None = None) -> ValidationResult:
    check_steps(steps)
    plan = plan or make_plan(request)
    _require_devices(plan)                     # before anything is written: a GPU plan never runs on CPU here
    base = check_run_dir_path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="scaletrain-validate-"))
    plan, series, run = run_steps(request, train, steps, base, on_output, plan=plan, budget_seconds=budget_seconds)
    return _result(plan, series, run)


def check_steps(steps: object) -> None:
    """--steps: enough to time some after the warm-up, few enough to be a validation."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not MIN_WARMUP_STEPS + 1 <= steps <= MAX_STEPS:
        raise ScaletrainError(f"--steps must be at least {MIN_WARMUP_STEPS + 1} (warm-up steps are not timed) and at "
                              f"most {MAX_STEPS:,} (got {steps})")


def _result(plan: Plan, series: list[Any], run: Any) -> ValidationResult:
    """Predicted next to measured for a finished validation run."""
    s = plan.setup
    notes: list[str] = []
    if s.device == "cpu":
        measured_alloc, target, extra = measure_cpu_memory(plan)
        notes += extra
        source = "torch.profiler memory timeline, one steady-state step (CPU)"
        pred_alloc = target.memory.allocated_peak_bytes
        pred_res = meas_res = None
    else:
        peaks = [m for rec in series for m in rec.peak_memory]
        alloc = [m.allocated_bytes for m in peaks if m.allocated_bytes is not None]
        res = [m.reserved_bytes for m in peaks if m.reserved_bytes is not None]
        measured_alloc = max(alloc) if alloc else None
        meas_res = max(res) if res else None
        source = "torch.cuda.max_memory_allocated / max_memory_reserved per rank (trainer metrics)"
        pred_alloc = plan.memory.allocated_peak_bytes
        pred_res = plan.memory.total_bytes
    pred_step = plan.time.step_seconds if plan.time is not None else None
    return ValidationResult(plan=plan, steps=len(series), memory_source=source,
                            predicted_allocated_bytes=pred_alloc, measured_allocated_bytes=measured_alloc,
                            predicted_reserved_bytes=pred_res, measured_reserved_bytes=meas_res,
                            predicted_step_seconds=pred_step, measured_step_seconds=steady_step_seconds(series),
                            run_dir=run.path, notes=tuple(notes))


def _require_devices(plan: Plan) -> None:
    from scaletrain.engine.devices.detect import require_local_gpus

    s = plan.setup
    require_local_gpus(str(s.device), s.hardware.gpus_per_node, f"the plan ({s.hardware.describe()})")


def derive_calibration(r: ValidationResult, source: str) -> Calibration:
    """A profile from one validation: compute scale from the timed steps, allocator reserve from the GPU peaks."""
    s = r.plan.setup
    t = r.plan.time
    if t is None or r.measured_step_seconds is None:
        raise ScaletrainError("no timed steps to calibrate from; run more --steps")
    if t.compute_seconds <= 0:
        raise ScaletrainError("the plan predicts no compute time; nothing to calibrate")
    non_compute = t.step_seconds - t.compute_seconds
    # relative to the uncalibrated model: a plan made under an older profile already carries its scale
    scale = t.constants.compute_scale * max(1e-6, r.measured_step_seconds - non_compute) / t.compute_seconds
    achieved = (t.model_flops_per_step / (r.measured_step_seconds * t.peak_flops)
                if s.device != "cpu" and t.peak_flops > 0 else None)
    reserve = None
    if r.measured_reserved_bytes and r.measured_allocated_bytes:
        reserve = max(0.0, r.measured_reserved_bytes / r.measured_allocated_bytes - 1.0)
    return Calibration(device=s.hardware.gpu.key, method=s.method, stack=stack_signature(),
                       created=date.today().isoformat(), source=source, compute_scale=round(scale, 4),
                       achieved_utilization=None if achieved is None else round(achieved, 4),
                       allocator_reserve_fraction=None if reserve is None else round(reserve, 4))

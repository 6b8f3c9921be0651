"""scaletrain's engine: the typed library behind every front end. No Textual, no Rich, no torch at import.

The public API, by where a plan goes (request → setup → plan → run directory → launcher → metrics/status →
monitor/doctor):

    vocabulary   Method, Strategy, Offload, Precision, Optimizer, Attention, Device
    catalog      load_model, catalog_ids, ModelArch, parse_gpus, find_gpu, GPU_CATALOG, GpuSpec, Hardware
    devices      detect, DetectionResult, hardware_from_detection
    model        TrainingSetup, ResidentModel, estimate_memory, MemoryBreakdown, estimate_time, TimeEstimate,
                 Calibration, load_calibration, save_calibration
    plan         PlanRequest, make_plan, base_setup, Plan, PlannerReport, evaluate, search, with_tables,
                 rank_remedies, Remedy, suggest_lr, LrSuggestion, Preset, load_preset, list_presets, save_preset
    run          RunDir, TrainOptions, PlanDocument, read_plan_document, write_run_dir, render_run_files,
                 launch, prepare_launch, LaunchResult, RunStatus, read_status, apply_remedy, relaunch,
                 StepMetrics, read_metrics, MetricsTail, summarize, RunSeries, run_series, tensorboard_command,
                 RunLength, run_length, default_weights, resolve_weights, weights_problem, weights_warning,
                 weights_note, DataSource, resolve_data
    sampling     make_sampler, Sampler, Tick
    doctor       diagnose, diagnose_paths, Diagnosis
    errors       ScaletrainError (bad input: one line, exit code 2)

`from scaletrain.engine import make_plan` loads only what that name needs (PEP 562), so a front end pays for
the parts it uses: `scaletrain plan` never loads the launcher, the sampler or the doctor.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_API = {
    "scaletrain.engine.vocabulary": ("Method", "Strategy", "Offload", "Precision", "Optimizer", "Attention",
                                     "Device"),
    "scaletrain.engine.errors": ("ScaletrainError",),
    "scaletrain.engine.catalog.architectures": ("ModelArch", "load_model", "catalog_ids"),
    "scaletrain.engine.catalog.hardware": ("GPU_CATALOG", "GpuSpec", "Hardware", "find_gpu", "parse_gpus"),
    "scaletrain.engine.devices.nvml": ("DetectionResult", "detect"),
    "scaletrain.engine.devices.detect": ("hardware_from_detection",),
    "scaletrain.engine.model.setup": ("ResidentModel", "TrainingSetup"),
    "scaletrain.engine.model.breakdown": ("MemoryBreakdown",),
    "scaletrain.engine.model.memory": ("estimate_memory",),
    "scaletrain.engine.model.timing": ("TimeEstimate", "estimate_time"),
    "scaletrain.engine.model.calibration": ("Calibration", "load_calibration", "save_calibration"),
    "scaletrain.engine.plan.request": ("PlanRequest", "base_setup"),
    "scaletrain.engine.plan.plan": ("Plan", "PlannerReport", "evaluate"),
    "scaletrain.engine.plan.planner": ("make_plan",),
    "scaletrain.engine.plan.search": ("search",),
    "scaletrain.engine.plan.tables": ("with_tables",),
    "scaletrain.engine.plan.remedies": ("Remedy", "rank_remedies"),
    "scaletrain.engine.plan.lr": ("LrSuggestion", "suggest_lr"),
    "scaletrain.engine.plan.presets": ("Preset", "list_presets", "load_preset", "save_preset"),
    "scaletrain.engine.run.layout": ("RunDir", "tensorboard_command"),
    "scaletrain.engine.run.run_length": ("RunLength", "run_length"),
    "scaletrain.engine.run.options": ("TrainOptions",),
    "scaletrain.engine.run.weights": ("default_weights", "resolve_weights", "weights_note", "weights_problem",
                                      "weights_warning"),
    "scaletrain.engine.run.data_source": ("DataSource", "resolve_data"),
    "scaletrain.engine.run.plan_document": ("PlanDocument", "read_plan_document"),
    "scaletrain.engine.run.writers": ("render_run_files", "write_run_dir"),
    "scaletrain.engine.run.launcher": ("LaunchResult", "launch", "prepare_launch"),
    "scaletrain.engine.run.status": ("RunStatus", "read_status"),
    "scaletrain.engine.run.relaunch": ("apply_remedy", "relaunch"),
    "scaletrain.engine.run.metrics": ("MetricsTail", "RunSeries", "StepMetrics", "read_metrics", "run_series",
                                      "summarize"),
    "scaletrain.engine.sampling.sampler": ("Sampler", "Tick", "make_sampler"),
    "scaletrain.engine.doctor.diagnosis": ("diagnose", "diagnose_paths"),
    "scaletrain.engine.doctor.summary": ("Diagnosis",),
}
_HOME = {name: module for module, names in _API.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:   # the same names, for type checkers and readers following imports
    from scaletrain.engine.catalog.architectures import ModelArch, catalog_ids, load_model
    from scaletrain.engine.catalog.hardware import GPU_CATALOG, GpuSpec, Hardware, find_gpu, parse_gpus
    from scaletrain.engine.devices.detect import hardware_from_detection
    from scaletrain.engine.devices.nvml import DetectionResult, detect
    from scaletrain.engine.doctor.diagnosis import diagnose, diagnose_paths
    from scaletrain.engine.doctor.summary import Diagnosis
    from scaletrain.engine.errors import ScaletrainError
    from scaletrain.engine.model.breakdown import MemoryBreakdown
    from scaletrain.engine.model.calibration import Calibration, load_calibration, save_calibration
    from scaletrain.engine.model.memory import estimate_memory
    from scaletrain.engine.model.setup import ResidentModel, TrainingSetup
    from scaletrain.engine.model.timing import TimeEstimate, estimate_time
    from scaletrain.engine.plan.lr import LrSuggestion, suggest_lr
    from scaletrain.engine.plan.plan import Plan, PlannerReport, evaluate
    from scaletrain.engine.plan.planner import make_plan
    from scaletrain.engine.plan.presets import Preset, list_presets, load_preset, save_preset
    from scaletrain.engine.plan.remedies import Remedy, rank_remedies
    from scaletrain.engine.plan.request import PlanRequest, base_setup
    from scaletrain.engine.plan.search import search
    from scaletrain.engine.plan.tables import with_tables
    from scaletrain.engine.run.launcher import LaunchResult, launch, prepare_launch
    from scaletrain.engine.run.data_source import DataSource, resolve_data
    from scaletrain.engine.run.layout import RunDir, tensorboard_command
    from scaletrain.engine.run.metrics import MetricsTail, RunSeries, StepMetrics, read_metrics, run_series, summarize
    from scaletrain.engine.run.run_length import RunLength, run_length
    from scaletrain.engine.run.options import TrainOptions
    from scaletrain.engine.run.plan_document import PlanDocument, read_plan_document
    from scaletrain.engine.run.relaunch import apply_remedy, relaunch
    from scaletrain.engine.run.status import RunStatus, read_status
    from scaletrain.engine.run.weights import (default_weights, resolve_weights, weights_note, weights_problem,
                                               weights_warning)
    from scaletrain.engine.run.writers import render_run_files, write_run_dir
    from scaletrain.engine.sampling.sampler import Sampler, Tick, make_sampler
    from scaletrain.engine.vocabulary import Attention, Device, Method, Offload, Optimizer, Precision, Strategy

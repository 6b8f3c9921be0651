"""The wizard's state: what the user chose so far, immutable, and the one place it becomes a PlanRequest.

Screens parse their text fields into a new WizardState (bad text → ScaletrainError with a one-line message that the
screen shows in place); the plan always comes from the engine (`plan_for` → make_plan). Nothing here estimates
memory or time. No Textual imports: the plain (`--plain`) wizard uses the same functions.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog import traced
from scaletrain.engine.catalog.hardware import (GPU_CATALOG, CPU_DEVICE, GpuSpec, Hardware, inter_node_gbit_s,
                                               parse_gpus)
from scaletrain.engine.devices.detect import hardware_from_detection
from scaletrain.engine.devices.nvml import DetectionResult
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.plan.planner import leanest_unfitting_plan, make_plan
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.plan.rows import AlternativeRow
from scaletrain.engine.plan.search import search_key
from scaletrain.engine.plan.what_if import repaired, what_if_changes
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.request.data_source import DataSource, resolve_data
from scaletrain.engine.request.records import check_data
from scaletrain.engine.request.weights import resolve_weights, weights_problem, weights_warning
from scaletrain.engine.plan.pins import PinCost, pin_cost
from scaletrain.engine.run.run_length import with_known_length
from scaletrain.tui.wizard.sources import model_weights, parse_data
from scaletrain.engine.request.args import asked_from_args
from scaletrain.engine.request.fields import FORM_FIELD, PIN_FIELDS, parse_resident, screen_fields

# Hardware offered when nothing is detected and nothing was named: the most common fine-tuning node.
DEFAULT_CATALOG_GPUS = "8xH100-SXM"
# Wizard starting points when neither flags nor a preset say otherwise (the method is asked, never assumed).
DEFAULT_EFFECTIVE_BATCH = 128
DEFAULT_PLAN_NAME = PlanRequest.name


def auto_name(model: str, method: str) -> str:
    """'Qwen/Qwen2.5-7B-Instruct', 'lora' → 'qwen2.5-7b-instruct-lora' (empty model: the default name)."""
    base = os.path.basename(model.rstrip("/")).removesuffix(".json") if model else ""
    if base == "config" and model:
        base = os.path.basename(os.path.dirname(model.rstrip("/")))
    slug = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in base.lower()).strip("-.")
    return f"{slug}-{method}" if slug else DEFAULT_PLAN_NAME


def catalog_gpus() -> tuple[GpuSpec, ...]:
    """GPUs the hardware step offers: the datasheet catalog plus the host CPU (gloo runs, demos, tests)."""
    return (*GPU_CATALOG, CPU_DEVICE)


@dataclass(frozen=True)
class WizardState:
    """Everything the user fixed; None fields in `request` are left to the planner."""

    request: PlanRequest
    train: TrainOptions = field(default_factory=TrainOptions)
    hw_source: str = "catalog"          # "detected" (NVML, request.gpus == "auto") | "catalog" (named hardware)
    run_dir: str | None = None
    preset: str | None = None
    method_chosen: bool = True          # False until the user picks full / LoRA / QLoRA (a fresh wizard asks)
    weights_chosen: bool = False        # the model step set train.model_source (a preset's counts as chosen)
    job_specs: tuple[str, ...] = ()     # --job-spec: the write step writes (and lists) these specs too
    preset_pins: tuple[tuple[str, Any], ...] = ()   # the planner choices the preset fixed (engine.plan.pins)

    def with_request(self, **changes: Any) -> "WizardState":
        return replace(self, request=self.request.with_(**changes))

    def with_train(self, **changes: Any) -> "WizardState":
        return replace(self, train=replace(self.train, **changes))

    def with_(self, **changes: Any) -> "WizardState":
        return replace(self, **changes)

    # ---- hardware ----------------------------------------------------------------------------------------------
    def catalog_choice(self) -> tuple[str, int, int]:
        """(gpu key, GPUs per node, nodes) of the named hardware, or the default when the request says auto."""
        named = self.hw_source == "catalog" and self.request.gpus != "auto"
        text = self.request.gpus if named else DEFAULT_CATALOG_GPUS
        try:
            hw = parse_gpus(text, nodes=self.request.nodes)
        except ScaletrainError:
            hw = parse_gpus(DEFAULT_CATALOG_GPUS)
        return hw.gpu.key, hw.gpus_per_node, hw.nodes

    def with_catalog_hardware(self, gpu_key: str, per_node: int, nodes: int) -> "WizardState":
        return replace(self, hw_source="catalog",
                       request=self.request.with_(gpus=f"{per_node}x{gpu_key}", nodes=nodes))

    def with_detected_hardware(self, nodes: int) -> "WizardState":
        return replace(self, hw_source="detected", request=self.request.with_(gpus="auto", nodes=nodes))

    def with_model(self, **changes: Any) -> "WizardState":
        """Model-step changes; a plan the user did not name is named after model and method (the run folder)."""
        req = self.request
        new = req.with_(**changes)
        if req.name in (DEFAULT_PLAN_NAME, auto_name(req.model, req.method)):
            new = new.with_(name=auto_name(new.model, new.method))
        return replace(self, request=new)

    def clear_what_ifs(self) -> "WizardState":
        """Forget choices the plan step made, so the planner solves again after an earlier step changed."""
        return self.with_request(micro_batch=None, grad_accum=None, strategy=None, offload=None, grad_ckpt=None,
                                 loss=None)

    def planning_inputs(self) -> PlanRequest:
        """The request minus the plan step's choices, in one spelling (nodes 1 = None, tuples not lists)."""
        r = self.clear_what_ifs().request
        gpus, nodes = r.gpus, r.nodes or 1
        if self.hw_source == "catalog":      # "2x8xRTX4090" and "8xRTX4090" on 2 nodes are the same machines
            try:
                hw = parse_gpus(r.gpus, nodes=r.nodes)
                gpus, nodes = f"{hw.gpus_per_node}x{hw.gpu.key}", hw.nodes
            except ScaletrainError:
                pass
        link = r.inter_node_gbps
        if link is not None:
            try:
                link = inter_node_gbit_s(link)
            except ScaletrainError:
                pass
        return r.with_(gpus=gpus, nodes=nodes, inter_node_gbps=link,
                       lora_targets=tuple(r.lora_targets) if r.lora_targets is not None else None,
                       residents=tuple((str(m), int(b)) for m, b in r.residents))

    def rebased(self, before: "WizardState") -> "WizardState":
        """Keep fixed choices (a preset's micro batch, strategy, ...) only while the inputs they were made for stay."""
        return self if self.planning_inputs() == before.planning_inputs() else self.clear_what_ifs()


@dataclass
class WizardOptions:
    """What the wizard starts from. `detect` is NVML's detect() unless a test or bench passes a recorded one."""

    state: WizardState
    detect: Callable[[], DetectionResult] | None = None
    launch: bool = True                       # the write step may launch (tests of the write step turn it off)
    overwrite: bool = False                   # --overwrite: a run directory holding another plan is moved aside


# ---- building the first state ------------------------------------------------------------------------------------
def state_from_args(args: argparse.Namespace) -> WizardState:
    """Flags and `--preset NAME` → the wizard's first state (same precedence as the CLI: preset, --set, flags)."""
    preset = getattr(args, "preset", None)
    asked = asked_from_args(args)
    train = asked.train if preset else TrainOptions()   # the preset's train options (lr, data, ...), --set train.*
    if preset or getattr(args, "model", None):
        request = asked.request()
    else:
        request = PlanRequest(model="", **{"gpus": "auto", **{k: v for k, v in asked.fields.items() if k != "model"}})
    if request.effective_batch is None and request.micro_batch is None and request.grad_accum is None:
        request = request.with_(effective_batch=DEFAULT_EFFECTIVE_BATCH)
    gpus = (request.gpus or "auto").strip()
    source = "detected" if gpus.lower() == "auto" else "catalog"
    if source == "catalog":
        parse_gpus(gpus, nodes=request.nodes, inter_node_gbps=request.inter_node_gbps)  # bad --gpus: one line, now
    pins: tuple[tuple[str, Any], ...] = ()
    if preset:                          # the preset's own name in the header, whatever case it was typed in
        from scaletrain.engine.request.presets import load_preset

        preset = load_preset(preset).name
        pins = tuple((f, getattr(request, f)) for f in PIN_FIELDS if getattr(request, f) is not None)
    return WizardState(request=request.with_(gpus=gpus), train=train, hw_source=source, preset_pins=pins,
                       run_dir=getattr(args, "run_dir", None), preset=preset,
                       method_chosen=bool(preset or getattr(args, "method", None)), weights_chosen=bool(preset),
                       job_specs=tuple(getattr(args, "job_spec", None) or ()))


# ---- hardware and plan (engine calls) ----------------------------------------------------------------------------
def hardware_for(state: WizardState, detection: DetectionResult | None) -> Hardware:
    """The Hardware the plan runs on: NVML's cards, or the named catalog entry."""
    req = state.request
    if state.hw_source == "detected":
        if detection is None:
            raise ScaletrainError("GPU detection has not finished yet; wait a moment or pick catalog hardware")
        return hardware_from_detection(nodes=req.nodes, inter_node_gbps=req.inter_node_gbps, result=detection)
    return parse_gpus(req.gpus, nodes=req.nodes, inter_node_gbps=req.inter_node_gbps)


def plan_for(state: WizardState, detection: DetectionResult | None) -> Plan:
    """The engine's plan for the current choices (ScaletrainError when they cannot be planned)."""
    if not state.request.model:
        raise ScaletrainError("no model chosen yet; pick one from the catalog or give a config.json path")
    return make_plan(counted(state), hardware_for(state, detection))


def counted(state: WizardState) -> PlanRequest:
    """The request with the run's length known: its samples, else the rows of its data or of the bundled data
    (engine.run.run_length.known_length), so step, epoch and total time show by default."""
    return with_known_length(state.request, state.train)


def wants_start_screen(state: WizardState) -> bool:
    """`scaletrain` with nothing that says what to plan (no preset, model or hardware): the first screen offers the
    presets and "start from scratch"."""
    return state.preset is None and not state.request.model and state.hw_source == "detected"


def state_for_preset(name: str | None, before: WizardState) -> WizardState:
    """The start screen's pick: the named preset's choices (as `--preset NAME`), or the state to start from scratch;
    the run directory given on the command line stays."""
    if name is None:
        return before
    return state_from_args(argparse.Namespace(preset=name, run_dir=before.run_dir))


def plannable(state: WizardState, detection: DetectionResult | None) -> tuple[WizardState, Plan]:
    """The state and its plan; plan-step choices (what-ifs, a preset's split) that no longer plan are dropped."""
    try:
        return state, plan_for(state, detection)
    except ScaletrainError:
        cleared = state.clear_what_ifs()
        cleared = replace(cleared, request=repaired(cleared.request))
        if cleared == state:
            raise
        return cleared, plan_for(cleared, detection)


def launchable_here(plan: Plan) -> str | None:
    """None when the plan can run on this machine, else the one-line reason it cannot."""
    hw = plan.setup.hardware
    if hw.source == "detected" or hw.gpu.key == CPU_DEVICE.key:
        return None
    return (f"this plan is for {hw.describe()}, which is not this machine's hardware; copy the run directory to "
            "that machine and run `scaletrain launch DIR` there (or `bash launch.sh` in it)")


# ---- what-if keys on the plan step: the engine's changes (engine/plan/what_if.py), the engine recomputes ----------
def what_if(state: WizardState, plan: Plan, change: str) -> WizardState:
    """Apply one what-if key to the choices behind `plan`; every other choice of the plan stays fixed."""
    return state.with_request(**what_if_changes(plan, change))


def pin_effective_batch(state: WizardState, plan: Plan) -> WizardState:
    """A request that fixes micro batch × accumulation and no effective batch (a preset's) means the batch they make.

    Pinned here, the batch step hands back the same number and `rebased` sees no changed input, so the preset's
    split stays. Unpinned, the batch step's filled-in effective batch (None → 16) read as a new input: the split was
    dropped and the planner searched again, so the wizard showed micro 8 × accum 1 where the headless run of the
    same preset (make_plan on the preset's request) ran micro 4 × accum 2."""
    if state.request.effective_batch is None:
        return state.with_request(effective_batch=plan.setup.effective_batch)
    return state


def pins_for(state: WizardState, plan: Plan, detection: DetectionResult | None) -> tuple[PinCost | None, str]:
    """What the state's pinned choices cost against the planner's best (engine.plan.pins.pin_cost), and whose
    they are: the preset's while they are the ones it fixed, else the user's."""
    try:
        cost = pin_cost(counted(state), plan, hardware_for(state, detection))
    except ScaletrainError:
        return None, ""
    mine = tuple((f, getattr(state.request, f)) for f in PIN_FIELDS if getattr(state.request, f) is not None)
    whose = f"the {state.preset} preset's" if state.preset and mine == state.preset_pins else "your"
    return cost, whose


def unpin(state: WizardState, plan: Plan) -> WizardState:
    """Every planner choice free again at the plan's effective batch (the `u` key): the planner's best."""
    return state.clear_what_ifs().with_request(effective_batch=plan.setup.effective_batch)


def pick_alternative(state: WizardState, row: AlternativeRow) -> WizardState:
    """Fix the choices of one of the planner's ranked alternatives (a rank_alternatives row)."""
    return state.with_request(effective_batch=row.effective_batch, micro_batch=row.micro_batch,
                              grad_accum=row.grad_accum, strategy=row.strategy, offload=row.offload,
                              grad_ckpt=row.grad_ckpt)


def is_current(row: AlternativeRow, plan: Plan) -> bool:
    return row.search_key() == search_key(plan.setup)


def plan_what_if(state: WizardState, detection: DetectionResult | None) -> tuple[Plan, str | None]:
    """The plan for a what-if, shown even when it does not fit: (plan, the engine's refusal or None).

    The planner refuses a fixed combination that does not fit; the wizard still draws it over the line, so the
    user sees by how much, with the planner's message beside it.
    """
    try:
        return plan_for(state, detection), None
    except ScaletrainError as e:
        over = _leanest_over_the_line(state, detection)
        if over is None:
            raise
        return over, str(e)


def _leanest_over_the_line(state: WizardState, detection: DetectionResult | None) -> Plan | None:
    try:
        hardware = hardware_for(state, detection)
    except ScaletrainError:
        return None
    return leanest_unfitting_plan(counted(state), hardware)


# ---- parsing what people type --------------------------------------------------------------------------------------
def parse_int(text: str, what: str, *, minimum: int = 1, optional: bool = False) -> int | None:
    t = (text or "").strip().replace(",", "").replace("_", "")
    if not t:
        if optional:
            return None
        raise ScaletrainError(f"{what} is empty; enter a whole number ≥ {minimum}")
    try:
        v = int(t)
    except ValueError:
        raise ScaletrainError(f"{what} must be a whole number ≥ {minimum} (got {text.strip()!r})") from None
    if v < minimum:
        raise ScaletrainError(f"{what} must be a whole number ≥ {minimum} (got {v})")
    return v


def parse_float(text: str, what: str, *, optional: bool = False, positive: bool = True) -> float | None:
    t = (text or "").strip()
    if not t:
        if optional:
            return None
        raise ScaletrainError(f"{what} is empty; enter a number")
    try:
        v = float(t)
    except ValueError:
        raise ScaletrainError(f"{what} must be a number (got {t!r})") from None
    if positive and not v > 0:
        raise ScaletrainError(f"{what} must be positive (got {t})")
    return v


def parse_targets(text: str) -> tuple[str, ...] | None:
    """Comma list of LoRA targets; empty or 'all' = every block linear (the engine checks the names)."""
    t = (text or "").strip()
    if not t or t.lower() == "all":
        return None
    return tuple(x.strip() for x in t.split(",") if x.strip())


def parse_residents(text: str) -> tuple[tuple[str, int], ...]:
    """'MODEL[:BITS], MODEL[:BITS]' → ((model, bits), ...); the CLI's --resident syntax."""
    return tuple(parse_resident(x.strip()) for x in (text or "").split(",") if x.strip())


def format_residents(residents: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{m}:{b}" for m, b in residents)


@dataclass(frozen=True)
class DatasetChoice:
    source: DataSource | None   # data the trainer reads (None: the bundled demo data)
    samples: int | None         # samples, for steps per epoch

    @property
    def path(self) -> str | None:
        return self.source.spec if self.source is not None else None


def parse_dataset(text: str) -> DatasetChoice:
    """A data path (must exist) or a sample count; empty = the bundled demo data, no dataset size."""
    t = (text or "").strip()
    if not t:
        return DatasetChoice(None, None)
    digits = t.replace(",", "").replace("_", "")
    if digits.isdigit():
        n = int(digits)
        if n < 1:
            raise ScaletrainError("dataset size must be at least 1 sample")
        return DatasetChoice(None, n)
    source = resolve_data(t)        # a data file or folder (or a cached HF dataset), counted by the engine
    return DatasetChoice(source, source.rows)


def dataset_text(state: WizardState) -> str:
    """The samples field: the count the estimate uses (empty: counted from a local data file, or none)."""
    return str(state.request.dataset_size) if state.request.dataset_size else ""


# ---- weights and data (parse_weights / parse_data: sources.py) ---------------------------------------------------------
def weights_text(state: WizardState) -> str:
    """What the weights field starts with: the chosen weights, else the weights the model's run starts from (its
    own id or folder; random-init for a config-only model, which the field showed as the model's id)."""
    if state.weights_chosen:
        return state.train.model_source
    return model_weights(state.request.model or "")


def weights_verdict(state: WizardState) -> tuple[str | None, str | None]:
    """(why these weights cannot be written for this method, the random-init warning): the engine's rules on the
    weights the run will really start from (not given: the model's own, engine.request.weights.default_weights)."""
    source = resolve_weights(state.train.model_source, state.request.model)
    return (weights_problem(state.request.method, state.request.base_bits, source), weights_warning(source))


BATCH_FIELDS = screen_fields("batch")      # the batch step's text fields, in order (engine/request/fields.py)


def apply_batch_fields(state: WizardState, values: dict[str, str]) -> WizardState:
    """Step 3's text fields → state. Raises FieldError naming the first bad field (shown next to it)."""
    parsers: dict[str, Callable[[str], Any]] = {"data": parse_data, "dataset": parse_dataset}
    for name in BATCH_FIELDS:
        parsers.setdefault(name, form_parser(name))
    got = {name: parse_named(name, values.get(name, ""), parsers[name]) for name in BATCH_FIELDS}
    if (got["base_lr"] is None) != (got["base_batch"] is None):
        missing = "base_batch" if got["base_batch"] is None else "base_lr"
        raise FieldError(missing, "the LR suggestion needs both a base LR and the base batch it was tuned at")
    ds: DatasetChoice = got["dataset"]
    source: DataSource | None = got["data"] or ds.source   # a data path typed as the samples is the data, counted
    data = source.spec if source is not None else None
    if source is not None:                 # read and checked as the trainer will: its line next to the field
        field = "data" if got["data"] is not None else "dataset"
        try:
            check_data(source.spec, state.request.objective, state.train.data_columns)
        except ScaletrainError as e:
            raise FieldError(field, str(e)) from None
    samples = ds.samples if ds.samples is not None else (source.rows if source is not None else None)
    return state.with_request(
        effective_batch=got["effective_batch"], seq_len=got["seq_len"], dataset_size=samples,
        epochs=got["epochs"], base_lr=got["base_lr"], base_batch=got["base_batch"],
    ).with_train(dataset=data, lr=got["lr"])


def form_parser(name: str) -> Callable[[str], Any]:
    """A number field's parser from the field table: its label names it in a refusal; optional fields may be
    empty."""
    f = FORM_FIELD[name]
    parse = parse_int if f.parse is int else parse_float
    return lambda t: parse(t, f.label or name, optional=f.optional)


class FieldError(ScaletrainError):
    """A ScaletrainError that also names the field it is about, so a screen can show it in place."""

    def __init__(self, field_name: str, message: str):
        super().__init__(message)
        self.field_name = field_name


def parse_named(name: str, text: str, parse: Callable[[str], Any]) -> Any:
    """parse(text); a refusal becomes a FieldError naming the field."""
    try:
        return parse(text)
    except ScaletrainError as e:
        raise FieldError(name, str(e)) from None


def field_value(field: Any, parse: Callable[[str], Any]) -> Any:
    """Parse a form field's text (anything with .field_name and .value); a refusal names the field."""
    return parse_named(field.field_name, field.value, parse)


def within_positions(state: WizardState, arch: Any) -> tuple[WizardState, str | None]:
    """A model with a learned position table (gpt2's 1024) runs no longer sequence: the wizard's sequence length
    comes down to the table, and says so (the batch step shows it). The CLI lowers only its default (a model given
    on the command line: engine/request/args.py) and refuses a typed --seq-len past the table."""
    limit = traced.position_limit(arch.trace)
    was = state.request.seq_len
    if limit is None or was <= limit:
        return state, None
    return state.with_request(seq_len=limit), (f"sequence length {limit:,}, not {was:,}: {arch.name} has learned "
                                               f"embeddings for {limit:,} positions")

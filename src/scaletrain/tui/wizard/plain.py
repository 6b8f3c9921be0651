"""`scaletrain --plain`: the wizard's questions without a full-screen app.

On a terminal the questions are asked with questionary (arrow keys, completion); with stdin piped (CI, scripts,
tests) the same questions are read line by line with input(): an empty line takes the default, a bad answer is
refused with the engine's one-line message and asked again, and input that ends early is one clear error.
Parsing, validation and planning are the same functions the Textual wizard uses (wizard_state, run_files).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog.hardware import GPU_CATALOG, parse_gpus
from scaletrain.engine.catalog.architectures import catalog_ids, load_model
from scaletrain.engine.estimate.setup import (check_num_generations, check_objective_strategy,
                                              check_prompt_len)
from scaletrain.engine.request.fields import FIELD
from scaletrain.engine.request.records import check_data
from scaletrain.engine.request.request import objective_lengths, resolve_hardware
from scaletrain.engine.vocabulary import Method, Objective, RefModel
from scaletrain.tui.wizard.sources import model_weights, parse_weights
from scaletrain.tui.wizard import run_files
from scaletrain.tui.wizard.state import (DEFAULT_CATALOG_GPUS, WizardState, dataset_text, format_residents,
                                         launchable_here, parse_dataset, parse_float, parse_int, parse_residents,
                                         parse_targets, plan_for, state_from_args, weights_verdict, within_positions)

Parse = Callable[[str], Any]


class PipeAsker:
    """Questions on stdout, answers from stdin lines (no TTY needed)."""

    def __init__(self, out=None) -> None:
        self.out = out or sys.stdout

    def _line(self, prompt: str) -> str:
        self.out.write(prompt)
        self.out.flush()
        line = sys.stdin.readline()
        if not line:
            raise ScaletrainError(f"--plain: input ended before the question {prompt.strip()!r} was answered")
        answer = line.rstrip("\n")
        self.out.write(f"{answer}\n" if not sys.stdin.isatty() else "")
        return answer

    def text(self, prompt: str, default: str, parse: Parse) -> Any:
        while True:
            answer = self._line(f"{prompt} [{default}]: " if default else f"{prompt}: ").strip() or default
            try:
                return parse(answer)
            except ScaletrainError as e:
                self.out.write(f"  ✗ {e}\n")

    def choice(self, prompt: str, choices: Sequence[str], default: str) -> str:
        def parse(t: str) -> str:
            if t not in choices:
                raise ScaletrainError(f"{t!r} is not one of: {', '.join(choices)}")
            return t

        return self.text(f"{prompt} ({'/'.join(choices)})", default, parse)

    def confirm(self, prompt: str, default: bool) -> bool:
        def parse(t: str) -> bool:
            t = t.strip().lower()
            if t in ("y", "yes"):
                return True
            if t in ("n", "no"):
                return False
            raise ScaletrainError(f"answer y or n (got {t!r})")

        return self.text(f"{prompt} (y/n)", "y" if default else "n", parse)


class QuestionaryAsker:
    """The same questions with questionary on a real terminal."""

    def __init__(self) -> None:
        import questionary

        self.q = questionary

    @staticmethod
    def _check(parse: Parse) -> Callable[[str], Any]:
        def validate(text: str) -> Any:
            try:
                parse(text)
            except ScaletrainError as e:
                return str(e)
            return True

        return validate

    def text(self, prompt: str, default: str, parse: Parse, completions: Sequence[str] = ()) -> Any:
        check = self._check(lambda t: parse(t.strip() or default))
        if completions:
            answer = self.q.autocomplete(prompt, choices=list(completions), default=default, validate=check,
                                         match_middle=True).unsafe_ask()
        else:
            answer = self.q.text(prompt, default=default, validate=check).unsafe_ask()
        return parse(answer.strip() or default)

    def choice(self, prompt: str, choices: Sequence[str], default: str) -> str:
        return self.q.select(prompt, choices=list(choices), default=default).unsafe_ask()

    def confirm(self, prompt: str, default: bool) -> bool:
        return bool(self.q.confirm(prompt, default=default).unsafe_ask())


def _say(text: str = "") -> None:
    print(text, flush=True)


def _prompt(name: str) -> str:
    """The question for a plan field (engine/request/fields.py)."""
    return FIELD[name].prompt or name


def _label(name: str) -> str:
    return FIELD[name].label or name


def _int(name: str) -> Parse:
    return lambda t: parse_int(t, _label(name))


def _float(name: str) -> Parse:
    return lambda t: parse_float(t, _label(name))


def ask_hardware(ask: Any, state: WizardState) -> tuple[WizardState, Any]:
    """Step 1: detected GPUs (only when --gpus is auto) or named catalog hardware."""
    detection = None
    if state.hw_source == "detected":
        from scaletrain.engine.devices.nvml import detect

        detection = detect()
        if detection.gpus:
            names = ", ".join(sorted({g.name or "N/A" for g in detection.gpus}))
            _say(f"Detected {len(detection.gpus)} GPU(s): {names} (driver {detection.driver_version or 'N/A'})")
            if ask.confirm("Plan for the GPUs detected here?", True):
                nodes = ask.text(_prompt("nodes"), str(state.request.nodes or 1), _int("nodes"))
                return state.with_detected_hardware(nodes), detection
        else:
            _say(f"No GPU detected on this machine ({detection.error or 'none visible'}). "
                 "Plan for hardware from the catalog.")
    default = state.request.gpus if state.hw_source == "catalog" else DEFAULT_CATALOG_GPUS
    hw = ask.text(f"GPUs to plan for, e.g. 4xH200 or 2x8xH100 (catalog: {', '.join(g.key for g in GPU_CATALOG)}, "
                  "CPU)", default, lambda t: parse_gpus(t, nodes=None))
    return state.with_catalog_hardware(hw.gpu.key, hw.gpus_per_node, hw.nodes), detection


def ask_model(ask: Any, state: WizardState) -> WizardState:
    """Step 2: model, method, LoRA settings, resident models."""
    req = state.request
    kwargs = {"completions": catalog_ids()} if isinstance(ask, QuestionaryAsker) else {}
    def model_spec(t: str) -> str:
        load_model(t)                  # refuses an unknown id or a missing path in one line
        return t.strip()

    model = ask.text(_prompt("model"), req.model, model_spec, **kwargs)
    weights = ask.text(_prompt("weights"),
                       state.train.model_source if state.weights_chosen else model_weights(model), parse_weights)
    method = ask.choice(_prompt("method"), Method.values(), req.method)
    changes: dict[str, Any] = dict(model=model, method=method)
    arch = load_model(model)
    if method != "full":
        changes["lora_rank"] = ask.text(_prompt("lora_rank"), str(req.lora_rank), _int("lora_rank"))

        def targets(t: str) -> Any:
            parsed = parse_targets(t)
            arch.lora_params(changes["lora_rank"], parsed)   # the engine checks the names
            return parsed

        # the model's own block linears (phi3: qkv_proj, gate_up_proj), as the wizard's hint says them
        changes["lora_targets"] = ask.text(f"{_prompt('lora_targets')}, this model's: {','.join(arch.block_linear_names)}",
                                           ",".join(req.lora_targets or ()) or "all", targets)

    def residents(t: str) -> Any:
        parsed = parse_residents("" if t.strip().lower() == "none" else t)
        for mid, _bits in parsed:
            load_model(mid)
        return parsed

    changes.update(ask_objective(ask, req))
    changes["residents"] = ask.text(_prompt("resident"),
                                    format_residents(req.residents) or "none", residents)
    chosen, note = within_positions(state.with_model(**changes).rebased(state), arch)
    if note:
        _say(note)
    return chosen.with_train(model_source=weights).with_(method_chosen=True, weights_chosen=True)


def ask_objective(ask: Any, req: Any) -> dict[str, Any]:
    """The objective and its own knobs (DPO: prompt length, reference; GRPO: generations, completion length,
    reference); an empty answer keeps TRL's default, which the engine fills in."""
    while True:   # an objective the planned strategy cannot run here: the engine's line, and asked again
        objective = ask.choice(_prompt("objective"), Objective.values(), req.objective)
        try:
            on_cpu = req.device == "cpu" if req.device else resolve_hardware(req).gpu.key == "CPU"
            check_objective_strategy(objective, str(req.strategy or ""), on_cpu)
            break
        except ScaletrainError as e:
            _say(f"  ✗ {e}")
    out: dict[str, Any] = dict(objective=objective, prompt_len=None, completion_len=None, num_generations=None,
                               ref_model=None)
    if objective not in ("dpo", "grpo"):
        return out

    def optional_int(name: str, check: Callable[[int], Any] = lambda n: None) -> Parse:
        def parse(t: str) -> int | None:
            if t.strip().lower() in ("", "default"):
                return None
            n = parse_int(t, name)
            check(n)
            return n
        return parse

    if objective == "grpo":
        out["num_generations"] = ask.text(_prompt("num_generations"), str(req.num_generations or "default"),
                                          optional_int(_label("num_generations"), check_num_generations))
        out["completion_len"] = ask.text(
            _prompt("completion_len"), str(req.completion_len or "default"),
            optional_int(_label("completion_len"),
                         lambda n: objective_lengths(req.with_(objective="grpo", completion_len=n, prompt_len=None))))
        refs = [r for r in RefModel.values() if r != "precomputed"]
    else:
        out["prompt_len"] = ask.text(
            _prompt("prompt_len"), str(req.prompt_len or "default"),
            optional_int(_label("prompt_len"), lambda n: check_prompt_len(n, req.seq_len)))
        refs = [r for r in RefModel.values() if r != "none"]
    default_ref = req.ref_model if req.ref_model in refs else refs[0] if objective == "dpo" else "none"
    out["ref_model"] = ask.choice(_prompt("ref_model"), refs, default_ref)
    return out


def ask_batch(ask: Any, state: WizardState, detection: Any) -> WizardState:
    """Step 3: effective batch (checked against the engine right away), sequence length, data, epochs, LR."""
    req = state.request

    def effective(t: str) -> int:
        eb = _int("effective_batch")(t)
        plan_for(state.with_request(effective_batch=eb), detection)   # refuses a batch no split reaches
        return eb

    eb = ask.text(_prompt("effective_batch"), str(req.effective_batch or ""), effective)
    state = state.with_request(effective_batch=eb)
    sl = ask.text(_prompt("seq_len"), str(req.seq_len), _int("seq_len"))
    def dataset(t: str) -> Any:
        choice = parse_dataset("" if t.strip().lower() == "none" else t)
        if choice.source is not None:         # read and checked as the trainer will: its line, and asked again
            check_data(choice.source.spec, req.objective, state.train.data_columns)
        return choice

    ds = ask.text("Dataset (JSONL path, a sample count, or none for the demo data)",
                  state.train.dataset or dataset_text(state) or "none", dataset)
    ep = ask.text(_prompt("epochs"), f"{req.epochs:g}", _float("epochs"))
    lr = ask.text(_prompt("lr"), f"{state.train.lr:g}", _float("lr"))
    ref = ask.text("LR reference for the scaling rules, BASE_LR@BASE_BATCH (e.g. 2e-4@8), or none",
                   f"{req.base_lr:g}@{req.base_batch}" if req.base_lr and req.base_batch else "none", parse_lr_reference)
    return state.with_request(seq_len=sl, dataset_size=ds.samples, epochs=ep, base_lr=ref[0], base_batch=ref[1]
                              ).with_train(dataset=ds.path, lr=lr)


def parse_lr_reference(text: str) -> tuple[float | None, int | None]:
    """'2e-4@8' → (2e-4, 8); 'none' or empty → (None, None)."""
    t = text.strip()
    if not t or t.lower() == "none":
        return None, None
    lr, sep, batch = t.partition("@")
    if not sep:
        raise ScaletrainError(f"give the LR reference as BASE_LR@BASE_BATCH, e.g. 2e-4@8 (got {t!r})")
    return parse_float(lr, "base LR"), parse_int(batch, "base batch")


def run_plain(args: argparse.Namespace, state: WizardState | None = None) -> int:
    """Ask, plan, print the plan, write the run directory, optionally launch and save a preset (`state`: the first
    state when the caller already built it from `args`)."""
    state = state if state is not None else state_from_args(args)
    ask: Any = QuestionaryAsker() if sys.stdin.isatty() and sys.stdout.isatty() else PipeAsker()
    _say("scaletrain: plan a fine-tuning run (empty answer = the default in brackets)")
    state, detection = ask_hardware(ask, state)
    state = ask_model(ask, state)
    state = ask_batch(ask, state, detection)
    plan = plan_for(state, detection)
    from scaletrain.tui.views.render import print_plan

    print_plan(plan)
    problem, warning = weights_verdict(state)
    if problem is not None:
        raise ScaletrainError(problem)          # refused before anything is written (engine.request.weights)
    if warning:
        _say(f"warning: {warning}")
    if not ask.confirm("Write the run directory?", True):
        _say("nothing written")
        return 0
    run_dir = ask.text("Run directory", run_files.default_dir(state), lambda t: t.strip() or None)
    run = run_files.write(plan, state, run_dir, overwrite=bool(getattr(args, "overwrite", False)))
    _say(f"wrote {', '.join(run_files.written_files(run))} to {run.path}")
    preset = getattr(args, "save_preset", None)
    if preset:
        _say(f"preset saved to {run_files.save_preset(preset, state, plan)[0]}")
    reason = launchable_here(plan)
    if reason is not None:
        _say(f"not launched: {reason}")
        return 0
    if not ask.confirm("Launch it now?", False):
        _say(f"launch later with: scaletrain launch {run.path}")
        return 0
    from scaletrain.tui.monitor.stream import stream_run

    return stream_run(run.path)

"""Step 2: the model (catalog search, or a config path / HF cache id) and the method (full, LoRA, QLoRA)."""

from __future__ import annotations

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Input, Label, OptionList, RadioButton, RadioSet, Static
from textual.widgets.option_list import Option
from textual.worker import get_current_worker

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog import traced
from scaletrain.engine.catalog.architectures import ModelArch, load_model
from scaletrain.engine.request.fields import FORM_FIELD
from scaletrain.engine.request.request import base_setup
from scaletrain.engine.vocabulary import Method, Objective
from scaletrain.engine.units import fmt_count, fmt_params
from scaletrain.tui.wizard.screen_base import WizardStep
from scaletrain.tui.widgets.field import Field
from scaletrain.tui.wizard.sources import model_weights, parse_weights
from scaletrain.tui.wizard.state import (FieldError, WizardState, field_value, format_residents, hardware_for,
                                         parse_int, parse_named, parse_residents, parse_targets, weights_text,
                                         within_positions)

BASE_BITS_CHOICES = (16, 8, 4)


def _own_model(text: str) -> bool:
    """Typed text that names a model by itself, not only a search: an HF id (org/name) or a path."""
    return "/" in text or text.startswith(("~", "."))


# The chosen method in words beside its radio buttons (a pressed button is otherwise only a coloured dot).
METHOD_WORDS = {"full": "→ full fine-tuning", "lora": "→ LoRA adapters", "qlora": "→ LoRA on a 4-bit base"}
# The objective's radio labels: what each trains (engine.vocabulary.Objective), short enough for 80 columns.
OBJECTIVE_WORDS = {"sft": "sft", "reward": "reward model", "dpo": "dpo", "grpo": "grpo"}


def _field(name: str, value: str, *, placeholder: str = "") -> Field:
    """A text field for one plan field: its label and hint from the field table (engine/request/fields.py)."""
    f = FORM_FIELD[name]
    return Field(name, f.label or name, value, placeholder=placeholder, hint=f.hint or "")


def describe_model(m: ModelArch) -> Text:
    return Text.assemble((m.name, "bold"), f" · {m.model_type} · ", (f"{fmt_count(m.params)}", "bold"),
                         f" params · {m.num_layers} layers · hidden {m.hidden_size} · vocab {m.vocab_size}"
                         f"{' · tied embeddings' if m.tie_embeddings else ''}")


def matches(model_id: str, query: str) -> bool:
    """Catalog search: every word of the query appears in the id (case-insensitive)."""
    mid = model_id.lower()
    return all(w in mid for w in query.lower().split())


class ModelScreen(WizardStep):
    STEP = 2
    HELP = """
## Step 2 · Model & method
Type to **search the catalog**; `down`/`tab` moves into the list and `enter` picks a model. Or type a **path** to a
config.json (or a folder holding one) or a **Hugging Face cache id** (read offline from the local cache).
**Weights**: where training starts — an HF id (org/name), a local model folder, or `random-init` (testing only:
the write step says so in red, and QLoRA cannot quantize random weights); they follow the model until you change
them. **Method** (asked, never assumed): full fine-tuning, LoRA (rank, target modules; empty targets = every block linear; frozen base in 16 or
8 bits) or QLoRA (4-bit NF4 base). **Objective**: sft (next-token loss), a reward model (a score head on
chosen/rejected pairs), dpo or grpo (TRL's trainers); `t` on the plan step cycles it too. **Extra resident models** are inference-only models kept on every GPU next to the
trained one, e.g. a reference policy or an evaluator: `MODEL[:BITS], …` with bits 16, 8 or 4.
"""

    def body(self) -> ComposeResult:
        req = self.wizard.state.request
        with VerticalScroll(id="body"):
            yield _field("model", req.model, placeholder="search the catalog, or a config.json path / HF id")
            yield OptionList(id="models")
            yield Static("", id="model-info")
            yield _field("weights", weights_text(self.wizard.state), placeholder="HF id, local folder, or random-init")
            with Horizontal(classes="field-row", id="method-row"):
                yield Label("method", classes="field-label")
                with RadioSet(id="method"):
                    for m in Method.values():
                        yield RadioButton(m, id=f"method-{m}",
                                          value=self.wizard.state.method_chosen and req.method == m)
                yield Static("", id="method-said")
            with Horizontal(classes="field-row", id="objective-row"):
                yield Label("objective", classes="field-label")
                with RadioSet(id="objective"):
                    for o in Objective.values():
                        yield RadioButton(OBJECTIVE_WORDS.get(o, o), id=f"objective-{o}",
                                          value=(req.objective or "sft") == o)
            with Vertical(id="lora-box"):
                yield _field("lora_rank", str(req.lora_rank))
                yield _field("lora_targets", ",".join(req.lora_targets or ()), placeholder="all block linears")
                yield _field("base_bits", "" if req.base_bits is None else str(req.base_bits),
                             placeholder="16 for LoRA, 4 for QLoRA")
            yield _field("residents", format_residents(req.residents), placeholder="none")

    def on_mount(self) -> None:
        self._info_spec: str | None = None
        # the weights the field shows while it follows the model (the model's own, random-init for a config-only one)
        self._weights_followed = weights_text(self.wizard.state) if not self.wizard.state.weights_chosen else ""
        self.fill_catalog()
        self._sync_method()
        self.query_one("#in-model", Input).focus()
        if self.wizard.state.request.model:
            self.load_info(self.wizard.state.request.model)

    # ---- catalog search --------------------------------------------------------------------------------------
    def fill_catalog(self) -> list[str]:
        query = self.query_one("#in-model", Input).value
        ol = self.query_one("#models", OptionList)
        ids = [mid for mid in self.wizard.catalog_ids if matches(mid, query)]
        ol.set_options(Option(self._label(mid), id=mid) for mid in ids)
        if ids:
            ol.highlighted = ids.index(query) if query in ids else 0
        return ids

    def _label(self, mid: str) -> Text:
        arch = self.wizard.catalog_arch[mid]
        return Text.assemble((f"{mid:<34}", "bold"), (f"{fmt_params(arch.params):>7} {arch.model_type}", "dim"))

    def refresh_catalog_labels(self) -> None:
        """The app's worker finished loading the catalog (ids and exact parameter counts)."""
        self.fill_catalog()

    @on(Input.Changed, "#in-model")
    def _model_typed(self, event: Input.Changed) -> None:
        found = self.fill_catalog()
        self.query_one("#field-model", Field).show_error(None)
        text = event.value.strip()
        if text and text not in self.wizard.catalog_ids and found:
            # still a search: the suggestions speak, not an "unknown model" error, and the weights stay as they are
            self._info_spec = None          # a model check still under way for an earlier text is not shown
            # an id or path typed in full (Qwen/Qwen2.5-7B beside the catalog's Qwen/Qwen2.5-7B-Instruct) is a model
            # of its own: tab past the list keeps it (checked when focus moves on, _model_left)
            keeps = f", tab past the list keeps {text}" if _own_model(text) else ""
            self.query_one("#model-info", Static).update(Text(
                f"{len(found)} catalog match{'es' if len(found) != 1 else ''}: enter picks {found[0]}, "
                f"↓ chooses another{keeps}", style="dim"))
            return
        self._follow_model(event.value)
        self.load_info(event.value)

    @on(events.DescendantFocus)
    def _model_left(self, event: events.DescendantFocus) -> None:
        """Focus moved past the model field and its suggestions (tab, a click) with a search still typed: the text
        is the model now, so it is checked and the weights follow it, as enter does for a catalog id."""
        if event.widget.id in ("in-model", "models"):
            return
        text = self.query_one("#in-model", Input).value.strip()
        if text and text != self._info_spec:
            self._follow_model(text)
            self.load_info(text)

    @on(OptionList.OptionSelected, "#models")
    def _model_picked(self, event: OptionList.OptionSelected) -> None:
        self.pick(event.option_id or "")

    def _follow_model(self, model: str) -> None:
        """The weights field follows the model field (its own weights) until the user types other weights."""
        weights = self.query_one("#field-weights", Field)
        if weights.value.strip() in ("", self._weights_followed.strip()):
            weights.value = self._weights_followed = model_weights(model)

    def pick(self, model_id: str) -> None:
        inp = self.query_one("#in-model", Input)
        self._follow_model(model_id)
        with inp.prevent(Input.Changed):
            inp.value = model_id
        self.query_one("#field-model", Field).show_error(None)
        self.load_info(model_id)
        self.query_one("#method").focus()

    def load_info(self, spec: str) -> None:
        self._info_spec = spec
        self._load_info(spec)

    def _show_info(self, spec: str, info: Text, arch: ModelArch | None = None) -> None:
        if spec != self._info_spec:
            return
        self.query_one("#model-info", Static).update(info)
        if arch is None and spec.strip() and self.focused is self.query_one("#method"):
            # enter on a model that does not resolve: the keys go back to it (pick moved them on to the method
            # before the answer came), so the next keystrokes fix the model instead of landing in the radio set
            self.query_one("#in-model", Input).focus()
        # the targets this model's blocks have (phi3: qkv_proj, gate_up_proj), not the hint's llama names
        targets = self.query_one("#field-lora_targets", Field)
        targets.set_hint(f"comma list of this model's block linears: {','.join(arch.block_linear_names)}"
                         if arch is not None else FORM_FIELD["lora_targets"].hint or "")

    @work(thread=True, exclusive=True, group="model-info")
    def _load_info(self, spec: str) -> None:
        """Resolve the model off the UI thread (a path or cache id reads disk; unknown families load torch)."""
        arch = None
        if not spec.strip():
            info: Text = Text("no model chosen yet", style="dim")
        else:
            try:
                arch = load_model(spec)
                info = describe_model(arch)
            except ScaletrainError as e:
                info = Text(str(e), style="yellow")
            except Exception as e:  # shown in place, never a traceback
                info = Text(f"cannot read {spec!r}: {e.__class__.__name__}: {e}", style="yellow")
        if get_current_worker().is_cancelled:
            return
        self.app.call_from_thread(self._show_info, spec, info, arch)
        if arch is not None and arch.memory_source == "traced":
            # while the method and batch are chosen, the trace process imports transformers and builds the
            # family once: the plan step then traces only its regimes (engine/catalog/traced.warm)
            traced.warm(arch.config)

    # ---- method ----------------------------------------------------------------------------------------------
    def _method(self) -> str | None:
        """The pressed method; None until one is chosen (a fresh wizard preselects nothing)."""
        pressed = self.query_one("#method", RadioSet).pressed_button
        return pressed.id.removeprefix("method-") if pressed and pressed.id else None

    def _objective(self) -> str:
        """The pressed objective (sft unless another is chosen)."""
        pressed = self.query_one("#objective", RadioSet).pressed_button
        return pressed.id.removeprefix("objective-") if pressed and pressed.id else "sft"

    def _sync_method(self) -> None:
        box = self.query_one("#lora-box")
        method = self._method()
        self.query_one("#method-said", Static).update(
            Text(METHOD_WORDS.get(method or "", "pick: ←/→, space"),
                 style="bold" if method else "yellow"))
        full = method in ("full", None)
        box.set_class(full, "-disabled")
        for inp in box.query(Input):
            inp.disabled = full

    @on(RadioSet.Changed, "#method")
    def _method_changed(self) -> None:
        self._sync_method()

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "in-model":
            # enter on a search picks the highlighted catalog match; a catalog id, path or cache id is kept as typed
            opt = self.query_one("#models", OptionList).highlighted_option
            if event.value not in self.wizard.catalog_ids and opt is not None and opt.id:
                self.pick(opt.id)
            else:
                self.pick(event.value.strip())
        elif event.input.id == "in-residents":
            self.action_next()
        else:
            self.focus_next()

    # ---- next ------------------------------------------------------------------------------------------------
    def candidate(self) -> WizardState:
        """Parse the fields (fast); the slow checks run in `check`."""
        method = self._method()
        model = self.query_one("#field-model", Field).value.strip()
        if not model:
            raise FieldError("model", "no model chosen; pick one from the catalog or give a config.json path")
        if method is None:
            raise FieldError("method", f"choose a method: {', '.join(Method.values())} (full fine-tuning, LoRA "
                                       "adapters, or LoRA on a 4-bit base)")
        weights = self._weights(model)
        changes: dict = dict(model=model, method=method, objective=self._objective())
        if method != "full":
            changes["lora_rank"] = field_value(self.query_one("#field-lora_rank", Field),
                                               lambda t: parse_int(t, "LoRA rank"))
            changes["lora_targets"] = parse_targets(self.query_one("#field-lora_targets", Field).value)
            bits = field_value(self.query_one("#field-base_bits", Field),
                               lambda t: parse_int(t, "frozen base bits", optional=True))
            if bits is not None and bits not in BASE_BITS_CHOICES:
                raise FieldError("base_bits", f"frozen base bits must be 16, 8 or 4 (got {bits})")
            changes["base_bits"] = bits
        else:
            changes["base_bits"] = None
        changes["residents"] = field_value(self.query_one("#field-residents", Field), parse_residents)
        return self.wizard.state.with_model(**changes).with_train(model_source=weights).with_(
            method_chosen=True, weights_chosen=True)

    def _weights(self, model: str) -> str:
        """The weights field; while it follows the model, the model's check (below) speaks for both, and a
        config.json's weights are its folder."""
        field = self.query_one("#field-weights", Field)
        if field.value.strip() in (model, self._weights_followed.strip()):
            return model_weights(model)
        return field_value(field, parse_weights)

    def action_next(self) -> None:
        self.clear_field_errors()
        try:
            state = self.candidate()
        except ScaletrainError as e:
            self.refuse(e)
            return
        self.set_status("checking the model…")
        self.check(state)

    @work(thread=True, exclusive=True, group="model-check")
    def check(self, state: WizardState) -> None:
        """Load every named config and build the engine's TrainingSetup: refusals come back as one line."""
        error: FieldError | ScaletrainError | None = None
        note = None
        req = state.request
        try:
            arch = parse_named("model", req.model, load_model)
            for mid, _bits in req.residents:
                parse_named("residents", mid, load_model)
            state, note = within_positions(state, arch)
            req = state.request
            try:
                base_setup(req, hardware_for(state, self.wizard.detection))
            except ScaletrainError as e:
                name = "lora_targets" if "LoRA target" in str(e) else (
                    "base_bits" if "bits" in str(e) or "quantized" in str(e) else None)
                raise (FieldError(name, str(e)) if name else e) from None
        except ScaletrainError as e:
            error = e
        except Exception as e:  # shown in place, never a traceback
            error = ScaletrainError(f"unexpected error: {e.__class__.__name__}: {e}")
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self._checked, state, error, note)

    def _checked(self, state: WizardState, error: ScaletrainError | None, note: str | None = None) -> None:
        if error is None:
            self.set_status(None)
            if note:
                self.app.notify(note, timeout=10)
            self.wizard.advance(state, self.STEP)
        else:
            self.refuse(error)

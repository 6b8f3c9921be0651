"""Step 3: target effective batch, sequence length, data, epochs, LR; the solver's answer shown live."""

from __future__ import annotations

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Input
from textual.worker import get_current_worker

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.plan.lr import default_lr
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.request.fields import FORM_FIELD
from scaletrain.tui.wizard.screen_base import WizardStep
from scaletrain.tui.widgets.field import Field
from scaletrain.tui.widgets.solver import SolverPanel
from scaletrain.tui.wizard.state import (BATCH_FIELDS, FieldError, WizardState, apply_batch_fields, dataset_text,
                                         pin_effective_batch, plan_for, plannable)

def _initial(state: WizardState, name: str) -> str:
    """The field's text for the state: its value (engine/request/fields.py says where it lives); the samples
    field says how it was counted."""
    v = dataset_text(state) if name == "dataset" else FORM_FIELD[name].value_in(state.request, state.train)
    return "" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))


class BatchScreen(WizardStep):
    STEP = 3
    HELP = """
## Step 3 · Batch & data
Give the **effective batch** (samples per optimizer step over all GPUs), the sequence length, the **data** the run
trains on (a JSONL file or an HF dataset id; empty: the bundled demo data), the **samples** the estimate counts
(empty: the rows of the data file, or of the bundled data the run then trains on) and epochs. The panel on the right is the engine's solver,
recomputed as you type: micro batch × gradient accumulation × GPUs = effective batch, the strategy, whether it fits,
and the time. With a **base LR** tuned at a **base batch**, it shows what the square-root and linear rules suggest.
"""

    def body(self) -> ComposeResult:
        st = self.wizard.state
        with Horizontal(id="body"):
            with VerticalScroll(id="batch-form"):
                for name in BATCH_FIELDS:
                    f = FORM_FIELD[name]
                    yield Field(name, f.label, _initial(st, name), hint=f.hint)
            yield SolverPanel(id="solver")

    def on_mount(self) -> None:
        eb = self.query_one("#field-effective_batch", Field)
        if not eb.value:  # a preset fixed micro batch × accumulation: its effective batch is the plan's
            try:
                plan = plan_for(self.wizard.state, self.wizard.detection)
            except ScaletrainError:
                pass
            else:       # pinned in the state too, so the preset's split stays (state.pin_effective_batch)
                self.wizard.state = pin_effective_batch(self.wizard.state, plan)
                eb.value = str(plan.setup.effective_batch)
        self._lora_lr()
        max_steps = self.wizard.state.train.max_steps
        if max_steps is not None:   # say so where epochs are typed: the trainer runs max_steps, not the epochs
            self.query_one("#field-epochs", Field).set_hint(f"not used: train.max_steps runs {max_steps:,} steps")
        eb.input.focus()
        self.resolve()

    def _lora_lr(self) -> None:
        """A LoRA run whose learning rate is still the full fine-tuning default starts from the LoRA rule's rate
        (engine.plan.lr.default_lr); the hint says where it comes from."""
        st = self.wizard.state
        method = st.request.method
        field = self.query_one("#field-lr", Field)
        if method == "full" or st.train.lr != TrainOptions.lr:
            return
        arch = self.wizard.catalog_arch.get(st.request.model)
        rule = default_lr(method, arch.params if arch is not None else None)
        field.value = f"{rule.lr:g}"
        field.set_hint(rule.why)

    def values(self) -> dict[str, str]:
        return {f.field_name: f.value for f in self.query(Field)}

    @on(Input.Changed)
    def _changed(self) -> None:
        self.resolve()

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        if event.input.id == f"in-{BATCH_FIELDS[-1]}":
            self.action_next()
        else:
            self.focus_next()

    # ---- the live solver -------------------------------------------------------------------------------------
    def candidate(self, state: WizardState, values: dict[str, str]) -> tuple[WizardState, Plan]:
        """The fields applied to `state` (changed inputs drop the plan step's choices) and the engine's plan."""
        return plannable(apply_batch_fields(state, values).rebased(state), self.wizard.detection)

    def resolve(self) -> None:
        self.solve(self.wizard.state, self.values())

    @work(thread=True, exclusive=True, group="solver")
    def solve(self, state: WizardState, values: dict[str, str]) -> None:
        """Parse the fields and ask the engine for a plan, off the UI thread (a dataset is counted, once)."""
        plan: Plan | None = None
        error: ScaletrainError | None = None
        try:
            _state, plan = self.candidate(state, values)
        except ScaletrainError as e:
            error = e
        except Exception as e:  # an unexpected failure is shown in place, never a traceback
            error = ScaletrainError(f"unexpected error: {e.__class__.__name__}: {e}")
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self._solved, plan, error)

    def _solved(self, plan: Plan | None, error: ScaletrainError | None) -> None:
        self.clear_field_errors()
        if isinstance(error, FieldError):
            self.show_field_error(error)
        elif error is not None and ("effective batch" in str(error) or "micro batch" in str(error)):
            self.query_one("#field-effective_batch", Field).show_error(str(error))
        self.query_one(SolverPanel).show(plan, error)

    def action_next(self) -> None:
        try:
            state, _plan = self.candidate(self.wizard.state, self.values())
        except ScaletrainError as e:
            self.refuse(e)
            return
        self.set_status(None)
        self.wizard.advance(state, self.STEP)

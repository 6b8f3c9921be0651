"""What every wizard step shares: the step bar, the footer, next/back/help keys, the error line."""

from __future__ import annotations

from typing import Protocol

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static

from scaletrain.engine.catalog.architectures import ModelArch
from scaletrain.engine.devices.nvml import DetectionResult
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.run.layout import RunDir
from scaletrain.tui.widgets.field import Field
from scaletrain.tui.widgets.steps import StepBar
from scaletrain.tui.wizard.state import WizardOptions, WizardState


class Wizard(Protocol):
    """What the steps ask of the wizard app (app.WizardApp): its state, plan and detection, and moving on."""

    options: WizardOptions
    state: WizardState
    plan: Plan | None
    detection: DetectionResult | None
    catalog_arch: dict[str, ModelArch]

    @property
    def catalog_ids(self) -> tuple[str, ...]: ...

    @property
    def launching(self) -> bool: ...

    def advance(self, state: WizardState, step: int) -> None: ...

    async def start_from(self, preset: str | None) -> None: ...

    def launch_run(self, run: RunDir) -> None: ...


class WizardStep(Screen):
    """A wizard step. Subclasses compose `body()` and implement `action_next()`."""

    STEP = 0
    HELP = ""
    # The keys every step has, first in the footer so they stay in view at 80 columns; a step's own keys follow and
    # `?` lists them all (widgets/help.py reads the bindings: no second list to keep in sync).
    BINDINGS = [
        Binding("ctrl+q", "app.quit", "Quit", priority=True),
        Binding("ctrl+n", "next", "Next", priority=True),
        Binding("escape", "back", "Back"),
        Binding("question_mark", "app.help", "Keys", key_display="?"),
        Binding("f1", "app.help", "Keys"),     # in the footer while a text field takes `?` as a character
        Binding("ctrl+s", "app.save_preset", "Save preset", priority=True),
    ]

    @property
    def wizard(self) -> Wizard:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield StepBar(self.STEP, self.wizard.state.preset, id="stepbar")
        yield from self.body()
        yield Static("", id="status", markup=False)
        yield Footer()

    def body(self) -> ComposeResult:
        yield from ()

    def refuse(self, error: ScaletrainError) -> None:
        """Show a refusal in place: next to the field it names (a FieldError), and on the status line; the keys go to
        that field, so the next keystrokes fix it (ctrl+n refused while focus sat elsewhere typed them there)."""
        self.show_field_error(error)
        self.set_status(str(error), error=True)
        self.focus_refused(error)

    def focus_refused(self, error: ScaletrainError) -> None:
        """Focus what a FieldError names: a text field's input, or a widget of that id (the method's radio set)."""
        name = getattr(error, "field_name", None)
        if not name:
            return
        for field in self.query(f"#field-{name}").results(Field):
            field.input.focus()
            return
        for widget in self.query(f"#{name}"):
            if widget.focusable:
                widget.focus()
                return

    def show_field_error(self, error: ScaletrainError) -> None:
        """Show a FieldError next to the field it names (any other refusal names no field)."""
        name = getattr(error, "field_name", None)
        if name:
            for field in self.query(f"#field-{name}").results(Field):
                field.show_error(str(error))

    def clear_field_errors(self) -> None:
        for field in self.query(Field):
            field.show_error(None)

    def set_status(self, message: str | None, *, error: bool = False) -> None:
        """The step's one status line: an engine message, a refusal, or what just happened."""
        status = self.query_one("#status", Static)
        status.update(message or "")
        status.set_class(error and bool(message), "-error")

    def action_back(self) -> None:
        """Back one step; from the first step, back to the start screen when the wizard began there."""
        stack = self.app.screen_stack
        below = stack[-2] if len(stack) > 1 else None
        if self.STEP > 1 or isinstance(below, WizardStep):
            self.dismiss()
        else:
            self.set_status("this is the first step: ctrl+q quits", error=False)

    def action_next(self) -> None:  # pragma: no cover - every step overrides it
        raise NotImplementedError

"""`ctrl+s` on any step: save the wizard's choices so far as a preset (engine.request.presets.save_preset)."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from scaletrain.engine.errors import ScaletrainError
from scaletrain.tui.wizard import run_files
from scaletrain.tui.widgets.field import Field

PLAN_STEP = 4      # screen_plan.PlanScreen.STEP: from here on the plan on screen is this state's


class SavePresetScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape", "close", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="preset-box"):
            yield Static("Save these choices as a preset (enter saves, escape closes)", classes="section")
            yield Field("preset_name", "preset name", self.app.state.preset or "",  # type: ignore[attr-defined]
                        placeholder="e.g. my-h200-lora", hint="reuse with: scaletrain --preset NAME")

    def on_mount(self) -> None:
        self.query_one("#in-preset_name", Input).focus()

    @on(Input.Submitted, "#in-preset_name")
    def _save(self, event: Input.Submitted) -> None:
        field = self.query_one("#field-preset_name", Field)
        app = self.app
        below = app.screen_stack[-2] if len(app.screen_stack) > 1 else None
        # the plan's choices are pinned only where the plan on screen is the one these choices make (plan, write)
        plan = app.plan if getattr(below, "STEP", 0) >= PLAN_STEP else None  # type: ignore[attr-defined]
        try:
            path, backup = run_files.save_preset(event.value, app.state, plan)  # type: ignore[attr-defined]
        except ScaletrainError as e:
            field.show_error(str(e))
            return
        field.show_error(None)
        kept = f" (the file it replaced: {backup})" if backup else ""
        field.set_hint(f"saved to {path}{kept}; escape closes")
        app.notify(f"preset saved to {path}{kept}")

    def action_close(self) -> None:
        self.dismiss()

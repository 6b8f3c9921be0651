"""The first screen of `scaletrain` with no arguments: start from a setup (a bundled preset, a seed guide's setup,
or one of yours in ./presets-local) or from scratch.

Each preset row says its hardware · model · method · objective, what its seed guide claimed, and what scaletrain
predicts for it (engine.run.preset_view: its own plan); picking one opens its plan with its name in the header.
"""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option
from textual.worker import get_current_worker

from scaletrain.engine.errors import ScaletrainError
from scaletrain.tui.wizard.screen_base import WizardStep

SCRATCH = "start-from-scratch"


def preset_label(view) -> Text:
    """Three lines: name and setup, the seed's claim, scaletrain's prediction."""
    head = Text.assemble((f"{view.name}", "bold cyan"), ("" if view.bundled else "  (yours)", "yellow"),
                         "  ", view.setup_words())
    seed = Text(f"   {view.seed}" if view.seed else "   (no seed guide: a common recipe)", style="dim")
    predicted = Text(f"   {view.predicted}")
    return Text("\n").join([head, seed, predicted])


class StartScreen(WizardStep):
    STEP = 0
    HELP = """
## Start · pick a setup
**Start from a setup**: each bundled preset is a seed guide's setup (or a common recipe) ready to plan — its
hardware, model, method and objective, what the guide claimed, and what scaletrain predicts for it. Your own
presets (saved with `ctrl+s`, in ./presets-local) are listed too. `enter` opens the preset's plan, its name stays in
the header, and `escape` walks back through its steps. **Start from scratch** asks for the hardware, the model and
the batch one step at a time. The same presets replay headless with `scaletrain --preset NAME --headless`.
"""

    def body(self) -> ComposeResult:
        with Vertical(id="body"):
            yield Static(Text.assemble(("Start from a setup", "bold"), " (enter opens its plan) or from scratch"),
                         id="start-head")
            yield OptionList(Option(Text.assemble(("start from scratch", "bold"),
                                                  "  choose hardware, model and batch step by step"), id=SCRATCH),
                             id="presets")
            yield Static("", id="preset-info")

    def on_mount(self) -> None:
        self.query_one("#presets", OptionList).focus()
        self.load_presets()

    @work(thread=True, exclusive=True, group="presets")
    def load_presets(self) -> None:
        """Every preset and its prediction (each its own plan, a few ms), off the UI thread."""
        from scaletrain.engine.request.presets import list_presets
        from scaletrain.engine.run.preset_view import preset_view

        views, error = [], None
        try:
            views = [preset_view(p) for p in list_presets()]
        except ScaletrainError as e:      # a broken preset file of yours: said, the rest of the screen works
            error = str(e)
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self._show_presets, views, error)

    def _show_presets(self, views: list, error: str | None) -> None:
        ol = self.query_one("#presets", OptionList)
        # the user's own first (what they saved last time), then the seed guides' setups, then the other recipes
        for view in sorted(views, key=lambda v: (v.bundled, v.seed is None, v.name)):
            ol.add_option(Option(preset_label(view), id=view.name))
        self.views = {v.name: v for v in views}
        if error:
            self.set_status(error, error=True)
        self._describe(ol.highlighted_option.id if ol.highlighted_option else None)

    @on(OptionList.OptionHighlighted, "#presets")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self._describe(event.option_id)

    def _describe(self, name: str | None) -> None:
        view = getattr(self, "views", {}).get(name or "")
        info = (Text(view.description, style="italic") if view is not None else
                Text("the wizard asks for the hardware, the model and method, the batch and data, then plans",
                     style="italic"))
        self.query_one("#preset-info", Static).update(info)

    @on(OptionList.OptionSelected, "#presets")
    def _picked(self, event: OptionList.OptionSelected) -> None:
        self.start(event.option_id)

    def start(self, option_id: str | None) -> None:
        name = None if option_id in (None, SCRATCH) else option_id
        self.app.run_worker(self.wizard.start_from(name), exclusive=True, group="start")

    def action_next(self) -> None:
        opt = self.query_one("#presets", OptionList).highlighted_option
        self.start(opt.id if opt is not None else None)

"""The Textual wizard: detect → model → batch → plan → write & launch.

`create_app(...)` is the one factory the CLI (`run_wizard`), the pilot tests, the snapshot tests and the bench use.
The app holds the wizard's immutable state, NVML's detection and the current Plan; screens only lay them out.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Callable

from textual.app import App
from textual.binding import Binding
from textual.worker import Worker

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog import traced
from scaletrain.engine.catalog.architectures import ModelArch
from scaletrain.engine.devices.nvml import DetectionResult, detect
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.launch.detach import Detached
from scaletrain.engine.run.layout import RunDir
from scaletrain.tui.monitor.app import detached_note
from scaletrain.tui.wizard.state import (WizardOptions, WizardState, plannable, state_for_preset, state_from_args,
                                         wants_start_screen)


def options_from(args_or_options: "WizardOptions | argparse.Namespace | None") -> WizardOptions:
    """Accept parsed CLI args (`scaletrain`'s Namespace; `tui/cli/parser.parse_args` turns an argv list into one),
    no args (no flags given), or ready WizardOptions."""
    if isinstance(args_or_options, WizardOptions):
        return args_or_options
    if args_or_options is None:
        args_or_options = argparse.Namespace()
    return WizardOptions(state=state_from_args(args_or_options),
                         overwrite=bool(getattr(args_or_options, "overwrite", False)))


class WizardApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "scaletrain"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True),    # the steps show it first in their footer
    ]

    def __init__(self, options: WizardOptions) -> None:
        super().__init__()
        self.options = options
        self.state: WizardState = options.state
        self.detection: DetectionResult | None = None
        self.plan: Plan | None = None
        self.catalog_arch: dict[str, ModelArch] = {}      # filled by a thread worker after the first paint
        self.launched: Detached | None = None              # the run started here (in the background)
        self.launched_dir: Path | None = None
        self.launch_error: str | None = None

    def on_mount(self) -> None:
        from scaletrain.tui.wizard.screen_hardware import HardwareScreen
        from scaletrain.tui.wizard.screen_start import StartScreen

        self.push_screen(StartScreen() if wants_start_screen(self.state) else HardwareScreen())
        self.run_worker(self._detect, thread=True, group="detect", name="nvml-detect")
        self.run_worker(self._load_catalog, thread=True, group="catalog", name="catalog")

    # ---- slow start-up work, off the UI thread -----------------------------------------------------------------
    def _detect(self) -> DetectionResult:
        return (self.options.detect or detect)()    # NVML's own, unless a test or bench replays one

    def _load_catalog(self) -> dict[str, ModelArch]:
        from scaletrain.engine.catalog.architectures import catalog_ids, load_model

        archs = {}
        for mid in catalog_ids():
            try:
                archs[mid] = load_model(mid)
            except ScaletrainError:     # a catalog entry this build cannot count is left out of the picker
                continue
        return archs

    @property
    def catalog_ids(self) -> tuple[str, ...]:
        return tuple(self.catalog_arch)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        w = event.worker
        if not w.is_finished or w.result is None:
            return
        if w.group == "detect":
            self.detection = w.result
            self._tell_screens("refresh_detection")
        elif w.group == "catalog":
            self.catalog_arch = w.result
            self._tell_screens("refresh_catalog_labels")

    def _tell_screens(self, method: str) -> None:
        for screen in self.screen_stack:
            fn = getattr(screen, method, None)
            if fn is not None and screen.is_mounted:
                fn()

    # ---- moving between steps ----------------------------------------------------------------------------------
    def advance(self, state: WizardState, step: int) -> None:
        """Accept a step's state and open the next step. Changed inputs drop the plan step's fixed choices."""
        self.state = state.rebased(self.state) if step < 4 else state
        if step == 1:
            from scaletrain.tui.wizard.screen_model import ModelScreen
            self.push_screen(ModelScreen())
        elif step == 2:
            from scaletrain.tui.wizard.screen_batch import BatchScreen
            self.push_screen(BatchScreen())
        elif step == 3:
            from scaletrain.tui.wizard.screen_plan import PlanScreen
            try:
                self.state, self.plan = plannable(self.state, self.detection)
            except ScaletrainError as e:    # the batch step checked this; a refusal still stays on screen
                self.screen.refuse(e)           # type: ignore[attr-defined]  (a WizardStep)
                return
            self.push_screen(PlanScreen())
        elif step == 4:
            from scaletrain.tui.wizard.screen_write import WriteScreen
            self.push_screen(WriteScreen())

    async def start_from(self, preset: str | None) -> None:
        """The start screen's pick: from scratch, step 1; a preset, its plan (steps 1-3 stacked below it, so escape
        walks back through them), or the first step that refuses it."""
        from scaletrain.tui.wizard.screen_batch import BatchScreen
        from scaletrain.tui.wizard.screen_hardware import HardwareScreen
        from scaletrain.tui.wizard.screen_model import ModelScreen
        from scaletrain.tui.wizard.screen_plan import PlanScreen

        start = self.screen
        try:
            state = state_for_preset(preset, self.options.state)
        except ScaletrainError as e:
            start.set_status(str(e), error=True)     # type: ignore[attr-defined]  (a WizardStep)
            return
        self.state, self.plan = state, None
        await self.push_screen(HardwareScreen())
        if preset is None:
            return
        await self.push_screen(ModelScreen())
        await self.push_screen(BatchScreen())
        try:
            self.state, self.plan = plannable(self.state, self.detection)
        except ScaletrainError as e:
            self.screen.refuse(e)           # type: ignore[attr-defined]  (a WizardStep)
            return
        await self.push_screen(PlanScreen())

    # ---- app-wide actions ----------------------------------------------------------------------------------------
    async def action_quit(self) -> None:
        """ctrl+q at any step: exit 0. A run launched from here runs in the background and keeps training (its
        launcher has its own session); run_wizard says so, with how to attach again or stop it."""
        self.exit(0)

    def on_unmount(self) -> None:
        """A trace still running (the model step's warm-up, a solve's first plan of a family) ends with the app:
        quitting does not wait for it."""
        traced.shutdown()

    # ---- launching (the write step asks; the monitor watches) -----------------------------------------------------
    def launch_run(self, run: RunDir) -> None:
        """Start the written run in the background (engine/launch/detach.py) from a thread worker; the launcher's
        handle lands in `launched`, a refusal in launch_error."""
        self.launched = None
        self.launch_error = None
        self.launched_dir = run.path
        self.run_worker(partial(self._launch, run), thread=True, group="launch", exclusive=True,
                        exit_on_error=False, name="launch")

    @property
    def launching(self) -> bool:
        """A launch is starting, or the run started here is still going (the monitor watches it, `l` again
        must not start a second one)."""
        if any(w.group == "launch" and not w.is_finished for w in self.workers):
            return True
        if self.launched_dir is None:
            return False
        from scaletrain.engine.launch.status import read_status

        return read_status(RunDir(self.launched_dir).status).state in ("starting", "running")

    def _launch(self, run: RunDir) -> None:
        from scaletrain.engine.launch.detach import start_detached

        try:
            self.launched = start_detached(run.path, progress=False)     # no bar under Textual
        except Exception as e:      # shown by the monitor, never a traceback
            self.launch_error = f"launch failed: {e}"

    def action_help(self) -> None:
        from scaletrain.tui.widgets.help import HelpScreen, key_rows

        if isinstance(self.screen, HelpScreen):
            return
        self.push_screen(HelpScreen(getattr(self.screen, "HELP", ""), key_rows(self.screen)))

    def action_save_preset(self) -> None:
        from scaletrain.tui.wizard.screen_preset import SavePresetScreen

        if isinstance(self.screen, SavePresetScreen):
            return
        self.push_screen(SavePresetScreen())


def create_app(args_or_options: "WizardOptions | argparse.Namespace | None" = None, *,
               detect: Callable[[], DetectionResult] | None = None, launch: bool | None = None) -> WizardApp:
    """The wizard app for parsed CLI args or WizardOptions (tests pass `detect` to replay NVML)."""
    options = options_from(args_or_options)
    if detect is not None:
        options.detect = detect
    if launch is not None:
        options.launch = launch
    return WizardApp(options)


def run_wizard(args: argparse.Namespace) -> int:
    """`scaletrain` with no subcommand: run the wizard full-screen; the exit code is the app's return code.

    Without a terminal on both ends (stdin piped, output redirected) a full-screen app cannot work: the same
    questions are asked in plain mode instead, and stderr says so.
    """
    options = options_from(args)          # bad flags or an unknown preset: one line, before anything starts
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print("scaletrain: no terminal for the full-screen wizard; asking the same questions as --plain",
              file=sys.stderr)
        from scaletrain.tui.wizard.plain import run_plain

        return run_plain(args, options.state)
    app = create_app(options)
    code = app.run()
    note = detached_note(app.launched_dir) if app.launched_dir is not None else None
    if note:
        print(note)
    if isinstance(code, int):
        return code
    return int(app.return_code or 0)


__all__ = ["WizardApp", "WizardOptions", "create_app", "run_wizard"]

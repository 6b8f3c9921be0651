"""Step 5: the files the plan becomes (syntax-highlighted), written on `w`, launched on `l`."""

from __future__ import annotations

from rich.syntax import Syntax
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option
from textual.worker import get_current_worker

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.run.run_length import run_length
from scaletrain.tui.monitor.screen import MonitorScreen
from scaletrain.tui.wizard import run_files
from scaletrain.tui.wizard.screen_base import WizardStep
from scaletrain.tui.widgets.field import Field
from scaletrain.tui.wizard.state import launchable_here, weights_verdict

_LEXERS = {".json": "json", ".yaml": "yaml", ".yml": "yaml", ".sh": "bash"}


def highlight(name: str, text: str) -> Syntax | Text:
    lexer = next((lx for ext, lx in _LEXERS.items() if name.endswith(ext)), None)
    if lexer is None:
        return Text(text)
    return Syntax(text, lexer, theme="ansi_dark", line_numbers=False, word_wrap=True)


def monitor_screen(run: RunDir) -> MonitorScreen:
    """The live monitor attached to the run the wizard launched."""
    return MonitorScreen(run, start=False)


class WriteScreen(WizardStep):
    STEP = 5
    HELP = """
## Step 5 · Write & launch
The files this plan becomes: `plan.json` (the full plan), `accelerate_config.yaml`, `ds_config.json` (DeepSpeed
strategies), `launch.sh` (the exact command). Pick a file on the left to read it. `w` writes them into the run
directory (an existing different run is never overwritten); `l` writes them (when not yet written) and launches the
run here, then opens the monitor. A plan for hardware that is not this machine is written but not launched: copy the
folder and run `launch.sh` there. Random-init weights are flagged in red (testing only); QLoRA from random-init is
refused here, before anything is written.
"""
    BINDINGS = [
        Binding("w", "write", "Write"),
        Binding("l", "launch", "Launch"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, str] = {}
        self.run: RunDir | None = None

    def body(self) -> ComposeResult:
        with Vertical(id="body"):
            yield Field("run_dir", "run directory", run_files.default_dir(self.wizard.state),
                        hint="where plan.json, configs, logs and checkpoints go")
            yield Static("", id="weights-warning", markup=False)
            with Horizontal(id="write-body"):
                yield OptionList(id="files")
                with VerticalScroll(id="preview"):
                    yield Static(Text("rendering the files…", style="dim"), id="preview-text")

    def on_mount(self) -> None:
        self.query_one("#files").border_title = "files"
        self.query_one("#preview").border_title = "preview"
        self.query_one("#files", OptionList).focus()
        st = self.wizard.state
        problem, warning = weights_verdict(st)
        warning = problem or warning
        box = self.query_one("#weights-warning", Static)
        box.update(warning or "")
        box.display = warning is not None
        self.render_preview(self.run_dir)

    @property
    def run_dir(self) -> str:
        return self.query_one("#field-run_dir", Field).value.strip()

    # ---- preview ---------------------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="preview")
    def render_preview(self, run_dir: str) -> None:
        """Render the files in a scratch directory (the writers do the work) and read them back."""
        try:
            files, error = run_files.preview(self.wizard.plan, self.wizard.state, run_dir or "."), None
        except ScaletrainError as e:
            files, error = {}, str(e)
        except Exception as e:  # shown in place, never a traceback
            files, error = {}, f"cannot render the files: {e.__class__.__name__}: {e}"
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self._show_files, files, error)

    def _show_files(self, files: dict[str, str], error: str | None) -> None:
        self.files = files
        ol = self.query_one("#files", OptionList)
        ol.set_options(Option(name, id=name) for name in files)
        if files:
            ol.highlighted = 0
            self._show(next(iter(files)))
        else:
            self.query_one("#preview-text", Static).update(Text(error or "no files", style="red"))
        if error:
            self.set_status(error, error=True)
        elif self.run is None:
            length = run_length(self.wizard.plan, self.wizard.state.train).text()
            self.set_status(f"{len(files)} files will be written to {self.run_dir}; the run trains {length}. "
                            "w writes them, l writes and launches")

    def _show(self, name: str) -> None:
        self.query_one("#preview-text", Static).update(highlight(name, self.files.get(name, "")))
        self.query_one("#preview").border_title = name

    @on(OptionList.OptionHighlighted, "#files")
    def _file_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_id:
            self._show(event.option_id)

    @on(Input.Changed, "#in-run_dir")
    def _dir_changed(self) -> None:
        self.run = None
        self.query_one("#field-run_dir", Field).show_error(None)
        self.render_preview(self.run_dir)

    @on(Input.Submitted, "#in-run_dir")
    def _dir_submitted(self) -> None:
        self.query_one("#files", OptionList).focus()

    # ---- write and launch ------------------------------------------------------------------------------------
    def action_write(self) -> None:
        st = self.wizard.state
        problem, _ = weights_verdict(st)
        if problem is not None:                   # refused before anything is written, not at launch
            self.set_status(f"not written: {problem}", error=True)
            return
        try:
            run = run_files.write(self.wizard.plan, self.wizard.state, self.run_dir,
                                  overwrite=self.wizard.options.overwrite)
        except ScaletrainError as e:
            self.query_one("#field-run_dir", Field).show_error(str(e))
            self.set_status(str(e), error=True)
            return
        self.run = run
        self.wizard.state = self.wizard.state.with_(run_dir=str(run.path))
        self._show_files(run_files.written_files(run), None)
        reason = launchable_here(self.wizard.plan)
        then = "l launches it here" if reason is None else f"not launched: {reason}"
        self.set_status(f"wrote {len(self.files)} files to {run.path}; {then}")

    def action_launch(self) -> None:
        if self.run is None:
            self.action_write()                   # l writes (when not yet written) and launches
            if self.run is None:
                return
        reason = launchable_here(self.wizard.plan)
        if reason is not None:
            self.set_status(f"not launched: {reason}", error=True)
            return
        if not self.wizard.options.launch:
            self.set_status("launching is turned off in this session", error=True)
            return
        if not self.wizard.launching:      # back from the monitor while the run goes on: watch it, don't relaunch
            self.wizard.launch_run(self.run)
        self.app.push_screen(monitor_screen(self.run))

    def action_next(self) -> None:
        if self.run is None:
            self.action_write()
        else:
            self.action_launch()

"""Placeholder monitor: tails RUN_DIR/logs/rank-0.log of the run the wizard launched (used when the live monitor,
tui/screen_monitor.py, is not in the build)."""

from __future__ import annotations

import os

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Log, Static

from scaletrain.engine.run.layout import RunDir
from scaletrain.tui.widgets.steps import StepBar

# How often the tail reads the log (the file is appended by the trainer; 0.5 s feels live and costs nothing).
TAIL_INTERVAL_SECONDS = 0.5
# Bytes read per poll at most, so a burst of output never stalls the UI thread.
TAIL_CHUNK_BYTES = 64 * 1024


class TailScreen(Screen):
    """Shows rank 0's log as it grows and how the launch ended (the app's launch worker runs the launcher)."""

    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("f1", "app.help", "Help"),
    ]
    HELP = """
## Monitor (placeholder)
The run was launched from its run directory with the exact command in `launch.sh`; this view tails rank 0's log.
`escape` goes back to the write step while the run goes on; `ctrl+q` quits the wizard and stops the run first
(every rank, no orphans), so start runs that must outlive the wizard with `scaletrain launch RUN_DIR`.
"""

    def __init__(self, run: RunDir) -> None:
        super().__init__()
        self.run = run
        self.log_offset = 0
        self.outcome: str | None = None

    def compose(self) -> ComposeResult:
        yield StepBar(6, id="stepbar")
        yield Static(Text(f"run: {self.run.path}", style="bold"), id="tail-status")
        yield Log(id="tail-log", highlight=False, max_lines=5000)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#tail-log").border_title = str(self.run.rank_log(0))
        self.set_status("running (rank 0's log below)…")
        self.set_interval(TAIL_INTERVAL_SECONDS, self.poll)

    def set_status(self, text: str, style: str = "") -> None:
        self.query_one("#tail-status", Static).update(
            Text.assemble((f"run: {self.run.path}\n", "bold"), (text, style)))

    def poll(self) -> None:
        self._tail()
        if self.outcome is None:
            self._report()

    def _report(self) -> None:
        error = getattr(self.app, "launch_error", None)
        result = getattr(self.app, "launch_result", None)
        if error:
            self.outcome = error
            self.set_status(error, "bold red")
        elif result is not None:
            self._tail()
            if result.exit_code == 0:
                self.outcome = "finished: exit code 0"
                self.set_status(self.outcome, "bold green")
            else:
                rank = result.first_failing_rank
                where = f", first failing rank {rank}" if rank is not None else ""
                self.outcome = f"stopped: exit code {result.exit_code}{where} (see {self.run.logs})"
                self.set_status(self.outcome, "bold red")

    def _tail(self) -> None:
        try:
            with open(self.run.rank_log(0), "rb") as f:
                if os.fstat(f.fileno()).st_size < self.log_offset:   # replaced (a relaunch): start over
                    self.log_offset = 0
                f.seek(self.log_offset)
                chunk = f.read(TAIL_CHUNK_BYTES)
        except OSError:
            return
        if not chunk:
            return
        # a full chunk may end mid-line: keep the partial line for the next poll
        cut = (chunk.rfind(b"\n") + 1 or len(chunk)) if len(chunk) == TAIL_CHUNK_BYTES else len(chunk)
        self.log_offset += cut
        self.query_one("#tail-log", Log).write(chunk[:cut].decode(errors="replace"))

    def action_back(self) -> None:
        self.dismiss()

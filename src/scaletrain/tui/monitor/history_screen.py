"""The monitor's history view (`h`): each GPU over the last minutes and the processes on it (nvitop's process
panel), or, on a CPU run, each rank's process. A Screen over the monitor, refreshed after every tick it samples.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Static

from scaletrain.engine.sampling.sampler import HISTORY_SAMPLES
from scaletrain.tui.widgets.gpu_history import GpuHistoryPanel
from scaletrain.tui.widgets.host_history import HostHistoryPanel


class HistoryScreen(Screen):
    CSS_PATH = "monitor.tcss"
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("h", "back", "Close", show=False),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("f1", "help", "Help", show=False, priority=True),
    ]
    HELP = f"""
## History
The last {HISTORY_SAMPLES} samples (minutes at the monitor's interval) since the monitor attached, newest on the
right. Per GPU: utilization, memory with the plan's predicted peak as a ─ line (a column past it is shaded), power
with its limit, then every process on the GPU with the memory NVML says it holds (`N/A` where the driver does not
say, e.g. in a container). A field NVML cannot read is `N/A` on its own and a gap (·) in its chart. On a CPU run:
the host's CPU and each rank's CPU and resident memory. `↑/↓`, PgUp/PgDn scroll; `esc` goes back.
"""

    def __init__(self, history: Any, predicted_bytes: int | None, unit: str = "GPU", monitor: Any = None) -> None:
        super().__init__()
        self.history = history
        self.predicted_bytes = predicted_bytes
        self.unit = unit
        self.monitor = monitor
        self._shown: tuple[int, ...] | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="history-title")
        yield VerticalScroll(id="history-area")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_view()
        self.query_one("#history-area").focus()

    def refresh_view(self) -> None:
        """Build a panel per GPU (once per set of GPUs), then redraw them from the history."""
        try:
            area = self.query_one("#history-area", VerticalScroll)
        except NoMatches:                  # a tick between the push and the mount, or after esc
            return
        gpus = tuple(sorted(self.history.gpus)) if self.history.gpu_reason is None else ()
        if gpus != self._shown:
            self._shown = gpus
            area.remove_children()
            panels = ([GpuHistoryPanel(self.history.gpus[i], self.history, self.predicted_bytes) for i in gpus]
                      or [HostHistoryPanel(self.history, self.predicted_bytes,
                                           "a CPU run" if self.unit == "process" else None)])
            area.mount_all(panels)
        for p in area.children:
            if isinstance(p, (GpuHistoryPanel, HostHistoryPanel)):
                p.refresh_view()
        what = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}" if gpus else "the run's processes"
        for title in self.query("#history-title").results(Static):
            title.update(Text.assemble(("history: ", "bold"), what, ("   esc: back to the monitor", "dim")))

    def action_back(self) -> None:
        self.dismiss()

    def action_help(self) -> None:
        from scaletrain.tui.widgets.help import HelpScreen, key_rows

        self.app.push_screen(HelpScreen(self.HELP, key_rows(self), global_keys=""))

"""The app behind `scaletrain monitor RUN_DIR`: one MonitorScreen, nothing else.

A small App rather than the wizard's: the wizard's factory builds the planning flow (detect → plan → write),
while attaching to an existing run needs only the monitor. The wizard pushes the same MonitorScreen after its
write step, so both paths show identical panels. `create_monitor_app` is the one factory the CLI, the pilot
tests and the benchmark use (tests pass a Sampler fed by recorded NVML samples).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.app import App
from textual.binding import Binding

from scaletrain.tui.monitor.screen import MonitorScreen


class MonitorApp(App[int]):
    TITLE = "scaletrain monitor"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("q", "quit", "Quit"),
        Binding("f1", "help", "Help", show=False, priority=True),
    ]

    def __init__(self, run_dir: str | Path, *, sampler: Any = None, start: bool = False,
                 interval_s: float | None = None, replay: str | None = None, detach: bool = True) -> None:
        super().__init__()
        self.monitor = MonitorScreen(run_dir, start=start, sampler=sampler, interval_s=interval_s, replay=replay,
                                     detach=detach)

    def on_mount(self) -> None:
        self.push_screen(self.monitor)

    def action_help(self) -> None:
        try:
            from scaletrain.tui.widgets.help import HelpScreen
        except ImportError:
            return
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(getattr(self.screen, "HELP", "")))


def create_monitor_app(run_dir: str | Path, *, sampler: Any = None, start: bool = False,
                       interval_s: float | None = None, replay: str | None = None, detach: bool = True) -> MonitorApp:
    return MonitorApp(run_dir, sampler=sampler, start=start, interval_s=interval_s, replay=replay, detach=detach)


def detached_note(run_dir: str | Path) -> str | None:
    """After a view closes: a run still going is said to keep training, with how to get back to it or stop it."""
    from scaletrain.engine.launch.status import read_status
    from scaletrain.engine.run.layout import RunDir

    run = RunDir(run_dir)
    st = read_status(run.status)
    if st.state not in ("starting", "running"):
        return None
    return (f"detached: {run.path} keeps training (launcher pid {st.launcher_pid}); `scaletrain monitor {run.path}` "
            f"attaches again, `scaletrain stop {run.path}` stops it")

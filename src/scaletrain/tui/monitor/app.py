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
    CSS_PATH = "monitor.tcss"          # the default screen's CSS_PATH is not loaded for it: the app brings it
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", show=False, priority=True)]   # q (the screen's) says Detach

    def __init__(self, run_dir: str | Path, *, sampler: Any = None, start: bool = False,
                 interval_s: float | None = None, replay: str | None = None, detach: bool = True) -> None:
        super().__init__()
        self.monitor = MonitorScreen(run_dir, start=start, sampler=sampler, interval_s=interval_s, replay=replay,
                                     detach=detach)

    def get_default_screen(self) -> MonitorScreen:
        """The monitor is the bottom screen: esc on it leaves the app, never onto an empty screen."""
        return self.monitor


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

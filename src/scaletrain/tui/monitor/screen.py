"""The monitor screen: per-GPU panels (or host panel), the job panel, and the doctor's remedies when a run fails.

Structure (reference §6): the engine's Sampler runs in a thread worker and posts one Ticked message per pass
(post_message is thread-safe); handlers only update widgets. Launching, diagnosing and applying a remedy run in
their own thread workers, so the screen never blocks on a subprocess or a log scan.

Layout: full GPU panels beside the job panel, or — above COMPACT_ABOVE_GPUS GPUs or below COMPACT_BELOW_COLUMNS
columns — one line per GPU (widgets/gpu_row.py) above the job panel, so 8 GPUs fit on 80×24.

`MonitorScreen(run, start=True)` launches the run first (the wizard's write step pushes it that way);
`scaletrain monitor RUN_DIR` attaches to a running or finished run with start=False.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static

from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.sampling.history import DeviceHistory
from scaletrain.tui.monitor.doctor_flow import DoctorFlow
from scaletrain.tui.monitor.run_control import RunControl
from scaletrain.tui.widgets.gpu_panel import GpuPanel, HostPanel
from scaletrain.tui.widgets.gpu_row import GpuRow
from scaletrain.tui.widgets.job_grid import JobGrid
from scaletrain.tui.widgets.job_panel import JobPanel
from scaletrain.tui.widgets.remedies import RemediesPanel

if TYPE_CHECKING:
    from scaletrain.engine.doctor.summary import Diagnosis
    from scaletrain.engine.launch.launcher import LaunchResult
    from scaletrain.engine.sampling.sampler import Sampler, Tick


COMPACT_ABOVE_GPUS = 4            # more GPUs than this: one line each
COMPACT_BELOW_COLUMNS = 100       # a terminal narrower than this: one line each, the job panel below them


SHORT_BELOW_ROWS = 30            # a terminal shorter than this: the job's numbers in three lines, and with the
                                 # whole-job grid shown, the grid stands in for the local GPU lines


def compact_layout(gpus: int, columns: int) -> bool:
    return gpus > COMPACT_ABOVE_GPUS or columns < COMPACT_BELOW_COLUMNS


@dataclass
class Ticked(Message):
    """One sampling pass (engine.sampling.sampler.Tick)."""

    tick: Tick


class MonitorScreen(RunControl, DoctorFlow, Screen):
    CSS_PATH = "monitor.tcss"          # the screen brings its styles, so the wizard can push it as it is
    BINDINGS = [                   # the footer's order: what a newcomer needs first (80 columns show these)
        Binding("q", "detach", "Detach"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("l", "log", "Log"),
        Binding("d", "diagnose", "Doctor"),
        Binding("h", "history", "History"),
        Binding("a", "apply", "Apply fix"),
        Binding("s", "stop_run", "Stop"),
        Binding("g", "cycle_chart", "Chart"),
        Binding("r", "cycle_rank", "Rank"),
        Binding("t", "grid_detail", "Temp/W"),
        Binding("escape", "back", "Back"),
        Binding("f1", "help", "Help", show=False, priority=True),
    ]
    HELP = """
## Monitor
One panel per GPU (utilization, memory with the plan's predicted peak ▼, temperature, power, this run's
processes), or one line per GPU above 4 GPUs or below 100 columns, or host CPU and memory per process on a CPU run.
`h` opens each GPU's history over the last minutes (utilization, memory against the plan's predicted line, power)
and the processes on it with their memory (on a CPU run: each process's CPU and memory). A job larger than this
machine (several nodes) gets a grid on top: a row per node, a cell per rank with its utilization and measured peak
as a share of the plan's (`t` adds temperature and power), stragglers and memory imbalance named.

The job panel shows step, loss, tokens/s and the ETA (a finished, failed or stopped run shows how long it ran
instead), and each rank's measured peak against the prediction; a red warning appears when a rank runs past the
prediction by more than the headroom. `g` cycles the chart: loss → tokens/s → step time, the last two against the
plan. `r` cycles the log tail's rank; `l` opens the whole log full-screen (scroll, `/` search, progress bars
folded).

When the run fails, the doctor names the first failing rank and lists remedies with their predicted memory and
step time, the first one selected: `↑/↓` choose, `a` shows what the highlighted one changes (the plan's fields,
memory and step time before → after, the step it resumes from) and asks: `y` applies it (plan.json rewritten, the
old files kept in attempts/) and relaunches, `n` leaves everything as it was. `d` asks the doctor at any time (a
healthy run: "no failure"); `d` again closes it.

The run trains in the background: `q` detaches (it keeps training; `scaletrain monitor` attaches again,
`scaletrain runs` lists it); `s` stops every rank after a second `s`. `esc` closes an open panel, then leaves
(as `q` does) — or, in the wizard, goes back to the write step.
"""
    HELP_FOOTER = """
`ctrl+q` leaves too. Every number here comes from the scaletrain engine (samples, metrics.jsonl, the plan);
the monitor only lays them out.
"""

    def __init__(self, run: RunDir | str | Path, *, start: bool = False, sampler: Sampler | None = None,
                 interval_s: float | None = None, replay: str | None = None, detach: bool = True) -> None:
        super().__init__()
        self.run = run if isinstance(run, RunDir) else RunDir(run)
        self.start = start
        self.detach = detach                       # launches run in the background (False: in this process)
        self.confirm_stop = False
        self._sampler = sampler
        self._interval_s = interval_s
        self._replay = replay
        self._stop = threading.Event()
        self.gpu_panels: dict[int, GpuPanel | GpuRow] = {}
        self.compact: bool | None = None           # the layout the GPU widgets are in (None: none shown yet)
        self.host_panel: HostPanel | None = None
        self.diagnosed_failure: tuple | None = None       # the failed launch last diagnosed (doctor_flow)
        self.diagnosis: Diagnosis | None = None
        self.last_tick: Tick | None = None
        self.launching = False
        self.launch_result: LaunchResult | None = None      # the last run this screen launched
        self.fix_note: str | None = None                    # the remedy last applied here (kept in the status)
        self.history = DeviceHistory()                      # the last minutes of every GPU / process (`h`)

    # ---- layout ----------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(Text(f"run: {self.run.path}", style="bold"), id="mon-status")
        yield JobGrid(id="job-grid")
        with Horizontal(id="mon-body"):
            yield VerticalScroll(id="gpu-area")
            yield JobPanel(world_size=None, id="job-panel")
        yield RemediesPanel(id="remedies")
        yield Footer()

    def on_mount(self) -> None:
        from scaletrain.engine.sampling.gpu import DEFAULT_INTERVAL_S
        from scaletrain.engine.sampling.sampler import make_sampler

        if self._sampler is None:
            self._sampler = make_sampler(self.run.path, self._interval_s or DEFAULT_INTERVAL_S, replay=self._replay)
        job = self._sampler.job
        self.query_one(JobPanel).world_size = job.world_size if job is not None else None
        self.sample_loop()
        if self.start:
            self.launch(resume=False)

    def on_unmount(self) -> None:
        self._stop.set()

    def set_status(self, text: str, style: str = "") -> None:
        self.query_one("#mon-status", Static).update(Text.assemble((f"run: {self.run.path}\n", "bold"),
                                                                   (text, style)))

    @property
    def unit(self) -> str:
        """What one rank runs on, in headers and remedies: a GPU, or a process on a CPU run."""
        job = self._sampler.job if self._sampler is not None else None
        return "process" if job is not None and job.on_cpu else "GPU"

    # ---- sampling --------------------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="sampler", exit_on_error=False)
    def sample_loop(self) -> None:
        try:
            self._sampler.run(lambda t: self.post_message(Ticked(t)), self._stop)
        finally:
            self._sampler.close()

    @on(Ticked)
    def on_ticked(self, message: Ticked) -> None:
        t = message.tick
        self.last_tick = t
        self.history.add(t)
        self._show_devices(t)
        for screen in self.app.screen_stack:            # the full-screen views over this one stay live
            if getattr(screen, "monitor", None) is self:
                screen.refresh_view()
        if t.job is not None:
            local = len(t.gpu.gpus) if t.gpu is not None and t.gpu.available else 0
            grid = self.query_one(JobGrid)
            grid.show_view(t.job.view, local)
            self.query_one(JobPanel).grid_shown = bool(grid.display)
            self._fit_height()
            self.query_one(JobPanel).update_job(t.job)
            self._maybe_diagnose(t.job.status)

    def _set_layout(self, compact: bool) -> None:
        """Switch between full panels and one line per GPU (the widgets are rebuilt; their history starts over)."""
        if compact == self.compact:
            return
        self.compact = compact
        for w in self.gpu_panels.values():
            w.remove()
        self.gpu_panels.clear()
        self.query_one("#mon-body").set_class(compact, "-compact")
        self.query_one(JobPanel).compact = compact

    def _fit_height(self) -> None:
        """A short terminal: the job's numbers shortened, and the grid (when shown) in place of the GPU lines."""
        short = self.size.height < SHORT_BELOW_ROWS
        panel = self.query_one(JobPanel)
        panel.short = short
        panel.set_class(short, "-short")
        self.query_one(RemediesPanel).set_class(short, "-short")
        self.query_one("#gpu-area").display = not (short and self.query_one(JobGrid).display)

    def on_resize(self) -> None:
        t = self.last_tick
        if t is None:
            return
        self._fit_height()
        n_gpus = len(t.gpu.gpus) if t.gpu is not None and t.gpu.available else 0
        if compact_layout(n_gpus, self.size.width) != self.compact:
            self._show_devices(t)

    def _show_devices(self, t: Tick) -> None:
        area = self.query_one("#gpu-area", VerticalScroll)
        g = t.gpu
        n_gpus = len(g.gpus) if g is not None and g.available else 0
        self._set_layout(compact_layout(n_gpus, self.size.width))
        job = self._sampler.job
        predicted = job.predicted_peak_bytes if job is not None else None
        if g is not None and g.available:
            rank_of: dict[int, int | None] = {}
            if t.host is not None:
                rank_of.update({p.pid: p.rank for p in t.host.procs})
            if t.job is not None:
                rank_of.update({pid: r for r, pid in t.job.status.rank_pids.items()})
            for i, s in enumerate(g.gpus):
                panel = self.gpu_panels.get(s.index)
                if panel is None:
                    kind = GpuRow if self.compact else GpuPanel
                    panel = self.gpu_panels[s.index] = kind(s.index)
                    area.mount(panel)
                name = g.names[i] if i < len(g.names) else None
                panel.update_sample(s, name, predicted, rank_of, tuple(m for m in g.migs if m.parent_index == s.index))
            return
        if self.host_panel is None:
            self.host_panel = HostPanel(id="host-panel")
            area.mount(self.host_panel)
        reason = ("a CPU run: no GPU to watch" if job is not None and job.on_cpu
                  else (g.reason if g is not None else "no GPU source"))
        if t.host is not None:
            self.host_panel.update_host(t.host, reason)

    # ---- keys --------------------------------------------------------------------------------------------------
    def action_cycle_chart(self) -> None:
        self.query_one("#job-chart").cycle()

    def action_grid_detail(self) -> None:
        grid = self.query_one(JobGrid)
        if not grid.display:
            self.set_status("t adds temperature and power to the whole-job grid, shown for runs of several nodes",
                            "yellow")
            return
        grid.toggle_detail()

    def action_cycle_rank(self) -> None:
        self.query_one(JobPanel).cycle_rank()

    def action_log(self) -> None:
        from scaletrain.tui.monitor.log_screen import LogScreen

        self.app.push_screen(LogScreen(self.query_one(JobPanel).book, self.query_one(JobPanel).rank_filter,
                                       monitor=self))

    def action_history(self) -> None:
        from scaletrain.tui.monitor.history_screen import HistoryScreen

        job = self._sampler.job if self._sampler is not None else None
        self.app.push_screen(HistoryScreen(self.history, job.predicted_peak_bytes if job is not None else None,
                                           self.unit, monitor=self))

    def action_help(self) -> None:
        from scaletrain.tui.widgets.help import HelpScreen, key_rows

        self.app.push_screen(HelpScreen(self.HELP, key_rows(self), global_keys=self.HELP_FOOTER,
                                        keys_title="Keys in the monitor"))

    def action_detach(self) -> None:
        """`q`: leave the monitor; a run still going keeps training (the CLI and the wizard print how to get back)."""
        self.app.exit(0)

    def action_back(self) -> None:
        """esc: cancel a pending stop, close the doctor's panel, else leave (the wizard: back to its write step)."""
        if self.confirm_stop:
            self.confirm_stop = False
            self.set_status("kept running", "")
            return
        panel = self.query_one(RemediesPanel)
        if panel.display:
            panel.hide()
            return
        if len(self.app.screen_stack) > 1:
            self.dismiss()
        else:
            self.app.exit(0)

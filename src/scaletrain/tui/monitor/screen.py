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
from scaletrain.tui.widgets.gpu_panel import GpuPanel, HostPanel
from scaletrain.tui.widgets.gpu_row import GpuRow
from scaletrain.tui.widgets.job_grid import JobGrid
from scaletrain.tui.widgets.job_panel import JobPanel
from scaletrain.tui.widgets.remedies import RemediesPanel

if TYPE_CHECKING:
    from scaletrain.engine.doctor.summary import Diagnosis
    from scaletrain.engine.doctor.remedies import Remedy
    from scaletrain.engine.launch.launcher import LaunchResult
    from scaletrain.engine.launch.relaunch import Applied
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


@dataclass
class Diagnosed(Message):
    diagnosis: Diagnosis


class MonitorScreen(Screen):
    CSS_PATH = "monitor.tcss"          # the screen brings its styles, so the wizard can push it as it is
    BINDINGS = [
        Binding("r", "cycle_rank", "Log rank"),
        Binding("g", "cycle_chart", "Chart"),
        Binding("t", "grid_detail", "Temp/power", show=False),
        Binding("d", "diagnose", "Diagnose"),
        Binding("a", "apply", "Apply remedy"),
        Binding("A", "apply_restart", "Apply, restart", show=False),
        Binding("s", "stop_run", "Stop run", show=False),
        Binding("escape", "back", "Back"),
        Binding("f1", "app.help", "Help", show=False, priority=True),
    ]
    HELP = """
## Monitor
One panel per GPU (utilization, memory with the plan's predicted peak ▼, temperature, power, this run's
processes), or one line per GPU above 4 GPUs or below 100 columns, or host CPU/memory per rank on a CPU run. A job
larger than this machine (several nodes) gets a grid on top: a row per node, a cell per rank with its utilization
and measured peak as a share of the plan's (`t` adds temperature and power), stragglers and memory imbalance named. The
chart shows the whole run: `g` cycles loss → tokens/s → step time, the last two against the plan's prediction; the
TensorBoard command is shown once the trainer writes its events. A run directory that does not exist yet is waited
for. The job panel shows step, loss, tokens/s, ETA and each
rank's measured peak against the prediction; a red warning appears when a rank runs past the prediction by more
than the headroom. `r` cycles the log tail's rank. When the run fails, the doctor names the first failing rank and
lists remedies with predicted memory and step time: `↑/↓` choose, `a` applies one (rewrites the run's files, keeps
the old plan as a backup) and relaunches from the last checkpoint; a change the checkpoint cannot survive (ZeRO
stage, precision, sequence length) is refused, and `A` applies it from step 0 instead. `d` diagnoses on demand.
A run launched here runs in the background: `q` detaches (the run keeps training; `scaletrain monitor` attaches
again, `scaletrain runs` lists it); `s` stops it (every rank) after a second `s` to confirm.
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
        self.diagnosed_state: str | None = None
        self.diagnosis: Diagnosis | None = None
        self.last_tick: Tick | None = None
        self.launching = False
        self.launch_result: LaunchResult | None = None      # the last run this screen launched

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
        self._show_devices(t)
        if t.job is not None:
            local = len(t.gpu.gpus) if t.gpu is not None and t.gpu.available else 0
            grid = self.query_one(JobGrid)
            grid.show_view(t.job.view, local)
            self.query_one(JobPanel).grid_shown = bool(grid.display)
            self._fit_height()
            self.query_one(JobPanel).update_job(t.job)
            self._maybe_diagnose(t.job.status.state)

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

    # ---- launching -------------------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="launch", exit_on_error=False)
    def launch(self, resume: bool, env: dict[str, str] | None = None) -> None:
        self._launch_blocking(resume, env)

    def _launch_blocking(self, resume: bool, env: dict[str, str] | None) -> None:
        """Start the launcher in its own session (it outlives this screen) and say so; or, with detach off, run
        it here to the end (in a worker thread) and say how it ended."""
        from scaletrain.engine.errors import ScaletrainError
        from scaletrain.engine.launch.detach import start_detached
        from scaletrain.engine.launch.launcher import launch

        self.launching = True
        self.app.call_from_thread(self.set_status, "resuming from the last checkpoint…" if resume else "launching…")
        if self.detach:
            try:
                d = start_detached(self.run.path, resume=resume, env=env)
            except ScaletrainError as e:
                self.app.call_from_thread(self.set_status, f"launch failed: {e}", "bold red")
                return
            finally:
                self.launching = False
            self.app.call_from_thread(self.set_status, f"{'resumed' if resume else 'launched'} in the background "
                                      f"(launcher pid {d.pid}): q detaches and it keeps training, s stops it", "bold")
            return
        try:
            # the screen going away (ctrl+q, app exit, a failed test) stops every rank: no orphans
            result = launch(self.run.path, resume=resume, env=env, stop=self._stop)
        except ScaletrainError as e:
            self.app.call_from_thread(self.set_status, f"launch failed: {e}", "bold red")
            return
        finally:
            self.launching = False
        self.launch_result = result
        msg = ("finished: exit code 0" if result.ok else
               f"stopped: exit code {result.exit_code}" + (f", first failing rank {result.first_failing_rank}"
                                                          if result.first_failing_rank is not None else ""))
        self.app.call_from_thread(self.set_status, msg, "bold green" if result.ok else "bold red")

    # ---- the doctor ------------------------------------------------------------------------------------------
    def _maybe_diagnose(self, state: str) -> None:
        if state == "failed" and self.diagnosed_state != "failed" and not self.launching:
            self.diagnosed_state = "failed"
            self.diagnose()
        elif state in ("running", "starting"):
            self.diagnosed_state = state

    @work(thread=True, exclusive=True, group="doctor", exit_on_error=False)
    def diagnose(self) -> None:
        from scaletrain.engine.doctor.diagnosis import diagnose_paths
        from scaletrain.engine.errors import ScaletrainError

        try:
            d = diagnose_paths([self.run.path])
        except ScaletrainError as e:
            self.app.call_from_thread(self.set_status, f"diagnosis failed: {e}", "bold red")
            return
        self.post_message(Diagnosed(d))

    @on(Diagnosed)
    def on_diagnosed(self, message: Diagnosed) -> None:
        self.diagnosis = message.diagnosis
        self.query_one(RemediesPanel).show(message.diagnosis)
        if message.diagnosis.remedies:
            self.query_one("#remedy-list").focus()

    def action_diagnose(self) -> None:
        self.diagnose()

    def action_cycle_chart(self) -> None:
        self.query_one("#job-chart").cycle()

    def action_grid_detail(self) -> None:
        self.query_one(JobGrid).toggle_detail()

    def action_cycle_rank(self) -> None:
        self.query_one(JobPanel).cycle_rank()

    def action_apply_restart(self) -> None:
        self.action_apply(restart=True)

    def action_apply(self, restart: bool = False) -> None:
        panel = self.query_one(RemediesPanel)
        r = panel.selected
        if r is None:
            self.set_status("no remedy to apply (the doctor runs when the run fails; d diagnoses now)", "yellow")
            return
        if not r.applicable:
            self.set_status(f"“{r.title}” is a manual step; scaletrain cannot apply it", "yellow")
            return
        if self.launching:
            self.set_status("the run is still running; wait for it to stop before applying a remedy", "yellow")
            return
        self.apply(r, restart)

    @work(thread=True, exclusive=True, group="launch", exit_on_error=False)
    def apply(self, remedy: Remedy, restart: bool = False) -> None:
        from scaletrain.engine.errors import ScaletrainError
        from scaletrain.engine.launch.relaunch import apply_remedy

        self.launching = True
        try:
            applied = apply_remedy(self.run.path, remedy.changes, restart=restart, title=remedy.title)
        except ScaletrainError as e:
            self.launching = False
            self.app.call_from_thread(self.set_status, f"not applied: {e}", "bold red")
            return
        self.app.call_from_thread(self._applied, applied)
        self._launch_blocking(applied.resume, applied.env)

    def _applied(self, applied: Applied) -> None:
        self.query_one(RemediesPanel).hide()
        self.diagnosed_state = None
        self.set_status(applied.summary, "bold")

    def action_stop_run(self) -> None:
        """`s` asks, a second `s` stops every rank of the run (engine/launch/detach.stop_run); esc cancels."""
        from scaletrain.engine.launch.status import read_status

        st = read_status(self.run.status)
        if st.state not in ("starting", "running"):
            self.set_status(f"the run is not running ({st.state}); nothing to stop", "yellow")
            return
        if not self.confirm_stop:
            self.confirm_stop = True
            self.set_status("stop the run? every rank ends (it resumes from its last checkpoint with `scaletrain "
                            "launch RUN --resume`): press s again to stop, esc to keep it running", "bold yellow")
            return
        self.confirm_stop = False
        self.set_status("stopping every rank…", "bold")
        self.stop_run()

    @work(thread=True, exclusive=True, group="stop", exit_on_error=False)
    def stop_run(self) -> None:
        from scaletrain.engine.errors import ScaletrainError
        from scaletrain.engine.launch.detach import stop_run

        try:
            st, _ = stop_run(self.run.path)
        except ScaletrainError as e:
            self.app.call_from_thread(self.set_status, f"not stopped: {e}", "bold red")
            return
        self.app.call_from_thread(self.set_status, f"stopped: every rank ended; status {st.state}"
                                  + (f", exit code {st.exit_code}" if st.exit_code is not None else ""), "bold")

    def action_back(self) -> None:
        if self.confirm_stop:
            self.confirm_stop = False
            self.set_status("kept running", "")
            return
        if len(self.app.screen_stack) > 1:
            self.dismiss()
        else:
            self.app.exit(0)

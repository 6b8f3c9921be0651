"""The job panel: step / total, tokens/s and step time beside the plan's, the ETA (a run that is over shows how long
it ran instead), the TensorBoard command, measured vs predicted peak per rank (left out in the compact layout, where
each GPU's line shows its memory), the run chart (loss, tokens/s, step time: widgets/run_chart.py), the log tail.

Formatting only: numbers come from sampling.watcher.JobSnapshot (which reads engine.run.metrics), the predicted
peaks from the plan. The log lines go into an engine LogBook (progress bars folded), which the full-screen log view
(`l`) reads too; the tail shows its last LOG_TAIL_LINES per rank, so the rank filter (`r`) can re-show past lines.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Log, Static

from scaletrain.engine.launch.status import OVER
from scaletrain.engine.run.log_text import LogBook
from scaletrain.engine.sampling.watcher import LOG_TAIL_LINES
from scaletrain.engine.units import fmt_bytes, fmt_seconds
from scaletrain.tui.widgets.gpu_panel import bar
from scaletrain.tui.widgets.run_chart import RunChart

STATE_STYLE = {"starting": "yellow", "running": "bold green", "finished": "bold cyan", "failed": "bold red",
               "unknown": "dim"}


def took_text(s: Any, wall_seconds: float | None, said: str) -> str:
    """How long the run has gone on: the launch's wall time after `said` where its status has the times (start-up,
    checkpoints and the export included), else what the steps took, called that."""
    if wall_seconds is not None:
        return f"{said} {fmt_seconds(wall_seconds)}"
    return f"{fmt_seconds(s.elapsed_seconds)} in steps"


def when_text(state: str, s: Any, wall_seconds: float | None) -> str:
    """The ETA while the run goes on; a run that is over (finished, failed, stopped) has none, only how long it ran."""
    if state in OVER:
        return f"{state} {took_text(s, wall_seconds, 'after')}"
    return f"ETA {fmt_seconds(s.eta_seconds)}   {took_text(s, wall_seconds, 'elapsed')}"


class JobPanel(VerticalScroll):
    """Numbers on top, the run chart, the per-rank log tail below (scrolls when the terminal is short)."""

    DEFAULT_CLASSES = "job-panel"

    def __init__(self, world_size: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.world_size = world_size
        self.rank_filter: int | None = None          # None = all ranks
        self.book = LogBook()                         # every line since attaching, progress bars folded (`l`)
        self.last: Any = None
        self.compact = False                          # the monitor's compact layout: no per-rank table
        self.short = False                            # a short terminal: the numbers in three lines, chart below
        self.grid_shown = False                       # the whole-job grid shows every rank: no per-rank table

    def compose(self) -> ComposeResult:
        yield Static(Text("waiting for the first step…", style="dim"), id="job-numbers")
        yield RunChart(id="job-chart")
        yield Static("", id="job-log-title")
        yield Log(id="job-log", highlight=False, max_lines=LOG_TAIL_LINES * 4)

    def on_mount(self) -> None:
        self._title()

    # ---- numbers ---------------------------------------------------------------------------------------------
    def update_job(self, job: Any) -> None:
        self.last = job
        self.query_one("#job-numbers", Static).update(self.render_job(job))
        chart = self.query_one(RunChart)
        if job.series is not chart.series:
            chart.show(job.series)
        appended, updated = self.book.extend(job.new_log_lines)
        if updated:                                   # a progress bar redrawn in place: show the tail afresh
            self._rewrite_log()
        elif appended:
            self.query_one("#job-log", Log).write_lines([self._fmt(e.rank, e.text) for e in appended
                                                         if self._keep(e.rank)])

    @property
    def lines(self) -> list[tuple[int | None, str]]:
        """(rank, line) of the tail, oldest first, progress bars folded."""
        return [(e.rank, e.text) for e in list(self.book.entries)[-LOG_TAIL_LINES * max(1, self.world_size or 1):]]

    def render_job(self, job: Any) -> Group:
        if job.waiting_for is not None:
            return Group(Text(job.waiting_for + "…", style="yellow"))
        st = job.status
        head = Text.assemble(("job ", "bold"), (st.state, STATE_STYLE.get(st.state, "")))
        if st.exit_code is not None:
            head.append(f"  exit code {st.exit_code}")
        if st.first_failing_rank is not None:
            head.append(f"  first failing rank {st.first_failing_rank}", style="red")
        rows: list[Any] = [head]
        s = job.summary
        if self.short and s is not None:
            return Group(*self._short_rows(head, job))
        if s is None:
            rows.append(Text("no step finished yet (metrics.jsonl is empty)", style="dim"))
        else:
            line = Text(f"step {s.step}/{s.total_steps}  ")
            line.append_text(bar(s.fraction_done, cells=30, style="cyan"))
            line.append(f" {s.fraction_done:4.0%}   epoch {s.epoch:.2f}")
            rows.append(line)
            rows.append(Text(f"loss {s.loss:.4f} (first {s.loss_first:.4f})   lr {s.lr:.3g}"))
            if s.versus is not None:       # measured beside the plan's, measured ÷ planned (engine summary)
                rows.append(Text(f"tokens/s {s.versus.tokens_text()}   step {s.versus.step_text()}"))
                rows.append(Text(when_text(st.state, s, job.wall_seconds)))
            else:
                rows.append(Text(f"tokens/s {s.tokens_per_second:,.0f}   step {fmt_seconds(s.step_seconds)}   "
                                 + when_text(st.state, s, job.wall_seconds)))
        if job.tensorboard:
            rows.append(Text.assemble(("TensorBoard: ", "dim"), job.tensorboard))
        if job.memory and not self.compact and not self.grid_shown:
            t = Table(box=None, pad_edge=False, show_edge=False, header_style="dim")
            t.add_column("rank")
            t.add_column("measured peak", justify="right")
            t.add_column("predicted", justify="right")
            t.add_column("")
            for m in job.memory:
                t.add_row(str(m.rank), "N/A" if m.measured_bytes is None else fmt_bytes(m.measured_bytes),
                          "N/A" if not m.predicted_bytes else fmt_bytes(m.predicted_bytes),
                          Text("over!" if m.warning else m.what, style="bold red" if m.warning else "dim"))
            rows.append(t)
        for w in job.warnings:
            rows.append(Text(f"⚠ {w}", style="bold red"))
        return Group(*rows)

    def _short_rows(self, head: Text, job: Any) -> list[Text]:
        """Step, progress and ETA on the state's line; loss and speed against the plan on the next; the first
        warning: room for the chart on a 24-row terminal."""
        s = job.summary
        head.append(f"  step {s.step}/{s.total_steps} ")
        head.append_text(bar(s.fraction_done, cells=12, style="cyan"))
        head.append(f" {s.fraction_done:4.0%}  " + (f"ETA {fmt_seconds(s.eta_seconds)}" if job.status.state not in OVER
                                                   else took_text(s, job.wall_seconds, "ran")))
        speed = (f"{s.versus.tokens_text()}  {s.versus.step_text()}" if s.versus is not None
                 else f"{s.tokens_per_second:,.0f} tok/s  step {fmt_seconds(s.step_seconds)}")
        rows = [head, Text(f"loss {s.loss:.4f}  {speed}", no_wrap=True, overflow="ellipsis")]
        rows += [Text(f"⚠ {w}", style="bold red", no_wrap=True, overflow="ellipsis") for w in job.warnings[:1]]
        for r in rows:
            r.no_wrap, r.overflow = True, "ellipsis"
        return rows

    # ---- log tail --------------------------------------------------------------------------------------------
    def _keep(self, rank: int | None) -> bool:
        return self.rank_filter is None or rank == self.rank_filter

    @staticmethod
    def _fmt(rank: int | None, line: str) -> str:
        return f"[{rank}] {line}" if rank is not None else line

    def _title(self) -> None:
        which = "all ranks" if self.rank_filter is None else f"rank {self.rank_filter}"
        self.query_one("#job-log-title", Static).update(
            Text.assemble(("log tail: ", "bold"), which, ("   (r: next rank, l: the whole log)", "dim")))

    def cycle_rank(self) -> None:
        ranks = sorted(self.book.ranks | set(range(self.world_size or 0)))
        order: list[int | None] = [None, *ranks]
        self.rank_filter = order[(order.index(self.rank_filter) + 1) % len(order)] if self.rank_filter in order \
            else None
        self._title()
        self._rewrite_log()

    def _rewrite_log(self) -> None:
        log = self.query_one("#job-log", Log)
        log.clear()
        log.write_lines([self._fmt(r, ln) for r, ln in self.lines if self._keep(r)][-LOG_TAIL_LINES:])

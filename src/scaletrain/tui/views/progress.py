"""Headless live progress, formatted: the rich bar's columns and a run's one-paragraph outcome (no Textual).

Every number shown comes from engine.run.metrics.summarize (loss, tokens/s, step time, ETA, and those beside the
plan's with measured ÷ planned) or the launcher's result; this module only formats. Launching and watching is
tui/monitor/stream.py.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

from scaletrain.engine.run.metrics import MetricsSummary
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.units import fmt_bytes, fmt_seconds

FAILURE_LOG_LINES = 25          # lines of the failing rank's log shown when a run fails


def progress_fields(s: MetricsSummary | None) -> dict[str, str]:
    if s is None:
        return {"loss": "starting…", "speed": "", "eta": ""}
    v = s.versus              # measured beside the plan's, from the engine's summary
    speed = (f"{v.step_text()} · {v.tokens_text()}" if v is not None
             else f"{s.tokens_per_second:,.0f} tok/s · {fmt_seconds(s.step_seconds)}/step")
    return {"loss": f"loss {s.loss:.4f}", "speed": speed,
            "eta": f"ETA {fmt_seconds(s.eta_seconds)}" if s.step < s.total_steps else "done"}


# The bar redraws itself this often on a terminal (rich's default is 10): each redraw builds the whole table on the
# launcher's thread, CPU taken from the ranks on a machine they fill. Off a terminal nothing redraws until the end.
REFRESH_PER_SECOND = 2


def make_progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[loss]}"), TextColumn("{task.fields[speed]}"),
                    TextColumn("{task.fields[eta]}"), console=console, transient=False,
                    auto_refresh=console.is_terminal, refresh_per_second=REFRESH_PER_SECOND)


def print_outcome(con: Console, run: RunDir, result: Any, s: MetricsSummary | None, status: Any,
                  failed: tuple[int, list[str]] | None = None) -> None:
    """How the run ended: the metrics' summary, then stopped / finished / failed with the failing rank's last log
    lines (`failed`: that rank and its lines)."""
    if s is not None:
        mem = (f", peak {fmt_bytes(s.peak_allocated_bytes)} allocated" if s.peak_allocated_bytes is not None
               else f", peak host RSS {fmt_bytes(s.peak_host_rss_bytes)}/rank" if s.peak_host_rss_bytes else "")
        speed = (f"{s.versus.tokens_text()}, {s.versus.step_text()}" if s.versus is not None
                 else f"{s.tokens_per_second:,.0f} tok/s")
        con.print(f"step {s.step}/{s.total_steps}, loss {s.loss_first:.4f} → {s.loss:.4f}, "
                  f"{speed} on {s.ranks_text}{mem}")
    if result.interrupted:
        con.print(f"[yellow]stopped[/] (Ctrl-C); every rank ended. Resume with: "
                  f"scaletrain launch {run.path} --resume")
    elif result.ok:
        con.print(f"[green]finished[/]; metrics {run.metrics}, checkpoints {run.checkpoints}")
        line = export_line(run)
        if line:
            con.print(line, markup=False, highlight=False, soft_wrap=True)
    else:
        where = (f"rank {result.first_failing_rank} failed first (exit {result.failing_rank_exit_code})"
                 if result.first_failing_rank is not None else f"accelerate exited {result.launcher_exit_code}")
        con.print(f"[red]failed[/]: {where}; exit code {result.exit_code}; status {status}")
        rank, lines = failed or (0, [])
        if lines:
            con.rule(f"last lines of {run.rank_log(rank).name}")
            for line in lines:
                con.print(line, markup=False, highlight=False)


def export_line(run: RunDir) -> str | None:
    """Where the run's model is (its newest export, engine/run/exports.py), its check, and how to try it."""
    from scaletrain.engine.run.exports import newest_export

    e = newest_export(run)
    if e is None:
        return None
    return (f"export (step {e.step}): {e.loadable} ({e.check_text()}); try it: scaletrain chat {run.path} "
            f"--prompt TEXT")

"""Headless live progress: launch a run directory and show a rich bar from metrics.jsonl (no Textual).

Every number shown comes from engine.run.metrics.summarize (loss, tokens/s, step time, ETA, and those beside the
plan's with measured ÷ planned) or the launcher's result; this module only formats. Ctrl-C stops the whole run
(engine.run.launcher) and the exit code is the training's.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

from scaletrain.engine.run.launcher import launch, prepare_launch, rank_log_tail
from scaletrain.engine.run.metrics import MetricsSummary, MetricsTail, summarize
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.run.plan_document import read_plan_document
from scaletrain.engine.units import fmt_bytes, fmt_seconds

FAILURE_LOG_LINES = 25          # lines of the failing rank's log shown when a run fails


def _fields(s: MetricsSummary | None) -> dict[str, str]:
    if s is None:
        return {"loss": "starting…", "speed": "", "eta": ""}
    v = s.versus              # measured beside the plan's, from the engine's summary
    speed = (f"{v.step_text()} · {v.tokens_text()}" if v is not None
             else f"{s.tokens_per_second:,.0f} tok/s · {fmt_seconds(s.step_seconds)}/step")
    return {"loss": f"loss {s.loss:.4f}", "speed": speed,
            "eta": f"ETA {fmt_seconds(s.eta_seconds)}" if s.step < s.total_steps else "done"}


def make_progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[loss]}"), TextColumn("{task.fields[speed]}"),
                    TextColumn("{task.fields[eta]}"), console=console, transient=False)


def stream_run(run_dir: str | os.PathLike[str], *, machine_rank: int | None = None,
               main_process_ip: str | None = None, resume: bool = False, script: str | None = None,
               script_args: Sequence[str] = (), echo_logs: bool = False, console: Console | None = None) -> int:
    """Launch the run, show progress until it ends, print a one-paragraph outcome; return the training's code."""
    prep = prepare_launch(run_dir, machine_rank=machine_rank, main_process_ip=main_process_ip, resume=resume,
                          script=script, script_args=script_args)      # bad input: one line, before any output
    run = prep.run
    con = console or Console(highlight=False)
    doc = read_plan_document(run.plan)
    planned = {"planned_step_seconds": doc.planned_step_seconds,
               "planned_tokens_per_second": doc.planned_tokens_per_second}
    tail = MetricsTail(run.metrics)
    tail.poll()                      # a resumed run: earlier steps are history, the bar starts from them
    progress = make_progress(con)
    task = progress.add_task(run.path.name, total=None, start=True, **_fields(None))

    def on_tick() -> None:
        if tail.poll():
            s = summarize(tail.series, **planned)
            if s is not None:
                progress.update(task, total=s.total_steps, completed=s.step, **_fields(s))

    def on_output(rank: int | None, line: str) -> None:
        if echo_logs:
            progress.console.print(f"[dim]{'launcher' if rank is None else f'rank{rank}'}:[/] {line}",
                                   markup=True, highlight=False, soft_wrap=True)

    con.print(f"[bold]scaletrain[/] launching {run.path}  (logs: {run.logs}, Ctrl-C stops every rank)")
    if prep.num_machines > 1:
        ranks = prep.local_ranks
        con.print(f"node {prep.machine_rank} of {prep.num_machines} (0 is the head node, {prep.main_process_ip}): "
                  f"global ranks {ranks.start}–{ranks.stop - 1}; the other nodes start with "
                  f"`scaletrain launch {run.path} --machine-rank R`"
                  + ("" if prep.machine_rank == 0 else "; metrics come from global rank 0 on the head node"))
    with progress:
        result = launch(run.path, machine_rank=machine_rank, main_process_ip=main_process_ip, resume=resume,
                        script=script, script_args=script_args, on_output=on_output, on_tick=on_tick, prepared=prep)
    _report(con, run, result, summarize(tail.series, **planned), prep.status)
    return result.exit_code


def _report(con: Console, run: RunDir, result: Any, s: MetricsSummary | None, status: Any) -> None:
    if s is not None:
        mem = (f", peak {fmt_bytes(s.peak_allocated_bytes)} allocated" if s.peak_allocated_bytes is not None
               else f", peak host RSS {fmt_bytes(s.peak_host_rss_bytes)}/rank" if s.peak_host_rss_bytes else "")
        speed = (f"{s.versus.tokens_text()}, {s.versus.step_text()}" if s.versus is not None
                 else f"{s.tokens_per_second:,.0f} tok/s")
        con.print(f"step {s.step}/{s.total_steps}, loss {s.loss_first:.4f} → {s.loss:.4f}, "
                  f"{speed} on {s.world_size} process(es){mem}")
    if result.interrupted:
        con.print(f"[yellow]stopped[/] (Ctrl-C); every rank ended. Resume with: "
                  f"scaletrain launch {run.path} --resume")
    elif result.ok:
        con.print(f"[green]finished[/]; metrics {run.metrics}, checkpoints {run.checkpoints}")
    else:
        where = (f"rank {result.first_failing_rank} failed first (exit {result.failing_rank_exit_code})"
                 if result.first_failing_rank is not None else f"accelerate exited {result.launcher_exit_code}")
        con.print(f"[red]failed[/]: {where}; exit code {result.exit_code}; status {status}")
        rank = (result.first_failing_rank if result.first_failing_rank is not None
                else min(result.exit_codes, default=0))
        lines = rank_log_tail(run.path, rank, FAILURE_LOG_LINES)
        if lines:
            con.rule(f"last lines of {run.rank_log(rank).name}")
            for line in lines:
                con.print(line, markup=False, highlight=False)

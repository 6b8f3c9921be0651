"""Headless live progress: launch a run directory and show a rich bar from metrics.jsonl while it runs (no
Textual); `scaletrain --headless`, `scaletrain launch` and the `--plain` wizard use it. The bar and the outcome are
formatted by views/progress.py. Ctrl-C stops the whole run (engine.launch.launcher) and the exit code is the
training's.
"""

from __future__ import annotations

import os
from typing import Sequence

from rich.console import Console

from scaletrain.engine.launch.launcher import launch, prepare_launch
from scaletrain.engine.launch.rank_logs import rank_log_tail
from scaletrain.engine.run.metrics import MetricsTail, summarize
from scaletrain.engine.run.plan_document import read_plan_document
from scaletrain.tui.views.progress import FAILURE_LOG_LINES, make_progress, print_outcome, progress_fields


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
    task = progress.add_task(run.path.name, total=None, start=True, **progress_fields(None))

    def on_tick() -> None:
        if tail.poll():
            s = summarize(tail.series, **planned)
            if s is not None:
                progress.update(task, total=s.total_steps, completed=s.step, **progress_fields(s))

    def on_output(rank: int | None, line: str) -> None:
        if echo_logs:
            progress.console.print(f"[dim]{'launcher' if rank is None else f'rank{rank}'}:[/] {line}",
                                   markup=True, highlight=False, soft_wrap=True)

    con.print(f"[bold]scaletrain[/] launching {run.path}  (logs: {run.logs}, Ctrl-C stops every rank)")
    for note in prep.notes:
        con.print(f"[dim]note:[/] {note}", highlight=False, soft_wrap=True)
    if prep.num_machines > 1:
        ranks = prep.local_ranks
        con.print(f"node {prep.machine_rank} of {prep.num_machines} (0 is the head node, {prep.main_process_ip}): "
                  f"global ranks {ranks.start}–{ranks.stop - 1}; the other nodes start with "
                  f"`scaletrain launch {run.path} --machine-rank R`"
                  + ("" if prep.machine_rank == 0 else "; metrics come from global rank 0 on the head node"))
    with progress:
        result = launch(run.path, machine_rank=machine_rank, main_process_ip=main_process_ip, resume=resume,
                        script=script, script_args=script_args, on_output=on_output, on_tick=on_tick, prepared=prep)
    failed = None
    if not (result.ok or result.interrupted):        # the failing rank's last lines (the first rank's otherwise)
        rank = (result.first_failing_rank if result.first_failing_rank is not None
                else min(result.exit_codes, default=0))
        failed = (rank, rank_log_tail(run.path, rank, FAILURE_LOG_LINES))
    print_outcome(con, run, result, summarize(tail.series, **planned), prep.status, failed)
    return result.exit_code

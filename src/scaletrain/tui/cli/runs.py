"""`scaletrain runs [--json]` (every run launched here, wherever its folder is) and `scaletrain stop RUN_DIR` (end
every rank of a run, wait for a final status). The registry and the stop live in the engine (engine/launch/registry.py,
engine/launch/detach.py); this module formats."""

from __future__ import annotations

import argparse
import json
import shutil
import sys

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.units import fmt_bytes, fmt_seconds
from scaletrain.tui.cli.plan_args import stated

HEAD = ("STATE", "STEP", "LOSS", "ETA", "PEAK / PLAN", "NODES×DEV", "FOLDER")


def configure_runs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help=stated("print the runs as one JSON list", "off"))


def configure_stop(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a running run's directory (`scaletrain runs` lists them)")
    p.add_argument("--machine-rank", type=int, metavar="R",
                   help=stated("multi-node: the node whose share to stop (run it on that node)", "0"))


def row_cells(r) -> tuple[str, ...]:
    step = f"{r.step}/{r.total_steps}" if r.step is not None else "-"
    loss = f"{r.loss:.4f}" if r.loss is not None else "-"
    eta = fmt_seconds(r.eta_seconds) if r.eta_seconds is not None else "-"
    peak = (fmt_bytes(r.peak_bytes, 3) + (" RSS" if r.peak_kind == "host RSS" else "")) \
        if r.peak_bytes is not None else "-"
    plan = fmt_bytes(r.planned_bytes, 3) if r.planned_bytes else "-"
    kind = "CPU" if r.on_cpu else "GPU"
    shape = f"{r.nodes}×{r.devices_per_node} {kind}" if r.nodes and r.devices_per_node else "-"
    state = r.state + (f" ({r.exit_code})" if r.state in ("failed", "interrupted") and r.exit_code else "")
    return state, step, loss, eta, f"{peak} / {plan}", shape, str(r.path)


def table_lines(table: list[tuple[str, ...]], columns: int) -> list[str]:
    """The table's lines, the folder last on each; where a row would run past `columns` (an 80-column SSH
    terminal), every folder goes on a line of its own under its row, so no line wraps in the middle of a cell."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in table]
    if max(len(line) + 2 + len(row[-1]) for line, row in zip(lines, table)) <= columns:
        return [line + "  " + row[-1] for line, row in zip(lines, table)]
    return [lines[0].rstrip()] + [x for line, row in zip(lines[1:], table[1:]) for x in (line.rstrip(),
                                                                                     "  " + row[-1])]


def cmd_runs(args: argparse.Namespace) -> int:
    from scaletrain.engine.launch.registry import DIED, list_runs, registry_dir

    rows = list_runs()
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
        return 0
    if not rows:
        print(f"no runs launched on this machine yet (the list lives in {registry_dir()})")
        return 0
    for line in table_lines([HEAD, *(row_cells(r) for r in rows)], shutil.get_terminal_size().columns):
        print(line)
    if any(r.state == DIED for r in rows):
        print(f"{DIED}: the launcher is gone and never recorded how the run ended (killed with its watchdog, or the "
              "machine restarted); resume with `scaletrain launch RUN_DIR --resume`")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from scaletrain.engine.launch.detach import not_running, state_text, stop_run

    if args.machine_rank is not None and args.machine_rank < 0:
        raise ScaletrainError(f"--machine-rank must be ≥ 0 (got {args.machine_rank})")
    st, stopped = stop_run(args.run_dir, machine_rank=args.machine_rank)
    if not stopped:
        print(f"{args.run_dir} is {not_running(st)}; nothing to stop")
        return 0
    print(f"stopped {args.run_dir}: every process ended; status {state_text(st)}. Resume with: "
          f"scaletrain launch {args.run_dir} --resume --detach")
    return 0 if st.over else 1


def print_detached(run_dir: object, pid: int, state: str, out=None, notes: tuple[str, ...] = ()) -> None:
    """What a detached launch says: its launch's notes, where the run is and how to watch or stop it."""
    out = out or sys.stdout
    for note in notes:
        print(f"note: {note}", file=out)
    print(f"launched {run_dir} in the background (launcher pid {pid}, {state}); it keeps training when this "
          f"terminal closes.\n  watch: scaletrain monitor {run_dir}\n  list:  scaletrain runs\n  stop:  "
          f"scaletrain stop {run_dir}", file=out, flush=True)

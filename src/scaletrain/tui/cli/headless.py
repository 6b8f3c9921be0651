"""`scaletrain --preset NAME --headless [--dry-run | --detach] [--run-dir DIR]`: replay a plan without any TUI.

Plan, write the run directory, print a short summary (rich, no Textual), then hand the run to the launcher's live
progress (monitor/stream.py) unless --dry-run; --detach starts it in the background (engine/launch/detach.py) and
returns. The exit code is the training's; a plan that does not fit a resource
it knows (GPU memory, host RAM, disk: engine/run/resources.py) is written, named in one line and not launched, exit
3 (EXIT_DOES_NOT_FIT). `--save-preset NEW` writes the request (with the planner's choices pinned) as a preset;
without --headless it only saves.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from scaletrain.engine.devices.detect import require_local_gpus
from scaletrain.engine.errors import EXIT_DOES_NOT_FIT, ScaletrainError
from scaletrain.engine.plan.cost import plan_cost, price_table
from scaletrain.engine.plan.plan import Plan
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.presets import write_preset
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.run.resources import resource_verdict
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.run.scripts import node_launch_commands
from scaletrain.engine.run.writers import write_run_dir, written_files
from scaletrain.engine.request.args import asked_from_args
from scaletrain.tui.monitor.stream import stream_run
from scaletrain.engine.request.weights import weights_download, weights_note, weights_warning
from scaletrain.tui.views.render import print_plan, print_weights


def print_written(console: Console, run: RunDir) -> None:
    console.print(f"[bold]run directory[/] {run.path}")
    for p in written_files(run):
        console.print(f"  {p.name}{'/' if p.is_dir() else ''}")


def save_preset_from_args(console: Console, args: argparse.Namespace, request: PlanRequest, train: TrainOptions,
                          plan: Plan) -> None:
    name = args.save_preset
    path, backup = write_preset(name, request, train, plan=plan)
    console.print(f"saved preset [bold]{name}[/] to {path}"
                  + (f" (previous version kept as {backup})" if backup else ""))


def print_node_commands(console: Console, plan: Plan, run: RunDir, main_process_ip: str | None, lead: str) -> None:
    """How to start the run: one command, or one per node (any order) plus sbatch for a multi-node plan."""
    cmds = node_launch_commands(plan, run, main_process_ip=main_process_ip)
    if not cmds:
        console.print(f"{lead} Launch with `scaletrain launch {run.path}` (or `bash launch.sh` in the folder, "
                      "wherever it is moved)")
        return
    console.print(f"{lead} {len(cmds)} nodes, the same run directory on each; start every node (in any order):")
    for rank, cmd in enumerate(cmds):
        console.print(f"  node {rank}: {cmd}", markup=False, highlight=False, soft_wrap=True)
    if run.sbatch_sh.exists():
        console.print(f"  or on SLURM: cd {run.path} && sbatch sbatch.sh  (partition/account: see its header)",
                      markup=False,
                      soft_wrap=True)


def check_local_gpus(plan: Plan, run: RunDir) -> None:
    """A GPU plan launched here needs this node's GPUs (counted with NVML); refuse early instead of failing late."""
    s = plan.setup
    try:
        require_local_gpus(str(s.device), s.hardware.gpus_per_node, "the plan")
    except ScaletrainError as e:
        raise ScaletrainError(f"{e}; the run directory is written ({run.path}): launch it on the GPU machine with "
                              f"`scaletrain launch {run.path}`") from None


def run_headless(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    asked = asked_from_args(args)
    request, train = asked.request(), asked.train
    plan = make_plan(request)
    if getattr(args, "save_preset", None):
        save_preset_from_args(console, args, request, train, plan)
        if not getattr(args, "headless", False):
            return 0
    ip = getattr(args, "main_process_ip", None)
    # the prices (a bad prices.yaml, one line) before anything is written
    cost = plan_cost(plan, price_table(plan.setup.hardware.gpu.key, getattr(args, "gpu_price", None)))
    run = write_run_dir(plan, request, train, getattr(args, "run_dir", None),
                        overwrite=bool(getattr(args, "overwrite", False)), main_process_ip=ip,
                        job_specs=getattr(args, "job_spec", None) or ())
    print_plan(plan)
    console.print(cost.line(), markup=False, highlight=False, soft_wrap=True)
    doc_train = run.train
    if doc_train.resume_from is not None:           # recorded as the checkpoint itself, checked when written
        from scaletrain.engine.run.resume_source import resume_for_plan

        console.print(resume_for_plan(plan, doc_train.resume_from).line(), markup=False, highlight=False,
                      soft_wrap=True)
    print_weights(str(doc_train.model_source), [w for w in (weights_warning(doc_train.model_source),) if w],
                  doc_train.dataset, plan.setup.dataset_size if doc_train.dataset else None,
                  note=weights_note(doc_train.model_source))
    print_written(console, run)
    verdict = resource_verdict(plan, train, host_ram_gib=request.host_ram, run_dir=run.path,
                               download=weights_download(doc_train.model_source)[0])
    if not verdict.fits:
        console.print(f"[bold red]{verdict.line()}[/]; nothing launched (exit {EXIT_DOES_NOT_FIT})")
        return EXIT_DOES_NOT_FIT
    if getattr(args, "dry_run", False):
        print_node_commands(console, plan, run, ip, "dry run: nothing launched.")
        return 0
    if plan.setup.hardware.nodes > 1:
        print_node_commands(console, plan, run, ip, "this machine starts node 0, the head node.")
    check_local_gpus(plan, run)
    if getattr(args, "detach", False):
        from scaletrain.engine.launch.detach import start_detached
        from scaletrain.tui.cli.runs import print_detached

        d = start_detached(run.path, main_process_ip=ip)
        print_detached(d.run_dir, d.pid, d.state, notes=d.notes)
        return 0
    return stream_run(run.path, main_process_ip=ip)

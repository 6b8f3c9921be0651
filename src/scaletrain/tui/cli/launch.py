"""`scaletrain launch RUN_DIR [--resume] [--set KEY=VALUE ...] [--detach] [--machine-rank R --main-process-ip IP]
[--script S -- ARGS]`. `--set` re-plans the run with those changes first (engine/launch/relaunch.py, as the monitor's
remedies do: the old files kept under attempts/), then launches it.

Argument parsing only: engine.launch.launcher runs the processes, tui.monitor.stream shows them. User-script mode runs
`accelerate launch --config_file RUN_DIR/accelerate_config.yaml train.py ARGS` under the run's configs.
"""

from __future__ import annotations

import argparse
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.tui.cli.plan_args import stated


def configure_launch(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by scaletrain (holds plan.json)")
    p.add_argument("--resume", action="store_true",
                   help=stated("continue from the newest checkpoint in RUN_DIR", "off: start fresh"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=stated("change the plan first (a plan field or train.KEY, as for a preset; repeatable): "
                               "re-planned on the run's hardware, every file rewritten, the old ones kept under "
                               "attempts/; with --resume it continues from the checkpoint when the change allows "
                               "(a micro-batch split, checkpointing, offload), else it refuses", "no change"))
    p.add_argument("--machine-rank", type=int, metavar="R",
                   help=stated("multi-node: this node's rank (0 on the head node)", "0"))
    p.add_argument("--main-process-ip", metavar="IP",
                   help=stated("multi-node: the head node's address", "the one in RUN_DIR's configs"))
    p.add_argument("--detach", action="store_true",
                   help=stated("start the run in the background and return; it outlives this terminal "
                               "(scaletrain monitor / runs / stop)", "off: progress until it ends, Ctrl-C stops it"))
    p.add_argument("--logs", action="store_true",
                   help=stated("echo every rank's output above the progress bar", "off"))
    p.add_argument("--script", metavar="SCRIPT",
                   help=stated("run your own training script under the run's accelerate/DeepSpeed configs; its "
                               "arguments go after --", "the bundled trainer"))
    p.epilog = "user-script mode: scaletrain launch RUN_DIR --script train.py -- ARGS"
    p.set_defaults(script_args=())
    _split_at_double_dash(p)


def _split_at_double_dash(p: argparse.ArgumentParser) -> None:
    """Everything after `--` is the user script's ARGS. argparse (3.11) cannot hand a `--` tail to a subcommand
    option or positional, so this subparser cuts it off before parsing and stores it as script_args."""
    parse = p.parse_known_args

    def parse_known_args(args: Any = None, namespace: Any = None) -> Any:
        args = list(args if args is not None else [])
        if "--" not in args:
            return parse(args, namespace)
        cut = args.index("--")
        ns, extras = parse(args[:cut], namespace)
        ns.script_args = tuple(args[cut + 1:])
        return ns, extras

    p.parse_known_args = parse_known_args  # type: ignore[method-assign]


def cmd_launch(args: argparse.Namespace) -> int:
    if args.script_args and not args.script:
        raise ScaletrainError("arguments after -- are for a user script; give it with --script train.py")
    if args.machine_rank is not None and args.machine_rank < 0:
        raise ScaletrainError(f"--machine-rank must be ≥ 0 (got {args.machine_rank})")
    resume = args.resume
    if args.set:
        resume = _apply_changes(args)
    if args.detach:
        if args.logs:
            raise ScaletrainError("--logs echoes output in the foreground; a --detach run's output is in RUN_DIR/logs")
        from scaletrain.engine.launch.detach import start_detached
        from scaletrain.tui.cli.runs import print_detached

        d = start_detached(args.run_dir, machine_rank=args.machine_rank, main_process_ip=args.main_process_ip,
                           resume=resume, script=args.script, script_args=tuple(args.script_args))
        print_detached(d.run_dir, d.pid, d.state, notes=d.notes)
        return 0
    from scaletrain.tui.monitor.stream import stream_run

    return stream_run(args.run_dir, machine_rank=args.machine_rank, main_process_ip=args.main_process_ip,
                      resume=resume, script=args.script, script_args=tuple(args.script_args),
                      echo_logs=args.logs)


def _apply_changes(args: argparse.Namespace) -> bool:
    """Re-plan RUN_DIR with the --set changes and rewrite its files; whether the launch resumes. Without --resume
    the run starts at step 0 (a checkpoint the change cannot resume under is kept in the attempt's backup)."""
    if args.script:
        raise ScaletrainError("--set re-plans the bundled trainer's run; a --script run takes its own arguments")
    if args.machine_rank:
        raise ScaletrainError("--set rewrites the run directory on the head node (machine rank 0); the other nodes "
                              "launch the rewritten folder")
    from scaletrain.engine.launch.relaunch import apply_remedy
    from scaletrain.engine.request.presets import override_changes

    applied = apply_remedy(args.run_dir, override_changes(args.set), restart=not args.resume,
                           how_to_restart="launch without --resume to start over")
    print(applied.summary, flush=True)
    return args.resume and applied.resume

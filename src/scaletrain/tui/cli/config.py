"""Subcommands `scaletrain presets [--json]` and `scaletrain config write ...` (registered with the CLI).

`config write` writes a run directory's configs without launching; `--install-default` also copies the accelerate
YAML to accelerate's default config path, after backing up whatever was there. No Textual, no torch.
"""

from __future__ import annotations

import argparse
import json

from scaletrain.engine.request.args import asked_from_args
from scaletrain.tui.cli.plan_args import PLAN_OPTIONS_USAGE, add_plan_options, stated


def cmd_presets(args: argparse.Namespace) -> int:
    from scaletrain.engine.request.presets import list_presets

    presets = list_presets()
    if args.json:
        print(json.dumps([p.to_json() for p in presets], indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    t = Table(title="presets (scaletrain --preset NAME --headless [--dry-run])", show_lines=True)
    t.add_column("name", no_wrap=True, style="bold")
    t.add_column("hardware · model · description", ratio=1)
    for p in presets:
        t.add_row(p.name + ("" if p.source == "bundled" else f"\n({p.source})"),
                  Text(f"{p.hardware} · {p.model}\n") + Text(p.description, style="grey62"))
    Console(highlight=False).print(t)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from rich.console import Console

    from scaletrain.engine.errors import ScaletrainError
    from scaletrain.engine.plan.planner import make_plan
    from scaletrain.engine.run.writers import check_installable, install_accelerate_default, write_run_dir
    from scaletrain.tui.cli.headless import print_written

    if getattr(args, "config_command", None) != "write":
        raise ScaletrainError("`scaletrain config` needs an action: write (see `scaletrain config write --help`)")
    console = Console(highlight=False)
    asked = asked_from_args(args)
    request, train = asked.request(), asked.train
    plan = make_plan(request)
    if args.install_default:
        check_installable()
    run = write_run_dir(plan, request, train, args.run_dir, overwrite=args.overwrite,
                        main_process_ip=args.main_process_ip, job_specs=getattr(args, "job_spec", None) or ())
    print_written(console, run)
    if args.install_default:
        target, backup = install_accelerate_default(run)
        if backup is not None:
            console.print(f"installed {run.accelerate_config.name} as accelerate's default config {target}; "
                          f"the previous one is backed up as {backup}")
        else:
            console.print(f"installed {run.accelerate_config.name} as accelerate's default config {target}")
        if run.ds_config.exists():
            console.print(f"it refers to {run.ds_config}; keep that file where it is")
    else:
        console.print(f"accelerate's default config is untouched; use `accelerate launch --config_file "
                      f"{run.accelerate_config} ...`, or pass --install-default")
    return 0


def configure_presets(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help=stated("print the presets as a JSON list", "off: a table"))


def configure_config(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="config_command", parser_class=type(p))
    w = sub.add_parser("write", help="write plan.json, accelerate/DeepSpeed configs and launch.sh (no launch)",
                       description="write plan.json, accelerate/DeepSpeed configs and launch.sh (no launch)",
                       usage=f"scaletrain config write {PLAN_OPTIONS_USAGE} [--run-dir DIR] [--install-default] ...",
                       formatter_class=p.formatter_class)
    add_plan_options(w)
    g = w.add_argument_group("output")
    g.add_argument("--run-dir", metavar="DIR", help=stated("where to write", "runs/<date>-<name>"))
    g.add_argument("--overwrite", action="store_true",
                   help=stated("write into a run directory holding a different plan (the old files are moved aside)",
                               "off"))
    g.add_argument("--main-process-ip", metavar="IP", help=stated("multi-node: the head node's address",
                                                                  "set at launch"))
    g.add_argument("--install-default", action="store_true",
                   help=stated("also make the accelerate YAML accelerate's default config (an existing one is "
                               "backed up)", "off"))

"""The `scaletrain` argument parser: one explicit table of subcommands, and the top level (the wizard, or a
headless replay). Parsing only: each command module runs its command."""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import dataclass
from typing import Callable, Sequence

from scaletrain.engine.errors import ScaletrainError
from scaletrain.tui.cli import chat, completion, config, diagnose, env, export, launch, monitor, plan, runs, validate
from scaletrain.tui.cli.plan_args import PLAN_OPTIONS_USAGE, add_plan_options, stated


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    usage: str | None = None             # None: argparse's; commands with the plan options say "[plan options]"


COMMANDS = (
    Command("plan", "predict per-GPU memory, host RAM, disk and time for a training setup", plan.configure_plan,
            plan.cmd_plan, f"scaletrain plan {PLAN_OPTIONS_USAGE}\n                      [--json] [--alternatives] "
                           "[--table {batch,gpus}]\n       scaletrain plan --keys [--json]"),
    Command("gpus", "detect local GPUs with NVML", plan.configure_json, plan.cmd_gpus),
    Command("models", "list the bundled model catalog", plan.configure_json, plan.cmd_models),
    Command("presets", "list the bundled and saved presets", config.configure_presets, config.cmd_presets),
    Command("config", "write accelerate/DeepSpeed configs for a plan (config write ...)", config.configure_config,
            config.cmd_config),
    Command("launch", "run a written run directory (accelerate launch), with live progress", launch.configure_launch,
            launch.cmd_launch),
    Command("runs", "list the runs launched on this machine: state, step, loss, ETA, peak memory, folder",
            runs.configure_runs, runs.cmd_runs),
    Command("stop", "stop a run (every rank) and wait for its final status", runs.configure_stop, runs.cmd_stop),
    Command("diagnose", "classify a failed run from its logs and suggest fixes with predicted numbers",
            diagnose.configure_diagnose, diagnose.cmd_diagnose),
    Command("monitor", "watch a run: per-GPU panels, job progress, failure doctor", monitor.configure_monitor,
            monitor.cmd_monitor),
    Command("export", "write a checkpoint as a model folder transformers loads, or a PEFT adapter (--merge: merged)",
            export.configure_export, export.cmd_export),
    Command("chat", "generate with a run's exported model (one-shot with --prompt, a conversation on a terminal)",
            chat.configure_chat, chat.cmd_chat),
    Command("validate", "run the planned configuration briefly and compare predicted with measured",
            validate.configure_validate, validate.cmd_validate,
            f"scaletrain validate {PLAN_OPTIONS_USAGE}\n                          [--steps N] [--budget-seconds S] "
            "[--save] [--json]"),
    Command("env", "versions, GPUs, driver, CUDA, configs and environment for a bug report", env.configure_env,
            env.cmd_env),
    Command("completion", "print a shell completion script (bash, zsh or fish)", completion.configure_completion,
            lambda args: completion.print_completion(args.shell, build_parser())),
)

TOP_USAGE = ("scaletrain [-h] [--version] [plan options] [--preset NAME]\n"
             "                  [--set KEY=VALUE ...] [--run-dir DIR] [--save-preset NAME]\n"
             "                  [--plain | --headless [--dry-run | --detach]] ...\n"
             "       scaletrain COMMAND [options]   (scaletrain COMMAND --help)")

EXAMPLES = """\
examples:
  # the wizard: hardware → model → batch → plan → write & launch
  scaletrain
  # a plan for hardware you name; its alternatives; every preset / --set key
  scaletrain plan --model Qwen/Qwen3-4B --gpus 8xRTX4090 --effective-batch 128 \\
      --seq-len 2048
  scaletrain plan --model meta-llama/Llama-3.1-70B --gpus 8xRTX4090 \\
      --host-ram 256
  scaletrain plan --preset 4090x8 --alternatives
  scaletrain plan --keys
  # plan, write the run directory, launch and stream progress (--detach: in the
  # background; scaletrain runs, monitor, stop)
  scaletrain --preset cpu-tiny --headless
  scaletrain --preset cpu-tiny --headless --detach
  # for a bug report; tab completion (zsh, fish: scaletrain completion --help)
  scaletrain env --json
  eval "$(scaletrain completion bash)"

exit codes: 0 ok · 1 a scaletrain bug · 2 bad input · 3 the plan does not fit
            (GPU memory, host RAM or disk) · 130 interrupted; launch and the
            headless path: the training's own exit code"""



class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line and exit 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ScaletrainError(f"{message} (see `{self.prog} --help`)")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """argparse's, but a word no parser took points at its command's help (argparse reports it from the top:
        `scaletrain diagnose x.log -7` said "see `scaletrain --help`", whose text lists no diagnose flag)."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            words = [w for w in (getattr(ns, "command", None), getattr(ns, "config_command", None)) if w]
            where = " ".join([self.prog, *words])
            raise ScaletrainError(f"unrecognized arguments: {' '.join(extras)} (see `{where} --help`)")
        return ns


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="scaletrain", usage=TOP_USAGE, epilog=EXAMPLES, formatter_class=_Formatter,
                description="Plan, launch, watch and fix multi-GPU LLM fine-tuning.\nWithout a command: the wizard "
                            "(or --plain questions, or a --headless replay)\nover the plan options below.")
    p.add_argument("--version", action=_VersionAction, help="print scaletrain's version and exit")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, title="commands", metavar="COMMAND",
                           prog="scaletrain")      # each command's usage: "scaletrain diagnose …"
    for c in COMMANDS:
        sp = sub.add_parser(c.name, help=c.help, description=textwrap.fill(c.help, 79), usage=c.usage,
                            formatter_class=_Formatter)
        c.configure(sp)
        sp.set_defaults(_run=c.run)
    # top level (no subcommand): the wizard, or a headless preset replay
    add_plan_options(p)
    g = p.add_argument_group("wizard and headless replay")
    g.add_argument("--headless", action="store_true",
                   help=stated("no TUI: plan, write, launch, stream progress; exit 3 if the plan does not fit", "off"))
    g.add_argument("--dry-run", action="store_true", help=stated("write the run directory but do not launch", "off"))
    g.add_argument("--detach", action="store_true",
                   help=stated("with --headless: start the run in the background and return (scaletrain monitor, "
                               "runs, stop)", "off: show progress until it ends"))
    g.add_argument("--run-dir", metavar="DIR", help=stated("where to write plan.json, configs, logs",
                                                           "runs/<date>-<name>"))
    g.add_argument("--plain", action="store_true",
                   help=stated("ask the wizard's questions without a full-screen app", "off"))
    g.add_argument("--main-process-ip", metavar="IP", help=stated("multi-node: the head node's address",
                                                                  "set at launch"))
    g.add_argument("--save-preset", metavar="NAME", help=stated("save the resulting plan as a preset", "none"))
    g.add_argument("--overwrite", action="store_true",
                   help=stated("write into a run directory holding a different plan (the old files are moved "
                               "aside)", "off"))
    return p


class _VersionAction(argparse._VersionAction):
    """argparse's version action, but the version is looked up only when asked (not by every other command)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser.exit(message=f"scaletrain {package_version()}\n")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples epilog's lines; help columns start at 32 so the long flags keep one line."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


def package_version() -> str:
    """The installed scaletrain's version (its dist-info, engine/dist_versions.py), or the source tree's."""
    from scaletrain.engine.dist_versions import installed_version

    return installed_version("scaletrain") or "0.1.0 (source tree)"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`scaletrain ARGV` parsed (the wizard, the pilot tests and the bench take the Namespace)."""
    return build_parser().parse_args(list(argv) if argv is not None else None)

"""The `scaletrain` argument parser: one explicit table of subcommands, and the top level (the wizard, or a
headless replay). Parsing only: each command module runs its command."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Sequence

from scaletrain.engine.errors import ScaletrainError
from scaletrain.tui.cli import config, diagnose, export, launch, monitor, plan, validate
from scaletrain.tui.cli.plan_args import add_plan_options


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS = (
    Command("plan", "predict per-GPU memory and time for a training setup", plan.configure_plan, plan.cmd_plan),
    Command("gpus", "detect local GPUs with NVML", plan.configure_json, plan.cmd_gpus),
    Command("models", "list the bundled model catalog", plan.configure_json, plan.cmd_models),
    Command("presets", "list the bundled and saved presets", config.configure_presets, config.cmd_presets),
    Command("config", "write accelerate/DeepSpeed configs for a plan (config write ...)", config.configure_config,
            config.cmd_config),
    Command("launch", "run a written run directory (accelerate launch), with live progress", launch.configure_launch,
            launch.cmd_launch),
    Command("diagnose", "classify a failed run from its logs and suggest fixes with predicted numbers",
            diagnose.configure_diagnose, diagnose.cmd_diagnose),
    Command("monitor", "watch a run: per-GPU panels, job progress, failure doctor", monitor.configure_monitor,
            monitor.cmd_monitor),
    Command("export", "write a checkpoint as a model folder transformers loads, or a PEFT adapter (--merge: merged)",
            export.configure_export, export.cmd_export),
    Command("validate", "run the planned configuration briefly and compare predicted with measured",
            validate.configure_validate, validate.cmd_validate),
)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line and exit 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ScaletrainError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="scaletrain", description="Plan, launch, watch and fix multi-GPU LLM fine-tuning.")
    p.add_argument("--version", action="version", version="scaletrain 0.1.0")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    for c in COMMANDS:
        sp = sub.add_parser(c.name, help=c.help, description=c.help)
        c.configure(sp)
        sp.set_defaults(_run=c.run)
    # top level (no subcommand): the wizard, or a headless preset replay
    add_plan_options(p)
    p.add_argument("--headless", action="store_true", help="no TUI: plan, write, launch, stream progress")
    p.add_argument("--dry-run", action="store_true", help="write the run directory but do not launch")
    p.add_argument("--run-dir", help="where to write plan.json, configs, logs (default runs/<date>-<name>)")
    p.add_argument("--plain", action="store_true", help="ask the wizard's questions without a full-screen app")
    p.add_argument("--main-process-ip", help="multi-node: the head node's address")
    p.add_argument("--save-preset", metavar="NAME", help="save the resulting plan as a preset")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a run directory holding a different plan (the old files are moved aside)")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`scaletrain ARGV` parsed (the wizard, the pilot tests and the bench take the Namespace)."""
    return build_parser().parse_args(list(argv) if argv is not None else None)

"""The plan options every front end takes (`scaletrain plan`, the top level, `config write`, `validate`, the wizard
and the plain prompts), as argparse flags derived from the engine's field table (`engine/request/fields.py`): each
flag's help is the field's meaning and its default (`engine/request/keys.py`), in argument groups by what they set.
`engine/request/args.py` turns the parsed flags into what the user asks."""

from __future__ import annotations

import argparse
from typing import Any

from scaletrain.engine.request.fields import FIELDS, PlanField
from scaletrain.engine.request.keys import flag_help

# The usage line of a command that takes the plan options: the options themselves are listed in groups below it.
PLAN_OPTIONS_USAGE = "[plan options] [--preset NAME] [--set KEY=VALUE ...]"


def stated(meaning: str, default: str) -> str:
    """A flag's help with its default said: 'print JSON (default: off)'."""
    return f"{meaning} (default: {default})"


def add_plan_options(p: argparse.ArgumentParser) -> None:
    groups: dict[str, Any] = {}
    for f in FIELDS:
        if f.group is None:
            continue
        if f.group not in groups:
            groups[f.group] = p.add_argument_group(f"plan options: {f.group}")
        _add(groups[f.group], f)
    g = p.add_argument_group("plan options: presets")
    g.add_argument("--preset", metavar="NAME",
                   help=stated("start from a preset (scaletrain presets); flags override its fields", "none"))
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=stated("override a preset field, repeatable (keys: scaletrain plan --keys)", "none"))


def _explained(parse: Any) -> Any:
    """A PlanField's parse function as argparse's type, its ValueError's words kept (argparse would say only
    "invalid parse_columns value"); int and float keep argparse's own wording."""
    if parse is None or parse in (int, float):
        return parse

    def typed(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e) or f"invalid value {text!r}") from None

    typed.__name__ = parse.__name__
    return typed


def _add(g: Any, f: PlanField) -> None:
    if f.kind == "flag":                      # --X / --no-X, unset (None) unless one is given
        ck = g.add_mutually_exclusive_group()
        ck.add_argument(f.flag, dest=f.name, action="store_true", default=None, help=flag_help(f))
        ck.add_argument("--no-" + f.flag[2:], dest=f.name, action="store_false",
                        help=stated(f"turn {f.flag} off", "the planner chooses"))
        return
    kw: dict[str, Any] = {"action": "append", "default": None} if f.kind == "append" else {}
    for key, value in (("type", _explained(f.parse)), ("choices", f.choices), ("metavar", f.metavar)):
        if value is not None:
            kw[key] = value
    g.add_argument(f.flag, help=flag_help(f), **kw)

"""The plan options every front end takes (`scaletrain plan`, the top level, `config write`, `validate`, the wizard
and the plain prompts), as argparse flags derived from the engine's field table (`engine/request/fields.py`);
`engine/request/args.py` turns the parsed flags into what the user asks."""

from __future__ import annotations

import argparse
from typing import Any

from scaletrain.engine.request.fields import FIELDS, PlanField


def add_plan_options(p: argparse.ArgumentParser) -> None:
    groups: dict[str, Any] = {}
    for f in FIELDS:
        if f.group is None:
            continue
        if f.group not in groups:
            groups[f.group] = p.add_argument_group(f.group)
        _add(groups[f.group], f)
    p.add_argument("--preset", help="start from a preset (scaletrain presets); flags override its fields")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset field")


def _add(g: Any, f: PlanField) -> None:
    if f.kind == "flag":                      # --X / --no-X, unset (None) unless one is given
        ck = g.add_mutually_exclusive_group()
        ck.add_argument(f.flag, dest=f.name, action="store_true", default=None)
        ck.add_argument("--no-" + f.flag[2:], dest=f.name, action="store_false")
        return
    kw: dict[str, Any] = {"action": "append", "default": None} if f.kind == "append" else {}
    for key, value in (("type", f.parse), ("choices", f.choices), ("metavar", f.metavar), ("help", f.help)):
        if value is not None:
            kw[key] = value
    g.add_argument(f.flag, **kw)

"""`scaletrain plan`, `scaletrain gpus` and `scaletrain models`: the engine's answers, as JSON or rich tables."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from scaletrain.engine.errors import EXIT_DOES_NOT_FIT
from scaletrain.engine.request.args import asked_from_args
from scaletrain.tui.cli.plan_args import add_plan_options, stated

if TYPE_CHECKING:
    from scaletrain.engine.run.resources import ResourceVerdict


def cmd_plan(args: argparse.Namespace) -> int:
    """The plan, as text or JSON; exit 0 when it fits every resource it knows, EXIT_DOES_NOT_FIT (3) when not."""
    from scaletrain.engine.plan.cost import plan_cost, price_table
    from scaletrain.engine.plan.planner import make_plan
    from scaletrain.engine.run.disk import disk_need
    from scaletrain.engine.request.weights import weights_download
    from scaletrain.engine.run.resources import resource_verdict
    from scaletrain.engine.run.resume_source import resume_for_plan

    if getattr(args, "keys", False):
        return print_keys(args.json)
    asked = asked_from_args(args)
    request = asked.request()
    plan = make_plan(request)
    weights = asked.weights(request)
    verdict = resource_verdict(plan, asked.train, host_ram_gib=request.host_ram,
                               download=weights_download(weights["source"])[0])
    code = 0 if verdict.fits else EXIT_DOES_NOT_FIT
    data = asked.data
    prices = price_table(plan.setup.hardware.gpu.key, getattr(args, "gpu_price", None))
    cost = plan_cost(plan, prices)
    resume = resume_for_plan(plan, asked.train.resume_from)      # --resume-from: checked against this plan
    if getattr(args, "alternatives", False) or getattr(args, "table", None) or getattr(args, "sort", None):
        from scaletrain.engine.plan.tables import with_tables
        plan = with_tables(plan, alternatives=getattr(args, "alternatives", False), table=getattr(args, "table", None),
                           prices=prices, sort=getattr(args, "sort", None))
    if args.json:
        out = plan.to_json()
        out["weights"] = weights
        prof = asked.profile.data if asked.profile is not None else None
        rows = prof["records"] if prof and "records" in prof else request.dataset_size
        out["data"] = {"spec": data, "rows": rows,
                       "profile": prof} if data else None
        out["disk"] = disk_need(plan, asked.train).to_json()
        out["resources"] = verdict.to_json()
        out["cost"] = cost.to_json()
        out["resume"] = resume.to_json() if resume is not None else None
        print(json.dumps(out, indent=2))
        return code
    from scaletrain.tui.views.render import print_plan, print_weights
    print_plan(plan, alternatives=getattr(args, "alternatives", False), table=getattr(args, "table", None))
    print(f"disk: {disk_need(plan, asked.train).text()}")
    print(cost.line())
    if resume is not None:
        print(resume.line())
    rows = asked.profile.data.get("records", request.dataset_size) if asked.profile is not None else request.dataset_size
    print_weights(weights["source"], [w for w in (weights["warning"], weights["problem"]) if w],
                  data, rows, note=weights["note"])
    for line in (asked.profile.lines() if asked.profile is not None else ()):
        print(f"  {line}")
    for example in (asked.profile.data.get("examples", ()) if asked.profile is not None else ()):
        print("  record as trained («trained tokens»): " + " ".join(example.split())[:300])
    print_verdict(verdict)
    return code


def print_verdict(verdict: ResourceVerdict) -> None:
    """Each resource's need against what there is, then the one-line verdict naming the binding resource."""
    from rich.console import Console
    from rich.markup import escape

    c = Console(highlight=False)
    for check in verdict.checks:
        c.print(f"  {check.line()}", markup=False, soft_wrap=True)
    c.print(f"[bold {'green' if verdict.fits else 'red'}]verdict:[/] {escape(verdict.line())}", soft_wrap=True)


def print_keys(as_json: bool) -> int:
    """Every key a preset or --set takes, with its meaning and default (engine/request/keys.py)."""
    from scaletrain.engine.request.keys import plan_keys

    keys = plan_keys()
    if as_json:
        print(json.dumps([k.to_json() for k in keys], indent=2))
        return 0
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(title="preset and --set keys (--set KEY=VALUE, request.KEY or train.KEY; in a preset: request:/train:)",
              box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    t.add_column("key (flag)", no_wrap=True)
    t.add_column("meaning", ratio=3)
    t.add_column("default", ratio=2)
    for k in keys:
        key = f"{k.section}.{k.key}" if k.section else k.key
        t.add_row(key + (f"\n  {k.flag}" if k.flag else ""), k.meaning, k.default)
    Console(highlight=False).print(t)
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    from scaletrain.engine.devices.nvml import detect

    res = detect()
    if args.json:
        print(json.dumps(res.to_json(), indent=2))
        return 0
    from scaletrain.tui.views.render import print_detection
    print_detection(res)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from scaletrain.engine.catalog.architectures import catalog_ids, load_model

    rows = []
    for mid in catalog_ids():
        m = load_model(mid)
        rows.append({"id": mid, "model_type": m.model_type, "params": m.params, "layers": m.num_layers,
                     "hidden_size": m.hidden_size, "vocab_size": m.vocab_size, "tied": m.tie_embeddings})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from scaletrain.tui.views.render import print_models
    print_models(rows)
    return 0


def configure_plan(p: argparse.ArgumentParser) -> None:
    add_plan_options(p)
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help=stated("print the plan as one JSON object", "off: text"))
    out.add_argument("--alternatives", action="store_true",
                     help=stated("show the planner's ranked alternatives", "off"))
    out.add_argument("--table", choices=["batch", "gpus"],
                     help=stated("micro batch vs memory, or GPU kinds × counts with time and cost", "none"))
    out.add_argument("--sort", choices=["time", "cost"],
                     help=stated("--table gpus: fastest or cheapest first (the rows that fit)", "catalog order"))
    out.add_argument("--keys", action="store_true",
                     help=stated("list every preset / --set key with its meaning and default, and exit", "off"))


def configure_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help=stated("print JSON for scripts", "off: a table"))

"""`scaletrain plan`, `scaletrain gpus` and `scaletrain models`: the engine's answers, as JSON or rich tables."""

from __future__ import annotations

import argparse
import json

from scaletrain.engine.request.args import asked_from_args
from scaletrain.tui.cli.plan_args import add_plan_options


def cmd_plan(args: argparse.Namespace) -> int:
    from scaletrain.engine.plan.planner import make_plan
    from scaletrain.engine.run.disk import disk_need

    asked = asked_from_args(args)
    request = asked.request()
    plan = make_plan(request)
    weights = asked.weights(request)
    data = asked.data
    if getattr(args, "alternatives", False) or getattr(args, "table", None):
        from scaletrain.engine.plan.tables import with_tables
        plan = with_tables(plan, alternatives=getattr(args, "alternatives", False), table=getattr(args, "table", None))
    if args.json:
        out = plan.to_json()
        out["weights"] = weights
        prof = asked.profile.data if asked.profile is not None else None
        rows = prof["records"] if prof and "records" in prof else request.dataset_size
        out["data"] = {"spec": data, "rows": rows,
                       "profile": prof} if data else None
        out["disk"] = disk_need(plan, asked.train).to_json()
        print(json.dumps(out, indent=2))
        return 0
    from scaletrain.tui.views.render import print_plan, print_weights
    print_plan(plan, alternatives=getattr(args, "alternatives", False), table=getattr(args, "table", None))
    print(f"disk: {disk_need(plan, asked.train).text()}")
    rows = asked.profile.data.get("records", request.dataset_size) if asked.profile is not None else request.dataset_size
    print_weights(weights["source"], [w for w in (weights["warning"], weights["problem"]) if w],
                  data, rows, note=weights["note"])
    for line in (asked.profile.lines() if asked.profile is not None else ()):
        print(f"  {line}")
    for example in (asked.profile.data.get("examples", ()) if asked.profile is not None else ()):
        print("  record as trained («trained tokens»): " + " ".join(example.split())[:300])
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
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--alternatives", action="store_true", help="show the planner's ranked alternatives")
    p.add_argument("--table", choices=["batch", "gpus"], help="micro batch vs memory, or GPU kinds × counts")


def configure_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")

"""`scaletrain` entry point: argument parsing and dispatch only; the engine computes, views render.

Nothing imported at module level may pull in Textual or torch: `scaletrain plan` must answer in well under a
second. The wizard, the trainer and the monitor are imported lazily by the subcommands that need them.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.vocabulary import Attention, Method, Offload, Optimizer, Precision, Strategy


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line and exit 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ScaletrainError(f"{message} (see `{self.prog} --help`)")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _resident(text: str) -> tuple[str, int]:
    """--resident MODEL[:BITS] (bits 16, 8 or 4; default 16)."""
    model, _, bits = text.rpartition(":") if text.rsplit(":", 1)[-1] in ("16", "8", "4") else (text, "", "16")
    return (model, int(bits))


def _inter_node(text: str) -> float:
    """--inter-node-gbps 400 or --inter-node-gbps ndr (engine.hardware.INTER_NODE_LINKS)."""
    from scaletrain.engine.catalog.hardware import inter_node_gbit_s
    return inter_node_gbit_s(text)


def add_plan_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to train")
    g.add_argument("--model", help="catalog id (scaletrain models), config.json path or folder, or HF cache id")
    g.add_argument("--method", choices=Method.values())
    g.add_argument("--lora-rank", type=int)
    g.add_argument("--lora-targets", type=_csv, help="comma list, default all block linears")
    g.add_argument("--base-bits", type=int, choices=[4, 8, 16], help="frozen base precision for lora/qlora")
    g.add_argument("--resident", action="append", type=_resident, default=None, metavar="MODEL[:BITS]",
                   help="an extra inference-only model kept on every GPU (reference policy, evaluator)")
    g = p.add_argument_group("hardware")
    g.add_argument("--gpus", help="auto | 4xH200 | 8xRTX4090 | 2x8xH100 (nodes × GPUs per node)")
    g.add_argument("--nodes", type=int)
    g.add_argument("--inter-node-gbps", type=_inter_node, metavar="GBPS|LINK",
                   help="inter-node link per node, Gb/s or a name: edr, hdr, ndr, xdr, 10gbe … 400gbe "
                        "(default 200, one HDR InfiniBand port)")
    g = p.add_argument_group("how")
    g.add_argument("--strategy", choices=Strategy.values())
    g.add_argument("--offload", choices=Offload.values())
    g.add_argument("--precision", choices=Precision.values())
    g.add_argument("--optimizer", choices=Optimizer.values())
    g.add_argument("--attn", choices=Attention.values())
    ck = g.add_mutually_exclusive_group()
    ck.add_argument("--grad-ckpt", dest="grad_ckpt", action="store_true", default=None)
    ck.add_argument("--no-grad-ckpt", dest="grad_ckpt", action="store_false")
    g.add_argument("--headroom", type=float, help="safety fraction of card memory kept free (default 0.10)")
    g = p.add_argument_group("batch and data")
    g.add_argument("--micro-batch", type=int)
    g.add_argument("--grad-accum", type=int)
    g.add_argument("--effective-batch", type=int)
    g.add_argument("--seq-len", type=int)
    g.add_argument("--dataset-size", type=int, help="samples")
    g.add_argument("--epochs", type=float)
    g.add_argument("--tokens-per-sample", type=int)
    g.add_argument("--base-lr", type=float)
    g.add_argument("--base-batch", type=int)
    p.add_argument("--preset", help="start from a preset (scaletrain presets); flags override its fields")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset field")


_REQUEST_FLAGS = (
    "model", "method", "lora_rank", "lora_targets", "base_bits", "gpus", "nodes", "inter_node_gbps", "strategy",
    "offload", "precision", "optimizer", "attn", "grad_ckpt", "headroom", "micro_batch", "grad_accum",
    "effective_batch", "seq_len", "dataset_size", "epochs", "tokens_per_sample", "base_lr", "base_batch",
)


def request_from_args(args: argparse.Namespace) -> Any:
    """Build the PlanRequest: a preset's fields (if any), then --set overrides, then explicit flags."""
    from scaletrain.engine.plan.request import PlanRequest

    fields: dict[str, Any] = {}
    if getattr(args, "preset", None):
        from scaletrain.engine.plan.presets import load_preset, apply_overrides
        preset = load_preset(args.preset)
        fields.update(preset.request_fields())
        fields = apply_overrides(fields, args.set)
    elif getattr(args, "set", None):
        raise ScaletrainError("--set overrides preset fields; give --preset NAME too")
    for name in _REQUEST_FLAGS:
        v = getattr(args, name, None)
        if v is not None:
            fields[name] = v
    if getattr(args, "resident", None):
        fields["residents"] = tuple(args.resident)
    if not fields.get("model"):
        raise ScaletrainError("--model is required (a catalog id, a config.json, or --preset NAME)")
    fields.setdefault("gpus", "auto")
    return PlanRequest(**fields)


# ---- subcommands ----------------------------------------------------------------------------------------------
def cmd_plan(args: argparse.Namespace) -> int:
    from scaletrain.engine.plan.planner import make_plan

    plan = make_plan(request_from_args(args))
    if getattr(args, "alternatives", False) or getattr(args, "table", None):
        from scaletrain.engine.plan.tables import with_tables
        plan = with_tables(plan, alternatives=getattr(args, "alternatives", False), table=getattr(args, "table", None))
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
        return 0
    from scaletrain.tui.views.render import print_plan
    print_plan(plan, alternatives=getattr(args, "alternatives", False), table=getattr(args, "table", None))
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


SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def register(name: str, help_text: str, configure: Callable[[argparse.ArgumentParser], None],
             run: Callable[[argparse.Namespace], int]) -> None:
    """Other modules add subcommands here (presets, launch, monitor, diagnose, validate, config)."""
    SUBCOMMANDS[name] = (help_text, configure, run)


def _configure_plan(p: argparse.ArgumentParser) -> None:
    add_plan_options(p)
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--alternatives", action="store_true", help="show the planner's ranked alternatives")
    p.add_argument("--table", choices=["batch", "gpus"], help="micro batch vs memory, or GPU kinds × counts")


register("plan", "predict per-GPU memory and time for a training setup", _configure_plan, cmd_plan)
register("gpus", "detect local GPUs with NVML", lambda p: p.add_argument("--json", action="store_true"), cmd_gpus)
register("models", "list the bundled model catalog", lambda p: p.add_argument("--json", action="store_true"),
         cmd_models)


def _load_plugins() -> None:
    """Subcommand modules that exist register themselves; missing ones are simply absent."""
    import importlib

    for mod in ("scaletrain.tui.cli.config", "scaletrain.tui.cli.launch", "scaletrain.tui.cli.doctor",
                "scaletrain.tui.cli.validate"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


def build_parser() -> argparse.ArgumentParser:
    _load_plugins()
    p = _Parser(prog="scaletrain", description="Plan, launch, watch and fix multi-GPU LLM fine-tuning.")
    p.add_argument("--version", action="version", version="scaletrain 0.1.0")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    for name, (help_text, configure, run) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        configure(sp)
        sp.set_defaults(_run=run)
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


def _run_top_level(args: argparse.Namespace) -> int:
    if args.headless or args.save_preset:
        from scaletrain.tui.cli.headless import run_headless
        return run_headless(args)
    if args.plain:
        from scaletrain.tui.wizard.plain import run_plain
        return run_plain(args)
    from scaletrain.tui.wizard.app import run_wizard
    return run_wizard(args)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        run = getattr(args, "_run", None)
        code = run(args) if run is not None else _run_top_level(args)
    except ScaletrainError as e:
        print(f"scaletrain: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("scaletrain: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("scaletrain"):
            print(f"scaletrain: error: this command is not available in this build ({e.name})", file=sys.stderr)
            return 2
        print(f"scaletrain: error: missing dependency {e.name!r}; install scaletrain[train]", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())

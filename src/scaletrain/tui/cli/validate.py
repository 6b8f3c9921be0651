"""`scaletrain validate [plan options | --preset NAME] [--steps N] [--budget-seconds S] [--save] [--json]`: predicted
vs measured. The run keeps its logs and metrics and no checkpoint weights."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.args import asked_from_args
from scaletrain.tui.cli.plan_args import add_plan_options, stated


def configure_validate(p: argparse.ArgumentParser) -> None:
    add_plan_options(p)
    g = p.add_argument_group("validation")
    g.add_argument("--steps", type=int, default=20, metavar="N",
                   help=stated("training steps to run (the first quarter is warm-up)", "20"))
    g.add_argument("--save", action="store_true",
                   help=stated("store a calibration profile for this GPU kind and stack", "off"))
    g.add_argument("--run-dir", metavar="DIR", help=stated("where the validation run goes", "a temporary directory"))
    g.add_argument("--budget-seconds", type=float, metavar="S",
                   help=stated("stop the run (every rank) if it has not finished after S seconds", "no limit"))
    g.add_argument("--json", action="store_true", help=stated("print the comparison as one JSON object", "off"))


def cmd_validate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from scaletrain.engine.estimate.calibration import save_calibration
    from scaletrain.engine.units import fmt_bytes, fmt_seconds
    from scaletrain.measure.validate import check_steps, derive_calibration, validate

    console = Console(highlight=False, stderr=args.json)
    budget = args.budget_seconds
    if budget is not None and not (math.isfinite(budget) and budget > 0):    # before any folder is made
        raise ScaletrainError(f"--budget-seconds must be a positive finite number of seconds (got {budget!r})")
    asked = asked_from_args(args)
    request, train = asked.request(), asked.train
    check_steps(args.steps)                      # before the first line is printed
    console.print(f"validating {request.model} for {args.steps} steps with the bundled trainer …")
    r = validate(request, train, steps=args.steps, run_dir=args.run_dir, budget_seconds=args.budget_seconds)
    saved = None
    if args.save:
        cal = derive_calibration(r, "scaletrain " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
        saved = save_calibration(cal)
    if args.json:
        out = r.to_json()
        out["calibration_path"] = str(saved) if saved else None
        print(json.dumps(out, indent=2))
        return 0

    def err(e: float | None) -> str:
        return "n/a" if e is None else f"{100 * e:+.1f}%"

    t = Table(title=f"predicted vs measured — {r.plan.setup.hardware.describe()}, {r.steps} steps")
    for col in ("", "predicted", "measured", "error"):
        t.add_column(col, justify="right" if col else "left")
    t.add_row("allocated peak / process", fmt_bytes(r.predicted_allocated_bytes),
              fmt_bytes(r.measured_allocated_bytes) if r.measured_allocated_bytes else "n/a", err(r.memory_error))
    if r.predicted_reserved_bytes is not None:
        meas = fmt_bytes(r.measured_reserved_bytes) if r.measured_reserved_bytes else "n/a"
        t.add_row("reserved + context / GPU", fmt_bytes(r.predicted_reserved_bytes), meas, "")
    t.add_row("step time (after warm-up)",
              fmt_seconds(r.predicted_step_seconds) if r.predicted_step_seconds is not None else "n/a",
              fmt_seconds(r.measured_step_seconds) if r.measured_step_seconds is not None else "n/a",
              err(r.time_error))
    console.print(t)
    console.print(f"memory: {r.memory_source}")
    for note in r.notes:
        console.print(f"note: {note}")
    console.print(f"run directory: {r.run_dir} (logs and metrics; no checkpoint weights kept)")
    if saved:
        console.print(f"calibration saved to {saved}; later plans on {r.plan.setup.hardware.gpu.key} use it")
    return 0

"""`scaletrain export RUN_DIR [--step N] [--merge] [--out DIR] [--dtype bf16|fp16|fp32] [--json]`: a checkpoint as a
folder transformers loads (full fine-tuning) or a PEFT adapter (LoRA/QLoRA), merged into its base on request
(trainer/export.py). Torch is imported when the command runs."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys

from scaletrain.engine.vocabulary import Precision
from scaletrain.tui.cli.plan_args import stated


def configure_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with at least one complete checkpoint")
    p.add_argument("--step", type=int, metavar="N", help=stated("the checkpoint's step", "the newest complete one"))
    p.add_argument("--merge", action="store_true",
                   help=stated("LoRA/QLoRA: also write the base with the adapter merged", "off"))
    p.add_argument("--out", metavar="DIR", help=stated("where the export goes", "RUN_DIR/export/step-N"))
    p.add_argument("--dtype", choices=Precision.values(),
                   help=stated("the exported weights' dtype", "the run's training precision"))
    p.add_argument("--json", action="store_true", help=stated("print the export as one JSON object", "off"))


def cmd_export(args: argparse.Namespace) -> int:
    from scaletrain.engine.errors import ScaletrainError
    from scaletrain.trainer.export import export_run

    if args.step is not None and args.step < 1:
        raise ScaletrainError(f"--step must be a checkpoint's step, a whole number ≥ 1 (got {args.step})")
    done = already_exported(args)
    if done is not None:
        if args.json:
            print(json.dumps({"path": str(done.path), "step": done.step, "kind": done.kind, "dtype": done.dtype,
                              "merged": str(done.merged) if done.merged else None, "already_exported": True},
                             indent=2))
        else:
            print(f"step {done.step} is already exported: {done.path} ({done.check_text()}); load it with "
                  f"AutoModelForCausalLM.from_pretrained({str(done.loadable)!r}) or try it: scaletrain chat "
                  f"{args.run_dir}")
        return 0
    # DeepSpeed's and transformers' prints and warnings are not the answer: kept aside, shown on stderr after a
    # success, dropped after a refusal (whose one line is the answer)
    noise = io.StringIO()
    with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
        e = export_run(args.run_dir, step=args.step, out=args.out, merge=args.merge, dtype=args.dtype)
    sys.stderr.write(noise.getvalue())
    if args.json:
        print(json.dumps(e.to_json(), indent=2))
        return 0
    what = "PEFT adapter in adapter/" + (", merged model in merged/" if e.merged else "") if e.kind == "adapter" \
        else "model (transformers from_pretrained)"
    print(f"exported step {e.step} ({e.dtype}): {e.path} — {what}")
    return 0


def already_exported(args: argparse.Namespace):
    """The default export folder of the asked step (the newest checkpoint's when none), when it already holds an
    export that answers the request (same dtype when one is asked, merged when --merge); None otherwise."""
    from scaletrain.engine.run.exports import read_export
    from scaletrain.engine.run.layout import RunDir, checkpoint_step

    if args.out is not None:
        return None
    run = RunDir(args.run_dir)
    step = args.step
    if step is None:
        newest = run.newest_checkpoint()
        step = checkpoint_step(newest) if newest is not None else None
    if step is None:
        return None
    e = read_export(run.export_dir(step))
    if e is None or (args.dtype is not None and e.dtype != args.dtype) or (args.merge and e.merged is None):
        return None
    return e

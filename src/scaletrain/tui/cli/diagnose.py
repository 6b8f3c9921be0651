"""`scaletrain diagnose LOG... [--plan plan.json] [--exit-code RANK=CODE] [--json]`: the doctor's verdict as plain
text or JSON (the doctor itself is engine.doctor). No Textual, no torch: it works over SSH, in CI and in logs.
The engine is imported when the command runs, so that parsing any command stays fast."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.units import printable
from scaletrain.tui.cli.plan_args import stated

if TYPE_CHECKING:
    from scaletrain.engine.doctor.remedies import Remedy
    from scaletrain.engine.doctor.summary import Diagnosis


def configure_diagnose(p: argparse.ArgumentParser) -> None:
    p.add_argument("logs", nargs="+", metavar="LOG", help="log files, or a run directory (uses its logs, "
                                                         "status.json and plan.json)")
    p.add_argument("--plan", metavar="PLAN_JSON",
                   help=stated("the run's plan.json (or `scaletrain plan --json` output), for predicted numbers and "
                               "remedies", "a run directory's own; none for log files"))
    p.add_argument("--exit-code", action="append", default=[], metavar="RANK=CODE",
                   help=stated("a rank's exit code when no status.json has it (e.g. 3=-9); repeatable", "none"))
    p.add_argument("--json", action="store_true", help=stated("print the diagnosis as one JSON object", "off"))


def _exit_codes(items: list[str]) -> dict[int, int]:
    out = {}
    for it in items:
        rank, _, code = it.partition("=")
        try:
            out[int(rank)] = int(code)
        except ValueError:
            raise ScaletrainError(f"--exit-code {it!r} is not RANK=CODE (e.g. 3=-9)") from None
    return out


def cmd_diagnose(args: argparse.Namespace) -> int:
    from scaletrain.engine.doctor.diagnosis import diagnose_paths
    from scaletrain.engine.run.plan_document import read_plan_document

    plan = read_plan_document(args.plan, flag="--plan") if args.plan else None
    if plan is not None:
        plan.check_plan()
    diag = diagnose_paths([Path(p) for p in args.logs], plan, exit_codes=_exit_codes(args.exit_code))
    runs = [Path(p) for p in args.logs if Path(p).is_dir()]
    run_dir = runs[0] if len(runs) == 1 else None
    if args.json:
        out = diag.to_json()
        for r, j in zip(diag.remedies, out["remedies"]):
            j["apply"] = apply_command(r, run_dir)           # the command line, or null (see apply_command)
        print(json.dumps(out, indent=2))
    else:
        print_diagnosis(diag, sys.stdout, run_dir)
    return 0


def apply_command(r: Remedy, run_dir: Path | None) -> str | None:
    """The command that applies a remedy to its run: `scaletrain launch RUN --set …` (re-planned, the old files kept,
    --resume where the change keeps the checkpoint). None for a manual step, an environment change (no --set key)
    or logs given without their run directory."""
    if run_dir is None or not r.applicable or not r.changes or any(k.startswith("env.") for k in r.changes):
        return None
    from scaletrain.engine.launch.relaunch import likely_resumes

    sets = " ".join(f"--set {shlex.quote(f'{k}={_as_yaml(v)}')}" for k, v in r.changes.items())
    resume = " --resume" if likely_resumes(r.changes, r.keeps_effective_batch) else ""
    return f"scaletrain launch {shlex.quote(str(run_dir))} {sets}{resume}"


def _as_yaml(v: object) -> str:
    """A change's value as `--set` reads it (YAML): true/false, null, [a, b]."""
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_as_yaml(x) for x in v) + "]"
    return str(v)


def print_diagnosis(diag: Diagnosis, out: TextIO, run_dir: Path | None = None) -> None:
    """Plain text: kind, summary, evidence, remedies with their predicted numbers (all from the Diagnosis), and with
    `run_dir` the command that applies each."""
    where = "".join(f" {k} {v}" for k, v in (("rank", diag.rank), ("node", diag.node), ("gpu", diag.gpu))
                    if v is not None)
    print(printable(f"{diag.kind}{where}: {diag.summary}"), file=out)
    if diag.evidence:
        print("evidence:", file=out)
        for line in diag.evidence:
            print(f"  {printable(line)}", file=out)
    for s in diag.secondary:
        print(f"  also: {printable(s)}", file=out)
    for s in diag.restarts:
        print(f"  elastic {printable(s)}", file=out)
    if diag.peers:
        print(f"peers: {printable(diag.peers)}", file=out)
    if diag.remedies:
        print("remedies:", file=out)
    for note in diag.notes:
        print(f"  note: {printable(note)}", file=out)
    for i, r in enumerate(diag.remedies, 1):
        nums = r.numbers()
        if r.predicted_per_gpu_bytes is not None and r.fits is not None:
            nums[0] += " fits" if r.fits else " still over"
        manual = "" if r.applicable else " [manual]"
        print(printable(f"  {i}. {r.title}{manual}" + (f"  ({', '.join(nums)})" if nums else "")), file=out)
        if r.changes:
            print(printable("     " + ", ".join(f"{k}={v}" for k, v in r.changes.items())), file=out)
        apply = apply_command(r, run_dir)
        if apply:
            print(printable(f"     apply: {apply}"), file=out)

"""The command line both CPU ground-truth scripts share: pick cases, run them, print the table, record the rows
with the machine and the library versions they ran on."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Callable, Sequence

from machine import machine_line


def run_groundtruth(argv: list[str] | None, *, cases: Sequence, quick: Sequence, run_case: Callable[[object], dict],
                    markdown: Callable[[list[dict]], str], out_name: str, command: str,
                    libraries: Sequence[str] = ("torch", "transformers")) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / out_name))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--only", help="run the cases whose label contains this text")
    args = ap.parse_args(argv)
    chosen = quick if args.quick else cases
    if args.only:
        chosen = [c for c in chosen if args.only in c.label]
    rows = [run_case(c) for c in chosen]
    print(markdown(rows))
    if not args.no_write:
        versions = {name: importlib.import_module(name).__version__ for name in libraries}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"machine": machine_line(), **versions, "command": command,
                                              "cases": rows}, indent=1) + "\n")
    return 0

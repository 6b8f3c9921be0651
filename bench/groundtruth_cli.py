"""What both CPU ground-truth scripts share: the compared row fields, and the command line (pick cases, run them,
print the table, record the rows with the machine and the library versions they ran on)."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Callable, Sequence

from machine import machine_line


def predicted_vs_measured(s, mem, measured, **extra_pairs: tuple[int, int]) -> dict:
    """The row fields both scripts compare: parameter counts and state bytes (exact), and the peak (with its error).
    `s` a TrainingSetup, `mem` its MemoryEstimate, `measured` the profiler's step; extra_pairs: name → (predicted,
    measured) compared the same way (e.g. the reference model's bytes)."""
    from scaletrain.engine.estimate.states import buffer_bytes, model_states

    states = model_states(s)
    # the parameters' bytes against the profiler's parameters: the engine's weights also hold a traced model's
    # buffers (rotary frequencies, a causal-mask table), which the peak counts and the PARAMETER category does not
    buffers = buffer_bytes(s)
    predicted = mem.allocated_peak_bytes
    row = {
        # the measured model carries the adapters too: base + trainable for LoRA
        "params_predicted": s.model.params + (s.trainable_params if s.method != "full" else 0),
        "params_measured": measured.params,
        "trainable_predicted": s.trainable_params, "trainable_measured": measured.trainable_params,
        "weights_bytes_predicted": states.weights - buffers, "weights_bytes_measured": measured.param_bytes,
    }
    for name, (pred, meas) in extra_pairs.items():
        row.update({f"{name}_predicted": pred, f"{name}_measured": meas})
    row.update({
        "optimizer_bytes_predicted": states.optimizer, "optimizer_bytes_measured": measured.optimizer_state_bytes,
        "predicted_peak_bytes": predicted, "measured_peak_bytes": measured.peak_allocated_bytes,
        "peak_phase": mem.peak_phase,
        "error": (predicted - measured.peak_allocated_bytes) / measured.peak_allocated_bytes,
        "measured_by_category": measured.peak_by_category,
    })
    return row


def run_groundtruth(argv: list[str] | None, *, cases: Sequence, quick: Sequence, run_case: Callable[[object], dict],
                    markdown: Callable[[list[dict]], str], out_name: str, command: str,
                    libraries: Sequence[str] = ("torch", "transformers"),
                    run_cases: Callable[[list], list[dict]] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / out_name))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--only", help="run the cases whose label contains this text (written into the results file "
                                   "in place of their earlier rows; the other rows stay)")
    args = ap.parse_args(argv)
    chosen = quick if args.quick else cases
    if args.only:
        chosen = [c for c in chosen if args.only in c.label]
    rows = run_cases(list(chosen)) if run_cases else [run_case(c) for c in chosen]
    print(markdown(rows))
    if not args.no_write:
        versions = {name: importlib.import_module(name).__version__ for name in libraries}
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        machine = machine_line()
        if args.only and out.is_file():   # a subset replaces its own rows (by case label) and keeps the others
            rerun = {r["case"] for r in rows}
            earlier = json.loads(out.read_text())
            rows = [r for r in earlier["cases"] if r["case"] not in rerun] + rows
            if earlier.get("machine") and earlier["machine"] != machine:    # the other rows' machine stays named
                machine = f"{earlier['machine']}; the rows matching --only {args.only!r}: {machine}"
        out.write_text(json.dumps({"machine": machine, **versions, "command": command,
                                   "cases": rows}, indent=1) + "\n")
    return 0

"""Where the time model's fitted constants come from: a small search over the H100 records.

    .venv/bin/python bench/fit_time.py

Reads the measured step times in bench/results/h100-2026-11-23.json (the shared H100 measurements, see
bench/gpu_records.py). Everything else in engine/estimate/timing.py is a datasheet figure, a published kernel benchmark or an
op count; three constants of the Hopper device model are searched on the plain-PyTorch runs (DDP on one GPU):
the GEMM plateau efficiency, the HBM efficiency of memory-bound kernels, and the host time per kernel. Then the
two DeepSpeed hook costs are solved on the ZeRO-2 and ZeRO-3 runs with those fixed. The objective is the worst
|log(predicted / measured)|, ties broken by the median: a planner's time is only as good as its worst case.
Writes bench/results/time_fit-h100-2026-11-23.json; the chosen values are the defaults in engine/estimate/timing.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path
from types import MappingProxyType

from gpu_records import RESULTS, setup_for
from scaletrain.engine.estimate.time_constants import DEFAULT_CONSTANTS, TimeConstants
from scaletrain.engine.estimate.timing import estimate_time

OUT = RESULTS.parent / "time_fit-h100-2026-11-23.json"
GEMM_GRID = (0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.80)
HBM_GRID = (0.60, 0.65, 0.70, 0.75, 0.80, 0.85, 0.90)
HOST_GRID = tuple(x * 1e-6 for x in range(20, 61, 5))


def _errors(records: list[dict], c: TimeConstants) -> list[float]:
    return [math.log(estimate_time(setup_for(r), c).step_seconds / r["measured"]["step_seconds"]) for r in records]


def _score(errs: list[float]) -> tuple[float, float]:
    return (round(max(map(abs, errs)), 3), statistics.median(map(abs, errs)))


def _solve(records: list[dict], c: TimeConstants, name: str, lo: float, hi: float) -> float:
    """Bisection on one hook constant so the (single) record's predicted time equals the measured one."""
    for _ in range(60):
        mid = (lo + hi) / 2
        if _errors(records, c.with_(**{name: mid}))[0] > 0:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)    # --help says what it does
    data = json.loads(RESULTS.read_text())
    plain = [r for r in data["records"] if r["strategy"] == "ddp"]
    zero2 = [r for r in data["records"] if r["strategy"] in ("zero1", "zero2")]
    zero3 = [r for r in data["records"] if r["strategy"] == "zero3"]
    best = None
    for ge, hb, th in itertools.product(GEMM_GRID, HBM_GRID, HOST_GRID):
        c = DEFAULT_CONSTANTS.with_(gemm_efficiency=MappingProxyType({**DEFAULT_CONSTANTS.gemm_efficiency,
                                                                        "hopper": ge}),
                                    hbm_efficiency=hb, host_seconds_per_kernel=th)
        sc = _score(_errors(plain, c))
        if best is None or sc < best[0]:
            best = (sc, ge, hb, th, c)
    (_, _), ge, hb, th, c = best
    hook = _solve(zero2, c, "ds_grad_hook_seconds", 0.0, 2e-3) if zero2 else c.ds_grad_hook_seconds
    c = c.with_(ds_grad_hook_seconds=hook)
    module = _solve(zero3, c, "ds_zero3_module_seconds", 0.0, 5e-3) if zero3 else c.ds_zero3_module_seconds
    c = c.with_(ds_zero3_module_seconds=module)
    rows = []
    for r in data["records"]:
        t = estimate_time(setup_for(r), c)
        rows.append({"config": f"{r['model']} {r['method']} {r['strategy']} ckpt={r['grad_ckpt']} "
                               f"b{r['micro_batch']}×s{r['seq_len']}",
                     "measured_step_seconds": r["measured"]["step_seconds"], "predicted_step_seconds": t.step_seconds,
                     "error": t.step_seconds / r["measured"]["step_seconds"] - 1, "host_bound": t.micro.host_bound})
    fit = {"gemm_efficiency_hopper": ge, "hbm_efficiency": hb, "host_seconds_per_kernel": th,
           "ds_grad_hook_seconds": hook, "ds_zero3_module_seconds": module}
    OUT.write_text(json.dumps({"command": "python bench/fit_time.py", "source": data["source"],
                               "grid": {"gemm": GEMM_GRID, "hbm": HBM_GRID, "host": HOST_GRID},
                               "fit": fit, "records": rows}, indent=1) + "\n")
    print(json.dumps(fit, indent=1))
    for row in rows:
        print(f"{row['error']:+6.1%}  {row['config']}{'  (host-bound)' if row['host_bound'] else ''}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())

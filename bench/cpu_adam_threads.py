"""DeepSpeed's CPU-Adam (the optimizer ZeRO-Offload runs on the host) against its thread count.

The time model's CPU-Adam compute rate per OpenMP thread (engine/estimate/time_constants.py
CPU_ADAM_PARAMS_PER_THREAD_SECOND) comes from here: one fp32 parameter tensor of --params elements with a gradient,
DeepSpeedCPUAdam.step() timed --repeats times after a warm-up step, in a fresh process per thread count
(OMP_NUM_THREADS is read when the OpenMP runtime starts). The first run JIT-builds DeepSpeed's cpu_adam op.

    PYTHONPATH=src .venv/bin/python bench/cpu_adam_threads.py [--params 50000000] [--machine vm]

Writes bench/results/cpu_adam_threads-<machine>.json: per thread count the minimum and median wall seconds per step
and parameters per second (min: the machine is shared; other work only ever adds time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import machine  # bench/machine.py

RESULTS = Path(__file__).resolve().parent / "results"


def one(params: int, repeats: int) -> dict:
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    p = torch.nn.Parameter(torch.zeros(params))
    p.grad = torch.randn(params)
    opt = DeepSpeedCPUAdam([p], lr=1e-3)
    opt.step()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t)
    return {"min_seconds": min(times), "median_seconds": statistics.median(times),
            "params_per_second": params / min(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=50_000_000)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--machine", default="vm")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.params, a.repeats)))
        return
    rows = []
    for threads in range(1, (os.cpu_count() or 1) + 1):
        out = subprocess.run([sys.executable, __file__, "--one", "--params", str(a.params), "--repeats",
                              str(a.repeats)], check=True, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        row = {"threads": threads, **json.loads(out.stdout.strip().splitlines()[-1])}
        row["params_per_second_per_thread"] = row["params_per_second"] / threads
        rows.append(row)
        print(json.dumps(row), flush=True)
    from scaletrain.engine.fileio import atomic_write

    doc = {"benchmark": "cpu_adam_threads", "machine": {**machine(), "name": a.machine,
                                                        "load_average_1m_at_end": os.getloadavg()[0]},
           "command": "PYTHONPATH=src .venv/bin/python bench/cpu_adam_threads.py " + " ".join(sys.argv[1:]),
           "params": a.params, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"cpu_adam_threads-{a.machine}.json"
    atomic_write(path, json.dumps(doc, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

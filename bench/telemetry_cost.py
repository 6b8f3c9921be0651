"""Cost of per-rank telemetry (issue 23): target ≤ 1 % of the step time on the CPU demo.

What a rank adds per optimizer step (trainer/telemetry.py, trainer/distributed.peak_memory): four host clock marks
around the step's phases, one RankTelemetry reading (NVML at most once per second: here an in-process stand-in with
pynvml's call shapes, bench_sampler.StandInNvml, read at EVERY step — the worst case, a step longer than 1 s), and
a peaks vector of 3 + len(VECTOR_FIELDS) float64 instead of 3 int64 (the same one all_gather per step). The bench
  1. times that work per step in-process (median of REPEATS × STEPS calls),
  2. runs the CPU demo for real (`scaletrain --preset cpu-tiny --headless`, 2 processes) and takes its median
     steady step time from metrics.jsonl,
and records the ratio with the machine in bench/results/telemetry_cost-<machine>.json.

    .venv/bin/python bench/telemetry_cost.py [--machine NAME] [--no-demo STEP_SECONDS]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scaletrain.engine.fileio import atomic_write
from scaletrain.engine.run.metrics import read_metrics, steady_step_seconds
from scaletrain.engine.run.rank_telemetry import VECTOR_FIELDS, RankTelemetry
from scaletrain.trainer.telemetry import RankSampler

from bench_sampler import StandInNvml
from machine import machine

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_FRACTION = 0.01
STEPS = 2000
REPEATS = 5


def per_step_seconds() -> dict[str, float]:
    """The telemetry's own work per step, NVML (stand-in) read every step, and the vector's packing."""
    import torch

    sampler = RankSampler(device_index=0, interval_s=0.0)     # 0: read NVML every step (worst case)
    sampler._nvml_tried, sampler._nv, sampler._handle = True, StandInNvml(), 0
    runs = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(STEPS):
            sampler.phase("data")
            sampler.phase("compute")
            sampler.phase("optimizer")
            tel = sampler.reading()
            vec = torch.tensor([1.0, 2.0, 3.0] + tel.to_vector(), dtype=torch.float64)
            RankTelemetry.from_vector(vec.tolist()[3:], "host")
        runs.append((time.perf_counter() - t0) / STEPS)
        base0 = time.perf_counter()
        for _ in range(STEPS):                                  # what the peaks alone cost before
            torch.tensor([1, 2, 3], dtype=torch.int64).tolist()
        runs[-1] -= (time.perf_counter() - base0) / STEPS
    return {"telemetry_seconds_per_step": statistics.median(runs), "vector_floats": 3 + len(VECTOR_FIELDS)}


def demo_step_seconds() -> float:
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        r = subprocess.run([sys.executable, "-c", "import sys; from scaletrain.tui.cli.main import main; "
                            "sys.exit(main())", "--preset", "cpu-tiny", "--headless", "--run-dir", str(run)],
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise SystemExit(f"the CPU demo failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
        step = steady_step_seconds(read_metrics(run / "metrics.jsonl"))
        if step is None:
            raise SystemExit("the CPU demo logged no steady steps")
        return step


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--machine", default="vm")
    ap.add_argument("--no-demo", type=float, metavar="STEP_SECONDS", help="use this step time instead of a run")
    args = ap.parse_args()
    cost = per_step_seconds()
    step = args.no_demo or demo_step_seconds()
    frac = cost["telemetry_seconds_per_step"] / step
    result = {"machine": machine(), "demo": "scaletrain --preset cpu-tiny --headless (2 processes)",
              "demo_steady_step_seconds": step, **cost, "fraction_of_step": frac,
              "target_fraction": TARGET_FRACTION, "within_target": frac <= TARGET_FRACTION,
              "nvml": "stand-in (bench_sampler.StandInNvml), read every step"}
    out = RESULTS / f"telemetry_cost-{args.machine}.json"
    atomic_write(out, json.dumps(result, indent=2) + "\n", backup=False)
    print(f"telemetry {cost['telemetry_seconds_per_step'] * 1e6:.1f} µs/step = {frac:.3%} of the demo's "
          f"{step * 1e3:.0f} ms step (target ≤ {TARGET_FRACTION:.0%}); {out}")
    return 0 if frac <= TARGET_FRACTION else 1


if __name__ == "__main__":
    sys.exit(main())

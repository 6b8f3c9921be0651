"""Speed of the planning path: the targets live here, with recorded results, not in timed tests.

Measures
  1. `scaletrain plan --model Qwen/Qwen3-4B --gpus 8xRTX4090 --json` wall time as a subprocess (median of 10)
  2. one estimate_memory + estimate_time call for that setup (median µs)          target: well under 1 ms
  3. one full planner search for an effective-batch target (median ms)            target: < 50 ms
  4. `python -X importtime` of the plan path: no torch / textual / transformers / deepspeed imported

and writes bench/results/bench_plan-<machine>.json (machine = --machine, else the hostname):

    .venv/bin/python bench/bench_plan.py [--machine NAME] [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scaletrain.engine.estimate.memory import estimate_memory
from scaletrain.engine.plan.search import search
from scaletrain.engine.request.request import PlanRequest, base_setup
from scaletrain.engine.fileio import atomic_write
from scaletrain.engine.estimate.timing import estimate_time

from machine import machine  # bench/machine.py

RESULTS = Path(__file__).resolve().parent / "results"
PLAN_ARGV = ["plan", "--model", "Qwen/Qwen3-4B", "--gpus", "8xRTX4090", "--json"]
HEAVY = ("torch", "textual", "transformers", "deepspeed", "accelerate")
ESTIMATE_TARGET_US = 1000.0
SEARCH_TARGET_MS = 50.0
# searches timed: the case, a multi-node 70B case, and a target with many divisors
SEARCH_CASES = (
    ("Qwen/Qwen3-4B", "8xRTX4090", 128, "full"),
    ("Qwen/Qwen2.5-7B-Instruct", "4xH200", 128, "lora"),
    ("meta-llama/Llama-3.1-70B", "2x8xH100", 1024, "full"),
    ("Qwen/Qwen3-4B", "2x8xRTX4090", 256 * 9 * 5 * 7, "full"),
)


def bench_cli(repeats: int) -> dict:
    cmd = [sys.executable, "-m", "scaletrain.tui.cli", *PLAN_ARGV]
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        times.append(time.perf_counter() - t)
        if r.returncode != 0:
            raise SystemExit(f"plan failed: {r.stderr.strip()}")
    json.loads(r.stdout)
    return {"command": "scaletrain " + " ".join(PLAN_ARGV), "median_seconds": statistics.median(times),
            "min_seconds": min(times), "runs": repeats}


def bench_estimate(repeats: int) -> dict:
    s = base_setup(PlanRequest(model="Qwen/Qwen3-4B", gpus="8xRTX4090", strategy="zero3", micro_batch=2,
                               grad_accum=8, grad_ckpt=True, dataset_size=160_791))
    per_call = []
    inner = 200
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            estimate_memory(s)
            estimate_time(s)
        per_call.append((time.perf_counter() - t) / inner)
    t_only = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            estimate_time(s)
        t_only.append((time.perf_counter() - t) / inner)
    med = statistics.median(per_call) * 1e6
    return {"setup": "Qwen3-4B full, 8xRTX4090, zero3, micro 2 x accum 8, seq 2048, grad-ckpt",
            "memory_plus_time_median_us": med, "time_only_median_us": statistics.median(t_only) * 1e6,
            "target_us": ESTIMATE_TARGET_US, "ok": med < ESTIMATE_TARGET_US}


def bench_search(repeats: int) -> list[dict]:
    out = []
    for model, gpus, target, method in SEARCH_CASES:
        req = PlanRequest(model=model, gpus=gpus, effective_batch=target, method=method, dataset_size=160_791)
        base = base_setup(req)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            res = search(base, target=target, fixed={}, headroom=req.headroom)
            times.append(time.perf_counter() - t)
        best = res.ranked[0] if res.ranked else None
        med = statistics.median(times) * 1000
        out.append({"model": model, "gpus": gpus, "method": method, "effective_batch": target,
                    "median_ms": med, "min_ms": min(times) * 1000, "max_ms": max(times) * 1000, "memory_probes": res.evaluated,
                    "fitting_configurations": len(res.ranked), "chosen": best.describe() if best else None,
                    "target_ms": SEARCH_TARGET_MS, "ok": med < SEARCH_TARGET_MS})
    return out


def bench_imports() -> dict:
    cmd = [sys.executable, "-X", "importtime", "-m", "scaletrain.tui.cli", *PLAN_ARGV]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    mods = []
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            mods.append(line.rsplit("|", 1)[1].strip())
    heavy = sorted({m for m in mods if m.split(".")[0] in HEAVY})
    return {"modules_imported": len(mods), "heavy_imported": heavy, "ok": r.returncode == 0 and not heavy and
            len(mods) > 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", help="name for the results file (default: hostname)")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    result = {
        "benchmark": "bench_plan",
        "machine": {**machine(), "name": args.machine or socket.gethostname()},
        "cli_plan": bench_cli(args.repeats),
        "estimate": bench_estimate(args.repeats),
        "planner_search": bench_search(args.repeats),
        "imports": bench_imports(),
    }
    result["machine"]["load_average_1m_at_end"] = os.getloadavg()[0]
    result["ok"] = (result["estimate"]["ok"] and all(c["ok"] for c in result["planner_search"])
                    and result["imports"]["ok"])
    name = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in result["machine"]["name"])
    path = RESULTS / f"bench_plan-{name}.json"
    # our own output, regenerated on every run: no backup
    atomic_write(path, json.dumps(result, indent=2, ensure_ascii=False) + "\n", backup=False)
    print(json.dumps(result, indent=2, ensure_ascii=False))
    print(f"wrote {path}", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""How long the first plan of a traced family takes (a fresh trace cache), and a cached one.

    PYTHONPATH=src .venv/bin/python bench/trace_latency.py [--repeat N]

Runs `scaletrain plan --model M --gpus 1xCPU --json` as a user would, for the tiny traced catalog models and for
tiny configs of families outside the catalog, first with an empty trace cache, then again with the cache it filled;
wall time of the whole command (interpreter start, imports, the trace process) each; and the wizard's first plan
of the family after its model step's warm-up (`traced.warm`), timed alone. Records
bench/results/trace_latency-vm.json with the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = ("scaletrain/tiny-llama", "scaletrain/tiny-phi3", "scaletrain/tiny-granite", "scaletrain/tiny-glm4")   # llama: analytic
SWEEP_FAMILIES = ("qwen3_next", "deepseek_v3")


def timed_plan(model: str, cache: str) -> tuple[float, int, str]:
    env = dict(os.environ, SCALETRAIN_CACHE=cache)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "scaletrain.tui.cli.main", "plan", "--model", model, "--gpus", "1xCPU",
                        "--json"], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=600)
    return time.perf_counter() - t0, r.returncode, (r.stderr.strip().splitlines() or [""])[-1][:200]


# The wizard (and a search over several plans) plans again in a process that has imported the engine: the plan
# itself, cached, without the interpreter's start and the imports every command pays.
_IN_PROCESS = """\
import contextlib, io, json, sys, time
from scaletrain.tui.cli.main import main
argv = ["plan", "--model", sys.argv[1], "--gpus", "1xCPU", "--json"]
times = []
for _ in range(4):
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        main(argv)
    times.append(round(time.perf_counter() - t0, 3))
print(json.dumps(times))
"""


def in_process_plans(model: str, cache: str) -> list[float]:
    """Seconds of four plans of `model` in one process, the cache filled: the first pays the engine's lazy imports."""
    env = dict(os.environ, SCALETRAIN_CACHE=cache)
    r = subprocess.run([sys.executable, "-c", _IN_PROCESS, model], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=600)
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else []


# The wizard starts the trace process when a model is picked (engine/catalog/traced.warm: transformers imported, the
# family built) while the method and batch are chosen; its first plan of the family then waits for the regimes
# only. Here: warm, then the plan the batch step asks for, timed alone, in one process with an empty cache.
_AFTER_WARM = """\
import contextlib, io, json, sys, time
from scaletrain.engine.catalog import traced
from scaletrain.engine.catalog.architectures import load_model
from scaletrain.tui.cli.main import main
t0 = time.perf_counter()
arch = load_model(sys.argv[1])
if arch.memory_source == "traced":       # as the wizard's model step: an analytic family has nothing to warm
    traced.warm(arch.config)
warmed = time.perf_counter() - t0
t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["plan", "--model", sys.argv[1], "--gpus", "1xCPU", "--json"])
print(json.dumps([round(warmed, 2), round(time.perf_counter() - t0, 2), code]))
"""


def plan_after_warm(model: str, cache: str) -> tuple[float, float] | None:
    """(seconds of the warm-up, seconds of the first plan after it) with an empty cache; None when it failed."""
    env = dict(os.environ, SCALETRAIN_CACHE=cache)
    r = subprocess.run([sys.executable, "-c", _AFTER_WARM, model], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=600)
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        return None
    warmed, first, code = json.loads(lines[-1])
    return (warmed, first) if code == 0 else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from machine import machine

    from scaletrain.measure.tiny_configs import config_dict

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = list(MODELS)
        for family in SWEEP_FAMILIES:
            path = Path(tmp) / f"{family}.json"
            path.write_text(json.dumps(config_dict(family)))
            models.append(str(path))
        for model in models:
            first, cached = [], []
            for k in range(a.repeat):
                cache = str(Path(tmp) / f"cache-{len(rows)}-{k}")
                t1, rc1, err1 = timed_plan(model, cache)
                t2, rc2, err2 = timed_plan(model, cache)
                first.append(round(t1, 2))
                cached.append(round(t2, 2))
            name = model if model in MODELS else f"tiny {Path(model).stem} (sweep config)"
            again = in_process_plans(model, cache)
            warm = [plan_after_warm(model, str(Path(tmp) / f"warm-{len(rows)}-{k}")) for k in range(a.repeat)]
            after_warm = [w[1] for w in warm if w]
            rows.append({"model": name, "first_plan_seconds": first, "cached_plan_seconds": cached,
                         "first_median": statistics.median(first), "cached_median": statistics.median(cached),
                         "in_process_cached_seconds": again,
                         "in_process_cached_median": statistics.median(again[1:]) if len(again) > 1 else None,
                         "warm_up_seconds": [w[0] for w in warm if w], "first_plan_after_warm_up_seconds": after_warm,
                         "first_after_warm_up_median": statistics.median(after_warm) if after_warm else None,
                         "exit": [rc1, rc2], "last_line": err2})
            print(json.dumps(rows[-1]), flush=True)
    # the load while it ran (the start's is in `machine`): a busy core doubles a cold plan (7.3 s at load 1.3 for
    # tiny-phi3's, 4.6 s on an idle machine)
    out = {"machine": machine(), "load_average_1m_at_end": round(os.getloadavg()[0], 2), "rows": rows,
           "note": "wall time of `scaletrain plan --json` as a subprocess; first: empty trace cache; "
                   "in_process_cached: four plans in one process that imported the engine (the wizard's replan), "
                   "the cache filled; its median leaves out the first (the engine's lazy imports); "
                   "first_plan_after_warm_up: the wizard's first plan of the family after its model step's warm-up "
                   "(traced.warm: transformers imported, the family built, while the method and batch are picked), "
                   "an empty cache"}
    path = HERE / "results" / "trace_latency-vm.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How long the test suite takes: `make test` (≤ 10 minutes on 2 cores) and `make test-fast` (≤ 2 minutes).

Runs the suite the way the Makefile does and writes bench/results/suite_time-<target>-<machine>.json: wall seconds,
CPU seconds (user + system of pytest and everything it started, ranks included), the machine's load sampled every
10 s (other work on the cores stretches the wall time, much less the CPU time), the versions, the exact command, the
pytest summary and the tests that cost the most CPU.

    python bench/suite_time.py                        # `make test` in this checkout (its .venv)
    python bench/suite_time.py --target test-fast
    python bench/suite_time.py --python /path/to/venv/bin/python   # pytest directly, in the Makefile's passes

With --python the DeepSpeed CPU op is built (or found built) first, timed apart, as `make ds-op` does; the docs
build that `make test` also runs is then not part of the time.

    python bench/suite_time.py --processes            # also: the CPU of every Python process, by kind

--processes puts bench/process_recorder/ first on PYTHONPATH (its sitecustomize records each process as it ends)
and adds `processes_by_kind`: how many ranks, launchers, probes, CLI calls and pytest workers ran, and their CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from scaletrain.engine.fileio import atomic_write

from machine import machine  # bench/machine.py

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
FAST = "not slow and not heavy and not long"    # the Makefile's test-fast selection
LONG_CPU_SECONDS = 2.5                          # a test-fast test over this is marked `long` (pyproject's markers)
PACKAGES = ("torch", "transformers", "accelerate", "deepspeed", "peft", "trl", "textual", "pytest", "xdist")
TARGET_SECONDS = {"test": 600, "test-fast": 120}


def versions(python: str) -> dict:
    code = ("import importlib, json, platform; v = {'python': platform.python_version()}\n"
            f"for p in {PACKAGES!r}:\n"
            "    try: v[p] = importlib.import_module(p).__version__\n"
            "    except Exception: v[p] = None\n"
            "print(json.dumps(v))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    lines = out.stdout.strip().splitlines()      # the last line: deepspeed prints its accelerator warning first
    try:
        return json.loads(lines[-1]) if out.returncode == 0 and lines else {"error": out.stderr[-500:]}
    except ValueError:
        return {"error": out.stdout[-500:]}


def commands(args: argparse.Namespace) -> list[list[str]]:
    """As the Makefile runs them: test-fast is one pass on FAST_JOBS workers; test is tests/passes.py, the
    multi-process tests (`slow`) on JOBS workers with the single-process ones beside them at idle priority on
    FAST_JOBS workers (a file per unit)."""
    if args.python is None:
        return [["make", args.target, f"JOBS={args.jobs}", f"FAST_JOBS={args.fast_jobs}",
                 "PYTEST_ARGS=-p suite_plugin"]]

    def xdist(n: int, dist: str) -> list[str]:
        return ["-n", str(n), "--dist", dist] if n > 1 else []

    pytest = [args.python, "-m", "pytest", "-q", "-p", "suite_plugin"]
    if args.target == "test-fast":
        return [[*pytest, *xdist(args.fast_jobs, "load"), "-m", FAST]]
    ds_op = [args.python, "-c", "from scaletrain.trainer.distributed import load_deepspeed_cpu_comm_op as f; f()"]
    return [ds_op, [args.python, str(ROOT / "tests" / "passes.py"), "--jobs", str(args.jobs), "--fast-jobs",
                    str(args.fast_jobs), "-p", "suite_plugin"]]


class LoadSampler(threading.Thread):
    def __init__(self, every_seconds: float = 10.0):
        super().__init__(daemon=True)
        self.samples: list[float] = [os.getloadavg()[0]]
        self.every, self.stop = every_seconds, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict:
        s = self.samples
        return {"min": round(min(s), 2), "mean": round(sum(s) / len(s), 2), "max": round(max(s), 2),
                "samples": len(s), "every_seconds": self.every}


def timed(argv: list[str], env: dict[str, str]) -> dict:
    """One command: wall and CPU seconds (its whole process tree, once waited for), exit code, output's tail."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = p.stdout + p.stderr
    summary = [ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    return {"command": " ".join(argv), "exit_code": p.returncode, "wall_seconds": round(wall, 1),
            "cpu_seconds": round(cpu, 1), "summary": summary[-1].strip("= ") if summary else None,
            "output_tail": out[-2000:] if p.returncode else ""}


def costliest(path: Path, n: int) -> tuple[list[dict], int, list[dict]]:
    """The n costliest tests by CPU, how many were timed, and the test-fast tests over LONG_CPU_SECONDS (to mark
    `long`, or to make cheaper)."""
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []
    fast = {"slow", "heavy", "long"}
    over = [r for r in rows if not fast & set(r.get("markers", ())) and r["cpu_seconds"] > LONG_CPU_SECONDS]
    return sorted(rows, key=lambda r: -r["cpu_seconds"])[:n], len(rows), over


def processes_by_kind(path: Path) -> dict:
    """The recorder's lines summed by kind (bench/process_recorder/sitecustomize.py), costliest first."""
    rows = []
    for ln in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(ln))
        except ValueError:
            continue                    # a line cut short (a process killed mid-write): not counted
    kinds: dict[str, dict] = {}
    for r in rows:
        k = kinds.setdefault(r["kind"], {"kind": r["kind"], "processes": 0, "cpu_seconds": 0.0, "modules_max": 0})
        k["processes"] += 1
        k["cpu_seconds"] += r["cpu_seconds"]
        k["modules_max"] = max(k["modules_max"], r["modules"])
    for k in kinds.values():
        k["cpu_seconds_each"] = round(k["cpu_seconds"] / k["processes"], 2)
        k["cpu_seconds"] = round(k["cpu_seconds"], 1)
    return {"recorded": len(rows), "cpu_seconds": round(sum(r["cpu_seconds"] for r in rows), 1),
            "not_recorded": "processes killed by a signal and non-Python children (the suite's CPU less this sum)",
            "by_kind": sorted(kinds.values(), key=lambda k: -k["cpu_seconds"]),
            "children_by_test": children_by_test(rows, 25)}


def children_by_test(rows: list[dict], n: int) -> list[dict]:
    """The n tests whose child processes (ranks, launchers, probes, CLI calls) cost the most CPU, waited for or not.
    A test's own timer (suite_plugin) counts only the children it waited for: a detached launcher or a trace
    process that outlives the test is seen here alone. A child knows its test from PYTEST_CURRENT_TEST, which it
    inherits."""
    tests: dict[str, dict] = {}
    for r in rows:
        name = re.sub(r" \((setup|call|teardown)\)$", "", r.get("test") or "")
        if not name or r["kind"].startswith("pytest"):
            continue                    # pytest itself and its workers: their own CPU, timed per test already
        t = tests.setdefault(name, {"test": name, "processes": 0, "cpu_seconds": 0.0})
        t["processes"] += 1
        t["cpu_seconds"] += r["cpu_seconds"]
    for t in tests.values():
        t["cpu_seconds"] = round(t["cpu_seconds"], 1)
    return sorted(tests.values(), key=lambda t: -t["cpu_seconds"])[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", choices=sorted(TARGET_SECONDS), default="test")
    ap.add_argument("--python", help="run pytest with this interpreter instead of `make` (default: make)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="pytest-xdist workers for the multi-process tests (`slow`), 1: serial (default 1, as make)")
    ap.add_argument("--fast-jobs", type=int, default=2,
                    help="pytest-xdist workers for the single-process tests (default 2, as make)")
    ap.add_argument("--machine", help="a name for the machine in the file name (default: the hostname)")
    ap.add_argument("--top", type=int, default=25, help="how many of the costliest tests to record")
    ap.add_argument("--processes", action="store_true",
                    help="record every Python process's CPU by kind (bench/process_recorder/)")
    args = ap.parse_args()
    if args.jobs < 1 or args.fast_jobs < 1:
        ap.error("--jobs and --fast-jobs must be 1 or more")
    per_test = Path(tempfile.mkdtemp(prefix="suite-time-")) / "tests.jsonl"
    per_process = per_test.with_name("processes.jsonl")
    recorder = (str(ROOT / "bench" / "process_recorder"),) if args.processes else ()
    env = dict(os.environ, SUITE_TIME_TESTS=str(per_test),
               PYTHONPATH=os.pathsep.join(p for p in (*recorder, str(ROOT / "bench"), os.environ.get("PYTHONPATH"))
                                          if p))
    if args.processes:
        env["SUITE_TIME_PROCESSES"] = str(per_process)
    env.pop("PYTHONDONTWRITEBYTECODE", None)      # as the Makefile (unexport): every process reuses compiled modules
    load = LoadSampler()
    load.start()
    steps = [timed(argv, env) for argv in commands(args)]
    load.stop.set()
    top, counted, over = costliest(per_test, args.top)
    wall = sum(s["wall_seconds"] for s in steps)
    result = {
        "benchmark": "suite_time", "target": f"make {args.target}", "jobs": args.jobs, "fast_jobs": args.fast_jobs,
        "machine": {**machine(), "name": args.machine or socket.gethostname(),
                    "load_average_1m_at_end": os.getloadavg()[0], "load_1m_during": load.summary()},
        "versions": versions(args.python or str(ROOT / ".venv" / "bin" / "python")),
        "steps": steps, "wall_seconds": round(wall, 1),
        "cpu_seconds": round(sum(s["cpu_seconds"] for s in steps), 1),
        "target_wall_seconds": TARGET_SECONDS[args.target], "within_target": wall <= TARGET_SECONDS[args.target],
        "tests_timed": counted, "costliest_tests_by_cpu": top, "unmarked_tests_over_long_cpu_seconds": over,
        "ok": all(s["exit_code"] == 0 for s in steps),
    }
    if args.processes:
        result["processes_by_kind"] = processes_by_kind(per_process)
    name = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in result["machine"]["name"])
    out = RESULTS / f"suite_time-{args.target}-{name}.json"
    atomic_write(out, json.dumps(result, indent=2, ensure_ascii=False) + "\n", backup=False)   # ours: no backup
    print(json.dumps({k: v for k, v in result.items() if k not in ("costliest_tests_by_cpu", "steps")}, indent=2))
    print(f"per test: {per_test}" + (f"; per process: {per_process}" if args.processes else ""), file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Host overhead of the bundled trainer: its steady-state tokens/s against a plain PyTorch loop's on the same run.

For 1 process and for 2 processes (DDP over gloo on the CPU), this writes a run directory with scaletrain
(`--preset cpu-tiny --gpus NxCPU --dry-run`, no checkpoints), then runs, alternately, pair by pair:

  trainer  `scaletrain launch RUN_DIR`: the real launcher path (accelerate launch, the thread count it sets, the
           bundled trainer, metrics.jsonl), its per-step step_seconds read from metrics.jsonl
  plain    bench/plain_loop.py on the same plan (model config, dtype, micro batch, accumulation, sequence length,
           AdamW implementation and groups, clipping): `python` for 1 process, `torchrun --standalone` for 2, with
           OMP_NUM_THREADS = the cores ÷ the processes (what a well-set-up plain loop runs with); with 1 process
           also on 1 thread, for the speedup the other cores give (engine/estimate/time_constants.py
           CPU_THREAD_EFFICIENCY)

Steady state: the first --warmup optimizer steps (start-up, allocator and autograd warm-up) are dropped; a run's
tokens/s is the tokens of one optimizer step ÷ its median step time (the mean, which other work on a shared
machine inflates, is recorded beside it). The ratio trainer ÷ plain is taken pair by pair, and its median quoted;
the target is ≥ 0.97 with 1 process and with 2.

Beside tokens/s, each run records rank 0's process CPU seconds per steady-state step (the trainer writes it to
metrics.jsonl); on one thread per process (2 processes; and for 1 process a further pair of runs on one core) that
is the work each loop does per step, which other work on a shared machine hardly changes, where wall-clock tokens/s
with every core's threads busy can swing tenfold (an OpenMP thread spinning for a descheduled peer).

    PYTHONPATH=src .venv/bin/python bench/host_overhead.py [--pairs 5] [--steps 80] [--warmup 15] [--machine vm]

Writes bench/results/host_overhead-<machine>.json with the machine (bench/machine.py) and the load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scaletrain.engine.catalog.hardware import host_cores, threads_per_process
from scaletrain.engine.fileio import atomic_write

from machine import machine  # bench/machine.py

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TARGET_RATIO = 0.97
PRESET = "cpu-tiny"


def _env(threads: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    src = str(HERE.parent / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def write_run(folder: Path, processes: int, steps: int) -> Path:
    """The run directory scaletrain writes for the benchmark's plan (nothing launched)."""
    run = folder / f"run-{processes}p-{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "scaletrain.tui.cli", "--preset", PRESET, "--gpus", f"{processes}xCPU",
            "--headless", "--dry-run", "--run-dir", str(run), "--set", f"train.max_steps={steps}",
            "--set", "train.save_checkpoints=false"]
    subprocess.run(argv, check=True, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return run


def steady(step_seconds: list[float], cpu_seconds: list[float], tokens_per_step: float, warmup: int) -> dict:
    s = step_seconds[warmup:]
    med = statistics.median(s)
    return {"steps_counted": len(s), "median_step_seconds": med, "tokens_per_second": tokens_per_step / med,
            "mean_tokens_per_second": tokens_per_step * len(s) / sum(s),
            "median_cpu_seconds_per_step": statistics.median(cpu_seconds[warmup:])}


def run_trainer(folder: Path, processes: int, steps: int, warmup: int, one_thread: bool = False) -> dict:
    run = write_run(folder, processes, steps)
    argv = [sys.executable, "-m", "scaletrain.tui.cli", "launch", str(run)]
    if one_thread:          # the launcher gives the cores it may use ÷ the processes: one core, one thread
        argv = ["taskset", "-c", str(min(os.sched_getaffinity(0))), *argv]
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    status = json.loads((run / "status.json").read_text())
    argv = status.get("argv") or []
    threads = (int(argv[argv.index("--num_cpu_threads_per_process") + 1])
               if "--num_cpu_threads_per_process" in argv else None)
    out = steady([r["step_seconds"] for r in rows], [r["cpu_seconds"] for r in rows], rows[-1]["tokens"], warmup)
    shutil.rmtree(run, ignore_errors=True)
    return {**out, "threads_per_process": threads, "wall_seconds": wall, "final_loss": rows[-1]["loss"]}


def run_plain(folder: Path, processes: int, steps: int, warmup: int, threads: int | None = None) -> dict:
    run = write_run(folder, processes, steps)
    result = run / "plain.json"
    threads = threads or threads_per_process(host_cores(), processes)
    script = [str(HERE / "plain_loop.py"), str(run), "--steps", str(steps), "--out", str(result)]
    if processes == 1:
        argv = [sys.executable, *script]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
                *script]
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, env=_env(threads), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    d = json.loads(result.read_text())
    out = steady(d["step_seconds"], d["cpu_seconds"], d["tokens_per_step"], warmup)
    shutil.rmtree(run, ignore_errors=True)
    return {**out, "threads_per_process": d["threads"], "wall_seconds": wall, "final_loss": d["loss"]}


def compare(folder: Path, processes: int, pairs: int, steps: int, warmup: int) -> dict:
    rows = []
    for i in range(pairs):
        # alternate which goes first, so a drift in the machine's speed falls on both alike
        order = ("trainer", "plain") if i % 2 == 0 else ("plain", "trainer")
        got = {}
        for kind in order:
            fn = run_trainer if kind == "trainer" else run_plain
            got[kind] = fn(folder, processes, steps, warmup)
        ratio = got["trainer"]["tokens_per_second"] / got["plain"]["tokens_per_second"]
        cpu_ratio = got["plain"]["median_cpu_seconds_per_step"] / got["trainer"]["median_cpu_seconds_per_step"]
        if processes == 1 and host_cores() > 1:
            # both on one thread: the plain loop's speedup from the other cores (CPU_THREAD_EFFICIENCY), and CPU
            # time per step that spinning OpenMP threads do not inflate
            got["plain_1_thread"] = run_plain(folder, processes, steps, warmup, threads=1)
            got["trainer_1_thread"] = run_trainer(folder, processes, steps, warmup, one_thread=True)
            got["thread_speedup"] = got["plain"]["tokens_per_second"] / got["plain_1_thread"]["tokens_per_second"]
            cpu_ratio = (got["plain_1_thread"]["median_cpu_seconds_per_step"]
                         / got["trainer_1_thread"]["median_cpu_seconds_per_step"])
        rows.append({"pair": i, "order": list(order), **got, "ratio": ratio, "cpu_ratio": cpu_ratio})
        print(f"{processes} process(es), pair {i}: trainer {got['trainer']['tokens_per_second']:,.0f} tok/s "
              f"({got['trainer']['threads_per_process']} threads), plain {got['plain']['tokens_per_second']:,.0f} "
              f"tok/s ({got['plain']['threads_per_process']} threads), ratio {ratio:.3f}; CPU per step plain/trainer "
              f"(1 thread) {cpu_ratio:.3f}", flush=True)
    ratios = [r["ratio"] for r in rows]
    med = statistics.median(ratios)
    cpu_ratios = [r["cpu_ratio"] for r in rows]
    return {"processes": processes, "pairs": rows, "ratio_median": med, "ratio_min": min(ratios),
            "cpu_ratio_median": statistics.median(cpu_ratios), "cpu_ratio_min": min(cpu_ratios),
            "cpu_ratio_max": max(cpu_ratios),
            "ratio_max": max(ratios), "trainer_tokens_per_second_median":
                statistics.median(r["trainer"]["tokens_per_second"] for r in rows),
            "plain_tokens_per_second_median": statistics.median(r["plain"]["tokens_per_second"] for r in rows),
            "target": TARGET_RATIO, "ok": med >= TARGET_RATIO,
            **({"plain_thread_speedup_median": statistics.median(r["thread_speedup"] for r in rows)}
               if rows and "thread_speedup" in rows[0] else {})}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--processes", default="1,2", help="comma-separated process counts")
    p.add_argument("--machine", default="vm")
    p.add_argument("--no-save", action="store_true")
    a = p.parse_args()
    info = {**machine(), "name": a.machine}
    cases = []
    with tempfile.TemporaryDirectory(prefix="host-overhead-") as tmp:
        for n in (int(x) for x in a.processes.split(",")):
            cases.append(compare(Path(tmp), n, a.pairs, a.steps, a.warmup))
    info["load_average_1m_at_end"] = os.getloadavg()[0]
    doc = {"benchmark": "host_overhead", "machine": info,
           "command": "PYTHONPATH=src .venv/bin/python bench/host_overhead.py " + " ".join(sys.argv[1:]),
           "preset": PRESET, "steps": a.steps, "warmup_steps_dropped": a.warmup,
           "tokens_per_second": "tokens per optimizer step / median steady-state step time", "cases": cases,
           "cpu_ratio": "plain / trainer median CPU seconds per steady-state step of rank 0, one thread per process "
                        "(1 process: both runs on one core)"}
    for c in cases:
        print(f"{c['processes']} process(es): trainer/plain median {c['ratio_median']:.3f} "
              f"(min {c['ratio_min']:.3f}, max {c['ratio_max']:.3f}; target ≥ {TARGET_RATIO}) "
              f"{'ok' if c['ok'] else 'BELOW TARGET'}")
    for c in cases:
        print(f"{c['processes']} process(es), CPU per step on one thread, plain/trainer median "
              f"{c['cpu_ratio_median']:.3f} (min {c['cpu_ratio_min']:.3f}, max {c['cpu_ratio_max']:.3f})")
    if not a.no_save:
        RESULTS.mkdir(exist_ok=True)
        out = RESULTS / f"host_overhead-{a.machine}.json"
        atomic_write(out, json.dumps(doc, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()

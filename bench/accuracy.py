"""GPU accuracy sweep: predicted vs measured peak memory and step time over a grid of configurations.

Run on one H100/H200 (the device tool), one configuration per process (a crash or a time limit then loses one
config, never the file):

    python bench/accuracy.py --only 3 --steps 10 --budget-seconds 300   # grid index 3; the recommended use
    python bench/accuracy.py --steps 10                                  # the whole grid in one process
    python bench/accuracy.py --cpu-smoke                                 # tiny configs on 2 CPU processes (tests)

Each configuration is planned by the engine (the same setup bench/gpu_records.py re-predicts: PlanRequest fields,
then optimizer_impl, master_weights, base_bits) and run by the bundled trainer through `scaletrain validate`'s path:
random-init weights built on the GPU (QLoRA bases quantized from them by bitsandbytes), the bundled demo data sized
to the plan, no checkpoints, the run directory's weights removed afterwards. A configuration the planner says does
not fit runs briefly (NO_FIT_STEPS): an OOM is the expected outcome and is recorded with the doctor's kind.

The results file (default bench/results/<gpu>-<date>.json) has bench/gpu_records.py's format and is rewritten
atomically after every configuration: {"machine", "measured_with", "source", "records": [...], "outcomes": [...]}.
A record holds the config fields, "gpu", "as_run" (optimizer_impl, base_bits, grad_accum, master_weights),
"measured" (peak_allocated_bytes, peak_reserved_bytes, step_seconds, steps) and the prediction made at run time
("predicted_at_run"); an outcome (OOM, time budget, error) holds "outcome", "cause", the doctor's "doctor_kind"
where there is one, and "predicted_at_run". `python bench/gpu_records.py --out FILE` re-predicts the file.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import atomic_write
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.plan.plan import Plan, evaluate
from scaletrain.engine.request.request import PlanRequest, base_setup
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.units import fmt_bytes

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]
CONFIG_KEYS = ("model", "method", "strategy", "grad_ckpt", "seq_len", "micro_batch", "attn", "precision")
NO_FIT_STEPS = 3                    # a config predicted not to fit runs this many steps (an OOM comes in the first)
OOM_KINDS = ("cuda_oom", "cuda_oom_zero3_gather", "host_oom")
DEFAULT_BUDGET_SECONDS = 600.0


@dataclass(frozen=True)
class Config:
    model: str
    method: str = "full"
    strategy: str = "ddp"           # single GPU: DDP-single (plain), ZeRO-2 / ZeRO-3 on one rank
    grad_ckpt: bool = False
    seq_len: int = 1024
    micro_batch: int = 4
    attn: str = "sdpa"
    grad_accum: int = 1
    setup: dict[str, Any] = field(default_factory=dict)   # TrainingSetup fields a PlanRequest does not name
    headroom: float = 0.10          # CPU smoke only: a headroom near 1 makes the planner say "does not fit"

    def request(self, gpus: str, precision: str) -> PlanRequest:
        extra = "".join(f"-{v}" for v in self.setup.values())
        return PlanRequest(model=self.model, gpus=gpus, method=self.method, strategy=self.strategy,
                           grad_ckpt=self.grad_ckpt, seq_len=self.seq_len, micro_batch=self.micro_batch,
                           grad_accum=self.grad_accum, offload="none", attn=self.attn, precision=precision,
                           headroom=self.headroom,
                           name=f"acc-{self.model.split('/')[-1]}-{self.method}-{self.strategy}"
                                f"-{'ckpt' if self.grad_ckpt else 'nockpt'}-b{self.micro_batch}s{self.seq_len}"
                                f"-{self.attn}{extra}")

    def training_setup(self, req: PlanRequest) -> TrainingSetup:
        return base_setup(req).with_(**self.setup)


# Models sized to one 80-141 GB card. Indices 2 and 9 are predicted not to fit on an 80 GB H100 (they ran out of
# memory on 2026-11-23); 14-16 add the regimes issue 12 introduced (bf16 master weights, the e2e LoRA run, the
# foreach optimizer the a528b20 trainer ran).
GRID: tuple[Config, ...] = (
    Config("Qwen/Qwen2.5-0.5B-Instruct", "full", "ddp", False, 1024, 8),
    Config("Qwen/Qwen2.5-0.5B-Instruct", "full", "ddp", True, 4096, 4),
    Config("Qwen/Qwen2.5-0.5B-Instruct", "lora", "ddp", False, 2048, 8, "eager"),
    Config("Qwen/Qwen2.5-1.5B-Instruct", "full", "ddp", True, 2048, 8),
    Config("Qwen/Qwen2.5-1.5B-Instruct", "full", "zero2", False, 1024, 4),
    Config("Qwen/Qwen2.5-1.5B-Instruct", "lora", "ddp", True, 4096, 4),
    Config("Qwen/Qwen2.5-3B-Instruct", "full", "zero3", True, 2048, 4),
    Config("Qwen/Qwen2.5-3B-Instruct", "lora", "ddp", False, 1024, 8),
    Config("Qwen/Qwen2.5-3B-Instruct", "qlora", "ddp", True, 2048, 8),
    Config("Qwen/Qwen3-4B", "full", "zero2", True, 1024, 4),
    Config("Qwen/Qwen2.5-7B-Instruct", "lora", "ddp", True, 2048, 4),
    Config("Qwen/Qwen2.5-7B-Instruct", "qlora", "ddp", True, 4096, 2),
    Config("Qwen/Qwen2.5-3B-Instruct", "full", "ddp", True, 2048, 4, setup={"master_weights": "bf16"}),
    Config("meta-llama/Llama-3.1-8B", "lora", "zero2", True, 2048, 4),
    Config("Qwen/Qwen2.5-1.5B-Instruct", "full", "ddp", True, 2048, 8, setup={"master_weights": "bf16"}),
    Config("Qwen/Qwen2.5-1.5B-Instruct", "lora", "ddp", False, 1024, 8, grad_accum=2),
    Config("Qwen/Qwen2.5-0.5B-Instruct", "full", "ddp", False, 1024, 8, setup={"optimizer_impl": "foreach"}),
)
CPU_SMOKE: tuple[Config, ...] = (
    Config("scaletrain/tiny-qwen2", "full", "ddp", False, 128, 4),
    Config("scaletrain/tiny-llama", "lora", "ddp", True, 128, 4),
    Config("scaletrain/tiny-qwen2", "qlora", "ddp", False, 128, 4),
    Config("scaletrain/tiny-qwen2", "full", "ddp", False, 64, 2, headroom=0.9999),   # "does not fit"
)


def _slice(spec: str | None, n: int) -> list[int]:
    if not spec:
        return list(range(n))
    out: list[int] = []
    try:
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            out += list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ScaletrainError(f"--only {spec!r} is not a list of grid indices (e.g. 0-5,9)") from None
    bad = [i for i in out if not 0 <= i < n]
    if bad:
        raise ScaletrainError(f"--only {spec!r}: no grid index {bad[0]} (the grid has 0-{n - 1})")
    return out


def as_run(s: TrainingSetup) -> dict[str, Any]:
    """What gpu_records.setup_for needs beyond the config fields to rebuild this exact setup."""
    return {"optimizer_impl": s.optimizer_impl.value, "base_bits": s.base_bits if s.method.is_adapter else None,
            "grad_accum": s.grad_accum, "master_weights": s.master_weights.value}


def prediction(plan: Plan) -> dict[str, Any]:
    return {"fits": plan.fits, "peak_allocated_bytes": plan.memory.allocated_peak_bytes,
            "total_bytes": plan.memory.total_bytes, "peak_phase": plan.memory.peak_phase,
            "step_seconds": plan.time.step_seconds if plan.time is not None else None}


def run_config(cfg: Config, gpus: str, precision: str, steps: int, run_root: Path,
               budget_seconds: float | None) -> tuple[str, dict[str, Any]]:
    """Plan, run and classify one configuration: ("records", measured) or ("outcomes", what happened)."""
    from scaletrain.engine.doctor.diagnosis import diagnose_paths
    from scaletrain.measure.validate import ValidationFailed, ValidationTimedOut, validate

    req = cfg.request(gpus, precision)
    plan = evaluate(cfg.training_setup(req), headroom_fraction=req.headroom, name=req.name)
    s = plan.setup
    entry: dict[str, Any] = {**{k: getattr(req, k) for k in CONFIG_KEYS}, "gpu": s.hardware.gpu.key,
                             "gpu_name": s.hardware.gpu.name, "as_run": as_run(s), "source": "bench/accuracy.py",
                             "command": "python bench/accuracy.py " + " ".join(sys.argv[1:]),
                             "predicted_at_run": prediction(plan)}
    run_dir = run_root / req.name
    shutil.rmtree(run_dir, ignore_errors=True)        # the harness owns run_root: nothing older stays on the disk
    n = steps if plan.fits else min(steps, NO_FIT_STEPS)
    said = f"the plan said: {'fits' if plan.fits else 'does not fit'}, {fmt_bytes(plan.memory.total_bytes)}"
    try:
        r = validate(req, TrainOptions(), steps=n, run_dir=run_dir, plan=plan, budget_seconds=budget_seconds)
    except ValidationTimedOut as e:
        return "outcomes", {**entry, "outcome": "timed_out", "error": str(e),
                            "cause": f"did not finish within the {budget_seconds:g} s budget ({said})"}
    except ValidationFailed as e:
        d = diagnose_paths([e.run.path], with_remedies=False)
        oom = d.kind in OOM_KINDS
        return "outcomes", {**entry, "outcome": "out_of_memory" if oom else "failed", "doctor_kind": d.kind,
                            "error": str(e), "measured_fits": False if oom else None,
                            "cause": f"{'OOM' if oom else d.kind}: {d.summary} ({said})"}
    except ScaletrainError as e:
        return "outcomes", {**entry, "outcome": "error", "error": str(e), "cause": f"refused: {e}"}
    return "records", {**entry, "measured_fits": True, "memory_source": r.memory_source,
                       "measured": {"peak_allocated_bytes": r.measured_allocated_bytes,
                                    "peak_reserved_bytes": r.measured_reserved_bytes,
                                    "step_seconds": r.measured_step_seconds, "steps": r.steps},
                       # what the engine compared with: on CPU the one-process setup the profiler measures
                       "predicted_at_run": {**prediction(plan), "compared_allocated_bytes": r.predicted_allocated_bytes}}


def _key(e: dict[str, Any]) -> str:
    return json.dumps([e.get(k) for k in CONFIG_KEYS] + [e.get("gpu"), e.get("as_run")], sort_keys=True)


def machine(gpus: str) -> str:
    """The machine in the words gpu_records' table prints (GPU, driver, software versions, cores)."""
    import importlib.metadata as md
    import os

    parts = []
    try:
        import torch

        if torch.cuda.is_available():
            parts.append(f"one {torch.cuda.get_device_name(0)}")
    except ImportError:
        pass
    if not parts:
        parts.append(f"{gpus} (no CUDA)")
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            parts.append(f"driver {out.stdout.split()[0]}")
    except (OSError, subprocess.TimeoutExpired):
        pass
    parts.append(f"{os.cpu_count()} cores")
    versions = []
    for pkg in ("torch", "transformers", "peft", "accelerate", "deepspeed", "bitsandbytes"):
        try:
            versions.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            pass
    return ", ".join(parts) + "; " + ", ".join(versions) + f" (python {platform.python_version()})"


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def write_results(out: Path, data: dict[str, Any], section: str, entry: dict[str, Any]) -> None:
    """Put one config's entry in (replacing the same config from an earlier run, in either list); atomic."""
    key = _key(entry)
    for name in ("records", "outcomes"):
        data[name] = [e for e in data.get(name, []) if _key(e) != key]
    data[section].append(entry)
    atomic_write(out, json.dumps(data, indent=1) + "\n", backup=False)


def load_results(out: Path, gpus: str, steps: int, budget: float | None) -> dict[str, Any]:
    if out.exists():
        try:
            data = json.loads(out.read_text())
        except ValueError as e:
            raise ScaletrainError(f"{out} is not JSON ({e}); move it aside or give another --out") from None
        if not isinstance(data, dict) or "records" not in data:
            raise ScaletrainError(f"{out} is not an accuracy results file; give another --out")
    else:
        data = {"records": [], "outcomes": []}
    data.setdefault("outcomes", [])
    data["machine"] = machine(gpus)
    data["measured_with"] = (f"python bench/accuracy.py --steps {steps} --budget-seconds {budget:g} "
                             f"(project commit {_commit()}), one config per process" if budget else
                             f"python bench/accuracy.py --steps {steps} (project commit {_commit()})")
    data["source"] = f"bench/results/{out.name}" if out.parent == RESULTS else str(out)
    return data


def summary_line(section: str, e: dict[str, Any]) -> str:
    head = (f"{e['model']} {e['method']} {e['strategy']} {'ckpt' if e['grad_ckpt'] else 'no-ckpt'} "
            f"b{e['micro_batch']}×s{e['seq_len']}")
    if section == "outcomes":
        return f"{head}: {e['outcome']}: {e['cause']}"
    m, p = e["measured"], e["predicted_at_run"]
    mem = (p["compared_allocated_bytes"] - m["peak_allocated_bytes"]) / m["peak_allocated_bytes"]
    t = (p["step_seconds"] - m["step_seconds"]) / m["step_seconds"] if m["step_seconds"] and p["step_seconds"] else None
    fit = "" if p["fits"] else " (the plan said it would not fit; it ran)"
    return (f"{head}: memory {100 * mem:+.1f}%, step time " + ("n/a" if t is None else f"{100 * t:+.1f}%") + fit)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", default="auto", help="--gpus value for one card, e.g. 1xH100 (default: detect)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--only", help="grid indices, e.g. 0-5,9 (one index per process is the recommended use)")
    ap.add_argument("--budget-seconds", type=float, default=DEFAULT_BUDGET_SECONDS,
                    help="per config: the run is stopped and recorded as timed out after this long")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny configs on 2 CPU processes (no GPU)")
    ap.add_argument("--out", help="result file (default bench/results/<gpu>-<date>.json)")
    ap.add_argument("--run-root", default="/tmp/scaletrain-accuracy")
    args = ap.parse_args(argv)
    try:
        grid, gpus, precision = (CPU_SMOKE, "2xCPU", "bf16") if args.cpu_smoke else (GRID, args.gpu, "bf16")
        indices = _slice(args.only, len(grid))
        if args.budget_seconds is not None and not args.budget_seconds > 0:
            raise ScaletrainError(f"--budget-seconds must be positive (got {args.budget_seconds})")
        if gpus == "auto":
            from scaletrain.engine.devices.detect import hardware_from_detection
            gpus = "1x" + hardware_from_detection().gpu.key
        key = "cpu-smoke" if args.cpu_smoke else gpus.split("x", 1)[-1].lower()
        out = Path(args.out) if args.out else RESULTS / f"{key}-{date.today().isoformat()}.json"
        data = load_results(out, gpus, args.steps, args.budget_seconds)
        for i in indices:
            section, entry = run_config(grid[i], gpus, precision, args.steps, Path(args.run_root),
                                        args.budget_seconds)
            entry["grid_index"] = i
            write_results(out, data, section, entry)
            print(f"[{i}] {summary_line(section, entry)}", flush=True)
    except ScaletrainError as e:
        print(f"accuracy: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU accuracy sweep: predicted vs measured peak memory and step time over a grid of configurations.

Run on one H100/H200 (the device tool), in as few invocations as possible:

    python bench/accuracy.py                 # the full sweep (≥ 12 configs), writes bench/results/<gpu>-<date>.json
    python bench/accuracy.py --only 0-5      # a slice of the grid (indices), appended to the same file
    python bench/accuracy.py --cpu-smoke     # two tiny configs on 2 CPU processes: checks the harness end to end

Each configuration is planned by the engine, run for --steps optimizer steps by the bundled trainer through
`scaletrain validate`'s path (random-init weights built from the catalog config), and recorded with the fields
the README table reads: gpu, config fields, predicted_peak_bytes (total − overhead), measured_peak_bytes
(max_memory_allocated), measured_reserved_bytes, predicted_step_seconds, measured_step_seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.plan.request import PlanRequest
from scaletrain.engine.run.options import TrainOptions
from scaletrain.trainer.validate import validate

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Config:
    model: str
    method: str = "full"
    strategy: str = "ddp"           # single GPU: DDP-single (plain), ZeRO-2 / ZeRO-3 on one rank
    grad_ckpt: bool = False
    seq_len: int = 1024
    micro_batch: int = 4
    attn: str = "sdpa"

    def request(self, gpus: str, precision: str = "bf16") -> PlanRequest:
        return PlanRequest(model=self.model, gpus=gpus, method=self.method, strategy=self.strategy,
                           grad_ckpt=self.grad_ckpt, seq_len=self.seq_len, micro_batch=self.micro_batch,
                           grad_accum=1, offload="none", attn=self.attn, precision=precision,
                           name=f"acc-{self.model.split('/')[-1]}-{self.method}-{self.strategy}")


# Models sized to one 80-141 GB card; full fine-tuning of 7B needs ZeRO-3 + checkpointing to fit on 80 GB.
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
    Config("Qwen/Qwen2.5-7B-Instruct", "full", "zero3", True, 512, 2),
    Config("meta-llama/Llama-3.1-8B", "lora", "zero2", True, 2048, 4),
)
CPU_SMOKE: tuple[Config, ...] = (
    Config("scaletrain/tiny-qwen2", "full", "ddp", False, 128, 4),
    Config("scaletrain/tiny-llama", "lora", "ddp", True, 128, 4),
)


def _slice(spec: str | None, n: int) -> list[int]:
    if not spec:
        return list(range(n))
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return [i for i in out if 0 <= i < n]


def record(cfg: Config, gpus: str, precision: str, steps: int, run_root: Path) -> dict:
    req = cfg.request(gpus, precision)
    base = {"model": cfg.model, "method": cfg.method, "strategy": cfg.strategy, "grad_ckpt": cfg.grad_ckpt,
            "seq_len": cfg.seq_len, "micro_batch": cfg.micro_batch, "attn": cfg.attn, "precision": precision}
    try:
        r = validate(req, TrainOptions(), steps=steps, run_dir=run_root / req.name)
    except ScaletrainError as e:   # e.g. qlora without bitsandbytes: recorded, not fatal to the sweep
        return {**base, "error": str(e)}
    s = r.plan.setup
    return {**base, "gpu": s.hardware.gpu.key, "gpu_name": s.hardware.gpu.name,
            "predicted_peak_bytes": r.predicted_allocated_bytes, "measured_peak_bytes": r.measured_allocated_bytes,
            "predicted_total_bytes": r.plan.memory.total_bytes, "measured_reserved_bytes": r.measured_reserved_bytes,
            "predicted_step_seconds": r.predicted_step_seconds, "measured_step_seconds": r.measured_step_seconds,
            "memory_source": r.memory_source, "steps": r.steps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", default="auto", help="--gpus value for one card, e.g. 1xH100 (default: detect)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--only", help="grid indices, e.g. 0-5,9")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny configs on 2 CPU processes (no GPU)")
    ap.add_argument("--out", help="result file (default bench/results/<gpu>-<date>.json)")
    ap.add_argument("--run-root", default="/tmp/scaletrain-accuracy")
    args = ap.parse_args(argv)
    grid, gpus, precision = (CPU_SMOKE, "2xCPU", "fp32") if args.cpu_smoke else (GRID, args.gpu, "bf16")
    if gpus == "auto":
        from scaletrain.engine.devices.detect import hardware_from_detection
        gpus = "1x" + hardware_from_detection().gpu.key
    records = [record(grid[i], gpus, precision, args.steps, Path(args.run_root)) for i in _slice(args.only, len(grid))]
    key = "cpu-smoke" if args.cpu_smoke else gpus.split("x", 1)[-1]
    out = Path(args.out) if args.out else RESULTS / f"{key}-{date.today().isoformat()}.json"
    old = json.loads(out.read_text())["records"] if out.exists() else []
    done = {json.dumps({k: r[k] for k in ("model", "method", "strategy", "grad_ckpt", "seq_len")}) for r in records}
    kept = [r for r in old
            if json.dumps({k: r[k] for k in ("model", "method", "strategy", "grad_ckpt", "seq_len")}) not in done]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": "python bench/accuracy.py " + " ".join(argv or sys.argv[1:]),
                               "records": kept + records}, indent=1) + "\n")
    for r in records:
        if "error" in r:
            print(f"{r['model']} {r['method']} {r['strategy']}: {r['error']}")
            continue
        mem = (r["predicted_peak_bytes"] - r["measured_peak_bytes"]) / r["measured_peak_bytes"]
        t = (r["predicted_step_seconds"] - r["measured_step_seconds"]) / r["measured_step_seconds"]
        print(f"{r['model']} {r['method']} {r['strategy']} ckpt={r['grad_ckpt']} s={r['seq_len']}: "
              f"memory {100 * mem:+.1f}%, step time {100 * t:+.1f}%")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

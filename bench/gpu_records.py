"""Measured GPU records, re-predicted by the current model: bench/results/h100-2026-11-23.json.

The records are facts measured on one H100 on 2026-11-23 (../shared/measurements/h100-2026-11-23/: the accuracy
sweep and the e2e LoRA run). They are copied into the results file once (`--import DIR`) with their source named,
so the repository alone can re-predict them; every later run only refreshes the predictions:

    .venv/bin/python bench/gpu_records.py --import ../shared/measurements/h100-2026-11-23   # once
    .venv/bin/python bench/gpu_records.py                                                   # re-predict

Each record keeps what the stack at the measured commit really ran (`as_run`): torch.optim.AdamW left to its
default (foreach on CUDA), and random-init LoRA bases built in fp32 (transformers' from_config default; the
trainer loads pretrained bases in bf16, and builds random-init ones in bf16 since issue 12). docs/accuracy.md's GPU
table comes from this file (bench/readme_tables.py).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from scaletrain.engine.plan.plan import evaluate
from scaletrain.engine.request.request import PlanRequest, base_setup

RESULTS = Path(__file__).resolve().parent / "results" / "h100-2026-11-23.json"
AS_RUN_NOTE = ("At a528b20 the bundled trainer ran torch.optim.AdamW with its default implementation (foreach on "
               "CUDA) and built random-init LoRA bases with transformers' from_config default dtype (fp32) under "
               "accelerate's bf16 autocast; each record is re-predicted for that stack (`as_run`).")
CONFIG_KEYS = ("model", "method", "strategy", "grad_ckpt", "seq_len", "micro_batch", "attn", "precision")


def _as_run(rec: dict) -> dict:
    return {"optimizer_impl": "foreach", "base_bits": 32 if rec["method"] == "lora" else None,
            "grad_accum": rec.get("grad_accum", 1)}


def import_shared(folder: Path) -> dict:
    """Copy the measured values (as measured) from the shared folder into the results structure."""
    sweep = json.loads((folder / "accuracy-sweep.json").read_text())
    records, outcomes = [], []
    for r in sweep["records"]:
        cfg = {k: r[k] for k in CONFIG_KEYS}
        if "measured_peak_bytes" in r:
            records.append({**cfg, "as_run": _as_run(r), "source": "accuracy-sweep.json",
                            "measured": {"peak_allocated_bytes": r["measured_peak_bytes"],
                                         "peak_reserved_bytes": r["measured_reserved_bytes"],
                                         "step_seconds": r["measured_step_seconds"], "steps": r["steps"]}})
        else:
            outcomes.append({**cfg, "as_run": _as_run(r), "source": "accuracy-sweep.json", "error": r["error"],
                             "cause": r["cause"]})
    e2e = _e2e_record(folder / "e2e-headless-lora-1.5b.txt")
    if e2e is not None:
        records.append(e2e)
    return {"machine": sweep["machine"], "measured_with": sweep["command"],
            "source": f"../shared/measurements/{folder.name}/", "as_run_note": AS_RUN_NOTE,
            "records": records, "outcomes": outcomes}


def _e2e_record(path: Path) -> dict | None:
    """The headless LoRA run: the last metrics.jsonl lines printed in the transcript (steady-state step)."""
    if not path.is_file():
        return None
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.startswith('{"step"')]
    if not lines:
        return None
    last = lines[-1]
    mem = last["peak_memory"][0]
    steps = sorted(x["step_seconds"] for x in lines)
    cfg = {"model": "Qwen/Qwen2.5-1.5B-Instruct", "method": "lora", "strategy": "ddp", "grad_ckpt": False,
           "seq_len": 1024, "micro_batch": 8, "attn": "sdpa", "precision": "bf16", "grad_accum": 2}
    header = path.read_text()
    assert re.search(r"micro 8 × accum 2", header) and "seq 1024" in header and "lora" in header
    return {**{k: cfg[k] for k in CONFIG_KEYS}, "as_run": _as_run(cfg), "source": path.name,
            "measured": {"peak_allocated_bytes": mem["allocated_bytes"], "peak_reserved_bytes": mem["reserved_bytes"],
                         "step_seconds": statistics.median(steps), "steps": last["step"]}}


def setup_for(rec: dict):
    """The setup a record ran: its config fields on its GPU (records without "gpu" are the 2026-11-23 H100's), then
    `as_run` (bench/accuracy.py writes the same fields; master_weights is absent from the older records: fp32)."""
    a = rec["as_run"]
    req = PlanRequest(model=rec["model"], gpus=f"1x{rec.get('gpu') or 'H100-SXM'}", method=rec["method"],
                      strategy=rec["strategy"], grad_ckpt=rec["grad_ckpt"], seq_len=rec["seq_len"],
                      micro_batch=rec["micro_batch"], grad_accum=a["grad_accum"], offload="none", attn=rec["attn"],
                      precision=rec["precision"])
    s = base_setup(req).with_(optimizer_impl=a["optimizer_impl"], master_weights=a.get("master_weights") or "fp32")
    return s.with_(base_bits=a["base_bits"]) if a.get("base_bits") else s


def repredict(data: dict) -> dict:
    for r in data["records"]:
        plan = evaluate(setup_for(r))
        m, t = plan.memory, plan.time
        r["predicted"] = {"peak_allocated_bytes": m.allocated_peak_bytes, "total_bytes": m.total_bytes,
                          "peak_phase": m.peak_phase, "step_seconds": t.step_seconds,
                          "host_bound": t.micro.host_bound,
                          "breakdown_seconds": {k: round(v, 6) for k, v in t.breakdown().items()}}
        r["memory_error"] = m.allocated_peak_bytes / r["measured"]["peak_allocated_bytes"] - 1
        r["time_error"] = t.step_seconds / r["measured"]["step_seconds"] - 1
    for o in data["outcomes"]:
        try:
            plan = evaluate(setup_for(o))
            o["predicted"] = {"fits": plan.memory.fits, "total_bytes": plan.memory.total_bytes,
                              "peak_phase": plan.memory.peak_phase}
        except Exception as e:  # a config the engine refuses is recorded as such
            o["predicted"] = {"error": str(e)}
    mem = [r["memory_error"] for r in data["records"]]
    tim = [r["time_error"] for r in data["records"]]
    data["summary"] = {
        "records": len(mem),
        "memory_abs_error_median": statistics.median(abs(x) for x in mem), "memory_abs_error_max": max(map(abs, mem)),
        "memory_error_min": min(mem),
        "time_abs_error_median": statistics.median(abs(x) for x in tim), "time_abs_error_max": max(map(abs, tim)),
    }
    data["predicted_with"] = "the current engine (python bench/gpu_records.py)"
    return data


def table(data: dict) -> str:
    out = [f"Measured on {data['machine']} ({data['measured_with']}; source `{data['source']}`). "
           f"Predictions: {data['predicted_with']}.", "",
           "| config | measured peak | predicted | error | measured step | predicted | error |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in data["records"]:
        cfg = (f"{r['model'].split('/')[-1]} {r['method']}{' (fp32 base)' if r['as_run'].get('base_bits') == 32 else ''} "
               f"{r['strategy']} {'ckpt' if r['grad_ckpt'] else 'no-ckpt'} b{r['micro_batch']}×s{r['seq_len']}"
               + (f" ga{r['as_run']['grad_accum']}" if r['as_run']['grad_accum'] > 1 else ""))
        out.append(f"| {cfg} | {r['measured']['peak_allocated_bytes'] / 2**30:.2f} GiB | "
                   f"{r['predicted']['peak_allocated_bytes'] / 2**30:.2f} GiB | {100 * r['memory_error']:+.1f}% | "
                   f"{r['measured']['step_seconds'] * 1000:.0f} ms | {r['predicted']['step_seconds'] * 1000:.0f} ms | "
                   f"{100 * r['time_error']:+.0f}% |")
    s = data["summary"]
    out += ["", f"Memory |error| median **{100 * s['memory_abs_error_median']:.1f}%**, max "
            f"**{100 * s['memory_abs_error_max']:.1f}%** (lowest {100 * s['memory_error_min']:+.1f}%); step time |error| "
            f"median **{100 * s['time_abs_error_median']:.0f}%**, max **{100 * s['time_abs_error_max']:.0f}%**, "
            f"over {s['records']} runs."]
    fails = [o for o in data["outcomes"] if "predicted" in o and "fits" in o["predicted"]]
    if fails:
        out += ["", "| config that did not finish | what happened | scaletrain now predicts |", "|---|---|---|"]
        for o in fails:
            p = o["predicted"]
            out.append(f"| {o['model'].split('/')[-1]} {o['method']} {o['strategy']} "
                       f"{'ckpt' if o['grad_ckpt'] else 'no-ckpt'} b{o['micro_batch']}×s{o['seq_len']} {o['attn']} | "
                       f"{o['cause']} | {'fits' if p['fits'] else 'does not fit'} "
                       f"({p['total_bytes'] / 2**30:.1f} GiB, peak in {p['peak_phase']}) |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--import", dest="folder", help="copy the measured records from this shared folder first")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    out = Path(args.out)
    data = import_shared(Path(args.folder)) if args.folder else json.loads(out.read_text())
    data = repredict(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())

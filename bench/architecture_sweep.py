"""Every causal LM the installed transformers ships, planned and measured: the traced path against full builds.

For every model_type in transformers' causal-LM mapping whose tiny config (measure/tiny_configs.py: the config
class's defaults, shrunk) builds as a causal LM on CPU: the engine's prediction (analytic where scaletrain knows
the layout, traced otherwise) against torch.profiler's peak of one real fp32 AdamW step of the full small build
(measure/step.py), full and LoRA, checkpointing on and off; parameters and trainable parameters compared
exactly. A model_type that does not build, or that the engine refuses, is listed with its one-line reason.

    PYTHONPATH=src .venv/bin/python bench/architecture_sweep.py [--only a,b] [--subset N] [--out FILE]

Each model_type runs in its own process (a hang or a crash is that family's row, not the sweep's end), tracing in
that process with a fresh trace cache. Results: bench/results/architecture_sweep.json (rows, versions, machine),
and a summary docs/accuracy.md quotes (bench/readme_tables.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "architecture_sweep.json"
B, S, RANK = 2, 128, 8
# a family measured at a shape of its own (its methods not named there: not measured), and why: torch.profiler's
# record of the step is what outgrows the machine
SHAPES = {"zamba": ({"full": (2, 64)},
                   "its shrunk config builds only at the default depth (76 layers: its shared attention block is tied "
                   "across hybrid layers, and the first 6 layers hold one), and torch.profiler's record of a step of "
                   "76 layers of transformers' per-position mamba loop outgrew this 24 GiB machine at 2 x 128 (killed, "
                   "-9); LoRA + checkpointing is not measured: at 2 x 64 its recompute, the loop run again, took the "
                   "profiled step past 20 GB, and at 2 x 32 its trace ran out of memory at 18 GiB")}
CASES = (("full", False), ("full", True), ("lora", False), ("lora", True))
# the broad sweep's default on a 2-core machine: each method and each checkpointing setting once (the grid above
# for the families the issue names and the CI subset: --cases grid)
DIAGONAL = (("full", False), ("lora", True))
NAMED = ("deepseek_v3", "jamba", "qwen3_next", "llama4_text", "glm4_moe", "ernie4_5_moe", "phimoe")
FAMILY_TIMEOUT_S = 900
# a fixed CI subset: one of each layer-stack shape (dense first then MoE, interleaved MoE, mamba/attention/MoE,
# linear/full attention, sliding pattern, plain) — tests/trainer/test_architecture_sweep.py runs it
CI_SUBSET = ("deepseek_v3", "jamba", "qwen3_next", "llama4_text", "phimoe", "starcoder2")


def model_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def one_family(model_type: str, cases=CASES, reuse: dict | None = None, config: dict | None = None,
               loss: str = "standard") -> dict:
    """Every case of one model_type, in this process (the trace runs in it too). `reuse`: an earlier row of the same
    config whose measured peaks stand (the engine's side is planned again; for iterating on the engine). `config`:
    this config.json dict instead of the sweep's shrunk one (a test's smaller build). `loss`: "chunked" plans and
    measures every case with the trainer's chunked loss (standard: the model's own, and the chunked one for a family
    whose own loss fails on text)."""
    import warnings

    warnings.simplefilter("ignore")
    from scaletrain.engine.catalog.architectures import arch_from_config
    from scaletrain.engine.catalog.hardware import parse_gpus
    from scaletrain.engine.errors import ScaletrainError
    from scaletrain.engine.estimate.memory import estimate_memory
    from scaletrain.engine.estimate.setup import TrainingSetup
    from scaletrain.engine.estimate.traced_blocks import unmodeled_checkpointing
    from scaletrain.engine.vocabulary import LossImpl
    from scaletrain.measure.trace_refusals import OWN_LOSS_FAILS
    from scaletrain.measure.step import measure_step
    from scaletrain.measure.tiny_configs import build_error, config_dict

    row: dict = {"model_type": model_type}
    by_method, why_shape = SHAPES.get(model_type, ({}, ""))
    if why_shape:
        row["shape"] = {**{m: list(bs) for m, bs in by_method.items()}, "why": why_shape}
        row["not_measured"] = [[m, ck] for m, ck in cases if m not in by_method]
        cases = tuple((m, ck) for m, ck in cases if m in by_method)
    try:
        cfg = config if config is not None else config_dict(model_type)
    except Exception as e:          # noqa: BLE001 - transformers' own refusal is the row
        return {**row, "refused": "config: " + _line(e)}
    why = build_error(cfg)
    if why:                         # not the engine's refusal: transformers does not build this shrunk config
        return {**row, "refused": "config: transformers does not build it as a causal LM: " + why}
    row["config"] = cfg
    try:
        t0 = time.perf_counter()
        arch = arch_from_config(cfg, f"tiny-{model_type}")
        attn = "sdpa" if "sdpa" in arch.attention_implementations else "eager"   # the model class's own kernels
        row["attn"] = attn
        if not arch.can_checkpoint:     # jetmoe, cpmant: none to turn on; gemma3n: refused (UNMODELED_CHECKPOINTING)
            cases = tuple(dict.fromkeys((m, False) for m, _ in cases))
            row["no_checkpointing"] = True
        setups = [TrainingSetup(model=arch, hardware=parse_gpus("1xCPU"), method=m, lora_rank=RANK, strategy="ddp",
                                precision="fp32", optimizer_impl="for-loop", attn=attn, grad_ckpt=ck,
                                micro_batch=by_method.get(m, (B, S))[0], seq_len=by_method.get(m, (B, S))[1],
                                device="cpu", loss=LossImpl(loss)) for m, ck in cases]
        if loss != "standard":
            row["loss"] = loss
        try:
            refused = _refused(setups)
        except ScaletrainError as e:
            if OWN_LOSS_FAILS not in str(e) or loss != "standard":
                raise
            # transformers' own loss fails on text (git's): the family is planned and measured with the loss that
            # runs, the trainer's chunked one, and the standard loss's refusal is kept in its row
            row["loss"], row["standard_loss_refused"] = "chunked", _line(e)
            setups = [x.with_(loss=LossImpl.CHUNKED) for x in setups]
            refused = _refused(setups)
        why = next((w for w in (unmodeled_checkpointing(x) for x in setups if id(x) not in refused) if w), None)
        if why:                         # a looped stack's checkpointing: refused from its trace (traced_blocks.py)
            cases = tuple(dict.fromkeys((m, False) for m, _ in cases))
            row["no_checkpointing"] = True
            setups = [next(x for x in setups if x.method == m).with_(grad_ckpt=False) for m, _ in cases]
            refused = _refused(setups)
        row["trace_seconds"] = round(time.perf_counter() - t0, 2)
        row["memory_source"] = arch.memory_source
        if arch.trace is not None:
            row["layer_kinds"] = len(arch.trace.get("kinds", ()))
            row["slice_layers"] = arch.trace.get("slice_layers")
    except ScaletrainError as e:
        return {**row, "refused": "engine: " + _line(e)}
    except Exception as e:          # noqa: BLE001
        return {**row, "refused": "engine bug: " + _line(e)}
    row["cases"] = []
    for (method, ckpt), s in zip(cases, setups):
        case = {"method": method, "grad_ckpt": ckpt}
        if id(s) in refused:        # this case's trace alone (reformer's LoRA: no adapter gets a gradient)
            row["cases"].append({**case, "refused": "engine: " + refused[id(s)]})
            continue
        try:
            predicted = estimate_memory(s).allocated_peak_bytes
            trainable = s.trainable_params
            m = _reused(reuse, cfg, method, ckpt, row["attn"], (s.micro_batch, s.seq_len), row.get("loss"))
            if m is not None and method != "full" and m.trainable_params != trainable:
                m = None        # peft's count differs: other LoRA targets than the recorded step's, measured again
            m = m or measure_step(cfg, method=method, lora_rank=RANK, lora_alpha=2 * RANK,
                             lora_targets=s.lora_targets if method != "full" else None, micro_batch=s.micro_batch,
                             seq_len=s.seq_len,
                             grad_ckpt=ckpt, attn=row["attn"], precision="fp32", device="cpu",
                             optimizer_impl="for-loop", loss=row.get("loss", "standard"))
        except ScaletrainError as e:
            case["refused"] = "engine: " + _line(e)
        except Exception as e:      # noqa: BLE001
            case["refused"] = "measure: " + _line(e)
        else:
            lora = trainable if method != "full" else 0
            case.update(predicted_bytes=predicted, measured_bytes=m.peak_allocated_bytes,
                        error=round((predicted - m.peak_allocated_bytes) / m.peak_allocated_bytes, 5),
                        params_exact=(arch.params + lora, trainable) == (m.params, m.trainable_params),
                        params=[arch.params + lora, m.params], trainable=[trainable, m.trainable_params])
        row["cases"].append(case)
    return row


def _refused(setups: list) -> dict[int, str]:
    """The cases whose own trace is refused (by id), with the line (traced_blocks.refused_traces); every case
    refused: the family's refusal, raised."""
    from scaletrain.engine.estimate.traced_blocks import refused_traces

    return {k: _line(v) for k, v in refused_traces(setups).items()}


def _reused(row: dict | None, cfg: dict, method: str, ckpt: bool, attn: str, shape: tuple[int, int] = (B, S),
            loss: str | None = None):
    from types import SimpleNamespace

    if not row or row.get("config") != json.loads(json.dumps(cfg)) or row.get("attn", "sdpa") != attn:
        return None
    if row.get("loss") != loss:
        return None
    if tuple((row.get("shape") or {}).get(method, (B, S))) != shape:
        return None
    for c in row.get("cases", []):
        if (c["method"], c["grad_ckpt"]) == (method, ckpt) and "measured_bytes" in c:
            return SimpleNamespace(peak_allocated_bytes=c["measured_bytes"], params=c["params"][1],
                                   trainable_params=c["trainable"][1])
    return None


def timed_out_row(row: dict) -> bool:
    """A family the sweep or its trace gave up on for time (a loaded machine), not one the engine refused."""
    return "ran past" in str(row.get("refused", ""))


def _line(e: BaseException) -> str:
    return (" ".join(str(e).split()) or type(e).__name__)[:300]


def run_isolated(model_type: str, cache: str, reuse: str | None = None, cases: str = "grid",
                 timeout_s: int = FAMILY_TIMEOUT_S, loss: str = "standard") -> dict:
    env = dict(os.environ, SCALETRAIN_CACHE=cache, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", model_type, "--cases", cases, "--loss", loss]
    cmd += ["--reuse", reuse] if reuse else []
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"model_type": model_type, "refused": f"sweep: ran past {timeout_s} s"}
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode != 0 or not lines:
        err = [x for x in r.stderr.splitlines() if x.strip()]
        return {"model_type": model_type, "refused": f"sweep: exit {r.returncode}: {(err or [''])[-1][:300]}"}
    return json.loads(lines[-1])


def summary(rows: list[dict]) -> dict:
    cases = [c for r in rows for c in r.get("cases", []) if "error" in c]
    errs = [c["error"] for c in cases]
    refused = [r for r in rows if "refused" in r]
    traced_rows = [r for r in rows if r.get("memory_source") == "traced"]
    return {"model_types": len(rows), "planned": len(rows) - len(refused), "traced": len(traced_rows),
            "refused": len(refused), "cases": len(cases),
            "median_abs_error": round(statistics.median(abs(e) for e in errs), 5) if errs else None,
            "max_over": round(max(errs), 5) if errs else None, "max_under": round(min(errs), 5) if errs else None,
            "under_2pct": sum(1 for e in errs if e < -0.02), "over_5pct": sum(1 for e in errs if e > 0.05),
            "params_exact": sum(1 for c in cases if c.get("params_exact")),
            "case_refusals": sum(1 for r in rows for c in r.get("cases", []) if "refused" in c)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--only", help="comma-separated model_types")
    p.add_argument("--ci", action="store_true", help="the fixed CI subset")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--reuse", help="an earlier results file whose measured peaks stand for unchanged configs")
    p.add_argument("--resume", action="store_true", help="keep the rows already in --out, run the rest")
    p.add_argument("--cache", help="keep each family's trace cache under this folder (re-planning reuses it)")
    p.add_argument("--cases", choices=("grid", "diagonal"), default="grid",
                   help="grid: full and LoRA × checkpointing off and on; diagonal: full, and LoRA checkpointed "
                        "(the named families always run the grid)")
    p.add_argument("--loss", choices=("standard", "chunked"), default="standard",
                   help="the loss every case is planned and measured with (standard: the model's own; a family "
                        "whose own loss fails on text runs the chunked one)")
    p.add_argument("--jobs", type=int, default=1, help="families measured at once")
    p.add_argument("--family-timeout", type=int, default=FAMILY_TIMEOUT_S,
                   help="seconds one family may take (its trace and its measured steps) before it is left for later")
    a = p.parse_args(argv)
    if a.one:
        old = json.loads(Path(a.reuse).read_text()) if a.reuse else {"rows": []}
        row = next((r for r in old["rows"] if r["model_type"] == a.one), None)
        cases = CASES if a.cases == "grid" or a.one in NAMED else DIAGONAL
        print(json.dumps(one_family(a.one, cases, reuse=row, loss=a.loss)))
        return 0
    sys.path.insert(0, str(HERE))
    from machine import machine

    from scaletrain.engine.probes import TRACE_FORMAT

    types = a.only.split(",") if a.only else (list(CI_SUBSET) if a.ci else model_types())
    import importlib.metadata as md

    done, timed_out_before = {}, set()
    if a.resume and Path(a.out).exists():
        previous = json.loads(Path(a.out).read_text())
        done = {r["model_type"]: r for r in previous["rows"] if not timed_out_row(r)}
        timed_out_before = set(previous.get("timed_out", ()))
    reusable = {r["model_type"] for r in json.loads(Path(a.reuse).read_text())["rows"]} if a.reuse else set()
    rows = [done[t] for t in types if t in done]
    t0 = time.time()
    # the named families first; what an earlier run timed out on last (it may again), and of the rest, families
    # whose measured peaks are reused first (a trace each, no step measured): more rows per hour of a resumed run
    todo = [t for t in sorted(types, key=lambda t: (t in timed_out_before, t not in NAMED, t not in reusable, t))
            if t not in done]
    lock = threading.Lock()
    out: dict = {}

    timed_out: list[str] = []

    def one(mt: str) -> None:
        row = run_isolated(mt, str(Path(a.cache or tmp) / mt), a.reuse, a.cases, a.family_timeout, a.loss)
        with lock:
            if timed_out_row(row):      # a loaded machine's timeout is no verdict: left in not_run for --resume
                timed_out.append(mt)
            else:
                rows.append(row)
            errs = [f"{c['method']}{'+ckpt' if c['grad_ckpt'] else ''} {c['error']:+.1%}"
                    for c in row.get("cases", []) if "error" in c]
            print(f"[{len(rows)}/{len(types)}] {mt}: {row.get('refused') or ', '.join(errs)}", flush=True)
            out.update({"machine": machine(), "seconds": round(time.time() - t0),
                        "versions": {d: md.version(d) for d in ("torch", "transformers", "peft")},
                        "trace_format": TRACE_FORMAT,
                        "setup": {"micro_batch": B, "seq_len": S, "lora_rank": RANK, "precision": "fp32",
                                  "attn": "sdpa (eager where the model class has no sdpa)", "optimizer": "adamw for-loop",
                                  "cases": a.cases, "loss": a.loss,
                                  "grid_for": list(NAMED)},
                        "summary": summary(rows), "rows": sorted(rows, key=lambda r: r["model_type"]),
                        "not_run": sorted(set(types) - {r["model_type"] for r in rows}),
                        "timed_out": sorted(timed_out)})
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(out, indent=1) + "\n")     # after every family: a partial run counts

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max(a.jobs, 1)) as pool:
        list(pool.map(one, todo))
    print(json.dumps(out.get("summary", {})))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cases nobody designed: random setups planned by the engine and measured whole by torch.profiler (one AdamW step),
so the memory model meets regimes, shapes and families its own tables do not hold.

    python bench/random_cases.py --seed 31 --cases 6 --catalog     # the catalog's tiny models (analytic + traced)
    python bench/random_cases.py --seed 12 --cases 8 --sweep       # the sweep's families in 16-bit regimes
    python bench/random_cases.py --seed 77 --cases 4 --sweep --loss chunked   # the same draws, the chunked loss

--catalog draws a tiny catalog model, method, precision regime (fp32, bf16 autocast over fp32 weights, bf16 weights,
LoRA on a bf16 base, LoRA on an fp32 base under autocast), checkpointing, shape, attention and (MoE) experts
implementation; --sweep draws a family of bench/results/architecture_sweep.json (its shrunk config) and a 16-bit
regime. One JSON line per case on stdout (the case, predicted and measured peak, error or the refusal). Run a few
cases per process: after about 35 builds in one process peft's get_peft_model once aborted in a C extension
("none_dealloc"). A case that finds something becomes a row of bench/cpu_groundtruth.py; what each run found is in
bench/results/random_cases-vm.json."""

from __future__ import annotations

import argparse
import json
import random
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MOE = ("qwen3-moe", "qwen2-moe", "mixtral", "olmoe", "gpt-oss")
DENSE = ("llama", "qwen2", "qwen3", "gemma3", "olmo2", "mistral", "phi3", "granite", "glm4")
REGIMES = (dict(precision="fp32"), dict(precision="bf16"), dict(precision="bf16", master_weights="bf16"),
           dict(method="lora", precision="bf16"), dict(method="lora", precision="bf16", base_bits=32),
           dict(method="lora"))
SHAPES = ((1, 512), (2, 256), (4, 128))
DRAWN: dict = {}        # the case being run, for the line of one that is refused
LOSS = {"loss": None}   # --loss: every case's loss (None: the standard one, or the row's own: git's chunked)


def catalog_case(rng: random.Random) -> dict:
    import cpu_groundtruth as G

    fam = rng.choice(MOE + DENSE)
    kw = {"method": "full", **rng.choice(REGIMES), "grad_ckpt": rng.random() < 0.5}
    kw["micro_batch"], kw["seq_len"] = rng.choice(SHAPES)
    kw["attn"] = "eager" if fam == "gpt-oss" else rng.choice(["sdpa", "eager"])
    overrides = ()
    if fam in MOE:
        kw["experts_impl"] = rng.choice(["grouped_mm", "eager", "batched_mm"])
        overrides = G._MOE4
    if LOSS["loss"]:
        kw["loss"] = LOSS["loss"]
    DRAWN["case"] = f"tiny-{fam} {kw}"
    row = G.run_case(G.Case(f"scaletrain/tiny-{fam}", overrides=overrides, **kw))
    return {"case": row["case"], "predicted": row["predicted_peak_bytes"], "measured": row["measured_peak_bytes"],
            "error": round(row["error"], 5)}


def sweep_case(rng: random.Random) -> dict:
    from architecture_sweep import RANK, RESULTS
    from scaletrain.engine.catalog.architectures import arch_from_config
    from scaletrain.engine.catalog.hardware import parse_gpus
    from scaletrain.engine.estimate.memory import estimate_memory
    from scaletrain.engine.estimate.setup import TrainingSetup
    from scaletrain.measure.step import measure_step

    rows = [r for r in json.loads(RESULTS.read_text())["rows"] if r.get("cases")]
    r = rng.choice(rows)
    # (method, master weights, base bits, measure/step.py's precision)
    method, master, bits, measured_as = rng.choice([("full", "fp32", 16, "bf16"), ("full", "bf16", 16, "bf16-pure"),
                                                    ("lora", "fp32", 16, "bf16-autocast"), ("lora", "fp32", 32, "bf16")])
    ckpt = rng.random() < 0.5
    b, S = rng.choice(((1, 128), (2, 128), (1, 256), (2, 64)))
    loss = LOSS["loss"] or r.get("loss", "standard")
    case = (f"{r['model_type']} {method} {measured_as} {'ckpt' if ckpt else 'no-ckpt'} b{b}×s{S}"
            + (f" loss={loss}" if loss != "standard" else ""))
    DRAWN["case"] = case
    setup = TrainingSetup(model=arch_from_config(r["config"], r["model_type"]), hardware=parse_gpus("1xCPU"),
                          method=method, lora_rank=RANK, precision="bf16", master_weights=master, base_bits=bits,
                          optimizer_impl="for-loop", attn=r["attn"], grad_ckpt=ckpt, micro_batch=b, seq_len=S,
                          device="cpu", loss=loss)
    predicted = estimate_memory(setup).allocated_peak_bytes
    m = measure_step(r["config"], method=method, lora_rank=RANK, lora_alpha=2 * RANK,
                     lora_targets=setup.lora_targets if method != "full" else None, micro_batch=b, seq_len=S,
                     grad_ckpt=ckpt, attn=r["attn"], precision=measured_as, device="cpu", optimizer_impl="for-loop",
                     loss=loss)
    return {"case": case, "source": r.get("memory_source"), "predicted": predicted,
            "measured": m.peak_allocated_bytes, "error": round(predicted / m.peak_allocated_bytes - 1, 5)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--cases", type=int, default=6)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--catalog", action="store_true")
    which.add_argument("--sweep", action="store_true")
    p.add_argument("--loss", choices=("standard", "chunked"),
                   help="every case's loss (the draws are the same as without it); default: the standard loss, or "
                        "the sweep row's own (git's chunked)")
    a = p.parse_args(argv)
    LOSS["loss"] = a.loss
    warnings.simplefilter("ignore")
    rng = random.Random(a.seed)
    draw = catalog_case if a.catalog else sweep_case
    for _ in range(a.cases):
        try:
            out = draw(rng)
        except Exception as e:     # noqa: BLE001 - a refusal or a build that fails is a finding, recorded
            out = {"case": DRAWN.get("case"), "refused": f"{type(e).__name__}: {str(e)[:300]}"}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

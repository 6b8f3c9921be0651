"""CPU ground truth for the objectives' memory terms: predicted allocated peak vs torch.profiler over a real TRL step.

For each case: TRL's RewardTrainer / DPOTrainer / GRPOTrainer on a random-init tiny model (trainer/objective_build.py),
one warm-up optimizer step, then one profiled step (GRPO: generation included); compared with the engine's
allocated peak for the same setup on one CPU process. Parameter and optimizer-state bytes are compared exactly.
Writes bench/results/objective_groundtruth.json and prints a Markdown table (docs/accuracy.md's):

    .venv/bin/python bench/objective_groundtruth.py [--quick] [--only TEXT]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from groundtruth_cli import predicted_vs_measured, run_groundtruth
from scaletrain.engine.catalog.architectures import arch_from_config, catalog_entry
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.estimate.memory import estimate_memory
from scaletrain.engine.estimate.objectives import reference_weight_bytes
from scaletrain.engine.estimate.setup import TrainingSetup

MiB = 1024 ** 2


@dataclass(frozen=True)
class Case:
    objective: str
    model: str = "scaletrain/tiny-qwen2"
    method: str = "full"
    ref_model: str = "none"
    grad_ckpt: bool = True            # TRL's default
    micro_batch: int = 2
    grad_accum: int = 1
    seq_len: int = 128
    prompt_len: int = 32
    num_generations: int = 2
    attn: str = "sdpa"
    lora_rank: int = 8

    @property
    def label(self) -> str:
        bits = [self.model.split("/")[-1], self.objective, self.method, self.attn,
                "ckpt" if self.grad_ckpt else "no-ckpt", f"b{self.micro_batch}×s{self.seq_len}"]
        if self.objective in ("dpo", "grpo"):
            bits.append(f"prompt {self.prompt_len}")
        if self.objective == "grpo":
            bits.append(f"G{self.num_generations}")
        if self.ref_model != "none":
            bits.append(f"ref {self.ref_model}")
        if self.grad_accum > 1:
            bits.append(f"ga{self.grad_accum}")
        return " ".join(bits)


CASES = [
    Case("reward"),
    Case("reward", grad_ckpt=False, micro_batch=4),
    Case("reward", method="lora", model="scaletrain/tiny-llama"),
    Case("dpo", ref_model="same"),
    Case("dpo", ref_model="precomputed", grad_ckpt=False, model="scaletrain/tiny-qwen3"),
    Case("dpo", ref_model="same", method="lora", model="scaletrain/tiny-llama"),
    Case("grpo"),
    Case("grpo", ref_model="same", grad_accum=2, num_generations=4),
    Case("grpo", method="lora", grad_ckpt=False, model="scaletrain/tiny-qwen3", seq_len=96, prompt_len=16),
]
QUICK = [CASES[i] for i in (2, 3, 7)]


def config_for(case: Case) -> dict:
    return dict(catalog_entry(case.model)["config"])


def setup_for(case: Case) -> TrainingSetup:
    return TrainingSetup(
        model=arch_from_config(config_for(case), case.model), hardware=parse_gpus("1xCPU"), method=case.method,
        lora_rank=case.lora_rank, strategy="ddp", precision="fp32", optimizer_impl="fused", attn=case.attn,
        grad_ckpt=case.grad_ckpt, micro_batch=case.micro_batch, grad_accum=case.grad_accum, seq_len=case.seq_len,
        device="cpu", objective=case.objective, prompt_len=case.prompt_len if case.objective != "reward" else None,
        num_generations=case.num_generations, ref_model=case.ref_model)


def run_case(case: Case) -> dict:
    from scaletrain.trainer.objective_build import ObjectiveRun
    from scaletrain.measure.objective_step import measure_objective_step

    s = setup_for(case)
    mem = estimate_memory(s)
    run = ObjectiveRun(objective=case.objective, model_config=config_for(case), output_dir="", method=case.method,
                       lora_rank=case.lora_rank, lora_targets=s.lora_targets if case.method != "full" else None,
                       precision="fp32", attn=case.attn, grad_ckpt=case.grad_ckpt, micro_batch=case.micro_batch,
                       grad_accum=case.grad_accum, seq_len=case.seq_len, prompt_len=case.prompt_len,
                       num_generations=case.num_generations, ref_model=case.ref_model)
    measured = measure_objective_step(run)
    return {
        "case": case.label, "objective": case.objective, "model": case.model, "method": case.method,
        "ref_model": case.ref_model, "grad_ckpt": case.grad_ckpt,
        **predicted_vs_measured(s, mem, measured,
                                reference_bytes=(reference_weight_bytes(s), measured.reference_bytes)),
    }


def markdown(rows: list[dict]) -> str:
    lines = ["| case | params & states exact | predicted peak | measured peak | error | peak in |",
             "|---|---|---:|---:|---:|---|"]
    for r in rows:
        exact = all(r[f"{k}_predicted"] == r[f"{k}_measured"]
                    for k in ("params", "trainable", "weights_bytes", "reference_bytes", "optimizer_bytes"))
        lines.append(f"| {r['case']} | {'yes' if exact else 'no'} | {r['predicted_peak_bytes'] / MiB:.2f} MiB | "
                     f"{r['measured_peak_bytes'] / MiB:.2f} MiB | {100 * r['error']:+.1f}% | {r['peak_phase']} |")
    from readme_tables import error_summary

    lines += ["", error_summary(rows)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_groundtruth(argv, cases=CASES, quick=QUICK, run_case=run_case, markdown=markdown,
                           out_name="objective_groundtruth.json", command="python bench/objective_groundtruth.py", libraries=("torch", "transformers", "trl"))


if __name__ == "__main__":
    sys.exit(main())

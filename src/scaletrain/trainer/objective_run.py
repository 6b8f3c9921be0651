"""The bundled trainer's reward, DPO and GRPO runs: TRL's trainer inside a run directory written by scaletrain.

`train_objective(cfg, resume)` is what trainer/train.py hands a plan whose objective is not sft. It reads the data
(train option `dataset`: JSONL with prompt/chosen/rejected rows for reward and DPO, prompt rows for GRPO; the
bundled presets/data/preference.jsonl or prompts.jsonl when unset), builds the TRL trainer (build.py) with the
plan's batch, precision, checkpointing, objective knobs and ds_config.json under ZeRO, and trains. TRL's Trainer
makes its own Accelerator from the environment `accelerate launch` sets: two gloo ranks on a CPU host with
use_cpu, NCCL on GPUs, DeepSpeed from ds_config.json. Rank 0 writes metrics.jsonl (one line per optimizer step,
engine.run.metrics) and prints a line per step; the final model goes to checkpoints/final/. GRPO's reward for the
bundled prompts is the share of the reference answer's characters a completion contains (rewards below).
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.metrics import MetricsWriter, StepMetrics
from scaletrain.engine.choices import choices_of
from scaletrain.trainer.config import RunConfig
from scaletrain.trainer.objective_build import ObjectiveRun, build_trainer


def bundled_dataset(objective: str) -> Path:
    import scaletrain.presets as presets_pkg

    name = "prompts.jsonl" if objective == "grpo" else "preference.jsonl"
    return Path(presets_pkg.__file__).parent / "data" / name


def read_rows(path: Path | str, objective: str) -> list[dict[str, Any]]:
    """Rows with the columns the objective needs, each problem in one line naming the line or row (the planner's
    reader and check: engine/request/records.objective_rows)."""
    from scaletrain.engine.request.records import objective_rows

    return objective_rows(path, objective)


def answer_overlap(completions: list[str], answer: list[str] | None = None, **_: Any) -> list[float]:
    """GRPO reward for the bundled prompts: the share of the reference answer's distinct characters present in the
    completion (0 … 1); completions of prompts without an answer score their distinct-letter count / 26."""
    out = []
    for i, c in enumerate(completions):
        ref = answer[i] if answer else None
        if ref:
            want = set(ref)
            out.append(len(want & set(c)) / max(1, len(want)))
        else:
            out.append(len({ch for ch in c.lower() if ch.isalpha()}) / 26)
    return out


def _tokenizer(cfg: RunConfig, vocab: int) -> Any:
    if cfg.train.model_source == "random-init":
        from scaletrain.trainer.objective_tokenizer import byte_level_tokenizer

        return byte_level_tokenizer(vocab)
    from scaletrain.trainer.tokenizer_check import load_checked

    tok = load_checked(str(cfg.train.model_source))       # an empty tokenizer is an error, never a run
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _rank_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class _Metrics:
    """A TrainerCallback: one metrics.jsonl line and one stdout line per optimizer step, on rank 0."""

    def __init__(self, cfg: RunConfig, total: int, steps_per_epoch: int, world: int, tokens_per_step: int):
        from transformers import TrainerCallback

        self.writer = MetricsWriter(cfg.run.metrics)
        self.t_last = time.perf_counter()
        outer = self

        class _CB(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kw):   # noqa: ANN001
                if not logs or "loss" not in logs or not state.is_world_process_zero:
                    return
                now = time.perf_counter()
                step_s = now - outer.t_last
                outer.t_last = now
                rec = StepMetrics(step=state.global_step, total_steps=total,
                                  epoch=round(state.global_step / max(1, steps_per_epoch), 4),
                                  loss=float(logs["loss"]), lr=float(logs.get("learning_rate", 0.0)),
                                  tokens_per_second=tokens_per_step / step_s if step_s > 0 else 0.0,
                                  step_seconds=step_s, world_size=world, time=time.time(), tokens=tokens_per_step,
                                  grad_norm=float(logs["grad_norm"]) if logs.get("grad_norm") is not None else None)
                outer.writer.write(rec)
                print(f"step {rec.step}/{total} loss {rec.loss:.4f} lr {rec.lr:.3g} "
                      f"tok/s {rec.tokens_per_second:.0f} step {step_s:.3f}s", flush=True)

        self.callback = _CB()


def objective_run(cfg: RunConfig, max_steps: int) -> ObjectiveRun:
    from scaletrain.trainer.model import model_config_dict

    return ObjectiveRun(
        objective=cfg.objective, model_config=model_config_dict(cfg.model_id), output_dir=str(cfg.run.path / "trl"),
        method=str(cfg.method), lora_rank=cfg.lora_rank, lora_alpha=cfg.train.lora_alpha,
        lora_targets=tuple(cfg.lora_targets) or None, **choices_of(cfg), grad_ckpt=cfg.grad_ckpt, micro_batch=cfg.micro_batch, grad_accum=cfg.grad_accum, seq_len=cfg.seq_len,
        prompt_len=cfg.prompt_len, num_generations=cfg.num_generations, ref_model=cfg.ref_model, lr=cfg.train.lr, lr_schedule=cfg.train.lr_schedule,
        warmup_ratio=cfg.train.warmup_ratio, weight_decay=cfg.train.weight_decay,
        max_grad_norm=cfg.train.max_grad_norm, max_steps=max_steps, seed=cfg.train.seed,
        use_cpu=_on_cpu(), deepspeed=str(cfg.run.ds_config) if cfg.uses_deepspeed else None,
        model_source=cfg.train.model_source)


def _check_strategy(cfg: RunConfig, acc: Any, world: int) -> None:
    """TRL wraps the model inside train(); what accelerate will wrap it with is its distributed type, checked here
    against the plan's strategy before any step (a CPU host drops accelerate's FSDP plugin: DDP instead)."""
    from accelerate.utils import DistributedType as DT

    want = ((DT.DEEPSPEED,) if cfg.uses_deepspeed else (DT.FSDP,) if cfg.strategy == "fsdp"
            else (DT.MULTI_CPU, DT.MULTI_GPU) if world > 1 else (DT.NO,))
    if acc.distributed_type not in want:
        raise ScaletrainError(f"the plan's strategy is {cfg.strategy} on {world} process(es), but TRL's accelerator "
                              f"runs {acc.distributed_type.value}; nothing was trained (on a CPU host use --strategy "
                              "ddp or zero3 for reward/dpo/grpo)")


def _on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def train_objective(cfg: RunConfig, resume: bool) -> int:
    import warnings

    from datasets import Dataset

    rank, world = _rank_world()
    main = rank == 0
    if resume and main:
        print("scaletrain: note: reward/dpo/grpo runs start from step 0 (TRL checkpoints are not resumed here)",
              flush=True)
    path = Path(cfg.train.dataset).expanduser() if cfg.train.dataset else bundled_dataset(cfg.objective)
    rows = read_rows(cfg.train.dataset or path, cfg.objective)
    per_step = cfg.micro_batch * cfg.grad_accum * world       # pairs (reward, dpo) or completions (grpo)
    samples = len(rows) * (cfg.num_generations if cfg.objective == "grpo" else 1)
    steps_per_epoch = samples // per_step
    if steps_per_epoch == 0:
        raise ScaletrainError(f"{path.name} gives {samples} {'completions' if cfg.objective == 'grpo' else 'pairs'} "
                              f"but one optimizer step needs micro batch {cfg.micro_batch} × accumulation "
                              f"{cfg.grad_accum} × {world} processes = {per_step}; add data or lower the batch")
    total = cfg.train.max_steps or max(1, math.ceil(cfg.epochs * steps_per_epoch))
    run = objective_run(cfg, total)
    from scaletrain.trainer.model import model_config_dict

    tok = _tokenizer(cfg, int(model_config_dict(cfg.model_id)["vocab_size"]))
    tokens_per_step = per_step * cfg.seq_len * (2 if cfg.objective in ("reward", "dpo") else 1)
    metrics = _Metrics(cfg, total, steps_per_epoch, world, tokens_per_step) if main else None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning)
        trainer = build_trainer(run, Dataset.from_list(rows), tok,
                                reward_funcs=answer_overlap if cfg.objective == "grpo" else None,
                                callbacks=[metrics.callback] if metrics else [], rank=rank)
        acc = trainer.accelerator
        if acc.num_processes != world:
            raise ScaletrainError(f"TRL's accelerator sees {acc.num_processes} process(es) of the {world} launched "
                                  f"({acc.distributed_type}); the ranks would train apart")
        _check_strategy(cfg, acc, world)
        if main:
            n_params = sum(p.numel() for p in trainer.model.parameters())
            print(f"scaletrain: {cfg.model_id} ({cfg.objective} with TRL, {cfg.method}, {cfg.strategy}, "
                  f"{cfg.precision}) on {world} process(es) ({acc.distributed_type}, {acc.device}); "
                  f"{len(rows)} rows from {path.name}; "
                  f"{steps_per_epoch} steps/epoch, {total} steps; {n_params:,} parameters", flush=True)
        try:
            trainer.train()
        except KeyboardInterrupt:
            if main:
                print(f"scaletrain: interrupted at step {trainer.state.global_step}", flush=True)
            return 130
        finally:
            if metrics is not None:
                metrics.writer.close()
    final = cfg.run.checkpoints / "final"
    trainer.save_model(str(final))
    if main:
        n = trainer.state.global_step
        print(f"scaletrain: done, {n} step{'s' if n != 1 else ''}; model in {final}", flush=True)
    sys.stdout.flush()
    return 0

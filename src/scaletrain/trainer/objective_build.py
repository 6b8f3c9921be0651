"""The TRL trainer for one objective, built the same way for a run (run.py) and for a measured step (measure.py).

    ObjectiveRun        everything TRL needs: the objective and its knobs, the model, batch, precision, optimizer
    build_trainer       the model (a causal LM, or a sequence classifier with one output for a reward model), the
                        TRL config (TrainingArguments underneath) and RewardTrainer / DPOTrainer / GRPOTrainer

What each knob means to TRL 1.16: the micro batch is per_device_train_batch_size (pairs for reward and DPO,
completions for GRPO); gradient checkpointing is TRL's own default (on); `ref_model same` is a frozen copy of the
policy (DPO's default; under LoRA the base with adapters disabled), `none` drops it (GRPO's beta 0, TRL's default),
`precomputed` computes DPO's reference log-probs once before training (precompute_ref_log_probs). torch is
imported inside functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from scaletrain.engine.choices import carries
from scaletrain.engine.errors import ScaletrainError
from scaletrain.trainer import model as model_lib

GRPO_BETA_WITH_REFERENCE = 0.04      # the KL coefficient GRPO papers and TRL's docs use when a reference is kept
DPO_BETA = 0.1                       # TRL's DPOConfig default


@dataclass(frozen=True)
@carries(after="lora_targets")      # precision, optimizer, attn …: RunChoices (engine/choices.py)
class ObjectiveRun:
    objective: str                   # reward | dpo | grpo
    model_config: dict[str, Any]
    output_dir: str
    method: str = "full"
    lora_rank: int = 16
    lora_alpha: int | None = None
    lora_targets: tuple[str, ...] | None = None
    bf16_weights: bool = False       # load the policy in bf16 (--master-weights bf16, LoRA's 16-bit base)
    grad_ckpt: bool = True
    micro_batch: int = 1
    grad_accum: int = 1
    seq_len: int = 128
    prompt_len: int | None = None
    completion_len: int | None = None
    num_generations: int = 2
    ref_model: str = "none"          # same | none | precomputed
    lr: float = 1e-5
    lr_schedule: str = "constant"
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_steps: int = 2
    seed: int = 0
    use_cpu: bool = True
    deepspeed: str | None = None     # ds_config.json of a ZeRO plan
    model_source: str = "random-init"
    fixed_length: bool = False       # GRPO: every completion runs to completion_len (measurements: known shapes)

    @property
    def completion(self) -> int:
        return self.completion_len or (self.seq_len - (self.prompt_len or 0))


def _optim_name(run: ObjectiveRun) -> str:
    """transformers' optimizer name for the plan's optimizer and implementation."""
    if run.optimizer == "sgd":
        return "sgd"
    if run.optimizer == "adamw-8bit":
        return "adamw_bnb_8bit"
    return {"fused": "adamw_torch_fused", "foreach": "adamw_torch", "for-loop": "adamw_torch"}[run.optimizer_impl]


def _common_args(run: ObjectiveRun) -> dict[str, Any]:
    from scaletrain.engine.request.options import LR_SCHEDULES

    args: dict[str, Any] = dict(
        output_dir=run.output_dir, per_device_train_batch_size=run.micro_batch,
        gradient_accumulation_steps=run.grad_accum, max_steps=run.max_steps, learning_rate=run.lr,
        lr_scheduler_type=LR_SCHEDULES[run.lr_schedule], warmup_steps=_warmup_steps(run),
        weight_decay=run.weight_decay, max_grad_norm=run.max_grad_norm, optim=_optim_name(run),
        gradient_checkpointing=run.grad_ckpt, bf16=run.precision == "bf16", fp16=run.precision == "fp16",
        seed=run.seed, data_seed=run.seed, logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=run.use_cpu, dataloader_num_workers=0, disable_tqdm=True, remove_unused_columns=False,
        trust_remote_code=False,       # TRL's own processor/config loads: never a model folder's code
    )
    if run.optimizer_impl == "for-loop" and run.optimizer == "adamw":
        args["optim_args"] = "foreach=False"
    if run.deepspeed:
        args["deepspeed"] = run.deepspeed
    return args


def _warmup_steps(run: ObjectiveRun) -> int:
    import math

    return math.ceil(run.warmup_ratio * run.max_steps)


def _dtype(run: ObjectiveRun) -> str:
    if run.bf16_weights or (run.method != "full" and run.precision == "bf16"):
        return "bfloat16"
    return "float32"


def model_path(run: ObjectiveRun, rank: int = 0) -> str:
    """Where TRL loads the policy from (and, for a reference, its copy): the model source, or for random init the
    catalog architecture with seeded random weights written once under the output directory (one folder per rank, so
    ranks never race; the seed makes them identical). TRL then builds the model its own way: a causal LM, or
    AutoModelForSequenceClassification with num_labels=1 (the score head) for a reward model."""
    from pathlib import Path

    if run.model_source != "random-init":
        return run.model_source
    import torch

    target = Path(run.output_dir) / f"initial-model-rank{rank}"
    if not (target / "config.json").is_file():
        torch.manual_seed(run.seed)
        model = model_lib.random_init(run.model_config, "sdpa", dtype=_dtype(run))
        model.save_pretrained(str(target))
    return str(target)


def model_init_kwargs(run: ObjectiveRun) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dtype": _dtype(run), "attn_implementation": {"flash": "flash_attention_2"}.get(
        run.attn, run.attn), "trust_remote_code": False}     # TRL's from_pretrained: never a folder's code
    return kwargs           # pretrained: the hub when reachable, else the HF cache (engine/launch/prefetch.py)


def peft_config(run: ObjectiveRun) -> Any:
    if run.method == "full":
        return None
    from peft import LoraConfig

    targets: Sequence[str] | str = list(run.lora_targets) if run.lora_targets else "all-linear"
    modules, parameters = model_lib.lora_targets(targets)      # `experts`: peft's target_parameters
    return LoraConfig(r=run.lora_rank, lora_alpha=run.lora_alpha or 2 * run.lora_rank, lora_dropout=0.0,
                      target_modules=modules, target_parameters=parameters,
                      task_type="SEQ_CLS" if run.objective == "reward" else "CAUSAL_LM")


def build_trainer(run: ObjectiveRun, dataset: Any, tokenizer: Any, reward_funcs: Any = None,
                  callbacks: Sequence[Any] = (), rank: int = 0) -> Any:
    """The TRL trainer for `run` over `dataset` (a datasets.Dataset in the objective's TRL format)."""
    model = model_path(run, rank)
    args = {**_common_args(run), "model_init_kwargs": model_init_kwargs(run)}
    cb = list(callbacks)
    if run.objective == "reward":
        from trl import RewardConfig, RewardTrainer

        if run.ref_model != "none":
            raise ScaletrainError("a reward model has no reference model; use --ref-model none")
        cfg = RewardConfig(**args, max_length=run.seq_len)
        return RewardTrainer(model=model, args=cfg, train_dataset=dataset, processing_class=tokenizer,
                             peft_config=peft_config(run), callbacks=cb)
    if run.objective == "dpo":
        from trl import DPOConfig, DPOTrainer

        if run.ref_model == "none":
            raise ScaletrainError("DPO needs reference log-probs: use --ref-model same or precomputed")
        cfg = DPOConfig(**args, max_length=run.seq_len, beta=DPO_BETA,
                        precompute_ref_log_probs=run.ref_model == "precomputed")
        return DPOTrainer(model=model, args=cfg, train_dataset=dataset, processing_class=tokenizer,
                          peft_config=peft_config(run), callbacks=cb)
    if run.objective == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        if run.ref_model == "precomputed":
            raise ScaletrainError("GRPO scores fresh completions every step; use --ref-model same or none")
        gen = {"min_new_tokens": run.completion} if run.fixed_length else None
        cfg = GRPOConfig(**args, num_generations=run.num_generations, max_completion_length=run.completion,
                         beta=GRPO_BETA_WITH_REFERENCE if run.ref_model == "same" else 0.0,
                         generation_kwargs=gen)
        return GRPOTrainer(model=model, reward_funcs=reward_funcs, args=cfg, train_dataset=dataset,
                           processing_class=tokenizer, peft_config=peft_config(run), callbacks=cb)
    raise ScaletrainError(f"objective {run.objective!r} does not run under TRL here (use reward, dpo or grpo)")

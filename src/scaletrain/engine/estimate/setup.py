"""TrainingSetup: every choice that decides memory and time, validated once, immutable afterwards.

The wizard, presets, `--json` CLI and the planner all build one of these; the estimators read it; nothing
downstream re-derives a number from raw user input.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog.hardware import Hardware
from scaletrain.engine.catalog.architectures import BLOCK_LINEARS, ModelArch
from scaletrain.engine.catalog.softcaps import final_softcap
from scaletrain.engine.catalog.traced import position_limit
from scaletrain.engine.catalog.unmodeled import UNMODELED_CHECKPOINTING, UNMODELED_EAGER
from scaletrain.engine.choices import carries, choices_json, coerce_words
from scaletrain.engine.vocabulary import Device, Generation, LossImpl, Method, Objective, Offload, RefModel, Strategy

BASE_BITS = (4, 8, 16, 32)


@dataclass(frozen=True)
class ResidentModel:
    """An inference-only model kept on every GPU next to the trained one (reference policy, evaluator)."""

    model: ModelArch
    bits: int = 16          # 16 (bf16), 8 or 4
    role: str = "evaluator"

    def weight_bytes(self) -> int:
        return _quantized_model_bytes(self.model, self.bits)


def _quantized_model_bytes(m: ModelArch, bits: int) -> int:
    """Weights of a frozen model: block linears at `bits`, everything else bf16 (as bitsandbytes leaves it)."""
    if bits == 16:
        return 2 * m.params
    lin = m.linear_weight_params()   # every block nn.Linear; MoE experts and routers stay 16-bit
    rest = m.params - lin
    return quantized_linear_bytes(lin, bits) + 2 * rest


def quantized_linear_bytes(n_weights: int, bits: int) -> int:
    """bitsandbytes storage for quantized linear weights.

    NF4 (bits=4) with double quantization: 4 bits per weight, one 8-bit absmax per 64-weight block, plus one fp32
    absmax per 256 blocks for the second level (QLoRA paper §2: 0.127 extra bits per weight).
    LLM.int8 (bits=8): 1 byte per weight plus one fp32 scale per output row (≈ negligible; counted as 1/4096 B).
    """
    if bits == 4:
        return n_weights // 2 + n_weights // 64 + 4 * (n_weights // (64 * 256))
    if bits == 8:
        return n_weights + n_weights // 1024
    raise ScaletrainError(f"quantized bits must be 4 or 8 (got {bits})")


@dataclass(frozen=True)
@carries(after="offload")           # precision … loop: RunChoices (engine/choices.py), as Vocabulary
class TrainingSetup:
    model: ModelArch
    hardware: Hardware
    method: Method = Method.FULL
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = BLOCK_LINEARS
    base_bits: int = 16              # frozen base weights: 16 (lora), 4 (qlora NF4), 8 (8-bit base), 32 (fp32 base)
    strategy: Strategy = Strategy.DDP
    offload: Offload = Offload.NONE
    loss: LossImpl = LossImpl.STANDARD   # the causal-LM loss: B·S·V logits, or chunked through lm_head
    grad_ckpt: bool = False
    micro_batch: int = 1
    grad_accum: int = 1
    seq_len: int = 2048
    residents: tuple[ResidentModel, ...] = ()
    dataset_size: int | None = None   # samples
    epochs: float = 1.0
    tokens_per_sample: int | None = None
    device: Device = Device.CUDA     # CUDA or CPU (CPU runs: no CUDA context or workspaces)
    # ---- the objective (engine/estimate/objectives.py holds its memory terms) ----
    objective: Objective = Objective.SFT
    prompt_len: int | None = None    # DPO / GRPO: the prompt's tokens within seq_len
    num_generations: int = 8         # GRPO: completions per prompt (TRL's default)
    ref_model: RefModel = RefModel.NONE
    generation: Generation = Generation.TRAIN
    generation_memory: float = 0.3   # GRPO colocate: the card's share vLLM holds (TRL vllm_gpu_memory_utilization)

    def __post_init__(self) -> None:
        coerce_words(self, skip=("device",))     # every Vocabulary-typed field; the device is checked below
        _check_objective(self)
        _check_loss(self)
        _check_checkpointing(self)
        if self.lora_targets is BLOCK_LINEARS and self.method.is_adapter and self.model.trace is not None:
            object.__setattr__(self, "lora_targets", self.model.default_lora_targets)   # a traced model's own
        if self.objective == "reward" and not self.model.score_head:
            object.__setattr__(self, "model", self.model.with_score_head())
        if self.base_bits not in BASE_BITS:
            raise ScaletrainError(f"--base-bits {self.base_bits!r} is not accepted; use one of: "
                                  f"{', '.join(map(str, BASE_BITS))}")
        for name in ("micro_batch", "grad_accum", "seq_len", "lora_rank"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ScaletrainError(f"--{name.replace('_', '-')} must be a whole number ≥ 1 (got {v!r})")
        limit = position_limit(self.model.trace)
        if limit is not None and self.seq_len > limit:    # the first step would index past the position table
            raise ScaletrainError(f"{self.model.name} ({self.model.model_type}) has learned embeddings for "
                                  f"{limit:,} positions: a sequence of {self.seq_len:,} tokens cannot run; give "
                                  f"--seq-len {limit} or less")
        if self.dataset_size is not None and self.dataset_size < 1:
            raise ScaletrainError(f"--dataset-size must be ≥ 1 sample (got {self.dataset_size})")
        if self.tokens_per_sample is not None and self.tokens_per_sample < 1:
            raise ScaletrainError(f"--tokens-per-sample must be ≥ 1 (got {self.tokens_per_sample})")
        if not self.epochs > 0:
            raise ScaletrainError(f"--epochs must be positive (got {self.epochs})")
        if self.method == "qlora" and self.base_bits == 32:
            raise ScaletrainError("--method qlora quantizes the base to 4 or 8 bits; use --method lora --base-bits 32 "
                                  "for an fp32 base")
        if self.method == "qlora" and self.base_bits not in (4, 8):
            object.__setattr__(self, "base_bits", 4)
        if self.method == "full" and self.base_bits != 16:
            raise ScaletrainError("--base-bits sets the frozen base of --method lora or qlora; full fine-tuning "
                                  "trains every weight (use --master-weights for their precision)")
        if self.master_weights == "bf16":
            if self.method == "qlora" or (self.method.is_adapter and self.base_bits != 16):
                raise ScaletrainError(f"--master-weights bf16 with LoRA means a bf16 base trained without autocast, "
                                      f"not a base of {self.base_bits} bits (use --master-weights fp32, or "
                                      "--method lora --base-bits 16)")
            if self.precision != "bf16":
                raise ScaletrainError(f"--master-weights bf16 trains bf16 weights, so it needs --precision bf16 "
                                      f"(got {self.precision})")
            if self.strategy.uses_deepspeed:
                raise ScaletrainError("DeepSpeed keeps an fp32 master copy of 16-bit weights in its optimizer; use "
                                      "--master-weights fp32 with ZeRO, or --strategy ddp/fsdp for bf16 weights only")
        if self.method.is_adapter:
            self.model.lora_params(self.lora_rank, self.lora_targets)  # validates target names
        if self.attn not in self.model.attention_implementations:
            why = UNMODELED_EAGER.get(self.model.model_type) if self.attn == "eager" else None
            what = f": {why}" if why else f" has no {self.attn} attention in transformers"
            raise ScaletrainError(f"{self.model.name} ({self.model.model_type}){what}; "
                                  f"use --attn {' or '.join(self.model.attention_implementations)}")
        if not self.strategy.allows_offload(self.offload):      # say which half of the rule is broken
            if not self.strategy.shards_optimizer:
                raise ScaletrainError(f"--offload {self.offload} needs a ZeRO or FSDP strategy (got {self.strategy})")
            if self.offload == "optimizer":
                raise ScaletrainError("FSDP's CPU offload moves parameters and optimizer together; use --offload all "
                                      "with --strategy fsdp, or --offload optimizer with a ZeRO strategy")
            raise ScaletrainError("--offload all (parameters too) needs --strategy zero3 or fsdp")
        if self.device not in Device.values():
            raise ScaletrainError(f"device {self.device!r} is not accepted; use cuda or cpu")
        object.__setattr__(self, "device", Device(self.device))
        if self.precision == "bf16" and self.device == "cuda" and not self.hardware.gpu.supports_bf16:
            raise ScaletrainError(f"{self.hardware.gpu.key} has no bf16 support; use --precision fp16 or fp32")

    # ---- derived counts ----------------------------------------------------------------------------------------
    @property
    def fused_lm_head(self) -> bool:
        """The loss is TRL's fused LM head (per-token log-probs in tiles, no B·S·V logits): DPO and GRPO, and SFT
        under `--loop trl` (TRL 1.16's SFTTrainer patches the model with it: sft_trainer.py add_fused_lm_head)."""
        return self.objective.log_probs or (self.loop == "trl" and self.objective == "sft")

    @property
    def world_size(self) -> int:
        return self.hardware.world_size

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.world_size

    @property
    def trainable_params(self) -> int:
        if not self.method.is_adapter:      # what transformers builds frozen (blt's entropy patcher) never steps
            return self.model.params - int((self.model.trace or {}).get("frozen_params") or 0)
        # a reward model under PEFT (task SEQ_CLS) also trains a copy of its score head (modules_to_save)
        score = self.model.hidden_size if self.model.score_head else 0
        return self.model.lora_params(self.lora_rank, self.lora_targets) + score

    @property
    def precision_label(self) -> str:
        """The weights' and compute's dtypes in words (plan lines, the wizard)."""
        if self.method == "full" and self.master_weights == "bf16":
            return f"{self.precision} weights only (no fp32 master)"
        if self.method.is_adapter and self.master_weights == "bf16":
            return f"{self.precision} base, no autocast (fp32 adapters)"
        if self.method.is_adapter and self.base_bits == 32:
            return f"{self.precision}, fp32 base"
        return str(self.precision)

    @property
    def optimizer_label(self) -> str:
        return f"{self.optimizer} ({self.optimizer_impl})" if self.optimizer != "adamw-8bit" else str(self.optimizer)

    @property
    def sample_tokens(self) -> int:
        return self.tokens_per_sample or self.seq_len

    @property
    def sequences_per_micro(self) -> int:
        """Sequences one micro-step runs through the model: TRL's per_device_train_batch_size counts pairs for
        reward and DPO (chosen and rejected are concatenated into one batch), completions for GRPO."""
        return 2 * self.micro_batch if self.objective.pairs else self.micro_batch

    @property
    def completion_len(self) -> int:
        """DPO / GRPO: the completion's tokens (seq_len − prompt_len)."""
        return self.seq_len - (self.prompt_len or 0)

    def with_(self, **changes: Any) -> "TrainingSetup":
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """plan.json's "training". The choices (engine/choices.py) keep their places: precision … attn after the
        offload, the rest (experts_impl for MoE models only, loop, and any later choice) before the loss."""
        rest = choices_json(self)
        if self.model.moe is None:
            del rest["experts_impl"]
        return {
            "method": self.method.value, "lora_rank": self.lora_rank if self.method.is_adapter else None,
            "lora_targets": list(self.lora_targets) if self.method.is_adapter else None,
            "base_bits": self.base_bits, "strategy": self.strategy.value, "offload": self.offload.value,
            **{k: rest.pop(k) for k in ("precision", "master_weights", "optimizer", "optimizer_impl", "attn")},
            "grad_ckpt": self.grad_ckpt, "seq_len": self.seq_len, "device": self.device.value,
            "residents": [{"model": r.model.name, "bits": r.bits, "role": r.role} for r in self.residents],
            "objective": self.objective.value, "prompt_len": self.prompt_len,
            "num_generations": self.num_generations if self.objective == "grpo" else None,
            "ref_model": self.ref_model.value, "generation": self.generation.value if self.objective == "grpo" else None,
            **rest, "loss": self.loss.value,
        }


def check_prompt_len(prompt_len: Any, seq_len: int) -> None:
    if not isinstance(prompt_len, int) or isinstance(prompt_len, bool) or not 1 <= prompt_len < seq_len:
        raise ScaletrainError(f"--prompt-len must be a whole number from 1 to seq_len − 1 = {seq_len - 1} "
                              f"(got {prompt_len!r})")


def check_num_generations(n: Any) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        raise ScaletrainError(f"--num-generations must be a whole number ≥ 2: GRPO's advantages compare completions "
                              f"of one prompt (got {n!r})")


def check_objective_strategy(objective: str, strategy: str, on_cpu: bool) -> None:
    """TRL's trainers (reward/dpo/grpo) take accelerate's FSDP plugin, which a CPU host drops (the bundled trainer's
    own fully_shard does not serve them): refused at plan time (TrainingSetup) and again at launch
    (engine/run/configs.check_strategy, for a plan written on a GPU host and launched on a CPU one), in one line."""
    if strategy == "fsdp" and objective != "sft" and on_cpu:
        raise ScaletrainError(f"--objective {objective} runs TRL's trainer, whose accelerate drops FSDP on a CPU "
                              "host and would train DDP instead; use --strategy ddp or zero3 on CPU")


def _check_objective(s: TrainingSetup) -> None:
    """The objective's own knobs, each refused in one line where it does not apply."""
    obj = s.objective
    check_objective_strategy(str(obj), str(s.strategy), s.device == "cpu")
    if obj in ("sft", "reward") and s.ref_model != "none":
        raise ScaletrainError(f"--ref-model {s.ref_model} applies to dpo and grpo; a {obj} step has no reference "
                              "model (use --ref-model none)")
    if obj == "dpo" and s.ref_model == "none":
        raise ScaletrainError("DPO compares with reference log-probs: use --ref-model same (a frozen copy, or the "
                              "base with adapters disabled under LoRA) or precomputed")
    if obj == "grpo" and s.ref_model == "precomputed":
        raise ScaletrainError("GRPO scores new completions every step, so its reference log-probs cannot be "
                              "precomputed: use --ref-model same or none")
    if s.prompt_len is not None:
        if obj not in ("dpo", "grpo"):
            raise ScaletrainError(f"--prompt-len applies to dpo and grpo (got --objective {obj})")
        check_prompt_len(s.prompt_len, s.seq_len)
    check_num_generations(s.num_generations)
    if not 0 < s.generation_memory < 1:
        raise ScaletrainError(f"--generation-memory must be a fraction of the card in (0, 1) (got "
                              f"{s.generation_memory})")
    if obj != "grpo" and s.generation != "train":
        raise ScaletrainError(f"--generation {s.generation} applies to grpo (got --objective {obj})")
    if obj != "sft" and s.loop in ("hf-trainer", "accelerate-loop"):
        raise ScaletrainError(f"--loop {s.loop} applies to sft; --objective {obj} runs TRL's own trainer (use --loop "
                              "trl, or leave --loop out)")


def _check_checkpointing(s: TrainingSetup) -> None:
    """A traced model whose class cannot checkpoint its layers (transformers' supports_gradient_checkpointing False:
    jetmoe, cpmant) is planned without it, and --grad-ckpt on it is refused in one line."""
    if s.grad_ckpt and not s.model.can_checkpoint:
        why = UNMODELED_CHECKPOINTING.get(s.model.model_type)
        if why:
            raise ScaletrainError(f"{s.model.name} ({s.model.model_type}) with --grad-ckpt: {why}; plan it without "
                                  "--grad-ckpt")
        raise ScaletrainError(f"{s.model.name} ({s.model.model_type}) cannot checkpoint its layers in transformers "
                              "(its class does not support gradient checkpointing); plan it without --grad-ckpt")


def _check_loss(s: TrainingSetup) -> None:
    """`--loss chunked` where it can run (engine/estimate/chunked_loss.py, trainer/chunked_loss.py), else one line."""
    if s.loss != "chunked":
        return
    if s.fused_lm_head and s.objective == "sft":
        raise ScaletrainError("--loss chunked with --loop trl: TRL's SFTTrainer already computes the loss through "
                              "its fused LM head (no B·S·V logits); use --loss standard")
    if s.objective != "sft":
        why = ("a score head has no vocabulary logits" if s.objective == "reward"
               else "TRL's log-prob head already chunks the vocabulary")
        raise ScaletrainError(f"--loss chunked applies to --objective sft ({s.objective}: {why}); use --loss standard")
    if s.strategy in ("zero3", "fsdp"):
        raise ScaletrainError(f"--loss chunked reads lm_head's weight outside lm_head's forward, where {s.strategy} "
                              "holds only this rank's shard of it; use --loss standard, or --strategy ddp/zero1/zero2")
    if final_softcap(s.model.config, s.model.model_type):
        raise ScaletrainError(f"--loss chunked cannot reproduce {s.model.model_type}'s logit soft-capping "
                              "(final_logit_softcapping); use --loss standard")

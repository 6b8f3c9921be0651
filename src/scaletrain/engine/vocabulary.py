"""The words a plan is made of, each defined once with the rules that belong to it.

Every value is a `str` Enum: it compares equal to its spelling (`Strategy.ZERO3 == "zero3"`), hashes like it,
prints as it (`f"{s}"` is "zero3") and JSON-encodes as it, so plan.json and `plan --json` read the same as when
these were bare strings. Definition order is the order people see them in (CLI choices, error messages) and,
for Method and Offload, the order of how far they go (full < lora < qlora, none < optimizer < all).
"""

from __future__ import annotations

from enum import Enum
from functools import cache


@cache
def _spellings(kind: type) -> tuple[str, ...]:
    """A Vocabulary's spellings, read once per class (the planner's search builds thousands of setups)."""
    return tuple(m.value for m in kind)


class Vocabulary(str, Enum):
    """A str-valued Enum that formats as its value (Python 3.11 would print `Strategy.DDP`)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The spellings, in definition order (argparse `choices=`, 'use one of' messages)."""
        return _spellings(cls)

    @property
    def rank(self) -> int:
        """Position in definition order."""
        return list(type(self)).index(self)


class Method(Vocabulary):
    FULL = "full"
    LORA = "lora"
    QLORA = "qlora"

    @property
    def is_adapter(self) -> bool:
        """LoRA or QLoRA: a frozen base plus trained low-rank adapters."""
        return self is not Method.FULL


class Strategy(Vocabulary):
    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"
    FSDP = "fsdp"

    @property
    def label(self) -> str:
        return {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "fsdp": "FSDP"}[self.value]

    @property
    def uses_deepspeed(self) -> bool:
        return self in (Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3)

    @property
    def zero_stage(self) -> int | None:
        """DeepSpeed's ZeRO stage (None: not DeepSpeed)."""
        return {"zero1": 1, "zero2": 2, "zero3": 3}.get(self.value)

    @property
    def shards_optimizer(self) -> bool:
        return self is not Strategy.DDP

    @property
    def shards_gradients(self) -> bool:
        return self in (Strategy.ZERO2, Strategy.ZERO3, Strategy.FSDP)

    @property
    def shards_params(self) -> bool:
        return self in (Strategy.ZERO3, Strategy.FSDP)

    def allows_offload(self, offload: "Offload | str") -> bool:
        """ZeRO offloads the optimizer (stage 1-3) or the parameters too (stage 3); FSDP's CPU offload moves
        parameters, gradients and optimizer together, so it has no optimizer-only variant; DDP offloads nothing."""
        off = Offload(offload)
        if off is Offload.NONE:
            return True
        if off is Offload.OPTIMIZER:
            return self.uses_deepspeed
        return self.shards_params

    def offloads(self) -> tuple["Offload", ...]:
        """The offloads this strategy allows, least first."""
        return tuple(o for o in Offload if self.allows_offload(o))

    def offload_within(self, offload: "Offload | str") -> "Offload":
        """The most this strategy can offload without going past `offload`."""
        limit = Offload(offload).rank
        return [o for o in self.offloads() if o.rank <= limit][-1]


class Offload(Vocabulary):
    NONE = "none"
    OPTIMIZER = "optimizer"       # optimizer states (and their update) in host RAM
    ALL = "all"                   # parameters too

    @property
    def moves_optimizer(self) -> bool:
        return self is not Offload.NONE

    @property
    def moves_params(self) -> bool:
        return self is Offload.ALL


class Precision(Vocabulary):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of the compute dtype."""
        return 4 if self is Precision.FP32 else 2

    @property
    def torch_dtype(self) -> str:
        """The torch dtype's name (`getattr(torch, p.torch_dtype)`; no torch import here)."""
        return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[self.value]


class Optimizer(Vocabulary):
    ADAMW = "adamw"
    ADAMW_8BIT = "adamw-8bit"
    SGD = "sgd"


class OptimizerImpl(Vocabulary):
    """torch's three optimizer implementations (torch.optim docs). The bundled trainer and HF Trainer's default
    (adamw_torch_fused) run fused; torch.optim.AdamW() left to itself runs foreach on CUDA, the for-loop on CPU."""

    FUSED = "fused"
    FOREACH = "foreach"
    FOR_LOOP = "for-loop"


class MasterWeights(Vocabulary):
    """Full fine-tuning's trained weights: fp32 (mixed precision keeps an fp32 copy: in the model under accelerate,
    in the optimizer under DeepSpeed) or bf16 only (a model loaded in bf16, torch AdamW on it, no fp32 copy)."""

    FP32 = "fp32"
    BF16 = "bf16"


class Attention(Vocabulary):
    EAGER = "eager"
    SDPA = "sdpa"
    FLASH = "flash"

    @property
    def hf_implementation(self) -> str:
        """transformers' attn_implementation."""
        return "flash_attention_2" if self is Attention.FLASH else self.value


class ExpertsImpl(Vocabulary):
    """How transformers runs an MoE block's experts (`experts_implementation=`, transformers/integrations/moe.py):
    grouped_mm (the default on CPU and CUDA: tokens sorted by expert, one grouped GEMM), eager (a Python loop over
    the hit experts with index_add_), batched_mm (each token-expert pair gathers its expert's weights: bmm)."""

    GROUPED_MM = "grouped_mm"
    EAGER = "eager"
    BATCHED_MM = "batched_mm"


class Loop(Vocabulary):
    """The training loop the plan's numbers are for: what it keeps alive through backward decides the peak.
    trainer: the bundled trainer (`loss = model(**batch).loss`, the output object dropped before backward);
    hf-trainer: transformers' Trainer (compute_loss returns the loss only); trl: TRL's SFTTrainer (its token
    accuracy and entropy metrics read the logits before backward); accelerate-loop: a hand-written loop in the
    style of accelerate's examples (`outputs = model(**batch); accelerator.backward(outputs.loss)`), which keeps
    the output object, and so the logits, alive through backward."""

    TRAINER = "trainer"
    HF_TRAINER = "hf-trainer"
    TRL = "trl"
    ACCELERATE_LOOP = "accelerate-loop"

    @property
    def holds_outputs(self) -> bool:
        """The model's output object (its B·S·V logits) stays referenced through backward."""
        return self is Loop.ACCELERATE_LOOP

    @property
    def words(self) -> str:
        """What the loop is, in a few words (plan text)."""
        return {"trainer": "the bundled trainer's loop", "hf-trainer": "transformers' Trainer",
                "trl": "TRL's SFTTrainer, fused LM head",
                "accelerate-loop": "keeps its outputs through backward"}[self.value]


class LossImpl(Vocabulary):
    """How the causal-LM loss meets the vocabulary. standard: lm_head writes B·S·V logits and cross-entropy
    upcasts them (transformers' ForCausalLMLoss); chunked: lm_head + cross-entropy over chunks of tokens,
    recomputed in backward, never materialising the whole logits (liger-kernel's fused linear cross-entropy on
    CUDA, a pure-torch chunked equivalent elsewhere)."""

    STANDARD = "standard"
    CHUNKED = "chunked"


class Objective(Vocabulary):
    """What a step optimises. sft: next-token cross-entropy (the bundled loop); reward: a preference (reward) model,
    a sequence classifier with one output trained on chosen/rejected pairs (TRL RewardTrainer); dpo: direct
    preference optimisation against reference log-probs (DPOTrainer); grpo: group-relative policy optimisation on
    the policy's own completions (GRPOTrainer)."""

    SFT = "sft"
    REWARD = "reward"
    DPO = "dpo"
    GRPO = "grpo"

    @property
    def uses_trl(self) -> bool:
        return self is not Objective.SFT

    @property
    def pairs(self) -> bool:
        """A micro batch of pairs: chosen and rejected run through the model together (2 × micro sequences)."""
        return self in (Objective.REWARD, Objective.DPO)

    @property
    def log_probs(self) -> bool:
        """Per-token log-probs through TRL's fused LM head (chunked, no B·S·V logits)."""
        return self in (Objective.DPO, Objective.GRPO)


class RefModel(Vocabulary):
    """The reference policy. same: a frozen copy of the policy (under LoRA: the base with adapters disabled);
    none: no reference (GRPO with beta 0, TRL's default); precomputed: DPO's reference log-probs computed once
    before training (precompute_ref_log_probs)."""

    SAME = "same"
    NONE = "none"
    PRECOMPUTED = "precomputed"


class Generation(Vocabulary):
    """Where GRPO's completions are generated. train: model.generate in the training process (TRL's default);
    colocate: a vLLM engine inside the training process holding a fixed share of the card; server: vLLM on
    separate GPUs (nothing on the learner's)."""

    TRAIN = "train"
    COLOCATE = "colocate"
    SERVER = "server"


class Device(Vocabulary):
    CUDA = "cuda"
    CPU = "cpu"

"""TrainingSetup: every choice that decides memory and time, validated once, immutable afterwards.

The wizard, presets, `--json` CLI and the planner all build one of these; the estimators read it; nothing
downstream re-derives a number from raw user input.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog.hardware import Hardware
from scaletrain.engine.catalog.architectures import BLOCK_LINEARS, ModelArch

METHODS = ("full", "lora", "qlora")
STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
OFFLOADS = ("none", "optimizer", "all")
PRECISIONS = ("bf16", "fp16", "fp32")
OPTIMIZERS = ("adamw", "adamw-8bit", "sgd")
ATTNS = ("eager", "sdpa", "flash")


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
    lin = m.targeted_linear_params()
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
class TrainingSetup:
    model: ModelArch
    hardware: Hardware
    method: str = "full"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = BLOCK_LINEARS
    base_bits: int = 16              # frozen base weights: 16 (lora), 4 (qlora NF4) or 8 (8-bit base)
    strategy: str = "ddp"
    offload: str = "none"
    precision: str = "bf16"
    optimizer: str = "adamw"
    attn: str = "sdpa"
    grad_ckpt: bool = False
    micro_batch: int = 1
    grad_accum: int = 1
    seq_len: int = 2048
    residents: tuple[ResidentModel, ...] = ()
    dataset_size: int | None = None   # samples
    epochs: float = 1.0
    tokens_per_sample: int | None = None
    device: str = "cuda"             # "cuda" or "cpu" (CPU runs: no context, single-tensor AdamW)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        def one_of(name: str, value: Any, allowed: tuple) -> None:
            if value not in allowed:
                raise ScaletrainError(f"--{name.replace('_', '-')} {value!r} is not accepted; use one of: "
                                      f"{', '.join(map(str, allowed))}")

        one_of("method", self.method, METHODS)
        one_of("strategy", self.strategy, STRATEGIES)
        one_of("offload", self.offload, OFFLOADS)
        one_of("precision", self.precision, PRECISIONS)
        one_of("optimizer", self.optimizer, OPTIMIZERS)
        one_of("attn", self.attn, ATTNS)
        for name in ("micro_batch", "grad_accum", "seq_len", "lora_rank"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ScaletrainError(f"--{name.replace('_', '-')} must be a whole number ≥ 1 (got {v!r})")
        if self.dataset_size is not None and self.dataset_size < 1:
            raise ScaletrainError(f"--dataset-size must be ≥ 1 sample (got {self.dataset_size})")
        if self.tokens_per_sample is not None and self.tokens_per_sample < 1:
            raise ScaletrainError(f"--tokens-per-sample must be ≥ 1 (got {self.tokens_per_sample})")
        if not self.epochs > 0:
            raise ScaletrainError(f"--epochs must be positive (got {self.epochs})")
        if self.method == "qlora" and self.base_bits not in (4, 8):
            object.__setattr__(self, "base_bits", 4)
        if self.method == "full" and self.base_bits != 16:
            raise ScaletrainError("a quantized base needs --method lora or qlora")
        if self.method in ("lora", "qlora"):
            self.model.lora_params(self.lora_rank, self.lora_targets)  # validates target names
        if self.offload != "none" and self.strategy not in ("zero1", "zero2", "zero3", "fsdp"):
            raise ScaletrainError(f"--offload {self.offload} needs a ZeRO or FSDP strategy (got {self.strategy})")
        if self.offload == "optimizer" and self.strategy == "fsdp":
            raise ScaletrainError("FSDP's CPU offload moves parameters and optimizer together; use --offload all "
                                  "with --strategy fsdp, or --offload optimizer with a ZeRO strategy")
        if self.offload == "all" and self.strategy not in ("zero3", "fsdp"):
            raise ScaletrainError("--offload all (parameters too) needs --strategy zero3 or fsdp")
        if self.device not in ("cuda", "cpu"):
            raise ScaletrainError(f"device {self.device!r} is not accepted; use cuda or cpu")
        if self.precision == "bf16" and self.device == "cuda" and not self.hardware.gpu.supports_bf16:
            raise ScaletrainError(f"{self.hardware.gpu.key} has no bf16 support; use --precision fp16 or fp32")

    # ---- derived counts ----------------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.hardware.world_size

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.world_size

    @property
    def trainable_params(self) -> int:
        if self.method == "full":
            return self.model.params
        return self.model.lora_params(self.lora_rank, self.lora_targets)

    @property
    def sample_tokens(self) -> int:
        return self.tokens_per_sample or self.seq_len

    def with_(self, **changes: Any) -> "TrainingSetup":
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method, "lora_rank": self.lora_rank if self.method != "full" else None,
            "lora_targets": list(self.lora_targets) if self.method != "full" else None,
            "base_bits": self.base_bits, "strategy": self.strategy, "offload": self.offload,
            "precision": self.precision, "optimizer": self.optimizer, "attn": self.attn,
            "grad_ckpt": self.grad_ckpt, "seq_len": self.seq_len, "device": self.device,
            "residents": [{"model": r.model.name, "bits": r.bits, "role": r.role} for r in self.residents],
        }

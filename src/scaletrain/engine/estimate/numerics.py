"""Which dtype every kind of tensor has in the stack a plan launches: the first question of the memory model.

accelerate's mixed precision keeps the model's own weights and wraps forward in torch.autocast; DeepSpeed casts the
module to 16-bit and keeps an fp32 master in its optimizer; FSDP2's MixedPrecisionPolicy gathers 16-bit copies of
fp32 shards; `--master-weights bf16` trains bf16 weights with no fp32 copy; PEFT keeps adapters in fp32;
prepare_model_for_kbit_training upcasts every non-quantized weight of a QLoRA model to fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scaletrain.engine.estimate.setup import TrainingSetup


@dataclass(frozen=True)
class Numerics:
    """Bytes per element of each kind of tensor, as the stack the plan launches really keeps them."""

    compute: int             # linear outputs, attention tensors, MLP intermediates, logits
    residual: int            # the residual stream between blocks, and what the RMSNorms return
    autocast: bool           # torch.autocast (accelerate's mixed precision) casts each linear's input per call
    weight: int              # a trainable weight of full fine-tuning as the model holds it
    frozen: int              # a frozen base weight outside quantized linears (LoRA / QLoRA)
    adapter: int             # a LoRA adapter weight (PEFT keeps fp32; DeepSpeed casts the module to 16-bit)
    trainable_copies: bool   # fp32 trainable weights under autocast: a 16-bit copy per forward, cached, saved
    frozen_copies: bool      # fp32 frozen block linears under autocast: a 16-bit copy per call, saved for backward
    fp32_head: bool          # a frozen fp32 lm_head under autocast: its 16-bit copy is saved for backward
    state: int               # an optimizer-state element: fp32, or bf16 when torch AdamW runs on bf16 weights
    mlp: int = 0             # the MLP's gate/up/act tensors: bitsandbytes' 4/8-bit linears return their input's
                             # dtype (fp32 under QLoRA's fp32 residual); the compute dtype otherwise (0: compute)

    @property
    def mlp_bytes(self) -> int:
        return self.mlp or self.compute


def uses_deepspeed(s: TrainingSetup) -> bool:
    return s.strategy.uses_deepspeed


def numerics(s: TrainingSetup) -> Numerics:
    """Which dtypes the launched stack uses (accelerate + DeepSpeed/FSDP + transformers + PEFT).

    accelerate's mixed precision keeps the model's own weights and wraps forward in torch.autocast; DeepSpeed
    casts the module to 16-bit and keeps an fp32 master in its optimizer; FSDP2's MixedPrecisionPolicy gathers
    16-bit copies of fp32 shards; `--master-weights bf16` trains bf16 weights with no fp32 copy at all. PEFT keeps
    adapters in fp32 and prepare_model_for_kbit_training upcasts every non-quantized weight to fp32 (QLoRA).
    """
    if s.precision == "fp32":
        return Numerics(4, 4, False, 4, 4, 4, False, False, False, 4)
    c = 2
    if s.method == "full":
        if uses_deepspeed(s):
            return Numerics(c, c, False, c, 0, 0, False, False, False, 4)
        if s.master_weights == "bf16":
            return Numerics(c, c, False, c, 0, 0, False, False, False, c)
        if s.strategy == "fsdp":
            return Numerics(c, c, False, 4, 0, 0, False, False, False, 4)
        return Numerics(c, 4, True, 4, 0, 0, True, False, False, 4)
    if uses_deepspeed(s):
        return Numerics(c, c, False, 0, c, c, False, False, False, 4)
    if s.master_weights == "bf16":
        # LoRA on a bf16 base trained without autocast (mixed_precision "no"): every activation is bf16, PEFT keeps
        # the adapters in fp32 and casts each adapted linear's input to fp32 (lora/layer.py _cast_input_dtype),
        # which autograd saves for lora_A's weight gradient (activations._reader_saved)
        return Numerics(c, c, False, 0, c, 4, False, False, False, 4)
    fp32_base = s.base_bits in (4, 8, 32)          # QLoRA: upcast by prepare_model_for_kbit_training
    if s.strategy == "fsdp":
        return Numerics(c, c, True, 0, c, 4, False, False, False, 4)
    quantized = s.base_bits in (4, 8)
    return Numerics(c, 4 if fp32_base else c, True, 0, 4 if fp32_base else c, 4, False, s.base_bits == 32,
                    fp32_base, 4, mlp=4 if quantized else 0)


def autocast_regime(s: TrainingSetup) -> bool:
    """fp32 weights computed in 16-bit by torch.autocast (accelerate mixed precision on an fp32 model)."""
    nm = numerics(s)
    return nm.autocast and nm.residual == 4


def load_dtype(method: str, base_bits: int, master_weights: str, strategy: Any, precision: Any) -> str:
    """The torch dtype (name) the model's weights are built or loaded in, as numerics() counts them: full
    fine-tuning keeps fp32 weights under mixed precision, bf16 weights only with master_weights bf16 (a LoRA
    base too: bf16, trained without autocast), and 16-bit
    weights under DeepSpeed (it casts the module to 16-bit and keeps the fp32 master in its optimizer, so building
    fp32 first would only cost memory); a LoRA/QLoRA base is in the compute precision (bf16/fp16), fp32 with
    base_bits 32 (QLoRA's 4/8-bit linears are quantized from it on load). Takes the plan's words (Strategy,
    Precision), so the trainer asks it without a TrainingSetup."""
    if method == "full":
        if master_weights == "bf16" or (strategy.uses_deepspeed and precision != "fp32"):
            return "bfloat16" if master_weights == "bf16" else precision.torch_dtype
        return "float32"
    return "float32" if base_bits == 32 else precision.torch_dtype

"""The model a run trains and the model a measurement measures, built by the same functions.

    hf_config          a catalog / config.json dict → transformers' config (checkpoint-only keys dropped)
    random_init        that config, randomly initialised in fp32 (tied embeddings tied)
    quantization       bitsandbytes' config for a 4-bit NF4 (double-quantised) or 8-bit frozen base
    enable_checkpointing  non-reentrant activation checkpointing on every decoder block, as a trainer does
    add_lora           LoRA adapters with PEFT (after prepare_model_for_kbit_training on a quantized base)

build_model / make_tokenizer / make_optimizer put them together for the bundled trainer (a run's RunConfig);
measure.py puts the same pieces together for one measured step. torch, transformers and peft are imported
inside the functions: importing this module is cheap.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from scaletrain.engine.catalog.architectures import load_model
from scaletrain.engine.errors import ScaletrainError
from scaletrain.trainer import data as data_mod
from scaletrain.trainer.config import RunConfig

SGD_MOMENTUM = 0.9                   # the memory model counts one fp32 momentum buffer for sgd
# Keys of a config.json that describe a checkpoint, not the architecture (the dtype is the run's choice).
CHECKPOINT_KEYS = ("architectures", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
                   "quantization_config", "auto_map")
NON_REENTRANT = {"use_reentrant": False}


# ---- the pieces -------------------------------------------------------------------------------------------------
def hf_config(config: Mapping[str, Any]) -> Any:
    """transformers' config for an architecture dict (a catalog entry's config or a config.json)."""
    from transformers import AutoConfig

    cfg = dict(config)
    if "model_type" not in cfg:
        raise ValueError("hf_config must contain 'model_type'")
    model_type = cfg.pop("model_type")
    for k in CHECKPOINT_KEYS:
        cfg.pop(k, None)
    return AutoConfig.for_model(model_type, **cfg)


def random_init(config: Mapping[str, Any] | Any, attn_implementation: str, dtype: str = "float32") -> Any:
    """The architecture (a dict, or a config from hf_config) with random weights in `dtype` (seed torch first);
    tied embeddings are tied."""
    import torch
    from transformers import AutoModelForCausalLM

    conf = hf_config(config) if isinstance(config, Mapping) else config
    model = AutoModelForCausalLM.from_config(conf, attn_implementation=attn_implementation,
                                             dtype=getattr(torch, dtype))
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    return model


def quantization(bits: int, compute_dtype: Any) -> Any:
    """bitsandbytes' config for a frozen base: NF4 with double quantization (QLoRA), or LLM.int8."""
    from transformers import BitsAndBytesConfig

    if bits == 4:
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=compute_dtype)
    return BitsAndBytesConfig(load_in_8bit=True)


def enable_checkpointing(model: Any) -> None:
    """Non-reentrant checkpointing on every decoder block (transformers 5 names it activation_checkpointing_*;
    it also makes the embedding output require grad, which LoRA needs)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=NON_REENTRANT)
    else:  # transformers < 5
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=NON_REENTRANT)


def add_lora(model: Any, *, rank: int, alpha: int, dropout: float, targets: Sequence[str] | str | None,
             quantized: bool, grad_ckpt: bool) -> Any:
    """The PEFT model with LoRA adapters on `targets` (a list, "all-linear", or None: PEFT's default)."""
    from peft import LoraConfig, get_peft_model

    if quantized:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=grad_ckpt,
                                                gradient_checkpointing_kwargs=NON_REENTRANT)
    target = list(targets) if isinstance(targets, (list, tuple)) else targets
    lora = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=target, task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


# ---- the bundled trainer's model --------------------------------------------------------------------------------
def check_capabilities(cfg: RunConfig) -> None:
    """Fail fast, before loading anything, on choices this machine cannot run."""
    import importlib.util

    import torch

    if cfg.attn == "flash" and not (torch.cuda.is_available() and importlib.util.find_spec("flash_attn")):
        raise ScaletrainError("attn flash needs a CUDA GPU with the flash-attn package installed; "
                              "use --attn sdpa (or eager)")
    needs_bnb = cfg.quantized_base or cfg.optimizer == "adamw-8bit"
    if needs_bnb and not (torch.cuda.is_available() and importlib.util.find_spec("bitsandbytes")):
        what = f"a {cfg.base_bits}-bit base" if cfg.quantized_base else "optimizer adamw-8bit"
        raise ScaletrainError(f"{what} needs bitsandbytes and a CUDA GPU (pip install bitsandbytes); "
                              "use --method lora/full with a 16-bit base and --optimizer adamw here")
    if cfg.quantized_base and cfg.train.model_source == "random-init":
        raise ScaletrainError("a quantized base needs pretrained weights: set the train option model_source to a "
                              "local path or HF cache id (random-init builds full-precision weights)")


def model_config_dict(model_id: str) -> dict[str, Any]:
    return dict(load_model(model_id).config)


def build_model(cfg: RunConfig, device: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    attn = cfg.attn.hf_implementation
    src = cfg.train.model_source
    torch.manual_seed(cfg.train.seed)
    if src == "random-init":
        model = random_init(model_config_dict(cfg.model_id), attn)
    else:
        kwargs: dict[str, Any] = {"local_files_only": True, "attn_implementation": attn}
        if cfg.method != "full":           # frozen base in the compute precision; adapters stay fp32 (peft)
            kwargs["dtype"] = getattr(torch, cfg.precision.torch_dtype)
        if cfg.quantized_base:
            compute = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
            kwargs["quantization_config"] = quantization(cfg.base_bits, compute)
            kwargs["device_map"] = {"": device}
        try:
            model = AutoModelForCausalLM.from_pretrained(src, **kwargs)
        except OSError as e:
            raise ScaletrainError(f"cannot load model {src!r} offline ({str(e).splitlines()[0]}); give a local "
                                  "folder or an id already in the HF cache, or model_source random-init") from None
    model.config.use_cache = False
    if cfg.grad_ckpt:
        enable_checkpointing(model)
    if cfg.method.is_adapter:
        model = add_lora(model, rank=cfg.lora_rank, alpha=cfg.train.lora_alpha or 2 * cfg.lora_rank,
                         dropout=cfg.train.lora_dropout, targets=list(cfg.lora_targets) or None,
                         quantized=cfg.quantized_base, grad_ckpt=cfg.grad_ckpt)
    return model


def make_tokenizer(cfg: RunConfig) -> data_mod.Tokenizer:
    if cfg.train.model_source == "random-init":
        return data_mod.ByteTokenizer(int(model_config_dict(cfg.model_id)["vocab_size"]))
    from transformers import AutoTokenizer

    try:
        return data_mod.HFTokenizer(AutoTokenizer.from_pretrained(cfg.train.model_source, local_files_only=True))
    except OSError as e:
        raise ScaletrainError(f"cannot load the tokenizer of {cfg.train.model_source!r} offline "
                              f"({str(e).splitlines()[0]})") from None


def make_optimizer(cfg: RunConfig, model: Any) -> Any:
    """Weight decay on matrices only (not biases or norms), the usual transformer recipe."""
    import torch

    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [g for g in ({"params": decay, "weight_decay": cfg.train.weight_decay},
                          {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.train.lr)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.train.lr, momentum=SGD_MOMENTUM)
    import bitsandbytes as bnb  # adamw-8bit; availability checked in check_capabilities

    return bnb.optim.AdamW8bit(groups, lr=cfg.train.lr)

"""The model a run trains and the model a measurement measures, built by the same functions.

    hf_config          a catalog / config.json dict → transformers' config (checkpoint-only keys dropped)
    random_init        that config with random weights in a given dtype: built on the meta device, materialised
                       on the target device and initialised there by the model's own init (tied embeddings tied)
    quantized_random_init  a random base quantized with bitsandbytes on load (QLoRA / 8-bit bases from random init)
    quantization       bitsandbytes' config for a 4-bit NF4 (double-quantised) or 8-bit frozen base
    enable_checkpointing  non-reentrant activation checkpointing on every decoder block, as a trainer does
    add_lora           LoRA adapters with PEFT (after prepare_model_for_kbit_training on a quantized base); the
                       target `experts` goes to peft as target_parameters (lora_targets)

build_model / make_tokenizer / make_optimizer put them together for the bundled trainer (a run's RunConfig);
measure.py puts the same pieces together for one measured step. torch, transformers and peft are imported
inside the functions: importing this module is cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from scaletrain.engine.catalog.architectures import load_config
from scaletrain.engine.catalog.moe import MOE_TYPES
from scaletrain.engine.catalog.moe import EXPERT_PARAMETERS, EXPERTS_TARGET
from scaletrain.engine.errors import ScaletrainError
from scaletrain.trainer import data as data_mod
from scaletrain.trainer.config import RunConfig

SGD_MOMENTUM = 0.9                   # the memory model counts one fp32 momentum buffer for sgd
BNB_CPU_VERSION = "0.45"             # bitsandbytes' first release whose 4/8-bit layers and 8-bit optimizers run on CPU
# torch.optim's implementation switches (torch.optim docs: fused, foreach, or neither = the for-loop)
OPTIMIZER_IMPL_KWARGS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}
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
    return AutoConfig.for_model(model_type, **cfg)     # transformers' own classes only: never a folder's code


def causal_lm_from_config(conf: Any, **kwargs: Any) -> Any:
    """transformers' causal LM built from the config object `conf` (AutoModelForCausalLM.from_config's keywords). A
    multimodal family's text config that the auto mapping does not list (mllama's and emu3's text_config, which a
    plan of their config.json reads) is built by the family's own causal-LM class, whose config class it is."""
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if type(conf) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        parts = type(conf).__module__.split(".")       # transformers.models.<family>.configuration_<family>
        name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(parts[2]) if parts[:2] == ["transformers", "models"] else None
        cls = getattr(transformers, name, None) if name else None
        if cls is not None and getattr(cls, "config_class", None) is type(conf):
            return cls._from_config(conf, **kwargs)
    return AutoModelForCausalLM.from_config(conf, **kwargs)


def random_init(config: Mapping[str, Any] | Any, attn_implementation: str, dtype: str = "float32",
                device: Any = "cpu") -> Any:
    """The architecture (a dict, or a config from hf_config) with random weights in `dtype` (seed torch first).

    On `device`: built on the meta device (no memory, no init), materialised there with `to_empty`, then initialised
    there by transformers' own `init_weights` (every module's `_init_weights`, rotary buffers included, then the tied
    embeddings tied), so a GPU run does not wait for a multi-billion-parameter init on the CPU (shared/gpu/README.md:
    tens of seconds for 1.5B on the H100 machine). device None: built the ordinary way, on the CPU, or partitioned
    as it is built by DeepSpeed's zero.Init when ZeRO-3 is on (transformers does that itself, and its ZeRO-3 init
    cannot run on the meta device)."""
    import torch

    conf = hf_config(config) if isinstance(config, Mapping) else config
    if device is None:
        model = causal_lm_from_config(conf, attn_implementation=attn_implementation, dtype=getattr(torch, dtype))
        if getattr(model.config, "tie_word_embeddings", False):
            model.tie_weights()
        return model
    with torch.device("meta"):
        model = causal_lm_from_config(conf, attn_implementation=attn_implementation, dtype=getattr(torch, dtype))
    model.to_empty(device=device)
    model.init_weights()                   # skipped on the meta device; re-run here (it also ties the embeddings)
    return model


def quantized_random_init(config: Mapping[str, Any] | Any, attn_implementation: str, bits: int, dtype: str,
                          device: Any = "cpu") -> Any:
    """A random frozen base quantized by bitsandbytes (4-bit NF4 or LLM.int8) on `device`: bitsandbytes quantizes
    at load time, so the random weights (in `dtype`, the compute dtype) go to a temporary folder and come back
    through from_pretrained with the quantization config, exactly as a pretrained base loads."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    base = random_init(config, attn_implementation, dtype=dtype, device=device)
    torch_dtype = getattr(torch, dtype)
    with tempfile.TemporaryDirectory(prefix="scaletrain-random-base-") as tmp:
        _save_weights(base, Path(tmp))
        del base
        return AutoModelForCausalLM.from_pretrained(tmp, quantization_config=quantization(bits, torch_dtype),
                                                    attn_implementation=attn_implementation, dtype=torch_dtype,
                                                    device_map={"": device}, local_files_only=True,
                                                    trust_remote_code=False)


def _save_weights(model: Any, folder: Path) -> None:
    """config.json + model.safetensors, on every rank (transformers' save_pretrained writes on global rank 0 only
    once torch.distributed is up, and each rank quantizes its own copy); a tied weight is written once."""
    from safetensors.torch import save_file

    model.config.save_pretrained(folder)
    seen: set[int] = set()
    tensors = {}
    for name, t in model.state_dict().items():
        if t.data_ptr() in seen:
            continue                                 # the tied lm_head: from_pretrained ties it again
        seen.add(t.data_ptr())
        tensors[name] = t.detach().contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


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


def moe_block_classes(model: Any) -> list[type]:
    """The classes of the model's mixture-of-experts blocks: a decoder block's child that holds the experts
    (Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock, GptOssMLP …), found by its `experts` child rather than by name
    so every transformers MoE family qualifies. Empty for a dense model."""
    found: list[type] = []
    for module in model.modules():
        if hasattr(module, "experts") and hasattr(module.experts, "parameters") and type(module) not in found:
            found.append(type(module))
    return found


def mark_moe_leaves(model: Any) -> list[str]:
    """ZeRO-3: make every MoE block a leaf module, as TRL and the HF DeepSpeed docs do for Mixtral/Qwen-MoE
    (deepspeed.utils.set_z3_leaf_modules): the block's parameters are gathered whole before it runs, the gather
    unit the memory model counts. (With per-expert modules, as transformers 4 built Mixtral, ZeRO-3's per-module
    hooks saw data-dependent use that differs between ranks; transformers 5 fuses the experts into one module,
    where whether that still matters was not checked here.) Returns the class names."""
    classes = moe_block_classes(model)
    if classes:
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(model, classes)
    return [c.__name__ for c in classes]


def add_lora(model: Any, *, rank: int, alpha: int, dropout: float, targets: Sequence[str] | str | None,
             quantized: bool, grad_ckpt: bool) -> Any:
    """The PEFT model with LoRA adapters on `targets` (a list, "all-linear", or None: PEFT's default)."""
    from peft import LoraConfig, get_peft_model

    if quantized:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=grad_ckpt,
                                                gradient_checkpointing_kwargs=NON_REENTRANT)
    target_modules, target_parameters = lora_targets(targets)
    if target_parameters and dropout:
        raise ScaletrainError(f"LoRA target {EXPERTS_TARGET} needs lora_dropout 0 (got {dropout}): peft's "
                              "ParamWrapper on the fused experts cannot apply dropout")
    lora = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules,
                      target_parameters=target_parameters, task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def lora_targets(targets: Sequence[str] | str | None) -> tuple[list[str] | str | None, list[str] | None]:
    """(target_modules, target_parameters) of peft's LoraConfig for the plan's targets: `experts` becomes every MoE
    block's fused gate_up_proj and down_proj as target_parameters (catalog/moe.py EXPERT_PARAMETERS), the other
    names stay nn.Linear targets (an empty list, not None, when `experts` is the only one: None is peft's default)."""
    if not isinstance(targets, (list, tuple)):
        return targets, None
    if EXPERTS_TARGET not in targets:
        return list(targets), None
    return [t for t in targets if t != EXPERTS_TARGET], list(EXPERT_PARAMETERS)


# ---- the bundled trainer's model --------------------------------------------------------------------------------
def check_capabilities(cfg: RunConfig) -> None:
    """Fail fast, before loading anything, on choices this machine cannot run."""
    import importlib.util

    import torch

    if cfg.attn == "flash" and not (torch.cuda.is_available() and importlib.util.find_spec("flash_attn")):
        raise ScaletrainError("attn flash needs a CUDA GPU with the flash-attn package installed; "
                              "use --attn sdpa (or eager)")
    if cfg.quantized_base or cfg.optimizer == "adamw-8bit":
        what = f"a {cfg.base_bits}-bit base" if cfg.quantized_base else "optimizer adamw-8bit"
        if importlib.util.find_spec("bitsandbytes") is None:
            raise ScaletrainError(f"{what} needs bitsandbytes (pip install 'bitsandbytes>={BNB_CPU_VERSION}'); "
                                  "use --method lora/full with a 16-bit base and --optimizer adamw without it")
        if not torch.cuda.is_available():
            from importlib.metadata import version

            from packaging.version import Version

            have = version("bitsandbytes")
            if Version(have) < Version(BNB_CPU_VERSION):
                raise ScaletrainError(f"{what} on the CPU needs bitsandbytes ≥ {BNB_CPU_VERSION} (installed: {have}; "
                                      "older releases run on CUDA only)")


def model_config_dict(model_id: str) -> dict[str, Any]:
    return load_config(model_id)


def with_experts_implementation(conf: dict[str, Any], experts_impl: str) -> dict[str, Any]:
    """An MoE config with transformers' `experts_implementation` the plan counted (config key, as from_config
    reads it); a dense config unchanged."""
    if conf.get("model_type") in MOE_TYPES:
        return {**conf, "experts_implementation": experts_impl}
    return conf


def _checkpoint_quant_method(src: str) -> str | None:
    """The quantization a checkpoint was saved with (config.json quantization_config.quant_method), if any."""
    try:
        quant = load_config(src).get("quantization_config")
    except ScaletrainError:
        return None
    return quant.get("quant_method") if isinstance(quant, dict) else None


def build_model(cfg: RunConfig, device: Any) -> Any:
    """The model the plan trains, in the dtype the memory model assumes (RunConfig.weights_dtype).

    random-init is materialised on the training device, except under ZeRO-3/FSDP (they shard the parameters; a
    whole model on every GPU is what they avoid): built as transformers builds it there (ZeRO-3: partitioned by
    zero.Init as it is built); a 4/8-bit base is quantized from the random weights on load."""
    import torch
    from transformers import AutoModelForCausalLM

    attn = cfg.attn.hf_implementation
    src = cfg.train.model_source
    dtype = cfg.weights_dtype
    torch.manual_seed(cfg.train.seed)
    if src == "random-init":
        conf = with_experts_implementation(model_config_dict(cfg.model_id), str(cfg.experts_impl))
        where = None if cfg.strategy.shards_params and not cfg.quantized_base else device
        model = (quantized_random_init(conf, attn, cfg.base_bits, dtype, device) if cfg.quantized_base
                 else random_init(conf, attn, dtype=dtype, device=where))
    else:
        # no local_files_only: the hub when reachable (the launcher has downloaded the files and starts the ranks
        # with HF_HUB_OFFLINE=1, engine/launch/prefetch.py), the HF cache otherwise
        kwargs: dict[str, Any] = {"attn_implementation": attn, "dtype": getattr(torch, dtype),
                                  "trust_remote_code": False}
        if load_config(cfg.model_id).get("model_type") in MOE_TYPES:
            kwargs["experts_implementation"] = str(cfg.experts_impl)
        if cfg.quantized_base:
            kwargs["quantization_config"] = quantization(cfg.base_bits, getattr(torch, dtype))
            kwargs["device_map"] = {"": device}
        elif _checkpoint_quant_method(src) == "mxfp4":
            # gpt-oss ships MXFP4 experts; training needs them as bf16 parameters (the plan counts bf16)
            from transformers import Mxfp4Config

            kwargs["quantization_config"] = Mxfp4Config(dequantize=True)
        try:
            model = AutoModelForCausalLM.from_pretrained(src, **kwargs)
        except OSError as e:
            raise ScaletrainError(f"cannot load model {src!r} ({str(e).splitlines()[0]}); give a local folder, an "
                                  "HF id (downloaded at launch when the hub is reachable, else from the HF cache), "
                                  "or model_source random-init") from None
    model.config.use_cache = False
    # the experts implementation transformers resolved and runs (every config carries the field: MoE models only)
    if getattr(model.config, "_experts_implementation", None) and moe_block_classes(model):
        print(f"scaletrain: MoE experts implementation {model.config._experts_implementation} "
              f"(planned {cfg.experts_impl})", flush=True)
    if cfg.strategy == "zero3":
        leaves = mark_moe_leaves(model)
        if leaves:
            print(f"scaletrain: ZeRO-3 leaf modules (gathered whole): {', '.join(leaves)}", flush=True)
    if cfg.grad_ckpt:
        enable_checkpointing(model)
    if cfg.method.is_adapter:
        model = add_lora(model, rank=cfg.lora_rank, alpha=cfg.train.lora_alpha or 2 * cfg.lora_rank,
                         dropout=cfg.train.lora_dropout, targets=list(cfg.lora_targets) or None,
                         quantized=cfg.quantized_base, grad_ckpt=cfg.grad_ckpt)
    return model


def make_tokenizer(cfg: RunConfig) -> data_mod.Tokenizer:
    return tokenizer_for(cfg.model_id, cfg.train.model_source)


def tokenizer_for(model_id: str, source: str | None) -> data_mod.Tokenizer:
    """The tokenizer a run of `model_id` from weights `source` uses (random-init: bytes; else the weights' own)."""
    if source == "random-init":
        return data_mod.ByteTokenizer(int(model_config_dict(model_id)["vocab_size"]))
    from scaletrain.trainer.tokenizer_check import load_checked

    return data_mod.HFTokenizer(load_checked(str(source)))      # an empty tokenizer is an error, never a run


def make_optimizer(cfg: RunConfig, model: Any) -> Any:
    """Weight decay on matrices only (not biases or norms), the usual transformer recipe; torch's optimizers in the
    plan's implementation (fused / foreach / for-loop; fused runs on the CPU too). Under DeepSpeed this is the
    client optimizer DeepSpeed steps."""
    import torch

    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [g for g in ({"params": decay, "weight_decay": cfg.train.weight_decay},
                          {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    impl = OPTIMIZER_IMPL_KWARGS[cfg.optimizer_impl]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.train.lr, **impl)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.train.lr, momentum=SGD_MOMENTUM, **impl)
    import bitsandbytes as bnb  # adamw-8bit (its own kernels; no fused/foreach); checked in check_capabilities

    return bnb.optim.AdamW8bit(groups, lr=cfg.train.lr)

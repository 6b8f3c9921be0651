"""Mixture-of-experts blocks as transformers 5.24 builds them, read from config.json without torch.

The five families counted analytically (qwen3_moe, qwen2_moe, mixtral, olmoe, gpt_oss) all decorate their experts
with `@use_experts_implementation` (transformers/integrations/moe.py): every expert's weights live in two fused 3-D
parameters, `mlp.experts.gate_up_proj` (E, 2I, h) and `mlp.experts.down_proj` (E, h, I) (gpt_oss stores them
transposed, (E, h, 2I) and (E, I, h), with biases (E, 2I) and (E, h)). The router is no nn.Linear either: a weight
(E, h) (+ a bias (E,) on gpt_oss) used through F.linear. qwen2_moe adds a dense shared expert (gate/up/down_proj
nn.Linear of `shared_expert_intermediate_size`) scaled by sigmoid(shared_expert_gate(x)), an nn.Linear(h, 1).
qwen3_moe and qwen2_moe build a dense MLP of `intermediate_size` instead of the MoE block in layers listed in
`mlp_only_layers` or not hit by `decoder_sparse_step` (`(i + 1) % step != 0`), see their DecoderLayer __init__.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from scaletrain.engine.errors import ScaletrainError

MOE_TYPES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss")

# Config keys per family (transformers 5.24 configuration_<family>.py): experts, experts per token, expert width.
# olmoe, mixtral and gpt_oss use `intermediate_size` as the expert width; the Qwen MoE families keep it for the
# dense layers and name the expert width `moe_intermediate_size`.
_KEYS = {
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "qwen2_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "olmoe": ("num_experts", "num_experts_per_tok", "intermediate_size"),
    "mixtral": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
    "gpt_oss": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
}
# The expert count's two spellings: each family's configuration class reads both (attribute_map)
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts")
# Defaults of the same configuration classes, for config.json files that leave a key out.
_DEFAULTS = {
    "qwen3_moe": dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=False),
    "qwen2_moe": dict(num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408, norm_topk_prob=False,
                      shared_expert_intermediate_size=5632),
    "olmoe": dict(num_experts=64, num_experts_per_tok=8, intermediate_size=2048, norm_topk_prob=False),
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=14336, norm_topk_prob=True),
    "gpt_oss": dict(num_local_experts=128, num_experts_per_tok=4, intermediate_size=2880),
}
MAX_EXPERTS = 1 << 14     # sanity limit like architectures.SIZE_LIMITS: released MoEs have at most a few hundred


@dataclass(frozen=True)
class MoeSpec:
    """The MoE MLP of one block, and which blocks have it."""

    experts: int                  # E
    top_k: int                    # experts per token
    expert_intermediate: int      # I of one expert
    shared_intermediate: int = 0  # qwen2_moe's shared expert width (0: none)
    norm_topk: bool = False       # top-k probabilities renormalised to sum 1 (mixtral always)
    router_bias: bool = False     # gpt_oss
    expert_bias: bool = False     # gpt_oss: gate_up_proj_bias (E, 2I), down_proj_bias (E, h)
    dense_layers: tuple[int, ...] = ()   # block indices built with a dense MLP of intermediate_size instead
    aux_loss: bool = False        # output_router_logits: the load-balancing loss over every layer's router logits
    router: str = "softmax_topk"  # "softmax_topk": fp32 softmax then top-k; "topk_softmax" (gpt_oss): softmax of
                                  # the top-k logits
    scores_fp32: bool = False     # mixtral keeps the routing weights in fp32 (no cast back to the logits' dtype)
    gate: str = "silu"            # "silu": act(gate)·up; "clamped_swiglu" (gpt_oss): interleaved, clamped, (up+1)·glu

    def expert_weight_params(self, h: int) -> int:
        """The fused expert parameters of one MoE block: gate_up_proj + down_proj (+ their biases)."""
        E, i = self.experts, self.expert_intermediate
        n = E * (2 * i * h + i * h)
        if self.expert_bias:
            n += E * (2 * i + h)
        return n

    def router_params(self, h: int) -> int:
        return self.experts * h + (self.experts if self.router_bias else 0)

    def active_expert_params(self, h: int) -> int:
        """The expert parameters one token runs through: top_k of the E experts."""
        return self.expert_weight_params(h) // self.experts * self.top_k

    def tensor_count(self) -> int:
        """Parameter tensors of the routed part: router weight (+ bias), gate_up_proj, down_proj (+ 2 biases)."""
        return 1 + (1 if self.router_bias else 0) + 2 + (2 if self.expert_bias else 0)


def moe_from_config(model_type: str, cfg: Mapping[str, Any], num_layers: int, name: str) -> MoeSpec | None:
    """The MoE spec of a config.json, or None for dense families (and MoE configs with zero experts)."""
    if model_type not in MOE_TYPES:
        return None
    d = _DEFAULTS[model_type]
    ek, kk, ik = _KEYS[model_type]

    def get(key: str) -> Any:
        v = cfg.get(key)
        if v is None and model_type == "gpt_oss" and key == "num_experts_per_tok":
            v = cfg.get("num_experts_per_token")       # the name in OpenAI's original config.json
        if v is None and key in EXPERT_COUNT_KEYS:
            # transformers reads either spelling (attribute_map) and writes its own: Qwen3MoeConfig in 5.24 saves
            # num_local_experts where the hub's Qwen3 MoE configs say num_experts (the default, 128, stood in)
            v = cfg.get(next(k for k in EXPERT_COUNT_KEYS if k != key))
        return d.get(key) if v is None else v

    def whole(key: str, lo: int = 1) -> int:
        v = get(key)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= MAX_EXPERTS * 1024:
            raise ScaletrainError(f"{name}: config.json {key} must be a whole number ≥ {lo} (got {v!r})")
        return v

    experts = whole(ek, 0)
    if experts == 0:     # Qwen MoE configs with num_experts 0 build dense MLPs everywhere
        return None
    top_k = whole(kk)
    if top_k > experts or experts > MAX_EXPERTS:
        raise ScaletrainError(f"{name}: config.json {kk} {top_k} must be at most {ek} {experts} "
                              f"(at most {MAX_EXPERTS:,} experts)")
    dense: tuple[int, ...] = ()
    if model_type in ("qwen3_moe", "qwen2_moe"):
        step = whole("decoder_sparse_step") if cfg.get("decoder_sparse_step") is not None else 1
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, (list, tuple)) or not all(isinstance(x, int) for x in only):
            raise ScaletrainError(f"{name}: config.json mlp_only_layers must be a list of layer indices")
        dense = tuple(i for i in range(num_layers) if i in only or (i + 1) % step != 0)
    return MoeSpec(
        experts=experts, top_k=top_k, expert_intermediate=whole(ik),
        shared_intermediate=whole("shared_expert_intermediate_size") if model_type == "qwen2_moe" else 0,
        # mixtral's router always renormalises; gpt_oss's softmax over the top-k needs no renormalising
        norm_topk=model_type == "mixtral" or (model_type != "gpt_oss" and bool(get("norm_topk_prob"))),
        router_bias=model_type == "gpt_oss", expert_bias=model_type == "gpt_oss", dense_layers=dense,
        aux_loss=bool(cfg.get("output_router_logits", False)),
        router="topk_softmax" if model_type == "gpt_oss" else "softmax_topk",
        scores_fp32=model_type == "mixtral", gate="clamped_swiglu" if model_type == "gpt_oss" else "silu",
    )


# peft 0.21 converts LoRA targets for MoE families whose experts transformers 5 fused
# (peft/utils/transformers_weight_conversion.py: _MOE_TARGET_MODULE_MAPPING and _MOE_FUSED_TARGETS, applied to the
# model types transformers' conversion_mapping._MODEL_TO_CONVERSION_PATTERN sends to "qwen2_moe", plus mixtral):
# the v4 names of the expert projections leave target_modules and become target_parameters on the fused 3-D
# experts; a fused pair (gate + up) must be named whole and gets rank 2r. qwen2_moe itself and gpt_oss are not
# converted (their gate/up/down_proj targets adapt qwen2_moe's shared expert).
PEFT_EXPERT_TARGETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "qwen3_moe": (("gate_proj", "up_proj"), ("down_proj",)),
    "olmoe": (("gate_proj", "up_proj"), ("down_proj",)),
    "mixtral": (("w1", "w3"), ("w2",)),
}


# The LoRA target `experts`: every MoE block's fused gate_up_proj and down_proj through peft's explicit
# target_parameters (LoraConfig(target_parameters=EXPERT_PARAMETERS), wrapped by peft's ParamWrapper at rank r), the
# way the gpt-oss fine-tuning cookbook adapts experts. Every family keeps them at these module paths. On the families
# peft converts, the explicit parameters and the converted ones are one set (peft wraps each parameter once), and a
# fused pair named whole keeps its rank 2r (peft's rank_pattern applies to the parameter whoever named it).
EXPERTS_TARGET = "experts"
EXPERT_PARAMETERS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def peft_expert_ranks(model_type: str, spec: MoeSpec | None, targets: tuple[str, ...]) -> tuple[int, int]:
    """The ranks, in units of r, of peft's adapters on gate_up_proj and down_proj (0: not adapted) for `targets`.
    Refused in one line: `experts` on a model without experts, half of a fused pair peft converts."""
    if spec is None:
        if EXPERTS_TARGET in targets:
            raise ScaletrainError(f"LoRA target {EXPERTS_TARGET} adapts the fused experts of a mixture-of-experts "
                                  f"model; {model_type} has none (target its linear layers instead)")
        return 0, 0
    names = PEFT_EXPERT_TARGETS.get(model_type)
    gu = dn = 0
    if names is not None:
        fused, down = names
        hit = [t for t in fused if t in targets]
        if hit and len(hit) < len(fused):
            missing = ", ".join(t for t in fused if t not in hit)
            raise ScaletrainError(f"LoRA target {', '.join(hit)} needs {missing} too on {model_type}: peft adapts "
                                  "them together, fused into the experts' gate_up_proj")
        gu, dn = (len(fused) if hit else 0), int(all(t in targets for t in down))
    if EXPERTS_TARGET in targets:
        gu, dn = gu or 1, dn or 1
    return gu, dn


def peft_expert_lora(model_type: str, spec: MoeSpec | None, h: int, rank: int,
                     targets: tuple[str, ...]) -> tuple[int, bool, bool]:
    """(trainable parameters per MoE block, gate_up_proj adapted, down_proj adapted) for LoRA `targets`.

    peft's ParamWrapper on a 3-D parameter of rank R trains lora_A (R·E, in) and lora_B (out, R·E): R·E·(in + out),
    whichever way the parameter is laid out ((E, out, in), or gpt_oss's transposed (E, in, out); its biases stay
    frozen); gate_up_proj (in h, out 2I) gets R = 2r where peft converted a fused pair, else r; down_proj R = r.
    """
    gu, dn = peft_expert_ranks(model_type, spec, targets)
    if spec is None:
        return 0, False, False
    E, i = spec.experts, spec.expert_intermediate
    return gu * rank * E * (h + 2 * i) + dn * rank * E * (i + h), bool(gu), bool(dn)


def peft_converted_names(model_type: str) -> tuple[str, ...]:
    """Target names peft moves from nn.Linear modules to the experts on this family (none elsewhere)."""
    names = PEFT_EXPERT_TARGETS.get(model_type)
    return names[0] + names[1] if names else ()

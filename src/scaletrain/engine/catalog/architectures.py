"""Model architectures from config.json, and exact parameter accounting without torch.

A model is its config: the bundled catalog (engine/catalog/models/*.json), a path to a config.json or a folder
holding one, or an id found in the local Hugging Face cache (offline). Parameter counts are derived from the
architecture's module list (`linear_shapes`, `other_params`), so LoRA counts, FLOPs and the largest ZeRO-3 gather
unit all come from the same table. Tests check the counts against transformers building the same config.
A model_type without an analytic layout (`memory_source` "traced") takes its module list and counts from a trace of
the real model instead (engine/catalog/traced.py), never from another family's layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from scaletrain.engine.catalog.config_json import REQUIRED_KEYS, SIZE_LIMITS, size_field, text_config, widest_layer
from scaletrain.engine.catalog.resolve import resolve_config
from scaletrain.engine.catalog.moe import MoeSpec, moe_from_config, peft_converted_names, peft_expert_lora
from scaletrain.engine.catalog.unmodeled import UNMODELED_CHECKPOINTING, UNMODELED_EAGER
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog import traced as _traced
from scaletrain.engine.catalog.entries import CATALOG_DIR, catalog_entry, catalog_ids, did_you_mean  # noqa: F401 - re-exported


# Decoder-block layouts of the families counted analytically. A model_type not listed is traced instead, never
# read from these (engine/catalog/traced.py: its real modules and saved bytes measured by measure/trace.py, cached).
#   qkv_bias:  "flag" → q,k,v,o follow config.attention_bias; "qkv" → q,k,v always biased, o not (Qwen2);
#              "qkv_flag" → q,k,v follow config.qkv_bias (default True), o not (Qwen2-MoE)
#   qk_norm:   None | "head" (RMSNorm over head_dim, Qwen3/Gemma3) | "full" (over all heads, OLMo2)
#   norms:     which RMSNorms a block has: pre-attention, post-attention, pre-MLP, post-MLP
#   norm_style how the RMSNorm multiplies its weight, which decides what it saves for backward:
#              "llama" weight * y.to(input dtype); "olmo" (weight * y).to(input dtype); "gemma" y * (1 + weight) in fp32
#   sinks:     a learned per-head attention sink (gpt_oss `self_attn.sinks`, num_heads values per block)
# The MoE families' MLP is described by catalog/moe.py (ModelArch.moe).
_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(qkv_bias="flag", qk_norm=None, norms=("pre_attn", "pre_mlp"), norm_style="llama"),
    "mistral": dict(qkv_bias="flag", qk_norm=None, norms=("pre_attn", "pre_mlp"), norm_style="llama"),
    "qwen2": dict(qkv_bias="qkv", qk_norm=None, norms=("pre_attn", "pre_mlp"), norm_style="llama"),
    "qwen3": dict(qkv_bias="flag", qk_norm="head", norms=("pre_attn", "pre_mlp"), norm_style="llama"),
    "gemma3_text": dict(qkv_bias="flag", qk_norm="head", norms=("pre_attn", "post_attn", "pre_mlp", "post_mlp"),
                        norm_style="gemma"),
    "gemma2": dict(qkv_bias="flag", qk_norm=None, norms=("pre_attn", "post_attn", "pre_mlp", "post_mlp"),
                   norm_style="gemma"),
    "olmo2": dict(qkv_bias="flag", qk_norm="full", norms=("post_attn", "post_mlp"), norm_style="olmo"),
    # transformers 5.24 models/<family>/modeling_<family>.py
    "qwen3_moe": dict(qkv_bias="flag", qk_norm="head", norms=("pre_attn", "pre_mlp"), norm_style="llama"),
    "qwen2_moe": dict(qkv_bias="qkv_flag", qk_norm=None, norms=("pre_attn", "pre_mlp"), norm_style="llama"),
    "mixtral": dict(qkv_bias="flag", qk_norm=None, norms=("pre_attn", "pre_mlp"), norm_style="llama"),
    "olmoe": dict(qkv_bias="flag", qk_norm="full", norms=("pre_attn", "pre_mlp"), norm_style="llama"),
    "gpt_oss": dict(qkv_bias="flag", qk_norm=None, norms=("pre_attn", "pre_mlp"), norm_style="olmo", sinks=True),
}
# config.attention_bias when config.json leaves it out (GptOssConfig defaults it to True)
_ATTENTION_BIAS_DEFAULT = {"gpt_oss": True}

# Families whose transformers model class sets _supports_sdpa = False (transformers 5.24 modeling files)
_NO_SDPA = frozenset({"gpt_oss", "gemma2"})   # _supports_sdpa False in transformers 5.24 (gemma2: its logit softcap)
BLOCK_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Every LoRA target name some family's block has as an nn.Linear (peft matches target_modules by name suffix)
KNOWN_LINEARS = BLOCK_LINEARS + ("shared_expert_gate",)
# ... the names peft 0.21 maps onto fused MoE experts (Mixtral's v4 names), and `experts` (target_parameters; moe.py)
KNOWN_TARGETS = KNOWN_LINEARS + ("w1", "w2", "w3", "experts")


@dataclass(frozen=True)
class ModelArch:
    """The fields of a causal-LM config that decide memory and FLOPs."""

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_embeddings: bool
    attention_bias: bool = False
    mlp_bias: bool = False
    config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), compare=False, hash=False,
                                      repr=False)
    exact_params: int | None = field(default=None, compare=False)   # set when counted by transformers (traced)
    # a traced model's structure (engine/catalog/traced.py): its real block modules, parameters and tensors
    trace: Mapping[str, Any] | None = field(default=None, compare=False, hash=False, repr=False)
    score_head: bool = False       # a sequence classifier with one output (reward model): h×1 score, no lm_head
    moe: MoeSpec | None = None     # the MoE MLP (catalog/moe.py); None for dense models

    # ---- structure -------------------------------------------------------------------------------------------
    @property
    def memory_source(self) -> str:
        """Where the per-block numbers come from: "analytic" (the layout table) or "traced" (measure/trace.py)."""
        return "analytic" if self.model_type in _FAMILIES else "traced"

    @property
    def family(self) -> dict[str, Any]:
        """The analytic layout; for a traced model only what its trace measured: its norms (by count), no
        qk-norm or bias rule (the linears' biases are in `linear_shapes`)."""
        if self.trace is None:
            if self.model_type not in _FAMILIES:
                raise ScaletrainError(f"model_type {self.model_type[:40]!r} has no analytic layout and was not traced "
                                      "(load it with arch_from_config or load_model, which trace it)")
            return _FAMILIES[self.model_type]
        return dict(qkv_bias=None, qk_norm=None, norms=tuple(f"norm{k}" for k in range(self.trace["block_norms"])),
                    norm_style=None, traced=True)

    @property
    def default_lora_targets(self) -> tuple[str, ...]:
        """Every linear of a block: the analytic seven, or a traced model's own (phi3: qkv_proj, gate_up_proj)."""
        if self.trace is None:
            return BLOCK_LINEARS
        names = list(self.trace["linears"])
        refused = self.trace.get("peft_refuses")     # a structure recorded with it; else peft is asked (mamba out_proj)
        if refused is None:
            refused = _traced.peft_refuses(self.config, names, analytic_types())
        return tuple(n for n in names if n not in refused)

    @property
    def block_linear_names(self) -> tuple[str, ...]:
        """A block's linears by the names LoRA targets take (the analytic seven, or a traced model's own)."""
        return tuple(self.linear_shapes()) if self.trace is not None else BLOCK_LINEARS

    @property
    def can_checkpoint(self) -> bool:
        """transformers checkpoints its layers (a traced class's supports_gradient_checkpointing: not jetmoe's), and
        the model counts what checkpointing leaves (not UNMODELED_CHECKPOINTING's)."""
        if self.model_type in UNMODELED_CHECKPOINTING:
            return False
        return self.trace is None or self.trace.get("checkpointing") is not False

    @property
    def attention_implementations(self) -> tuple[str, ...]:
        """The --attn values transformers runs for this family: gpt_oss has no sdpa path (its attention sinks need
        the scores; GptOssPreTrainedModel._supports_sdpa = False), only eager and flash kernels with sinks."""
        if self.trace is not None and self.trace.get("attn_implementations"):   # the model class's own flags
            return tuple(self.trace["attn_implementations"])
        kernels = ("eager", "flash") if self.model_type in _NO_SDPA else ("eager", "sdpa", "flash")
        return tuple(k for k in kernels if not (k == "eager" and self.model_type in UNMODELED_EAGER))

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def linear_shapes(self, dense: bool = False) -> dict[str, tuple[int, int, bool]]:
        """(in_features, out_features, has_bias) of each nn.Linear in one decoder block, named as peft matches them.

        An MoE model's block (the default): attention, and qwen2_moe's shared expert and its gate; the routed
        experts are 3-D parameters (`expert_params`), the router a bare weight. `dense=True`: a dense layer of an
        MoE model (mlp_only_layers / decoder_sparse_step), with the ordinary MLP of intermediate_size. A traced
        model: the modules its trace found.
        """
        if self.trace is not None:
            return {k: (int(a), int(o), bool(b)) for k, (a, o, b) in self.trace["linears"].items()}
        h, i = self.hidden_size, self.intermediate_size
        style = self.family["qkv_bias"]
        qkv_b = True if style == "qkv" else self.attention_bias
        o_b = False if style in ("qkv", "qkv_flag") else self.attention_bias
        out = {"q_proj": (h, self.q_dim, qkv_b), "k_proj": (h, self.kv_dim, qkv_b),
               "v_proj": (h, self.kv_dim, qkv_b), "o_proj": (self.q_dim, h, o_b)}
        if self.moe is None or dense:
            out.update(gate_proj=(h, i, self.mlp_bias), up_proj=(h, i, self.mlp_bias), down_proj=(i, h, self.mlp_bias))
        elif self.moe.shared_intermediate:
            si = self.moe.shared_intermediate
            out.update(gate_proj=(h, si, False), up_proj=(h, si, False), down_proj=(si, h, False),
                       shared_expert_gate=(h, 1, False))
        return out

    def linear_kinds(self) -> tuple[tuple[int, dict[str, tuple[int, int, bool]]], ...]:
        """(blocks, linear_shapes of one) per block layout: a traced model's kinds each with its own linears
        (deepseek_v3's dense first layers and its MoE layers differ), or block_kinds()."""
        if self.trace is None:
            return tuple((n, self.linear_shapes(d)) for d, n in self.block_kinds())
        return tuple((int(k["count"]), {n: (int(a), int(o), bool(b)) for n, (a, o, b) in k["linears"].items()})
                     for k in self.trace["kinds"])

    def block_kinds(self) -> tuple[tuple[bool, int], ...]:
        """(dense, how many blocks) for each block layout of the model: one kind for dense models and MoE models
        without dense layers, two when some layers of an MoE model are dense."""
        if self.moe is None:
            return ((False, self.num_layers),)
        nd = len(self.moe.dense_layers)
        return tuple(k for k in ((False, self.num_layers - nd), (True, nd)) if k[1])

    def expert_params(self) -> int:
        """The routed experts' fused parameters of one MoE block (gate_up_proj, down_proj and their biases)."""
        return self.moe.expert_weight_params(self.hidden_size) if self.moe else 0

    def buffer_bytes(self, float_bytes: int, cast_whole: bool = False) -> int:
        """A traced model's buffers, floating ones at `float_bytes` but those a 16-bit build keeps in their own dtype
        (gptj's sin/cos) unless the module is cast whole (DeepSpeed); none for an analytic layout (rotary: KiBs)."""
        t = self.trace or {}
        fixed = int(t.get("buffer_fixed_elems", 0)) * float_bytes if cast_whole else int(t.get("buffer_fixed_bytes", 0))
        return int(t.get("buffer_float_elems", 0)) * float_bytes + int(t.get("buffer_other_bytes", 0)) + fixed

    def block_linear_params(self, dense: bool = False) -> int:
        return sum(a * b + (b if bias else 0) for a, b, bias in self.linear_shapes(dense).values())

    def block_norm_params(self) -> int:
        if self.trace is not None:      # everything in the block that is not a linear
            return int(self.trace["block_params"]) - self.block_linear_params()
        fam = self.family
        n = len(fam["norms"]) * self.hidden_size
        if fam["qk_norm"] == "head":
            n += 2 * self.head_dim
        elif fam["qk_norm"] == "full":
            n += self.q_dim + self.kv_dim
        return n + (self.num_heads if fam.get("sinks") else 0)

    def block_params(self, dense: bool | None = None, active: bool = False) -> int:
        """Parameters of one block (`dense=None`: the largest block kind). `active`: those one token runs
        through (the router and top_k of the experts instead of all of them). Remembered per model (a non-field
        that equality and JSON ignore): the planner's search asks thousands of times."""
        memo = self.__dict__.setdefault("_block_params_memo", {})
        if (dense, active) not in memo:
            memo[(dense, active)] = self._block_params(dense, active)
        return memo[(dense, active)]

    def _block_params(self, dense: bool | None, active: bool) -> int:
        if self.trace is not None:      # the largest layer kind
            return int(self.trace["block_params"])
        if dense is None:
            return max(self.block_params(d, active) for d, _ in self.block_kinds())
        n = self.block_linear_params(dense) + self.block_norm_params()
        if self.moe is not None and not dense:
            h = self.hidden_size
            n += self.moe.router_params(h)
            n += self.moe.active_expert_params(h) if active else self.moe.expert_weight_params(h)
        return n

    def block_tensor_count(self, dense: bool | None = None) -> int:
        """Parameter tensors in one block (weights, biases, norm weights): optimizers keep per-tensor state."""
        if self.trace is not None:
            return int(self.trace["block_tensors"])
        if dense is None:
            return max(self.block_tensor_count(d) for d, _ in self.block_kinds())
        n = sum(2 if bias else 1 for _, _, bias in self.linear_shapes(dense).values())
        n += len(self.family["norms"]) + (2 if self.family["qk_norm"] else 0) + (1 if self.family.get("sinks") else 0)
        return n + (self.moe.tensor_count() if self.moe is not None and not dense else 0)

    @property
    def tensor_count(self) -> int:
        head = 1 if self.score_head else (0 if self.tie_embeddings else 1)
        if self.trace is not None:
            own_head = 1 if self.trace["lm_head_params"] else 0
            return int(self.trace["tensor_count"]) - own_head + head
        return 1 + sum(n * self.block_tensor_count(d) for d, n in self.block_kinds()) + 1 + head

    @property
    def embedding_params(self) -> int:
        if self.trace is not None:
            return int(self.trace["embedding_params"])
        return self.vocab_size * self.hidden_size

    @property
    def largest_param_elems(self) -> int:
        """Elements of the model's largest parameter tensor: for-loop AdamW's sqrt and div temporaries have its
        size. Usually the embedding; roc_bert's shape embedding (24858×512) and an MoE block's fused experts
        (E, 2I, h) can be larger. A traced model: as its meta build has it (older traces: the embedding)."""
        if self.trace is not None:
            return int(self.trace.get("largest_param") or self.embedding_params)
        linears = [*self.linear_shapes().values(), *(self.linear_shapes(dense=True).values() if self.moe else ())]
        block = max((a * o for a, o, _ in linears), default=0)
        if self.moe is not None:
            block = max(block, self.moe.experts * 2 * self.moe.expert_intermediate * self.hidden_size)
        return max(self.embedding_params, self.lm_head_params, block)

    @property
    def lm_head_params(self) -> int:
        """The output head's own parameters: an untied lm_head (V×h), none when tied, or a reward model's score."""
        if self.score_head:
            return self.hidden_size
        if self.trace is not None:
            return int(self.trace["lm_head_params"])
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    @property
    def vocab_head(self) -> bool:
        """The model ends in an lm_head over the vocabulary (a reward model's score head does not)."""
        return not self.score_head

    def with_score_head(self) -> "ModelArch":
        """The same backbone as AutoModelForSequenceClassification(num_labels=1) builds it (transformers'
        GenericForSequenceClassification: `score = Linear(h, 1, bias=False)` in place of lm_head)."""
        if self.score_head:
            return self
        from dataclasses import replace

        exact = None if self.exact_params is None else self.exact_params - self.lm_head_params + self.hidden_size
        return replace(self, score_head=True, exact_params=exact)

    @property
    def params(self) -> int:
        """Exact parameter count, tied embeddings counted once."""
        if self.exact_params is not None:
            return self.exact_params
        return self._count(active=False)

    @property
    def active_params(self) -> int:
        """Parameters one token runs through: `params` with each MoE block's experts cut to top_k (the router and
        a shared expert run for every token); equal to `params` for dense models."""
        if self.moe is None:
            return self.params
        return self._count(active=True)

    def _count(self, active: bool) -> int:
        blocks = sum(n * self.block_params(d, active) for d, n in self.block_kinds())
        return self.embedding_params + blocks + self.hidden_size + self.lm_head_params

    @property
    def largest_gather_params(self) -> int:
        """The largest unit ZeRO-3/FSDP gathers at once: a decoder block (an MoE block whole, as a ZeRO-3 leaf
        module) or the (un)tied embedding matrix."""
        return max(self.block_params(), self.embedding_params)

    def lora_target_shapes(self, targets: tuple[str, ...] | None = None,
                           dense: bool = False) -> dict[str, tuple[int, int, bool]]:
        """The requested LoRA targets that exist as an nn.Linear in this block kind (peft adapts exactly those;
        on qwen3_moe, olmoe and mixtral it moves the expert names to the fused experts instead, catalog/moe.py)."""
        shapes = self.linear_shapes(dense)
        moved = peft_converted_names(self.model_type)
        wanted = tuple(targets) if targets else self.default_lora_targets
        return {t: shapes[t] for t in wanted if t in shapes and t not in moved}

    def expert_lora(self, rank: int, targets: tuple[str, ...] | None = None) -> tuple[int, bool, bool]:
        """peft's adapters on one MoE block's fused experts: (parameters, gate_up_proj adapted, down_proj adapted)."""
        return peft_expert_lora(self.model_type, self.moe, self.hidden_size, rank,
                                tuple(targets) if targets else BLOCK_LINEARS)

    def _moe_blocks(self) -> int:
        return sum(n for d, n in self.block_kinds() if not d) if self.moe is not None else 0

    def _per_kind(self, targets: tuple[str, ...] | None, per_linear) -> int:
        return sum(n * sum(per_linear(a, o) for a, o, _ in self.lora_target_shapes(targets, d).values())
                   for d, n in self.block_kinds())

    def lora_params(self, rank: int, targets: tuple[str, ...] | None = None) -> int:
        """Exact LoRA trainable count: r·(in+out) per adapted linear, over all blocks. peft adapts every module whose
        name ends in a target, so a target this family's blocks lack (gate_proj on qwen3_moe's MoE blocks) adapts
        nothing there; a name no family has, or targets of which none exists here, is refused. A traced model: peft's
        own count on the real model (measure/trace.py), fused experts and every layer kind included."""
        targets = tuple(targets) if targets else self.default_lora_targets
        known = tuple(self.linear_shapes()) if self.trace is not None else KNOWN_TARGETS   # a traced model's own
        unknown = [t for t in targets if t not in known]
        if unknown:
            raise ScaletrainError(
                f"unknown LoRA target(s) {', '.join(unknown)}; accepted: {', '.join(known)}")
        if self.trace is not None:
            return rank * int(self._traced_lora(targets)["per_rank"])
        n = self._per_kind(targets, lambda a, o: rank * (a + o))
        n += self._moe_blocks() * self.expert_lora(rank, targets)[0]
        if n == 0:
            have = sorted({t for d, _ in self.block_kinds() for t in self.linear_shapes(d)})
            raise ScaletrainError(f"none of the LoRA targets {', '.join(targets)} is a linear layer of "
                                  f"{self.model_type}'s blocks; it has: {', '.join(have)}")
        return n

    def lora_params_by_layer(self, rank: int, targets: tuple[str, ...] | None = None) -> tuple[int, ...]:
        """A traced model's LoRA trainable count per decoder layer, in order (peft's own); () when not known (an
        analytic model, whose blocks the memory model counts by kind)."""
        if self.trace is None:
            return ()
        return tuple(rank * int(n) for n in self._traced_lora(targets).get("per_rank_by_layer", ()))

    def _traced_lora(self, targets: tuple[str, ...] | None) -> Mapping[str, int]:
        return _traced.lora(self.config, tuple(sorted(targets or self.default_lora_targets)), analytic_types())

    def adapted_linears(self, targets: tuple[str, ...] | None = None) -> int:
        """How many modules LoRA adapts over all blocks (nn.Linear, and peft's wrappers of fused expert weights)."""
        if self.trace is not None:
            return int(self._traced_lora(targets)["adapted"])
        _, gu, dn = self.expert_lora(1, targets)
        return self._per_kind(targets, lambda a, o: 1) + self._moe_blocks() * (int(gu) + int(dn))

    def linear_weight_params(self) -> int:
        """Weights (no bias) of every nn.Linear in the blocks: what bitsandbytes quantizes whatever LoRA targets
        (the fused experts and the router are no nn.Linear: they stay 16-bit)."""
        return sum(n * sum(a * o for a, o, _ in lin.values()) for n, lin in self.linear_kinds())

    def targeted_linear_params(self, targets: tuple[str, ...] | None = None) -> int:
        """Weights (no bias) of the targeted nn.Linear modules: those LoRA adapts (bitsandbytes quantizes every
        block linear whatever the targets: linear_weight_params). A traced model's: by leaf name or path."""
        if self.trace is None:
            return self._per_kind(targets, lambda a, o: a * o)
        wanted = set(targets or ())
        return sum(n * sum(a * o for name, (a, o, _) in lin.items()
                           if not wanted or name.rsplit(".", 1)[-1] in wanted or name in wanted)
                   for n, lin in self.linear_kinds())

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "model_type": self.model_type, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_layers": self.num_layers,
            "num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim,
            "vocab_size": self.vocab_size, "tie_embeddings": self.tie_embeddings, "params": self.params,
            "head": "score" if self.score_head else "lm_head",
            **({"experts": self.moe.experts, "experts_per_token": self.moe.top_k,
                "active_params": self.active_params} if self.moe else {}),
            "memory_source": self.memory_source,      # never the cache's state: plan.json is the same either way
        }

    def memory_source_line(self) -> str:
        """One line for the plan's text: where the memory model's numbers come from."""
        if self.trace is None:
            return f"memory: analytic layout of {self.model_type}"
        cached = " (cached)" if _traced.source(self.config) == "traced (cached)" else ""
        n, kinds = self.trace.get("slice_layers", 2), len(self.trace.get("kinds", ())) or 1
        what = f"{kinds} layer kinds" if kinds > 1 else "one layer kind"
        return f"memory: traced from a {n}-layer slice of {self.model_type} ({what}){cached}"


# ---- loading ---------------------------------------------------------------------------------------------------
def arch_from_config(cfg: Mapping[str, Any], name: str, structure: Mapping[str, Any] | None = None) -> ModelArch:
    """Build a ModelArch from a config.json dict; raise ScaletrainError for anything that is not a causal LM.
    `structure`: a traced model's structure recorded with its catalog entry (else traced or read from the cache)."""
    cfg = text_config(cfg)
    config = dict(cfg)
    missing = [k for k in REQUIRED_KEYS if k not in cfg]
    if missing and str(cfg.get("model_type")) not in _FAMILIES and "model_type" in cfg:
        cfg, structure = _sizes_from_trace(cfg, structure)      # GPT-2's n_embd, n_layer, n_head …
        missing = [k for k in REQUIRED_KEYS if k not in cfg]
    if missing:
        raise ScaletrainError(
            f"{name} is not a causal-LM config.json (missing {', '.join(missing)}); "
            "give a catalog id (scaletrain models), a config.json, or a folder holding one")
    model_type = str(cfg.get("model_type", "llama"))[:100]
    if model_type not in _FAMILIES:
        cfg = widest_layer(cfg)
    h = size_field(cfg, "hidden_size", name)
    heads = size_field(cfg, "num_attention_heads", name)
    kv = size_field(cfg, "num_key_value_heads", name, heads)
    if heads % kv:
        raise ScaletrainError(f"{name}: config.json num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv} (each key/value head serves a whole group of query heads)")
    if cfg.get("head_dim") is None and h % heads:
        raise ScaletrainError(f"{name}: config.json hidden_size {h} is not divisible by num_attention_heads {heads} "
                              "(give head_dim when the heads do not split the hidden size)")
    head_dim = size_field(cfg, "head_dim", name, h // heads)
    inter = size_field(cfg, "intermediate_size", name, 4 * h if 4 * h <= SIZE_LIMITS["intermediate_size"] else None)
    arch = ModelArch(
        name=name, model_type=model_type, hidden_size=h, intermediate_size=inter,
        num_layers=size_field(cfg, "num_hidden_layers", name), num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        vocab_size=size_field(cfg, "vocab_size", name),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", model_type in ("gemma3_text", "gemma2"))),
        attention_bias=bool(cfg.get("qkv_bias", True) if model_type == "qwen2_moe" else
                            cfg.get("attention_bias", _ATTENTION_BIAS_DEFAULT.get(model_type, False))),
        mlp_bias=bool(cfg.get("mlp_bias", False)), config=MappingProxyType(config),
        moe=moe_from_config(model_type, cfg, size_field(cfg, "num_hidden_layers", name), name),
    )
    if model_type not in _FAMILIES:
        arch = _with_trace(arch, structure)
    return arch


def _sizes_from_trace(cfg: dict[str, Any], structure: Mapping[str, Any] | None) -> tuple[dict, Mapping[str, Any]]:
    """A traced family's sizes as transformers' config object answers them (its attribute_map), from the trace's
    structure; a model without attention heads (a state-space stack) counts one head as wide as the model."""
    struct = structure if structure is not None else _traced.structure(cfg, analytic_types())
    sizes = dict(struct.get("sizes") or {})
    if "hidden_size" in sizes and "num_attention_heads" not in sizes and "num_attention_heads" not in cfg:
        sizes.update(num_attention_heads=1, num_key_value_heads=1, head_dim=sizes["hidden_size"])
    return {**sizes, **cfg}, struct


def analytic_types() -> str:
    """The model_types with an analytic layout, for messages."""
    return ", ".join(sorted(_FAMILIES))


def _with_trace(arch: ModelArch, structure: Mapping[str, Any] | None = None) -> ModelArch:
    """A model_type without an analytic layout: its real modules and exact counts from a trace (cached, built on the
    meta device by engine/catalog/traced.py), or as its catalog entry recorded one (checked by test_traced.py)."""
    from dataclasses import replace

    struct = structure if structure is not None else _traced.structure(arch.config, analytic_types())
    head_out = struct.get("head_out")      # the logits' width, where the class sizes its head its own way
    # the model's own decoder layers: longcat_flash's config counts two a layer (every gradient twice, +19 %)
    kinds = struct.get("layer_kinds")
    depth = len(kinds) if isinstance(kinds, (list, tuple)) and kinds else arch.num_layers
    return replace(arch, trace=MappingProxyType(dict(struct)), exact_params=int(struct["params"]),
                   tie_embeddings=bool(struct["tied"]), num_layers=depth,
                   vocab_size=int(head_out) if isinstance(head_out, int) and head_out > 0 else arch.vocab_size)


def load_model(spec: str, *, offline_only: bool = False) -> ModelArch:
    """Resolve --model: catalog id, config.json path, folder with config.json, an HF cache id, or (unless
    offline_only) an HF id whose config.json alone is fetched from the hub (catalog/hub.py)."""
    cfg, name, structure = resolve_config(spec, offline_only)
    return arch_from_config(cfg, name, structure)


def load_config(spec: str) -> dict[str, Any]:
    """The causal LM's config dict (a multimodal config's text part) for --model, resolved offline, nothing counted:
    what the trainer builds from (no meta-device build, which under ZeRO-3 would go through zero.Init)."""
    cfg, _, _ = resolve_config(spec, True)
    return text_config(cfg)

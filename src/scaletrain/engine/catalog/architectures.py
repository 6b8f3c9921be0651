"""Model architectures from config.json, and exact parameter accounting without torch.

A model is its config: the bundled catalog (engine/catalog/models/*.json), a path to a config.json or a folder
holding one, or an id found in the local Hugging Face cache (offline). Parameter counts are derived from the
architecture's module list (`linear_shapes`, `other_params`), so LoRA counts, FLOPs and the largest ZeRO-3 gather
unit all come from the same table. Tests check the counts against transformers building the same config.
A model_type without an analytic layout (`memory_source` "traced") takes its module list and counts from a trace of
the real model instead (engine/model/traced.py), never from another family's layout.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.model import traced as _traced

CATALOG_DIR = Path(__file__).parent / "models"

# Decoder-block layouts of the families counted analytically. A model_type not listed is traced instead
# (engine/model/traced.py: its real modules and saved bytes measured once by trainer/trace.py, then cached);
# nothing reads these layouts for it.
#   qkv_bias:  "flag" → q,k,v,o follow config.attention_bias; "qkv" → q,k,v always biased, o not (Qwen2)
#   qk_norm:   None | "head" (RMSNorm over head_dim, Qwen3/Gemma3) | "full" (over all heads, OLMo2)
#   norms:     which RMSNorms a block has: pre-attention, post-attention, pre-MLP, post-MLP
#   norm_style how the RMSNorm multiplies its weight, which decides what it saves for backward:
#              "llama" weight * y.to(input dtype); "olmo" (weight * y).to(input dtype); "gemma" y * (1 + weight) in fp32
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
}

BLOCK_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


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
    # a traced model's structure (engine/model/traced.py): its real block modules, parameters and tensors
    trace: Mapping[str, Any] | None = field(default=None, compare=False, hash=False, repr=False)
    score_head: bool = False       # a sequence classifier with one output (reward model): h×1 score, no lm_head

    # ---- structure -------------------------------------------------------------------------------------------
    @property
    def memory_source(self) -> str:
        """Where the memory model's per-block numbers come from: "analytic" (the layout table above) or
        "traced" (trainer/trace.py measured a slice of the real model)."""
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
        return BLOCK_LINEARS if self.trace is None else tuple(self.trace["linears"])

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int, bool]]:
        """(in_features, out_features, has_bias) of each linear layer in one decoder block."""
        if self.trace is not None:
            return {k: (int(a), int(o), bool(b)) for k, (a, o, b) in self.trace["linears"].items()}
        h, i = self.hidden_size, self.intermediate_size
        fam = self.family
        qkv_b = True if fam["qkv_bias"] == "qkv" else self.attention_bias
        o_b = False if fam["qkv_bias"] == "qkv" else self.attention_bias
        return {
            "q_proj": (h, self.q_dim, qkv_b),
            "k_proj": (h, self.kv_dim, qkv_b),
            "v_proj": (h, self.kv_dim, qkv_b),
            "o_proj": (self.q_dim, h, o_b),
            "gate_proj": (h, i, self.mlp_bias),
            "up_proj": (h, i, self.mlp_bias),
            "down_proj": (i, h, self.mlp_bias),
        }

    def block_linear_params(self) -> int:
        return sum(a * b + (b if bias else 0) for a, b, bias in self.linear_shapes().values())

    def block_norm_params(self) -> int:
        if self.trace is not None:      # everything in the block that is not a linear
            return int(self.trace["block_params"]) - self.block_linear_params()
        fam = self.family
        n = len(fam["norms"]) * self.hidden_size
        if fam["qk_norm"] == "head":
            n += 2 * self.head_dim
        elif fam["qk_norm"] == "full":
            n += self.q_dim + self.kv_dim
        return n

    def block_params(self) -> int:
        return self.block_linear_params() + self.block_norm_params()

    def block_tensor_count(self) -> int:
        """Parameter tensors in one block (weights, biases, norm weights): optimizers keep per-tensor state."""
        if self.trace is not None:
            return int(self.trace["block_tensors"])
        n = sum(2 if bias else 1 for _, _, bias in self.linear_shapes().values())
        n += len(self.family["norms"]) + (2 if self.family["qk_norm"] else 0)
        return n

    @property
    def tensor_count(self) -> int:
        head = 1 if self.score_head else (0 if self.tie_embeddings else 1)
        if self.trace is not None:
            own_head = 1 if self.trace["lm_head_params"] else 0
            return int(self.trace["tensor_count"]) - own_head + head
        return 1 + self.num_layers * self.block_tensor_count() + 1 + head

    @property
    def embedding_params(self) -> int:
        if self.trace is not None:
            return int(self.trace["embedding_params"])
        return self.vocab_size * self.hidden_size

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
        return (self.embedding_params + self.num_layers * self.block_params() + self.hidden_size
                + self.lm_head_params)

    @property
    def largest_gather_params(self) -> int:
        """The largest unit ZeRO-3/FSDP gathers at once: a decoder block or the (un)tied embedding matrix."""
        return max(self.block_params(), self.embedding_params)

    def lora_params(self, rank: int, targets: tuple[str, ...] | None = None) -> int:
        """Exact LoRA trainable count: r·(in+out) per adapted linear, over all blocks."""
        shapes = self.linear_shapes()
        targets = tuple(targets) if targets else self.default_lora_targets
        unknown = [t for t in targets if t not in shapes]
        if unknown:
            raise ScaletrainError(
                f"unknown LoRA target(s) {', '.join(unknown)}; accepted: {', '.join(shapes)}")
        per_block = sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)
        return per_block * self.num_layers

    def targeted_linear_params(self, targets: tuple[str, ...] | None = None) -> int:
        """Weights (no bias) of the targeted linears: what QLoRA quantizes and LoRA freezes."""
        shapes = self.linear_shapes()
        targets = tuple(targets) if targets else self.default_lora_targets
        return self.num_layers * sum(shapes[t][0] * shapes[t][1] for t in targets)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "model_type": self.model_type, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_layers": self.num_layers,
            "num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim,
            "vocab_size": self.vocab_size, "tie_embeddings": self.tie_embeddings, "params": self.params,
            "head": "score" if self.score_head else "lm_head",
            "memory_source": self.memory_source if self.trace is None else _traced.source(self.config),
        }

    def memory_source_line(self) -> str:
        """One line for the plan's text: where the memory model's numbers come from."""
        if self.trace is None:
            return f"memory: analytic layout of {self.model_type}"
        cached = " (cached)" if _traced.source(self.config) == "traced (cached)" else ""
        return f"memory: traced from a {_traced.slice_layers(self.config)}-layer slice of {self.model_type}{cached}"


# ---- loading ---------------------------------------------------------------------------------------------------
def _text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Multimodal configs (Gemma 3) keep the language model under text_config."""
    cfg = dict(cfg)
    if "text_config" in cfg and isinstance(cfg["text_config"], dict) and "hidden_size" not in cfg:
        text = dict(cfg["text_config"])
        text.setdefault("model_type", str(cfg.get("model_type", "")) + "_text")
        text.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", True))
        return text
    return cfg


_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# Sanity limits on config.json sizes: every released causal LM is far inside them, and a value outside is a typo or
# a damaged file that would otherwise surface as a ZeroDivisionError, an OverflowError or a minutes-long search.
SIZE_LIMITS = {"hidden_size": 1 << 18, "intermediate_size": 1 << 20, "num_hidden_layers": 4096,
               "num_attention_heads": 1 << 12, "num_key_value_heads": 1 << 12, "head_dim": 1 << 14,
               "vocab_size": 1 << 24}
MAX_CONFIG_BYTES = 16 << 20           # a config.json is a few KiB; anything this large is not one
MAX_SPEC_CHARS = 4096                 # PATH_MAX: no catalog id, path or cache id is longer


def _size(cfg: Mapping[str, Any], key: str, name: str, default: int | None = None) -> int:
    """A positive whole-number size field of config.json (an integral float such as 4096.0 is accepted)."""
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise ScaletrainError(f"{name}: config.json has no {key}")
        return default
    ok = isinstance(v, int) and not isinstance(v, bool)
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v, ok = int(v), True
    limit = SIZE_LIMITS[key]
    if not ok or not 1 <= v <= limit:
        raise ScaletrainError(f"{name}: config.json {key} must be a whole number from 1 to {limit:,} "
                              f"(got {_short(cfg.get(key))})")
    return v


def _short(v: Any, limit: int = 40) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + "…"


def arch_from_config(cfg: Mapping[str, Any], name: str, structure: Mapping[str, Any] | None = None) -> ModelArch:
    """Build a ModelArch from a config.json dict; raise ScaletrainError for anything that is not a causal LM.
    `structure`: a traced model's structure recorded with its catalog entry (else traced or read from the cache)."""
    cfg = _text_config(cfg)
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise ScaletrainError(
            f"{name} is not a causal-LM config.json (missing {', '.join(missing)}); "
            "give a catalog id (scaletrain models), a config.json, or a folder holding one")
    model_type = str(cfg.get("model_type", "llama"))[:100]
    h = _size(cfg, "hidden_size", name)
    heads = _size(cfg, "num_attention_heads", name)
    kv = _size(cfg, "num_key_value_heads", name, heads)
    if heads % kv:
        raise ScaletrainError(f"{name}: config.json num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv} (each key/value head serves a whole group of query heads)")
    if cfg.get("head_dim") is None and h % heads:
        raise ScaletrainError(f"{name}: config.json hidden_size {h} is not divisible by num_attention_heads {heads} "
                              "(give head_dim when the heads do not split the hidden size)")
    head_dim = _size(cfg, "head_dim", name, h // heads)
    inter = _size(cfg, "intermediate_size", name, 4 * h if 4 * h <= SIZE_LIMITS["intermediate_size"] else None)
    arch = ModelArch(
        name=name, model_type=model_type, hidden_size=h, intermediate_size=inter,
        num_layers=_size(cfg, "num_hidden_layers", name), num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        vocab_size=_size(cfg, "vocab_size", name),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", model_type in ("gemma3_text", "gemma2"))),
        attention_bias=bool(cfg.get("attention_bias", False)), mlp_bias=bool(cfg.get("mlp_bias", False)),
        config=MappingProxyType(dict(cfg)),
    )
    if model_type not in _FAMILIES:
        arch = _with_trace(arch, structure)
    return arch


def analytic_types() -> str:
    """The model_types with an analytic layout, for messages."""
    return ", ".join(sorted(_FAMILIES))


def _with_trace(arch: ModelArch, structure: Mapping[str, Any] | None = None) -> ModelArch:
    """A model_type without an analytic layout: its real modules and exact counts from a trace (cached; the first
    time a subprocess builds it on the meta device, engine/model/traced.py), or as its catalog entry recorded one
    (tests/test_traced.py checks those against a fresh trace)."""
    from dataclasses import replace

    struct = structure if structure is not None else _traced.structure(arch.config, analytic_types())
    return replace(arch, trace=MappingProxyType(dict(struct)), exact_params=int(struct["params"]),
                   tie_embeddings=bool(struct["tied"]))


@lru_cache(maxsize=None)
def _catalog_index() -> dict[str, Path]:
    out = {}
    for p in sorted(CATALOG_DIR.glob("*.json")):
        out[p.stem.replace("--", "/").lower()] = p
    return out


def catalog_ids() -> list[str]:
    return [json.loads(p.read_text())["id"] for p in _catalog_index().values()]


@lru_cache(maxsize=None)
def catalog_entry(model_id: str) -> dict[str, Any] | None:
    key = model_id.lower().strip()
    idx = _catalog_index()
    path = idx.get(key)
    if path is None:  # forgiving: "Qwen3-4B" without the org
        hits = [p for k, p in idx.items() if k.split("/")[-1] == key]
        path = hits[0] if len(hits) == 1 else None
    return json.loads(path.read_text()) if path else None


def _hf_cache_config(model_id: str) -> Path | None:
    """<cache>/models--org--name/snapshots/<rev>/config.json without touching the network (catalog/hub.py)."""
    from scaletrain.engine.catalog.hub import cached_file

    return cached_file(model_id)


def did_you_mean(spec: str) -> str | None:
    """The nearest catalog id to a mistyped or newer-version id (difflib on the id, then on the name alone)."""
    import difflib

    ids = catalog_ids()
    name = spec.split("/")[-1].lower()
    prefixed = [i for i in ids if name.startswith(i.split("/")[-1].lower())]    # Qwen3-4B-Instruct → Qwen3-4B
    if prefixed:
        return max(prefixed, key=len)
    hit = difflib.get_close_matches(spec, ids, n=1, cutoff=0.6)
    if not hit:
        names = {i.split("/")[-1].lower(): i for i in ids}
        near = difflib.get_close_matches(spec.split("/")[-1].lower(), list(names), n=1, cutoff=0.6)
        hit = [names[near[0]]] if near else []
    return hit[0] if hit else None


def _read_config(path: Path, spec: str) -> dict[str, Any]:
    """A config.json as a dict, or one line saying why not (unreadable, too large, not JSON, not an object)."""
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ScaletrainError(f"{spec}: {path.name} is {path.stat().st_size:,} bytes, not a config.json "
                                  f"(at most {MAX_CONFIG_BYTES >> 20} MiB)")
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else e.__class__.__name__
        where = spec if str(path) == spec else f"{spec} ({path})"
        raise ScaletrainError(f"{where} is not a JSON config.json ({why})") from None
    if not isinstance(cfg, dict):
        raise ScaletrainError(f"{spec} is not a config.json object" if str(path) == spec
                              else f"{spec} ({path}) is not a config.json object")
    return cfg


def load_model(spec: str, *, offline_only: bool = False) -> ModelArch:
    """Resolve --model: catalog id, config.json path, folder with config.json, an HF cache id, or (unless
    offline_only) an HF id whose config.json alone is fetched from the hub (catalog/hub.py)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ScaletrainError("--model is empty; give a catalog id (see `scaletrain models`) or a config.json path")
    if len(spec) > MAX_SPEC_CHARS:
        raise ScaletrainError(f"--model is {len(spec):,} characters long; give a catalog id, a config.json path or "
                              f"an HF cache id (at most {MAX_SPEC_CHARS} characters)")
    entry = catalog_entry(spec)
    if entry is not None:
        return arch_from_config(entry["config"], entry["id"], entry.get("traced_structure"))
    p = Path(spec).expanduser()
    try:
        exists = p.exists()
    except (OSError, ValueError) as e:      # a name too long for the filesystem, a NUL byte
        raise ScaletrainError(f"--model {_short(spec)} is not a usable path ({getattr(e, 'strerror', None) or e})"
                              ) from None
    if exists:
        if p.is_dir():
            p = p / "config.json"
            if not p.exists():
                raise ScaletrainError(f"{spec} is a folder without a config.json")
        cfg = _read_config(p, spec)
        name = p.parent.name if p.name == "config.json" else p.stem
        return arch_from_config(cfg, name)
    cached = _hf_cache_config(spec)
    if cached is not None:
        return arch_from_config(_read_config(cached, spec), spec)
    from scaletrain.engine.catalog.hub import HF_ID, cache_roots, fetch_config

    why = "not an HF id (org/name)" if not HF_ID.match(spec) else "the hub was not asked"
    if HF_ID.match(spec) and not offline_only:
        fetched, why = fetch_config(spec)
        if fetched is not None:
            return arch_from_config(_read_config(fetched, spec), spec)
    near = did_you_mean(spec)
    raise ScaletrainError(
        f"unknown model {_short(spec, 100)}: not in the catalog ({len(_catalog_index())} models, `scaletrain "
        f"models`), not a path, not in the HF cache at {cache_roots()[0]}, and {why}; pass a config.json path"
        + (f" (did you mean {near}?)" if near else ""))

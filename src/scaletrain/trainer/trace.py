"""Trace a model family that has no analytic layout: measure what its blocks are and what they save for backward.

    python -m scaletrain.trainer.trace < request.json > trace.json      (one request)
    python -m scaletrain.trainer.trace --serve                          (JSON lines in, JSON lines out)

`--serve` is how the engine runs it (engine/catalog/traced.py): one process per planning process, transformers
imported once, every structure, regime and LoRA count of a plan answered by it.

A request is `{"config": <config.json dict>, "regime": null | {"method", "lora_rank", "lora_targets", "precision",
"attn", "windowed"?, "chunked"?}}` (precision in trainer/measure.py's names), or `"regimes": [...]` (answered as
`activations_by_regime`, in order), or `"lora_targets": [...] | null` (answered as `lora`). The answer:

- `structure` (always): the real model built on the meta device (no memory): its exact parameter count, the
  embedding and output-head sizes, and its decoder layers grouped into KINDS by structural signature (the layer's
  class, every submodule's class and plain attributes — sliding or not, linear or full attention, MoE or dense,
  mamba or attention — and every parameter's shape; derived from the module tree, no per-family table), each kind
  with its count, parameters, tensors and nn.Linear modules; and the slice that holds one of each kind: the
  shortest prefix of the stack whose layers have the same signatures as the real model's first layers.
- `activations` (per regime): that slice at the real widths, random init, one forward + loss under
  `torch.autograd.graph.saved_tensors_hooks` at four sequence lengths (micro-batch 1), each saved storage counted
  once and kept alive until the forward ends (so no freed address is reused and taken for another). The lengths are
  multiples of every kernel chunk the config names (`chunk_size`: mamba2's scan) and of the gated delta rule's 64,
  so padded chunked kernels are traced as they run. Each layer's bytes are split into its attention half and its MLP
  half and fitted with NON-NEGATIVE coefficients as c0 + c1·S + c2·S² through the first three lengths; the fourth
  must be predicted within FIT_TOLERANCE or the trace refuses in one line. Per kind: the largest coefficients of its
  layers in the slice. Outside the blocks: `shared` (the ids the embedding keeps, and tensors every block receives:
  rotary tables, masks), `final_norm`, `head_input`; the logits, log-softmax and labels are the engine's.
- `lora` (LoRA regimes and LoRA requests): peft's own count on the meta-device model with the run's targets —
  trainable parameters per unit of rank and adapted modules — as the trainer's `add_lora` builds it.

Failures print ONE line (stderr, or `{"error": ...}` when serving) and exit 2. torch / transformers are imported
inside functions.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
from fractions import Fraction
from typing import Any

from scaletrain.engine.catalog.traced import MAX_GRANULE, TRACE_FORMAT
from scaletrain.trainer.saved_activations import decoder_layers

# The gated delta rule's torch kernel pads every sequence to a multiple of its 64-token chunk
# (transformers/models/qwen3_next/modeling_qwen3_next.py torch_chunk_gated_delta_rule(chunk_size=64)); 64 is also a
# multiple of every smaller power-of-two tile. Trace lengths are multiples of it and of the config's chunk sizes.
BASE_GRANULE = 64
TRACE_MULTIPLES = (1, 2, 3, 4)   # lengths granule × these: three fit, the fourth checks
# A fitted half may miss the checking length by this share of the slice's saved bytes there (MoE routing of a
# random init moves a few tokens between experts from one length to the next); else the trace refuses.
FIT_TOLERANCE = 0.02
# A sliding window or attention chunk the planned sequences exceed is traced as this one, shorter than the traced
# lengths, so its masks and repeated k/v are in the fit.
WINDOWED_TRACE = 8
# The slice's vocabulary: prime, so no hidden, head or MLP width equals it and the vocabulary-wide tensors
# (logits, log-softmax) can be told apart by their last dimension.
SLICE_VOCAB = 509
# The most the slice's weights may take in the traced dtype on this CPU.
MAX_SLICE_BYTES = 4 << 30
ATTN_NAMES = ("self_attn", "attention", "attn", "self_attention", "mixer", "mamba", "linear_attn", "temporal_block")
MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe")
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
# attributes that number a layer rather than shape it (left out of the signature)
_NUMBERING = re.compile(r"idx|index|layer_id|layer_num|layer_no|block_id", re.I)


class TraceError(Exception):
    """A trace that cannot run: the message is the one line the engine shows."""


# ---- the model, on the meta device ----------------------------------------------------------------------------

def _meta_model(config: dict):
    import torch
    from transformers import AutoModelForCausalLM

    from scaletrain.trainer import model as model_lib

    conf = model_lib.hf_config(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(conf)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    return model


def block_linears(layer) -> dict[str, list]:
    """name → [in, out, bias] of each nn.Linear in one block: the leaf name (what peft matches a target against
    by suffix), or the path within the block when two linears share a leaf name."""
    import torch

    found = [(n, m) for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)]
    leaves = [n.rsplit(".", 1)[-1] for n, _ in found]
    out = {}
    for (path, mod), leaf in zip(found, leaves):
        key = leaf if leaves.count(leaf) == 1 else path
        out[key] = [int(mod.in_features), int(mod.out_features), mod.bias is not None]
    return out


def _plain(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str)) or (
        isinstance(v, (tuple, list)) and len(v) <= 16 and all(isinstance(x, (bool, int, float, str)) for x in v))


def layer_signature(layer) -> str:
    """What makes two decoder layers the same kind: classes, plain attributes and parameter shapes of the module
    tree (a layer's number left out)."""
    parts = [type(layer).__name__]
    for name, mod in layer.named_modules():
        attrs = sorted((k, repr(v)) for k, v in vars(mod).items()
                       if not k.startswith("_") and k != "training" and _plain(v) and not _NUMBERING.search(k))
        parts.append(f"{name}:{type(mod).__name__}:{attrs}")
    for name, p in layer.named_parameters():
        parts.append(f"{name}:{tuple(p.shape)}:{p.dtype}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _norm_modules(layer) -> int:
    """Modules of the block that own parameters and are not linears (its norms)."""
    import torch

    return sum(1 for _, m in layer.named_modules() if not isinstance(m, torch.nn.Linear)
               and any(True for _ in m.parameters(recurse=False)))


def _kinds(layers) -> tuple[list[dict], list[int], list[str]]:
    """The layers grouped by signature, in order of first appearance: (kinds, kind of each layer, signatures)."""
    sigs = [layer_signature(layer) for layer in layers]
    order: dict[str, int] = {}
    kinds: list[dict] = []
    for i, (sig, layer) in enumerate(zip(sigs, layers)):
        if sig not in order:
            order[sig] = len(kinds)
            params = list(layer.parameters())
            kinds.append({"first": i, "count": 0, "label": type(layer).__name__,
                          "params": sum(int(p.numel()) for p in params), "tensors": len(params),
                          "linears": block_linears(layer), "norms": _norm_modules(layer)})
        kinds[order[sig]]["count"] += 1
    return kinds, [order[s] for s in sigs], sigs


def structure(config: dict) -> dict[str, Any]:
    """The real model's parameters, its layer kinds and the slice that holds one of each (meta device)."""
    model = _meta_model(config)
    unique = {id(p): p for p in model.parameters()}
    layers = decoder_layers(model)
    if not layers:
        raise TraceError("transformers' model has no list of decoder layers to trace")
    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    emb_params = int(emb.weight.numel()) if emb is not None and hasattr(emb, "weight") else 0
    tied = head is not None and emb is not None and getattr(head, "weight", None) is getattr(emb, "weight", 0)
    head_params = 0 if head is None or tied else sum(int(p.numel()) for p in head.parameters())
    kinds, layer_kinds, sigs = _kinds(layers)
    linears: dict[str, list] = {}
    for k in kinds:
        for name, shape in k["linears"].items():
            linears.setdefault(name, shape)
    largest = max(kinds, key=lambda k: (k["params"], k["tensors"]))
    return {
        "params": int(sum(p.numel() for p in unique.values())),
        "embedding_params": emb_params, "lm_head_params": head_params, "tied": bool(tied),
        "block_params": largest["params"], "block_tensors": largest["tensors"], "linears": linears,
        "block_norms": largest["norms"], "tensor_count": len(unique),
        "kinds": kinds, "layer_kinds": layer_kinds, "slice_layers": _slice_depth(config, sigs),
    }


# ---- the slice ------------------------------------------------------------------------------------------------
def _depth_key(config: dict) -> str:
    for key in DEPTH_KEYS:
        if isinstance(config.get(key), int) and not isinstance(config.get(key), bool):
            return key
    raise TraceError("config.json names no number of layers (num_hidden_layers)")


def prefix_config(config: dict, n: int) -> dict:
    """The config of the first `n` layers: per-layer lists and strings cut to n, layer-numbered maps and index
    lists kept below n; the vocabulary small, special token ids moved inside it."""
    cfg = dict(config)
    key = _depth_key(cfg)
    depth = cfg[key]
    for k, v in config.items():
        if isinstance(v, (list, str)) and len(v) == depth and depth > 1 and k not in ("model_type",):
            cfg[k] = v[:n]
        elif isinstance(v, dict) and v and all(str(x).isdigit() for x in v) and "layer" in k:
            cfg[k] = {x: y for x, y in v.items() if int(x) < n}
        elif (isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
              and "layer" in k and max(v) < depth):
            cfg[k] = [x for x in v if x < n]
    cfg[key] = n
    cfg["vocab_size"] = SLICE_VOCAB
    for k in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        v = cfg.get(k)
        if isinstance(v, int) and v >= SLICE_VOCAB:
            cfg[k] = SLICE_VOCAB - 1
        elif isinstance(v, list):
            cfg[k] = [x if not isinstance(x, int) or x < SLICE_VOCAB else SLICE_VOCAB - 1 for x in v]
    return cfg


def _slice_depth(config: dict, sigs: list[str]) -> int:
    """The shortest prefix holding every kind whose layers are signed as the real model's first layers."""
    depth = len(sigs)
    firsts = {}
    for i, s in enumerate(sigs):
        firsts.setdefault(s, i)
    n = max(max(firsts.values()) + 1, min(2, depth))
    while n < depth:
        try:
            got = [layer_signature(x) for x in decoder_layers(_meta_model(prefix_config(config, n)))]
        except Exception:          # noqa: BLE001 - a prefix transformers refuses: try a longer one
            got = []
        if got == sigs[:n]:
            return n
        n += 1
    return depth


def _check_slice_size(struct: dict, precision: str, model_type: str) -> None:
    per = 4 if precision in ("fp32", "bf16") else 2
    n = struct["slice_layers"]
    kinds = struct["kinds"]
    need = per * sum(kinds[k]["params"] for k in struct["layer_kinds"][:n])
    if need > MAX_SLICE_BYTES:
        raise TraceError(f"the {n}-layer slice of {model_type} that holds each of its {len(kinds)} layer kinds is "
                         f"{need / 2**30:.1f} GiB in the traced dtype, over the {MAX_SLICE_BYTES >> 30} GiB a trace "
                         "may take on this CPU (no reduced-width trace is proven exact for it)")


def granule(config: dict) -> int:
    """Trace lengths are multiples of this: the gated delta rule's chunk and every kernel chunk the config names."""
    g = BASE_GRANULE
    for k, v in config.items():
        if "chunk" in k and isinstance(v, int) and not isinstance(v, bool) and 1 < v <= MAX_GRANULE:
            g = g * v // math.gcd(g, v)
    return g


def _windows(cfg: dict, regime: dict) -> None:
    """A window or attention chunk shorter than the planned sequences: traced as one shorter than the traced ones."""
    if regime.get("windowed"):
        cfg["sliding_window"] = WINDOWED_TRACE
    if regime.get("chunked"):
        for k, v in list(cfg.items()):
            if "chunk" in k and isinstance(v, int) and v > MAX_GRANULE:
                cfg[k] = WINDOWED_TRACE


def _tensors_in(x) -> list:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors_in(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors_in(v)]
    return []


def _child(layer, names: tuple[str, ...], cls_word: str):
    for name, mod in layer.named_children():
        if name in names or cls_word in type(mod).__name__:
            return mod
    return None


class _Recorder:
    """Saved storages by where forward was when autograd first packed them. Every packed tensor is kept alive
    until the forward ends, so a storage's address stays its own: a freed temporary cannot hand its address to a
    later saved tensor, which would then be taken for the first and go uncounted."""

    def __init__(self, torch, excluded: set, count_passed: bool = False):
        self.torch, self.excluded = torch, excluded
        self.count_passed = count_passed   # checkpointing: what a layer receives is held until its recompute
        self.scope = "shared"
        self.shared_keys: set = set()
        self.alive: list = []
        self.seen: dict = {}            # storage key → [bytes, scope, shape, dtype]

    def pack(self, t):
        from scaletrain.trainer.measure import storage_key

        torch = self.torch
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta":
            self.alive.append(t)
            k = storage_key(t)
            if k not in self.excluded:
                nb = t.untyped_storage().nbytes()
                rec = self.seen.get(k)
                scope = "shared" if k in self.shared_keys else self.scope
                if rec is None:
                    self.seen[k] = [nb, scope, tuple(t.shape), t.dtype]
                elif nb > rec[0]:
                    rec[0] = nb
        return t

    def hooks(self, model) -> list:
        from scaletrain.trainer.measure import storage_key

        out = []
        layers = decoder_layers(model)

        def enter(i):
            def hook(module, args, kwargs):
                passed = _tensors_in(list(args[1:])) + _tensors_in({k: v for k, v in kwargs.items()
                                                                    if k != "hidden_states"})
                self.shared_keys.update(storage_key(t) for t in passed)
                if self.count_passed:
                    scope, self.scope = self.scope, "shared"
                    for t in passed:
                        self.pack(t)
                    self.scope = scope
                self.alive += passed
                self.scope = f"layer{i}.attn"
            return hook

        def half(i, name):
            def hook(module, args):
                self.scope = f"layer{i}.{name}"
            return hook

        def leave(module, args, output):
            self.scope = "final_norm"

        for i, layer in enumerate(layers):
            out.append(layer.register_forward_pre_hook(enter(i), with_kwargs=True))
            out.append(layer.register_forward_hook(leave))
            for name, names, word in (("attn", ATTN_NAMES, "Attention"), ("mlp", MLP_NAMES, "MLP")):
                child = _child(layer, names, word)
                if child is not None:
                    out.append(child.register_forward_pre_hook(half(i, name)))
        head = model.get_output_embeddings()

        def head_in(module, args):
            self.scope = "head_input"

        def head_out(module, args, output):
            self.scope = "loss"
        out.append(head.register_forward_pre_hook(head_in))
        out.append(head.register_forward_hook(head_out))
        return out


class _Live:
    """Bytes of the storages created since it started and still alive (each storage once, freed when torch frees
    it), and the highest of them within each open window: a layer's forward, a layer's backward (from the gradient
    of its output to the gradient of its input). Allocations inside one kernel are not seen: a kernel's own scratch
    is the one thing this reads from the analytic side."""

    def __init__(self, torch):
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode

        self.torch, self.weakref = torch, weakref
        self.live = 0
        self.keys: dict = {}
        self.windows: dict[str, list[int]] = {}     # name → [live at start, peak], while open
        self.rises: dict[str, int] = {}
        live = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                live.created(out)
                return out
        self.mode = Mode()

    def created(self, out) -> None:
        from torch.utils._pytree import tree_flatten

        for t in tree_flatten(out)[0]:
            if isinstance(t, self.torch.Tensor) and t.layout == self.torch.strided and t.device.type != "meta":
                st = t.untyped_storage()
                key = st._cdata
                if key in self.keys:
                    continue
                nb = st.nbytes()
                self.keys[key] = self.weakref.ref(st, lambda _, k=key, n=nb: self._freed(k, n))
                self.live += nb
                for w in self.windows.values():
                    if self.live > w[1]:
                        w[1] = self.live

    def _freed(self, key, nb: int) -> None:
        if self.keys.pop(key, None) is not None:
            self.live -= nb

    def open(self, name: str) -> None:
        self.windows[name] = [self.live, self.live]

    def close(self, name: str) -> None:
        """The window's rise (its peak over its start) is kept; later allocations no longer raise it."""
        w = self.windows.pop(name, None)
        if w is not None:
            self.rises[name] = w[1] - w[0]

    def close_all(self) -> dict[str, int]:
        for name in list(self.windows):
            self.close(name)
        return self.rises


def _first_tensor(x):
    found = _tensors_in(x)
    return found[0] if found else None


def _window_hooks(model, live: _Live) -> list:
    """Each decoder layer's forward and backward as a window of `live` (the backward's ends are gradient hooks on
    the layer's output and input)."""
    out = []
    for i, layer in enumerate(decoder_layers(model)):
        def pre(module, args, kwargs, i=i):
            live.open(f"fwd{i}")
            x = _first_tensor(list(args[:1])) if args else _first_tensor(kwargs.get("hidden_states"))
            if x is not None and x.requires_grad:
                x.register_hook(lambda g, i=i: live.close(f"bwd{i}"))

        def post(module, args, output, i=i):
            live.close(f"fwd{i}")
            y = _first_tensor(output)
            if y is not None and y.requires_grad:
                y.register_hook(lambda g, i=i: live.open(f"bwd{i}"))
        out.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        out.append(layer.register_forward_hook(post))
    return out


def _warm_up(harness, seq_len: int) -> None:
    import torch

    from scaletrain.trainer.measure import make_batches

    (ids,) = make_batches(1, 1, seq_len, harness.vocab_size, harness.device, 0)
    with torch.no_grad(), harness.autocast():
        harness.model(input_ids=ids, labels=ids)


def _saved_by_scope(harness, seq_len: int, batch: int = 1) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """One forward + loss + backward at micro-batch 1: saved bytes per scope, the largest per-token tensor per
    scope, and per layer the rise of live bytes in its forward (`fwd{i}`) and in its backward (`bwd{i}`)."""
    import torch

    from scaletrain.trainer.measure import make_batches, storage_key

    model = harness.model
    excluded = {storage_key(t) for t in list(model.parameters()) + list(model.buffers())}
    rec = _Recorder(torch, excluded, count_passed=any(getattr(m, "gradient_checkpointing", False) is True
                                                        for m in model.modules()))
    live = _Live(torch)
    (ids,) = make_batches(1, batch, seq_len, harness.vocab_size, harness.device, 0)
    rec.scope = "shared"
    hooks = rec.hooks(model) + _window_hooks(model, live)
    try:
        with live.mode, torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t), harness.autocast():
            loss = model(input_ids=ids, labels=ids).loss
        rec.alive.clear()
        with live.mode:
            loss.backward()
    finally:
        for h in hooks:
            h.remove()
    del loss
    model.zero_grad(set_to_none=True)
    total: dict[str, int] = {}
    largest: dict[str, int] = {}
    for nb, scope, shape, dtype in rec.seen.values():
        if scope == "loss" or (shape and shape[-1] == SLICE_VOCAB):
            continue              # logits, log-softmax, labels: the engine's cross-entropy terms
        total[scope] = total.get(scope, 0) + nb
        if list(shape).count(seq_len) == 1:
            largest[scope] = max(largest.get(scope, 0), nb // (seq_len * batch))
    return total, largest, live.close_all()


# ---- the fit --------------------------------------------------------------------------------------------------
def _solve(points: list[tuple[Fraction, Fraction]], free: tuple[int, ...]) -> list[Fraction] | None:
    """Least squares of bytes = Σ c_k·S^k over the powers in `free` (normal equations, exact fractions)."""
    n = len(free)
    a = [[sum(x ** (free[i] + free[j]) for x, _ in points) for j in range(n)] for i in range(n)]
    b = [sum(y * x ** free[i] for x, y in points) for i in range(n)]
    for col in range(n):                       # Gauss-Jordan
        piv = next((r for r in range(col, n) if a[r][col] != 0), None)
        if piv is None:
            return None
        a[col], a[piv], b[col], b[piv] = a[piv], a[col], b[piv], b[col]
        for r in range(n):
            if r != col and a[r][col] != 0:
                f = a[r][col] / a[col][col]
                a[r] = [u - f * v for u, v in zip(a[r], a[col])]
                b[r] -= f * b[col]
    c = [Fraction(0)] * 3
    for i, k in enumerate(free):
        c[k] = b[i] / a[i][i]
    return c


def _up(x: Fraction) -> int | float:
    """A coefficient as the answer stores it: exact when whole, else rounded up at a thousandth of a byte."""
    return int(x) if x.denominator == 1 else math.ceil(x * 1000) / 1000


def envelope(points: list[tuple[int, int]], quadratic: bool = True) -> list[int | float]:
    """c0, c1, c2 ≥ 0 over every point: the best non-negative fit through the first three, raised by the largest
    shortfall at any point. For the rise of live bytes in a layer's forward or backward, which MoE routing of a
    random init moves from one length to the next: never under what was measured."""
    c = fit(points[:3], "rise", slack=1 << 62, quadratic=quadratic)
    at = lambda x: c[0] + c[1] * x + c[2] * x * x      # noqa: E731
    short = max((Fraction(y) / Fraction(at(x)) for x, y in points if y > 0 and at(x) > 0), default=Fraction(1))
    extra = max((y - at(x) for x, y in points if at(x) <= 0), default=0)
    if short > 1:
        c = [_up(Fraction(v) * short) for v in c]
    if extra > 0:
        c[0] = _up(Fraction(c[0]) + extra)
    return c


def fit(points: list[tuple[int, int]], what: str = "bytes", slack: int = 0, quadratic: bool = True) -> list[int]:
    """c0, c1, c2 ≥ 0 of bytes = c0 + c1·S + c2·S² through the first three (S, bytes) points (exact where the bytes
    are a quadratic with non-negative coefficients, else the best non-negative least-squares fit), rounded up; every
    point must then be within `slack` bytes, or the trace refuses."""
    pts = [(Fraction(a), Fraction(b)) for a, b in points]
    fitting, check = pts[:3], pts[3:]
    best = None
    for free in ((0, 1, 2), (0, 1), (1, 2), (0, 2), (1,), (2,), (0,)) if quadratic else ((0, 1), (1,), (0,)):
        c = _solve(fitting, free)
        if c is None or any(x < 0 for x in c):
            continue
        err = sum((c[0] + c[1] * x + c[2] * x * x - y) ** 2 for x, y in fitting)
        if best is None or err < best[0]:
            best = (err, c)
        if err == 0:
            break
    coeffs = [_up(x) for x in best[1]] if best else [0, 0, 0]
    for x, y in fitting + check:
        got = coeffs[0] + coeffs[1] * x + coeffs[2] * x * x
        if abs(got - y) > max(slack, 0):
            raise TraceError(f"{what}: saved bytes {[int(v) for _, v in pts]} at S={[int(u) for u, _ in pts]} are "
                             f"not c0 + c1·S + c2·S² with c ≥ 0 (off by {int(abs(got - y))} bytes at S={int(x)})")
    return coeffs


# ---- one regime -----------------------------------------------------------------------------------------------
def activations(config: dict, regime: dict, struct: dict) -> dict[str, Any]:
    """Saved bytes of the slice in `regime`, fitted per layer half and taken per kind (see the module doc)."""
    import warnings

    from scaletrain.trainer.measure import build_harness

    _check_slice_size(struct, regime["precision"], str(config.get("model_type")))
    n = struct["slice_layers"]
    cfg = prefix_config(config, n)
    _windows(cfg, regime)
    g = granule(config)
    lengths = [g * k for k in TRACE_MULTIPLES]
    targets = tuple(regime.get("lora_targets") or ()) or None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        harness = build_harness(cfg, method=regime["method"], lora_rank=int(regime.get("lora_rank", 8)),
                                lora_alpha=2 * int(regime.get("lora_rank", 8)), lora_targets=targets,
                                grad_ckpt=bool(regime.get("grad_ckpt")), attn=regime["attn"],
                                precision=regime["precision"], device="cpu")
        _warm_up(harness, lengths[0])            # lazily built buffers and caches, before anything is counted
        runs = [(S, *_saved_by_scope(harness, S)) for S in lengths]
        pair = _saved_by_scope(harness, lengths[1], batch=2)    # the last length's tokens as two sequences
    out = {"seq_lens": lengths, "granule": g, "slice_layers": n,
           **_per_kind(runs, struct, own_saved=not regime.get("grad_ckpt"), pair=pair)}
    if regime["method"] != "full":
        out["lora"] = lora_count(config, targets)
    return out


def _series(S: int, tot: dict, rises: dict, n: int, own_saved: bool) -> dict[str, int]:
    """One run's numbers by series: each layer half's saved bytes, each layer's forward and backward rise."""
    out = dict(tot)
    for i in range(n):
        own = tot.get(f"layer{i}.attn", 0) + tot.get(f"layer{i}.mlp", 0) if own_saved else 0
        out.setdefault(f"layer{i}.attn", 0)
        out.setdefault(f"layer{i}.mlp", 0)
        out[f"layer{i}.fwd"] = rises.get(f"fwd{i}", 0)
        out[f"layer{i}.bwd"] = rises.get(f"bwd{i}", 0) + own
    return out


def _per_kind(runs: list, struct: dict, own_saved: bool = True, pair: tuple | None = None) -> dict[str, Any]:
    """The runs fitted per scope and per layer window, then taken per kind (the largest coefficients of its layers
    in the slice): saved bytes of each half, and the rise of live bytes in the layer's forward and backward (the
    backward's counted on top of what is alive below the layer: its rise plus the layer's own saved bytes; under
    checkpointing the layer saved nothing but its input, alive below it, and its backward's rise holds the
    recompute)."""
    n = struct["slice_layers"]
    slack = int(FIT_TOLERANCE * max(sum(tot.values()) for _, tot, _, _ in runs))
    series: dict[str, list[tuple[int, int]]] = {}
    for S, tot, _, rises in runs:
        for key, v in _series(S, tot, rises, n, own_saved).items():
            series.setdefault(key, []).append((S, v))
    # the last length's tokens as two sequences: a series that does not change is per token (an S² coefficient would
    # be routing noise that a larger micro-batch divides, under-counting it); one that halves its S² part is not
    as_two = _series(runs[1][0], pair[0], pair[2], n, own_saved) if pair else {}
    last = {k: v[-1][1] for k, v in series.items()}
    per_token = {k: abs(as_two.get(k, 0) - last[k]) <= slack for k in series} if pair else {}
    fits = {k: envelope(v, not per_token.get(k)) if k.endswith((".fwd", ".bwd"))
            else fit(v, k, slack, quadratic=not per_token.get(k)) for k, v in series.items()}
    largest = {k: max(lg.get(k, 0) for _, _, lg, _ in runs) for k in series}
    zero = [0, 0, 0]
    kinds = [{"count": k["count"], "attn": zero, "mlp": zero, "fwd": zero, "bwd": zero,
              "largest_attn": 0, "largest_mlp": 0} for k in struct["kinds"]]
    for i in range(n):
        kind = kinds[struct["layer_kinds"][i]]
        for part in ("attn", "mlp", "fwd", "bwd"):
            kind[part] = [max(a, b) for a, b in zip(kind[part], fits[f"layer{i}.{part}"])]
        for half in ("attn", "mlp"):
            kind[f"largest_{half}"] = max(kind[f"largest_{half}"], largest.get(f"layer{i}.{half}", 0))
    return {"kinds": kinds, "shared": fits.get("shared", zero), "final_norm": fits.get("final_norm", zero),
            "head_input": fits.get("head_input", zero)}


def lora_count(config: dict, targets) -> dict[str, int]:
    """peft's own count on the meta-device model: trainable parameters per unit of rank and adapted modules, as the
    trainer's add_lora builds them (checked linear in the rank at ranks 1 and 2)."""
    from peft.tuners.lora import LoraLayer

    from scaletrain.trainer import model as model_lib

    counts = []
    for rank in (1, 2):
        model = model_lib.add_lora(_meta_model(config), rank=rank, alpha=2 * rank, dropout=0.0,
                                   targets=list(targets) if targets else "all-linear", quantized=False,
                                   grad_ckpt=False)
        trainable = sum(int(p.numel()) for p in model.parameters() if p.requires_grad)
        adapted = sum(1 for _, m in model.named_modules() if isinstance(m, LoraLayer))
        counts.append((trainable, adapted))
    if counts[1][0] != 2 * counts[0][0]:
        raise TraceError(f"peft's LoRA parameters are not linear in the rank here ({counts[0][0]} at rank 1, "
                         f"{counts[1][0]} at rank 2)")
    if counts[0][1] == 0:
        raise TraceError(f"peft adapts no module of {config.get('model_type')} for the targets "
                         f"{', '.join(targets) if targets else 'all-linear'}")
    return {"per_rank": counts[0][0], "adapted": counts[0][1]}


# ---- requests -------------------------------------------------------------------------------------------------
_STRUCTURES: dict[str, dict] = {}     # by config, within one serving process


def _structure_of(config: dict) -> dict[str, Any]:
    key = json.dumps(config, sort_keys=True, default=str)
    if key not in _STRUCTURES:
        try:
            _STRUCTURES[key] = structure(config)
        except TraceError:
            raise
        except Exception as e:          # noqa: BLE001 - transformers' own refusal, in one line
            raise TraceError(f"transformers cannot build it: {one_line(e)}") from None
    return _STRUCTURES[key]


def run(request: dict) -> dict[str, Any]:
    config = request.get("config")
    if not isinstance(config, dict) or "model_type" not in config:
        raise TraceError("the request has no config.json dict with a model_type")
    struct = _structure_of(config)
    out: dict[str, Any] = {"format": TRACE_FORMAT, "model_type": config["model_type"], "structure": struct}
    regimes = list(request.get("regimes") or ([request["regime"]] if request.get("regime") else []))
    answers = []
    for regime in regimes:
        try:
            answers.append(activations(config, regime, struct))
        except TraceError:
            raise
        except Exception as e:          # noqa: BLE001
            raise TraceError(f"its forward failed: {one_line(e)}") from None
    if request.get("regime"):
        out["activations"] = answers[0]
    elif answers:
        out["activations_by_regime"] = answers
    if "lora_targets" in request:
        try:
            out["lora"] = lora_count(config, request["lora_targets"])
        except TraceError:
            raise
        except Exception as e:          # noqa: BLE001
            raise TraceError(f"peft cannot adapt it: {one_line(e)}") from None
    return out


def one_line(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split()) or e.__class__.__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _die_with_parent() -> None:
    """Linux: end with the planning process that started this one, even mid-trace (prctl PR_SET_PDEATHSIG)."""
    import signal

    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)         # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:                     # the parent was gone before the signal was asked for
        sys.exit(0)


def serve() -> int:
    """Answer one JSON request per line until stdin closes; the protocol owns the real stdout (whatever a library
    prints goes to stderr)."""
    _die_with_parent()
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise TraceError("the request is not a JSON object")
            answer: dict[str, Any] = {"ok": run(request)}
        except (TraceError, ValueError) as e:
            answer = {"error": one_line(e, 280), "code": 2}
        except ImportError as e:
            answer = {"error": f"the train extra is missing ({one_line(e, 120)})", "code": 3}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve()
    try:
        request = json.loads(argv[0] if argv else sys.stdin.read())
        if not isinstance(request, dict):
            raise TraceError("the request is not a JSON object")
        result = run(request)
    except (TraceError, ValueError) as e:
        print(one_line(e, 280), file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"the train extra is missing ({one_line(e, 120)})", file=sys.stderr)
        return 3
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

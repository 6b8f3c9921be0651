"""Trace a model family that has no analytic layout: measure what its blocks are and what they save for backward.

    python -m scaletrain.trainer.trace < request.json > trace.json      (or: ... trace '{"config": ...}')

The request is `{"config": <config.json dict>, "regime": null | {"method", "lora_rank", "lora_targets",
"precision", "attn"}}` (precision in trainer/measure.py's names: fp32, bf16, bf16-pure, bf16-autocast), or
`"regimes": [...]` for several in one process (answered as `activations_by_regime`, in order). The answer:

- `structure` (always): the real model built on the meta device (no memory): its exact parameter count, the
  embedding and output-head sizes, and one decoder block's nn.Linear modules (name → in, out, bias), parameter
  tensors and parameters, so FLOPs, LoRA counts and ZeRO-3 gathers come from the real modules.
- `activations` (when a regime is given): a *slice* of the model at its real widths (enough decoder layers to
  cover a `layer_types` pattern after a first layer, else 2; a small vocabulary, which only the cross-entropy
  sees and the engine models generically), random init on the CPU, one forward + loss under
  `torch.autograd.graph.saved_tensors_hooks` (as trainer/saved_activations.py counts them: storages, once) at
  three sequence lengths with micro-batch 1. Each decoder block's saved bytes are split into its attention half
  (from the block's start until its MLP child runs, attention child included) and its MLP half (from the MLP
  child on); bytes are fitted exactly as c0 + c1·S + c2·S² (three lengths, integer coefficients: a per-block
  constant such as autocast's weight copies, a per-token term, and a term growing with S² such as eager
  attention's softmax). Outside the blocks: `shared` (the ids the embedding keeps, and tensors every block
  receives: rotary cos/sin, masks), `final_norm` (saved after the last block, before the output head),
  `head_input` (what the head keeps of its input); the logits, log-softmax and labels are left to the engine.

Failures print ONE line on stderr and exit 2. torch / transformers are imported inside functions.
"""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from typing import Any

from scaletrain.trainer.saved_activations import decoder_layers, forward_saving

TRACE_FORMAT = 1
# Sequence lengths of the slice's forwards (micro-batch 1): three points fit c0 + c1·S + c2·S² exactly. Short,
# so a slice at a 9B model's width stays well under a second per forward on a laptop CPU; long enough that
# torch's CPU sdpa runs its flash kernel (the one trainer/saved_activations.py was checked on at S = 32).
TRACE_SEQ_LENS = (16, 32, 48)
# A sliding window the planned sequences exceed is traced as this one, shorter than every TRACE_SEQ_LENS.
WINDOWED_TRACE = 8
# The slice's vocabulary: prime, so no hidden, head or MLP width equals it and the vocabulary-wide tensors
# (logits, log-softmax) can be told apart by their last dimension.
SLICE_VOCAB = 509
# The most one decoder layer's weights may take in the traced dtype on this CPU (the slice builds two or more).
MAX_LAYER_BYTES = 2 << 30
ATTN_NAMES = ("self_attn", "attention", "attn", "self_attention", "mixer")
MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe")


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


def structure(config: dict) -> dict[str, Any]:
    """The real model's parameters and one block's modules (meta device: no memory, no init)."""
    model = _meta_model(config)
    unique = {id(p): p for p in model.parameters()}
    layers = decoder_layers(model)
    if not layers:
        raise TraceError("transformers' model has no decoder-layer list (…layers) to trace")
    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    emb_params = int(emb.weight.numel()) if emb is not None else 0
    tied = head is not None and emb is not None and head.weight is emb.weight
    head_params = 0 if head is None or tied else sum(int(p.numel()) for p in head.parameters())
    blocks = []
    for layer in layers:
        params = list(layer.parameters())
        blocks.append((sum(int(p.numel()) for p in params), len(params)))
    largest = max(blocks)
    ref = layers[1] if len(layers) > 1 else layers[0]
    linears = block_linears(ref)
    return {
        "params": int(sum(p.numel() for p in unique.values())),
        "embedding_params": emb_params, "lm_head_params": head_params, "tied": bool(tied),
        "block_params": largest[0], "block_tensors": largest[1], "linears": linears,
        "block_norms": _norm_modules(ref), "tensor_count": len(unique),
    }


def _norm_modules(layer) -> int:
    """Modules of the block that own parameters and are not linears (its norms)."""
    import torch

    return sum(1 for _, m in layer.named_modules() if not isinstance(m, torch.nn.Linear)
               and any(True for _ in m.parameters(recurse=False)))


# ---- the slice ------------------------------------------------------------------------------------------------
def slice_config(config: dict) -> tuple[dict, list | None]:
    """The slice: one first layer, then one layer of each position in the layer_types pattern (or one more layer),
    and a small vocabulary with the special token ids moved inside it."""
    from scaletrain.engine.catalog.traced import pattern_period, slice_layers

    cfg = dict(config)
    types = cfg.get("layer_types")
    n = slice_layers(cfg)
    if isinstance(types, list) and types:
        period = pattern_period(types)
        cfg["layer_types"] = [types[i % period] for i in range(n)]
    else:
        types = None
    cfg["num_hidden_layers"] = n
    cfg["vocab_size"] = SLICE_VOCAB
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        v = cfg.get(key)
        if isinstance(v, int) and v >= SLICE_VOCAB:
            cfg[key] = SLICE_VOCAB - 1
        elif isinstance(v, list):
            cfg[key] = [x if not isinstance(x, int) or x < SLICE_VOCAB else SLICE_VOCAB - 1 for x in v]
    return cfg, cfg.get("layer_types") if types else None


def _check_layer_size(struct: dict, precision: str, model_type: str) -> None:
    per = 4 if precision in ("fp32", "bf16") else 2
    need = struct["block_params"] * per
    if need > MAX_LAYER_BYTES:
        raise TraceError(f"one decoder layer of {model_type} is {need / 2**30:.1f} GiB in the traced dtype, over the "
                         f"{MAX_LAYER_BYTES >> 30} GiB a trace may take on this CPU (no reduced-width trace is "
                         "proven exact for it)")


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
    """Saved storages by where forward was when autograd first packed them (see the module doc)."""

    def __init__(self, torch, excluded: set):
        self.torch, self.excluded = torch, excluded
        self.scope = "shared"
        self.shared_keys: set = set()
        self.alive: list = []
        self.seen: dict = {}            # storage key → [bytes, scope, shape, dtype]

    def pack(self, t):
        from scaletrain.trainer.measure import storage_key

        torch = self.torch
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta":
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
                self.alive += passed      # held until forward ends: no later tensor reuses their addresses
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


def _saved_by_scope(harness, seq_len: int) -> tuple[dict[str, int], dict[str, int]]:
    """One forward + loss at micro-batch 1: bytes per scope, and the largest per-token tensor per scope."""
    import torch

    from scaletrain.trainer.measure import make_batches, storage_key

    model = harness.model
    excluded = {storage_key(t) for t in list(model.parameters()) + list(model.buffers())}
    rec = _Recorder(torch, excluded)
    (ids,) = make_batches(1, 1, seq_len, harness.vocab_size, harness.device, 0)
    rec.scope = "shared"
    forward_saving(model, harness.autocast, ids, rec.pack, rec.hooks(model))
    total: dict[str, int] = {}
    largest: dict[str, int] = {}
    for nb, scope, shape, dtype in rec.seen.values():
        if scope == "loss" or (shape and shape[-1] == SLICE_VOCAB):
            continue              # logits, log-softmax, labels: the engine's cross-entropy terms
        total[scope] = total.get(scope, 0) + nb
        if list(shape).count(seq_len) == 1:
            largest[scope] = max(largest.get(scope, 0), nb // seq_len)
    return total, largest


def fit(points: list[tuple[int, int]], what: str = "bytes") -> list[int]:
    """c0, c1, c2 of bytes = c0 + c1·S + c2·S² through three (S, bytes) points; raises if not whole numbers."""
    (x0, y0), (x1, y1), (x2, y2) = [(Fraction(a), Fraction(b)) for a, b in points]
    c2 = ((y2 - y0) / (x2 - x0) - (y1 - y0) / (x1 - x0)) / (x2 - x1)
    c1 = (y1 - y0) / (x1 - x0) - c2 * (x1 + x0)
    c0 = y0 - c1 * x0 - c2 * x0 * x0
    if any(c.denominator != 1 for c in (c0, c1, c2)):
        raise TraceError(f"{what}: saved bytes {[int(y) for _, y in points]} at S={[int(x) for x, _ in points]} "
                         "are not a quadratic in the sequence length")
    return [int(c0), int(c1), int(c2)]


def activations(config: dict, regime: dict, struct: dict) -> dict[str, Any]:
    """Saved bytes of the slice in `regime`, fitted per scope (see the module doc)."""
    import warnings

    from scaletrain.trainer.measure import build_harness

    _check_layer_size(struct, regime["precision"], str(config.get("model_type")))
    cfg, types = slice_config(config)
    if regime.get("windowed"):     # the planned sequence is longer than the window: so are the traced ones
        cfg["sliding_window"] = WINDOWED_TRACE
    targets = tuple(regime.get("lora_targets") or ()) or None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        harness = build_harness(cfg, method=regime["method"], lora_rank=int(regime.get("lora_rank", 8)),
                                lora_alpha=2 * int(regime.get("lora_rank", 8)), lora_targets=targets,
                                grad_ckpt=False, attn=regime["attn"], precision=regime["precision"], device="cpu")
        _saved_by_scope(harness, TRACE_SEQ_LENS[0])     # warm-up: lazily built buffers and caches
        runs = [(S, *_saved_by_scope(harness, S)) for S in TRACE_SEQ_LENS]
    scopes = sorted({k for _, tot, _ in runs for k in tot})
    fits = {k: fit([(S, tot.get(k, 0)) for S, tot, _ in runs], k) for k in scopes}
    largest = {k: max(lg.get(k, 0) for _, _, lg in runs) for k in scopes}
    n = cfg["num_hidden_layers"]
    zero = [0, 0, 0]
    blocks = []
    for i in range(1, n):
        blocks.append({"type": types[i] if types else None,
                       "attn": fits.get(f"layer{i}.attn", zero), "mlp": fits.get(f"layer{i}.mlp", zero),
                       "largest_attn": largest.get(f"layer{i}.attn", 0),
                       "largest_mlp": largest.get(f"layer{i}.mlp", 0)})
    return {"seq_lens": list(TRACE_SEQ_LENS), "slice_layers": n, "blocks": blocks,
            "shared": fits.get("shared", zero), "final_norm": fits.get("final_norm", zero),
            "head_input": fits.get("head_input", zero)}


# ---- command line ---------------------------------------------------------------------------------------------
def run(request: dict) -> dict[str, Any]:
    config = request.get("config")
    if not isinstance(config, dict) or "model_type" not in config:
        raise TraceError("the request has no config.json dict with a model_type")
    try:
        struct = structure(config)
    except TraceError:
        raise
    except Exception as e:
        raise TraceError(f"transformers cannot build it: {one_line(e)}") from None
    out: dict[str, Any] = {"format": TRACE_FORMAT, "model_type": config["model_type"], "structure": struct}
    regimes = list(request.get("regimes") or ([request["regime"]] if request.get("regime") else []))
    answers = []
    for regime in regimes:
        try:
            answers.append(activations(config, regime, struct))
        except TraceError:
            raise
        except Exception as e:
            raise TraceError(f"its forward failed: {one_line(e)}") from None
    if request.get("regime"):
        out["activations"] = answers[0]
    elif answers:
        out["activations_by_regime"] = answers
    return out


def one_line(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split()) or e.__class__.__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
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

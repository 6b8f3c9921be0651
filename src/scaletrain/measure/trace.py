"""Trace a model family that has no analytic layout: measure what its blocks are and what they save for backward.

    python -m scaletrain.measure.probe trace < request.json > trace.json      (one request)
    python -m scaletrain.measure.probe trace --serve                          (JSON lines in, JSON lines out)

`--serve` is how the engine runs it (engine/catalog/traced.py, through the probes' entry point measure/probe.py):
one process per planning process, transformers imported once, every structure, regime and LoRA count of a plan
answered by it (several regimes asked at once: by forked copies of it, side by side; see "several regimes").

A request is `{"config": <config.json dict>, "regime": null | {"method", "lora_rank", "lora_targets", "precision",
"attn", "windowed"?, "chunked"?, "loss"?}}` (precision in measure/step.py's names; loss "chunked": the trainer's
chunked loss instead of the model's own), or `"regimes": [...]` (answered as
`activations_by_regime`, in order), or `"lora_targets": [...] | null` (answered as `lora`). The answer:

- `structure` (always): the real model built on the meta device (no memory): its exact parameter count, the
  embedding and output-head sizes, and its decoder layers grouped into KINDS by structural signature (the layer's
  class, every submodule's class and plain attributes — sliding or not, linear or full attention, MoE or dense,
  mamba or attention — and every parameter's shape; derived from the module tree, no per-family table), each kind
  with its count, parameters, tensors and nn.Linear modules; and the slice that holds one of each kind: the
  shortest prefix of the stack whose layers have the same signatures as the real model's first layers.
- `activations` (per regime): that slice at the real widths, random init, one forward + loss under
  `torch.autograd.graph.saved_tensors_hooks` at four sequence lengths (TRACE_BATCH sequences: at one, copies over
  the batch dimension are views and go unseen), each saved storage counted
  once and kept alive until the forward ends (so no freed address is reused and taken for another). The lengths are
  in the planned length's residue class modulo every kernel chunk the config names (`chunk_size`: mamba2's scan)
  and the gated delta rule's 64 (engine/catalog/traced.py `granule`), so padded chunked kernels are traced as they
  run at that length. Each layer's bytes are split into its attention half and its MLP
  half and fitted with NON-NEGATIVE coefficients as c0 + c1·S + c2·S² through the first three lengths; the fourth
  must be predicted within FIT_TOLERANCE or the trace refuses in one line; so are the bytes of the hidden states
  each layer receives (`input`: what a checkpointed layer keeps, at its real width: hyper-connections pass several
  residual streams). Per kind: the largest coefficients of its layers in the slice. Outside the blocks: `shared` (the ids the embedding keeps, and tensors every block receives:
  rotary tables, masks), `final_norm`, `head_input`; the logits, log-softmax and labels are the engine's.
  A reversible stack (reformer's: its layers run without autograd in the forward and are recomputed, last first,
  inside the stack's own autograd Function's backward): a layer's backward window opens where its parts run in the
  backward, and rises over the run's start less the gradients made before it (trace_record._recompute); a layer
  recomputed where no part of it runs as a module is refused. So is a forward that writes its own config (an
  unset num_buckets set from the first length: what was traced would not be what runs), naming the key.
  `gradless_params`: elements of the trainable parameters outside the decoder layers that a step on text gives
  no gradient (a multimodal causal LM's towers), which torch's optimizers give no state; `gradless_names`: their
  names (outside the layers, as in the full model), which the trainer freezes under DDP; both counted on the real
  model's meta build (full fine-tuning), with `largest_stepped_param`, the largest tensor the optimizer steps.
  `looped`, `call_order`: a stack that runs its layers several times in one forward (hrm_text's cycles): the most
  forwards a layer ran, and the layers' runs with gradients in the order they ran (the engine walks backward run by
  run).
- `lora` (LoRA regimes and LoRA requests): peft's own count on the meta-device model with the run's targets —
  trainable parameters per unit of rank and adapted modules — as the trainer's `add_lora` builds it.
- `peft_refuses` (asked by a LoRA plan without its own targets): the block linears peft will not adapt (a mamba
  mixer's out_proj). Only LoRA plans import peft.

Failures print ONE line (stderr, or `{"error": ...}` when serving) and exit 2. torch / transformers are imported
inside functions.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from scaletrain.engine.catalog.traced import granule
from scaletrain.engine.devices.detect import host_memory_bytes
from scaletrain.engine.probes import TRACE_FORMAT, TRACE_OUT_OF_MEMORY as OUT_OF_MEMORY
from scaletrain.measure.trace_fit import TraceError, envelope, envelope_parts, fit
from scaletrain.measure.trace_process import die_with_parent, one_thread
from scaletrain.measure.trace_record import saved_by_scope
from scaletrain.measure.trace_steps import gradless_params, head_width, routed_rows, warm_up
from scaletrain.measure.trace_refusals import forward_failed, one_line, own_loss_fails
from scaletrain.measure.trace_structure import (FIT_TOLERANCE, TRACE_BATCH, TRACE_MULTIPLES, check_config_kept,
                                                check_slice_size, config_of, lora_count, peft_refuses,
                                                prefix_config, shrink_windows, slice_kinds, slice_params,
                                                stacked_config, stepped_on_full_model, structure)

__all__ = ["TraceError", "activations", "envelope", "fit", "lora_count", "main", "prefix_config", "run", "serve",
           "structure"]


# ---- one regime -----------------------------------------------------------------------------------------------
def activations(config: dict, regime: dict, struct: dict) -> dict[str, Any]:
    """Saved bytes of the slice in `regime`, fitted per layer half and taken per kind (see the module doc)."""
    import warnings

    from scaletrain.measure.step import build_harness

    check_slice_size(struct, regime["precision"], str(config.get("model_type")))
    n = struct["slice_layers"]
    whole = n == len(struct["layer_kinds"]) or struct.get("slice_stacks")
    cfg = stacked_config(config, struct) if whole else prefix_config(config, n)
    shrink_windows(cfg, regime)
    g = granule(config)
    residue = int(regime.get("residue", 0)) % g     # the planned length's, modulo the kernels' chunk
    lengths = [g * k + residue for k in TRACE_MULTIPLES]
    targets = tuple(regime.get("lora_targets") or ()) or None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        harness = build_harness(cfg, method=regime["method"], lora_rank=int(regime.get("lora_rank", 8)),
                                lora_alpha=2 * int(regime.get("lora_rank", 8)), lora_targets=targets,
                                grad_ckpt=bool(regime.get("grad_ckpt")), attn=regime["attn"],
                                precision=regime["precision"], device="cpu", loss=regime.get("loss", "standard"))
        before = config_of(harness)
        try:
            warm_up(harness, lengths[0])        # lazily built buffers and caches, before anything is counted
        except Exception as e:          # noqa: BLE001 - the model's own loss, or its forward
            raise own_loss_fails(harness, lengths[0], e) or e
        runs = [(S, *saved_by_scope(harness, S, batch=TRACE_BATCH)) for S in lengths]
        # the last length's tokens as twice the sequences
        pair = saved_by_scope(harness, lengths[1], batch=2 * TRACE_BATCH)
        gradless, gradless_names = gradless_params(harness, lengths[0])
        routed = routed_rows(harness, lengths[0])
        largest_stepped = 0
        if gradless_names and regime["method"] == "full":
            gradless, largest_stepped = stepped_on_full_model(config, gradless_names, gradless)
        check_config_kept(harness, before)
    if runs[0][3].get("calls.unseen"):
        raise TraceError("its decoder layers run without autograd in the forward and get their gradients where the "
                         "trace sees none of them run again (no part of them is recomputed as a module in the "
                         "backward), so it cannot plan this one")
    looped = max(int(r.get("calls.max", 1)) for _, _, _, r in runs)
    # a looped stack: the most forwards a layer ran, and the layers' runs with gradients in the order they ran
    order = list(runs[0][3].get("calls.order", ())) if looped > 1 else []
    out = {"gradless_params": gradless, "gradless_names": gradless_names, "largest_stepped_param": largest_stepped,
           "looped": looped if looped > 1 else 0, "call_order": order,
           "seq_lens": lengths, "granule": g, "residue": residue, "slice_layers": n,
           "head_out": head_width(harness.model),
           **_per_kind(runs, struct, own_saved=not regime.get("grad_ckpt"), pair=pair, looped=looped > 1)}
    _experts_per_token(out["kinds"], routed, struct)
    if regime["method"] != "full":
        out["lora"] = lora_count(config, targets)
    return out


def _experts_per_token(kinds: list[dict], routed: list, struct: dict) -> None:
    """Each kind with routed experts gets `experts_per_token`: per expert weight of its structure, the most rows a
    token ran through it in its layers in the slice, or None where its module could not be counted
    (trace_experts)."""
    for kind_index, rows in zip(slice_kinds(struct), routed):
        weights = struct["kinds"][kind_index].get("experts")
        if not weights:
            continue
        rows = rows if rows is not None and len(rows) == len(weights) else [None] * len(weights)
        got = kinds[kind_index].get("experts_per_token") or [0.0] * len(weights)
        kinds[kind_index]["experts_per_token"] = [None if a is None or b is None else max(a, b)
                                                  for a, b in zip(got, rows)]


def _series(S: int, tot: dict, rises: dict, n: int, own_saved: bool) -> dict[str, int]:
    """One run's numbers by series: each layer half's saved bytes, each layer's forward and backward rise."""
    out = dict(tot)
    out["tail.bwd"] = rises.get("tail", 0)
    out["front.bwd"] = rises.get("front", 0)
    for i in range(n):
        own = tot.get(f"layer{i}.attn", 0) + tot.get(f"layer{i}.mlp", 0) if own_saved else 0
        out.setdefault(f"layer{i}.attn", 0)
        out.setdefault(f"layer{i}.mlp", 0)
        # what a part beside a checkpointed layer saves is kept as its input is (trace_record: `beside`)
        out[f"layer{i}.input"] = tot.get(f"layer{i}.input", 0) + out.pop(f"layer{i}.beside", 0)
        out[f"layer{i}.fwd"] = rises.get(f"fwd{i}", 0)
        out[f"layer{i}.bwd"] = rises.get(f"bwd{i}", 0) + own
        out[f"layer{i}.fwd_left"] = rises.get(f"fwd{i}.left", 0)
        out[f"layer{i}.fwd_kept"] = rises.get(f"fwd{i}.kept", 0)
        out[f"layer{i}.bwd_left"] = rises.get(f"bwd{i}.left", 0)
    return out


def _per_kind(runs: list, struct: dict, own_saved: bool = True, pair: tuple | None = None,
              looped: bool = False) -> dict[str, Any]:
    """The runs fitted per scope and per layer window, then taken per kind (the largest coefficients of its layers
    in the slice): saved bytes of each half, and the rise of live bytes in the layer's forward and backward (the
    backward's counted on top of what is alive below the layer: its rise plus the layer's own saved bytes; under
    checkpointing the layer saved nothing but its input, alive below it, and its backward's rise holds the
    recompute). A rise is fitted over the three longest lengths (`long_from` on); `*_below`: what a shorter
    planned length adds to its constant (trace_fit.envelope_parts). A looped stack's layers of one kind run a
    different number of times (hrm_text's L module 3 times with gradients, its H module twice): traced whole (no
    prefix of it builds), each kind's saved bytes and inputs are its layers' mean, their sum exact."""
    n = struct["slice_layers"]
    slack = int(FIT_TOLERANCE * max(sum(v for k, v in tot.items() if k != "loss_vocab" and not k.endswith(".input"))
                                    for _, tot, _, _ in runs))
    series: dict[str, list[tuple[int, int]]] = {}
    for S, tot, _, rises in runs:
        for key, v in _series(S, tot, rises, n, own_saved).items():
            series.setdefault(key, []).append((S, v))
    # the last length's tokens as two sequences: a series that does not change is per token (an S² coefficient would
    # be routing noise that a larger micro-batch divides, under-counting it); one that halves its S² part is not
    as_two = _series(runs[1][0], pair[0], pair[2], n, own_saved) if pair else {}
    last = {k: v[-1][1] for k, v in series.items()}
    per_token = {k: abs(as_two.get(k, 0) - last[k]) <= slack for k in series} if pair else {}
    rises = {k: envelope_parts(v, not per_token.get(k)) for k, v in series.items()
             if k.endswith((".fwd", ".bwd", "_left", "_kept"))}
    below = {k: b for k, (_, b) in rises.items()}       # what a length under the three longest adds to c0
    fits = {k: per_sequence(rises[k][0] if k in rises else fit(v, k, slack, quadratic=not per_token.get(k)))
            for k, v in series.items()}
    largest = {k: max(lg.get(k, 0) for _, _, lg, _ in runs) for k in series}
    zero = [0, 0, 0]
    kinds = [{"count": k["count"], "attn": zero, "mlp": zero, "fwd": zero, "bwd": zero, "input": zero,
              "fwd_left": zero, "bwd_left": zero, "fwd_kept": zero, "fwd_below": 0, "bwd_below": 0,
              "largest_attn": 0, "largest_mlp": 0} for k in struct["kinds"]]
    order = slice_kinds(struct)
    carry = _carry(fits, order)
    mean = looped and n == len(struct["layer_kinds"])
    for i in range(n):
        kind = kinds[order[i]]
        for part in ("attn", "mlp", "fwd", "bwd", "input", "fwd_left", "bwd_left", "fwd_kept"):
            if part == "bwd_left" and i == n - 1 and any(carry):
                continue        # the stack's carry (below), not its kind's
            if mean and part in ("attn", "mlp", "input"):
                kind[part] = [a + b / kind["count"] for a, b in zip(kind[part], fits[f"layer{i}.{part}"])]
                continue
            kind[part] = [max(a, b) for a, b in zip(kind[part], fits[f"layer{i}.{part}"])]
        for part in ("fwd", "bwd"):
            kind[f"{part}_below"] = max(kind[f"{part}_below"], below[f"layer{i}.{part}"])
        for half in ("attn", "mlp"):
            kind[f"largest_{half}"] = max(kind[f"largest_{half}"], largest.get(f"layer{i}.{half}", 0))
    return {"kinds": kinds, "shared": fits.get("shared", zero), "final_norm": fits.get("final_norm", zero),
            "head_input": fits.get("head_input", zero), "loss_vocab": fits.get("loss_vocab", zero),
            "tail_bwd": fits.get("tail.bwd", zero), "tail_bwd_below": below.get("tail.bwd", 0),
            "front_bwd": fits.get("front.bwd", zero), "bwd_carry": carry,
            "front_grads": min(r.get("front.grads", 0) for _, _, _, r in runs),
            "long_from": sorted(S for S, _, _, _ in runs)[-3]}


def _carry(fits: dict, layer_kinds: list) -> list:
    """What the first layer to run backward (the slice's last) leaves beyond what the other layers of its kind
    leave: a buffer made once for the whole stack, gemma3n's gradient of the per-layer inputs every layer reads
    (B·S·L·256, accumulated in place by the layers after it). Counted once by the engine, from that layer's
    backward to the end, not by every layer of the kind. Nothing when no other layer of the kind is in the slice
    (its leave-behind stays its kind's: the safe side)."""
    last = len(layer_kinds) - 1
    others = [i for i in range(last) if layer_kinds[i] == layer_kinds[-1]] if last >= 0 else []
    if not others:
        return [0, 0, 0]
    own = [max(c) for c in zip(*(fits.get(f"layer{i}.bwd_left", [0, 0, 0]) for i in others))]
    return [max(a - b, 0) for a, b in zip(fits.get(f"layer{last}.bwd_left", [0, 0, 0]), own)]


def per_sequence(coeffs: list) -> list:
    """A fit of TRACE_BATCH sequences as the engine reads it (engine/catalog/traced.py `at`: c0 + b·(c1·S + c2·S²)):
    the per-token and per-S² parts divided by the traced sequences (rounded up at a thousandth), the constant not."""
    from fractions import Fraction

    from scaletrain.measure.trace_fit import up

    return [coeffs[0], *(up(Fraction(c) / TRACE_BATCH) for c in coeffs[1:])]


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
    languages = config.get("languages")
    if config.get("default_language") is None and isinstance(languages, list) and languages:
        # xmod: transformers runs no forward without one, and the trainer cannot call set_default_language()
        raise TraceError('its forward needs a default language: set "default_language" in its config.json to one '
                         f"of its languages ({', '.join(map(str, languages[:4]))}{', …' if len(languages) > 4 else ''})")
    struct = _structure_of(config)
    out: dict[str, Any] = {"format": TRACE_FORMAT, "model_type": config["model_type"], "structure": struct}
    regimes = list(request.get("regimes") or ([request["regime"]] if request.get("regime") else []))
    done = _in_copies(config, regimes, struct, _copies(len(regimes), struct)) if _SERVING else {}
    answers = []
    for i, regime in enumerate(regimes):
        if i in done:
            answers.append(done[i])
            continue
        try:
            answers.append(activations(config, regime, struct))
        except TraceError:
            raise
        except Exception as e:          # noqa: BLE001
            raise forward_failed(regime, e) from None
    if request.get("regime"):
        out["activations"] = answers[0]
    elif answers:
        out["activations_by_regime"] = answers
    if "peft_refuses" in request:
        try:
            out["peft_refuses"] = peft_refuses(config, [str(n) for n in request["peft_refuses"]])
        except TraceError:
            raise
        except Exception as e:          # noqa: BLE001
            raise TraceError(f"peft cannot adapt it: {one_line(e)}") from None
    if "lora_targets" in request:
        try:
            out["lora"] = lora_count(config, request["lora_targets"])
        except TraceError:
            raise
        except Exception as e:          # noqa: BLE001
            raise TraceError(f"peft cannot adapt it: {one_line(e)}") from None
    return out


# ---- several regimes at once -----------------------------------------------------------------------------------
# A search asks for several regimes of one family (4 for a first plan: autocast and 16-bit weights, checkpointed or
# not). Served, they are traced by forked copies of this process, one per core, each from the state the structure
# left (transformers imported, the family built once): no second import. A copy takes what a trace takes, about six
# times its slice's weights (qwen3_next's real widths at 32 experts: 12.3 GB for a 2.0 GiB slice), so the copies are
# as many as the memory cap holds at 8 times. A regime a copy did not answer (an error, a copy that died) is traced
# here after, and fails as it fails alone. SCALETRAIN_TRACE_COPIES=1: one regime at a time.
COPIES_ENV = "SCALETRAIN_TRACE_COPIES"
MAX_COPIES = 8
COPY_MEMORY_PER_SLICE_BYTE = 8
_SERVING = False


def _copies(regimes: int, struct: dict) -> int:
    """How many forked copies trace `regimes` regimes of the family of `struct` at once (1: this process alone)."""
    try:
        cores = len(os.sched_getaffinity(0))
        wanted = int(os.environ.get(COPIES_ENV) or MAX_COPIES)
    except (AttributeError, OSError, ValueError):        # not Linux, or a value that is not a number
        return 1
    weights = 4 * slice_params(struct)
    by_memory = _CAP // max(COPY_MEMORY_PER_SLICE_BYTE * weights, 1) if _CAP else 1
    return max(1, min(regimes, cores, wanted, by_memory, MAX_COPIES))


def _in_copies(config: dict, regimes: list, struct: dict, copies: int) -> dict[int, dict]:
    """The answers of the regimes `copies` forked copies of this process traced, by index (see above)."""
    if copies < 2:
        return {}
    started = []
    for c in range(copies):
        try:
            read, write = os.pipe()
        except OSError:                                 # out of descriptors: the rest is traced here
            break
        try:
            pid = os.fork()
        except OSError:                                 # out of processes or memory: the rest is traced here
            os.close(read)
            os.close(write)
            break
        if pid == 0:                                    # the copy: its share, as JSON on the pipe, then out
            os.close(read)
            _traced_copy(config, [(i, regimes[i]) for i in range(c, len(regimes), copies)], struct, write)
        os.close(write)
        started.append((pid, read))
    done: dict[int, dict] = {}
    for pid, read in started:
        with os.fdopen(read, encoding="utf-8") as f:
            text = f.read()
        os.waitpid(pid, 0)
        try:
            done.update({int(i): a for i, a in json.loads(text).items()})
        except (ValueError, AttributeError):            # a copy that died or was killed: traced here
            pass
    return done


def _traced_copy(config: dict, mine: list, struct: dict, write: int) -> None:
    code = 1
    try:
        die_with_parent()
        answers = {}
        for i, regime in mine:
            try:
                answers[str(i)] = activations(config, regime, struct)
            except Exception:                           # noqa: BLE001 - left to the serving process
                pass
        with os.fdopen(write, "w", encoding="utf-8") as f:
            json.dump(answers, f)
        code = 0
    finally:
        os._exit(code)


# the memory cap the serving process set (bytes; None: none): the forked copies share it
_CAP: int | None = None
MEMORY_ENV = "SCALETRAIN_TRACE_MEMORY_GB"     # the trace process's memory cap, GiB (default: MEMORY_SHARE below)
MEMORY_SHARE = 0.8                             # of the memory available when the trace process starts


def _memory_cap() -> int | None:
    """Cap the trace process's heap (RLIMIT_DATA: private anonymous memory, what torch allocates) below what the
    machine has free, so a model whose trace would need more fails its allocation and is refused in one line, rather
    than the kernel's OOM killer taking the machine's memory first and then some process (rwkv's default
    attention_hidden_size of 4096 under a 64-wide sweep config: its trace process reached 23.6 GB of this 24 GiB
    VM and was killed, -9). `SCALETRAIN_TRACE_MEMORY_GB` sets it; returns the cap in bytes, None when not set."""
    try:
        import resource

        env = os.environ.get(MEMORY_ENV)
        free = None if env else host_memory_bytes(field="MemAvailable")
        if not env and free is None:
            return None
        cap = int(float(env) * 2**30) if env else int(MEMORY_SHARE * free)
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        if soft == resource.RLIM_INFINITY or cap < soft:
            resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
        return cap
    except (ImportError, OSError, ValueError):    # not Linux, or a value that is not a number
        return None


def _out_of_memory(e: BaseException) -> bool:
    """An allocation the cap (or the machine) refused, as torch and its C++ say it."""
    text = str(e)
    return isinstance(e, MemoryError) or any(w in text for w in ("can't allocate memory", "not enough memory",
                                                                   "bad_alloc"))


def serve() -> int:
    """Answer one JSON request per line until stdin closes; the protocol owns the real stdout (whatever a library
    prints goes to stderr)."""
    global _SERVING, _CAP
    die_with_parent()
    one_thread()
    cap = _CAP = _memory_cap()
    _SERVING = True
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
        except (TraceError, ValueError, MemoryError) as e:
            answer = {"error": _oom_line(e, cap), "code": OUT_OF_MEMORY} if _out_of_memory(e) else \
                {"error": one_line(e, 280), "code": 2}
        except ImportError as e:
            answer = {"error": f"the train extra is missing ({one_line(e, 120)})", "code": 3}
        out.write(json.dumps(answer) + "\n")
        out.flush()
        if answer.get("code") == OUT_OF_MEMORY:
            break               # its heap is as full as the cap: the engine starts a fresh process for the next
        _release_memory()
    return 0


def _release_memory() -> None:
    """Hand the freed heap back to the machine after an answer. The process lives as long as the planning process
    (the wizard's session), idle between traces, and glibc keeps what a trace freed: zamba's sweep trace process
    held 14.3 GB idle while the sweep measured a step beside it, and the two took this 24 GiB machine into
    reclaim (kswapd at 100 %). malloc_trim(0) returns the free pages; elsewhere than glibc nothing is done."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):       # not glibc (macOS, musl)
        pass


def _oom_line(e: BaseException, cap: int | None) -> str:
    """Short (the engine's refusal around it lists the accepted model types): the cap reached, and how to raise it."""
    if cap:
        return f"out of memory at {cap / 2**30:.1f} GiB ({MEMORY_ENV})"
    return f"its trace ran out of memory ({one_line(e, 80)})"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve()
    cap = None
    try:
        one_thread()
        cap = _memory_cap()
        request = json.loads(argv[0] if argv else sys.stdin.read())
        if not isinstance(request, dict):
            raise TraceError("the request is not a JSON object")
        result = run(request)
    except (TraceError, ValueError, MemoryError) as e:
        print(_oom_line(e, cap) if _out_of_memory(e) else one_line(e, 280), file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"the train extra is missing ({one_line(e, 120)})", file=sys.stderr)
        return 3
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

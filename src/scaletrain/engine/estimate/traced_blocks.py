"""The activations term of a traced model (no analytic layout): activations.py's two functions, from the trace.

Traced (measure/trace.py: a slice of the real model at its real widths holding one layer of each kind, measured at
four lengths, fitted as c0 + c1·S + c2·S² with non-negative coefficients):
  - each kind's saved bytes, attention half and MLP half: c1 the per-token tensors, c2 what grows with S² (eager
    attention's softmax), c0 the per-block constants (autocast's 16-bit weight copies, kept as `weight_copies`);
    averaged over the real layers by each kind's count, since forward keeps every layer's;
  - each kind's moments: the rise of live bytes while it runs forward, and its saved bytes plus the rise while it
    runs backward (under checkpointing: the rise from its output's gradient to its input's, the recompute in it);
    a block's moment is its largest kind's (`worst`), since any layer may be the one running at the peak;
  - outside the blocks: the ids the embedding keeps and the tensors every block receives (rotary cos/sin, masks),
    the final norm's saved tensors and what the output head keeps of its input.
Kernel rules kept from the analytic families: on a GPU, FlashAttention-2's backward workspace and the MLP's
gradients beside the CPU-traced moments (the larger kept); the output head's 16-bit copy (a V×h linear; the trace's
small vocabulary does not show the real one). The logits and cross-entropy are the engine's generic head terms
(objectives.py), as for every family. tests/engine/test_traced.py and bench/architecture_sweep.py check whole steps
against torch.profiler.
"""

from __future__ import annotations

import contextvars
import math
from typing import Any, Callable

from scaletrain.engine.catalog import traced
from scaletrain.engine.estimate.chunked_loss import chunked, hidden_saved
from scaletrain.engine.estimate.numerics import numerics, uses_deepspeed
from scaletrain.engine.estimate.setup import TrainingSetup


def trace_regime(s: TrainingSetup) -> dict[str, Any]:
    """The regime a trace runs in, in measure/step.py's names (as measure/validate.py maps a plan).

    Checkpointing is (its recompute's moments are traced as they run), and so is the loss (`--loss chunked`: the
    trainer's chunked loss, not the model's own, which git's slicing of image positions fails on a text batch).
    fp16 is traced as bf16 (same widths); QLoRA as LoRA on an fp32 base under autocast (its frozen weights' 16-bit
    copies counted: an over-estimate, on the safe side). A sliding window or an attention chunk shorter than the
    planned sequence is traced as one shorter than the trace's sequences, so its masks and repeated k/v are in the
    fit.
    """
    nm = numerics(s)
    if s.precision == "fp32":
        precision = "fp32"
    elif not nm.autocast:
        precision = "bf16-pure"
    else:
        precision = "bf16" if nm.residual == 4 else "bf16-autocast"
    lora = s.method != "full"
    regime: dict[str, Any] = {"method": "lora" if lora else "full", "lora_rank": s.lora_rank if lora else 0,
                              "lora_targets": sorted(s.lora_targets) if lora else None, "precision": precision,
                              "attn": "eager" if s.attn == "eager" else "sdpa"}
    if s.grad_ckpt:
        regime["grad_ckpt"] = True    # the recompute's moments are traced as they run
    if chunked(s):
        regime["loss"] = "chunked"    # the loss the trainer runs (git's own fails on text; this one runs)
    cfg = s.model.config
    window = cfg.get("sliding_window")
    if _length(window) and window <= s.seq_len:
        regime["windowed"] = True     # traced with a window its sequences reach: masks, repeated k/v
    if any(_length(v) and v > traced.MAX_GRANULE and v < s.seq_len for k, v in cfg.items() if "chunk" in k):
        regime["chunked"] = True      # an attention chunk (llama4's) the sequences exceed: traced as a short one
    residue = s.seq_len % traced.granule(cfg)
    if residue:
        regime["residue"] = residue   # traced at lengths padding kernels pad as they pad this one (traced.granule)
    return regime


def _granule(act: dict[str, Any], seq_len: int) -> int:
    """1 when the trace's lengths share `seq_len`'s residue modulo the padding kernels' chunk (its fit is exact at
    `seq_len`); else the chunk, so traced.at rounds the sequence up to it (an answer cached before the residue was
    traced: the safe side)."""
    g = int(act.get("granule", 1))
    return 1 if g <= 1 or seq_len % g == int(act.get("residue", 0)) else g


def _under_long_fits(act: dict[str, Any], seq_len: int, granule: int) -> bool:
    """The planned length is under the three longest traced lengths, which the rises' fits are through."""
    S = -(-seq_len // max(granule, 1)) * max(granule, 1)
    return S < int(act.get("long_from", 0))


def _at_length(kind: dict[str, Any], act: dict[str, Any], seq_len: int, granule: int) -> dict[str, Any]:
    """A kind whose forward and backward rises hold, at a planned length under the long fits' range, the largest
    shortfall of those fits at a shorter traced length in their constant (measure/trace_fit.py envelope_parts)."""
    if not _under_long_fits(act, seq_len, granule):
        return kind
    return {**kind, **{p: [kind[p][0] + kind.get(f"{p}_below", 0), *kind[p][1:]] for p in ("fwd", "bwd")}}


def _length(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


# The losses a planner searches next (planner.solve: the chunked loss's search after the standard one's, `--loss`
# left free): their regimes are traced in the same ask, by the same forked copies, not in a second ask after it
# (tiny-glm4's first plan on a 2-core VM: the second ask took 1.1 of its 5.3 s)
ALSO_LOSSES: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("also_losses", default=())


def prefetch_traces(setups: list[TrainingSetup]) -> None:
    """Trace, in one subprocess, every regime these setups of a traced model need and the cache lacks (a search
    visits several: DeepSpeed's 16-bit weights and accelerate's autocast are different regimes), and those of the
    losses searched next (ALSO_LOSSES)."""
    from scaletrain.engine.catalog.architectures import analytic_types
    from scaletrain.engine.errors import ScaletrainError

    todo = [s for s in setups if s.model.memory_source == "traced"]
    if todo:
        regimes = {_json_key(trace_regime(s)): trace_regime(s) for s in todo}
        for loss in ALSO_LOSSES.get():
            for s in todo:
                try:
                    regime = trace_regime(s.with_(loss=loss))
                except ScaletrainError:         # a loss this setup cannot take: its search leaves it out
                    continue
                regimes.setdefault(_json_key(regime), regime)
        traced.prefetch(todo[0].model.config, list(regimes.values()), analytic_types())


def refused_traces(setups: list[TrainingSetup]) -> dict[int, str]:
    """The setups whose regime's trace is refused (by id), with the refusal: all regimes traced at once, or, when
    that is refused, each regime alone (git's LoRA + checkpointing fails in transformers, its LoRA without does
    not; reformer's LoRA has no adapter a gradient reaches). Every regime refused: the first refusal, raised."""
    from scaletrain.engine.errors import ScaletrainError

    try:
        prefetch_traces(setups)
        return {}
    except ScaletrainError as e:
        first = e
    by_regime: dict[str, list[TrainingSetup]] = {}
    for s in setups:
        if s.model.memory_source == "traced":
            by_regime.setdefault(_json_key(trace_regime(s)), []).append(s)
    if len(by_regime) < 2:
        raise first
    refused: dict[int, str] = {}
    for group in by_regime.values():
        try:
            prefetch_traces(group[:1])
        except ScaletrainError as e:
            refused.update({id(s): str(e) for s in group})
    if len(refused) == len(setups):
        raise first
    return refused


def traceable(setups: list[TrainingSetup]) -> list[TrainingSetup]:
    """The setups whose regimes trace (refused_traces): a planner's search leaves the others out."""
    refused = refused_traces(setups)
    return [s for s in setups if id(s) not in refused]


def _json_key(regime: dict[str, Any]) -> str:
    import json

    return json.dumps(regime, sort_keys=True)


def _trace(s: TrainingSetup) -> dict[str, Any]:
    from scaletrain.engine.catalog.architectures import analytic_types

    return traced.activations(s.model.config, trace_regime(s), analytic_types())


def routed_experts(s: TrainingSetup) -> list[tuple[int, list, list]]:
    """(layers, rows per token of each expert weight, [E, a, b] of each) of each layer kind with routed experts:
    the weights from the structure, the rows counted by the regime's trace (measure/trace_experts.py; None: not
    counted)."""
    kinds = (s.model.trace or {}).get("kinds") or []
    if not any(k.get("experts") for k in kinds):
        return []
    counted = _trace(s).get("kinds") or []
    out = []
    for i, k in enumerate(kinds):
        if k.get("experts"):
            rows = counted[i].get("experts_per_token") if i < len(counted) else None
            n = len(k["experts"])
            rows = list(rows) if isinstance(rows, list) and len(rows) == n else [None] * n
            out.append((int(k["count"]), rows, list(k["experts"])))
    return out


# A looped stack checkpointed (hrm_text, dory: TRACE_FORMAT 22 traces their runs) holds about six hidden states
# more at its backward's peak than the traced runs count, which the trace does not see yet: their LoRA +
# checkpointing steps measured 2.4 % under torch.profiler (hrm_text -2.35 %, dory -2.37 %; full + checkpointing
# -1.1 % and -0.7 %), without checkpointing within 0.4 % (bench/results/architecture_sweep.json).
LOOPED_CHECKPOINTING = ("its stack runs layers several times in one forward, and checkpointed such a stack holds "
                        "more than its plan counts: LoRA + checkpointing measured 2.4 % under torch.profiler "
                        "(hrm_text, dory), without checkpointing within 0.4 % (bench/results/architecture_sweep.json)")


def unmodeled_checkpointing(s: TrainingSetup) -> str | None:
    """Why the memory model does not plan `s`'s checkpointing, from its trace (a looped stack); None when it does.
    A planner leaves such a setup out; an estimate of it is refused in one line (memory.py)."""
    if not s.grad_ckpt or s.model.memory_source != "traced":
        return None
    return LOOPED_CHECKPOINTING if _trace(s).get("looped") else None


def gradless_params(s: TrainingSetup) -> int:
    """Trainable parameters that a step on text gives no gradient (a multimodal causal LM's towers; the trace's
    `gradless_params`). Plain PyTorch in one process allocates no gradient for them and torch's optimizers no state;
    under DDP the trainer freezes them before wrapping (trainer/distributed.freeze_without_gradient), so its buckets
    hold none either. DeepSpeed's and FSDP's flat partitions hold every trainable parameter: 0 there."""
    if uses_deepspeed(s) or s.strategy == "fsdp":
        return 0
    return params_without_gradient(s)


def largest_stepped_param(s: TrainingSetup) -> int:
    """Elements of the largest parameter tensor the optimizer steps (full fine-tuning): the model's largest, or,
    where the step leaves parameters without a gradient, the largest of the others (git's vision tower holds its
    largest; an older trace without the count: the model's largest, the safe side)."""
    if gradless_params(s):
        return int(_trace(s).get("largest_stepped_param") or 0) or s.model.largest_param_elems
    return s.model.largest_param_elems


def params_without_gradient(s: TrainingSetup) -> int:
    """The trace's `gradless_params` under any strategy."""
    if s.model.memory_source != "traced":
        return 0
    return min(int(_trace(s).get("gradless_params", 0)), s.trainable_params)


def names_without_gradient(s: TrainingSetup) -> tuple[str, ...]:
    """The names of those parameters (outside the layers: as in the full model), which the trainer freezes under
    DDP (plan.json): its reducer would wait for their gradients, and the next step fails."""
    if s.model.memory_source != "traced" or not params_without_gradient(s):
        return ()
    return tuple(str(n) for n in _trace(s).get("gradless_names") or ())


def _total(kinds: list[dict], L: int, value: Callable[[dict], int]) -> int:
    """Average over the real layers of a per-kind value, each kind weighed by its count, rounded up (safe side)."""
    return -(-sum(int(k["count"]) * value(k) for k in kinds) // max(L, 1))


def traced_block_terms(s: TrainingSetup, micro_batch: int | None, copies: tuple[int, int],
                       flash_backward: Callable[[TrainingSetup, int], int]) -> dict[str, Any]:
    """LayerActivations' fields for a traced model: the saved bytes averaged over the real layers (each kind by its
    count, what accumulates through forward), the moments of one block from the largest kind (`worst`: what a block
    holds while it runs forward, backward or is recomputed; see the module doc)."""
    m = s.model
    b = micro_batch or s.micro_batch
    S = s.seq_len
    act = _trace(s)
    g = _granule(act, S)
    kinds = [_at_length(k, act, S, g) for k in act["kinds"] if int(k["count"])]
    per_token = lambda f: [0, *f[1:]]   # noqa: E731 - c1, c2 without the constant
    attn = [traced.at(per_token(k["attn"]), b, S, g) for k in kinds]
    mlp = [traced.at(per_token(k["mlp"]), b, S, g) for k in kinds]
    consts = [math.ceil(k["attn"][0] + k["mlp"][0]) for k in kinds]
    counts = [int(k["count"]) for k in kinds]
    L = max(m.num_layers, 1)
    mean = lambda xs: -(-sum(n * x for n, x in zip(counts, xs)) // L)   # noqa: E731 - rounded up
    inputs = _inputs(s, kinds, b, S, g)
    fwd, bwd = _moments(s, kinds, b, S, g, flash_backward, max(inputs))
    kept = inputs if s.grad_ckpt else [a + x + c for a, x, c in zip(attn, mlp, consts)]
    # what a checkpointed layer's backward leaves (to the end of backward), its forward (to the next layer's end:
    # memory.py), and of that what outlives the forward (gemma4's stored keys and values: to the end of backward)
    left = {p: [traced.at(k.get(p, [0, 0, 0]), b, S, g) if s.grad_ckpt else 0 for k in kinds]
            for p in ("bwd_left", "fwd_left", "fwd_kept")}
    stack = _stack(s, act, kinds, kept, left["bwd_left"], (b, S, g), flash_backward, max(inputs)) \
        if len(kinds) > 1 else ()
    carry = traced.at(act.get("bwd_carry", [0, 0, 0]), b, S, g)
    looped = tuple(int(i) for i in act.get("call_order") or ()) if act.get("looped") else ()
    if s.grad_ckpt:     # a block's moments as traced under checkpointing (memory.py adds its input, the waiting grad)
        moment = {"saved_attn": 0, "saved_mlp": bwd, "fwd_transient": fwd, "mlp_bwd_transient": 0,
                  "attn_bwd_transient": 0, "weight_copies": 0, "cached_copies": 0, "recompute_transient": 0,
                  "checkpointed_input": max(inputs)}
        # autocast's cache holds every block's cast trainable weights until forward returns, a cache the trace's
        # hooks cannot see under checkpointing (the blocks save only their inputs): counted from the linears
        # (starcoder2 full + checkpointing under autocast peaks at the loss with them: 6.6 % under without)
        return {"saved_attn": mean(attn), "saved_mlp": mean(mlp), "fwd_transient": fwd, "mlp_bwd_transient": 0,
                "attn_bwd_transient": 0, "weight_copies": mean(consts), "cached_copies": copies[1],
                "recompute_transient": 0, "checkpointed_input": mean(inputs), "worst": moment, "stack": stack,
                "bwd_left": mean(left["bwd_left"]), "fwd_left": max(left["fwd_left"]), "bwd_carry": carry,
                "fwd_kept": mean(left["fwd_kept"]),
                "looped": looped}
    worst_saved = max(a + x for a, x in zip(attn, mlp))
    worst = {"saved_attn": max(attn), "saved_mlp": worst_saved - max(attn), "fwd_transient": fwd,
             "mlp_bwd_transient": max(bwd - worst_saved, 0), "attn_bwd_transient": 0,
             "weight_copies": max(consts), "cached_copies": min(copies[1], max(consts)),
             "recompute_transient": max(fwd - worst_saved, 0)}
    out = {"saved_attn": mean(attn), "saved_mlp": mean(mlp), "fwd_transient": fwd,
           "mlp_bwd_transient": max(bwd - mean(attn) - mean(mlp), 0), "attn_bwd_transient": 0,
           "weight_copies": mean(consts), "cached_copies": min(copies[1], mean(consts)),
           "recompute_transient": max(fwd - mean(attn) - mean(mlp), 0), "bwd_carry": carry, "looped": looped}
    if len(kinds) > 1:
        out["worst"] = worst
        out["stack"] = stack
        # forward: memory.py counts the running block's rise over the average block's saved bytes; the rise of
        # each kind is over its own, so the largest excess of a kind's rise over its own saved bytes stands on top
        # of every block's (gemma4's layer of head_dim 512 ran last, the average counted it 5 times over)
        excess = max(traced.at(k["fwd"], b, S, g) - a - m_ for k, a, m_ in zip(kinds, attn, mlp))
        excess = max(excess, fwd - worst_saved, 0)
        out["fwd_transient"] = min(fwd, mean(attn) + mean(mlp) + excess)
        out["recompute_transient"] = max(out["fwd_transient"] - mean(attn) - mean(mlp), 0)
    return out


def _stack(s: TrainingSetup, act: dict[str, Any], kinds: list[dict], kept: list[int], left: list[int],
           at: tuple[int, int, int], flash_backward: Callable[[TrainingSetup, int], int],
           block_input: int) -> tuple[tuple[int, int, int, int], ...]:
    """A stack of unlike layers, layer by layer in the real model's order (the structure's `layer_kinds`): what each
    keeps for backward (its saved bytes; checkpointed: its input), its backward moment as `_moments` takes it for
    its kind alone, its parameters, and what its backward leaves alive (checkpointed). memory.py walks backward through it, so a wide kind's backward counts only
    the layers below it (nemotron_h's: the bound of the largest kind over every layer's saved bytes was 9 % over).
    Empty when the order is not known (a cached structure without it)."""
    order = list(s.model.trace.get("layer_kinds") or ()) if s.model.trace else []
    present = [i for i, k in enumerate(act["kinds"]) if int(k["count"])]
    if len(order) != s.model.num_layers or not set(order) <= set(present):
        return ()
    structure_kinds = s.model.trace.get("kinds") or []
    if any(i >= len(structure_kinds) or "params" not in structure_kinds[i] for i in present):
        return ()
    b, S, g = at
    params = [int(structure_kinds[i]["params"]) for i in present]
    per_kind = [(keep, _moments(s, [k], b, S, g, flash_backward, block_input)[1], n, lf)
                for keep, k, n, lf in zip(kept, kinds, params, left)]
    where = {orig: j for j, orig in enumerate(present)}
    return tuple(per_kind[where[i]] for i in order)


def _inputs(s: TrainingSetup, kinds: list[dict], b: int, S: int, g: int) -> list[int]:
    """Each kind's input bytes for b sequences of S: the hidden states its layers receive, as traced (a trace
    without them, t·h in the residual dtype)."""
    nm = numerics(s)
    default = b * S * s.model.hidden_size * nm.residual
    return [traced.at([0, *k["input"][1:]], b, S, g) if k.get("input") else default for k in kinds]


def _moments(s: TrainingSetup, kinds: list[dict], b: int, S: int, g: int,
             flash_backward: Callable[[TrainingSetup, int], int], block_input: int) -> tuple[int, int]:
    """The largest kind's (forward, backward) bytes while one block runs: traced as the rise of live bytes in its
    forward, and its saved bytes plus the rise in its backward, with the gradient of its output waiting (the width
    of its input: `block_input`). On a GPU the kernel rules of the analytic families stand beside them
    (FlashAttention-2's workspace, which the CPU trace does not run), the larger of the two kept."""
    m = s.model
    nm = numerics(s)
    t = b * S
    waiting = 0 if s.grad_ckpt else block_input     # memory.py adds it under checkpointing
    fwd = max(traced.at(k["fwd"], b, S, g) for k in kinds)      # the allocator's rise: kernels' scratch included
    bwd = max(traced.at(k["bwd"], b, S, g) for k in kinds) + waiting
    if s.device != "cuda" or s.grad_ckpt:
        return fwd, bwd
    c = nm.compute
    largest = max(max(int(k["largest_mlp"]), int(k["largest_attn"])) for k in kinds)
    s2 = b * m.num_heads * S * S           # attention score elements
    saved = max(traced.at(k["attn"], b, S, g) + traced.at(k["mlp"], b, S, g) for k in kinds)
    rule_fwd = 2 * s2 * 4 if s.attn == "eager" else t * largest
    rule_bwd = 2 * s2 * 4 if s.attn == "eager" else t * flash_backward(s, c)
    rule_bwd = max(rule_bwd, 2 * t * (max(int(k["largest_mlp"]) for k in kinds) or largest))
    if nm.trainable_copies:      # a block without a linear (none found in its trace) has no such gradient
        rule_bwd += c * max((a * o for a, o, _ in m.linear_shapes().values()), default=0)
    return max(fwd, saved + rule_fwd), max(bwd, saved + rule_bwd)


# what cross-entropy itself saves per logit: log_softmax's fp32 output (the engine's head terms count it)
CROSS_ENTROPY_SAVED_PER_LOGIT = 4


def _head_tail(act: dict[str, Any], vocab: int, b: int, S: int, g: int) -> int:
    """What the model saves between its output head and the loss beyond cross-entropy's own (a final-logit
    softcap's tanh: another fp32 B·S·V tensor), traced at the slice's head width and scaled to the real one."""
    width = int(act.get("head_out") or 0)
    lv = act.get("loss_vocab")
    if not width or not lv:
        return 0
    per_logit = traced.at([0, *lv[1:]], 1, S, g) / (S * width)      # bytes per token per logit at the slice
    return math.ceil(max(per_logit - CROSS_ENTROPY_SAVED_PER_LOGIT, 0) * b * S * vocab)


def traced_outside_blocks(s: TrainingSetup, micro_batch: int | None = None) -> dict[str, int]:
    """activations.outside_blocks for a traced model: `shared`, `final`, `labels` (see the module doc)."""
    m = s.model
    nm = numerics(s)
    b = micro_batch or s.micro_batch
    S = s.seq_len
    t = b * S
    act = _trace(s)
    g = _granule(act, S)
    shared = traced.at(act["shared"], b, S, g)
    final = traced.at(act["final_norm"], b, S, g)
    own_head = not (s.fused_lm_head or chunked(s))   # TRL's fused head, the chunked loss: their own saves
    head_input = traced.at([0, *act["head_input"][1:]], b, S, g) if own_head else 0
    final += head_input
    head_out = m.vocab_size if m.vocab_head else 1
    if (nm.trainable_copies or nm.fp32_head) and own_head:
        final += 2 * head_out * m.hidden_size
    if nm.autocast and nm.residual == 4 and own_head:
        # the final hidden states in fp32, which the head reads through autocast's 16-bit cast (the cast is what it
        # saves): held by the causal LM's forward until the loss, where a checkpointed step peaks (cohere2, olmo3,
        # ministral, exaone4 full + checkpointing under autocast, 2×128: 1.6 % under without it)
        final += t * m.hidden_size * 4
    final += hidden_saved(s, t) if chunked(s) else 0
    final += _head_tail(act, m.vocab_size, b, S, g)
    # the tail's backward rise, less what the head's backward freed before it ran (its saved input, in `final`)
    tail_fit = list(act.get("tail_bwd", [0, 0, 0]))
    tail_fit[0] += act.get("tail_bwd_below", 0) if _under_long_fits(act, S, g) else 0
    tail = max(traced.at(tail_fit, b, S, g) - head_input, 0) if own_head else 0
    # before the stack, last in backward (the embedding's, gemma3n's per-layer input projection): its peak over what
    # outlives backward, its parameters' own gradients apart (the engine's `grads`)
    front = max(traced.at(act.get("front_bwd", [0, 0, 0]), b, S, g) - int(act.get("front_grads", 0)), 0)
    return {"shared": shared, "final": final, "labels": 8 * t, "window_mask": 0, "tail_bwd": tail,
            "front_bwd": front}

"""A traced model's routed experts: their weights' shapes (the structure, on the meta device) and how many experts a
token runs through (counted in a real forward of the slice, measure/trace.py `activations`).

transformers builds a mixture-of-experts block's experts as 3-D weights, [E, a, b] (gate_up_proj, down_proj: the
`@use_experts_implementation` families, granitemoe, nemotron_h) or as a module of such weights (jetmoe's
ParallelExperts), never as nn.Linear: the block linears (trace_layers.block_linears) miss them, and with them the
GEMMs a token's top-k experts run, which is most of an MoE block's compute. The time model needs each weight's
shape and the rows a token sends through it; the memory model has them already (the trace measured the experts'
parameters and what they save).

The experts a token runs through are counted, not read from a config key (their names differ by family: top_k,
num_experts_per_tok, moe_topk, moe_k …): the FLOPs inside the experts modules in one forward, in transformers'
`eager` experts implementation (a matmul per expert hit, which torch's flop counter sees; grouped_mm it does not),
divided by the FLOPs one row through every weight costs (2·a·b each) and by the tokens. Random routing spreads the
tokens unevenly, but every token still goes to its top k, so the count is exact; a family with zero-compute
experts (longcat_flash: a token routed there runs no GEMM) is counted at the share its random-init router sends
there, which training moves.
"""

from __future__ import annotations

from typing import Any


def routed_modules(layer) -> list:
    """The modules of one block that own routed expert weights: 3-D parameters [E, a, b], held by (or
    inside) a module's `experts` child (as transformers names them; trainer/model.py `moe_block_classes` reads the
    same) or a module whose class is an *Experts one. The owners, not the blocks around them, are what a forward
    calls: jetmoe's attention experts (JetMoeMoA) run their two ParallelExperts from its own `map` and `reduce`,
    never through their forward. A layer's other 3-D parameters (convolutions, xlnet's per-head projections,
    zamba's mamba heads) are no experts."""
    marked = [child for parent in layer.modules() for name, child in parent.named_children() if name == "experts"]
    marked += [m for m in layer.modules() if "expert" in type(m).__name__.lower()]
    return [mod for mod in layer.modules()
            if _weights(mod) and any(m is mod or _inside(mod, m) for m in marked)]


def _inside(mod, outer) -> bool:
    return any(m is mod for m in outer.modules())


def _weights(mod) -> list[list[int]]:
    """[E, a, b] of each 3-D parameter a module owns itself (E experts of a·b weights each; hunyuan's configs
    may build one)."""
    return [[int(d) for d in p.shape] for p in mod.parameters(recurse=False) if p.dim() == 3]


def expert_weights(layer) -> list[list[int]]:
    """[E, a, b] of every routed expert weight of one block (empty for a dense block)."""
    return [w for mod in routed_modules(layer) for w in _weights(mod)]


def experts_per_token(layers: list, tokens: int, forward) -> list[list[float | None] | None]:
    """Per layer of `layers`: for each of its expert weights (expert_weights' order), the rows one token runs
    through it in `forward()` (a no-gradient forward of `tokens` tokens), counted per module that owns them as the
    module doc says (inkling's block holds routed experts, 2 of 8, and shared ones, 1 of 1); None for a layer
    without experts, and None for a weight whose module could not be counted (the engine then says the experts'
    time is missing)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    per_layer = [routed_modules(layer) for layer in layers]
    if not any(per_layer):
        return [None] * len(layers)
    counted: dict[int, float] = {}
    linears: dict[int, float] = {}
    handles: list = []
    kept: list[tuple[Any, Any]] = []

    def watch(mod, into: dict[int, float]) -> None:
        state: dict[str, Any] = {}

        def enter(*_: Any) -> None:
            state["mode"] = FlopCounterMode(display=False)
            state["mode"].__enter__()

        def leave(*_: Any) -> None:
            mode = state.pop("mode", None)
            if mode is not None:
                mode.__exit__(None, None, None)
                into[id(mod)] = into.get(id(mod), 0.0) + float(mode.get_total_flops())

        handles.append(mod.register_forward_pre_hook(enter))
        handles.append(mod.register_forward_hook(leave, always_call=True))

    for mods in per_layer:
        for mod in mods:
            watch(mod, counted)
            for sub in mod.modules():        # a router inside the experts module is a block linear already
                if isinstance(sub, torch.nn.Linear):
                    watch(sub, linears)
            conf = getattr(mod, "config", None)
            if conf is not None and hasattr(conf, "_experts_implementation"):
                kept.append((conf, conf._experts_implementation))
                conf._experts_implementation = "eager"
    try:
        with torch.no_grad():
            forward()
    except Exception:        # noqa: BLE001 - a forward the counter cannot follow: counted as unknown
        counted.clear()
    finally:
        for h in handles:
            h.remove()
        for conf, impl in kept:
            conf._experts_implementation = impl
    return [[rows for m in mods for rows in _rows(m, counted, linears, tokens)] if mods else None
            for mods in per_layer]


def _rows(mod, counted: dict[int, float], linears: dict[int, float], tokens: int) -> list[float | None]:
    """The rows a token runs through each expert weight of `mod`: its FLOPs (less a linear's inside it) over what a
    row through all its weights costs, per token; None each when it ran no counted FLOPs."""
    weights = _weights(mod)
    flops = counted.get(id(mod), 0.0) - sum(linears.get(id(s), 0.0) for s in mod.modules() if s is not mod)
    per_row = sum(2 * a * b for _, a, b in weights)
    rows = round(flops / (per_row * tokens), 3) if per_row and tokens and flops > 0 else None
    return [rows] * len(weights)

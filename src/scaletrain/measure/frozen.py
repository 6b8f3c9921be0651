"""Module lists transformers builds frozen (blt's entropy patcher): tagged when a model is built, so they are never
taken for decoder layers (measure/saved_activations.py), whatever peft or a change of requires_grad does later."""

from __future__ import annotations

# the attribute a frozen module list carries
FROZEN_STACK = "_scaletrain_frozen_stack"


def mark_frozen_stacks(model) -> None:
    """Tag the module lists whose every parameter transformers built frozen: blt's entropy patcher, a stack run on
    the input ids to cut them into patches and never trained, whose outputs carry no gradient. They are no decoder
    layers, whatever a later peft wrapping (which freezes every base weight) or a change of requires_grad does:
    called where a model is built, before either (measure/step.py, measure/trace_layers.py meta_model)."""
    import torch

    for mod in model.modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod):
            params = list(mod.parameters())
            if params and not any(p.requires_grad for p in params):
                setattr(mod, FROZEN_STACK, True)

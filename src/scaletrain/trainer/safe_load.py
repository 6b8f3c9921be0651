"""Loading checkpoint files without running code from them: torch.load with weights_only=True, DeepSpeed's state
classes allowed (its loaders pass weights_only=False), for the trainer's checkpoints (trainer/checkpoints.py) and
FSDP's DCP shards (trainer/fsdp.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator


# DeepSpeed classes its optimizer partitions pickle (0.19: the loss scaler, the ZeRO stage enum, bf16 fragment
# addresses); weights_only loading accepts these and plain tensors/containers, nothing that runs code.
def _deepspeed_safe_globals() -> list[Any]:
    out: list[Any] = []
    for module, names in (("deepspeed.runtime.fp16.loss_scaler", ("LossScaler", "DynamicLossScaler")),
                          ("deepspeed.runtime.zero.config", ("ZeroStageEnum",)),
                          ("deepspeed.utils.tensor_fragment", ("fragment_address",))):
        try:
            mod = __import__(module, fromlist=list(names))
        except ImportError:
            continue
        out += [getattr(mod, n) for n in names if hasattr(mod, n)]
    return out


def safe_load(path: str | Path, map_location: Any = None) -> Any:
    """torch.load that runs no code from the file (weights_only=True; DeepSpeed's state classes allowed)."""
    import torch

    with torch.serialization.safe_globals(_deepspeed_safe_globals()):
        return torch.load(path, map_location=map_location, weights_only=True)


@contextlib.contextmanager
def weights_only_loads() -> Iterator[None]:
    """Every torch.load inside runs no code from the file (for library code that loads with weights_only=False,
    e.g. DeepSpeed's zero_to_fp32 consolidation): weights_only=True, DeepSpeed's state classes allowed."""
    import torch

    original = torch.load

    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        with torch.serialization.safe_globals(_deepspeed_safe_globals()):
            return original(f, map_location=map_location, weights_only=True)

    torch.load = load
    try:
        yield
    finally:
        torch.load = original

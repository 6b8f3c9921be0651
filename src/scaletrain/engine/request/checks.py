"""Sanity limits on a PlanRequest's values, checked before anything is resolved or searched.

Why a separate pass: a request arrives from flags, presets, `--set`, the wizard and plan.json, and a value that
is the right type can still be absurd (epochs `inf`, a headroom of NaN, a billion nodes). Each one is refused here
in one line that names the field and what is accepted, instead of surfacing later as an OverflowError in the time
model or a search that never ends. The limits are far beyond any real training job.
"""

from __future__ import annotations

import math
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.fields import INT_LIMITS

MAX_EPOCHS = 1e6
MAX_MODEL_SPEC_CHARS = 4096          # PATH_MAX on Linux; longer is no catalog id, path or cache id
MAX_NAME_CHARS = 200
MAX_RESIDENTS = 16
MAX_HOST_RAM_GIB = float(1 << 20)    # 1 PiB of RAM per node: no machine; a larger number is a typo


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _number(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ScaletrainError(f"{_flag(name)} must be a number (got {v!r})")
    return float(v)


def check_values(req: Any) -> None:
    """Refuse absurd request values in one line each (types, finiteness, ranges)."""
    for name, (lo, hi) in INT_LIMITS.items():
        v = getattr(req, name, None)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ScaletrainError(f"{_flag(name)} must be a whole number from {lo} to {hi:,} (got {v!r})")
    epochs = _number("epochs", req.epochs)
    if not (math.isfinite(epochs) and 0 < epochs <= MAX_EPOCHS):
        raise ScaletrainError(f"--epochs must be a positive finite number up to {MAX_EPOCHS:g} (got {req.epochs!r})")
    headroom = _number("headroom", req.headroom)
    if not (math.isfinite(headroom) and 0.0 <= headroom < 1.0):
        raise ScaletrainError(f"--headroom must be a fraction in [0, 1) (got {req.headroom!r})")
    if req.base_lr is not None:
        lr = _number("base_lr", req.base_lr)
        if not (math.isfinite(lr) and lr > 0):
            raise ScaletrainError(f"--base-lr must be a positive finite number (got {req.base_lr!r})")
    host_ram = getattr(req, "host_ram", None)
    if host_ram is not None:
        gib = _number("host_ram", host_ram)
        if not (math.isfinite(gib) and 0 < gib <= MAX_HOST_RAM_GIB):
            raise ScaletrainError(f"--host-ram must be a positive number of GiB per node up to {MAX_HOST_RAM_GIB:,.0f} "
                                  f"(got {host_ram!r})")
    _check_model_spec("--model", req.model)
    if req.lora_targets is not None and not req.lora_targets:     # "--lora-targets ," names no target
        raise ScaletrainError("--lora-targets names no target; give a comma list such as q_proj,v_proj, or leave it "
                              "out for every block linear")
    for resident in req.residents or ():
        _check_model_spec("--resident", resident[0] if isinstance(resident, (tuple, list)) and resident else resident)
    if isinstance(req.gpus, str) and not req.gpus.isprintable():     # a bidi or control character is no GPU name
        raise ScaletrainError(f"--gpus holds a control or direction character ({ascii(req.gpus)[:80]}); give plain "
                              "text such as auto, 4xH200 or 2x8xH100")
    for t in req.lora_targets or ():
        if not isinstance(t, str) or not t.isprintable() or len(t) > MAX_NAME_CHARS:
            raise ScaletrainError(f"--lora-targets: {ascii(t)[:80]} is no module name; give names such as q_proj,v_proj")
    if req.method == "qlora" and req.base_bits is not None and req.base_bits not in (4, 8):
        raise ScaletrainError(f"--method qlora quantizes the frozen base to 4 or 8 bits (got --base-bits "
                              f"{req.base_bits}); use --base-bits 4 or 8, or --method lora for a {req.base_bits}-bit "
                              "base")
    if not isinstance(req.gpus, str) or len(req.gpus) > MAX_NAME_CHARS:
        raise ScaletrainError(f"--gpus must be short text such as auto, 4xH200 or 2x8xH100 (got "
                              f"{str(req.gpus)[:40]!r}{'…' if len(str(req.gpus)) > 40 else ''})")
    if not isinstance(req.name, str) or len(req.name) > MAX_NAME_CHARS or not req.name.isprintable():
        raise ScaletrainError(f"the plan name must be one printable line of at most {MAX_NAME_CHARS} characters")
    if req.residents and len(req.residents) > MAX_RESIDENTS:
        raise ScaletrainError(f"at most {MAX_RESIDENTS} --resident models (got {len(req.residents)})")


def _check_model_spec(flag: str, model: Any) -> None:
    if not isinstance(model, str):
        raise ScaletrainError(f"{flag} must be text (got {model!r})")
    if not model.strip():
        raise ScaletrainError(f"{flag} is empty; give a catalog id (scaletrain models) or a config.json path")
    if len(model) > MAX_MODEL_SPEC_CHARS:
        raise ScaletrainError(f"{flag} is {len(model):,} characters long; give a catalog id, a config.json path "
                              f"or an HF cache id (at most {MAX_MODEL_SPEC_CHARS} characters)")

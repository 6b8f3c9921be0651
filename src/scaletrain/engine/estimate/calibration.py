"""Calibration profiles: what `scaletrain validate --save` measured on the user's own cards.

A profile is keyed by device kind (catalog GPU key, or "CPU"), training method and the software stack (torch,
transformers, accelerate, deepspeed versions: a new stack gets measured anew). Later plans on that hardware use
it — the time model's compute scale and the CUDA context / allocator reserve of the memory model — and say so in
the plan's notes. Profiles live under $SCALETRAIN_CONFIG_DIR (default $XDG_CONFIG_HOME/scaletrain or
~/.config/scaletrain)/calibration/. Reading one never imports torch (versions come from package metadata).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from scaletrain.engine.dist_versions import installed_version
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import atomic_write
from scaletrain.engine.estimate.setup import TrainingSetup

STACK_PACKAGES = ("torch", "transformers", "accelerate", "deepspeed")
# A measured compute scale outside this range means the run measured something else (a stall, a wrong device):
# the profile is refused rather than bending every later plan.
COMPUTE_SCALE_RANGE = (0.2, 5.0)


@dataclass(frozen=True)
class Calibration:
    device: str                              # catalog GPU key ("H100-SXM") or "CPU"
    method: str                              # full | lora | qlora
    stack: dict[str, str]
    created: str                             # ISO date
    source: str                              # the validate command that measured it
    compute_scale: float                     # measured / predicted compute time (1.0 = the model was right)
    achieved_utilization: float | None       # the utilization that scale implies (informational)
    context_bytes: int | None = None         # CUDA context + NCCL buffers seen on the device
    allocator_reserve_fraction: float | None = None   # reserved / allocated − 1 at the peak

    def describe(self) -> str:
        parts = [f"time ×{self.compute_scale:.2f} on compute"]
        if self.achieved_utilization is not None:
            parts.append(f"{self.achieved_utilization:.0%} achieved utilization")
        if self.allocator_reserve_fraction is not None:
            parts.append(f"allocator reserve {self.allocator_reserve_fraction:.0%}")
        if self.context_bytes is not None:
            parts.append(f"context {self.context_bytes / 2**20:.0f} MiB")
        return f"calibrated on {self.device} ({self.method}, {self.created}): " + ", ".join(parts)


def config_dir() -> Path:
    """SCALETRAIN_CONFIG_DIR, else $XDG_CONFIG_HOME/scaletrain, else ~/.config/scaletrain (remembered per value of
    the variables it reads: the planner's search asks for every setup it tries)."""
    return _config_dir(os.environ.get("SCALETRAIN_CONFIG_DIR"), os.environ.get("XDG_CONFIG_HOME"),
                       os.environ.get("HOME"))


@lru_cache(maxsize=16)
def _config_dir(explicit: str | None, xdg: str | None, home: str | None) -> Path:
    if explicit:
        return Path(explicit)
    base = xdg or str(Path.home() / ".config")
    return Path(base) / "scaletrain"


def calibration_dir() -> Path:
    return config_dir() / "calibration"


@lru_cache(maxsize=1)
def _stack() -> tuple[tuple[str, str], ...]:
    return tuple((name, installed_version(name) or "absent") for name in STACK_PACKAGES)


def stack_signature() -> dict[str, str]:
    """Versions of the packages that decide memory and speed (cached: read once per process)."""
    return dict(_stack())


def profile_path(device: str, method: str) -> Path:
    return calibration_dir() / f"{device}-{method}.json"


@lru_cache(maxsize=64)
def _load(path: str, mtime_ns: int) -> Calibration | None:
    try:
        data = json.loads(Path(path).read_text())
        return Calibration(**data)
    except (OSError, ValueError, TypeError):
        return None   # an unreadable profile is ignored, never fatal: plans fall back to the sourced constants


def load_calibration(device: str, method: str) -> Calibration | None:
    """The profile for this device kind and method, if one was saved with the current software stack."""
    if os.environ.get("SCALETRAIN_NO_CALIBRATION"):
        return None
    path = profile_path(device, method)
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        return None
    cal = _load(path, mtime)
    if cal is None or cal.stack != stack_signature():
        return None
    return cal


def for_setup(setup: TrainingSetup) -> Calibration | None:
    return load_calibration(setup.hardware.gpu.key, setup.method)


def save_calibration(cal: Calibration) -> Path:
    lo, hi = COMPUTE_SCALE_RANGE
    if not lo <= cal.compute_scale <= hi:
        raise ScaletrainError(
            f"measured/predicted compute time {cal.compute_scale:.2f} is outside {lo}–{hi}: the run measured "
            "something other than training (a stall or the wrong device); not saving a profile")
    path = profile_path(cal.device, cal.method)
    atomic_write(path, json.dumps(asdict(cal), indent=2) + "\n")
    return path

"""What a bug report needs to know about this machine (`scaletrain env`, as `trl env` and `accelerate env` do):
versions of the stack, platform, GPUs / driver / CUDA through NVML, host cores and RAM, accelerate's default config
and the DeepSpeed config it names, and the environment variables that change a run.

Versions come from the installed distributions' metadata (importlib.metadata): nothing here imports torch or any
other package it reports on. Each part is read on its own; a missing package is "not installed", no GPU is a normal
answer. Variables that hold secrets are reported as set or not, never their value.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from scaletrain.engine.catalog.hardware import host_cores
from scaletrain.engine.devices.detect import host_memory_bytes
from scaletrain.engine.devices.nvml import detect
from scaletrain.engine.run.writers import accelerate_default_config_path

NOT_INSTALLED = "not installed"
# Distributions a run's behaviour depends on, in the order a reader looks for them.
PACKAGES = ("scaletrain", "torch", "transformers", "peft", "accelerate", "deepspeed", "trl", "bitsandbytes",
            "liger-kernel", "datasets", "safetensors", "huggingface-hub", "tensorboard", "wandb", "textual", "rich",
            "nvidia-ml-py", "pydantic", "PyYAML")
# Variables that change where models come from, which GPUs a run sees, and how it communicates.
ENV_VARS = ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN",
            "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF",
            "OMP_NUM_THREADS", "ACCELERATE_CONFIG_FILE", "WANDB_MODE", "WANDB_API_KEY", "SCALETRAIN_VENV",
            "SCALETRAIN_DEBUG", "XDG_CACHE_HOME")
ENV_PREFIXES = ("NCCL_", "ACCELERATE_", "DS_", "TORCH_DISTRIBUTED_", "SLURM_JOB_")
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
MAX_CONFIG_BYTES = 1 << 20          # an accelerate default config is a few hundred bytes


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return NOT_INSTALLED


def _env_value(name: str) -> str | None:
    v = os.environ.get(name)
    if v is None:
        return None
    return "set (hidden)" if any(w in name.upper() for w in SECRET_WORDS) else v


def environment_variables() -> dict[str, str | None]:
    """The variables that matter: the named ones (None: unset) and any set one with a known prefix."""
    out = {name: _env_value(name) for name in ENV_VARS}
    for name in sorted(os.environ):
        if name.startswith(ENV_PREFIXES) and name not in out:
            out[name] = _env_value(name)
    return out


def _read_yaml(path: Path) -> tuple[Any, str | None]:
    from scaletrain.engine.yamlsafe import load_yaml

    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return None, f"larger than {MAX_CONFIG_BYTES:,} bytes, not read"
        return load_yaml(path.read_text(errors="replace")), None
    except Exception as e:                       # unreadable or not YAML: said, the rest of the report stands
        return None, f"unreadable: {e.__class__.__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def accelerate_config() -> dict[str, Any]:
    """accelerate's default config (where `accelerate launch` looks without --config_file) and the DeepSpeed
    config file it names, if any: found or not, and the keys a reader checks first."""
    path = Path(os.environ.get("ACCELERATE_CONFIG_FILE") or accelerate_default_config_path())
    out: dict[str, Any] = {"path": str(path), "found": path.is_file(), "error": None, "distributed_type": None,
                           "num_processes": None, "mixed_precision": None, "deepspeed_config_file": None,
                           "deepspeed_config_found": None}
    if not out["found"]:
        return out
    doc, err = _read_yaml(path)
    if err or not isinstance(doc, dict):
        out["error"] = err or "not a mapping"
        return out
    for key in ("distributed_type", "num_processes", "mixed_precision"):
        out[key] = doc.get(key)
    ds = doc.get("deepspeed_config") if isinstance(doc.get("deepspeed_config"), dict) else {}
    ds_file = ds.get("deepspeed_config_file")
    if ds_file:
        out["deepspeed_config_file"] = str(ds_file)
        out["deepspeed_config_found"] = Path(os.path.expanduser(str(ds_file))).is_file()
    elif ds:
        out["deepspeed_config_file"] = f"inline (zero_stage {ds.get('zero_stage')})"
    return out


def deepspeed_env_files() -> list[str]:
    """DeepSpeed's launcher exports the variables in ~/.deepspeed_env and ./.deepspeed_env to every node."""
    return [str(p) for p in (Path.home() / ".deepspeed_env", Path.cwd() / ".deepspeed_env") if p.is_file()]


@dataclass(frozen=True)
class Environment:
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dict(self.data)


def collect_environment() -> Environment:
    """Everything `scaletrain env` reports, read now."""
    gpus = detect()
    ram = host_memory_bytes()
    return Environment({
        "scaletrain": package_version("scaletrain"),
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": {"system": platform.platform(), "machine": platform.machine(), "cpu_cores": host_cores(),
                     "ram_bytes": ram},
        "packages": {name: package_version(name) for name in PACKAGES},
        "gpus": gpus.to_json(),
        "accelerate_config": accelerate_config(),
        "deepspeed_env_files": deepspeed_env_files(),
        "environment": environment_variables(),
    })

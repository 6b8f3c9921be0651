"""Which weights a run starts from (TrainOptions.model_source, set by --weights or a preset's `weights:`).

Why it matters: a plan is the same for random and pretrained weights, but a run from random init trains noise,
and a 4/8-bit base cannot be quantized from weights that do not exist on a GPU run. So the default is the model's
own pretrained weights (the catalog or HF id planned), random-init only for configs that have no weights (the
bundled scaletrain/tiny-* test models, a config.json folder without weight files), and every random-init run
carries a warning. The front ends (CLI, headless, wizard) call these functions; none of them decides on its own.

    default_weights(model)                        what None (not given) means for this --model
    resolve_weights(model_source, model)          model_source with None replaced by the default
    weights_warning(model_source)                 the red "testing only" line for random-init, else None
    weights_problem(method, base_bits, source)    one line why these weights cannot be used, else None (custom
                                                  code included: engine/request/remote_code.py)
    weights_mismatch(source, arch)                one line when local/cached weights are another architecture
    weights_note(model_source)                    a note when HF weights are not in the local cache yet: what the
                                                  launch downloads (hub reachable), else where they must come from
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from scaletrain.engine.request.remote_code import remote_code_problem

RANDOM_INIT = "random-init"
RANDOM_INIT_WARNING = ("random-init weights: testing only, this trains noise (give --weights HF_ID|PATH to start "
                       "from real weights)")
# Catalog models that exist only as configs (no hub repository): random init is all they have.
CONFIG_ONLY_ORGS = ("scaletrain/",)
# Files whose presence makes a folder a pretrained checkpoint (transformers' save_pretrained names).
WEIGHT_FILE_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model*.safetensors.index.json")
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
QUANTIZED_BITS = (4, 8)
COMPARED_FIELDS = ("hidden_size", "num_layers", "vocab_size")


def _local(source: str) -> Path | None:
    """The path a source names when it exists on this machine (a folder or a config.json), else None."""
    p = Path(source).expanduser()
    try:
        return p if p.exists() else None
    except (OSError, ValueError):
        return None


def _looks_like_path(source: str) -> bool:
    return source.startswith(("/", "./", "../", "~")) or source.count("/") > 1 or os.sep != "/" and os.sep in source


def has_weight_files(folder: Path) -> bool:
    try:
        return folder.is_dir() and any(any(folder.glob(pat)) for pat in WEIGHT_FILE_PATTERNS)
    except OSError:
        return False


def default_weights(model: str) -> str:
    """The weights a run of `model` starts from when --weights is not given: the model's own pretrained weights
    (its HF id, or the local folder when it holds weight files), random-init for config-only models."""
    from scaletrain.engine.catalog.architectures import catalog_entry

    spec = model.strip()
    entry = catalog_entry(spec)
    if entry is not None:
        mid = str(entry["id"])
        return RANDOM_INIT if mid.lower().startswith(CONFIG_ONLY_ORGS) else mid
    local = _local(spec)
    if local is not None:
        folder = local if local.is_dir() else local.parent
        return str(folder.resolve()) if has_weight_files(folder) else RANDOM_INIT
    return spec                                   # an HF id (cache or hub): its own weights


def resolve_weights(model_source: str | None, model: str) -> str:
    """model_source as the trainer will read it: None (not given) → default_weights(model); a local path → absolute
    (the trainer runs from the run directory)."""
    if model_source is None:
        return default_weights(model)
    local = _local(model_source)
    return str(local.resolve()) if local is not None and model_source != RANDOM_INIT else model_source


def weights_warning(model_source: str | None) -> str | None:
    """The warning every front end shows (red) for a run from random init; None for real weights."""
    return RANDOM_INIT_WARNING if model_source == RANDOM_INIT else None


def is_quantized_base(method: Any, base_bits: int | None) -> bool:
    """A 4/8-bit frozen base: QLoRA (4-bit unless told), or LoRA with --base-bits 4/8."""
    m = str(getattr(method, "value", method))
    bits = base_bits if base_bits is not None else (4 if m == "qlora" else 16)
    return m in ("lora", "qlora") and bits in QUANTIZED_BITS


def weights_problem(method: Any, base_bits: int | None, model_source: str | None) -> str | None:
    """One line saying why a run cannot start from these weights, or None. Checked when a run directory is written
    (and at --dry-run), before any process starts: a quantized base needs pretrained weights; a local path must
    exist and hold a config.json; anything else must read as an HF id (org/name)."""
    if model_source is None:
        return None
    if not isinstance(model_source, str) or not model_source.strip():
        return "--weights is empty; give an HF id, a local folder with config.json, or random-init"
    if model_source == RANDOM_INIT:
        if is_quantized_base(method, base_bits):
            bits = base_bits or 4
            return (f"a {bits}-bit base ({getattr(method, 'value', method)}) needs pretrained weights to quantize, not "
                    "random-init; give --weights HF_ID|PATH (scaletrain validate measures random-init on purpose)")
        return None
    local = _local(model_source)
    if local is not None:
        folder = local if local.is_dir() else local.parent
        if not (folder / "config.json").is_file():
            return f"--weights {model_source}: the folder holds no config.json (give a save_pretrained folder)"
        return remote_code_problem(model_source)
    if _looks_like_path(model_source) or not _HF_ID.match(model_source):
        return (f"--weights {model_source[:120]}: no such file or folder, and not an HF id (org/name); give a local "
                "folder with config.json, an HF id, or random-init")
    return remote_code_problem(model_source)              # an HF id already in the cache: its files are here


def launch_weights_problem(method: Any, base_bits: int | None, model_source: str | None) -> str | None:
    """weights_problem at launch and export, of the weights plan.json names now (it may have been edited after it
    was written): everything but the random-init rule for a 4/8-bit base, which `validate` relaxes on purpose."""
    if model_source == RANDOM_INIT:
        return None
    return weights_problem(method, base_bits, model_source)


def weights_mismatch(model_source: str | None, arch: Any) -> str | None:
    """One line when weights found on this machine (a local folder, or an HF cache entry) are another
    architecture than the plan's (hidden size, layers, vocabulary); None when they match or cannot be read here."""
    if model_source is None or model_source == RANDOM_INIT:
        return None
    from scaletrain.engine.catalog.architectures import load_model
    from scaletrain.engine.errors import ScaletrainError

    local = _local(model_source)
    spec = str((local if local.is_dir() else local.parent) / "config.json") if local is not None else model_source
    if local is None and model_source.lower() == str(getattr(arch, "name", "")).lower():
        return None
    try:
        theirs = load_model(spec, offline_only=True)
    except ScaletrainError:
        return None if local is None else f"--weights {model_source}: its config.json cannot be read as a causal LM"
    diffs = [f"{f} {getattr(theirs, f)} ≠ {getattr(arch, f)}" for f in COMPARED_FIELDS
             if getattr(theirs, f) != getattr(arch, f)]
    if diffs:
        return (f"--weights {model_source} is another architecture than the planned {arch.name} ({', '.join(diffs)});"
                " plan that model (--model) or give its weights")
    return None


_ASKED: dict[tuple[str, ...], tuple[float, Any]] = {}
ASKED_TTL_SECONDS = 60.0          # one `plan` asks the hub once (the note, the verdict, --json share the answer)


def weights_download(model_source: str | None) -> tuple[Any, str | None]:
    """(HubFiles of what the launch downloads, note) for HF weights not (all) in this machine's HF cache: when the
    hub can be asked, its metadata says how much ('downloads 15.2 GiB at launch …') or why it would refuse (gated,
    missing, no access: said now, and the launch stops there); offline, where they must come from. (None, None)
    for random-init, a local folder, or weights the cache holds."""
    if model_source is None or model_source == RANDOM_INIT or _local(model_source) is not None:
        return None, None
    from scaletrain.engine.catalog.hub import cache_roots, cached_file, unavailable

    config = cached_file(model_source, "config.json")
    if config is not None and has_weight_files(config.parent):
        return None, None                     # cached: the launch only checks for a newer main
    why = unavailable() if _HF_ID.match(model_source) and "/" in model_source else "not an HF id"
    if why is None:
        files = _asked(model_source)
        if isinstance(files, str):
            return None, f"{files}; the launch stops there"
        return (files, files.note()) if files.missing else (None, None)
    return None, (f"the weights of {model_source} are not in the HF cache at {cache_roots()[0]}, and here {why}: a "
                  f"launch where the hub answers downloads them first; elsewhere download them on the machine "
                  f"that trains (huggingface-cli download {model_source})")


def _asked(model_source: str) -> Any:
    """hub_files(model_source) or the hub's refusal (a line), the answer reused for a minute (same id, endpoint,
    token and cache)."""
    import time

    from scaletrain.engine.errors import ScaletrainError
    from scaletrain.engine.request.hub_files import hub_files

    key = (model_source, *(os.environ.get(k, "") for k in ("HF_ENDPOINT", "HF_TOKEN", "HF_HUB_CACHE", "HF_HOME")))
    hit = _ASKED.get(key)
    if hit is not None and time.monotonic() - hit[0] < ASKED_TTL_SECONDS:
        return hit[1]
    try:
        answer: Any = hub_files(model_source, "model")
    except ScaletrainError as e:
        answer = str(e)
    _ASKED[key] = (time.monotonic(), answer)
    return answer


def weights_note(model_source: str | None) -> str | None:
    """A note (not an error: the plan is still right, and the run may go to another machine) when an HF id's
    weights are not in this machine's HF cache: what the launch downloads, or, offline, that they must be there
    first (weights_download)."""
    return weights_download(model_source)[1]

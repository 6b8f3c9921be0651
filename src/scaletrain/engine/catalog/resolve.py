"""--model resolved to a config.json dict: a catalog id, a config.json path or folder, an HF cache id, or (unless
offline only) an HF id whose config.json alone is fetched from the hub. Nothing here counts parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from scaletrain.engine.catalog.config_json import MAX_SPEC_CHARS, hf_cache_config, read_config, short
from scaletrain.engine.catalog.entries import catalog_entry, catalog_ids, did_you_mean
from scaletrain.engine.errors import ScaletrainError


def resolve_config(spec: str, offline_only: bool) -> tuple[dict[str, Any], str, Mapping[str, Any] | None]:
    """The config.json dict behind --model, the name to show for it and the traced structure its catalog entry
    records (if any), or one line saying why there is none."""
    if not isinstance(spec, str) or not spec.strip():
        raise ScaletrainError("--model is empty; give a catalog id (see `scaletrain models`) or a config.json path")
    if len(spec) > MAX_SPEC_CHARS:
        raise ScaletrainError(f"--model is {len(spec):,} characters long; give a catalog id, a config.json path or "
                              f"an HF cache id (at most {MAX_SPEC_CHARS} characters)")
    entry = catalog_entry(spec)
    if entry is not None:
        return dict(entry["config"]), entry["id"], entry.get("traced_structure")
    p = Path(spec).expanduser()
    try:
        exists = p.exists()
    except (OSError, ValueError) as e:      # a name too long for the filesystem, a NUL byte
        raise ScaletrainError(f"--model {short(spec)} is not a usable path ({getattr(e, 'strerror', None) or e})"
                              ) from None
    if exists:
        if p.is_dir():
            p = p / "config.json"
            if not p.exists():
                raise ScaletrainError(f"{spec} is a folder without a config.json")
        cfg = read_config(p, spec)
        return cfg, (p.parent.name if p.name == "config.json" else p.stem), None
    cached = hf_cache_config(spec)
    if cached is not None:
        return read_config(cached, spec), spec, None
    from scaletrain.engine.catalog.hub import HF_ID, cache_roots, fetch_config

    why = "not an HF id (org/name)" if not HF_ID.match(spec) else "the hub was not asked"
    if HF_ID.match(spec) and not offline_only:
        fetched, why = fetch_config(spec)
        if fetched is not None:
            return read_config(fetched, spec), spec, None
    near = did_you_mean(spec)
    raise ScaletrainError(
        f"unknown model {short(spec, 100)}: not in the catalog ({len(catalog_ids())} models, `scaletrain "
        f"models`), not a path, not in the HF cache at {cache_roots()[0]}, and {why}; pass a config.json path"
        + (f" (did you mean {near}?)" if near else ""))

"""The bundled catalog's entries (engine/catalog/models/*.json): looked up by id, forgivingly, with a did-you-mean."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

CATALOG_DIR = Path(__file__).parent / "models"


@lru_cache(maxsize=None)
def _catalog_index() -> dict[str, Path]:
    out = {}
    for p in sorted(CATALOG_DIR.glob("*.json")):
        out[p.stem.replace("--", "/").lower()] = p
    return out


def catalog_ids() -> list[str]:
    return [json.loads(p.read_text())["id"] for p in _catalog_index().values()]


@lru_cache(maxsize=None)
def catalog_entry(model_id: str) -> dict[str, Any] | None:
    key = model_id.lower().strip()
    idx = _catalog_index()
    path = idx.get(key)
    if path is None:  # forgiving: "Qwen3-4B" without the org
        hits = [p for k, p in idx.items() if k.split("/")[-1] == key]
        path = hits[0] if len(hits) == 1 else None
    return json.loads(path.read_text()) if path else None


def did_you_mean(spec: str) -> str | None:
    """The nearest catalog id to a mistyped or newer-version id (difflib on the id, then on the name alone)."""
    import difflib

    ids = catalog_ids()
    name = spec.split("/")[-1].lower()
    prefixed = [i for i in ids if name.startswith(i.split("/")[-1].lower())]    # Qwen3-4B-Instruct → Qwen3-4B
    if prefixed:
        return max(prefixed, key=len)
    # the base model of a catalog variant (Qwen/Qwen2.5-7B → Qwen/Qwen2.5-7B-Instruct): the shortest such id
    extended = [i for i in ids if i.split("/")[-1].lower().startswith(name) and name]
    if extended:
        return min(extended, key=len)
    hit = difflib.get_close_matches(spec, ids, n=1, cutoff=0.6)
    if not hit:
        names = {i.split("/")[-1].lower(): i for i in ids}
        near = difflib.get_close_matches(spec.split("/")[-1].lower(), list(names), n=1, cutoff=0.6)
        hit = [names[near[0]]] if near else []
    return hit[0] if hit else None

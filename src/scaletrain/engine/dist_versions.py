"""Installed package versions without importlib.metadata's scan of every distribution (40-90 ms a process: most of a
cached plan's start), read from the `NAME-VERSION.dist-info` folder names on sys.path, the first in path order as
importlib.metadata finds it; anything else (an .egg-info, a name not found that way) asks importlib.metadata."""

from __future__ import annotations

import os
import re
import sys
from functools import lru_cache


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


@lru_cache(maxsize=None)
def installed_version(name: str) -> str | None:
    """The version of distribution `name`, or None when it is not installed."""
    want = _normal(name)
    for entry in sys.path:
        for folder in _listing(entry):
            if folder.endswith(".dist-info") and "-" in folder:
                dist, _, version = folder[: -len(".dist-info")].partition("-")
                if _normal(dist) == want and version:
                    return version
            elif folder.endswith(".egg-info") and _normal(folder[: -len(".egg-info")].split("-")[0]) == want:
                return _from_metadata(name)
    return _from_metadata(name)


@lru_cache(maxsize=None)
def _listing(entry: str) -> tuple[str, ...]:
    try:
        return tuple(n for n in os.listdir(entry or ".") if n.endswith((".dist-info", ".egg-info")))
    except OSError:
        return ()


def _from_metadata(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None

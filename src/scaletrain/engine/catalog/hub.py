"""A model's config.json from the Hugging Face cache, or only that file from the hub.

Why: any HF causal LM can be planned without the weights; config.json (a few KiB) is all the engine reads. The cache
is read as huggingface_hub lays it out (<cache>/models--ORG--NAME/refs/main → snapshots/<rev>/config.json), with
the same roots it uses ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub), so nothing touches the
network for a cached model. Otherwise `huggingface_hub.hf_hub_download` fetches config.json alone (it honours
HF_HUB_OFFLINE, HF_TOKEN and HF_ENDPOINT) after a quick reachability probe, because an offline machine would
otherwise spend ~20 s in its retries before saying no. No torch, no transformers.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse

HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
PROBE_TIMEOUT_SECONDS = 3.0
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = ("1", "on", "yes", "true")


def cache_roots() -> list[Path]:
    """Where huggingface_hub keeps repositories: the one it uses first ($HF_HUB_CACHE, else $HF_HOME/hub, else
    $XDG_CACHE_HOME or ~/.cache, /huggingface/hub), then the others that are set (a download made under other
    settings is still found)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    roots = [Path(os.environ["HF_HUB_CACHE"]).expanduser() if os.environ.get("HF_HUB_CACHE") else None,
             Path(os.environ["HF_HOME"]).expanduser() / "hub" if os.environ.get("HF_HOME") else None,
             Path(xdg).expanduser() / "huggingface" / "hub" if xdg else None,
             Path.home() / ".cache" / "huggingface" / "hub"]
    out: list[Path] = []
    for r in roots:
        if r is not None and r not in out:
            out.append(r)
    return out


def cached_file(repo_id: str, filename: str = "config.json", kind: str = "models") -> Path | None:
    """<cache>/<kind>--ORG--NAME/snapshots/<refs/main>/filename, else the newest snapshot holding it; None when
    absent. Never touches the network."""
    folder = f"{kind}--" + repo_id.replace("/", "--")
    for root in cache_roots():
        repo = root / folder
        try:
            ref = repo / "refs" / "main"
            if ref.is_file():
                p = repo / "snapshots" / ref.read_text().strip() / filename
                if p.is_file():
                    return p
            snaps = repo / "snapshots"
            if snaps.is_dir():
                cands = sorted(snaps.glob(f"*/{filename}"), key=lambda p: p.stat().st_mtime, reverse=True)
                if cands:
                    return cands[0]
        except (OSError, ValueError):      # an id too long for a file name, a dangling snapshot link
            continue
    return None


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def reachable() -> str | None:
    """None when the hub endpoint accepts a TCP connection (or a proxy is configured: the client knows best);
    else why not, in a few words."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_SECONDS).close()
        return None
    except OSError as e:
        return f"{host} unreachable: {e.strerror or e.__class__.__name__}"


def unavailable() -> str | None:
    """None when the hub may be asked (not HF_HUB_OFFLINE, its endpoint answers); else why not, in a few words."""
    if offline():
        return "the hub is off (HF_HUB_OFFLINE is set)"
    why = reachable()
    return None if why is None else f"the hub is unreachable ({why})"


def fetch_config(repo_id: str) -> tuple[Path | None, str]:
    """config.json downloaded from the hub (only that file), or (None, why not: offline, unreachable, no access,
    no such repository)."""
    why = unavailable()
    if why is not None:
        return None, why
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_off = are_progress_bars_disabled()
    disable_progress_bars()                  # a few KiB: no bar (the launch's download shows one)
    try:
        return Path(hf_hub_download(repo_id, "config.json")), ""
    except Exception as e:        # GatedRepoError, RepositoryNotFoundError, HTTP errors: one line
        return None, f"the hub said: {error_line(e, repo_id)}"
    finally:
        if not was_off:
            enable_progress_bars()


def error_line(e: BaseException, repo_id: str, kind: str = "model") -> str:
    """One line for what the hub refused: gated, missing or private, unauthorised, else the client's first line."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    site = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    page = f"{site}/{'datasets/' if kind == 'dataset' else ''}{repo_id}"
    if isinstance(e, GatedRepoError):
        return (f"{kind} {repo_id} is gated on the hub: accept its terms at {page} and set HF_TOKEN to a token of "
                "that account (or `hf auth login`)")
    if isinstance(e, RepositoryNotFoundError):
        return (f"{kind} {repo_id} is not on the hub, or it is private and HF_TOKEN gives no access to it; check the "
                "id (org/name) or set HF_TOKEN")
    if isinstance(e, RevisionNotFoundError):
        return f"{kind} {repo_id}: the hub has no such revision"
    status = getattr(getattr(e, "response", None), "status_code", None)
    if status in (401, 403):
        return f"{kind} {repo_id}: the hub refused access ({status}); set HF_TOKEN to a token with access"
    first = (str(e).strip().splitlines() or [e.__class__.__name__])[0][:200]
    return f"{kind} {repo_id}: the hub could not be asked ({first})"

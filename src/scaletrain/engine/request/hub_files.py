"""The files a run needs from the Hugging Face Hub: which, how big, whether this machine's cache has them, and
their download.

Why: every user's first run of a hub model downloads it (HF Trainer, TRL and axolotl do so on first use), and a
run that downloads inside every rank races N processes over one cache and fails late, after the ranks started. So
the launcher downloads once per node before the ranks start (engine/launch/prefetch.py), the plan says how much
it will download, and a gated, missing or unauthorised repository is one line first. Only what the run loads is
fetched: config, generation config, tokenizer files and the weights transformers reads (safetensors; the .bin
pickles only for a repo without them); of a dataset, the data files the trainer reads (data_files.pick_data_files).

All of it is `huggingface_hub` (it honours HF_ENDPOINT, HF_TOKEN, HF_HUB_CACHE/HF_HOME and HF_HUB_OFFLINE): the
size comes from one metadata request (repo info with file sizes), the download is snapshot_download into the HF
cache (resumable: an interrupted file continues from its .incomplete part). No torch, no transformers.
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.engine.catalog.hub import error_line
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.data_files import pick_data_files
from scaletrain.engine.units import fmt_bytes, fmt_seconds

# What transformers reads for AutoConfig, AutoTokenizer, AutoModelForCausalLM and GenerationConfig.
MODEL_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
                    "tokenizer.model", "spiece.model", "chat_template.jinja", "chat_template.json", "*.tiktoken")
# The weights by transformers' own names (a repo may also hold other copies, e.g. Mistral's consolidated.safetensors:
# not what from_pretrained reads, so not fetched); the .bin pickles only where no safetensors exist.
SAFETENSORS = ("model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors")
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin")
# For the plan's download time: an assumed sustained hub download rate (a cloud machine pulling from the hub's CDN;
# not measured here — this sandbox has no hub). The bytes are exact; the time is said to be at this rate.
ASSUMED_BYTES_PER_SECOND = 100e6
HUB_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class HubFiles:
    """A repository's files a run needs (name → bytes, from the hub's metadata), at commit `sha`, and which of
    them this machine's HF cache lacks."""

    repo_id: str
    kind: str                                 # "model" | "dataset"
    sha: str
    sizes: tuple[tuple[str, int], ...]
    missing: tuple[str, ...]

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.sizes]

    @property
    def total_bytes(self) -> int:
        return sum(b for _, b in self.sizes)

    @property
    def missing_bytes(self) -> int:
        gone = set(self.missing)
        return sum(b for n, b in self.sizes if n in gone)

    @property
    def download_seconds(self) -> float:
        return self.missing_bytes / ASSUMED_BYTES_PER_SECOND

    def note(self) -> str:
        """'downloads 15.2 GiB at launch (4 files of ORG/NAME into CACHE; about 2.5 min at 100 MB/s)'."""
        from scaletrain.engine.catalog.hub import cache_roots

        n = len(self.missing)
        return (f"downloads {fmt_bytes(self.missing_bytes)} at launch ({n} file{'s' if n != 1 else ''} of "
                f"{self.repo_id} into the HF cache at {cache_roots()[0]}; about {fmt_seconds(self.download_seconds)}"
                f" at {ASSUMED_BYTES_PER_SECOND / 1e6:.0f} MB/s)")

    def to_json(self) -> dict[str, Any]:
        return {"repo": self.repo_id, "kind": self.kind, "revision": self.sha, "files": len(self.sizes),
                "bytes": self.total_bytes, "missing_files": len(self.missing), "missing_bytes": self.missing_bytes,
                "seconds": round(self.download_seconds, 1), "assumed_bytes_per_second": ASSUMED_BYTES_PER_SECOND}


def pick_model_files(names: list[str]) -> list[str]:
    """Of a model repo's files, those from_pretrained reads: the side files and one weight format."""
    def matching(patterns: tuple[str, ...]) -> list[str]:
        return [n for n in names if "/" not in n and any(fnmatch.fnmatchcase(n, p) for p in patterns)]

    weights = matching(SAFETENSORS) or matching(PICKLES)
    return sorted(set(matching(MODEL_SIDE_FILES) + weights))


def _listing(repo_id: str, kind: str) -> tuple[str, dict[str, int]]:
    from huggingface_hub import HfApi

    api = HfApi()
    info = (api.dataset_info if kind == "dataset" else api.model_info)(repo_id, files_metadata=True,
                                                                        timeout=HUB_TIMEOUT_SECONDS)
    return str(info.sha), {s.rfilename: int(s.size or 0) for s in (info.siblings or [])}


def hub_files(repo_id: str, kind: str = "model") -> HubFiles:
    """What a run of `repo_id` needs from the hub (one metadata request); one line when the hub refuses. Whether the
    files may be downloaded (a gated repo's metadata is public) is known only when they are: see download()."""
    try:
        sha, sizes = _listing(repo_id, kind)
    except Exception as e:          # the client's errors (HTTP, connection): one line
        raise ScaletrainError(error_line(e, repo_id, kind)) from None
    names = pick_model_files(list(sizes)) if kind == "model" else pick_data_files(list(sizes))
    if kind == "model" and not any(n.endswith((".safetensors", ".bin")) for n in names):
        raise ScaletrainError(f"model {repo_id} on the hub holds no weights transformers loads (model.safetensors, "
                              "model-*-of-*.safetensors or pytorch_model*.bin)")
    if kind == "dataset" and not names:
        raise ScaletrainError(f"dataset {repo_id} on the hub holds no JSONL/JSON/Parquet/CSV data files")
    _check_access(repo_id, kind, sha, names[0])
    missing = tuple(n for n in names if not _in_cache(repo_id, kind, sha, n))
    return HubFiles(repo_id, kind, sha, tuple((n, sizes[n]) for n in names), missing)


def _check_access(repo_id: str, kind: str, sha: str, name: str) -> None:
    """A gated repo's metadata is public but its files are not: ask for one file's metadata (a HEAD request) with
    this machine's token, so a refusal is said before anything is downloaded."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    try:
        get_hf_file_metadata(hf_hub_url(repo_id, name, repo_type=kind, revision=sha), timeout=HUB_TIMEOUT_SECONDS)
    except Exception as e:
        raise ScaletrainError(error_line(e, repo_id, kind)) from None


def _in_cache(repo_id: str, kind: str, sha: str, name: str) -> bool:
    from scaletrain.engine.catalog.hub import cache_roots

    p = cache_roots()[0] / f"{kind}s--{repo_id.replace('/', '--')}" / "snapshots" / sha / name
    try:
        return p.is_file()
    except OSError:
        return False


def download(files: HubFiles, progress: bool | None = None) -> Path:
    """The needed files into the HF cache (snapshot_download of main, only those files); returns the
    snapshot folder. A progress bar on a terminal (progress None: when stderr is one), none off one."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    show = sys.stderr.isatty() if progress is None else progress
    was_off = are_progress_bars_disabled()
    if not show:
        disable_progress_bars()
    try:
        # revision main (not the listed commit): the cache's refs/main then names the snapshot, which is what
        # transformers and the datasets reader resolve an id to offline (the ranks run with HF_HUB_OFFLINE=1)
        return Path(snapshot_download(files.repo_id, repo_type=files.kind, allow_patterns=files.names,
                                      etag_timeout=HUB_TIMEOUT_SECONDS))
    except Exception as e:
        raise ScaletrainError(error_line(e, files.repo_id, files.kind)) from None
    finally:
        if not show and not was_off:
            enable_progress_bars()

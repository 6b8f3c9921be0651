"""What the wizard's weights and data fields accept: random-init, a local folder or an HF model id; a local data file
or an HF dataset id. Parsing only (the trainer loads them); no Textual, so the plain wizard can use it too."""

from __future__ import annotations

import os
import re
from pathlib import Path

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.weights import RANDOM_INIT

HF_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")          # org/name, as the Hub spells repository ids
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def _looks_like_path(t: str) -> bool:
    return t.startswith(("/", ".", "~")) or t.lower().endswith(DATA_SUFFIXES) or os.sep + os.sep in t


def parse_weights(text: str) -> str:
    """The weights field: random-init, a local folder (must exist), or an HF model id (org/name)."""
    t = (text or "").strip()
    if not t:
        raise ScaletrainError("weights are empty; give an HF id (org/name), a local model folder, or random-init "
                              "(testing only)")
    if t.lower() == RANDOM_INIT:
        return RANDOM_INIT
    p = Path(os.path.expanduser(t))
    if p.exists():
        if not p.is_dir():
            raise ScaletrainError(f"weights {t!r} is a file; give the model's folder (it holds config.json and "
                                  "the weights)")
        return str(p.resolve())
    if _looks_like_path(t) or not HF_ID_RE.match(t):
        raise ScaletrainError(f"weights {t!r} is neither a folder here nor an HF id (org/name); or random-init")
    return t


def parse_data(text: str) -> str | None:
    """The data field: a local JSONL/JSON/Parquet/CSV file (must exist), an HF dataset id, or empty (demo data)."""
    t = (text or "").strip()
    if not t:
        return None
    p = Path(os.path.expanduser(t))
    if p.exists():
        if not p.is_file():
            raise ScaletrainError(f"data {t!r} is not a file; give a JSONL file or an HF dataset id (org/name)")
        return str(p.resolve())
    if _looks_like_path(t) or not HF_ID_RE.match(t):
        raise ScaletrainError(f"data {t!r} does not exist; give a JSONL file or an HF dataset id (org/name)")
    return t


def model_weights(model: str) -> str:
    """A model's own weights: its folder for a config.json path, else the model as given (folder or HF id)."""
    p = Path(os.path.expanduser(model.strip()))
    return str(p.parent.resolve()) if p.is_file() else model.strip()

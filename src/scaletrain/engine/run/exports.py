"""What a run has exported: export/step-<n>/ folders with their export.json (written by trainer/export.py, last).

The finish line, `monitor --headless`, `scaletrain export` (a step already exported is said, not redone) and
`scaletrain chat` read it here; no torch. A folder without a readable export.json is not an export (a partial one
is written beside and renamed whole, so that only happens to folders made by hand).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.engine.run.layout import CHECKPOINT_PREFIX, RunDir

EXPORT_MANIFEST = "export.json"
MAX_MANIFEST_BYTES = 1 << 20
STEP_DIR_RE = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


@dataclass(frozen=True)
class ExportInfo:
    path: Path
    step: int
    kind: str                          # "model" or "adapter"
    dtype: str | None
    merged: Path | None                # LoRA: the merged model folder, when written
    max_abs_logit_diff: dict[str, float]   # the end-of-run check: export read back vs the trained model ({} if none)
    base_weights: str | None           # the run's starting weights (an adapter's base)

    @property
    def loadable(self) -> Path:
        """The folder AutoModelForCausalLM loads on its own: the model, or the merged model (None-safe: the
        adapter folder otherwise, which needs its base)."""
        if self.kind == "model":
            return self.path
        return self.merged if self.merged is not None else self.path / "adapter"

    def check_text(self) -> str:
        if not self.max_abs_logit_diff:
            return "not checked against the trained model"
        parts = ", ".join(f"{k} {v:.2g}" for k, v in sorted(self.max_abs_logit_diff.items()))
        return f"checked: max |logit − trained| {parts}"


def read_export(folder: Path) -> ExportInfo | None:
    """One export folder's manifest, or None when it has none (or an unreadable one)."""
    f = Path(folder) / EXPORT_MANIFEST
    try:
        if f.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        d: Any = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(d, dict) or not isinstance(d.get("step"), int) or d.get("kind") not in ("model", "adapter"):
        return None
    checked = d.get("checked") if isinstance(d.get("checked"), dict) else {}
    diffs = checked.get("max_abs_logit_diff") if isinstance(checked.get("max_abs_logit_diff"), dict) else {}
    merged = Path(folder) / "merged" if d.get("merged") and (Path(folder) / "merged").is_dir() else None
    return ExportInfo(Path(folder), d["step"], d["kind"], d.get("dtype") if isinstance(d.get("dtype"), str) else None,
                      merged, {k: float(v) for k, v in diffs.items() if isinstance(v, (int, float))},
                      d.get("base_weights") if isinstance(d.get("base_weights"), str) else None)


def run_exports(run: RunDir) -> list[ExportInfo]:
    """The run's exports under export/, newest step first."""
    try:
        dirs = [p for p in run.exports.iterdir() if p.is_dir() and STEP_DIR_RE.match(p.name)]
    except OSError:
        return []
    found = [e for e in (read_export(p) for p in dirs) if e is not None]
    return sorted(found, key=lambda e: e.step, reverse=True)


def newest_export(run: RunDir) -> ExportInfo | None:
    found = run_exports(run)
    return found[0] if found else None

"""A run directory's earlier attempts, kept: attempts/<n>-<stamp>/ holds what a remedy's rewrite or a fresh launch
would otherwise overwrite.

A remedy (relaunch.py) copies the plan files and logs there before it rewrites them, and moves the checkpoints and
metrics there when it restarts from step 0. A launch without --resume over a run that already trained moves that
run's checkpoints, metrics, TensorBoard events and export there first (`set_aside_earlier`): the new run's step-6/
would otherwise replace the old one's while the old step-12/ stayed, so a later --resume continued the OLD run's
step 12 under the new run's metrics; and the end-of-run export refused the old export/step-12/ while the console
reported that old export as this run's.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from scaletrain.engine.fileio import atomic_write
from scaletrain.engine.run.layout import BACKED_UP, RunDir, checkpoint_step

ATTEMPTS_DIR = "attempts"


def backup_attempt(run: RunDir, record: dict[str, Any], move: tuple[str, ...] = (),
                   record_name: str = "remedy.json") -> Path:
    """attempts/<n>-<stamp>/: copies of the plan files and logs as they were; `move` names are moved there; `record`
    written as `record_name`."""
    root = run.path / ATTEMPTS_DIR
    root.mkdir(exist_ok=True)
    n = 1 + sum(1 for p in root.iterdir() if p.is_dir())
    dest = root / f"{n:02d}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    dest.mkdir()
    for name in BACKED_UP:
        src = run.path / name
        if src.is_file() and name not in move:
            shutil.copy2(src, dest / name)
    if run.logs.is_dir():
        shutil.copytree(run.logs, dest / run.logs.name)
    for name in move:
        src = run.path / name
        if src.exists():
            shutil.move(str(src), str(dest / name))
    atomic_write(dest / record_name, json.dumps(record, indent=2, default=str) + "\n", backup=False)
    return dest


def _trained(run: RunDir) -> bool:
    """The run directory holds what a launch wrote: a checkpoint folder (complete or not) or an export."""
    ckpts = run.checkpoints.is_dir() and any(checkpoint_step(d) is not None for d in run.checkpoints.iterdir())
    return ckpts or (run.exports.is_dir() and any(run.exports.iterdir()))


def set_aside_earlier(run: RunDir) -> str | None:
    """Before a launch that starts at step 0 (no --resume): an earlier launch's checkpoints, metrics, TensorBoard
    events and export moved to attempts/<n>-<stamp>/ (a rename: no copy, nothing deleted). The note to show, or
    None when the run directory holds no earlier training."""
    if not _trained(run):
        return None
    newest = run.newest_checkpoint()
    move = tuple(p.name for p in (run.checkpoints, run.metrics, run.tensorboard, run.exports) if p.exists())
    record = {"why": "launched without --resume", "newest_checkpoint": newest.name if newest else None,
              "moved": list(move), "at": datetime.now().isoformat(timespec="seconds")}
    dest = backup_attempt(run, record, move, record_name="launch.json")
    resume = f"; `--resume` would have continued from its {newest.name}" if newest else ""
    return (f"this launch starts at step 0: the earlier launch's {', '.join(move)} moved to "
            f"{dest.relative_to(run.path)}/{resume}")

"""Writing files so that a reader never sees half of one: a temp file beside the target, then a rename."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, text: str, *, mode: int | None = None, backup: bool = True) -> Path | None:
    """Write via a temp file + rename; keep a `.bak` of an existing file that differs. Returns the backup path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    bak = None
    if path.exists() and backup:
        try:
            same = path.read_text() == text
        except (OSError, UnicodeDecodeError):
            same = False
        if same:
            return None
        bak = path.with_name(path.name + ".bak")
        n = 1
        while bak.exists():
            bak = path.with_name(f"{path.name}.bak{n}")
            n += 1
        bak.write_bytes(path.read_bytes())
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return bak

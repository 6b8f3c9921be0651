"""Files written and read while something else uses them: atomic writes (a temp file beside the target, then a
rename) and incremental reads of a file another process appends to."""

from __future__ import annotations

import errno
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from scaletrain.engine.errors import ScaletrainError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def os_error_reason(e: OSError) -> str:
    """Why an OSError happened, in a few words (a full disk is named as such)."""
    if e.errno in DISK_FULL_ERRNOS:
        return "the disk is full (No space left on device)" if e.errno == errno.ENOSPC else "disk quota exceeded"
    return e.strerror or e.__class__.__name__


@contextmanager
def writing(what: str) -> Iterator[None]:
    """Turn an OSError while writing `what` into one ScaletrainError line (read-only place, full disk, ...)."""
    try:
        yield
    except OSError as e:
        where = f" ({e.filename})" if e.filename and str(e.filename) not in what else ""
        raise ScaletrainError(f"cannot write {what}{where}: {os_error_reason(e)}") from None


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


class AppendedLines:
    """The complete lines appended to a file since the last poll. A partial last line waits for the next poll; a
    replaced or truncated file (a relaunch) is read afresh and `restarted` says so; with `first_read_limit`, the
    first read of a big file starts that many bytes before its end."""

    def __init__(self, path: str | os.PathLike[str], first_read_limit: int | None = None):
        self.path = Path(path)
        self.first_read_limit = first_read_limit
        self.restarted = False
        self._offset = 0
        self._pending = b""
        self._inode: int | None = None

    def poll(self) -> list[bytes]:
        self.restarted = False
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        if self._inode is not None and (st.st_ino != self._inode or st.st_size < self._offset):
            self._offset, self._pending = 0, b""
            self.restarted = True
        if self._inode is None and self.first_read_limit is not None and st.st_size > self.first_read_limit:
            self._offset = st.st_size - self.first_read_limit
        self._inode = st.st_ino
        if st.st_size == self._offset:
            return []
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        self._offset += len(chunk)
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        return lines

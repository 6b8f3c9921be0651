"""Files written and read while something else uses them: atomic writes (a temp file beside the target, then a
rename), incremental reads of a file another process appends to, and bounded reads of files a user or a run folder
hands the tool: regular files only (a FIFO, socket, device or folder is one line, without blocking: the type is
checked before opening, and the open itself does not wait, O_NONBLOCK), whole-file reads capped in size."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from scaletrain.engine.errors import ScaletrainError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def os_error_reason(e: OSError) -> str:
    """Why an OSError happened, in a few words (a full disk is named as such)."""
    if e.errno in DISK_FULL_ERRNOS:
        return "the disk is full (No space left on device)" if e.errno == errno.ENOSPC else "disk quota exceeded"
    return e.strerror or e.__class__.__name__


MAX_PATH_SHOWN = 160                     # a path in an error line, cut in the middle beyond this

_WHAT_TO_DO = {
    errno.ENOSPC: "free some space or choose a place on another disk",
    errno.EDQUOT: "free some space or choose a place on another disk",
    errno.ELOOP: "a symbolic link there points back at itself; give the real folder",
    errno.ENAMETOOLONG: "a name in it is longer than the filesystem allows; choose a shorter name",
    errno.EACCES: "choose a place you may read and write",
    errno.EPERM: "choose a place you may read and write",
    errno.EROFS: "the filesystem is read-only; choose a writable place",
    errno.ENOTDIR: "a part of the path is a file, not a folder; choose another path",
    errno.EISDIR: "it is a folder where a file is needed; choose another path",
    errno.EEXIST: "something is already there; choose a new path or remove it",
    errno.ENOENT: "it does not exist; check the path",
    errno.EIO: "the device reported an I/O error; check the disk",
}


def short_path(path: object, limit: int = MAX_PATH_SHOWN) -> str:
    """A path for an error line: as typed, cut in the middle past `limit` characters, escapes for control bytes."""
    s = os.fspath(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
    s = s.decode("utf-8", "replace") if isinstance(s, bytes) else s
    s = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in s)
    return s if len(s) <= limit else s[: limit // 2 - 1] + "…" + s[-(limit // 2):]


def io_problem(e: BaseException, path: object = None, what: str = "") -> str | None:
    """One line for an error the operating system or a file library raised (OSError; pathlib's RuntimeError for a
    symlink loop; safetensors' SafetensorError, whose I/O errors are no OSError): the path, why and what to do.
    None for anything else (a bug, left to the caller)."""
    where = f"{what} " if what else ""
    if isinstance(e, OSError):
        p = path if path is not None else (e.filename if e.filename is not None else None)
        at = f"{where}{short_path(p)}: " if p is not None else (f"{where.strip()}: " if where else "")
        todo = _WHAT_TO_DO.get(e.errno or 0, "check the path and its permissions")
        return f"{at}{os_error_reason(e)}; {todo}"
    if isinstance(e, RuntimeError) and str(e).startswith("Symlink loop"):     # pathlib.Path.resolve
        p = path if path is not None else str(e).partition("from ")[2].strip("'\"")
        return f"{where}{short_path(p)}: a symbolic link there points back at itself; give the real folder"
    if type(e).__name__ == "SafetensorError":
        text = str(e)
        at = f"{where}{short_path(path)}: " if path is not None else (f"{where.strip()}: " if where else "")
        if "code: 28" in text or "StorageFull" in text or "No space left" in text:
            return f"{at}the disk is full (No space left on device); {_WHAT_TO_DO[errno.ENOSPC]}"
        if "code: 122" in text or "QuotaExceeded" in text:
            return f"{at}disk quota exceeded; {_WHAT_TO_DO[errno.EDQUOT]}"
        return f"{at}safetensors could not write or read the weights ({short_path(text, 200)}); check the disk"
    return None


# Whole-file reads of what a user or a run folder hands the tool: a config, plan.json or a status file is KiBs; the
# caps leave room for the largest real one and refuse what would only fill the memory (a 100 GB file named by mistake).
MAX_CONFIG_BYTES = 16 << 20              # config.json, tokenizer_config.json, presets, plan.json, status.json
MAX_DATA_BYTES = 4 << 30                 # one JSON array of records read whole (JSON lines are read line by line)

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def not_regular(path: str | os.PathLike[str], what: str = "file") -> str | None:
    """One line when `path` exists but is not a regular file (a FIFO, socket, device, folder), else None. Never
    opens the file, so a FIFO with no writer cannot block it."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None                       # missing or unusable: the caller's open says so in its own words
    if stat.S_ISREG(st.st_mode):
        return None
    return f"{what} {os.fspath(path)} is {_kind(st.st_mode)}, not a regular file; give a regular file"


def open_regular(path: str | os.PathLike[str], what: str = "file") -> BinaryIO:
    """`path` opened for binary reading, refused in one line (ScaletrainError) unless it is a regular file: checked
    before opening and again on the open descriptor (a file swapped for a FIFO in between cannot block the open:
    O_NONBLOCK). OSError (missing, no permission) propagates for the caller to word."""
    problem = not_regular(path, what)
    if problem:
        raise ScaletrainError(problem)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ScaletrainError(f"{what} {os.fspath(path)} is {_kind(st.st_mode)}, not a regular file; give a "
                                  "regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes_bounded(path: str | os.PathLike[str], max_bytes: int, what: str = "file") -> bytes:
    """A regular file's bytes, at most `max_bytes` (one line when larger: nothing of it is read into memory)."""
    with open_regular(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise ScaletrainError(f"{what} {os.fspath(path)} is {size:,} bytes, more than the {max_bytes:,} accepted "
                                  "for it; give the right file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:             # grew while read
        raise ScaletrainError(f"{what} {os.fspath(path)} is more than the {max_bytes:,} bytes accepted for it; give "
                              "the right file")
    return data


def read_text_bounded(path: str | os.PathLike[str], max_bytes: int = MAX_CONFIG_BYTES, what: str = "file",
                      errors: str = "strict") -> str:
    """read_bytes_bounded decoded as UTF-8 (UnicodeDecodeError propagates with errors="strict")."""
    return read_bytes_bounded(path, max_bytes, what).decode("utf-8", errors=errors)


def read_tail(path: str | os.PathLike[str], max_bytes: int, what: str = "file") -> bytes:
    """The last `max_bytes` of a regular file (all of it when smaller): a log's tail without reading its head."""
    with open_regular(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - max_bytes))
        return f.read(max_bytes)


@contextmanager
def writing(what: str) -> Iterator[None]:
    """Turn an OSError while writing `what` into one ScaletrainError line (read-only place, full disk, ...)."""
    try:
        yield
    except OSError as e:
        where = f" ({short_path(e.filename)})" if e.filename and str(e.filename) not in what else ""
        todo = _WHAT_TO_DO.get(e.errno or 0, "check the path and its permissions")
        raise ScaletrainError(f"cannot write {short_path(what, MAX_PATH_SHOWN + 40)}{where}: {os_error_reason(e)}; "
                              f"{todo}") from None


def atomic_write(path: Path, text: str, *, mode: int | None = None, backup: bool = True) -> Path | None:
    """Write via a temp file + rename; keep a `.bak` of an existing file that differs. Returns the backup path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    bak = None
    if path.exists() and backup and not_regular(path) is None:       # a FIFO in its place is replaced, never read
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
        if not stat.S_ISREG(st.st_mode):
            return []                      # a FIFO or a folder in a log's place: nothing appended, nothing blocks
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        self._offset += len(chunk)
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        return lines

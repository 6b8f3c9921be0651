"""One launch per run directory (per node): an exclusive flock on RUN_DIR/.launch.lock, held for the whole run.

Why a lock and not status.json: two launches started together both read "not running" before either writes it
(two simultaneous launches into one run directory both ran), and a status file outlives a killed launcher. The
kernel drops a flock when the last process holding it exits, so a lock can never be left behind. The launcher
takes it before it writes anything; its watchdog (watchdog.py) inherits it, so the directory stays locked until
a killed launcher's processes are really gone. The file holds the launcher's pid, for the refusal message.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import os_error_reason


class RunLock:
    """An exclusive, non-blocking flock on one file; `fd` is what a helper process inherits to share it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self, what: str) -> "RunLock":
        """Take the lock or raise one line naming the launch that holds it."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise ScaletrainError(f"cannot lock {what} ({self.path.name}): {os_error_reason(e)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            os.close(fd)
            raise ScaletrainError(f"{what} is already running{f' (launcher pid {holder})' if holder else ''}, or "
                                  "still stopping its processes; stop it first, or wait for it to end") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:          # a full disk: the lock holds all the same, the message just names no pid
            pass
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:
        self.release()


def _holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None

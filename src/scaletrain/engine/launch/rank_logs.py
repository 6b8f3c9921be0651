"""Per-rank logs: torchrun's prefixed console lines split into logs/rank-<i>.log, the rest into logs/launcher.log."""

from __future__ import annotations

import os
import re
import threading
from datetime import datetime
from typing import TextIO

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import DISK_FULL_ERRNOS, os_error_reason, read_tail
from scaletrain.engine.launch.elastic import split_prefix
from scaletrain.engine.run.layout import RunDir

# Written at the top of every launch into each rank log: a relaunched run's earlier lines are history (the doctor
# reads from the last mark on).
LAUNCH_MARK = "==> scaletrain launch {stamp} <=="
LAUNCH_MARK_RE = re.compile(r"^==> scaletrain launch .* <==$")

class RankLogs:
    """Split prefixed console lines into logs/rank-<i>.log; the rest goes to logs/launcher.log."""

    def __init__(self, run: RunDir, *, single_process: bool, rank_offset: int = 0, launcher_log: str | None = None):
        self.run = run
        self.single = single_process
        self.rank_offset = rank_offset
        self.launcher_log = launcher_log or run.launcher_log().name
        self._files: dict[str, TextIO] = {}
        self._lock = threading.Lock()
        self.launcher_lines: list[str] = []
        self.write_error: str | None = None
        self.disk_full = False
        run.logs.mkdir(parents=True, exist_ok=True)

    def start(self, ranks: range) -> None:
        """Open (create) this machine's rank logs and mark where this launch begins in each."""
        mark = LAUNCH_MARK.format(stamp=datetime.now().isoformat(timespec="seconds"))
        for r in ranks:
            self.feed_raw(self.run.rank_log(r).name, mark)
        self.feed_raw(self.launcher_log, mark)

    def feed_raw(self, name: str, text: str) -> None:
        with self._lock:
            self._write(name, text)

    def _write(self, name: str, text: str) -> None:
        """Append one line to logs/<name> and flush (caller holds the lock). A failed write (a full disk) loses
        the line, never the run: the first error is kept (`write_error`, `disk_full`) for status.json."""
        try:
            f = self._files.get(name)
            if f is None:
                f = self._files[name] = (self.run.logs / name).open("a", encoding="utf-8")
            f.write(text + "\n")
            f.flush()
        except (OSError, ValueError) as e:
            if self.write_error is None:
                self.write_error = f"cannot write logs/{name}: {os_error_reason(e) if isinstance(e, OSError) else e}"
            self.disk_full = self.disk_full or (isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS)

    def feed(self, line: str) -> tuple[int | None, str]:
        """Route one line; returns (rank or None for the launcher, the line without its prefix)."""
        p = split_prefix(line)
        if p is not None:
            rank = p.number + (0 if p.role == "rank" else self.rank_offset)
            text = line[p.end:]
            name = self.run.rank_log(rank).name
        else:
            rank, text, name = (0 if self.single else None), line, self.launcher_log
            self.launcher_lines.append(line)
        with self._lock:
            self._write(name, text)
            if rank is not None and name == self.launcher_log:
                self._write(self.run.rank_log(rank).name, text)
        return rank, text

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                try:
                    f.close()
                except OSError:            # the buffered tail cannot be written either (a full disk)
                    pass
            self._files.clear()


RANK_LOG_TAIL_BYTES = 1 << 20     # a failure report's last lines are in a log's last MiB


def rank_log_tail(run_dir: str | os.PathLike[str], rank: int, lines: int = 20) -> list[str]:
    """The last lines of one rank's log (for a failure report)."""
    try:
        tail = read_tail(RunDir(run_dir).rank_log(rank), RANK_LOG_TAIL_BYTES, "rank log")
    except (OSError, ScaletrainError):    # missing, or a FIFO in its place: no tail to show, nothing waited on
        return []
    return tail.decode("utf-8", errors="replace").splitlines()[-lines:]

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
# A stop the launcher was asked for (Ctrl-C, `scaletrain stop`, the monitor's s s): torchrun's agent answers the
# SIGINT with a traceback of its own that ends in SignalException, which read as a crash at the end of the log and in
# the monitor's log tail. Folded into one line that keeps the exception (the doctor's `interrupted` signature).
TRACEBACK_START = "Traceback (most recent call last):"
# torch's own log header (glog style: "E1203 19:29:56.004000 1485 torch/distributed/elastic/…/api.py:1002] "). A rank
# that dies mid-line (a library's exit message without its newline) leaves its last prefixed line open, and the
# agent's next line is glued to it: "[rank0]:See …/refleaks.htmlE1203 … failed (exitcode: -9) local_rank: 1 …" went
# to rank 0's log and the restart it reports was never recorded (status.json: finished, no restarts). Such a header
# past a prefixed line's start is cut off into a launcher line.
GLUED_LOG_HEADER = re.compile(r"[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")
AGENT_SIGNAL = re.compile(r"SignalException: Process \d+ got signal: \d+")
MAX_HELD_LINES = 200          # a longer block is not the agent's: written as it came

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
        self.stopping = False            # set by the launcher once it stops the run (the block above)
        self._held: list[str] = []       # a launcher traceback held while it may be the agent's answer to the stop
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

    def feed(self, line: str) -> tuple[int | None, str | None]:
        """Route one line; returns (rank or None for the launcher, the line without its prefix; None while it is
        held: a launcher traceback during a stop, see TRACEBACK_START)."""
        p = split_prefix(line)
        if p is None and (self._held or (self.stopping and line.strip() == TRACEBACK_START)):
            with self._lock:
                return self._hold(line)
        if p is None:
            with self._lock:
                self._launcher(line)
            return (0 if self.single else None), line
        rank = p.number + (0 if p.role == "rank" else self.rank_offset)
        text = line[p.end:]
        glued = GLUED_LOG_HEADER.search(text, 1)
        own = text[:glued.start()] if glued else text
        with self._lock:
            self._write(self.run.rank_log(rank).name, own)
            if glued:
                self._launcher(text[glued.start():])
        return rank, own

    def _launcher(self, text: str) -> None:
        """A launcher line (caller holds the lock): logs/launcher.log, and rank 0's log in a single-process run."""
        self.launcher_lines.append(text)
        self._write(self.launcher_log, text)
        if self.single:
            self._write(self.run.rank_log(0).name, text)

    def _hold(self, line: str) -> tuple[int | None, str | None]:
        """A launcher line inside a traceback during a stop (caller holds the lock): the agent's block ending in
        SignalException becomes one line; any other block is written as it came."""
        self._held.append(line)
        ended = not line.startswith((" ", "\t")) and line.strip() not in ("", TRACEBACK_START)
        m = AGENT_SIGNAL.search(line) if ended else None
        if m:
            self._held = []
            text = f"scaletrain: torchrun's agent stopped as asked ({m.group(0)}; its traceback left out)"
        elif ended or len(self._held) > MAX_HELD_LINES:
            text = self._release()
        else:
            return None, None
        self._launcher(text)
        return (0 if self.single else None), text

    def _release(self) -> str:
        """Write the held lines but the last as they came (caller holds the lock); the last is returned."""
        held, self._held = self._held, []
        for text in held[:-1]:
            self._launcher(text)
        return held[-1]

    def close(self) -> None:
        with self._lock:
            if self._held:
                self._launcher(self._release())
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

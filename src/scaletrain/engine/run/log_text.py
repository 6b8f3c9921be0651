"""Rank logs as a person reads them: progress bars folded, carriage returns resolved, a bounded history.

Why here: a rank's log holds tqdm bars (datasets' `Map: 45%|████▌ | 450/1000`, downloads) written with `\\r`
so a terminal redraws one line; read from a file they are hundreds of lines, or one line holding every redraw. The
monitor's log tail and its full-screen log view both read a LogBook, so both show one line per bar, updated in
place, and the rest of the log untouched. No Textual here: text in, text out.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Iterable

MAX_LOG_LINES = 50_000            # what the monitor keeps of all ranks' logs since it attached (after folding)
ANSI_CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")          # colour and cursor moves (tqdm's nested bars use ESC[A)
PROGRESS_BAR = re.compile(r"(\d{1,3})%\|")                 # tqdm's " 45%|" (the bar follows the bar sign)


def visible_text(line: str) -> str:
    """What a terminal shows for `line`: escape sequences dropped, the last segment after a carriage return."""
    line = ANSI_CSI.sub("", line)
    parts = [p for p in line.split("\r") if p.strip()]
    return parts[-1].rstrip() if parts else ""


def progress_key(text: str) -> str | None:
    """A progress bar's label (the text before its percentage: 'Map', 'Downloading shards'), None for other lines."""
    m = PROGRESS_BAR.search(text)
    if m is None:
        return None
    return text[:m.start()].strip().rstrip(":").strip() or "progress"


@dataclass(eq=False)
class LogEntry:
    rank: int | None
    text: str
    bar: str | None = None             # the progress bar's label when this line is one
    folded: int = 0                    # earlier redraws of the same bar folded into this line


class LogBook:
    """Every rank's log lines in arrival order, a progress bar's redraws folded into its last line."""

    def __init__(self, max_lines: int = MAX_LOG_LINES):
        self.entries: deque[LogEntry] = deque(maxlen=max_lines)
        self.ranks: set[int] = set()
        self.version = 0                   # bumped on every change (views re-read when it moves)
        self._last: dict[int | None, LogEntry] = {}

    def extend(self, lines: Iterable[tuple[int | None, str]]) -> tuple[list[LogEntry], bool]:
        """Add (rank, raw line) pairs; return (the entries appended, whether an existing line was updated)."""
        appended: list[LogEntry] = []
        updated = False
        for rank, raw in lines:
            text = visible_text(raw)
            last = self._last.get(rank)
            if not text and ("\r" in raw or (last is not None and last.bar is not None)):
                continue                   # a bare redraw, or the newline a bar writes when it closes
            key = progress_key(text)
            if key is not None and last is not None and last.bar == key:
                last.text, last.folded = text, last.folded + 1
                updated = updated or not any(last is a for a in appended[-1:])
                continue
            e = LogEntry(rank, text, key)
            self.entries.append(e)
            appended.append(e)
            self._last[rank] = e
            if rank is not None:
                self.ranks.add(rank)
        if appended or updated:
            self.version += 1
        return appended, updated

    def lines(self, rank: int | None = None) -> list[LogEntry]:
        """The entries of one rank (None: all ranks and the launcher)."""
        if rank is None:
            return list(self.entries)
        return [e for e in self.entries if e.rank == rank]

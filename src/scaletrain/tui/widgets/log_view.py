"""The full-screen log's text: every line of a LogBook (engine/run/log_text.py), one rank or all, unwrapped.

A line-API ScrollView (only the visible rows are drawn, so 50,000 lines scroll as fast as 50): follows the tail
while it is at the bottom (scrolling up stops following, `end` resumes), highlights a search's matches and jumps
between them. Folded progress bars carry how many redraws they stand for.
"""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

RANK_STYLES = ("cyan", "green", "magenta", "yellow", "blue", "bright_cyan", "bright_green", "bright_magenta")


def row_text(entry: Any, with_rank: bool) -> tuple[str, str]:
    """(prefix, text) of one entry: '[3] ' before a rank's line in the all-ranks view, the fold count after a bar."""
    prefix = f"[{entry.rank}] " if with_rank and entry.rank is not None else ""
    text = entry.text + (f"  (+{entry.folded} updates folded)" if entry.folded else "")
    return prefix, text


class LogView(ScrollView, can_focus=True):
    DEFAULT_CLASSES = "log-view"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entries: list[Any] = []
        self.with_rank = True
        self.query = ""
        self.matches: list[int] = []               # row numbers holding the query
        self.current: int | None = None            # index into matches

    def set_entries(self, entries: list[Any], with_rank: bool) -> None:
        """Show these entries (the book's, filtered); keep following the tail if we were at it."""
        at_end = self.is_vertical_scroll_end
        self.entries = entries
        self.with_rank = with_rank
        width = max((cell_len("".join(row_text(e, with_rank))) for e in entries[-2000:]), default=0)
        self.virtual_size = Size(max(width, self.virtual_size.width if entries else 0), len(entries))
        if self.query:
            self._find()
        self.refresh()
        if at_end:
            self.scroll_end(animate=False, immediate=True)
            self.call_after_refresh(self.scroll_end, animate=False)     # the first time, once it has a size

    @property
    def following(self) -> bool:
        """At the bottom: new lines scroll into view (scrolling up stops that, `end` resumes it)."""
        return self.is_vertical_scroll_end

    # ---- search ----------------------------------------------------------------------------------------------
    def search(self, query: str) -> int:
        """Highlight every line holding `query` (case-insensitive) and jump to the last one; return the count."""
        self.query = query
        self._find()
        self.current = len(self.matches) - 1 if self.matches else None
        self._jump()
        return len(self.matches)

    def _find(self) -> None:
        q = self.query.lower()
        self.matches = [i for i, e in enumerate(self.entries)
                        if q and q in "".join(row_text(e, self.with_rank)).lower()]
        if self.current is not None and self.current >= len(self.matches):
            self.current = len(self.matches) - 1 if self.matches else None

    def next_match(self, step: int) -> int | None:
        """Go to the next (+1) or previous (−1) match, wrapping around; the row number, or None without matches."""
        if not self.matches:
            return None
        self.current = 0 if self.current is None else (self.current + step) % len(self.matches)
        self._jump()
        return self.matches[self.current]

    def _jump(self) -> None:
        if self.current is None:
            self.refresh()
            return
        row = self.matches[self.current]
        self.scroll_to(y=max(0, row - self.size.height // 2), animate=False, immediate=True)
        self.refresh()

    # ---- drawing ---------------------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        i = scroll_y + y
        width = self.size.width
        style = self.rich_style
        if i >= len(self.entries):
            return Strip.blank(width, style)
        e = self.entries[i]
        prefix, text = row_text(e, self.with_rank)
        line = Text(no_wrap=True, style=style)
        if prefix:
            line.append(prefix, style=RANK_STYLES[(e.rank or 0) % len(RANK_STYLES)])
        line.append(text, style="dim" if e.bar else "")
        if self.query:
            current = self.current is not None and self.matches and self.matches[self.current] == i
            line.highlight_words([self.query], style="black on yellow" if current else "reverse",
                                 case_sensitive=False)
        strip = Strip(line.render(self.app.console), line.cell_len)
        return strip.crop_extend(scroll_x, scroll_x + width, style).apply_offsets(scroll_x, i)

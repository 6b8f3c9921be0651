"""The full-screen log (`l` in the monitor): every rank's lines or one rank's, following the tail, scrolling,
searching with `/`, progress bars folded (engine/run/log_text.LogBook, which the monitor feeds on every tick).

A Screen pushed over the monitor: the monitor keeps sampling underneath and calls `refresh_view` after each tick,
so the view stays live. esc closes the search, then the view.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from scaletrain.tui.widgets.log_view import LogView


class LogScreen(Screen):
    CSS_PATH = "monitor.tcss"
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("slash", "search", "Search", key_display="/"),
        Binding("n", "next(1)", "Next match"),
        Binding("N", "next(-1)", "Prev match", key_display="N"),
        Binding("r", "cycle_rank", "Rank"),
        Binding("end", "follow", "Follow"),
        Binding("l", "back", "Close", show=False),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("f1", "help", "Help", show=False, priority=True),
    ]
    HELP = """
## Log
Every line the ranks wrote since the monitor attached (the last MiB of each log before that), all ranks
interleaved as they arrived (`[r]` names the rank) or one rank alone (`r` cycles). Progress bars (tqdm: datasets'
`Map`, downloads) are folded into one line that updates in place. The view follows the tail while it is at the
bottom; scroll up (↑, PgUp, Home, the wheel) to read, `end` to follow again. `/` searches (case-insensitive): every
match is highlighted, `n` / `N` go to the next / previous. `esc` closes the search, then this view.
"""

    def __init__(self, book: Any, rank: int | None = None, monitor: Any = None) -> None:
        super().__init__()
        self.book = book
        self.rank = rank
        self.monitor = monitor             # the MonitorScreen underneath: it calls refresh_view after each tick
        self._version = -1

    def compose(self) -> ComposeResult:
        yield Static("", id="log-title")
        yield LogView(id="log-view")
        yield Input(placeholder="search the log (enter: find, esc: close)", id="log-search")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#log-search").display = False
        self.refresh_book(force=True)
        self.query_one(LogView).focus()

    def refresh_view(self) -> None:
        if self.query("#log-view"):        # a tick can land between the push and the mount, or after esc
            self.refresh_book()

    def refresh_book(self, force: bool = False) -> None:
        """Re-read the book when it changed (the monitor calls this after each tick)."""
        if not force and self.book.version == self._version:
            return
        self._version = self.book.version
        self.query_one(LogView).set_entries(self.book.lines(self.rank), with_rank=self.rank is None)
        self._title()

    def _title(self, note: str = "") -> None:
        view = self.query_one(LogView)
        which = "all ranks" if self.rank is None else f"rank {self.rank}"
        t = Text.assemble(("log: ", "bold"), which, f"   {len(view.entries):,} lines   ",
                          ("following the tail" if view.following else "paused (end follows)",
                           "green" if view.following else "yellow"))
        if view.query:
            t.append(f"   “{view.query}”: {len(view.matches)} match{'es' if len(view.matches) != 1 else ''}",
                     style="bold")
            if view.current is not None and view.matches:
                t.append(f" ({view.current + 1} of {len(view.matches)})")
        if note:
            t.append(f"   {note}", style="yellow")
        self.query_one("#log-title", Static).update(t)

    def on_scroll_view_scroll(self) -> None:     # pragma: no cover - a wheel's scroll (the title's follow state)
        self._title()

    def action_cycle_rank(self) -> None:
        order: list[int | None] = [None, *sorted(self.book.ranks)]
        self.rank = order[(order.index(self.rank) + 1) % len(order)] if self.rank in order else None
        self.refresh_book(force=True)

    def action_follow(self) -> None:
        self.query_one(LogView).scroll_end(animate=False, immediate=True)
        self._title()

    def action_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.display = True
        box.focus()

    @on(Input.Submitted, "#log-search")
    def _searched(self, event: Input.Submitted) -> None:
        view = self.query_one(LogView)
        n = view.search(event.value.strip())
        event.input.display = False
        view.focus()
        self._title("" if n or not view.query else "no match")

    def action_next(self, step: int) -> None:
        view = self.query_one(LogView)
        if view.next_match(step) is None:
            self._title("no search yet: / searches" if not view.query else "no match")
            return
        self._title()

    def action_back(self) -> None:
        box = self.query_one("#log-search", Input)
        if box.display:
            box.display = False
            self.query_one(LogView).focus()
            return
        self.dismiss()

    def action_help(self) -> None:
        from scaletrain.tui.widgets.help import HelpScreen, key_rows

        self.app.push_screen(HelpScreen(self.HELP, key_rows(self), global_keys=""))

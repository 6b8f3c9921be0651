"""Help on `?` / F1: what the current step is for, and a cheat sheet of every key it answers to.

The cheat sheet is read from the step's and the app's bindings (Screen.active_bindings), hidden ones included, so a
key added to a step is listed without a second list to keep in sync.
"""

from __future__ import annotations

from typing import Iterable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Markdown

GLOBAL_KEYS = """
`tab` / `shift+tab` move between fields. Numbers on every screen come from the scaletrain engine (memory and time
models); the wizard only lays them out. `ctrl+q` quits with exit 0: nothing is written unless you wrote it.
"""


def key_rows(screen: Screen) -> list[tuple[str, str]]:
    """(key as shown, what it does) for every binding of the step and of the app, in the footer's order, each
    action once (several keys for one action are joined: '+/-', '? / f1')."""
    app = screen.app
    rows: dict[str, tuple[list[str], str]] = {}
    active = list(screen.active_bindings.values())
    for owner in (screen, app):       # the step's own keys first, then the app's (tab, copy)
        for a in active:
            if a.node is owner:       # a focused widget's own keys (a table's arrows) are its business
                _add(rows, a.binding, app.get_key_display(a.binding))
    out = [(" / ".join(dict.fromkeys(keys)), what) for keys, what in rows.values()]
    # a key another row already shows as one of its own ("-" in "+/-": micro batch up or down) is not listed twice
    shown = {k: {part.strip() for part in k.replace(" / ", "/").split("/")} for k, _ in out}
    return [(k, w) for k, w in out if not any(shown[k] < shown[o] for o in shown if o != k)]


def _add(rows: dict[str, tuple[list[str], str]], binding: Binding, shown: str) -> None:
    what = binding.tooltip or binding.description or binding.action
    if binding.action in rows:
        rows[binding.action][0].append(shown)
    else:
        rows[binding.action] = ([shown], what)


def cheat_sheet(rows: Iterable[tuple[str, str]]) -> str:
    """One Markdown list line per key: '- `^n` Next'."""
    return "\n".join(f"- `{k.replace('`', chr(39))}` {w}" for k, w in rows)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "close", "Close")]

    def __init__(self, step_help: str, keys: list[tuple[str, str]] | None = None, *,
                 global_keys: str = GLOBAL_KEYS, keys_title: str = "Keys on this step") -> None:
        super().__init__()
        self.step_help = step_help
        self.keys = keys or []
        self.global_keys = global_keys          # the wizard's words on every step; the monitor brings its own
        self.keys_title = keys_title

    def compose(self) -> ComposeResult:
        sheet = f"### {self.keys_title}\n{cheat_sheet(self.keys)}\n\n" if self.keys else ""
        tail = f"{self.global_keys.strip()}\n\n" if self.global_keys.strip() else ""
        with VerticalScroll(id="help-box"):
            yield Markdown(f"{sheet}{self.step_help.strip()}\n\n{tail}*escape closes this help*")

    def action_close(self) -> None:
        self.dismiss()

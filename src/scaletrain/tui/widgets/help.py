"""Help on `?` / F1: what the current step is for and its keys."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

GLOBAL_KEYS = """
**Everywhere**: `ctrl+n` next step · `escape` back · `tab` / `shift+tab` move between fields · `?` or `F1` help ·
`ctrl+s` save the choices as a preset · `ctrl+q` quit (exit 0, nothing written unless you wrote it).
Numbers on every screen come from the scaletrain engine (memory and time models); the wizard only lays them out.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "close", "Close")]

    def __init__(self, step_help: str) -> None:
        super().__init__()
        self.step_help = step_help

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Markdown(f"{self.step_help.strip()}\n\n{GLOBAL_KEYS.strip()}\n\n*escape closes this help*")

    def action_close(self) -> None:
        self.dismiss()

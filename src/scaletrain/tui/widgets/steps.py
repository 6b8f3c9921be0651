"""The wizard's step bar: where you are in start → detect → model → batch → plan → write, and the loaded preset."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

STEPS = ("Hardware", "Model", "Batch & data", "Plan", "Write & launch")


class StepBar(Static):
    """One line naming the five steps, the current one highlighted, and the preset the choices started from.

    Narrower than the full line (80 columns with a preset), the steps other than the current one are shown by
    number only, so the preset's name always stays in view."""

    def __init__(self, step: int, preset: str | None = None, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.step = step
        self.preset = preset

    def render(self) -> Text:
        width = self.size.width or 120
        full = self._text(self.step, self.preset, short=False)
        return full if full.cell_len <= width else self._text(self.step, self.preset, short=True)

    @staticmethod
    def _text(step: int, preset: str | None, *, short: bool) -> Text:
        t = Text(" scaletrain ", style="bold")
        if step == 0:
            t.append(" start: pick a setup ", style="bold reverse")
        for i, name in enumerate(STEPS, start=1):
            if i > 1 or step == 0:
                t.append("›", style="dim")
            style = "bold reverse" if i == step else ("" if i < step else "dim")
            t.append(f" {i} {name} " if i == step or not short else f" {i} ", style=style)
        if preset:
            t.append("  preset ", style="dim")
            t.append(preset, style="bold cyan")
        return t

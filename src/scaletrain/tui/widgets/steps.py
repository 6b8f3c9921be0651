"""The wizard's step bar: where you are in detect → model → batch → plan → write, on one line."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

STEPS = ("Hardware", "Model", "Batch & data", "Plan", "Write & launch")


class StepBar(Static):
    """One line naming the five steps, the current one highlighted."""

    def __init__(self, step: int, **kwargs) -> None:
        super().__init__(self._text(step), **kwargs)

    @staticmethod
    def _text(step: int) -> Text:
        t = Text(" scaletrain ", style="bold")
        for i, name in enumerate(STEPS, start=1):
            if i > 1:
                t.append("›", style="dim")
            style = "bold reverse" if i == step else ("" if i < step else "dim")
            t.append(f" {i} {name} ", style=style)
        return t

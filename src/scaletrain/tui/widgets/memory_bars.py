"""Per-GPU memory as a stacked bar by component against the card's capacity, with the headroom line.

Every byte shown is a field of the engine's MemoryBreakdown; this widget only lays them out.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from scaletrain.engine.estimate.breakdown import MemoryBreakdown
from scaletrain.engine.units import fmt_bytes
from scaletrain.tui.views.render import COMPONENT_STYLE, memory_bar

# Columns left for the bar after the border and padding of the panel (the bar itself adds 1 + its overflow room).
_BAR_MARGIN = 12
_MIN_BAR = 20
_THREE_COLUMN_WIDTH = 78   # bar width from which three legend entries fit on a row ("activations 537.77 GiB")
_PHASE_SHORT = {"forward": "fwd", "backward": "bwd"}   # keeps the phase line on one row at 80 columns


def _columns(cells: list[Text], per_row: int) -> list[Text]:
    """Lay cells out in aligned columns, one Text per row (cheaper to render than a rich Table)."""
    width = max(c.cell_len for c in cells) + 2
    rows = []
    for r in range(0, len(cells), per_row):
        row = Text()
        for c in cells[r:r + per_row]:
            row.append_text(c)
            row.append(" " * (width - c.cell_len))
        row.rstrip()
        rows.append(row)
    return rows


class MemoryBars(Static):
    """A stacked bar (every rank of a plan holds the same bytes) + legend + headroom line + per-phase peaks."""

    def __init__(self, memory: MemoryBreakdown | None = None, world_size: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.memory = memory
        self.world_size = world_size

    def show(self, memory: MemoryBreakdown, world_size: int, noun: str, devices: str) -> None:
        """`noun`, `devices`: what one rank runs on and the ranks in words (Hardware.device_noun, devices_text)."""
        first = self.memory is None
        self.memory = memory
        self.world_size = world_size
        each = "each of the" if world_size > 1 else "the"
        self.border_title = f"per-{noun} memory at the peak ({each} {devices})"
        self.border_subtitle = f"{fmt_bytes(memory.total_bytes)} of {fmt_bytes(memory.capacity_bytes)}"
        self.refresh(layout=first)     # same rows every time: only the first plan changes the layout

    def render(self) -> Group | Text:
        m = self.memory
        if m is None:
            return Text("no plan yet", style="dim")
        width = max(_MIN_BAR, self.size.width - _BAR_MARGIN)
        bar = memory_bar(m.components(), m.capacity_bytes, m.usable_bytes, width=width)
        cells = [Text.assemble(("■ ", COMPONENT_STYLE[name]), f"{name} ", (fmt_bytes(b), "bold"))
                 for name, b in m.components().items()]
        legend = _columns(cells, per_row=3 if width >= _THREE_COLUMN_WIDTH else 2)
        line = Text.assemble(
            ("| ", "bold"), f"limit {fmt_bytes(m.usable_bytes)} ({m.headroom_fraction:.0%} headroom kept free)",
            ("   peak during ", "dim"), (m.peak_phase, "bold"),
        )
        phases = Text("peaks (allocated):", style="dim")
        for name, b in m.phase_peaks.items():
            phases.append(f"  {_PHASE_SHORT.get(name, name)} {fmt_bytes(b)}", style="dim")
        lines = [bar, *legend, line, phases]
        for t in lines:           # one row each, always: the widget's height never changes after the first plan
            t.no_wrap = True
            t.overflow = "ellipsis"
        return Group(*lines)

"""A small block chart of one series over the last minutes, with an optional horizontal line (the plan's
predicted peak on a memory chart, the power limit on a power chart).

Drawing only: the values are the engine's samples (engine/sampling/history.py); a None (N/A) is a gap. The series
is bucketed into the chart's width (each column the highest value of its bucket, so a short spike still shows).
"""

from __future__ import annotations

from typing import Sequence

from rich.text import Text

EIGHTHS = " ▁▂▃▄▅▆▇█"


def buckets(values: Sequence[float | None], width: int) -> list[float | None]:
    """`width` columns over all of `values` (the newest at the right): the highest of each bucket, None if all N/A."""
    vals = list(values)
    if width <= 0:
        return []
    if len(vals) <= width:
        return [None] * (width - len(vals)) + vals
    out: list[float | None] = []
    for c in range(width):
        part = [v for v in vals[c * len(vals) // width:(c + 1) * len(vals) // width] if v is not None]
        out.append(max(part) if part else None)
    return out


def chart(values: Sequence[float | None], width: int, height: int, lo: float, hi: float,
          style: str = "cyan", line: float | None = None, line_style: str = "bold magenta") -> list[Text]:
    """`height` rows of block columns scaled lo..hi; `line` draws ─ across the row it falls in where no column
    covers it (a column reaching past the line keeps its block, on a shaded background, so the crossing shows)."""
    cols = buckets(values, width)
    pad = max(0, width - len(values))          # columns before the first sample: blank, not N/A
    span = (hi - lo) or 1.0
    levels = [None if v is None else max(0.0, min(1.0, (v - lo) / span)) * height * 8 for v in cols]
    line_row = None
    if line is not None and lo <= line <= hi:
        line_row = min(height - 1, int((line - lo) / span * height))          # 0 = bottom row
    rows = []
    for r in range(height - 1, -1, -1):
        t = Text(" " * pad, no_wrap=True, overflow="crop")
        for lv in levels[pad:]:
            fill = 0 if lv is None else int(max(0.0, min(8.0, lv - r * 8)))
            if lv is None and r == 0:
                t.append("·", style="dim")                                       # N/A: a gap, marked
            elif fill == 0 and r == line_row:
                t.append("─", style=line_style)
            else:
                t.append(EIGHTHS[fill], style=style if r != line_row else f"{style} on grey23")
        rows.append(t)
    return rows

"""One GPU over the last minutes (the monitor's `h` view): utilization, memory against the plan's predicted peak
(a ─ line), power against its limit, and the processes on the GPU with the memory each holds.

Formatting only: the series are engine/sampling/history.GpuTrack's (NVML samples, each field N/A on its own), the
processes history.GpuProcess (NVML's per-process memory, N/A where the driver does not say), the line the plan's.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from scaletrain.engine.units import fmt_bytes, fmt_seconds
from scaletrain.tui.views.history_chart import chart
from scaletrain.tui.widgets.gpu_panel import NA

LABEL_CELLS = 6
VALUE_CELLS = 26
DEFAULT_CELLS = 100           # before the first layout (no size yet)
ROWS = {"util": 3, "mem": 4, "power": 3}


def _last(values: Any) -> Any:
    return values[-1] if values else None


def chart_rows(label: str, rows: list[Text], value: Text) -> list[Text]:
    """The label on the first row, the current value after the chart's first row."""
    out = []
    for k, row in enumerate(rows):
        t = Text(f"{label if k == 0 else '':<{LABEL_CELLS}}", no_wrap=True, overflow="ellipsis")
        t.append_text(row)
        if k == 0:
            t.append(" ")
            t.append_text(value)
        out.append(t)
    return out


class GpuHistoryPanel(Static):
    DEFAULT_CLASSES = "gpu-history"

    def __init__(self, track: Any, history: Any, predicted_bytes: int | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.track = track
        self.history = history
        self.predicted_bytes = predicted_bytes

    def refresh_view(self) -> None:
        self.update(self.render_track())

    def on_mount(self) -> None:
        self.refresh_view()

    def on_resize(self) -> None:
        self.refresh_view()

    def render_track(self) -> Group:
        tr, s = self.track, self.track.last
        width = max(10, (self.content_size.width or DEFAULT_CELLS) - LABEL_CELLS - VALUE_CELLS)
        span = self.history.span_seconds(tr.times_s)
        head = Text.assemble((f"GPU {tr.index}", "bold"), "  ", (tr.name or "", "dim"),
                             (f"   the last {fmt_seconds(span)} ({len(tr.times_s)} samples)", "dim"))
        if s is not None and s.error:
            return Group(head, Text(f"ERROR: {s.error}", style="bold red"))
        rows: list[Any] = [head]
        util = _last(tr.utilization_pct)
        rows += chart_rows("util", chart(tr.utilization_pct, width, ROWS["util"], 0, 100),
                           Text(f"{util:3.0f}%" if util is not None else NA, style="" if util is not None else "dim"))
        total = s.memory_total_bytes if s is not None else None
        used = _last(tr.memory_used_bytes)
        if total:
            value = Text(f"{fmt_bytes(used)} of {fmt_bytes(total)}" if used is not None else f"{NA} of "
                         f"{fmt_bytes(total)}")
            rows += chart_rows("mem", chart(tr.memory_used_bytes, width, ROWS["mem"], 0, total,
                                            line=self.predicted_bytes), value)
            if self.predicted_bytes:
                rows.append(Text(f"{'':<{LABEL_CELLS}}─ the plan's predicted peak {fmt_bytes(self.predicted_bytes)}",
                                 style="magenta"))
        else:
            rows.append(Text(f"{'mem':<{LABEL_CELLS}}{NA} (NVML gave no memory reading)", style="dim"))
        limit = s.power_limit_w if s is not None else None
        watts = _last(tr.power_w)
        if any(v is not None for v in tr.power_w):
            hi = limit or max(v for v in tr.power_w if v is not None)
            rows += chart_rows("power", chart(tr.power_w, width, ROWS["power"], 0, hi, style="yellow",
                                              line=limit, line_style="red"),
                               Text((f"{watts:.0f} W" if watts is not None else NA)
                                    + (f" of {limit:.0f} W" if limit else "")))
        else:
            rows.append(Text(f"{'power':<{LABEL_CELLS}}{NA}", style="dim"))
        rows.append(self._processes())
        return Group(*rows)

    def _processes(self) -> Any:
        procs = self.history.gpu_processes(self.track.index)
        if not procs:
            return Text(f"{'procs':<{LABEL_CELLS}}none on this GPU", style="dim")
        t = Table(box=None, pad_edge=False, show_edge=False, header_style="dim", padding=(0, 2, 0, 0))
        t.add_column("  pid", justify="right")
        t.add_column("process")
        t.add_column("GPU memory", justify="right")
        for p in procs:
            who = (f"rank {p.rank}" if p.rank is not None else "this run") if p.ours else "another process"
            t.add_row(str(p.pid), Text(who, style="bold" if p.ours else "dim"),
                      fmt_bytes(p.memory_bytes) if p.memory_bytes is not None else Text(NA, style="dim"))
        return t

"""A CPU run's processes over the last minutes (the monitor's `h` view without GPUs): the host's CPU, and each
rank's CPU and resident memory, the memory against the plan's predicted per-process total (a ─ line).

Formatting only: engine/sampling/history.DeviceHistory's series (psutil readings; N/A on its own, an exited
process keeps its past and says so).
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from scaletrain.engine.units import fmt_bytes, fmt_seconds
from scaletrain.tui.views.history_chart import chart
from scaletrain.tui.widgets.gpu_history import DEFAULT_CELLS, LABEL_CELLS, VALUE_CELLS, chart_rows
from scaletrain.tui.widgets.gpu_panel import NA


class HostHistoryPanel(Static):
    DEFAULT_CLASSES = "gpu-history"

    def __init__(self, history: Any, predicted_bytes: int | None, reason: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history = history
        self.predicted_bytes = predicted_bytes
        self.reason = reason

    def refresh_view(self) -> None:
        self.update(self.render_host())

    def on_mount(self) -> None:
        self.refresh_view()

    def on_resize(self) -> None:
        self.refresh_view()

    def render_host(self) -> Group:
        h = self.history
        width = max(10, (self.content_size.width or DEFAULT_CELLS) - LABEL_CELLS - VALUE_CELLS)
        rows: list[Any] = [Text(f"No GPU history: {self.reason or h.gpu_reason or 'no GPU source'}. Each process "
                                "of the run instead.", style="yellow")]
        cpu = h.host_cpu[-1] if h.host_cpu else None
        rows += chart_rows("host", chart(h.host_cpu, width, 2, 0, 100),
                           Text(f"cpu {cpu:3.0f}%" if cpu is not None else f"cpu {NA}"))
        if not h.procs:
            rows.append(Text("no process of the run found yet (status.json names the launcher's pids)", style="dim"))
        for tr in sorted(h.procs.values(), key=lambda t: (t.rank is None, t.rank or 0, t.pid)):
            who = f"rank {tr.rank}" if tr.rank is not None else "process"
            span = h.span_seconds(tr.times_s)
            rows.append(Text.assemble((f"{who}  pid {tr.pid}", "bold"),
                                      ("" if tr.alive else "  exited", "dim"),
                                      (f"   the last {fmt_seconds(span)}", "dim")))
            c = tr.cpu_percent[-1] if tr.cpu_percent else None
            rows += chart_rows("cpu", chart(tr.cpu_percent, width, 2, 0, max(100.0, *(v for v in tr.cpu_percent
                                                                                     if v is not None), 0.0)),
                               Text(f"{c:3.0f}%" if c is not None else NA))
            rss = tr.rss_bytes[-1] if tr.rss_bytes else None
            hi = max([v for v in tr.rss_bytes if v is not None] + [self.predicted_bytes or 0, 1])
            rows += chart_rows("mem", chart(tr.rss_bytes, width, 3, 0, hi * 1.1, line=self.predicted_bytes),
                               Text(f"rss {fmt_bytes(rss)}" if rss is not None else f"rss {NA}"))
        if self.predicted_bytes:
            rows.append(Text(f"{'':<{LABEL_CELLS}}─ the plan's predicted tensors per process "
                             f"{fmt_bytes(self.predicted_bytes)} (RSS also holds Python and its libraries)",
                             style="magenta"))
        return Group(*rows)

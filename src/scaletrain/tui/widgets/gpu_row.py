"""One GPU on one line: the monitor's compact layout (above COMPACT_ABOVE_GPUS GPUs or below COMPACT_BELOW_COLUMNS
columns), so 8 GPUs fit on an 80×24 terminal.

    GPU3  ████░░  67% mem █▼░░░░░░ 3.32 GiB/23.99 GiB  47°C 148/450 W rank 3

Formatting only, as gpu_panel.GpuPanel: every number is an engine sample (nvml.GpuSample), every NVML field may be
N/A on its own, a lost GPU is its error; the ▼ is the plan's predicted peak.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from scaletrain.engine.units import fmt_bytes
from scaletrain.tui.widgets.gpu_panel import (MEM_THRESHOLDS, NA, TEMP_HOT_C, TEMP_WARN_C, UTIL_THRESHOLDS,
                                              level_style, bar)

UTIL_CELLS = 6
MEM_CELLS = 8


class GpuRow(Static):
    """A GPU in one line: util bar and %, memory used/total bar (predicted peak ▼), temperature, power, process."""

    DEFAULT_CLASSES = "gpu-row"

    def __init__(self, index: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index = index
        self.sample: Any = None

    def update_sample(self, sample: Any, name: str | None, predicted_bytes: int | None,
                      rank_of_pid: dict[int, int | None], migs: tuple[Any, ...] = ()) -> None:
        self.sample = sample
        self.set_class(sample.error is not None, "-lost")
        self.update(self.render_sample(sample, predicted_bytes, rank_of_pid, migs))

    def render_sample(self, s: Any, predicted: int | None, rank_of_pid: dict[int, int | None],
                      migs: tuple[Any, ...] = ()) -> Text:
        line = Text(f"GPU{s.index:<2}", style="bold")
        if s.error:
            line.append(f" ERROR: {s.error}", style="bold red")
            return line
        line.append(" ")
        if s.utilization_pct is not None:
            line.append_text(bar(s.utilization_pct / 100, cells=UTIL_CELLS,
                                 style=level_style(s.utilization_pct, UTIL_THRESHOLDS)))
            line.append(f" {s.utilization_pct:3d}%")
        else:
            line.append(f"{'util N/A':<{UTIL_CELLS + 5}}", style="dim")      # as wide as bar + " 64%"
        line.append(" mem ")
        if s.memory_used_bytes is not None and s.memory_total_bytes:
            frac = s.memory_used_bytes / s.memory_total_bytes
            mark = predicted / s.memory_total_bytes if predicted else None
            line.append_text(bar(frac, cells=MEM_CELLS, style=level_style(100 * frac, MEM_THRESHOLDS), marker=mark))
            line.append(f" {fmt_bytes(s.memory_used_bytes)}/{fmt_bytes(s.memory_total_bytes)}")
        else:
            line.append(NA, style="dim")
        if s.temperature_c is not None:
            style = "red" if s.temperature_c >= TEMP_HOT_C else ("yellow" if s.temperature_c >= TEMP_WARN_C else "")
            line.append(f" {s.temperature_c:3d}°C", style=style)
        else:
            line.append(f" {NA}°C", style="dim")
        if s.power_w is not None:
            line.append(f" {s.power_w:.0f}/{s.power_limit_w:.0f} W" if s.power_limit_w else f" {s.power_w:.0f} W")
        else:
            line.append(f" {NA} W", style="dim")
        line.append(" ")
        line.append_text(_procs(s.pids, rank_of_pid))
        if migs:
            line.append(f"  {len(migs)} MIG slices", style="dim")
        return line


def _procs(pids: tuple[int, ...], rank_of_pid: dict[int, int | None]) -> Text:
    """This run's rank on the GPU (bold), else how many other processes (dim)."""
    ours = [pid for pid in pids if pid in rank_of_pid]
    if ours:
        pid = ours[0]
        r = rank_of_pid[pid]
        t = Text(f"rank {r}" if r is not None else f"pid {pid}", style="bold")
        if len(pids) > 1:
            t.append(f" +{len(pids) - 1}", style="dim")
        return t
    if pids:
        return Text(f"pid {pids[0]}" + (f" +{len(pids) - 1}" if len(pids) > 1 else ""), style="dim")
    return Text("idle", style="dim")

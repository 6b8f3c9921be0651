"""One panel per GPU (and the host panel a CPU run shows instead): current numbers plus short histories.

Formatting only: every number is an engine sample (nvml.GpuSample, nvml.MigSample / HostSnapshot) or the
plan's predicted peak; the panel keeps a few minutes of history for its sparklines.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from scaletrain.engine.sampling.sampler import HISTORY_SAMPLES
from scaletrain.engine.units import fmt_bytes

SPARK_CHARS = "▁▂▃▄▅▆▇█"
BAR_CELLS = 24
SPARK_CELLS = 30
VALUE_CELLS = 12                 # " 15.00 GiB  " after a bar, before its sparkline
# Colour thresholds for util/memory bars (nvitop's defaults: --gpu-util-thresh 10 75, --mem-util-thresh 10 80).
UTIL_THRESHOLDS = (10, 75)
MEM_THRESHOLDS = (10, 80)
# Temperature colours (nvsonar: 60/75/85 °C).
TEMP_WARN_C, TEMP_HOT_C = 75, 85
NA = "N/A"


def spark(values: Iterable[float | None], width: int = SPARK_CELLS, lo: float | None = None,
          hi: float | None = None) -> str:
    """A one-line sparkline of the last `width` values (None → a gap)."""
    vals = list(values)[-width:]
    nums = [v for v in vals if v is not None]
    if not nums:
        return " " * width
    lo = min(nums) if lo is None else lo
    hi = max(nums) if hi is None else hi
    span = (hi - lo) or 1.0
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        else:
            k = int((min(max(v, lo), hi) - lo) / span * (len(SPARK_CHARS) - 1))
            out.append(SPARK_CHARS[k])
    return "".join(out).rjust(width)


def level_style(pct: float, thresholds: tuple[int, int]) -> str:
    """green below the first threshold, yellow below the second, red above (a bar or a number's style)."""
    low, high = thresholds
    return "green" if pct < low else ("yellow" if pct < high else "red")


def bar(fraction: float, cells: int = BAR_CELLS, style: str = "green", marker: float | None = None) -> Text:
    """A filled bar; `marker` (a fraction) draws the predicted peak as ▼ on top of it."""
    fraction = min(1.0, max(0.0, fraction))
    full = int(round(fraction * cells))
    t = Text()
    mark = None if marker is None else min(cells - 1, max(0, int(marker * cells)))
    for i in range(cells):
        if i == mark:
            t.append("▼", style="bold magenta")
        elif i < full:
            t.append("█", style=style)
        else:
            t.append("░", style="grey35")
    return t


class GpuPanel(Static):
    """A GPU: util, memory (predicted peak marked), temperature, power/limit, histories, this run's processes."""

    DEFAULT_CLASSES = "gpu-panel"

    def __init__(self, index: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index = index
        self.util_hist: deque[float | None] = deque(maxlen=HISTORY_SAMPLES)
        self.mem_hist: deque[float | None] = deque(maxlen=HISTORY_SAMPLES)
        self.power_hist: deque[float | None] = deque(maxlen=HISTORY_SAMPLES)
        self.sample: Any = None

    def update_sample(self, sample: Any, name: str | None, predicted_bytes: int | None,
                      rank_of_pid: dict[int, int | None], migs: tuple[Any, ...] = ()) -> None:
        self.sample = sample
        self.util_hist.append(sample.utilization_pct)
        self.mem_hist.append(sample.memory_used_bytes)
        self.power_hist.append(sample.power_w)
        self.set_class(sample.error is not None, "-lost")
        self.update(self.render_sample(sample, name, predicted_bytes, rank_of_pid, migs))

    def render_sample(self, s: Any, name: str | None, predicted: int | None, rank_of_pid: dict[int, int | None],
                      migs: tuple[Any, ...]) -> Group:
        head = Text.assemble((f"GPU {s.index}", "bold"), "  ", (name or "", "dim"))
        if s.error:
            return Group(head, Text(f"ERROR: {s.error}", style="bold red"))
        temp = (Text(f"{s.temperature_c}°C", style="red" if s.temperature_c >= TEMP_HOT_C else
                     ("yellow" if s.temperature_c >= TEMP_WARN_C else ""))
                if s.temperature_c is not None else Text(f"{NA}°C", style="dim"))
        if s.power_w is not None:
            power = f"{s.power_w:.0f}/{s.power_limit_w:.0f} W" if s.power_limit_w else f"{s.power_w:.0f} W"
        else:
            power = f"{NA} W"
        head.append("   ")
        head.append_text(temp)
        head.append(f"   {power}")
        rows = [head]
        util = Text("util  ")
        if s.utilization_pct is not None:
            util.append_text(bar(s.utilization_pct / 100, style=level_style(s.utilization_pct, UTIL_THRESHOLDS)))
            util.append(f" {s.utilization_pct:3d}%".ljust(VALUE_CELLS))
        else:
            util.append(f"{NA:<{BAR_CELLS}}", style="dim")
            util.append(" " * VALUE_CELLS)
        util.append(spark(self.util_hist, lo=0, hi=100), style="cyan")
        rows.append(util)
        mem = Text("mem   ")
        if s.memory_used_bytes is not None and s.memory_total_bytes:
            frac = s.memory_used_bytes / s.memory_total_bytes
            mark = predicted / s.memory_total_bytes if predicted else None
            mem.append_text(bar(frac, style=level_style(100 * frac, MEM_THRESHOLDS), marker=mark))
            mem.append(f" {fmt_bytes(s.memory_used_bytes)}".ljust(VALUE_CELLS))
            mem.append(spark(self.mem_hist, lo=0, hi=s.memory_total_bytes), style="cyan")
        else:
            mem.append(NA, style="dim")
        rows.append(mem)
        pw = Text("power ")
        if s.power_w is not None and s.power_limit_w:
            pw.append_text(bar(s.power_w / s.power_limit_w, style="cyan"))
            pw.append(f" {s.power_w:.0f} W".ljust(VALUE_CELLS))
            pw.append(spark(self.power_hist, lo=0, hi=s.power_limit_w), style="cyan")
        else:
            pw.append(power, style="dim" if s.power_w is None else "")
        rows.append(pw)
        if s.memory_total_bytes:
            foot = Text(f"      of {fmt_bytes(s.memory_total_bytes)}", style="dim")
            if predicted:
                foot.append(f"   ▼ predicted peak {fmt_bytes(predicted)}", style="magenta")
            rows.append(foot)
        procs = Text("procs ", style="")
        if s.pids:
            mem = s.pid_memory_bytes
            for k, pid in enumerate(s.pids):
                held = f" {fmt_bytes(mem[k])}" if k < len(mem) and mem[k] is not None else ""   # N/A: left out
                if pid in rank_of_pid:
                    r = rank_of_pid[pid]
                    procs.append(f"rank {r} (pid {pid}){held}  " if r is not None else f"this run (pid {pid}){held}  ",
                                 style="bold")
                else:
                    procs.append(f"other pid {pid}{held}  ", style="dim")
        else:
            procs.append("none", style="dim")
        rows.append(procs)
        for m in migs:
            line = Text(f"  MIG {s.index}:{m.mig_index}  ", style="")
            if m.error:
                line.append(f"ERROR: {m.error}", style="red")
            elif m.memory_used_bytes is not None and m.memory_total_bytes:
                line.append(f"mem {fmt_bytes(m.memory_used_bytes)} / {fmt_bytes(m.memory_total_bytes)}")
                line.append("  util N/A on MIG", style="dim")
                ours = [p for p in m.pids if p in rank_of_pid]
                if ours:
                    line.append("  " + ", ".join(f"rank {rank_of_pid[p]}" for p in ours), style="bold")
            else:
                line.append(NA, style="dim")
            rows.append(line)
        for row in rows:            # a narrow panel cuts a line's sparkline short instead of wrapping it
            row.no_wrap, row.overflow = True, "ellipsis"
        return Group(*rows)


class HostPanel(Static):
    """A CPU run (or no NVML): says why there are no GPU panels and shows host CPU/memory per rank."""

    DEFAULT_CLASSES = "host-panel"

    def __init__(self, reason: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reason = reason
        self.cpu_hist: deque[float | None] = deque(maxlen=HISTORY_SAMPLES)
        self.rank_rss: dict[int, deque[float | None]] = {}

    def update_host(self, h: Any, reason: str | None = None) -> None:
        if reason:
            self.reason = reason
        self.cpu_hist.append(h.cpu_percent)
        rows = [Text.assemble(("processes on this host", "bold"),
                              (f"  (no GPU panels: {self.reason or 'NVML unavailable'})", "yellow"))]
        cpu = Text("host cpu ")
        if h.cpu_percent is not None:
            cpu.append_text(bar(h.cpu_percent / 100, style=level_style(h.cpu_percent, UTIL_THRESHOLDS)))
            cpu.append(f" {h.cpu_percent:3.0f}%  ")
        cpu.append(spark(self.cpu_hist, lo=0, hi=100), style="cyan")
        rows.append(cpu)
        if h.memory_total_bytes:
            mem = Text("host mem ")
            mem.append_text(bar(h.memory_used_bytes / h.memory_total_bytes,
                                style=level_style(100 * h.memory_used_bytes / h.memory_total_bytes, MEM_THRESHOLDS)))
            mem.append(f" {fmt_bytes(h.memory_used_bytes)} / {fmt_bytes(h.memory_total_bytes)}")
            rows.append(mem)
        if not h.procs:
            rows.append(Text("ranks: none found yet (status.json names the launcher's pids)", style="dim"))
        for p in h.procs:
            hist = self.rank_rss.setdefault(p.rank if p.rank is not None else -1, deque(maxlen=HISTORY_SAMPLES))
            hist.append(p.rss_bytes)
            who = f"rank {p.rank}" if p.rank is not None else "proc"
            if not p.alive:
                rows.append(Text(f"{who:<8} pid {p.pid}  exited", style="dim"))
                continue
            cpu_s = f"{p.cpu_percent:5.0f}%" if p.cpu_percent is not None else f"{NA:>6}"
            rss_s = fmt_bytes(p.rss_bytes) if p.rss_bytes is not None else NA
            rows.append(Text.assemble(f"{who:<8} pid {p.pid:<7} cpu {cpu_s}  rss {rss_s:>10}  ",
                                      (spark(hist, width=SPARK_CELLS // 2, lo=0), "cyan")))
        for row in rows[1:]:        # a narrow panel cuts a sparkline short instead of wrapping it onto a line
            row.no_wrap, row.overflow = True, "ellipsis"
        self.update(Group(*rows))

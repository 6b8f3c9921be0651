"""The last minutes of every GPU and of every rank's process, kept from the monitor's ticks (nvitop's history).

Why in the engine: the monitor's panels are rebuilt when the layout changes (their own short histories start over),
while the history view (`h`) must show the minutes since the monitor attached. Each field keeps its own N/A (None)
so a chart shows a gap where NVML refused a reading, never a made-up value.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from scaletrain.engine.sampling.sampler import HISTORY_SAMPLES


@dataclass
class GpuTrack:
    """One GPU over time (each deque one value per tick) and its latest sample, name and MIG slices."""

    index: int
    name: str | None = None
    times_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_SAMPLES))
    utilization_pct: deque[float | None] = field(default_factory=lambda: deque(maxlen=HISTORY_SAMPLES))
    memory_used_bytes: deque[int | None] = field(default_factory=lambda: deque(maxlen=HISTORY_SAMPLES))
    power_w: deque[float | None] = field(default_factory=lambda: deque(maxlen=HISTORY_SAMPLES))
    last: Any = None                   # nvml.GpuSample
    migs: tuple[Any, ...] = ()


@dataclass
class ProcTrack:
    """One rank's process on a CPU run (or any host process the run owns): CPU % and resident memory."""

    rank: int | None
    pid: int
    times_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_SAMPLES))
    cpu_percent: deque[float | None] = field(default_factory=lambda: deque(maxlen=HISTORY_SAMPLES))
    rss_bytes: deque[int | None] = field(default_factory=lambda: deque(maxlen=HISTORY_SAMPLES))
    alive: bool = True


@dataclass(frozen=True)
class GpuProcess:
    """A process on a GPU as the history view lists it: whose it is and what it holds (None = N/A)."""

    pid: int
    rank: int | None                   # this run's rank, None for another process (or this run's launcher)
    ours: bool
    memory_bytes: int | None


class DeviceHistory:
    def __init__(self) -> None:
        self.gpus: dict[int, GpuTrack] = {}
        self.procs: dict[int, ProcTrack] = {}          # by pid
        self.rank_of_pid: dict[int, int | None] = {}
        self.host_cpu: deque[float | None] = deque(maxlen=HISTORY_SAMPLES)
        self.host: Any = None                          # the latest HostSnapshot
        self.gpu_reason: str | None = None             # why there are no GPU tracks (a CPU run, no NVML)
        self.ticks = 0

    def add(self, tick: Any) -> None:
        """One sampling pass (engine.sampling.sampler.Tick)."""
        self.ticks += 1
        g, h, job = tick.gpu, tick.host, tick.job
        if h is not None:
            self.host = h
            self.host_cpu.append(h.cpu_percent)
            self.rank_of_pid.update({p.pid: p.rank for p in h.procs})
            for p in h.procs:
                tr = self.procs.setdefault(p.pid, ProcTrack(p.rank, p.pid))
                tr.times_s.append(h.time_s)
                tr.cpu_percent.append(p.cpu_percent if p.alive else None)
                tr.rss_bytes.append(p.rss_bytes if p.alive else None)
                tr.alive = p.alive
        if job is not None:
            self.rank_of_pid.update({pid: r for r, pid in job.status.rank_pids.items()})
        if g is None or not g.available:
            self.gpu_reason = g.reason if g is not None else "no GPU source"
            return
        self.gpu_reason = None
        for i, s in enumerate(g.gpus):
            tr = self.gpus.setdefault(s.index, GpuTrack(s.index))
            tr.name = g.names[i] if i < len(g.names) else tr.name
            tr.times_s.append(s.time_s)
            tr.utilization_pct.append(s.utilization_pct)
            tr.memory_used_bytes.append(s.memory_used_bytes)
            tr.power_w.append(s.power_w)
            tr.last = s
            tr.migs = tuple(m for m in g.migs if m.parent_index == s.index)

    def span_seconds(self, times: deque[float]) -> float:
        """How long the kept samples cover."""
        return times[-1] - times[0] if len(times) > 1 else 0.0

    def gpu_processes(self, index: int) -> tuple[GpuProcess, ...]:
        """The processes on GPU `index` at the last sample: this run's ranks first, each with its memory."""
        tr = self.gpus.get(index)
        if tr is None or tr.last is None:
            return ()
        s = tr.last
        mem = list(getattr(s, "pid_memory_bytes", ()) or ())
        out = [GpuProcess(pid, self.rank_of_pid.get(pid), pid in self.rank_of_pid,
                          mem[k] if k < len(mem) else None) for k, pid in enumerate(s.pids)]
        return tuple(sorted(out, key=lambda p: (not p.ours, p.rank if p.rank is not None else 1 << 30, p.pid)))

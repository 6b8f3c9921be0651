"""Live numbers for the monitor: GPUs (gpu.py), host processes (host.py) and the run directory (watcher.py),
polled at a fixed cadence (gpustat's: sleep interval − query time).

Why here and not in the screen: the Textual monitor, `scaletrain monitor --headless` and the benchmark all read
the same snapshots, so sampling lives in the engine (no Textual, no torch) and every view only formats them.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.sampling.gpu import DEFAULT_INTERVAL_S, GpuSnapshot, GpuSource, NvmlSource, ReplaySource
from scaletrain.engine.sampling.host import MAX_INTERVAL_S, MIN_INTERVAL_S, HostSnapshot, HostSource
from scaletrain.engine.sampling.watcher import JobSnapshot, RunWatcher

HISTORY_SAMPLES = 180             # sparkline history: 3 minutes at 1 Hz ("the last minutes")


@dataclass(frozen=True)
class Tick:
    """What one sampling pass produced (any part may be None when its source is absent)."""

    gpu: GpuSnapshot | None
    host: HostSnapshot | None
    job: JobSnapshot | None
    cost_seconds: float                # CPU time this pass took in the sampling thread


class Sampler:
    """Poll the sources at a fixed cadence and hand each Tick to `on_tick` (the monitor posts it as a message)."""

    def __init__(self, gpu: GpuSource | None, host: HostSource | None, job: RunWatcher | None,
                 interval_s: float = DEFAULT_INTERVAL_S):
        if not MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S:       # nan and inf (1e309) too
            raise ScaletrainError(f"--interval must be from {MIN_INTERVAL_S} to {MAX_INTERVAL_S:g} s (got {interval_s})")
        self.gpu, self.host, self.job = gpu, host, job
        self.interval_s = float(interval_s)

    def tick(self) -> Tick:
        c0 = time.thread_time()
        job = self.job.poll() if self.job is not None else None
        if job is not None and self.host is not None and (job.status.pids or job.status.rank_pids):
            self.host.set_pids(job.status.pids, job.status.rank_pids)
        gpu = self.gpu.read() if self.gpu is not None else None
        host = self.host.read() if self.host is not None else None
        return Tick(gpu, host, job, time.thread_time() - c0)

    def run(self, on_tick: Callable[[Tick], None], stop: threading.Event,
            until: Callable[[Tick], bool] | None = None) -> None:
        """Loop until `stop` is set (or `until(tick)` says so); each pass is timed so the cadence holds."""
        while not stop.is_set():
            t0 = time.monotonic()
            t = self.tick()
            on_tick(t)
            if until is not None and until(t):
                return
            stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def close(self) -> None:
        for s in (self.gpu, self.host):
            if s is not None:
                s.close()


def run_is_over(t: Tick) -> bool:
    return t.job is not None and t.job.status.state in ("finished", "failed", "interrupted")


def make_sampler(run_dir: str | os.PathLike[str] | None, interval_s: float = DEFAULT_INTERVAL_S,
                 replay: str | os.PathLike[str] | None = None, nvml: bool = True, wait: bool = True) -> Sampler:
    """The monitor's sources: NVML (or a replay file), host stats for the run's ranks, the run directory (waited
    for while it does not exist yet, unless `wait` is False)."""
    job = RunWatcher(run_dir, wait=wait) if run_dir is not None else None
    gpu: GpuSource | None
    if replay is not None:
        gpu = ReplaySource(replay)
    elif nvml and not (job is not None and job.on_cpu):
        gpu = NvmlSource()
    else:
        gpu = None
    try:
        host: HostSource | None = HostSource()
    except ModuleNotFoundError:
        host = None
    return Sampler(gpu, host, job, interval_s)



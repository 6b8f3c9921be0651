"""The run directory as the monitor watches it: metrics.jsonl (run.metrics), per-rank log tails, status.json
(run.status), the plan's predicted peak (run.plan_document), and the early memory warning.

A directory that does not exist yet is waited for (`wait=True`, the monitor's default): every poll says "waiting
for DIR" until it appears, then the watcher reads it as any other run directory."""

from __future__ import annotations

import os
import time
from datetime import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import AppendedLines, not_regular
from scaletrain.engine.run.layout import RUN_DIR_MARKERS, RunDir, log_rank, tensorboard_command
from scaletrain.engine.run.metrics import (MetricsSummary, MetricsTail, RankMemory, RunSeries, StepMetrics,
                                           run_series, summarize)
from scaletrain.engine.run.plan_document import PlanDocument, read_plan_document
from scaletrain.engine.launch.status import RunStatus, read_status
from scaletrain.engine.sampling.job_view import JobView, job_view
from scaletrain.engine.units import fmt_bytes

# what a run directory being written holds (layout.py): a folder with other files only is not waited for
LOG_TAIL_LINES = 400              # per rank, what the log panel can scroll back to
LOSS_HISTORY_STEPS = 2000         # loss plot points kept
TAIL_READ_LIMIT_BYTES = 1 << 20   # first read of a big log: only its last MiB


class LogTail:
    """Lines appended to one log since the last poll (offset-based, partial last line kept for later)."""

    def __init__(self, path: Path, rank: int | None):
        self.path = Path(path)
        self.rank = rank
        self._lines = AppendedLines(self.path, first_read_limit=TAIL_READ_LIMIT_BYTES)

    def poll(self) -> list[str]:
        """New lines (a relaunch's rewritten log is read afresh)."""
        return [ln.decode("utf-8", errors="replace").rstrip("\r") for ln in self._lines.poll()]


@dataclass(frozen=True)
class RankMemoryView:
    """Measured vs predicted peak for one rank; `warning` set when it is past the prediction by the headroom."""

    rank: int
    measured_bytes: int | None
    predicted_bytes: int | None
    what: str                          # "allocated" (GPU) or "host RSS" (CPU run)
    warning: str | None = None



@dataclass(frozen=True)
class JobSnapshot:
    time_s: float
    status: RunStatus
    summary: MetricsSummary | None = None          # None before the first step
    losses: tuple[float, ...] = ()
    memory: tuple[RankMemoryView, ...] = ()
    new_log_lines: tuple[tuple[int | None, str], ...] = ()   # (rank, line) appended since the last poll
    warnings: tuple[str, ...] = ()
    new_steps: tuple[StepMetrics, ...] = ()       # appended since the last poll
    series: RunSeries | None = None               # every step so far (charts), with the plan's speed
    waiting_for: str | None = None                # "waiting for DIR" while the run directory does not exist
    tensorboard: str | None = None                # the command that shows the run's TensorBoard events
    view: JobView | None = None                   # every rank on every node at the last step (job_view.py)
    wall_seconds: float | None = None             # how long this launch has run, or ran (RunStatus.wall_seconds)


def memory_views(plan: PlanDocument | None, peak_memory: Iterable[RankMemory]) -> tuple[RankMemoryView, ...]:
    """Per-rank measured peak against the plan's; warn past prediction + headroom (before the OOM, not after).

    Allocated is compared with the predicted allocated peak (both exclude the CUDA context and the allocator's
    reserve). A CPU run reports no allocator numbers, so its RSS is compared with the predicted per-process
    total. The margin is the plan's headroom: headroom_fraction × capacity.
    """
    doc = plan or PlanDocument({})
    total = doc.predicted_total_bytes
    alloc_pred = doc.allocated_peak_bytes
    cap = doc.capacity_bytes
    usable = doc.usable_bytes
    margin = int(cap * float(doc.headroom_fraction or 0.0)) if cap else None
    out = []
    for m in peak_memory:
        on_gpu = m.allocated_bytes is not None
        measured = m.allocated_bytes if on_gpu else m.host_rss_bytes
        predicted = alloc_pred if on_gpu else total
        warning = None
        if measured is not None and predicted and margin is not None and measured - predicted > margin:
            warning = (f"rank {m.rank}: measured peak {fmt_bytes(measured)} is {fmt_bytes(measured - predicted)} over "
                       f"the predicted {fmt_bytes(predicted)}, more than the {fmt_bytes(margin)} headroom")
        if on_gpu and measured is not None and usable and m.reserved_bytes and m.reserved_bytes > usable:
            warning = (warning + "; " if warning else f"rank {m.rank}: ") + (
                f"reserved {fmt_bytes(m.reserved_bytes)} is past the usable {fmt_bytes(usable)}: an OOM is near")
        # a CPU run's RSS holds the Python runtime and libraries besides the tensors the model predicts
        out.append(RankMemoryView(m.rank, measured, predicted, "allocated" if on_gpu else "host RSS vs tensors",
                                  warning))
    return tuple(out)



class RunWatcher:
    """Everything the job panel shows, polled from the run directory (cheap: stat + appended bytes)."""

    def __init__(self, run_dir: str | os.PathLike[str], *, wait: bool = False):
        self.run = RunDir(run_dir)
        self.plan: PlanDocument | None = None
        self.ready = False
        self.metrics = MetricsTail(self.run.metrics)
        self.tails: dict[Path, LogTail] = {}
        self._seen_steps = 0                       # len(series) the cached numbers below were made from
        self._losses: tuple[float, ...] = ()
        self._series: RunSeries | None = None
        self._summary: MetricsSummary | None = None
        self._memory: tuple[RankMemoryView, ...] = ()
        self._view: JobView | None = None
        if wait:
            self._wait()               # a file is refused now; a missing or still empty directory is waited for
        else:
            self._open()

    def _open(self) -> None:
        """Read the run directory's plan (a file or a folder that is no run directory: one line)."""
        if not self.run.path.exists():
            raise ScaletrainError(f"{self.run.path} does not exist; give a run directory (it holds plan.json), or "
                                  "leave out --once to wait for it")
        if not self.run.path.is_dir():
            raise ScaletrainError(f"{self.run.path} is not a directory; give a run directory (it holds plan.json)")
        self.plan = read_plan_document(self.run.plan) if self.run.plan.exists() else None
        if self.plan is None and not self.run.metrics.exists() and not self.run.logs.is_dir():
            raise ScaletrainError(f"{self.run.path} is not a run directory (no plan.json, metrics.jsonl or logs/)")
        self.ready = True

    @property
    def waiting_text(self) -> str:
        return f"waiting for {self.run.path}"

    def _wait(self) -> bool:
        """True while the directory is still to come (or holds nothing of a run yet: the writer is mid-way)."""
        if self.ready:
            return False
        if not self.run.path.exists():
            return True
        try:
            self._open()
        except ScaletrainError:
            if not_regular(self.run.plan, self.run.plan.name):
                raise                              # a FIFO or a folder in plan.json's place is not being written
            if self.run.path.is_dir() and not self._foreign():
                return True                        # created, not written yet: keep waiting
            raise
        return False

    def _foreign(self) -> bool:
        """A directory holding files, none of them a run directory's: not a run to wait for (a wrong path)."""
        names = {p.name for p in self.run.path.iterdir()}
        return bool(names) and not names & RUN_DIR_MARKERS

    def problems(self, status: RunStatus) -> tuple[str, ...]:
        """What the run directory says wrongly, each in words: no plan.json (no prediction to compare with), a
        status file that is not the launcher's record, a metrics file without one step record."""
        out = []
        if self.ready and self.plan is None:
            out.append(f"{self.run.path} has no plan.json: nothing to compare the measurements with")
        if status.state == "unknown" and status.reason:
            out.append(status.reason)
        if self.metrics.problem:
            out.append(self.metrics.problem)
        return tuple(out)

    @property
    def predicted_peak_bytes(self) -> int | None:
        return self.plan.predicted_total_bytes if self.plan is not None else None

    @property
    def world_size(self) -> int | None:
        return self.plan.world_size if self.plan is not None else None

    @property
    def on_cpu(self) -> bool:
        return self.plan is not None and self.plan.on_cpu

    def _log_tails(self) -> list[LogTail]:
        if self.run.logs.is_dir():
            for p in sorted(self.run.logs.glob("*.log")):
                if p not in self.tails:
                    self.tails[p] = LogTail(p, log_rank(p.name))
        return list(self.tails.values())

    def poll(self) -> JobSnapshot:
        if self._wait():
            return JobSnapshot(time.time(), RunStatus("starting"), waiting_for=self.waiting_text)
        new = self.metrics.poll()
        series = self.metrics.series
        if new or len(series) != self._seen_steps:     # the series only changes in poll (new steps, or a reset)
            self._seen_steps = len(series)
            self._losses = tuple(r.loss for r in series[-LOSS_HISTORY_STEPS:])
            doc = self.plan or PlanDocument({})
            self._series = run_series(series, doc.planned_step_seconds, doc.planned_tokens_per_second)
            self._summary = summarize(series, planned_step_seconds=doc.planned_step_seconds,
                                      planned_tokens_per_second=doc.planned_tokens_per_second) if series else None
            self._memory = memory_views(self.plan, series[-1].peak_memory) if series else ()
            self._view = job_view(self.plan, series[-1] if series else None)
        summary, mem = self._summary, self._memory
        lines: list[tuple[int | None, str]] = []
        for t in self._log_tails():
            lines.extend((t.rank, ln) for ln in t.poll())
        status = read_status(self.run.status)
        warnings = self.problems(status) + tuple(m.warning for m in mem if m.warning)
        return JobSnapshot(time.time(), status, summary, self._losses, mem, tuple(lines), warnings, tuple(new),
                           self._series, tensorboard=tensorboard_command(self.run) if self.run.tensorboard.is_dir()
                           else None, view=self._view, wall_seconds=status.wall_seconds(datetime.now()))



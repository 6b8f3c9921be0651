"""metrics.jsonl: one JSON line per optimizer step, written by the trainer (rank 0), read by progress and monitor.

A line:
  {"step": 12, "total_steps": 40, "epoch": 0.3, "loss": 3.91, "lr": 0.0003, "tokens_per_second": 5120.0,
   "step_seconds": 0.41, "world_size": 2, "time": 1763770000.1, "tokens": 2048, "grad_norm": 1.7,
   "peak_memory": [{"rank": 0, "allocated_bytes": null, "reserved_bytes": null, "host_rss_bytes": 612345856}, ...]}
`epoch` is fractional progress (steps done / steps per epoch); `tokens` counts the step's real (unpadded) tokens over
all ranks; `grad_norm` is the global norm before clipping (null where the strategy does not report it).
`allocated_bytes`/`reserved_bytes` are CUDA's max_memory_allocated/reserved per rank (null on CPU);
`eval_loss`, `eval_perplexity` and `eval_seconds` appear on the steps that evaluated (an eval split: --eval-data or
train.eval_fraction). `host_rss_bytes` is the rank's peak resident set size; `telemetry` (when the trainer sampled it) what the rank saw of
its own device, node and step phases (rank_telemetry.py).

A resumed run first cuts the file back to its checkpoint's step (truncate_metrics: the steps logged after the last
checkpoint of a killed run are logged again, and a torn last line goes), then appends. Readers still keep one
monotone series, for files written before that: a step that does not go forward replaces the records from that
step on.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from scaletrain.engine.fileio import AppendedLines, atomic_write, open_regular
from scaletrain.engine.run.rank_telemetry import RankTelemetry
from scaletrain.engine.units import counted, fmt_seconds

MAX_RECORD_BYTES = 1 << 20      # one metrics line; a longer one is no step record (skipped, never held whole)
TORN_TAIL_SCAN_BYTES = 1 << 20  # a record is a few hundred bytes: its line break is well within the last MiB
ETA_WINDOW_STEPS = 20          # recent steps averaged for the speed and the ETA (warm-up steps left out)
WARMUP_FRACTION = 0.25         # the first quarter of the steps (at least MIN_WARMUP_STEPS) is warm-up: allocator,
MIN_WARMUP_STEPS = 2           # kernel selection, caches; a steady-state number leaves them out


@dataclass(frozen=True)
class RankMemory:
    """One rank's peaks at a step, and what it sampled of its own device and step (rank_telemetry.py)."""

    rank: int
    allocated_bytes: int | None
    reserved_bytes: int | None
    host_rss_bytes: int | None
    telemetry: RankTelemetry | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"rank": self.rank, "allocated_bytes": self.allocated_bytes, "reserved_bytes": self.reserved_bytes,
               "host_rss_bytes": self.host_rss_bytes}
        if self.telemetry is not None:
            out["telemetry"] = self.telemetry.to_json()
        return out

    @property
    def node(self) -> int | None:
        return self.telemetry.node if self.telemetry is not None else None


@dataclass(frozen=True)
class StepMetrics:
    step: int
    total_steps: int
    epoch: float
    loss: float
    lr: float
    tokens_per_second: float
    step_seconds: float
    world_size: int
    time: float
    tokens: int = 0
    grad_norm: float | None = None
    peak_memory: tuple[RankMemory, ...] = ()
    eval_loss: float | None = None          # mean loss over the eval split's trained tokens, at this step
    eval_seconds: float | None = None       # how long that evaluation took (not in step_seconds)

    @property
    def eval_perplexity(self) -> float | None:
        return math.exp(min(self.eval_loss, 700.0)) if self.eval_loss is not None else None
    cpu_seconds: float | None = None      # rank 0's process CPU time in the step (all its threads): host work

    def to_json(self) -> dict[str, Any]:
        out = {"step": self.step, "total_steps": self.total_steps, "epoch": self.epoch, "loss": self.loss,
               "lr": self.lr, "tokens_per_second": self.tokens_per_second, "step_seconds": self.step_seconds,
               "world_size": self.world_size, "time": self.time, "tokens": self.tokens,
               "grad_norm": self.grad_norm, "peak_memory": [m.to_json() for m in self.peak_memory]}
        if self.eval_loss is not None:
            out.update(eval_loss=self.eval_loss, eval_perplexity=self.eval_perplexity, eval_seconds=self.eval_seconds)
        if self.cpu_seconds is not None:
            out["cpu_seconds"] = self.cpu_seconds
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "StepMetrics":
        mem = tuple(RankMemory(int(m["rank"]), m.get("allocated_bytes"), m.get("reserved_bytes"),
                               m.get("host_rss_bytes"), RankTelemetry.from_json(m.get("telemetry")))
                    for m in d.get("peak_memory") or ())
        return cls(step=int(d["step"]), total_steps=int(d["total_steps"]), epoch=float(d["epoch"]),
                   loss=float(d["loss"]), lr=float(d["lr"]), tokens_per_second=float(d["tokens_per_second"]),
                   step_seconds=float(d["step_seconds"]), world_size=int(d["world_size"]), time=float(d["time"]),
                   tokens=int(d.get("tokens", 0)),
                   grad_norm=None if d.get("grad_norm") is None else float(d["grad_norm"]), peak_memory=mem,
                   eval_loss=None if d.get("eval_loss") is None else float(d["eval_loss"]),
                   eval_seconds=None if d.get("eval_seconds") is None else float(d["eval_seconds"]),
                   cpu_seconds=None if d.get("cpu_seconds") is None else float(d["cpu_seconds"]))


def _parse(line: str) -> StepMetrics | None:
    try:
        d = json.loads(line)
        return StepMetrics.from_json(d) if isinstance(d, dict) else None
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError):
        return None          # a foreign or damaged line is skipped, never fatal to a viewer


def _monotone(series: list[StepMetrics], rec: StepMetrics) -> None:
    while series and series[-1].step >= rec.step:
        series.pop()
    series.append(rec)


def read_metrics(path: str | os.PathLike[str]) -> list[StepMetrics]:
    """All complete records as one monotone series (an unfinished last line is left for the next read)."""
    series: list[StepMetrics] = []
    try:
        f = open_regular(path, "metrics file")        # a FIFO in its place is one line, not a wait
    except FileNotFoundError:
        return series
    with f:
        while True:
            raw = f.readline(MAX_RECORD_BYTES)
            if not raw.endswith(b"\n"):
                if len(raw) < MAX_RECORD_BYTES:
                    break                               # the end, or an unfinished last line
                while raw and not raw.endswith(b"\n"):  # a line no step record is this long: skipped
                    raw = f.readline(MAX_RECORD_BYTES)
                continue
            rec = _parse(raw.decode("utf-8", errors="replace"))
            if rec is not None:
                _monotone(series, rec)
    return series


def read_metrics_tail(path: str | os.PathLike[str], limit_bytes: int) -> list[StepMetrics]:
    """The newest records only: at most the file's last `limit_bytes` are read (a long run's list view)."""
    series: list[StepMetrics] = []
    for raw in AppendedLines(Path(path), first_read_limit=limit_bytes).poll():
        rec = _parse(raw.decode("utf-8", errors="replace"))
        if rec is not None:
            _monotone(series, rec)
    return series


class MetricsTail:
    """Incremental reader: poll() returns the records appended since the last call (handles partial lines)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._lines = AppendedLines(self.path)
        self.series: list[StepMetrics] = []
        self.rejected_lines = 0                 # complete lines that are no step record (foreign, damaged, null)

    def poll(self) -> list[StepMetrics]:
        lines = self._lines.poll()
        if self._lines.restarted:
            self.series = []                    # replaced or truncated: start over
            self.rejected_lines = 0
        new: list[StepMetrics] = []
        for raw in lines:
            rec = _parse(raw.decode("utf-8", errors="replace"))
            if rec is not None:
                _monotone(self.series, rec)
                new.append(rec)
            elif raw.strip():
                self.rejected_lines += 1
        return new

    @property
    def problem(self) -> str | None:
        """What is wrong with the file when no line of it is a step record (a few bad lines among good ones are
        skipped quietly: a torn line after a crash is normal)."""
        if self.rejected_lines and not self.series:
            return (f"{self.path.name}: none of its {self.rejected_lines} line(s) is a step record (a JSON object "
                    "with step, loss, lr, tokens_per_second, …)")
        return None


def truncate_metrics(path: str | os.PathLike[str], through_step: int) -> int:
    """Resume: keep the records of the one monotone series up to `through_step` (the checkpoint's step), drop the
    rest (an abandoned stretch the resumed run logs again, a torn last line). Rewritten atomically; returns the
    number of lines dropped."""
    p = Path(path)
    try:
        with open_regular(p, "metrics file") as f:
            raw = f.read()
    except FileNotFoundError:
        return 0
    lines = raw.split(b"\n")
    complete, torn = lines[:-1], lines[-1]
    kept: list[tuple[int, bytes]] = []
    for line in complete:
        rec = _parse(line.decode("utf-8", errors="replace"))
        if rec is None:
            continue
        while kept and kept[-1][0] >= rec.step:
            kept.pop()
        kept.append((rec.step, line))
    kept = [(s, line) for s, line in kept if s <= through_step]
    dropped = len(complete) - len(kept) + (1 if torn else 0)
    if dropped:
        atomic_write(p, "".join(line.decode("utf-8", errors="replace") + "\n" for _, line in kept), backup=False)
    return dropped


class MetricsWriter:
    """Append-only writer: one complete line per write, flushed, so a tailing reader never sees half a record.
    A torn last line (a process killed mid-write) is cut off first, so the next record starts on its own line."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_tail(self.path)
        self._f = self.path.open("a", encoding="utf-8")

    def write(self, rec: StepMetrics) -> None:
        self._f.write(json.dumps(rec.to_json(), separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _drop_torn_tail(path: Path) -> None:
    try:
        with path.open("rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(max(0, size - TORN_TAIL_SCAN_BYTES))
            tail = f.read()
            if tail.endswith(b"\n"):
                return
            cut = tail.rfind(b"\n")
            if cut >= 0 or size <= TORN_TAIL_SCAN_BYTES:
                f.truncate(size - len(tail) + cut + 1)           # cut = -1 with the whole file read: empty
            else:
                f.write(b"\n")                                   # no line break in sight: end the line instead
    except FileNotFoundError:
        return


@dataclass(frozen=True)
class VersusPlan:
    """Measured speed beside the plan's: step time and tokens/s (all ranks) with measured ÷ planned (> 1: slower
    steps, more tokens/s). The plan's numbers are plan.json's time section."""

    measured_step_seconds: float
    planned_step_seconds: float
    measured_tokens_per_second: float
    planned_tokens_per_second: float | None
    # every step measured so far is warm-up (allocator, kernel selection, the first collectives): a one-step run's
    # 17.9 s against the plan's 6.7 s (tiny-phi3 on 2xCPU) read as a time model 2.7× off
    warm_up_only: bool = False

    @property
    def step_ratio(self) -> float:
        return self.measured_step_seconds / self.planned_step_seconds

    @property
    def tokens_ratio(self) -> float | None:
        p = self.planned_tokens_per_second
        return self.measured_tokens_per_second / p if p else None

    def step_text(self) -> str:
        """'645 ms/step (plan 324 ms, ×1.99)'."""
        return (f"{fmt_seconds(self.measured_step_seconds)}/step (plan {fmt_seconds(self.planned_step_seconds)}, "
                f"×{self.step_ratio:.2f}{', warm-up steps only' if self.warm_up_only else ''})")

    def tokens_text(self) -> str:
        """'25,400 tok/s (plan 50,500, ×0.50)'."""
        r = self.tokens_ratio
        plan = f" (plan {self.planned_tokens_per_second:,.0f}, ×{r:.2f})" if r is not None else ""
        return f"{self.measured_tokens_per_second:,.0f} tok/s{plan}"

    def to_json(self) -> dict[str, Any]:
        return {"measured_step_seconds": self.measured_step_seconds,
                "planned_step_seconds": self.planned_step_seconds, "step_ratio": self.step_ratio,
                "measured_tokens_per_second": self.measured_tokens_per_second,
                "planned_tokens_per_second": self.planned_tokens_per_second, "tokens_ratio": self.tokens_ratio,
                "warm_up_only": self.warm_up_only}


def versus_plan(step_seconds: float, tokens_per_second: float, planned_step_seconds: float | None,
                planned_tokens_per_second: float | None, warm_up_only: bool = False) -> VersusPlan | None:
    """Measured beside planned, when there is a planned step time to compare with."""
    if not planned_step_seconds or planned_step_seconds <= 0 or step_seconds <= 0:
        return None
    tps = planned_tokens_per_second if planned_tokens_per_second and planned_tokens_per_second > 0 else None
    return VersusPlan(step_seconds, planned_step_seconds, tokens_per_second, tps, warm_up_only)


@dataclass(frozen=True)
class MetricsSummary:
    """What a progress line shows, computed once here so every view prints the same numbers."""

    step: int
    total_steps: int
    epoch: float
    loss: float
    loss_first: float
    lr: float
    tokens_per_second: float
    step_seconds: float
    eta_seconds: float
    elapsed_seconds: float
    world_size: int
    peak_host_rss_bytes: int | None
    peak_allocated_bytes: int | None
    versus: VersusPlan | None = None      # the recent steady speed beside the plan's (when a plan is known)

    @property
    def fraction_done(self) -> float:
        return self.step / self.total_steps if self.total_steps else 0.0

    @property
    def ranks_text(self) -> str:
        """'8 GPUs', '1 GPU', '2 processes': the ranks, named by what recorded their peak (allocated bytes come
        from a GPU; a CPU run records host RSS only)."""
        return counted(self.world_size, "GPU" if self.peak_allocated_bytes is not None else "process")

    def eta_after(self, rec: StepMetrics) -> float:
        """Seconds left after step `rec`, at the recent mean step time (what eta_seconds is for the last step)."""
        return eta_seconds(rec, self.step_seconds)


def eta_seconds(rec: StepMetrics, step_seconds: float) -> float:
    """Steps left after `rec` × a step time."""
    return max(0, rec.total_steps - rec.step) * step_seconds


def steady_steps(series: Iterable[StepMetrics]) -> list[StepMetrics]:
    """The steps after warm-up: the first quarter of the series, at least MIN_WARMUP_STEPS, left out."""
    recs = list(series)
    return recs[max(MIN_WARMUP_STEPS, int(len(recs) * WARMUP_FRACTION)):]


def steady_step_seconds(series: Iterable[StepMetrics]) -> float | None:
    """The median step time after warm-up (None while every step is still warm-up)."""
    steady = steady_steps(series)
    return statistics.median(r.step_seconds for r in steady) if steady else None


def summarize(series: Iterable[StepMetrics], window: int = ETA_WINDOW_STEPS, *,
              planned_step_seconds: float | None = None,
              planned_tokens_per_second: float | None = None) -> MetricsSummary | None:
    """Latest step, recent speed and ETA (mean step time of the recent steady steps × steps left; the warm-up steps
    count only while there is nothing else), and that speed beside the plan's when given; None before the first
    step."""
    recs = list(series)
    if not recs:
        return None
    last = recs[-1]
    steady = steady_steps(recs)
    recent = (steady or recs)[-window:]
    step_s = statistics.fmean(r.step_seconds for r in recent)
    tps = statistics.fmean(r.tokens_per_second for r in recent)
    rss = [m.host_rss_bytes for m in last.peak_memory if m.host_rss_bytes is not None]
    alloc = [m.allocated_bytes for m in last.peak_memory if m.allocated_bytes is not None]
    return MetricsSummary(
        step=last.step, total_steps=last.total_steps, epoch=last.epoch, loss=last.loss, loss_first=recs[0].loss,
        lr=last.lr, tokens_per_second=tps, step_seconds=step_s,
        eta_seconds=eta_seconds(last, step_s),
        elapsed_seconds=sum(r.step_seconds for r in recs), world_size=last.world_size,
        peak_host_rss_bytes=max(rss) if rss else None, peak_allocated_bytes=max(alloc) if alloc else None,
        versus=versus_plan(step_s, tps, planned_step_seconds, planned_tokens_per_second, warm_up_only=not steady))


@dataclass(frozen=True)
class RunSeries:
    """The whole run so far, step by step, for charts: every record of metrics.jsonl (not a recent window), and
    the plan's step time and tokens/s to draw beside the measured ones (None where plan.json has none)."""

    steps: tuple[int, ...]
    loss: tuple[float, ...]
    tokens_per_second: tuple[float, ...]
    step_seconds: tuple[float, ...]
    planned_step_seconds: float | None = None
    planned_tokens_per_second: float | None = None
    eval_steps: tuple[int, ...] = ()        # the steps that evaluated, and their eval loss
    eval_loss: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.steps)


def run_series(series: Iterable[StepMetrics], planned_step_seconds: float | None = None,
               planned_tokens_per_second: float | None = None) -> RunSeries:
    """All steps of one monotone series (read_metrics / MetricsTail.series) as chart columns, with the plan's."""
    recs = list(series)
    plan_s = planned_step_seconds if planned_step_seconds and planned_step_seconds > 0 else None
    plan_t = planned_tokens_per_second if planned_tokens_per_second and planned_tokens_per_second > 0 else None
    evals = [r for r in recs if r.eval_loss is not None]
    return RunSeries(tuple(r.step for r in recs), tuple(r.loss for r in recs),
                     tuple(r.tokens_per_second for r in recs), tuple(r.step_seconds for r in recs), plan_s, plan_t,
                     tuple(r.step for r in evals), tuple(r.eval_loss for r in evals if r.eval_loss is not None))

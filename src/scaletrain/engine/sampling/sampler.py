"""Live numbers for the monitor: GPUs (NVML, or recorded samples replayed), host processes, and the job itself.

Why here and not in the screen: the Textual monitor, `scaletrain monitor --headless` and the benchmark all read
the same snapshots, so sampling lives in the engine (no Textual, no torch) and every view only formats them.

  GpuSource     NvmlSource (pynvml, each field may fail alone, MIG slices under their parent, a lost GPU is an
                error row) or ReplaySource (JSONL recorded by `python -m scaletrain.engine.sampling.sampler --record`).
  HostSource    per-rank CPU % and RSS via psutil, found from the launcher's pids; host CPU and memory.
  RunWatcher    the run directory: metrics.jsonl (engine.metrics), per-rank log tails, status.json, the plan's
                predicted peak, and the early memory warning.
  Sampler       the fixed-cadence loop a thread runs (gpustat's cadence: sleep interval − query time).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.devices.nvml import GpuSample, _field, _load_nvml, sample as nvml_sample

DEFAULT_INTERVAL_S = 1.0          # the 1 Hz default
MIN_INTERVAL_S = 0.1              # gpustat's minimum watch interval
HISTORY_SAMPLES = 180             # sparkline history: 3 minutes at 1 Hz ("the last minutes")
LOG_TAIL_LINES = 400              # per rank, what the log panel can scroll back to
LOSS_HISTORY_STEPS = 2000         # loss plot points kept
RANK_DISCOVERY_EVERY_S = 5.0      # re-walk the launcher's process tree this often (ranks appear after start-up)
TAIL_READ_LIMIT_BYTES = 1 << 20   # first read of a big log: only its last MiB


# ---- GPU samples ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MigSample:
    """One MIG slice: NVML reports memory and processes; utilization is not supported on MIG."""

    parent_index: int
    mig_index: int
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    pids: tuple[int, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class GpuSnapshot:
    """One tick of all GPUs. `available` False: no NVML (a CPU run, or no driver), `reason` says why."""

    time_s: float
    gpus: tuple[GpuSample, ...] = ()
    names: tuple[str | None, ...] = ()
    migs: tuple[MigSample, ...] = ()
    available: bool = True
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "available": self.available, "reason": self.reason,
                "gpus": [{**asdict(g), "pids": list(g.pids), "name": n}
                         for g, n in zip(self.gpus, self.names or (None,) * len(self.gpus))],
                "migs": [{**asdict(m), "pids": list(m.pids)} for m in self.migs]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "GpuSnapshot":
        gpus, names = [], []
        known = set(GpuSample.__dataclass_fields__)
        for g in d.get("gpus") or ():
            names.append(g.get("name"))
            kw = {k: v for k, v in g.items() if k in known}
            kw["pids"] = tuple(kw.get("pids") or ())
            kw.setdefault("time_s", d.get("time_s", 0.0))
            gpus.append(GpuSample(**kw))
        migs = tuple(MigSample(**{**m, "pids": tuple(m.get("pids") or ())}) for m in d.get("migs") or ())
        return cls(time_s=float(d.get("time_s", 0.0)), gpus=tuple(gpus), names=tuple(names), migs=migs,
                   available=bool(d.get("available", True)), reason=d.get("reason"))


class GpuSource(Protocol):
    def read(self) -> GpuSnapshot: ...
    def close(self) -> None: ...


class NvmlSource:
    """NVML through nvidia-ml-py. Init failure is an answer (available=False), never an exception."""

    def __init__(self, loader: Callable[[], Any] = _load_nvml, now: Callable[[], float] = time.time):
        self._now = now
        self.nv: Any = None
        self.reason: str | None = None
        try:
            self.nv = loader()
        except ModuleNotFoundError:
            self.reason = "nvidia-ml-py is not installed"
        except Exception as e:  # NVMLError_LibraryNotFound / DriverNotLoaded: a CPU host
            self.reason = f"NVML unavailable: {e.__class__.__name__}: {e}".rstrip(": ")
        self.count = int(_field(self.nv.nvmlDeviceGetCount) or 0) if self.nv is not None else 0
        if self.nv is not None and self.count == 0:
            self.reason = "NVML found no GPU"
        self.names = tuple(self._name(i) for i in range(self.count))

    def _name(self, i: int) -> str | None:
        h = _field(lambda: self.nv.nvmlDeviceGetHandleByIndex(i))
        return _field(lambda: self.nv.nvmlDeviceGetName(h)) if h is not None else None

    @property
    def available(self) -> bool:
        return self.nv is not None and self.count > 0

    def read(self) -> GpuSnapshot:
        if not self.available:
            return GpuSnapshot(self._now(), available=False, reason=self.reason)
        gpus = tuple(nvml_sample(self.nv, self.count, self._now))
        return GpuSnapshot(gpus[0].time_s if gpus else self._now(), gpus, self.names, self._migs(gpus))

    def _migs(self, gpus: tuple[GpuSample, ...]) -> tuple[MigSample, ...]:
        nv = self.nv
        out: list[MigSample] = []
        for g in gpus:
            if g.error:
                continue
            h = _field(lambda: nv.nvmlDeviceGetHandleByIndex(g.index))
            mode = _field(lambda: nv.nvmlDeviceGetMigMode(h)) if h is not None else None
            current = mode[0] if isinstance(mode, (tuple, list)) else mode
            if not current:
                continue
            slots = _field(lambda: nv.nvmlDeviceGetMaxMigDeviceCount(h)) or 0
            for k in range(int(slots)):
                try:
                    mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                except Exception:
                    continue  # an empty slot (nvitop stops at the first; slots can be sparse after reconfiguring)
                mem = _field(lambda: nv.nvmlDeviceGetMemoryInfo(mh))
                procs = _field(lambda: nv.nvmlDeviceGetComputeRunningProcesses(mh)) or []
                out.append(MigSample(g.index, k, int(mem.used) if mem is not None else None,
                                     int(mem.total) if mem is not None else None,
                                     tuple(int(p.pid) for p in procs)))
        return tuple(out)

    def close(self) -> None:
        if self.nv is not None:
            _field(self.nv.nvmlShutdown)
            self.nv = None


class ReplaySource:
    """Recorded GpuSnapshots from a JSONL file, one per read; `loop` restarts at the end (else the last repeats)."""

    def __init__(self, path: str | os.PathLike[str], loop: bool = True):
        p = Path(path)
        try:
            lines = [ln for ln in p.read_text().splitlines() if ln.strip()]
        except FileNotFoundError:
            raise ScaletrainError(f"recorded samples {p} do not exist") from None
        snaps = []
        for n, ln in enumerate(lines, 1):
            try:
                snaps.append(GpuSnapshot.from_json(json.loads(ln)))
            except (ValueError, TypeError) as e:
                raise ScaletrainError(f"{p}:{n} is not a recorded sample ({e}); record with "
                                      "`python -m scaletrain.engine.sampling.sampler --record FILE`") from None
        if not snaps:
            raise ScaletrainError(f"{p} holds no samples")
        self.snapshots = snaps
        self.loop = loop
        self._i = 0

    def read(self) -> GpuSnapshot:
        s = self.snapshots[self._i]
        if self._i + 1 < len(self.snapshots):
            self._i += 1
        elif self.loop:
            self._i = 0
        return s

    def close(self) -> None:
        pass


def record(path: str | os.PathLike[str], seconds: float, interval_s: float = DEFAULT_INTERVAL_S,
           source: GpuSource | None = None) -> int:
    """Write `seconds` of live NVML samples as JSONL (fixtures for the replay source). Returns samples written."""
    src = source or NvmlSource()
    n = 0
    with open(path, "w") as f:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            f.write(json.dumps(src.read().to_json()) + "\n")
            f.flush()
            n += 1
            time.sleep(max(0.0, interval_s - (time.monotonic() - t0)))
    src.close()
    return n


# ---- host processes ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcSample:
    pid: int
    rank: int | None
    cpu_percent: float | None         # of one core (100 = one core busy)
    rss_bytes: int | None
    alive: bool = True


@dataclass(frozen=True)
class HostSnapshot:
    time_s: float
    cpu_percent: float | None         # whole host, all cores = 100
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    procs: tuple[ProcSample, ...] = ()

    def by_rank(self) -> dict[int, ProcSample]:
        return {p.rank: p for p in self.procs if p.rank is not None}


class HostSource:
    """psutil readings for the run's rank processes, found under the launcher's pids by their RANK variable."""

    def __init__(self, root_pids: Iterable[int] = (), rank_pids: dict[int, int] | None = None,
                 now: Callable[[], float] = time.time):
        import psutil  # a dev/runtime dependency; imported here so planning never loads it

        self.psutil = psutil
        self._now = now
        self.root_pids = tuple(int(p) for p in root_pids)
        self.rank_of: dict[int, int | None] = {int(p): int(r) for r, p in (rank_pids or {}).items()}
        self._procs: dict[int, Any] = {}
        self._last_discovery = -1e9
        psutil.cpu_percent(None)          # prime: the first call has no interval to measure against
        self._primed_at = time.monotonic()

    def set_pids(self, root_pids: Iterable[int] = (), rank_pids: dict[int, int] | None = None) -> None:
        """Follow the launcher's status.json: its rank pids when known (a relaunch replaces them), else its roots."""
        roots = tuple(int(p) for p in root_pids)
        if roots != self.root_pids:
            self.root_pids = roots
            self._last_discovery = -1e9
        if rank_pids:
            mapping = {int(p): int(r) for r, p in rank_pids.items()}
            if mapping != self.rank_of:
                self.rank_of = mapping
                self._procs = {pid: p for pid, p in self._procs.items() if pid in mapping}

    def _proc(self, pid: int) -> Any:
        p = self._procs.get(pid)
        if p is None:
            p = self.psutil.Process(pid)
            p.cpu_percent(None)
            self._procs[pid] = p
        return p

    def _discover(self) -> None:
        """Rank processes under the roots: the shallowest process carrying RANK (its workers inherit RANK too)."""
        ps = self.psutil
        found: dict[int, tuple[int, int]] = {}          # rank → (depth, pid)
        for root in self.root_pids:
            try:
                top = ps.Process(root)
                tree = [top, *top.children(recursive=True)]
            except (ps.NoSuchProcess, ps.AccessDenied):
                continue
            parent = {p.pid: p.ppid() for p in tree if p.is_running()}
            for p in tree:
                try:
                    env = p.environ()
                except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess, OSError):
                    continue
                if "RANK" not in env or "LOCAL_RANK" not in env or not env["RANK"].isdigit():
                    continue
                depth, q = 0, p.pid
                while q in parent and q != root:
                    q, depth = parent[q], depth + 1
                r = int(env["RANK"])
                if r not in found or depth < found[r][0]:
                    found[r] = (depth, p.pid)
        for r, (_, pid) in found.items():
            self.rank_of[pid] = r
        self._last_discovery = time.monotonic()

    def read(self) -> HostSnapshot:
        ps = self.psutil
        if (self.root_pids and not self.rank_of
                and time.monotonic() - self._last_discovery >= RANK_DISCOVERY_EVERY_S):
            self._discover()
        procs = []
        for pid, rank in sorted(self.rank_of.items(), key=lambda kv: (kv[1] is None, kv[1] or 0)):
            try:
                p = self._proc(pid)
                with p.oneshot():
                    if p.status() == ps.STATUS_ZOMBIE:
                        raise ps.ZombieProcess(pid)
                    procs.append(ProcSample(pid, rank, p.cpu_percent(None), int(p.memory_info().rss)))
            except (ps.NoSuchProcess, ps.ZombieProcess):
                procs.append(ProcSample(pid, rank, None, None, alive=False))
                self._procs.pop(pid, None)
            except ps.AccessDenied:
                procs.append(ProcSample(pid, rank, None, None))
        vm = ps.virtual_memory()
        cpu = ps.cpu_percent(None)
        if time.monotonic() - self._primed_at < MIN_INTERVAL_S:
            cpu = None                    # no interval yet to average over: N/A rather than a spurious 0 or 100 %
            procs = [replace(p, cpu_percent=None) for p in procs]
        return HostSnapshot(self._now(), cpu, int(vm.total - vm.available), int(vm.total), tuple(procs))

    def close(self) -> None:
        self._procs.clear()


# ---- the run directory ------------------------------------------------------------------------------------------
class LogTail:
    """Lines appended to one log since the last poll (offset-based, partial last line kept for later)."""

    def __init__(self, path: Path, rank: int | None):
        self.path = Path(path)
        self.rank = rank
        self._offset = 0
        self._pending = b""
        self._ino: int | None = None

    def poll(self) -> list[str]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        if self._ino is not None and (st.st_ino != self._ino or st.st_size < self._offset):
            self._offset, self._pending = 0, b""          # rotated or truncated (a relaunch): read it afresh
        if self._ino is None and st.st_size > TAIL_READ_LIMIT_BYTES:
            self._offset = st.st_size - TAIL_READ_LIMIT_BYTES
        self._ino = st.st_ino
        if st.st_size == self._offset:
            return []
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        self._offset += len(chunk)
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        return [ln.decode("utf-8", errors="replace").rstrip("\r") for ln in lines]


@dataclass(frozen=True)
class RankMemoryView:
    """Measured vs predicted peak for one rank; `warning` set when it is past the prediction by the headroom."""

    rank: int
    measured_bytes: int | None
    predicted_bytes: int | None
    what: str                          # "allocated" (GPU) or "host RSS" (CPU run)
    warning: str | None = None


@dataclass(frozen=True)
class RunStatus:
    state: str                         # "starting" | "running" | "finished" | "failed" | "interrupted" | "unknown"
    exit_code: int | None = None
    exit_codes: dict[int, int] = field(default_factory=dict)
    first_failing_rank: int | None = None
    pids: tuple[int, ...] = ()
    rank_pids: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class JobSnapshot:
    time_s: float
    status: RunStatus
    summary: Any = None                # engine.metrics.MetricsSummary, None before the first step
    losses: tuple[float, ...] = ()
    memory: tuple[RankMemoryView, ...] = ()
    new_log_lines: tuple[tuple[int | None, str], ...] = ()   # (rank, line) appended since the last poll
    warnings: tuple[str, ...] = ()
    new_steps: tuple[Any, ...] = ()    # engine.metrics.StepMetrics appended since the last poll


def memory_views(plan_json: dict[str, Any] | None, peak_memory: Iterable[Any]) -> tuple[RankMemoryView, ...]:
    """Per-rank measured peak against the plan's; warn past prediction + headroom (before the OOM, not after).

    Allocated is compared with the predicted allocated peak (both exclude the CUDA context and the allocator's
    reserve). A CPU run reports no allocator numbers, so its RSS is compared with the predicted per-process
    total. The margin is the plan's headroom: headroom_fraction × capacity.
    """
    from scaletrain.engine.units import fmt_bytes

    mem = (plan_json or {}).get("memory") or {}
    total = (mem.get("per_gpu_bytes") or {}).get("total")
    alloc_pred = mem.get("allocated_peak_bytes")
    cap = mem.get("capacity_bytes")
    usable = mem.get("usable_bytes")
    margin = int(cap * float(mem.get("headroom_fraction", 0.0))) if cap else None
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


def read_run_status(path: Path) -> RunStatus:
    """status.json (the launcher's): state, exit codes, first failing rank, pids. Absent → 'starting'."""
    from scaletrain.engine.doctor.diagnosis import status_codes

    try:
        st = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return RunStatus("starting")
    except (json.JSONDecodeError, OSError):
        return RunStatus("unknown")
    codes, first = status_codes(st)
    code = st.get("exit_code", st.get("returncode"))
    state = st.get("state") or st.get("status")
    if state not in ("starting", "running", "finished", "failed", "interrupted"):
        state = "running" if code is None else ("finished" if code == 0 else "failed")
    pids = st.get("pids") or []
    rank_pids: dict[int, int] = {}
    if isinstance(pids, dict):
        rank_pids = {int(k): int(v) for k, v in pids.items() if str(k).lstrip("-").isdigit() and v}
        roots = [int(v) for k, v in pids.items() if not str(k).lstrip("-").isdigit() and isinstance(v, int)]
    else:
        roots = [int(p) for p in pids if isinstance(p, int)]
    rp = st.get("rank_pids")
    if isinstance(rp, dict):
        rank_pids.update({int(k): int(v) for k, v in rp.items() if str(k).isdigit() and isinstance(v, int)})
    for key in ("pid", "launcher_pid"):
        if isinstance(st.get(key), int):
            roots.append(st[key])
    return RunStatus(state, code, codes, first, tuple(dict.fromkeys(roots)), rank_pids)


class RunWatcher:
    """Everything the job panel shows, polled from the run directory (cheap: stat + appended bytes)."""

    def __init__(self, run_dir: str | os.PathLike[str]):
        from scaletrain.engine.run.metrics import MetricsTail
        from scaletrain.engine.run.layout import RunDir

        self.run = RunDir(run_dir)
        if not self.run.path.is_dir():
            raise ScaletrainError(f"{self.run.path} is not a directory; give a run directory (it holds plan.json)")
        self.plan_json = self.run.read_plan() if self.run.plan.exists() else None
        if self.plan_json is None and not self.run.metrics.exists() and not self.run.logs.is_dir():
            raise ScaletrainError(f"{self.run.path} is not a run directory (no plan.json, metrics.jsonl or logs/)")
        self.metrics = MetricsTail(self.run.metrics)
        self.tails: dict[Path, LogTail] = {}
        self._seen_steps = 0                       # len(series) the cached numbers below were made from
        self._losses: tuple[float, ...] = ()
        self._summary: Any = None
        self._memory: tuple[RankMemoryView, ...] = ()

    @property
    def predicted_peak_bytes(self) -> int | None:
        return (((self.plan_json or {}).get("memory") or {}).get("per_gpu_bytes") or {}).get("total")

    @property
    def world_size(self) -> int | None:
        return ((self.plan_json or {}).get("hardware") or {}).get("world_size")

    @property
    def on_cpu(self) -> bool:
        return (((self.plan_json or {}).get("training") or {}).get("device") == "cpu"
                or ((self.plan_json or {}).get("hardware") or {}).get("gpu") == "CPU")

    def _log_tails(self) -> list[LogTail]:
        from scaletrain.engine.doctor.diagnosis import RE_RANK_FILE

        if self.run.logs.is_dir():
            for p in sorted(self.run.logs.glob("*.log")):
                if p not in self.tails:
                    m = RE_RANK_FILE.search(p.name)
                    self.tails[p] = LogTail(p, int(m.group(1)) if m else None)
        return list(self.tails.values())

    def poll(self) -> JobSnapshot:
        from scaletrain.engine.run.metrics import summarize

        new = self.metrics.poll()
        series = self.metrics.series
        if new or len(series) != self._seen_steps:     # the series only changes in poll (new steps, or a reset)
            self._seen_steps = len(series)
            self._losses = tuple(r.loss for r in series[-LOSS_HISTORY_STEPS:])
            self._summary = summarize(series) if series else None
            self._memory = memory_views(self.plan_json, series[-1].peak_memory) if series else ()
        summary, mem = self._summary, self._memory
        lines: list[tuple[int | None, str]] = []
        for t in self._log_tails():
            lines.extend((t.rank, ln) for ln in t.poll())
        status = read_run_status(self.run.status)
        warnings = tuple(m.warning for m in mem if m.warning)
        return JobSnapshot(time.time(), status, summary, self._losses, mem, tuple(lines), warnings, tuple(new))


# ---- the loop ---------------------------------------------------------------------------------------------------
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
        if not interval_s >= MIN_INTERVAL_S:
            raise ScaletrainError(f"--interval must be at least {MIN_INTERVAL_S} s (got {interval_s})")
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
                 replay: str | os.PathLike[str] | None = None, nvml: bool = True) -> Sampler:
    """The monitor's sources: NVML (or a replay file), host stats for the run's ranks, the run directory."""
    job = RunWatcher(run_dir) if run_dir is not None else None
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


def main(argv: list[str] | None = None) -> int:
    """`python -m scaletrain.engine.sampling.sampler --record FILE [--seconds N] [--interval S]`: record NVML fixtures."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m scaletrain.engine.sampling.sampler")
    p.add_argument("--record", required=True, metavar="FILE", help="JSONL file to write")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S)
    a = p.parse_args(argv)
    src = NvmlSource()
    if not src.available:
        print(f"scaletrain: error: {src.reason}", flush=True)
        return 2
    print(f"recorded {record(a.record, a.seconds, a.interval, src)} samples to {a.record}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

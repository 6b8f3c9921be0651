"""Host numbers for the monitor: per-rank CPU % and RSS via psutil, found under the launcher's pids; host CPU and
memory."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

RANK_DISCOVERY_EVERY_S = 5.0      # re-walk the launcher's process tree this often (ranks appear after start-up)
MIN_INTERVAL_S = 0.1              # gpustat's minimum watch interval: CPU % before it has no interval to average
MAX_INTERVAL_S = 3600.0           # an hour between samples: longer is a typo (and inf, 1e309, would never sample)


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



"""The launcher's view of the processes it started: every descendant ever seen, identified by (pid, start time).

Why: torchrun starts every rank with start_new_session=True, so the ranks are not in the launcher's process group
and a killed `accelerate launch` leaves them running. Tracking (pid, start time) means a recycled pid is never
signalled. Linux /proc only; no psutil.
"""

from __future__ import annotations

import os
from pathlib import Path

# Once the ranks are known, the launcher and its watchdog scan the process table this often instead of at every
# poll: a scan reads /proc/<pid>/stat of every process on the machine (py-spy on the 2-core VM: the watchdog's 4
# scans a second took 2.6 % of a core, time taken from the ranks). Stopping always scans first, so a live descendant
# is never missed; only one started and orphaned within the same interval could be.
TRACK_SECONDS = 2.0


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) from /proc/<pid>/stat; None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    try:
        return int(rest[1]), rest[0], int(rest[19])
    except (IndexError, ValueError):
        return None


class ProcessTree:
    """Every descendant of a root ever observed, identified by (pid, start time)."""

    def __init__(self, root: int):
        self.root = root
        self.known: dict[int, int] = {}
        st = _stat(root)
        if st:
            self.known[root] = st[2]

    def snapshot(self) -> bool:
        """Add the current descendants of the root and of every known process; True when something was new."""
        children: dict[int, list[int]] = {}
        starts: dict[int, int] = {}
        try:
            entries = os.listdir("/proc")
        except OSError:
            return False
        for name in entries:
            if not name.isdigit():
                continue
            st = _stat(int(name))
            if st:
                children.setdefault(st[0], []).append(int(name))
                starts[int(name)] = st[2]
        before = len(self.known)
        queue = [p for p in self.known if starts.get(p) == self.known[p]]
        while queue:
            p = queue.pop()
            for c in children.get(p, ()):
                if c not in self.known:
                    self.known[c] = starts[c]
                    queue.append(c)
        return len(self.known) > before

    def alive(self) -> list[int]:
        out = []
        for pid, start in self.known.items():
            st = _stat(pid)
            if st and st[2] == start and st[1] != "Z":
                out.append(pid)
        return sorted(out)

    def signal_all(self, sig: int) -> None:
        """Send sig to every live tracked process and its process group (ranks lead their own)."""
        for pid in self.alive():
            for fn, target in ((os.killpg, pid), (os.kill, pid)):
                try:
                    if fn is os.killpg and os.getpgid(pid) != pid:
                        continue
                    fn(target, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def rank_pids(self, single_process: bool = False) -> dict[int, int]:
        """Global rank → pid: the shallowest tracked process whose environment carries RANK. accelerate's
        single-process launcher sets no RANK: its one child is rank 0."""
        if single_process:
            kids = [p for p in self.alive() if (st := _stat(p)) and st[0] == self.root]
            return {0: kids[0]} if len(kids) == 1 else {}
        found: dict[int, tuple[int, int]] = {}
        for pid in self.alive():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            rank = next((e[5:] for e in env if e.startswith(b"RANK=")), None)
            if rank is None or not rank.isdigit() or pid == self.root:
                continue
            depth, p = 0, pid
            while p and p != self.root and depth < 64:
                st = _stat(p)
                p = st[0] if st else 0
                depth += 1
            r = int(rank)
            if r not in found or depth < found[r][1]:
                found[r] = (pid, depth)
        return {r: v[0] for r, v in sorted(found.items())}


def pid_alive(pid: int) -> bool:
    st = _stat(pid)
    return bool(st) and st[1] != "Z"


def process_start(pid: int) -> int | None:
    """A live process's start time (clock ticks after boot): with the pid, it names one process for good."""
    st = _stat(pid)
    return st[2] if st and st[1] != "Z" else None


def oom_kill_count() -> int | None:
    """The kernel's OOM kills since boot (/proc/vmstat oom_kill: every victim, cgroup limits included)."""
    try:
        with open("/proc/vmstat", "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None

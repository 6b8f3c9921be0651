"""status.json, the one module that writes and reads it: the launcher's record of one node's share of a run.

    {"state": "running" | "finished" | "failed" | "interrupted",
     "started", "argv", "machine_rank", "num_machines", "local_ranks",
     "pids": {"launcher": pid, "accelerate": pid, "<rank>": pid, ...}, "rank_pids": {"<rank>": pid},
     "tracked_pids": [...],
     once the run ended: "ended", "exit_code" (the training's: the first failing rank's, signal N → 128+N; 130
     after Ctrl-C), "launcher_exit_code" (accelerate's own), "first_failing_rank", "failing_rank_exit_code",
     "exit_codes" {"<rank>": code as torchrun reports it},
     "host", "launcher_start" (the launcher's identity), and when known: "reason" (how it ended, where the exit
     codes cannot say: a killed launcher stopped by its watchdog), "disk_full", "disk_free_bytes", "oom_kills"
     (the kernel's OOM kills on this host while the run lived, from /proc/vmstat: 0 clears the OOM killer),
     "restarts" [{"restart": n, "rank": r, "exit_code": c}] (torchelastic restarted every rank after rank r
     failed: train.max_restarts)}

The head node (and every single-node run) writes status.json; node R > 0 writes status-node-<R>.json
(layout.RunDir.node_status). A missing file reads as "starting", an unreadable one as "unknown", a "running" one
whose launcher is gone from this host as "interrupted".
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import DISK_FULL_ERRNOS, MAX_CONFIG_BYTES, atomic_write, read_text_bounded
from scaletrain.engine.launch.processes import process_start

STATES = ("starting", "running", "finished", "failed", "interrupted", "unknown")
OVER = ("finished", "failed", "interrupted")


def _when(stamp: str | None) -> datetime | None:
    """A status time ("2026-12-03T15:01:25", the launcher's local clock), or None when absent or not a time."""
    try:
        return datetime.fromisoformat(stamp) if stamp else None
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class RunStatus:
    state: str                                       # one of STATES
    started: str | None = None
    argv: tuple[str, ...] = ()
    machine_rank: int | None = None
    num_machines: int | None = None
    local_ranks: tuple[int, ...] = ()
    launcher_pid: int | None = None                  # the `scaletrain launch` process
    accelerate_pid: int | None = None                # `accelerate launch` (torchrun's agent below it)
    rank_pids: dict[int, int] = field(default_factory=dict)
    tracked_pids: tuple[int, ...] = ()
    ended: str | None = None                         # set together with the exit fields below
    exit_code: int | None = None
    launcher_exit_code: int | None = None
    first_failing_rank: int | None = None
    failing_rank_exit_code: int | None = None
    exit_codes: dict[int, int] = field(default_factory=dict)
    host: str | None = None                          # where the launcher runs (its pid means something there only)
    launcher_start: int | None = None                # the launcher's start time (processes.process_start)
    reason: str | None = None                        # why it ended, when the exit codes do not say (watchdog, stale)
    disk_full: bool = False                          # a write of the launcher's (logs, status) met a full disk
    disk_free_bytes: int | None = None               # free space on the run directory's filesystem at the end
    oom_kills: int | None = None                     # the kernel's OOM kills on this host during the run
    # torchelastic's worker-group restarts (train.max_restarts): (restart number, the rank that failed, its exit
    # code as torchrun reports it), elastic.restarts
    restarts: tuple[tuple[int, int | None, int | None], ...] = ()

    @property
    def pids(self) -> tuple[int, ...]:
        """The launcher's own processes (the roots under which the ranks run)."""
        return tuple(p for p in (self.launcher_pid, self.accelerate_pid) if p is not None)

    @property
    def over(self) -> bool:
        return self.state in OVER

    @property
    def stale(self) -> bool:
        """Says starting or running, but its launcher (on this host) is gone: killed along with its watchdog, or
        before it could start one."""
        if self.state not in ("starting", "running") or self.launcher_pid is None \
                or self.host != socket.gethostname():
            return False
        start = process_start(self.launcher_pid)
        return start is None or (self.launcher_start is not None and start != self.launcher_start)

    def wall_seconds(self, now: datetime | None = None) -> float | None:
        """How long this launch has run, by the launcher's clock: started to ended once it is over; to `now` while it
        runs on this host (another host's clock, or a status without times, says nothing: None). Not the steps'
        time: the model load, checkpoints and the export count too."""
        start, end = _when(self.started), _when(self.ended)
        if start is None:
            return None
        if end is None:
            if self.over or now is None or self.host not in (None, socket.gethostname()):
                return None
            end = now
        seconds = (end - start).total_seconds()
        return seconds if seconds >= 0 else None

    def running_elsewhere(self) -> int | None:
        """The launcher pid when this status says running and that process (not this one) is alive."""
        pid = self.launcher_pid
        if self.state != "running" or pid is None or pid == os.getpid():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid

    def to_json(self) -> dict[str, Any]:
        pids: dict[str, int] = {}
        if self.launcher_pid is not None:
            pids["launcher"] = self.launcher_pid
        if self.accelerate_pid is not None:
            pids["accelerate"] = self.accelerate_pid
        pids.update({str(r): p for r, p in sorted(self.rank_pids.items())})
        out: dict[str, Any] = {
            "state": self.state, "started": self.started, "argv": list(self.argv), "machine_rank": self.machine_rank,
            "num_machines": self.num_machines, "local_ranks": list(self.local_ranks), "pids": pids,
            "rank_pids": {str(r): p for r, p in sorted(self.rank_pids.items())},
            "tracked_pids": list(self.tracked_pids),
        }
        if self.ended is not None:
            out.update(ended=self.ended, exit_code=self.exit_code, launcher_exit_code=self.launcher_exit_code,
                       first_failing_rank=self.first_failing_rank, failing_rank_exit_code=self.failing_rank_exit_code,
                       exit_codes={str(r): c for r, c in sorted(self.exit_codes.items())})
        for key in ("host", "launcher_start", "reason", "disk_free_bytes", "oom_kills"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.disk_full:
            out["disk_full"] = True
        if self.restarts:
            out["restarts"] = [{"restart": n, "rank": r, "exit_code": c} for n, r, c in self.restarts]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RunStatus":
        """Total on any JSON object: a field of the wrong type (an exit code "x", a pid 1.5, argv 7) reads as
        absent, never as an exception, so a "failed" record with junk beside it still says failed (a monitor waits
        for a final state: it must see one)."""
        code = _int(d.get("exit_code"))
        state = d.get("state")
        if state not in STATES:
            state = "running" if code is None else ("finished" if code == 0 else "failed")
        pids = d.get("pids") if isinstance(d.get("pids"), dict) else {}
        rank_pids = _int_map(pids, signed_keys=True)
        rank_pids.update(_int_map(d.get("rank_pids")))
        rank_pids = {r: p for r, p in rank_pids.items() if p}
        return cls(state=state, started=_opt(d, "started", str), argv=_strs(d.get("argv")),
                   machine_rank=_int(d.get("machine_rank")), num_machines=_int(d.get("num_machines")),
                   local_ranks=_ints(d.get("local_ranks")), launcher_pid=_int(pids.get("launcher")),
                   accelerate_pid=_int(pids.get("accelerate")), rank_pids=rank_pids,
                   tracked_pids=_ints(d.get("tracked_pids")), ended=_opt(d, "ended", str), exit_code=code,
                   launcher_exit_code=_int(d.get("launcher_exit_code")),
                   first_failing_rank=_int(d.get("first_failing_rank")),
                   failing_rank_exit_code=_int(d.get("failing_rank_exit_code")),
                   exit_codes=_int_map(d.get("exit_codes")),
                   host=_opt(d, "host", str), launcher_start=_int(d.get("launcher_start")),
                   reason=_opt(d, "reason", str), disk_full=d.get("disk_full") is True,
                   disk_free_bytes=_int(d.get("disk_free_bytes")), oom_kills=_int(d.get("oom_kills")),
                   restarts=_restarts(d.get("restarts")))


def _restarts(v: Any) -> tuple[tuple[int, int | None, int | None], ...]:
    """status.json's "restarts": entries that are not {"restart": n, ...} objects are left out."""
    items = v if isinstance(v, list) else []
    return tuple((n, _int(e.get("rank")), _int(e.get("exit_code"))) for e in items
                 if isinstance(e, dict) and (n := _int(e.get("restart"))) is not None)


MAX_STATUS_INT = 1 << 63              # a pid, an exit code, a byte count: anything larger is not one


def _int(v: Any) -> int | None:
    """A whole number as status.json writes it (an integral float such as 1.0 too), else None."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) and abs(v) < MAX_STATUS_INT else None


def _key(k: Any, signed: bool) -> int | None:
    text = str(k)
    body = text[1:] if signed and text.startswith("-") else text
    return int(text) if 0 < len(body) <= 18 and body.isascii() and body.isdigit() else None


def _int_map(raw: Any, signed_keys: bool = False) -> dict[int, int]:
    """{"<rank>": whole number} entries of a JSON object; anything else (a non-numeric key or value) is left out."""
    if not isinstance(raw, dict):
        return {}
    out = {}
    for k, v in raw.items():
        key, value = _key(k, signed_keys), _int(v)
        if key is not None and value is not None:
            out[key] = value
    return out


def _ints(raw: Any) -> tuple[int, ...]:
    return tuple(x for x in (_int(v) for v in raw) if x is not None) if isinstance(raw, list) else ()


def _opt(d: dict[str, Any], key: str, kind: type) -> Any:
    v = d.get(key)
    return v if isinstance(v, kind) and not isinstance(v, bool) else None


def _strs(raw: Any) -> tuple[str, ...]:
    return tuple(v for v in raw if isinstance(v, str)) if isinstance(raw, list) else ()


def read_status(path: str | Path) -> RunStatus:
    """One node's status file: absent → "starting", unreadable → "unknown". A "running" status whose launcher on
    this host is gone (killed together with its watchdog) reads as "interrupted", with the reason (so does a
    "starting" one)."""
    try:
        d = json.loads(read_text_bounded(path, MAX_CONFIG_BYTES, Path(path).name))
    except FileNotFoundError:
        return RunStatus("starting")
    except ScaletrainError as e:          # a FIFO, a device, a folder or a huge file in its place: never waited on
        return RunStatus("unknown", reason=str(e))
    except (ValueError, OSError, RecursionError) as e:
        return RunStatus("unknown", reason=f"{Path(path).name} is unreadable ({type(e).__name__})")
    if not isinstance(d, dict):
        return RunStatus("unknown", reason=f"{Path(path).name} holds a JSON {type(d).__name__}, not the launcher's "
                                           "record (an object with a state)")
    try:
        st = RunStatus.from_json(d)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return RunStatus("unknown", reason=f"{Path(path).name} has a field of the wrong type")
    if st.stale:
        st = replace(st, state="interrupted", reason=f"its launcher (pid {st.launcher_pid}) is gone without "
                                                     "recording how the run ended")
    return st


class StatusWriter:
    """The launcher's side: every change is written at once (atomically), so a monitor never reads half of it.

    On a full disk the atomic write (a new file) fails; the change is then written over the old file in place (its
    blocks are already allocated), so status.json still ends in a final state. A write that fails even so is
    remembered (`failed`), never raised: losing a status line must not stop the run or its clean-up.
    """

    def __init__(self, path: Path, status: RunStatus | None = None):
        self.path = Path(path)
        self.status = status or RunStatus("starting")
        self.failed: OSError | None = None

    def write(self, **changes: Any) -> RunStatus:
        self.status = replace(self.status, **changes)
        text = json.dumps(self.status.to_json(), indent=2) + "\n"
        try:
            atomic_write(self.path, text, backup=False)
        except OSError as e:
            if e.errno in DISK_FULL_ERRNOS and not self.status.disk_full:
                self.status = replace(self.status, disk_full=True)
                text = json.dumps(self.status.to_json(), indent=2) + "\n"
            try:
                _write_in_place(self.path, text)
            except OSError as e2:
                self.failed = e2
        return self.status


def _write_in_place(path: Path, text: str) -> None:
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)

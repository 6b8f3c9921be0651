"""status.json, the one module that writes and reads it: the launcher's record of one node's share of a run.

    {"state": "running" | "finished" | "failed" | "interrupted",
     "started", "argv", "machine_rank", "num_machines", "local_ranks",
     "pids": {"launcher": pid, "accelerate": pid, "<rank>": pid, ...}, "rank_pids": {"<rank>": pid},
     "tracked_pids": [...],
     once the run ended: "ended", "exit_code" (the training's: the first failing rank's, signal N → 128+N; 130
     after Ctrl-C), "launcher_exit_code" (accelerate's own), "first_failing_rank", "failing_rank_exit_code",
     "exit_codes" {"<rank>": code as torchrun reports it}}

The head node (and every single-node run) writes status.json; node R > 0 writes status-node-<R>.json
(layout.RunDir.node_status). A missing file reads as "starting", an unreadable one as "unknown".
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scaletrain.engine.fileio import atomic_write

STATES = ("starting", "running", "finished", "failed", "interrupted", "unknown")
OVER = ("finished", "failed", "interrupted")


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

    @property
    def pids(self) -> tuple[int, ...]:
        """The launcher's own processes (the roots under which the ranks run)."""
        return tuple(p for p in (self.launcher_pid, self.accelerate_pid) if p is not None)

    @property
    def over(self) -> bool:
        return self.state in OVER

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
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RunStatus":
        code = d.get("exit_code")
        state = d.get("state")
        if state not in STATES:
            state = "running" if code is None else ("finished" if code == 0 else "failed")
        pids = d.get("pids") if isinstance(d.get("pids"), dict) else {}
        rank_pids = {int(k): int(v) for k, v in pids.items() if str(k).lstrip("-").isdigit() and v}
        rp = d.get("rank_pids")
        if isinstance(rp, dict):
            rank_pids.update({int(k): int(v) for k, v in rp.items() if str(k).isdigit() and isinstance(v, int)})
        raw = d.get("exit_codes")
        codes = {int(k): int(v) for k, v in raw.items() if v is not None} if isinstance(raw, dict) else {}
        first = d.get("first_failing_rank")

        def pid(key: str) -> int | None:
            v = pids.get(key)
            return v if isinstance(v, int) else None

        return cls(state=state, started=d.get("started"), argv=tuple(d.get("argv") or ()),
                   machine_rank=d.get("machine_rank"), num_machines=d.get("num_machines"),
                   local_ranks=tuple(d.get("local_ranks") or ()), launcher_pid=pid("launcher"),
                   accelerate_pid=pid("accelerate"), rank_pids=rank_pids,
                   tracked_pids=tuple(d.get("tracked_pids") or ()), ended=d.get("ended"), exit_code=code,
                   launcher_exit_code=d.get("launcher_exit_code"),
                   first_failing_rank=int(first) if first is not None else None,
                   failing_rank_exit_code=d.get("failing_rank_exit_code"), exit_codes=codes)


def read_status(path: str | Path) -> RunStatus:
    """One node's status file: absent → "starting", unreadable → "unknown"."""
    try:
        d = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return RunStatus("starting")
    except (ValueError, OSError):
        return RunStatus("unknown")
    if not isinstance(d, dict):
        return RunStatus("unknown")
    return RunStatus.from_json(d)


class StatusWriter:
    """The launcher's side: every change is written at once (atomically), so a monitor never reads half of it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.status = RunStatus("starting")

    def write(self, **changes: Any) -> RunStatus:
        self.status = replace(self.status, **changes)
        atomic_write(self.path, json.dumps(self.status.to_json(), indent=2) + "\n", backup=False)
        return self.status

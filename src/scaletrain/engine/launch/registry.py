"""The runs this user launched on this machine, wherever their folders are: `scaletrain runs`, and `scaletrain
monitor` without a folder (the newest running run).

Why a registry: a run directory can be anywhere (--run-dir), and a detached run has no terminal to find it by. Every
launch writes one small file, atomically, under the user's state directory:

    $XDG_STATE_HOME/scaletrain/runs/<hash of the folder>.json   (~/.local/state/... when XDG_STATE_HOME is unset)
    {"path": "/abs/run", "launched": "2025-...", "host": "node1", "launcher_pid": 123, "launcher_start": 456}

One file per run folder (a relaunch rewrites it). An entry whose folder is gone is pruned when listed. What a row
shows is read from the run folder itself (status.json, metrics.jsonl, plan.json), never stored here. No torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import atomic_write
from scaletrain.engine.launch.processes import process_start
from scaletrain.engine.launch.status import RunStatus, read_status
from scaletrain.engine.run.layout import RunDir

STATE_ENV = "XDG_STATE_HOME"
RUNS_SUBDIR = ("scaletrain", "runs")
MAX_ENTRY_BYTES = 4096                 # an entry is ~200 bytes; anything bigger is not ours
METRICS_TAIL_BYTES = 256 * 1024        # the newest records of metrics.jsonl (a long run's file is not read whole)
DIED = "died"                          # the launcher is gone and status.json never got a final state
LIVE_STATES = ("starting", "running")


def registry_dir() -> Path:
    base = os.environ.get(STATE_ENV) or str(Path.home() / ".local" / "state")
    return Path(base).expanduser().joinpath(*RUNS_SUBDIR)


def _entry_path(run_path: Path) -> Path:
    return registry_dir() / f"{hashlib.sha256(str(run_path).encode()).hexdigest()[:20]}.json"


def register_run(run_path: str | os.PathLike[str], launcher_pid: int | None = None) -> Path:
    """Record a launch of `run_path` (atomically; a relaunch replaces the entry). Raises OSError when the state
    directory cannot be written (the launcher warns and runs on)."""
    path = Path(run_path).resolve()
    pid = os.getpid() if launcher_pid is None else launcher_pid
    entry = {"path": str(path), "launched": datetime.now().isoformat(timespec="seconds"),
             "host": socket.gethostname(), "launcher_pid": pid, "launcher_start": process_start(pid)}
    target = _entry_path(path)
    atomic_write(target, json.dumps(entry, indent=2) + "\n", backup=False)
    return target


def register_quietly(run_path: str | os.PathLike[str]) -> str | None:
    """register_run for the launcher: a state directory it cannot write is a warning (returned), never a stop."""
    try:
        register_run(run_path)
    except OSError as e:
        return f"scaletrain: warning: cannot record this run under {registry_dir()} ({e.strerror or e}); " \
               "`scaletrain runs` will not list it"
    return None


@dataclass(frozen=True)
class RunRow:
    """One registered run as `scaletrain runs` shows it; every number comes from the run folder."""

    path: Path
    launched: str
    state: str                              # status.json's state, or DIED
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    eta_seconds: float | None = None        # None once the run is over (or before its first step)
    peak_bytes: int | None = None           # measured: allocated (GPU) or host RSS (CPU), the highest rank's
    peak_kind: str | None = None            # "allocated" or "host RSS"
    planned_bytes: int | None = None        # the plan's predicted per-device total
    nodes: int | None = None
    devices_per_node: int | None = None
    on_cpu: bool = False
    launcher_pid: int | None = None
    exit_code: int | None = None
    reason: str | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def to_json(self) -> dict[str, Any]:
        return {"folder": str(self.path), "launched": self.launched, "state": self.state, "step": self.step,
                "total_steps": self.total_steps, "loss": self.loss, "eta_seconds": self.eta_seconds,
                "peak_bytes": self.peak_bytes, "peak_kind": self.peak_kind, "planned_peak_bytes": self.planned_bytes,
                "nodes": self.nodes, "devices_per_node": self.devices_per_node,
                "device": "cpu" if self.on_cpu else "gpu", "launcher_pid": self.launcher_pid,
                "exit_code": self.exit_code, "reason": self.reason}


def _read_entry(p: Path) -> dict[str, Any] | None:
    try:
        if p.stat().st_size > MAX_ENTRY_BYTES:
            return None
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    return d if isinstance(d, dict) and isinstance(d.get("path"), str) else None


def _state(st: RunStatus, entry: dict[str, Any]) -> str:
    """DIED where the launcher is gone without a final state: read_status reports such a status as "interrupted"
    with no end time (a launcher's or watchdog's final write always has one); a run whose launcher died before it
    wrote status.json at all is one whose registered launcher is gone."""
    if st.state == "interrupted" and st.ended is None:
        return DIED
    if st.state == "starting" and entry.get("host") == socket.gethostname():
        pid, start = entry.get("launcher_pid"), entry.get("launcher_start")
        if isinstance(pid, int) and (process_start(pid) is None or process_start(pid) != start):
            return DIED
    return st.state


def _tail_summary(run: RunDir) -> Any:
    from scaletrain.engine.run.metrics import read_metrics_tail, summarize

    return summarize(read_metrics_tail(run.metrics, METRICS_TAIL_BYTES))


def read_row(run_path: Path, entry: dict[str, Any]) -> RunRow:
    from scaletrain.engine.run.plan_document import read_plan_document

    run = RunDir(run_path)
    st = read_status(run.status)
    state = _state(st, entry)
    s = _tail_summary(run)
    planned = nodes = per_node = None
    on_cpu = False
    try:
        doc = read_plan_document(run.plan)
        planned, per_node, on_cpu = doc.predicted_total_bytes, doc.gpus_per_node, doc.on_cpu
        ws = doc.world_size
        nodes = max(1, ws // per_node) if isinstance(ws, int) and isinstance(per_node, int) and per_node else None
    except ScaletrainError:
        pass
    peak, kind = (None, None)
    if s is not None:
        peak, kind = ((s.peak_allocated_bytes, "allocated") if s.peak_allocated_bytes is not None
                      else (s.peak_host_rss_bytes, "host RSS") if s.peak_host_rss_bytes is not None else (None, None))
    return RunRow(run.path, str(entry.get("launched") or ""), state,
                  step=s.step if s else None, total_steps=s.total_steps if s else None, loss=s.loss if s else None,
                  eta_seconds=s.eta_seconds if s is not None and state in LIVE_STATES else None,
                  peak_bytes=peak, peak_kind=kind, planned_bytes=planned, nodes=nodes, devices_per_node=per_node,
                  on_cpu=on_cpu, launcher_pid=st.launcher_pid or entry.get("launcher_pid"), exit_code=st.exit_code,
                  reason=st.reason)


def list_runs() -> list[RunRow]:
    """Every registered run whose folder still exists, newest launch first; entries of gone folders are removed."""
    folder = registry_dir()
    try:
        files = sorted(folder.glob("*.json"))
    except OSError:
        return []
    rows = []
    for p in files:
        entry = _read_entry(p)
        if entry is None:
            continue
        run_path = Path(entry["path"])
        if not RunDir(run_path).plan.is_file():
            try:
                p.unlink()
            except OSError:
                pass
            continue
        rows.append(read_row(run_path, entry))
    return sorted(rows, key=lambda r: r.launched, reverse=True)


def newest_running() -> RunRow | None:
    return next((r for r in list_runs() if r.live), None)

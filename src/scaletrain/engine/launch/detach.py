"""Runs that outlive the window: start the launcher in its own session, and stop a run explicitly.

Why: a launcher running inside the wizard or the monitor (a thread of the TUI) or in a terminal's process group dies
with them — a closed SSH session stopped every rank, `q` in the monitor killed a run it had just relaunched. A
detached launch runs

    python -m scaletrain.engine.launch.detach RUN_DIR [--resume] [--machine-rank R] [--main-process-ip IP]

with start_new_session=True (no controlling terminal: a hang-up or Ctrl-C there never reaches it), stdin from
/dev/null and its output appended to the run's launcher log. It is the same launcher as `scaletrain launch` in the
foreground (launcher.launch: its watchdog, status.json, the lock, the registry entry); only where it runs differs.
start_detached checks the launch first (prepare_launch: every refusal is one line here, not in a log) and returns
once status.json names the new launcher as running.

stop_run ends a run from anywhere: SIGINT to its launcher (it stops every rank as after Ctrl-C: SIGINT to accelerate,
then SIGTERM, then SIGKILL to every tracked process), SIGTERM if it is still there after its own grace, SIGKILL after
that (its watchdog then stops what is left and writes the final state); it returns when the run directory's lock is
free (no process of the run is left) and status.json is final.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import os_error_reason
from scaletrain.engine.launch.processes import process_start
from scaletrain.engine.launch.runlock import RunLock
from scaletrain.engine.launch.status import RunStatus, read_status
from scaletrain.engine.run.layout import RunDir

START_WAIT_SECONDS = 30.0       # for the new launcher to write "running" (imports and the watchdog take ~1-3 s)
POLL_SECONDS = 0.1
# stop: after SIGINT the launcher itself waits up to 20 s (SIGINT) + 5 s (SIGTERM) + 5 s (SIGKILL) for the ranks
STOP_WAITS = ((signal.SIGINT, 45.0), (signal.SIGTERM, 15.0), (signal.SIGKILL, 30.0))
LOCK_WAIT_SECONDS = 30.0        # after the launcher: its watchdog (holding the lock) finishes its clean-up
ERROR_PREFIX = "scaletrain: error: "


@dataclass(frozen=True)
class Detached:
    run_dir: Path
    pid: int                    # the detached launcher
    state: str                  # status.json's state when start_detached returned ("running", or "starting")
    log: Path                   # where its own output goes
    notes: tuple[str, ...] = ()  # what the launch's checks said (prepare_launch), in its log too


def detached_argv(run_dir: Path, *, resume: bool = False, machine_rank: int | None = None,
                  main_process_ip: str | None = None, script: str | None = None,
                  script_args: Sequence[str] = ()) -> list[str]:
    argv = [sys.executable, "-m", "scaletrain.engine.launch.detach", str(run_dir)]
    if resume:
        argv.append("--resume")
    if machine_rank is not None:
        argv += ["--machine-rank", str(machine_rank)]
    if main_process_ip:
        argv += ["--main-process-ip", main_process_ip]
    if script:
        argv += ["--script", script, "--", *script_args]
    return argv


def start_detached(run_dir: str | os.PathLike[str], *, resume: bool = False, env: dict[str, str] | None = None,
                   machine_rank: int | None = None, main_process_ip: str | None = None, script: str | None = None,
                   script_args: Sequence[str] = (), wait_s: float = START_WAIT_SECONDS,
                   progress: bool | None = None) -> Detached:
    """Check the launch (and fetch its hub files here, `progress`: a download bar, None: on a terminal), start its
    launcher in a session of its own and return once it runs (one line on error)."""
    from scaletrain.engine.launch.launcher import prepare_launch

    prep = prepare_launch(run_dir, machine_rank=machine_rank, main_process_ip=main_process_ip, resume=resume,
                          script=script, script_args=script_args, progress=progress)
    if prep.lock is not None:
        prep.lock.release()            # the launcher takes it again (a launch that slips in between is refused there)
    argv = detached_argv(prep.run.path, resume=resume, machine_rank=machine_rank, main_process_ip=main_process_ip,
                         script=str(Path(script).expanduser().resolve()) if script else None,
                         script_args=script_args)
    log = prep.launcher_log
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "ab")
        out.write("".join(f"scaletrain: note: {n}\n" for n in prep.notes).encode())
        out.flush()
    except OSError as e:
        raise ScaletrainError(f"cannot write {log}: {os_error_reason(e)}") from None
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=str(prep.run.path), start_new_session=True, close_fds=True)
    except OSError as e:
        raise ScaletrainError(f"cannot start the launcher ({os_error_reason(e)})") from None
    finally:
        out.close()
    state = _wait_running(proc, prep.status, log, wait_s)
    return Detached(prep.run.path, proc.pid, state, log, prep.notes)


def _wait_running(proc: subprocess.Popen, status: Path, log: Path, wait_s: float) -> str:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        st = read_status(status)
        if st.launcher_pid == proc.pid and st.state != "starting":
            return st.state
        if proc.poll() is not None:
            st = read_status(status)
            if st.launcher_pid == proc.pid and st.over:
                return st.state                       # it ran and ended already (a very short run)
            raise ScaletrainError(_error_line(log) or f"the launcher exited with code {proc.returncode} before the "
                                                      f"run started; see {log}")
        time.sleep(POLL_SECONDS)
    return read_status(status).state


def _error_line(log: Path) -> str | None:
    """The detached launcher's own one-line refusal (the last 'scaletrain: error: …' in its log)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return next((ln[len(ERROR_PREFIX):] for ln in reversed(lines) if ln.startswith(ERROR_PREFIX)), None)


# ---- stopping --------------------------------------------------------------------------------------------------
def _launcher_alive(st: RunStatus) -> bool:
    pid = st.launcher_pid
    if pid is None:
        return False
    start = process_start(pid)
    return start is not None and (st.launcher_start is None or start == st.launcher_start)


def state_text(st: RunStatus) -> str:
    """'finished, exit code 0' (or the state alone before it has one): what stop's answers say of the status."""
    return st.state + (f", exit code {st.exit_code}" if st.exit_code is not None else "")


def not_running(st: RunStatus) -> str:
    """Why stop_run stopped nothing, as the CLI and the monitor say it: the run is over, or its status.json says it
    runs while no launcher of it is alive here (a status written by hand, or a launcher gone without its record)."""
    if st.state not in ("starting", "running"):
        return f"not running (status: {state_text(st)})"
    if st.launcher_pid is None:
        return f"not running: its status.json says {st.state} but names no launcher process"
    return (f"not running: its status.json says {st.state}, but its launcher (pid {st.launcher_pid}) is not alive on "
            "this machine")


def stop_run(run_dir: str | os.PathLike[str], *, machine_rank: int | None = None,
             waits: tuple[tuple[int, float], ...] = STOP_WAITS) -> tuple[RunStatus, bool]:
    """Stop a running run (every rank, then its launcher); returns (status.json after, whether this call stopped
    it). A run that is not running is left as it is; a run directory that is not one is one line."""
    run = RunDir(run_dir)
    if not run.plan.is_file():
        raise ScaletrainError(f"{run.path} is not a run directory (no {run.plan.name}); `scaletrain runs` lists "
                              "the runs launched here")
    path = run.node_status(machine_rank)
    st = read_status(path)
    deadline = time.monotonic() + START_WAIT_SECONDS
    while st.state == "starting" and _launcher_alive(st) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)          # its signal handlers are installed once it says running
        st = read_status(path)
    if st.state in ("starting", "running") and st.host is not None and st.host != socket.gethostname():
        raise ScaletrainError(f"{run.path} runs on {st.host}, not on this machine; stop it there")
    if not _launcher_alive(st) or st.state not in ("starting", "running"):
        return st, False
    for sig, wait_s in waits:
        try:
            os.kill(st.launcher_pid, sig)       # type: ignore[arg-type]
        except ProcessLookupError:
            break
        except PermissionError:
            raise ScaletrainError(f"launcher pid {st.launcher_pid} of {run.path} belongs to another user") from None
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _launcher_alive(st):
            time.sleep(POLL_SECONDS)
        if not _launcher_alive(st):
            break
    _wait_for_lock(run, machine_rank)
    return read_status(path), True


def _wait_for_lock(run: RunDir, machine_rank: int | None) -> None:
    """The watchdog holds the run's lock until the last process is gone: taking it means nothing is left."""
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            RunLock(run.node_lock(machine_rank)).acquire(str(run.path)).release()
            return
        except ScaletrainError:
            if time.monotonic() > deadline:
                raise ScaletrainError(f"{run.path}: processes of the run are still stopping after "
                                      f"{LOCK_WAIT_SECONDS:.0f} s; see `scaletrain runs`") from None
            time.sleep(POLL_SECONDS)


# ---- the detached launcher's entry point -----------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """python -m scaletrain.engine.launch.detach RUN_DIR …: the launcher with no view (its output: the log)."""
    from scaletrain.engine.launch.launcher import launch

    p = argparse.ArgumentParser(prog="python -m scaletrain.engine.launch.detach")
    p.add_argument("run_dir")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--machine-rank", type=int)
    p.add_argument("--main-process-ip")
    p.add_argument("--script")
    args = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, tail = args[:cut], args[cut + 1:]
    ns = p.parse_args(args)
    try:
        return launch(ns.run_dir, resume=ns.resume, machine_rank=ns.machine_rank,
                      main_process_ip=ns.main_process_ip, script=ns.script, script_args=tuple(tail)).exit_code
    except ScaletrainError as e:
        print(f"{ERROR_PREFIX}{e}", file=sys.stderr, flush=True)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())

"""The launcher's watchdog: a small process that outlives a killed launcher and stops everything it started.

Why: torchrun starts every rank in its own session, and a launcher killed with SIGKILL (or dying any way that runs
no Python `finally`) leaves `accelerate launch` and every rank training under PID 1, with status.json saying
"running" for ever. No signal handler can help a SIGKILLed process, so the clean-up lives in another one:

    python -m scaletrain.engine.launch.watchdog --root ACCELERATE_PID --launcher PID --status status.json

started by the launcher in its own session (a terminal's hang-up or Ctrl-C does not reach it) with a pipe on its
stdin. It tracks the root's process tree (processes.ProcessTree, every descendant by pid and start time). When
the launcher ends normally it writes "done" and the watchdog exits. When the pipe closes without "done" the
launcher is dead: the watchdog sends SIGTERM to every tracked process and process group, SIGKILL after a grace
period, waits until none is left and writes status.json's final state ("interrupted", with the reason). It
inherits the run directory's lock (runlock.py), so a new launch is refused until that clean-up is over.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from scaletrain.engine.launch.processes import TRACK_SECONDS, ProcessTree
from scaletrain.engine.launch.status import StatusWriter, read_status

POLL_SECONDS = 0.25
# The process table is scanned at every poll while the tree grows (ranks being started) and for SETTLE_SECONDS
# after it last grew, then every TRACK_SECONDS (processes.py says why)
SETTLE_SECONDS = 10.0
TERM_GRACE_SECONDS = 10.0          # after SIGTERM (torchrun forwards it to the ranks), then SIGKILL
KILL_WAIT_SECONDS = 10.0
DONE = b"done"
EXIT_INTERRUPTED = 130
START_WAIT_SECONDS = 10.0          # for the watchdog to say it is watching ("ready" on its stdout)


class Watchdog:
    """The launcher's handle: start() → watching; done() on a normal end (the watchdog then exits quietly)."""

    def __init__(self, proc: subprocess.Popen, ready: bool):
        self.proc = proc
        self.ready = ready              # False: it did not say it was watching in time (the launcher warns)

    @classmethod
    def start(cls, root_pid: int, status: Path, lock_fd: int | None) -> "Watchdog":
        argv = [sys.executable, "-m", "scaletrain.engine.launch.watchdog", "--root", str(root_pid),
                "--launcher", str(os.getpid()), "--status", str(status)]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True, pass_fds=(lock_fd,) if lock_fd is not None else ())
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], START_WAIT_SECONDS)   # it tracks the tree from here on
        said = proc.stdout.readline().strip() == b"ready" if ready else False
        proc.stdout.close()
        return cls(proc, said)

    def done(self) -> None:
        """The launcher has stopped everything itself: let the watchdog go (and wait for it, so the run
        directory's lock is free when launch() returns)."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(DONE + b"\n")
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _launcher_gone(stdin_fd: int, tree: ProcessTree) -> bool:
    """Wait on the pipe, tracking the tree; True when it closes without "done" (the launcher died)."""
    seen = b""
    last_scan = last_growth = time.monotonic()
    while True:
        ready, _, _ = select.select([stdin_fd], [], [], POLL_SECONDS)
        now = time.monotonic()
        if now - last_growth < SETTLE_SECONDS or now - last_scan >= TRACK_SECONDS:
            last_scan = now
            if tree.snapshot():
                last_growth = now
        if not ready:
            continue
        chunk = os.read(stdin_fd, 64)
        if not chunk:
            return DONE not in seen
        seen += chunk
        if DONE in seen:
            return False


def stop_all(tree: ProcessTree, term_grace: float = TERM_GRACE_SECONDS) -> None:
    """SIGTERM to every tracked process and group, then SIGKILL; returns when none is alive (or after the wait)."""
    for sig, wait_s in ((signal.SIGTERM, term_grace), (signal.SIGKILL, KILL_WAIT_SECONDS)):
        tree.snapshot()
        tree.signal_all(sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            tree.snapshot()                 # a rank started during the stop is caught too
            if not tree.alive():
                return
            time.sleep(POLL_SECONDS / 2)


def finalize(status_path: Path, launcher_pid: int) -> None:
    """status.json's final state after a killed launcher (unless the launcher wrote one before it died)."""
    old = read_status(status_path)
    if old.over and old.reason is None and old.ended is not None:
        return
    writer = StatusWriter(status_path, old)
    writer.write(state="interrupted", ended=datetime.now().isoformat(timespec="seconds"),
                 exit_code=old.exit_code if old.exit_code is not None else EXIT_INTERRUPTED,
                 reason=f"the launcher (pid {launcher_pid}) was killed; its watchdog (pid {os.getpid()}) stopped "
                        "every process it had started")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scaletrain.engine.launch.watchdog")
    p.add_argument("--root", type=int, required=True)
    p.add_argument("--launcher", type=int, required=True)
    p.add_argument("--status", required=True)
    args = p.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)          # only the pipe decides; the clean-up must not be cut short
    tree = ProcessTree(args.root)
    tree.snapshot()
    try:
        os.write(sys.stdout.fileno(), b"ready\n")
        os.close(sys.stdout.fileno())
    except OSError:
        pass
    if not _launcher_gone(sys.stdin.fileno(), tree):
        return 0
    stop_all(tree)
    finalize(Path(args.status), args.launcher)
    return 0


if __name__ == "__main__":
    sys.exit(main())

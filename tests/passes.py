"""`make test`'s two pytest passes, run side by side: the multi-process training runs (`-m slow`) at normal
priority, the single-process tests (`-m "not slow"`) beside them at idle priority.

Why: on 2 cores the two passes one after the other took 321 s + 473 s (2026-12-02, this VM), yet the slow pass
keeps the cores busy only about two thirds of its time (642 CPU-s in 473 s: a rank waits on its launcher, a
1-rank resume uses one core, a detached run is polled). At idle priority the single-process tests take only
those idle cycles: run beside the slow pass, the slow pass's first 37 tests took 200.5 s against 203.2 s alone.

Idle priority on Linux: a new session whose autogroup's nice is 19 (/proc/self/autogroup). With autogroups on,
the kernel shares the cores between sessions first and honours a process's nice only inside its own session, and
every launch's ranks start sessions of their own (torchrun's start_new_session): a plain `nice 19` would still
get half the cores against each launch. Where autogroups are off or absent the process's own nice 19 does it.

The slow pass's output streams as it runs; the other pass's output is shown whole when it ends. The exit code is
the first failing pass's (pytest's 5, no test selected, is a pass: PYTEST_ARGS may name files of one kind only).
Ctrl-C or SIGTERM stops both passes; if this process dies, the kernel ends the idle pass (PR_SET_PDEATHSIG).

    python tests/passes.py [--jobs N] [--fast-jobs N] [PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time

AUTOGROUP = "/proc/self/autogroup"
IDLE_NICE = 19
NO_TESTS = 5                      # pytest: no test was selected
PR_SET_PDEATHSIG = 1


def _xdist(workers: int) -> list[str]:
    """Workers for a pass (pytest-xdist, a test file or xdist_group per unit), or none where it is not installed."""
    if workers <= 1 or importlib.util.find_spec("xdist") is None:
        return []
    return ["-n", str(workers), "--dist", "loadgroup", "--no-loadscope-reorder"]    # conftest.py's order


def _at_idle_priority() -> None:
    """preexec_fn of the idle pass (it runs in the child, after setsid): lowest priority, and die with the parent."""
    try:
        with open(AUTOGROUP, "w") as f:
            f.write(str(IDLE_NICE))
    except OSError:
        pass                                  # no autogroups here: the nice below is what counts
    os.nice(IDLE_NICE - os.nice(0))
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass                                  # not Linux: Ctrl-C and SIGTERM still stop it (_stop)


def _stop(proc: subprocess.Popen, *, group: bool, grace_seconds: float = 15.0) -> None:
    """SIGINT (pytest stops as on Ctrl-C, its fixtures end what they started), SIGKILL after grace_seconds: to the
    pass's process group (pytest and its xdist workers) or to pytest alone (the slow pass shares ours)."""
    for sig, wait in ((signal.SIGINT, grace_seconds), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


def _passed(code: int) -> bool:
    return code in (0, NO_TESTS)


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def _wait_both(slow: subprocess.Popen, fast: subprocess.Popen, started: float) -> dict[str, tuple[int, float]]:
    """Each pass's exit code and the seconds it ran, once both have ended."""
    ended: dict[str, tuple[int, float]] = {}
    while len(ended) < 2:
        for name, proc in (("slow", slow), ("fast", fast)):
            if name not in ended and proc.poll() is not None:
                ended[name] = (proc.returncode, time.monotonic() - started)
        time.sleep(0.2)
    return ended


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1, help="pytest-xdist workers for the slow pass (default 1)")
    ap.add_argument("--fast-jobs", type=int, default=2, help="workers for the single-process pass (default 2)")
    args, pytest_args = ap.parse_known_args(argv)
    if args.jobs < 1 or args.fast_jobs < 1:
        ap.error(f"--jobs and --fast-jobs take a whole number of workers, 1 or more (got {args.jobs}, "
                 f"{args.fast_jobs})")
    pytest = [sys.executable, "-m", "pytest", "-q"]
    threads = max(1, len(os.sched_getaffinity(0)) // args.fast_jobs)   # each worker's torch: its share
    fast_env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    signal.signal(signal.SIGTERM, _interrupted)
    with tempfile.TemporaryFile("w+") as fast_out:
        started = time.monotonic()
        fast = subprocess.Popen([*pytest, *_xdist(args.fast_jobs), "-m", "not slow", *pytest_args],
                                stdin=subprocess.DEVNULL, stdout=fast_out, stderr=subprocess.STDOUT, env=fast_env,
                                start_new_session=True, preexec_fn=_at_idle_priority)
        slow = subprocess.Popen([*pytest, *_xdist(args.jobs), "-m", "slow", *pytest_args], stdin=subprocess.DEVNULL)
        try:
            ended = _wait_both(slow, fast, started)
        except KeyboardInterrupt:
            _stop(slow, group=False)
            _stop(fast, group=True)
            print("\ntests/passes.py: stopped both passes", file=sys.stderr)
            return 130
        fast_out.seek(0)
        print("\n---- the single-process tests (-m 'not slow'), run beside the slow pass at idle priority ----",
              flush=True)
        sys.stdout.write(fast_out.read())
    (slow_code, slow_s), (fast_code, fast_s) = ended["slow"], ended["fast"]
    print(f"---- multi-process pass: exit {slow_code} after {slow_s:.0f} s; single-process pass: exit {fast_code} "
          f"after {fast_s:.0f} s ----", flush=True)
    for code in (fast_code, slow_code):
        if not _passed(code):
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())

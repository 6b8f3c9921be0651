"""Where a timed suite's CPU goes, by process: bench/suite_time.py --processes puts this folder first on PYTHONPATH,
so every Python process the suite starts (pytest and its workers, each CLI call, launcher, rank and probe) loads it
and, as it ends, appends one JSON line to $SUITE_TIME_PROCESSES: its kind, its argv, its own CPU and wall seconds,
and the test that started it (PYTEST_CURRENT_TEST, which pytest sets in its environment while a test runs).

The trainer's ranks end with os._exit, which skips atexit: that exit is wrapped too. A process killed by a signal
records nothing (a test's deliberately killed rank, a trace stopped at its memory cap): the suite's CPU total less
the recorded sum is theirs, plus non-Python children (bash, g++). During such a run this module stands in for any
other sitecustomize further down the path (the venv has none).
"""

import atexit
import json
import os
import resource
import sys
import time

_LOG = os.environ.get("SUITE_TIME_PROCESSES")
_STARTED = time.monotonic()
_done = False


def _kind() -> str:
    argv = sys.argv or [""]
    first = os.path.basename(argv[0])
    if first == "-c" and "execnet" in sys.modules and "xdist" in sys.modules:
        return "pytest worker (tests in the process)"
    if first == "train.py":
        return "rank (trainer/train.py)"
    if first == "launch_agent.py":
        return "launcher (accelerate launch)"
    if first == "probe.py":
        return f"probe {argv[1] if len(argv) > 1 else ''}".strip()
    if first == "main.py" and "cli" in argv[0] or first == "scaletrain":
        return f"scaletrain {argv[1] if len(argv) > 1 else ''}".strip()
    runner = first == "__main__.py" and os.path.basename(os.path.dirname(argv[0])) == "pytest"     # python -m pytest
    if runner or first in ("pytest", "py.test"):
        return "pytest"
    if first == "-c":
        return "python -c (a test's or probe's child)"
    return first or "python"


def _record() -> None:
    global _done
    if _done or not _LOG:
        return
    _done = True
    r = resource.getrusage(resource.RUSAGE_SELF)
    argv = [(os.path.basename(a) if "/" in a else a)[:200] for a in sys.argv[:3]]    # a line well under 4 KiB
    test = os.environ.get("PYTEST_CURRENT_TEST", "")[:300]     # a test's children inherit pytest's note of it
    line = json.dumps({"kind": _kind(), "argv": argv, "test": test,
                       "cpu_seconds": round(r.ru_utime + r.ru_stime, 3),
                       "wall_seconds": round(time.monotonic() - _STARTED, 3), "modules": len(sys.modules)})
    try:
        with open(_LOG, "a") as f:          # one short write per process: appends do not interleave
            f.write(line + "\n")
    except OSError:
        pass


def _exit(code, _real=os._exit):
    try:
        _record()
    finally:
        _real(code)


if _LOG:
    atexit.register(_record)
    os._exit = _exit

"""pytest plugin for bench/suite_time.py: each test's wall and CPU seconds, appended as it ends (a killed suite keeps
what it measured). CPU is this process's and its waited-for children's user + system time, so a test's 2-rank
training counts in full, and a loaded machine (other work on the cores) changes it far less than the wall time.
Under pytest-xdist every worker appends its own lines to the same file."""

from __future__ import annotations

import json
import os
import resource
import time

import pytest

_OUT = os.environ.get("SUITE_TIME_TESTS", "")


def _cpu_seconds() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around setup, call and teardown, where the test runs (a worker under xdist, not the controller): a shared
    fixture's cost lands on the first test that asks for it."""
    wall0, cpu0 = time.monotonic(), _cpu_seconds()
    yield
    if not _OUT:
        return
    marks = sorted({m.name for m in item.iter_markers()} & {"slow", "heavy", "long"})
    line = json.dumps({"test": item.nodeid, "wall_seconds": round(time.monotonic() - wall0, 2),
                       "cpu_seconds": round(_cpu_seconds() - cpu0, 2), "load_1m": round(os.getloadavg()[0], 2),
                       "markers": marks})
    with open(_OUT, "a") as f:
        f.write(line + "\n")

"""Hermetic tests: no user calibration profile leaks in, and no process a test started outlives it."""

import os
import tempfile

import psutil
import pytest

_CONFIG = tempfile.mkdtemp(prefix="scaletrain-test-config-")
os.environ["SCALETRAIN_CONFIG_DIR"] = _CONFIG
# the run registry (engine/launch/registry.py: every launch writes an entry) never lands in the user's state dir
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="scaletrain-test-state-")
# traced model families (engine/catalog/traced.py) cache here, never in the user's ~/.cache
os.environ["SCALETRAIN_CACHE"] = tempfile.mkdtemp(prefix="scaletrain-test-traces-")


@pytest.fixture(autouse=True)
def _no_stray_processes():
    """A test that fails midway (a timeout in a pilot, an assertion while ranks run) must not leave training
    processes behind: kill whatever this pytest process still has below it once the test is over."""
    yield
    me = psutil.Process()
    strays = me.children(recursive=True)
    for p in strays:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(strays, timeout=5)

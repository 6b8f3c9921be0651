"""tests/passes.py, `make test`'s runner: the slow pass at normal priority, the other beside it at idle priority in
a session of its own, and one exit code for both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PASSES = Path(__file__).resolve().parent / "passes.py"
PROBE = """\
import json, os, pytest

def _record(name):
    group = open("/proc/self/autogroup").read().split() if os.path.exists("/proc/self/autogroup") else []
    with open(os.path.join(os.environ["PASSES_OUT"], name + ".json"), "w") as f:
        json.dump({"nice": os.nice(0), "sid": os.getsid(0), "autogroup_nice": group[-1] if group else None,
                   "threads": os.environ.get("OMP_NUM_THREADS")}, f)

@pytest.mark.slow
def test_slow():
    _record("slow")

def test_fast():
    _record("fast")
    assert os.environ.get("FAIL_FAST") != "1"
"""


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: a slow test\n")
    return subprocess.run([sys.executable, str(PASSES), "--jobs", "1", "--fast-jobs", "1", "-p", "no:cacheprovider",
                           *args], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env=dict(os.environ, PASSES_OUT=str(tmp_path), **env))


@pytest.mark.long
def test_the_single_process_pass_runs_beside_at_idle_priority_in_a_session_of_its_own(tmp_path):
    r = _run(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    slow, fast = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("slow", "fast"))
    assert fast["nice"] == 19 and slow["nice"] == os.nice(0)
    assert fast["sid"] != slow["sid"] and slow["sid"] == os.getsid(0)     # the slow pass stays in ours
    if Path("/proc/self/autogroup").exists():
        assert fast["autogroup_nice"] == "19"
    assert fast["threads"] == str(len(os.sched_getaffinity(0)))          # one worker: every core's threads
    assert "single-process pass: exit 0" in r.stdout and "1 passed" in r.stdout


@pytest.mark.long
def test_a_failing_pass_fails_the_run_and_a_pass_with_nothing_selected_does_not(tmp_path):
    failed = _run(tmp_path, FAIL_FAST="1")
    assert failed.returncode == 1 and "single-process pass: exit 1" in failed.stdout, failed.stdout
    only_slow = _run(tmp_path, "-k", "slow")       # the single-process pass selects nothing: pytest's exit 5
    assert only_slow.returncode == 0 and "single-process pass: exit 5" in only_slow.stdout, only_slow.stdout


def test_a_worker_count_under_one_is_one_line_and_exit_2(tmp_path):
    r = subprocess.run([sys.executable, str(PASSES), "--jobs", "0"], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert r.returncode == 2 and "--jobs and --fast-jobs take a whole number of workers" in r.stderr


def test_the_single_process_pass_hands_out_screens_first_then_costly_files_and_short_files_last():
    """tests/conftest.py: a screen's waits pass while the training runs hold the cores, and the pass ends on
    CPU-bound short files, both workers together (measured there: with the screens after the heavy files their
    waits were the tail, 27-46 % of the cores idle)."""
    from conftest import _start_order

    heavy, screens = {"t/test_d_profiler.py", "t/test_g_launch.py"}, {"t/test_b_wizard.py", "t/test_e_monitor.py"}
    files = ["t/test_a_short.py", "t/test_b_wizard.py", "t/test_c_long.py", "t/test_d_profiler.py",
             "t/test_e_monitor.py", "t/test_f_short.py", "t/test_g_launch.py"]
    handed = sorted(files, key=lambda f: _start_order(f, heavy, screens))      # a stable sort: the order within kinds
    assert handed == ["t/test_b_wizard.py", "t/test_e_monitor.py", "t/test_d_profiler.py", "t/test_g_launch.py",
                      "t/test_a_short.py", "t/test_c_long.py", "t/test_f_short.py"]


def test_a_file_drives_a_screen_when_it_runs_a_textual_pilot_or_a_snapshot():
    from conftest import _drives_a_screen

    class Item:
        def __init__(self, path: str, *fixtures: str):
            self.fspath, self.fixturenames = path, fixtures

    here = Path(__file__).resolve().parent
    assert _drives_a_screen(Item(str(here / "frontends" / "test_wizard.py")))             # app.run_test(...)
    assert _drives_a_screen(Item(str(here / "engine" / "test_units.py"), "snap_compare"))
    assert not _drives_a_screen(Item(str(here / "engine" / "test_units.py"), "tmp_path"))

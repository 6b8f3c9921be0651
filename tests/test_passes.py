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

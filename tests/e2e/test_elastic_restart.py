"""Issue 33, item 2, with a real 2-rank CPU run (accelerate → torchrun's elastic agent → gloo): train.max_restarts
puts the run under torchelastic's restarts; one rank SIGKILLed mid-training (after a checkpoint) makes the agent
restart every rank, which resume from that checkpoint (the trainer reads TORCHELASTIC_RESTART_COUNT) and finish;
status.json and the doctor say which rank died, how, and where it resumed; no process is left, also when the
launcher itself is SIGKILLed after a restart (its watchdog stops the restarted ranks too)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import psutil
import pytest

from scaletrain.engine.doctor.diagnosis import diagnose_paths
from scaletrain.engine.run.metrics import read_metrics

from test_launcher import _tree
from test_run_lifecycle import CLI, _all_gone, _status
from test_train_cpu import make_run

pytestmark = pytest.mark.slow
LIMIT_SECONDS = 300


def _start(run):
    return subprocess.Popen([*CLI, "launch", str(run.path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _until(what, proc, check, tree):
    """Poll `check` (collecting the launcher's process tree meanwhile) until it gives something."""
    end = time.monotonic() + LIMIT_SECONDS
    while (got := check()) is None:
        tree.update(_tree(proc.pid))
        if proc.poll() is not None:
            pytest.fail(f"launch ended ({proc.returncode}) before {what}: {proc.stdout.read()[-3000:]}")
        if time.monotonic() > end:
            proc.kill()
            pytest.fail(f"no {what} within {LIMIT_SECONDS} s")
        time.sleep(0.05)
    return got


def _rank_pids(run) -> dict:
    """status.json's rank pids; {} before the launcher has written it (or while it is replaced)."""
    try:
        return _status(run).get("rank_pids") or {}
    except (OSError, ValueError):
        return {}


def _newest_checkpoint(run):
    steps = [int(d.name.split("-")[1]) for d in run.checkpoints.glob("step-*") if (d / "trainer_state.json").is_file()]
    return max(steps) if steps else None


def _kill_rank(run, proc, rank, tree):
    """SIGKILL one rank once a checkpoint exists; the step it must resume from."""
    newest = _until("a checkpoint", proc, lambda: _newest_checkpoint(run), tree)
    pid = _until("rank pids", proc, lambda: _rank_pids(run).get(str(rank)), tree)
    assert "scaletrain.trainer.train" in " ".join(psutil.Process(pid).cmdline())
    newest = _newest_checkpoint(run)
    os.kill(pid, signal.SIGKILL)
    return newest


def test_a_killed_rank_restarts_every_rank_which_resume_and_finish(tmp_path):
    total = 16
    run = make_run(tmp_path, "ddp", lr=5e-3, max_steps=total, checkpoint_every=4, max_restarts=2,
                   export_at_end=False)
    assert "--max_restarts 2" in run.launch_sh.read_text()
    proc = _start(run)
    tree: dict[int, float] = {}
    resumed_at = _kill_rank(run, proc, 1, tree)
    assert resumed_at < total, "the rank had finished before it was killed"
    while proc.poll() is None:
        tree.update(_tree(proc.pid))
        time.sleep(0.1)
    out = proc.stdout.read()
    assert proc.returncode == 0, out[-3000:]
    assert _all_gone(tree) == [], "processes left behind after the restarted run finished"

    st = _status(run)
    assert st["state"] == "finished" and st["exit_code"] == 0
    assert st["restarts"] == [{"restart": 1, "rank": 1, "exit_code": -9}]
    log = run.rank_log(0).read_text()
    assert "scaletrain: elastic restart 1 of 2" in log
    m = re.search(r"scaletrain: resumed from (\S+) at step (\d+)", log)
    assert m and int(m.group(2)) == resumed_at >= 4, (resumed_at, log[-2000:])      # resumed, not restarted
    steps = [r.step for r in read_metrics(run.metrics)]
    assert steps == list(range(1, total + 1))                                       # each step once, to the end

    d = diagnose_paths([run.path])
    assert d.kind == "restarted" and d.rank == 1
    assert f"restart 1: rank 1 killed by SIGKILL, resumed from step {resumed_at}" in d.summary, d.summary
    assert any("failed (exitcode: -9) local_rank: 1" in e for e in d.evidence), d.evidence


def test_the_watchdog_stops_restarted_ranks_when_the_launcher_is_killed(tmp_path):
    run = make_run(tmp_path, "ddp", lr=5e-3, max_steps=2000, checkpoint_every=2, max_restarts=1,
                   export_at_end=False)
    proc = _start(run)
    tree: dict[int, float] = {}
    old = _until("both rank pids", proc, lambda: p if len(p := _rank_pids(run)) == 2 else None, tree)
    _kill_rank(run, proc, 0, tree)

    def restarted():
        pids = _rank_pids(run)
        fresh = set(pids.values()) - set(old.values())
        log = run.rank_log(0).read_text() if run.rank_log(0).is_file() else ""
        return pids if len(fresh) == 2 and "elastic restart 1" in log else None

    new = _until("the restarted ranks", proc, restarted, tree)
    tree.update(_tree(proc.pid))
    assert set(new.values()) <= set(tree)
    proc.kill()                                   # the launcher: its watchdog stops the rest
    proc.communicate(timeout=30)
    assert _all_gone(tree) == [], "restarted ranks left behind after SIGKILL of the launcher"
    assert _status(run)["state"] == "interrupted"

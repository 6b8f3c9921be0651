"""engine.launch.launcher and `scaletrain launch` for real: Ctrl-C leaves no process behind, a resumed run continues its
step count, a failing rank is recorded with the right exit code, bad input is one line before anything starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from scaletrain.engine.doctor.diagnosis import diagnose_paths
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.launch.launcher import launch
from scaletrain.engine.run.metrics import read_metrics
from scaletrain.tui.cli.main import main

from test_train_cpu import deadline_tick, make_run, write_dataset

CLI = [sys.executable, "-c", "import sys; from scaletrain.tui.cli.main import main; sys.exit(main())"]
STOP_LIMIT_SECONDS = 60          # SIGINT → every process gone (the launcher escalates to SIGKILL well before)

FAILING_SCRIPT = """\
import os, signal, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} started with {sys.argv[1:]}", flush=True)
if rank == 1:
    time.sleep(1)
    if sys.argv[1] == "exit":
        print("rank 1 gives up", file=sys.stderr, flush=True)
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
"""


def _tree(pid: int) -> dict[int, float]:
    """pid → create time of a process and all its descendants (ranks run in their own sessions)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in procs:
        try:
            out[p.pid] = p.create_time()
        except psutil.NoSuchProcess:
            pass
    return out


def _survivors(tree: dict[int, float]) -> list[str]:
    alive = []
    for pid, created in tree.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return alive


def _wait_for_steps(run, n: int, proc: subprocess.Popen, limit_s: float = 240) -> None:
    end = time.monotonic() + limit_s
    while len(read_metrics(run.metrics)) < n:
        if proc.poll() is not None:
            pytest.fail(f"launch ended early ({proc.returncode}): {proc.stdout.read() if proc.stdout else ''}")
        if time.monotonic() > end:
            proc.kill()
            pytest.fail(f"no {n} steps within {limit_s} s")
        time.sleep(0.2)


@pytest.mark.slow
def test_ctrl_c_leaves_no_process_and_resume_continues_the_step_count(tmp_path):
    run = make_run(tmp_path, "ddp", lr=5e-3, max_steps=2000, checkpoint_every=4)
    proc = subprocess.Popen([*CLI, "launch", str(run.path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    _wait_for_steps(run, 6, proc)
    tree: dict[int, float] = {}
    for _ in range(5):                      # union of a few looks: the launcher, accelerate, torchrun's ranks
        tree.update(_tree(proc.pid))
        time.sleep(0.1)
    status = json.loads(run.status.read_text())
    ranks = {int(r): p for r, p in status["rank_pids"].items()}
    assert set(ranks) == {0, 1} and set(ranks.values()) <= set(tree)
    assert all(os.getsid(p) != os.getsid(proc.pid) for p in ranks.values())   # why a group kill is not enough

    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=STOP_LIMIT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"launcher still running {STOP_LIMIT_SECONDS} s after SIGINT")
    assert proc.returncode == 130, out
    deadline = time.monotonic() + 5
    while _survivors(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _survivors(tree) == [], "processes left behind after Ctrl-C"
    status = json.loads(run.status.read_text())
    assert status["state"] == "interrupted" and status["exit_code"] == 130
    assert "Resume with" in out
    assert diagnose_paths([run.path]).kind == "interrupted"          # stopped, not failed: no fix to look for
    # torchrun's agent answers the SIGINT with a traceback: one line in the log, not a crash (rank_logs.py)
    assert "Traceback" not in run.launcher_log().read_text(), run.launcher_log().read_text()[-3000:]

    stopped_at = read_metrics(run.metrics)[-1]
    before = {r.step: r.loss for r in read_metrics(run.metrics)}
    ckpt = max(int(p.name.split("-")[1]) for p in run.checkpoints.glob("step-*")
               if (p / "trainer_state.json").exists())
    assert ckpt % 4 == 0 and 4 <= ckpt <= stopped_at.step

    plan = json.loads(run.plan.read_text())
    plan["train"]["max_steps"] = ckpt + 4           # finish soon after the checkpoint
    run.plan.write_text(json.dumps(plan))
    res = launch(run.path, resume=True, on_tick=deadline_tick())
    assert res.exit_code == 0, run.rank_log(0).read_text()
    raw = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    # continues, does not restart at 1; the steps logged after the checkpoint were cut and logged again, once
    assert [r["step"] for r in raw] == list(range(1, ckpt + 5))
    resumed = raw[ckpt:]
    if ckpt + 1 in before:          # same weights, optimizer and data position: the same loss again
        assert resumed[0]["loss"] == pytest.approx(before[ckpt + 1], rel=1e-4)
    assert f"resumed from {run.checkpoints / f'step-{ckpt}'}" in run.rank_log(0).read_text()


@pytest.mark.slow
def test_failing_rank_exit_code_via_cli_script_mode(tmp_path, capsys):
    run = make_run(tmp_path, "ddp")
    script = tmp_path / "train.py"
    script.write_text(FAILING_SCRIPT)
    code = main(["launch", str(run.path), "--script", str(script), "--", "exit", "--flag"])
    out = capsys.readouterr().out
    assert code == 3, out
    status = json.loads(run.status.read_text())
    assert status["state"] == "failed" and status["exit_code"] == 3 and status["launcher_exit_code"] == 1
    assert status["first_failing_rank"] == 1 and status["failing_rank_exit_code"] == 3
    assert status["exit_codes"]["1"] == 3 and status["exit_codes"]["0"] == -15   # rank 0 stopped by torchrun
    assert "rank 0 started with ['exit', '--flag']" in run.rank_log(0).read_text()
    assert "rank 1 gives up" in run.rank_log(1).read_text()
    assert "rank 1 failed first" in out and "rank 1 gives up" in out


@pytest.mark.slow
def test_a_killed_rank_is_the_first_failure(tmp_path):
    run = make_run(tmp_path, "ddp")
    script = tmp_path / "train.py"
    script.write_text(FAILING_SCRIPT)
    res = launch(run.path, script=str(script), script_args=["kill"], on_tick=deadline_tick(120))
    assert (res.first_failing_rank, res.failing_rank_exit_code, res.exit_code) == (1, -9, 128 + 9)
    assert json.loads(run.status.read_text())["first_failing_rank"] == 1
    assert _survivors({p: psutil.Process(p).create_time() for p in res.pids if psutil.pid_exists(p)}) == []


STUBBORN_SCRIPT = """\
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(300)
"""


@pytest.mark.slow
def test_ranks_that_ignore_sigint_and_sigterm_are_still_stopped(tmp_path):
    """The stop API of a launcher run in a worker thread (the TUI's path) escalates to SIGKILL: nothing survives."""
    run = make_run(tmp_path, "ddp")
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN_SCRIPT)
    stop = threading.Event()
    ready: set[int | None] = set()
    seen: dict[int, float] = {}

    def on_output(rank, line):
        if line == "ready":
            ready.add(rank)

    def on_tick():
        seen.update(_tree(os.getpid()))        # this test's own view of every descendant
        seen.pop(os.getpid(), None)
        if ready >= {0, 1} and len(seen) >= 3 and not stop.is_set():
            box["stop_at"] = time.monotonic()
            stop.set()                         # both ranks run, ignoring SIGINT and SIGTERM: stop the run

    box: dict[str, object] = {}
    worker = threading.Thread(target=lambda: box.update(res=launch(
        run.path, script=str(script), stop=stop, on_output=on_output, on_tick=on_tick,
        stop_grace_seconds=(2.0, 2.0))), daemon=True)
    worker.start()
    worker.join(180)
    assert not worker.is_alive(), "launcher did not return"
    stop_seconds = time.monotonic() - box["stop_at"]
    res = box["res"]
    assert res.interrupted and res.exit_code == 130
    # SIGINT, 2 s, SIGTERM, 2 s, SIGKILL: well before torchrun's own 30 s shutdown timeout would kill the ranks
    assert stop_seconds < 15, stop_seconds
    assert len(seen) >= 3 and set(res.rank_pids.values()) <= set(seen)   # accelerate + both ranks were seen
    assert _survivors(seen) == []
    assert json.loads(run.status.read_text())["state"] == "interrupted"


def test_bad_input_is_one_line_and_starts_nothing(tmp_path, capsys):
    data = write_dataset(tmp_path / "d.jsonl", n=10)
    run = make_run(tmp_path, "ddp", dataset=str(data))
    data.unlink()
    with pytest.raises(ScaletrainError, match=r"dataset .*d\.jsonl does not exist"):
        launch(run.path)
    plan = json.loads(run.plan.read_text())
    plan["train"]["lr_schedule"] = "step"
    run.plan.write_text(json.dumps(plan))
    with pytest.raises(ScaletrainError, match="lr_schedule 'step' is not accepted; use one of: cosine"):
        launch(run.path)
    assert not run.status.exists()

    assert main(["launch", str(tmp_path / "nowhere")]) == 2
    assert main(["launch", str(run.path), "--script", str(tmp_path / "missing.py")]) == 2
    assert main(["launch", str(run.path), "--", "stray"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("scaletrain: error: ") for line in err)
    assert "no plan.json" in err[0] and "missing.py does not exist" in err[1] and "give it with --script" in err[2]
    assert captured.out == ""                          # nothing drawn before the error

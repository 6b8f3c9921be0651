"""Issue 30, items 2 and 3, with real 2-process CPU runs of the cpu-tiny preset: a detached run returns at once and
trains on, `scaletrain runs` lists it with its step, `scaletrain stop` ends every process with a final status; a run
launched from the wizard survives the wizard's exit and the terminal's hang-up; the monitor's `q` detaches; a run
whose launcher died without a final state is listed as such; entries of deleted folders are pruned."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from scaletrain.engine.launch.detach import stop_run
from scaletrain.engine.launch.registry import DIED, list_runs, register_run, registry_dir
from scaletrain.engine.launch.status import read_status
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.run.metrics import read_metrics
from scaletrain.tui.cli.main import main

from test_train_cpu import make_run

CLI = [sys.executable, "-c", "import sys; from scaletrain.tui.cli.main import main; sys.exit(main())"]
DETACH_RETURN_SECONDS = 5.0          # the limit for `--headless --detach` to come back
STEP_WAIT_SECONDS = 180
LONG = ["--set", "train.max_steps=100000", "--set", "train.checkpoint_every=100000"]


def _run_processes(run: RunDir) -> dict[int, float]:
    """Every process of the run now: its launcher and everything below it (accelerate, the ranks in their own
    sessions, the watchdog), by pid → create time."""
    st = read_status(run.status)
    roots = {p for p in (st.launcher_pid, *st.tracked_pids) if p}
    out: dict[int, float] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            for p in (root, *root.children(recursive=True)):
                out[p.pid] = p.create_time()
        except psutil.NoSuchProcess:
            pass
    return out


def _alive(tree: dict[int, float]) -> list[str]:
    left = []
    for pid, created in tree.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} {' '.join(p.cmdline())[:100]}")
        except psutil.NoSuchProcess:
            pass
    return left


def _wait(predicate, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def _steps(run: RunDir) -> int:
    m = read_metrics(run.metrics)
    return m[-1].step if m else 0


def _stop_and_check(run: RunDir, tree: dict[int, float]) -> None:
    """`scaletrain stop RUN`: exit 0, no process of the run left, status.json final with an end time."""
    tree.update(_run_processes(run))
    assert main(["stop", str(run.path)]) == 0
    assert _alive(tree) == [], "processes left after scaletrain stop"
    st = json.loads(run.status.read_text())
    assert st["state"] == "interrupted" and st["exit_code"] == 130 and st["ended"]


@pytest.mark.slow
def test_headless_detach_returns_at_once_runs_lists_it_and_stop_ends_every_process(tmp_path, capsys):
    run = RunDir(tmp_path / "run")
    tree: dict[int, float] = {}
    try:                # started inside: whatever fails after it, the long run is stopped (finally)
        t0 = time.monotonic()
        r = subprocess.run([*CLI, "--preset", "cpu-tiny", "--headless", "--detach", "--run-dir", str(run.path),
                            *LONG], capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        tree.update(_run_processes(run))
        assert r.returncode == 0, r.stderr
        assert took < DETACH_RETURN_SECONDS, f"--headless --detach took {took:.1f} s"
        assert "in the background" in r.stdout and f"scaletrain stop {run.path}" in r.stdout
        st = read_status(run.status)
        assert st.state == "running"
        launcher = psutil.Process(st.launcher_pid)
        assert launcher.ppid() != os.getpid()                    # the CLI that started it is gone
        assert os.getsid(st.launcher_pid) == st.launcher_pid != os.getsid(0)    # its own session: no terminal
        assert os.readlink(f"/proc/{st.launcher_pid}/fd/0") == "/dev/null"
        _wait(lambda: _steps(run) >= 2, STEP_WAIT_SECONDS, "the detached run's steps")

        capsys.readouterr()
        assert main(["runs", "--json"]) == 0
        rows = [x for x in json.loads(capsys.readouterr().out) if x["folder"] == str(run.path)]
        assert len(rows) == 1 and rows[0]["state"] == "running" and rows[0]["step"] >= 2
        assert rows[0]["total_steps"] == 100000 and rows[0]["loss"] > 0 and rows[0]["eta_seconds"] > 0
        assert (rows[0]["nodes"], rows[0]["devices_per_node"], rows[0]["device"]) == (1, 2, "cpu")
        assert rows[0]["peak_bytes"] > 0 and rows[0]["planned_peak_bytes"] > 0
        assert main(["runs"]) == 0
        table = capsys.readouterr().out
        assert "running" in table and str(run.path) in table and "1×2 CPU" in table

        assert main(["monitor", "--once"]) == 0                 # no folder: the newest running run
        out = capsys.readouterr()
        assert f"attaching to {run.path}" in out.err and "step " in out.out

        second = subprocess.run([*CLI, "launch", str(run.path), "--detach"], capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 2 and "already running" in second.stderr and second.stderr.count("\n") == 1
    finally:
        _stop_and_check(run, tree)
    capsys.readouterr()
    assert main(["runs", "--json"]) == 0
    row = next(x for x in json.loads(capsys.readouterr().out) if x["folder"] == str(run.path))
    assert row["state"] == "interrupted" and row["eta_seconds"] is None
    assert main(["stop", str(run.path)]) == 0 and "not running" in capsys.readouterr().out
    assert main(["monitor", "--once"]) == 2 and "no run is running" in capsys.readouterr().err


@pytest.mark.slow
def test_launch_detach_resumes_in_the_background(ddp_run, tmp_path, capsys):
    """`scaletrain launch RUN --detach --resume` on a copy of the shared DDP run (tests/conftest.py: checkpoints at
    10, 20 and 24), made long: it returns at once, resumes from the newest checkpoint in the background, and
    `scaletrain stop` ends it."""
    run = ddp_run.copy(tmp_path / "run")
    plan = json.loads(run.plan.read_text())
    plan["train"]["max_steps"] = 100000
    run.plan.write_text(json.dumps(plan))
    ck = run.newest_checkpoint()
    assert ck.name == "step-24"
    tree: dict[int, float] = {}
    try:                # launched inside: whatever fails after it, the 100,000-step run is stopped (finally)
        assert main(["launch", str(run.path), "--detach", "--resume"]) == 0
        assert "in the background" in capsys.readouterr().out
        tree.update(_run_processes(run))
        _wait(lambda: "resumed from" in run.rank_log(0).read_text(), STEP_WAIT_SECONDS, "the resumed run")
        assert ck.name in run.rank_log(0).read_text()
        _wait(lambda: _steps(run) > 24, STEP_WAIT_SECONDS, "a step after the checkpoint")
    finally:
        _stop_and_check(run, tree)


WIZARD_CHILD = r"""
import asyncio, fcntl, signal, sys, termios, time
fcntl.ioctl(0, termios.TIOCSCTTY, 0)          # this pty is the session's controlling terminal, as in a real one
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal's shell starts it (a suite run under nohup passes it ignored)
from scaletrain.engine.devices.nvml import DetectionResult
from scaletrain.engine.launch.status import read_status
from scaletrain.tui.cli.parser import parse_args
from scaletrain.tui.wizard.app import create_app

run_dir = sys.argv[1]
app = create_app(parse_args(["--preset", "cpu-tiny", "--run-dir", run_dir, *sys.argv[2:]]),
                 detect=lambda: DetectionResult((), None, None, "no NVML"))

async def walk():
    async with app.run_test(size=(100, 32)) as pilot:
        for key in ["ctrl+n"] * 4 + ["w"]:
            await pilot.press(key)
            for _ in range(3):
                await app.workers.wait_for_complete()
                await pilot.pause()
        await pilot.press("l")             # the monitor's sampler runs until the screen goes: no waiting for workers
        for _ in range(600):
            if read_status(run_dir + "/status.json").state == "running":
                break
            await pilot.pause(0.2)
        assert type(app.screen).__name__ == "MonitorScreen", type(app.screen).__name__
        await pilot.press("ctrl+q")
asyncio.run(walk())
print("WIZARD-EXITED", app.return_code, read_status(run_dir + "/status.json").state, flush=True)
time.sleep(600)
"""


def _read_until(fd: int, marker: bytes, seconds: float) -> bytes:
    seen = b""
    end = time.monotonic() + seconds
    # the marker's whole line: a pty may hand over the marker and the rest of its line in two reads
    while (marker not in seen or b"\n" not in seen[seen.index(marker):]) and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


@pytest.mark.slow
def test_a_wizard_launched_run_survives_the_wizards_exit_and_the_terminals_hangup(tmp_path):
    run = RunDir(tmp_path / "run")
    master, slave = pty.openpty()
    child = subprocess.Popen([sys.executable, "-c", WIZARD_CHILD, str(run.path), *LONG], stdin=slave, stdout=slave,
                             stderr=slave, start_new_session=True)
    os.close(slave)
    tree: dict[int, float] = {}
    try:
        out = _read_until(master, b"WIZARD-EXITED", 240)
        assert b"WIZARD-EXITED 0 running" in out, out.decode(errors="replace")[-3000:]
        tree = _run_processes(run)
        st = read_status(run.status)
        assert os.getsid(st.launcher_pid) != child.pid           # not in the terminal's session
        os.close(master)                                          # the terminal goes away: SIGHUP to its session
        master = -1
        assert child.wait(30) == -signal.SIGHUP
        before = _steps(run)
        _wait(lambda: _steps(run) >= before + 3, STEP_WAIT_SECONDS, "steps after the hang-up")
        assert read_status(run.status).state == "running" and not _alive({child.pid: 0.0})
    finally:
        if master >= 0:
            os.close(master)
        if child.poll() is None:
            child.kill()
        _stop_and_check(run, tree)


@pytest.mark.slow
def test_monitor_launch_runs_in_the_background_q_detaches_and_s_s_stops(tmp_path):
    from scaletrain.tui.monitor.app import create_monitor_app, detached_note

    run = make_run(tmp_path, "ddp", lr=5e-3, max_steps=100000)
    app = create_monitor_app(run.path, start=True, interval_s=0.3)
    tree: dict[int, float] = {}

    async def go(keys: list[str]) -> str:
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(900):
                if _steps(run) >= 1:
                    break
                await pilot.pause(0.2)
            for key in keys:
                await pilot.press(key)
                await pilot.pause(0.3)
            return str(app.screen.query_one("#mon-status").render())

    try:
        status_line = asyncio.run(go(["q"]))
        tree = _run_processes(run)
        assert "in the background" in status_line
        assert app.return_code == 0 and read_status(run.status).state == "running"
        note = detached_note(run.path)
        assert note and "keeps training" in note and f"scaletrain stop {run.path}" in note
        before = _steps(run)
        _wait(lambda: _steps(run) > before, STEP_WAIT_SECONDS, "steps after the monitor closed")

        app = create_monitor_app(run.path, interval_s=0.3)          # attach again; s asks, esc keeps it running
        asyncio.run(go(["s", "escape"]))
        assert read_status(run.status).state == "running"
        app = create_monitor_app(run.path, interval_s=0.3)

        async def stop_twice() -> str:
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot.press("s")
                asked = str(app.screen.query_one("#mon-status").render())
                await pilot.press("s")
                said = ""
                for _ in range(900):                 # (the sampler's worker runs until the app closes)
                    said = str(app.screen.query_one("#mon-status").render())
                    if "stopped:" in said or "not stopped" in said:
                        break
                    await pilot.pause(0.2)
                return asked + "\n" + said

        said = asyncio.run(stop_twice())
        assert "press s again" in said and "stopped: every rank ended; status interrupted" in said
        assert _alive(tree) == []
    finally:
        tree.update(_run_processes(run))
        stop_run(run.path)
        assert _alive(tree) == []


def test_runs_lists_a_launcher_that_died_without_a_final_state_and_prunes_deleted_folders(tmp_path, capsys):
    import shutil
    import socket

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = make_run(tmp_path, "ddp", name="died")
    run.status.write_text(json.dumps({"state": "running", "pids": {"launcher": dead.pid},
                                      "host": socket.gethostname()}))
    gone = make_run(tmp_path, "ddp", name="gone")
    register_run(run.path, launcher_pid=dead.pid)
    entry = register_run(gone.path, launcher_pid=dead.pid)
    shutil.rmtree(gone.path)
    rows = {r.path: r for r in list_runs()}
    assert rows[run.path].state == DIED and gone.path not in rows
    assert not entry.exists() and entry.parent == registry_dir()
    capsys.readouterr()
    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    assert f"{DIED}" in out and "never recorded how the run ended" in out
    assert main(["stop", str(run.path)]) == 0 and "not running" in capsys.readouterr().out
    assert main(["stop", str(tmp_path / "nowhere")]) == 2
    assert main(["--preset", "cpu-tiny", "--detach"]) == 2                    # --detach needs --headless
    assert Path(registry_dir()).is_dir()

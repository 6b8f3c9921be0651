"""Issue 14, done-when 2, with real 2-rank CPU runs (accelerate → torchrun → gloo): whatever ends the launcher —
a closed terminal (SIGHUP) or SIGKILL — no process is left and status.json ends in a final state; one launch per
run directory, even when two start together; a full disk ends as `disk_full` with a final status; a pickle in a
checkpoint is never executed, a damaged newest checkpoint is passed over, and resume leaves every step once in
metrics.jsonl; a SIGKILLed rank with no OOM kill on the host is `killed`, not host_oom."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from scaletrain.engine.doctor.diagnosis import diagnose_paths
from scaletrain.engine.launch.launcher import launch
from scaletrain.engine.run.metrics import read_metrics
from scaletrain.engine.launch.runlock import RunLock
from scaletrain.tui.cli.main import main

from test_launcher import FAILING_SCRIPT, _survivors, _tree, _wait_for_steps
from test_train_cpu import deadline_tick, make_run

CLI = [sys.executable, "-c", "import sys; from scaletrain.tui.cli.main import main; sys.exit(main())"]
GONE_LIMIT_SECONDS = 60        # a signal to the launcher → every process it started is gone
FINAL_STATES = ("finished", "failed", "interrupted")


def _start(run, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "launch", str(run.path), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _watch_tree(proc: subprocess.Popen, looks: int = 5) -> dict[int, float]:
    tree: dict[int, float] = {}
    for _ in range(looks):                      # the launcher, accelerate, the ranks and the watchdog
        tree.update(_tree(proc.pid))
        time.sleep(0.1)
    return tree


def _all_gone(tree: dict[int, float], limit: float = GONE_LIMIT_SECONDS) -> list[str]:
    deadline = time.monotonic() + limit
    while _survivors(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _survivors(tree)


def _status(run) -> dict:
    return json.loads(run.status.read_text())


@pytest.mark.slow
def test_sighup_and_sigkill_of_the_launcher_leave_no_process_and_a_final_status(tmp_path):
    run = make_run(tmp_path, "ddp", lr=5e-3, max_steps=2000, checkpoint_every=4)

    # a closed terminal: SIGHUP stops the run like Ctrl-C
    proc = _start(run)
    _wait_for_steps(run, 5, proc)
    tree = _watch_tree(proc)
    ranks = {int(r): p for r, p in _status(run)["rank_pids"].items()}
    assert set(ranks) == {0, 1} and set(ranks.values()) <= set(tree)
    second = subprocess.run([*CLI, "launch", str(run.path), "--resume"], capture_output=True, text=True, timeout=120)
    assert second.returncode == 2 and "already running" in second.stderr, second.stderr     # not while it runs
    assert second.stderr.count("\n") == 1 and _status(run)["state"] == "running"
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=GONE_LIMIT_SECONDS)
    assert proc.returncode == 130, out
    assert _all_gone(tree) == [], "processes left behind after SIGHUP"
    st = _status(run)
    assert st["state"] == "interrupted" and st["exit_code"] == 130 and st["pids"]["launcher"] == proc.pid
    assert diagnose_paths([run.path]).kind == "interrupted"

    # SIGKILL: nothing in the launcher runs; its watchdog stops the rest and writes the final state
    proc = _start(run, "--resume")
    _wait_for_steps(run, len(read_metrics(run.metrics)) + 3, proc)
    tree = _watch_tree(proc)
    watchdogs = [p for p in tree if "scaletrain.engine.launch.watchdog" in " ".join(psutil.Process(p).cmdline())]
    assert len(watchdogs) == 1
    assert _status(run)["state"] == "running"
    proc.kill()
    proc.communicate(timeout=30)
    assert _all_gone(tree) == [], "processes left behind after SIGKILL of the launcher"
    st = _status(run)
    assert st["state"] == "interrupted" and "was killed" in st["reason"] and st["ended"]
    d = diagnose_paths([run.path])
    assert d.kind == "interrupted" and "was killed" in d.summary
    RunLock(run.node_lock()).acquire("the run").release()          # the lock went with the last process


SHORT_SCRIPT = """\
import os, time
print(f"rank {os.environ['RANK']} runs", flush=True)
time.sleep(3)
"""


@pytest.mark.slow
def test_two_launches_started_together_exactly_one_runs(tmp_path):
    run = make_run(tmp_path, "ddp")
    script = tmp_path / "short.py"
    script.write_text(SHORT_SCRIPT)
    for trial in range(3):
        procs = [subprocess.Popen([*CLI, "launch", str(run.path), "--script", str(script)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        results = [p.communicate(timeout=180) for p in procs]
        codes = sorted(p.returncode for p in procs)
        assert codes == [0, 2], (trial, codes, [r[1][-500:] for r in results])
        refused = next(r for p, r in zip(procs, results) if p.returncode == 2)
        assert "already running" in refused[1] and refused[1].count("\n") == 1 and refused[0] == ""
        assert _status(run)["state"] == "finished"
        ran = sum(1 for line in run.rank_log(0).read_text().splitlines() if line == "rank 0 runs")
        assert ran == trial + 1                                     # one more run per trial, never two


def _mount_small_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True)
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def _fill(path: Path, leave: int) -> None:
    """Write zeros into `path` until the filesystem has about `leave` bytes free (0: until it refuses)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.statvfs(path).f_bavail * os.statvfs(path).f_frsize > leave + 4096 and os.write(fd, b"\0" * 4096):
            pass
        while leave == 0 and os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.mark.slow
def test_a_full_disk_ends_as_disk_full_with_a_final_status(tmp_path):
    small = tmp_path / "small"
    if not _mount_small_tmpfs(small, "16m"):
        pytest.skip("mounting a small tmpfs needs root (mount -t tmpfs); a full disk cannot be made otherwise")
    try:
        d = small / "run"
        # the run fits when it starts (launch checks: 3 checkpoints of about 2 MiB), then another process fills
        # the disk before the first checkpoint is written
        assert main(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(d), "--set",
                     "train.max_steps=60", "--set", "train.checkpoint_every=20"]) == 0
        proc = subprocess.Popen([*CLI, "launch", str(d)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not (d / "status.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        _fill(small / "filler", leave=64 << 10)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode not in (0, 2) and "Traceback" not in err, (out + err)[-2000:]
        st = json.loads((d / "status.json").read_text())
        assert st["state"] == "failed" and st["ended"] and st["disk_free_bytes"] < 1 << 20
        diag = subprocess.run([*CLI, "diagnose", str(d), "--json"], capture_output=True, text=True, timeout=120)
        assert diag.returncode == 0 and json.loads(diag.stdout)["kind"] == "disk_full", diag.stdout + diag.stderr
        mon = subprocess.run([*CLI, "monitor", str(d), "--headless"], capture_output=True, text=True, timeout=120)
        assert "run failed" in mon.stdout and "disk_full" in mon.stdout and "Traceback" not in mon.stderr
        # writing a run directory onto the full disk: one line, nothing half-written left
        _fill(small / "filler2", leave=0)
        before = sorted(p.name for p in small.iterdir())
        w = subprocess.run([*CLI, "--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir",
                            str(small / "other")], capture_output=True, text=True, timeout=120)
        assert w.returncode == 2 and w.stderr.count("\n") == 1 and "disk is full" in w.stderr, w.stderr
        assert sorted(p.name for p in small.iterdir()) == before
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


class _Evil:
    """A pickle that would run a command when loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.slow
def test_a_fresh_launch_over_a_trained_run_keeps_the_earlier_training_apart(demo_run, tmp_path):
    """`scaletrain launch RUN` without --resume on a run that trained (a copy of the shared demo run: checkpoints at
    6 and 12, step 12 exported), now planned for 6 steps: the new step-6/ replaced the old one while the old
    step-12/ stayed, so a later --resume continued the OLD run's step 12; the end-of-run export was refused by
    the old export/step-12/ (a warning in the rank log only). Now the earlier checkpoints, metrics and export move
    to attempts/<n>-<stamp>/ and the launch says so."""
    run = demo_run.copy(tmp_path / "run")
    old12 = (run.checkpoints / "step-12" / "trainer_state.json").read_bytes()
    plan = json.loads(run.plan.read_text())
    plan["train"]["max_steps"] = 6
    run.plan.write_text(json.dumps(plan))

    out = subprocess.run([*CLI, "launch", str(run.path)], capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL, env=dict(os.environ, COLUMNS="400"))
    assert out.returncode == 0, out.stdout + out.stderr + run.rank_log(0).read_text()[-2000:]
    (aside,) = (run.path / "attempts").iterdir()
    assert (f"this launch starts at step 0: the earlier launch's checkpoints, metrics.jsonl, tensorboard, export "
            f"moved to attempts/{aside.name}/; `--resume` would have continued from its step-12") in out.stdout
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step-6"]        # this run's only
    assert run.newest_checkpoint() == run.checkpoints / "step-6"
    assert (aside / "checkpoints" / "step-12" / "trainer_state.json").read_bytes() == old12
    assert sorted(p.name for p in (aside / "export").iterdir()) == ["step-12"]
    assert json.loads((aside / "launch.json").read_text())["newest_checkpoint"] == "step-12"
    assert [r.step for r in read_metrics(run.metrics)] == list(range(1, 7))      # one series, this run's
    assert json.loads((run.export_dir(6) / "export.json").read_text())["step"] == 6
    assert "export of step" not in run.rank_log(0).read_text().split("==> scaletrain launch")[-1]  # no failure


@pytest.mark.slow
def test_launch_set_replans_the_run_and_resumes_when_the_change_allows(demo_run, tmp_path):
    """`scaletrain launch RUN --set micro_batch=2 --set grad_accum=4 --resume` on a copy of the shared demo run cut
    back to its step-6 checkpoint (micro 4 × accum 2): the plan is re-planned with the split (the same samples per
    rank per step, so step-6 resumes), every file rewritten with the old ones under attempts/, and the run trains
    steps 7-12 once each. A change the checkpoint cannot resume under, with --resume, is one line and changes
    nothing. Editing plan.json by hand is refused (tests/frontends/test_edited_plan.py): this is the way."""
    import shutil

    run = demo_run.copy(tmp_path / "run")
    shutil.rmtree(run.checkpoints / "step-12")
    cli = dict(capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, env=dict(os.environ, COLUMNS="400"))
    out = subprocess.run([*CLI, "launch", str(run.path), "--set", "micro_batch=2", "--set", "grad_accum=4",
                          "--resume"], **cli)
    assert out.returncode == 0, out.stdout + out.stderr + run.rank_log(0).read_text()[-2000:]
    (attempt,) = (run.path / "attempts").iterdir()
    assert (f"applied micro_batch=2, grad_accum=4; resuming from step-6; previous files in attempts/{attempt.name}"
            in out.stdout)
    plan = json.loads(run.plan.read_text())
    assert (plan["batch"]["micro_batch"], plan["batch"]["grad_accum"]) == (2, 4)
    assert json.loads((attempt / "plan.json").read_text())["batch"]["micro_batch"] == 4
    assert f"resumed from {run.checkpoints / 'step-6'} at step 6" in run.rank_log(0).read_text()
    assert [r.step for r in read_metrics(run.metrics)] == list(range(1, 13))

    refused = subprocess.run([*CLI, "launch", str(run.path), "--set", "strategy=zero2", "--resume"], **cli)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert ("cannot resume step-12 after this change: strategy changes the checkpoint's format or the data; launch "
            "without --resume to start over") in refused.stderr
    assert len(list((run.path / "attempts").iterdir())) == 1 and json.loads(run.plan.read_text()) == plan


@pytest.mark.slow
def test_resume_runs_no_pickle_skips_a_damaged_checkpoint_and_keeps_each_step_once(ddp_run, tmp_path):
    """A copy of the shared DDP run (tests/conftest.py: 24 steps, checkpoints at 10, 20 and 24) with its two newest
    checkpoints damaged, resumed: it falls back to step-10 and trains on from there."""
    import torch

    run = ddp_run.copy(tmp_path / "run")
    losses = {r.step: r.loss for r in read_metrics(run.metrics)}
    marker = tmp_path / "PWNED"
    # step-24: a tampered scheduler.pt (its size recorded as if written, so the load itself is what refuses it)
    ck24 = run.checkpoints / "step-24"
    torch.save({"lr_lambdas": [_Evil(marker)]}, ck24 / "scheduler.pt")
    state = json.loads((ck24 / "trainer_state.json").read_text())
    state["files"]["scheduler.pt"] = (ck24 / "scheduler.pt").stat().st_size
    (ck24 / "trainer_state.json").write_text(json.dumps(state))
    # step-20: a truncated optimizer state (a crash or a full disk during the save)
    opt = run.checkpoints / "step-20" / "optimizer.bin"
    opt.write_bytes(opt.read_bytes()[:1000])
    with run.metrics.open("a") as f:                              # a torn last line, as a killed writer leaves
        f.write('{"step": 25, "total_st')
    plan = json.loads(run.plan.read_text())
    plan["train"]["max_steps"] = 26
    run.plan.write_text(json.dumps(plan))

    res = launch(run.path, resume=True, on_tick=deadline_tick())
    log = run.rank_log(0).read_text()
    assert res.exit_code == 0, log[-3000:]
    assert not marker.exists(), "the pickle in scheduler.pt was executed"
    assert "checkpoint step-24 cannot be loaded (a file in it asks to run posix.system; refused" in log
    assert "checkpoint step-20 cannot be loaded (step-20/optimizer.bin has 1,000 bytes" in log
    assert f"resumed from {run.checkpoints / 'step-10'} at step 10" in log
    steps = [json.loads(line)["step"] for line in run.metrics.read_text().splitlines()]
    assert steps == list(range(1, 27))                              # each step once: no duplicate, no torn line
    resumed = {r.step: r.loss for r in read_metrics(run.metrics)}
    assert resumed[11] == pytest.approx(losses[11], rel=1e-4)       # from step 10's exact state again


@pytest.mark.slow
def test_fsdp_resume_reads_the_dcp_shards_and_continues_bit_exactly(fsdp_run, tmp_path):
    """FSDP2 (DTensor shards, DCP checkpoints): a copy of the shared FSDP run (tests/conftest.py: 12 steps, checkpoints
    at 6 and 12), resumed from step 6 past a truncated step-12 shard, repeats steps 7-12 bit for bit: the same losses
    and grad norms, and the same weights in the new step-12 checkpoint."""
    import torch

    from scaletrain.trainer.fsdp import full_model_state
    from test_train_cpu import assert_fsdp_sharded

    run = fsdp_run.copy(tmp_path / "run")
    assert_fsdp_sharded(run, 6)
    first = {r.step: r for r in read_metrics(run.metrics)}
    weights12 = full_model_state(run.checkpoints / "step-12")
    shard = run.checkpoints / "step-12" / "dcp" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])          # rank 1's shard of the newest checkpoint, cut short
    plan = json.loads(run.plan.read_text())
    plan["train"]["export_at_end"] = False                # step 12 is exported already (the shared run's export)
    run.plan.write_text(json.dumps(plan))

    res = launch(run.path, resume=True, on_tick=deadline_tick())
    log = run.rank_log(0).read_text()
    assert res.exit_code == 0, log[-3000:]
    assert "checkpoint step-12 cannot be loaded (step-12/dcp/__1_0.distcp has 1,000 bytes" in log
    assert f"resumed from {run.checkpoints / 'step-6'} at step 6" in log
    again = {r.step: r for r in read_metrics(run.metrics)}
    assert sorted(again) == list(range(1, 13))
    for step in range(7, 13):
        assert (again[step].loss, again[step].grad_norm) == (first[step].loss, first[step].grad_norm), step
    redone = full_model_state(run.checkpoints / "step-12")
    assert redone.keys() == weights12.keys() and all(torch.equal(redone[k], weights12[k]) for k in weights12)
    assert_fsdp_sharded(run, 12)


def test_a_dcp_checkpoint_runs_no_pickle_from_its_metadata(tmp_path):
    """DCP's own reader unpickles .metadata with plain pickle: the trainer's allows DCP's metadata classes only."""
    from scaletrain.trainer.checkpoints import _why
    from scaletrain.trainer.fsdp import full_model_state

    marker = tmp_path / "PWNED"
    ck = tmp_path / "step-2"
    (ck / "dcp").mkdir(parents=True)
    (ck / "dcp" / ".metadata").write_bytes(pickle.dumps(_Evil(marker)))
    with pytest.raises(pickle.UnpicklingError) as e:
        full_model_state(ck)
    assert not marker.exists()
    assert _why(e.value) == "a file in it asks to run posix.system; refused, nothing from it was executed"


def test_safe_load_refuses_a_pickle_that_would_run_code(tmp_path):
    import torch

    from scaletrain.trainer.checkpoints import _why, safe_load

    marker = tmp_path / "PWNED"
    path = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.zeros(2)}, "ds_config": _Evil(marker)}, path)
    with pytest.raises(pickle.UnpicklingError) as e:
        safe_load(path)
    assert not marker.exists() and "posix.system" in _why(e.value)
    torch.save({"module": {"w": torch.ones(2)}, "step": 3}, path)                 # plain tensors load
    assert safe_load(path)["step"] == 3


def test_truncate_metrics_keeps_one_monotone_series_through_the_step(tmp_path):
    from scaletrain.engine.run.metrics import MetricsWriter, truncate_metrics

    rec = '{{"step": {}, "total_steps": 9, "epoch": 0, "loss": 1, "lr": 1, "tokens_per_second": 1, ' \
          '"step_seconds": 1, "world_size": 1, "time": 0}}'
    p = tmp_path / "metrics.jsonl"
    lines = [rec.format(s) for s in (1, 2, 3, 4, 5, 3, 4, 5, 6)]          # an old resume's abandoned stretch
    p.write_text("\n".join(lines) + "\n" + '{"step": 7, "to')
    assert truncate_metrics(p, 4) == 6
    assert [json.loads(x)["step"] for x in p.read_text().splitlines()] == [1, 2, 3, 4]
    p.write_text(rec.format(1) + "\n" + '{"step": 2, "tot')                # torn tail without a resume
    MetricsWriter(p).close()
    assert p.read_text() == rec.format(1) + "\n"


@pytest.mark.slow
def test_a_sigkilled_rank_without_an_oom_kill_is_killed_not_host_oom(tmp_path):
    run = make_run(tmp_path, "ddp")
    script = tmp_path / "train.py"
    script.write_text(FAILING_SCRIPT)
    res = launch(run.path, script=str(script), script_args=["kill"], on_tick=deadline_tick(120))
    assert (res.first_failing_rank, res.failing_rank_exit_code) == (1, -9)
    ooms = _status(run).get("oom_kills")
    if ooms is None:
        pytest.skip("/proc/vmstat has no oom_kill counter here")
    d = diagnose_paths([run.path])
    if ooms:
        assert d.kind == "host_oom"              # the host really OOM-killed something during the run
        return
    assert (d.kind, d.rank) == ("killed", 1) and "OOM killer did not act" in d.summary
    assert not any("micro" in r.title or "offload" in r.title for r in d.remedies)   # no memory remedies


def test_a_running_status_whose_launcher_is_gone_reads_as_interrupted(tmp_path):
    """Both the launcher and its watchdog SIGKILLed (kill -9 of everything): readers still see the run ended, so
    `monitor --headless` exits and a new launch is not refused."""
    import socket

    from scaletrain.engine.launch.status import read_status

    gone = subprocess.Popen(["true"])
    gone.wait()
    path = tmp_path / "status.json"
    path.write_text(json.dumps({"state": "running", "pids": {"launcher": gone.pid}, "host": socket.gethostname()}))
    st = read_status(path)
    assert st.state == "interrupted" and st.over and "is gone" in st.reason and st.running_elsewhere() is None
    path.write_text(json.dumps({"state": "running", "pids": {"launcher": os.getpid()}, "host": socket.gethostname()}))
    assert read_status(path).state == "running"                       # alive: still running
    path.write_text(json.dumps({"state": "running", "pids": {"launcher": gone.pid}, "host": "another-node"}))
    assert read_status(path).state == "running"                       # another host's pid says nothing here

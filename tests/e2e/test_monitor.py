"""The monitor, driven by Textual's pilot: recorded NVML samples, and a real CPU run through the real launcher
that is killed on one rank, diagnosed, fixed with one key and resumed from its checkpoint. Plus the headless
stream of a live run, and apply-and-relaunch's refusals.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.metrics import read_metrics
from scaletrain.engine.request.presets import load_preset, train_options
from scaletrain.engine.run.plan_document import PlanDocument, read_plan_document
from scaletrain.engine.launch.relaunch import apply_remedy, resume_blocker, split_changes
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.sampling.host import HostSource
from scaletrain.engine.sampling.gpu import ReplaySource
from scaletrain.engine.sampling.watcher import RunWatcher
from scaletrain.engine.sampling.sampler import Sampler
from scaletrain.engine.run.writers import write_run_dir
from scaletrain.tui.monitor.app import create_monitor_app
from scaletrain.tui.widgets.gpu_panel import GpuPanel, HostPanel
from scaletrain.tui.widgets.gpu_row import GpuRow
from scaletrain.tui.widgets.job_panel import JobPanel
from scaletrain.tui.widgets.remedies import RemediesPanel
from scaletrain.tui.widgets.remedy_confirm import RemedyConfirm

NVML = Path(__file__).parents[1] / "fixtures" / "nvml"
RUN_TIMEOUT_S = 240           # a tiny 2-rank CPU run starts in ~15 s on 2 cores; generous for a loaded CI host


def run(coro):
    return asyncio.run(coro)


def text_of(widget) -> str:
    c = Console(width=140, record=True, file=io.StringIO())
    c.print(widget.content)
    return c.export_text()


def cpu_run_dir(path: Path, max_steps: int = 6, checkpoint_every: int = 2) -> RunDir:
    """The cpu-tiny preset (tiny Qwen2, 2 gloo ranks, DDP), shortened."""
    preset = load_preset("cpu-tiny")
    req = PlanRequest(**preset.request_fields())
    train = train_options(preset, [f"train.max_steps={max_steps}", f"train.checkpoint_every={checkpoint_every}"])
    return write_run_dir(make_plan(req), req, train, path)


def gpu_run_dir(path: Path) -> RunDir:
    """A finished 2-GPU run's directory, as the trainer and launcher leave it (no GPU needed to read it)."""
    req = PlanRequest(model="Qwen/Qwen2.5-0.5B-Instruct", gpus="8xRTX4090", strategy="zero2", micro_batch=2,
                      grad_accum=4, grad_ckpt=True, offload="none", seq_len=1024)
    plan = make_plan(req)
    path.mkdir()
    (path / "plan.json").write_text(json.dumps(plan.to_json()))
    (path / "logs").mkdir()
    for r in range(8):
        (path / "logs" / f"rank-{r}.log").write_text(f"rank {r} ready\n")
    alloc = plan.memory.allocated_peak_bytes
    lines = [{"step": s, "total_steps": 4, "epoch": s / 4, "loss": 2.0 - s / 10, "lr": 1e-5, "tokens_per_second": 9e4,
              "step_seconds": 1.5, "world_size": 8, "time": 1763700000.0 + s,
              "peak_memory": [{"rank": r, "allocated_bytes": alloc * (2 if r == 3 else 1), "reserved_bytes": None,
                               "host_rss_bytes": 3 * 2**30} for r in range(8)]} for s in (1, 2)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (path / "status.json").write_text(json.dumps({"state": "running", "pids": {"0": 41000, "3": 41003}}))
    return RunDir(path)


async def wait_for(pilot, cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.2)


# ---- recorded NVML samples --------------------------------------------------------------------------------------
def test_gpu_lines_from_recorded_samples_with_prediction_and_warning(tmp_path):
    """8 GPUs: one line each (the compact layout, above 4 GPUs), even on a wide terminal."""
    rd = gpu_run_dir(tmp_path / "run")

    async def go():
        s = Sampler(ReplaySource(NVML / "rtx4090x8_training.jsonl"), None, RunWatcher(rd.path), 0.1)
        app = create_monitor_app(rd.path, sampler=s)
        async with app.run_test(size=(170, 60)) as pilot:
            await wait_for(pilot, lambda: len(app.screen.query(GpuRow)) == 8
                           and app.screen.query_one(JobPanel).last is not None, 10, "8 GPU lines")
            await pilot.pause(0.5)
            assert not app.screen.query(GpuPanel)
            rows = list(app.screen.query(GpuRow))
            assert [p.index for p in rows] == list(range(8))
            t3 = text_of(rows[3])
            assert "GPU3" in t3 and "°C" in t3 and "/450 W" in t3 and "GiB/23.99 GiB" in t3
            assert "▼" in t3 and "rank 3" in t3                              # predicted peak; this run's rank
            assert "rank 0" in text_of(rows[0]) and "pid 41001" in text_of(rows[1])
            job = text_of(app.screen.query_one("#job-numbers"))
            assert "step 2/4" in job and "ETA" in job and "90,000 tok/s" in job
            assert "rank 3: measured peak" in job                              # the early warning, rank 3 only
            assert "over!" not in job                                          # no per-rank table when compact

    run(go())


def test_lost_gpu_na_fields_and_mig(tmp_path):
    rd = gpu_run_dir(tmp_path / "run")

    async def go():
        s = Sampler(ReplaySource(NVML / "edge_na_lost_mig.jsonl"), None, RunWatcher(rd.path), 0.1)
        app = create_monitor_app(rd.path, sampler=s)
        async with app.run_test(size=(170, 50)) as pilot:
            await wait_for(pilot, lambda: len(app.screen.query(GpuPanel)) == 3, 10, "3 GPU panels")
            await pilot.pause()
            p0, p1, p2 = app.screen.query(GpuPanel)
            assert "N/A" in text_of(p0) and "util" in text_of(p0)
            assert p1.has_class("-lost") and "ERROR: GPU lost" in text_of(p1)
            t2 = text_of(p2)
            assert "MIG 2:0" in t2 and "MIG 2:2" in t2 and "util N/A on MIG" in t2

    run(go())


def test_rank_filter_cycles_the_log_tail(tmp_path):
    rd = gpu_run_dir(tmp_path / "run")

    async def go():
        s = Sampler(None, None, RunWatcher(rd.path), 0.1)
        app = create_monitor_app(rd.path, sampler=s)
        async with app.run_test(size=(170, 50)) as pilot:
            jp = app.screen.query_one(JobPanel)
            await wait_for(pilot, lambda: len(jp.lines) == 8, 10, "log lines")
            assert jp.rank_filter is None
            await pilot.press("r")
            assert jp.rank_filter == 0
            await pilot.press("r")
            assert jp.rank_filter == 1
            assert [ln for r, ln in jp.lines if jp._keep(r)] == ["rank 1 ready"]

    run(go())


# ---- a real CPU run ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_cpu_run_live_then_killed_rank_diagnosed_then_fixed_and_resumed(tmp_path, monkeypatch):
    """Done-when: live job numbers on a real CPU run, in the monitor and headless; a killed rank diagnosed;
    `a` applies a remedy and the run resumes from its checkpoint."""
    from scaletrain.tui.cli.monitor import stream_run

    rd = cpu_run_dir(tmp_path / "run")
    monkeypatch.setenv("SCALETRAIN_FAIL_AT_STEP", "3")       # trainer/train.py's test hook: SIGKILL rank 1 at step 3
    monkeypatch.setenv("SCALETRAIN_FAIL_RANK", "1")
    # ... as the kernel's OOM killer would: its kill count goes up during the run (the launcher records it; an
    # unchanged count makes the same SIGKILL `killed`, not host_oom: tests/e2e/test_run_lifecycle.py)
    kills = iter(range(100, 200))
    monkeypatch.setattr("scaletrain.engine.launch.launcher.oom_kill_count", lambda: next(kills))
    headless = io.StringIO()                                  # `scaletrain monitor --headless`, attached meanwhile
    streamer = threading.Thread(target=lambda: stream_run(Sampler(None, HostSource(), RunWatcher(rd.path), 0.3),
                                                          headless), daemon=True)
    streamer.start()
    chosen: dict = {}

    async def go():
        s = Sampler(None, HostSource(), RunWatcher(rd.path), 0.3)
        # in this process: the OOM-kill count patched above is the launcher's own (a background launch is another
        # process; tests/e2e/test_detach.py covers it)
        app = create_monitor_app(rd.path, sampler=s, start=True, detach=False)
        async with app.run_test(size=(170, 60)) as pilot:
            scr = app.screen
            jp = scr.query_one(JobPanel)
            await wait_for(pilot, lambda: jp.last is not None and jp.last.summary is not None, RUN_TIMEOUT_S,
                           "the first step in the job panel")
            assert jp.last.summary.total_steps == 6 and jp.last.summary.tokens_per_second > 0
            assert "step " in text_of(scr.query_one("#job-numbers"))
            host = scr.query_one(HostPanel)                      # a CPU run: host numbers per rank, no GPU panels
            assert not scr.query(GpuPanel)
            await wait_for(pilot, lambda: "rank 0" in text_of(host) and "rank 1" in text_of(host), 30,
                           "rank rows in the host panel")
            rem = scr.query_one(RemediesPanel)
            await wait_for(pilot, lambda: rem.diagnosis is not None, RUN_TIMEOUT_S, "the automatic diagnosis")
            d = rem.diagnosis
            assert (d.kind, d.rank) == ("host_oom", 1)
            assert rem.display
            split = next(i for i, r in enumerate(d.remedies) if set(r.changes) == {"micro_batch", "grad_accum"})
            chosen.update(d.remedies[split].changes)
            scr.query_one("#remedy-list").highlighted = split
            await pilot.press("a")                                # asks first (widgets/remedy_confirm.py) …
            await wait_for(pilot, lambda: isinstance(app.screen, RemedyConfirm), 60, "the confirmation")
            await pilot.press("y")                                # … and applies on y
            await wait_for(pilot, lambda: not rem.display, 30, "the remedy to be applied")
            await wait_for(pilot, lambda: scr.workers and not any(w.group == "launch" and w.is_running
                                                                  for w in scr.workers)
                           and jp.last.status.state == "finished", RUN_TIMEOUT_S, "the resumed run to finish")

    run(go())
    streamer.join(30)
    text = headless.getvalue()
    assert "step 1/6 [####" in text and "step 3/6 [####" in text and "loss" in text and "tok/s" in text and "ETA" in text
    assert "host cpu" in text and "rank 1 pid" in text
    assert "run failed: exit code 137" in text and "host_oom rank 1 node 0:" in text    # the doctor's verdict, headless
    plan = read_plan_document(rd.plan)
    assert (plan.batch.micro_batch, plan.batch.grad_accum) == (chosen["micro_batch"],
                                                               chosen["grad_accum"])  # applied
    attempts = list((rd.path / "attempts").iterdir())
    assert len(attempts) == 1 and (attempts[0] / "plan.json").exists()               # the old plan, kept
    assert json.loads((attempts[0] / "plan.json").read_text())["batch"]["micro_batch"] == 4
    log0 = rd.rank_log(0).read_text()
    assert "resumed from" in log0 and "checkpoints/step-2 at step 2" in log0
    steps = [m.step for m in read_metrics(rd.metrics)]
    assert steps == [1, 2, 3, 4, 5, 6]                       # one monotone series across the relaunch


# ---- apply-and-relaunch refusals ---------------------------------------------------------------------------------
def test_apply_refuses_hardware_running_and_unresumable_changes(tmp_path):
    rd = cpu_run_dir(tmp_path / "run")
    with pytest.raises(ScaletrainError, match="changes the hardware"):
        apply_remedy(rd.path, {"gpus": "4xCPU"})
    with pytest.raises(ScaletrainError, match="not a plan field"):
        apply_remedy(rd.path, {"warp_speed": 9})
    ck = rd.checkpoints / "step-2"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text("{}")
    with pytest.raises(ScaletrainError, match="cannot resume step-2.*strategy"):
        apply_remedy(rd.path, {"strategy": "zero3"})
    applied = apply_remedy(rd.path, {"strategy": "zero3"}, restart=True)       # step 0, old checkpoints kept
    assert not applied.resume and (applied.backup_dir / "checkpoints" / "step-2").is_dir()
    assert rd.ds_config.exists() and read_plan_document(rd.plan).training.strategy == "zero3"
    (rd.status).write_text(json.dumps({"state": "running", "pids": {"launcher": 1}}))
    with pytest.raises(ScaletrainError, match="still running"):
        apply_remedy(rd.path, {"grad_ckpt": True})


def test_resume_rules():
    old = make_plan(PlanRequest(model="scaletrain/tiny-qwen2", gpus="2xCPU", strategy="ddp", micro_batch=4,
                                grad_accum=2, grad_ckpt=False, offload="none", precision="fp32")).to_json()

    def blocker(**ch):
        p, t, _ = split_changes(ch)
        new = make_plan(PlanRequest(model="scaletrain/tiny-qwen2", gpus="2xCPU", **{
            "strategy": "ddp", "micro_batch": 4, "grad_accum": 2, "grad_ckpt": False, "offload": "none",
            "precision": "fp32", **p}))
        return resume_blocker(PlanDocument.from_json(old), new, p, t)

    assert blocker(micro_batch=2, grad_accum=4) is None
    assert blocker(grad_ckpt=True) is None
    assert "samples per step" in blocker(micro_batch=2, grad_accum=2)
    assert "seq_len" in blocker(seq_len=64)
    assert "train option lr" in blocker(**{"train.lr": 0.1})
    assert split_changes({"env.NCCL_DEBUG": "INFO", "train.lr": 1.0, "offload": "none"}) == (
        {"offload": "none"}, {"lr": 1.0}, {"NCCL_DEBUG": "INFO"})

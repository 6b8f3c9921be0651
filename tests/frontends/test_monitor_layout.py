"""The monitor's layouts, chart and edges: one line per GPU below 100 columns (full panels otherwise, up to 4 GPUs),
the whole run's loss / tokens/s / step time against the plan (textual-plotext), the TensorBoard command, a run
directory that does not exist yet (waited for, full-screen and headless), and `--headless --once`."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from pathlib import Path

import pytest

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.layout import RunDir, tensorboard_command
from scaletrain.engine.run.plan_document import read_plan_document
from scaletrain.engine.sampling.gpu import ReplaySource
from scaletrain.engine.sampling.sampler import Sampler, make_sampler
from scaletrain.engine.sampling.watcher import RunWatcher
from scaletrain.tui.cli.main import main
from scaletrain.tui.cli.monitor import stream_run
from scaletrain.tui.monitor.app import create_monitor_app
from scaletrain.tui.widgets.gpu_panel import GpuPanel
from scaletrain.tui.widgets.gpu_row import GpuRow
from scaletrain.tui.widgets.job_panel import JobPanel
from scaletrain.tui.widgets.run_chart import RunChart
from test_monitor import NVML, gpu_run_dir, text_of, wait_for


def run(coro):
    return asyncio.run(coro)


def long_run(path: Path, steps: int = 300) -> RunDir:
    """gpu_run_dir with `steps` steps of metrics (more than any recent window) and TensorBoard events."""
    rd = gpu_run_dir(path)
    lines = [{"step": s, "total_steps": steps, "epoch": s / steps, "loss": 5.0 - 4.0 * s / steps, "lr": 1e-5,
              "tokens_per_second": 8e4 + s, "step_seconds": 1.0 + s / 1000, "world_size": 8,
              "time": 1763700000.0 + s, "peak_memory": []} for s in range(1, steps + 1)]
    rd.metrics.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rd.tensorboard.mkdir()
    return rd


@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_three_gpus_full_panels_when_wide_one_line_each_when_narrow(tmp_path):
    rd = gpu_run_dir(tmp_path / "run")

    async def go(size):
        s = Sampler(ReplaySource(NVML / "edge_na_lost_mig.jsonl"), None, RunWatcher(rd.path), 0.1)
        app = create_monitor_app(rd.path, sampler=s)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: len(app.screen.query(GpuPanel)) + len(app.screen.query(GpuRow)) == 3,
                           10, "3 GPUs")
            await pilot.pause()
            panels, rows = list(app.screen.query(GpuPanel)), list(app.screen.query(GpuRow))
            texts = [text_of(r) for r in rows]
        return len(panels), texts

    assert run(go((170, 50))) == (3, [])
    n, texts = run(go((90, 40)))
    assert n == 0 and len(texts) == 3
    assert "N/A" in texts[0]                               # every NVML field can be N/A on its own
    assert "ERROR: GPU lost" in texts[1]
    assert "MIG" in texts[2]


@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_chart_holds_every_step_and_the_plans_speed(tmp_path):
    rd = long_run(tmp_path / "run")
    doc = read_plan_document(rd.plan)

    async def go():
        s = Sampler(ReplaySource(NVML / "rtx4090x8_training.jsonl"), None, RunWatcher(rd.path), 0.1)
        app = create_monitor_app(rd.path, sampler=s)
        async with app.run_test(size=(120, 40)) as pilot:
            chart = app.screen.query_one(RunChart)
            await wait_for(pilot, lambda: chart.series is not None, 10, "the chart")
            assert chart.kind == "loss" and len(chart.series) == 300          # the whole run, not a window
            assert chart.series.steps[0] == 1 and chart.series.loss[-1] == 1.0
            assert chart.series.planned_step_seconds == doc.planned_step_seconds
            assert chart.series.planned_tokens_per_second == doc.planned_tokens_per_second
            await pilot.press("g")
            assert chart.kind == "tokens"
            await pilot.pause()
            drawn = chart.plt.build()
            assert "plan" in drawn and "measured" in drawn and "tokens/s" in drawn
            await pilot.press("g")
            assert chart.kind == "step"
            job = text_of(app.screen.query_one("#job-numbers"))
            assert tensorboard_command(rd) in job.replace("\n", "")

    run(go())


def test_tensorboard_command_names_the_runs_event_folder(tmp_path):
    rd = RunDir(tmp_path / "my run")
    assert tensorboard_command(rd) == f"tensorboard --logdir '{rd.path}/tensorboard'"


def test_headless_once_prints_one_snapshot(tmp_path, capsys):
    rd = long_run(tmp_path / "run", steps=40)
    assert main(["monitor", str(rd.path), "--headless", "--once"]) == 0
    out = capsys.readouterr().out
    steps = [ln for ln in out.splitlines() if ln.startswith("step ")]
    assert steps == [ln for ln in steps if ln.startswith("step 40/40")] and len(steps) == 1
    assert f"tensorboard: {tensorboard_command(rd)}" in out


def test_headless_waits_for_a_run_dir_that_does_not_exist_yet(tmp_path):
    target = tmp_path / "later"
    out = io.StringIO()
    sampler = make_sampler(target, 0.1, nvml=False)
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(stream_run(sampler, out)), daemon=True)
    t.start()
    time.sleep(0.5)
    assert out.getvalue() == f"waiting for {target.resolve()}\n"        # said once, not every tick
    gpu_run_dir(target)
    (target / "status.json").write_text(json.dumps({"state": "finished", "exit_code": 0, "host": "elsewhere",
                                                    "started": "2026-12-03T15:01:25", "ended": "2026-12-03T16:03:25"}))
    t.join(20)
    assert not t.is_alive() and result == [0]
    text = out.getvalue()
    assert "step 2/4" in text and "run finished: exit code 0, after 62.0 min\n" in text    # the launch's wall time


def test_headless_once_on_a_missing_dir_says_it_does_not_exist(tmp_path, capsys):
    """One snapshot of a folder that is not there is an error (issue 23); without --once it is waited for."""
    assert main(["monitor", str(tmp_path / "nowhere"), "--headless", "--once"]) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and "nowhere does not exist" in err


def test_full_screen_waits_then_shows_the_run(tmp_path):
    target = tmp_path / "later"

    async def go():
        app = create_monitor_app(target, sampler=make_sampler(target, 0.1, nvml=False))
        async with app.run_test(size=(100, 30)) as pilot:
            jp = app.screen.query_one(JobPanel)
            await wait_for(pilot, lambda: jp.last is not None, 10, "a tick")
            assert f"waiting for {target.resolve()}" in text_of(app.screen.query_one("#job-numbers"))
            gpu_run_dir(target)
            await wait_for(pilot, lambda: jp.last.summary is not None, 10, "the run")
            assert "step 2/4" in text_of(app.screen.query_one("#job-numbers"))

    run(go())


def test_an_empty_dir_is_waited_for_a_foreign_one_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert RunWatcher(empty, wait=True).poll().waiting_for == f"waiting for {empty.resolve()}"
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(ScaletrainError, match="not a run directory"):
        RunWatcher(foreign, wait=True)
    with pytest.raises(ScaletrainError, match="not a directory"):
        RunWatcher(foreign / "cat.jpg", wait=True)

"""SVG snapshots of the monitor on 8 recorded RTX 4090s (tests/fixtures/nvml/rtx4090x8_training.jsonl, replayed by
engine.sampling.gpu.ReplaySource) at 80×24 and 120×40: both show all 8 GPUs, one line each (the compact layout).

The run directory is written at a fixed path with fixed metrics, and the sampler ticks once (a one-hour interval),
so the screens are the same everywhere. Look at new SVGs before accepting them with `--snapshot-update`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from scaletrain.engine.sampling.gpu import ReplaySource
from scaletrain.engine.sampling.sampler import Sampler
from scaletrain.engine.sampling.watcher import RunWatcher
from scaletrain.tui.monitor.app import create_monitor_app
from scaletrain.tui.widgets.gpu_row import GpuRow
from test_monitor import NVML, gpu_run_dir

RUN_DIR = Path("/tmp/scaletrain-snapshot/monitor-8gpu")


@pytest.fixture
def run_8gpu():
    if RUN_DIR.exists():
        shutil.rmtree(RUN_DIR)
    RUN_DIR.parent.mkdir(parents=True, exist_ok=True)
    rd = gpu_run_dir(RUN_DIR)
    (RUN_DIR / "tensorboard").mkdir()
    yield rd
    shutil.rmtree(RUN_DIR, ignore_errors=True)


def app_for(rd):
    sampler = Sampler(ReplaySource(NVML / "rtx4090x8_training.jsonl", loop=False), None, RunWatcher(rd.path), 3600)
    return create_monitor_app(rd.path, sampler=sampler)


async def all_eight_on_screen(pilot) -> None:
    """run_before: wait for the first tick, then check every GPU's line is inside the terminal."""
    app = pilot.app
    for _ in range(50):
        if len(app.screen.query(GpuRow)) == 8 and app.screen.query_one("#job-panel").last is not None:
            break
        await pilot.pause(0.1)
    await pilot.pause(0.3)
    rows = list(app.screen.query(GpuRow))
    assert [r.index for r in rows] == list(range(8))
    w, h = app.size
    for r in rows:
        assert r.region.height == 1 and 0 <= r.region.y < h and r.region.right <= w, (r.index, r.region)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_monitor_8_gpus(snap_compare, run_8gpu, size):
    assert snap_compare(app_for(run_8gpu), terminal_size=size, run_before=all_eight_on_screen)


# ---- issue 30: the doctor's remedies, the confirmation before applying one, the full-screen log -------------------
FAILED_DIR = Path("/tmp/scaletrain-snapshot/monitor-failed-cpu")


@pytest.fixture
def failed_run():
    from test_monitor_keys import failed_cpu_run

    if FAILED_DIR.exists():
        shutil.rmtree(FAILED_DIR)
    FAILED_DIR.parent.mkdir(parents=True, exist_ok=True)
    rd = failed_cpu_run(FAILED_DIR)
    yield rd
    shutil.rmtree(FAILED_DIR, ignore_errors=True)


def failed_app(rd):
    return create_monitor_app(rd.path, sampler=Sampler(None, None, RunWatcher(rd.path), 3600))


async def remedies_then_down(pilot) -> None:
    """The doctor's verdict on the failed run, the third remedy highlighted (its detail beside the list)."""
    from test_monitor_keys import remedies_shown

    await remedies_shown(pilot)
    await pilot.press("down", "down")
    await pilot.pause(0.3)


async def asking(pilot) -> None:
    """The micro-batch split highlighted, `a` pressed: the confirmation with the plan's numbers before → after."""
    from scaletrain.tui.widgets.remedy_confirm import RemedyConfirm
    from test_monitor_keys import remedies_shown, split_index

    panel = await remedies_shown(pilot)
    pilot.app.screen.query_one("#remedy-list").highlighted = split_index(panel)
    await pilot.press("a")
    for _ in range(100):
        if isinstance(pilot.app.screen, RemedyConfirm):
            break
        await pilot.pause(0.1)
    await pilot.pause(0.3)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_monitor_remedies(snap_compare, failed_run, size):
    assert snap_compare(failed_app(failed_run), terminal_size=size, run_before=remedies_then_down)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_monitor_remedy_confirmation(snap_compare, failed_run, size):
    assert snap_compare(failed_app(failed_run), terminal_size=size, run_before=asking)


async def log_view(pilot) -> None:
    from scaletrain.tui.monitor.log_screen import LogScreen

    await all_eight_on_screen(pilot)
    await pilot.press("l")
    for _ in range(50):
        if isinstance(pilot.app.screen, LogScreen):
            break
        await pilot.pause(0.1)
    await pilot.press("slash", *"rank 3", "enter")
    await pilot.pause(0.3)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_monitor_log_view(snap_compare, run_8gpu, size):
    assert snap_compare(app_for(run_8gpu), terminal_size=size, run_before=log_view)

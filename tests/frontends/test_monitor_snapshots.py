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

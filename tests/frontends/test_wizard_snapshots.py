"""SVG snapshots of each wizard step at 100×32 (pytest-textual-snapshot).

The numbers on these screens come from the engine: a change to the memory or time model changes the plan and write
snapshots on purpose. Look at the new SVGs, then accept them with
`pytest tests/frontends/test_wizard_snapshots.py --snapshot-update`.
NVML is replayed and the run directory is a fixed path (nothing is written), so the screens are the same everywhere.
"""

from __future__ import annotations

import pytest
from textual.widgets import Input

from scaletrain.engine.devices.nvml import DetectionResult
from scaletrain.tui.cli.parser import parse_args
from scaletrain.tui.wizard.app import create_app

SIZE = (100, 32)
RUN_DIR = "/tmp/scaletrain-snapshot/run"     # shown on the write step only; never written
ARGS = ["--gpus", "4xH200", "--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora", "--effective-batch", "128",
        "--run-dir", RUN_DIR]


def no_gpu() -> DetectionResult:
    return DetectionResult((), None, None, "NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found")


@pytest.fixture(autouse=True)
def steady_cursor(monkeypatch):
    """A blinking cursor would make screenshots differ by timing."""
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)


def walk_to(step: int, *extra_keys: str):
    """run_before: press ctrl+n until `step`, letting each step's thread workers finish."""
    async def run_before(pilot) -> None:
        app = pilot.app

        async def settle() -> None:
            for _ in range(3):
                await app.workers.wait_for_complete()
                await pilot.pause()

        await settle()
        for _ in range(step - 1):
            await pilot.press("ctrl+n")
            await settle()
        for key in extra_keys:
            await pilot.press(key)
            await settle()

    return run_before


def app_for(args=ARGS):
    return create_app(parse_args(list(args)), detect=no_gpu, launch=False)


@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_step1_hardware_no_gpu(snap_compare, no_local_presets):
    """No arguments: the start screen, then "start from scratch" (its first row) opens step 1."""
    assert snap_compare(app_for(["--run-dir", RUN_DIR]), terminal_size=SIZE, run_before=walk_to(1, "enter"))


def test_step1_hardware_4xh200(snap_compare):
    assert snap_compare(app_for(), terminal_size=SIZE, run_before=walk_to(1))


@pytest.mark.long
def test_step2_model(snap_compare):
    assert snap_compare(app_for(), terminal_size=SIZE, run_before=walk_to(2))


@pytest.mark.long
def test_step3_batch(snap_compare):
    assert snap_compare(app_for(), terminal_size=SIZE, run_before=walk_to(3))


@pytest.mark.long
def test_step4_plan(snap_compare):
    assert snap_compare(app_for(), terminal_size=SIZE, run_before=walk_to(4))


@pytest.mark.long
def test_step4_plan_what_if_over_the_line(snap_compare):
    """Raising the micro batch until it does not fit draws the bar past the card, with the engine's message."""
    assert snap_compare(app_for(), terminal_size=SIZE, run_before=walk_to(4, "plus", "plus", "plus"))


@pytest.mark.long
def test_step5_write(snap_compare):
    assert snap_compare(app_for(), terminal_size=SIZE, run_before=walk_to(5))


@pytest.mark.long
def test_step5_write_random_init_preset(snap_compare):
    """cpu-tiny trains random-init weights: the red testing-only line, and 200 steps (max_steps) as it will run."""
    args = ["--preset", "cpu-tiny", "--run-dir", RUN_DIR]
    assert snap_compare(app_for(args), terminal_size=SIZE, run_before=walk_to(5))


@pytest.mark.long
def test_help(snap_compare):
    assert snap_compare(app_for(), terminal_size=SIZE, run_before=walk_to(4, "f1"))


# ---- the start screen and a preset's plan (issue 31), at both terminal sizes the wizard supports ------------------
SIZES = {"120x40": (120, 40), "80x24": (80, 24)}


@pytest.fixture
def no_local_presets(tmp_path, monkeypatch):
    """The start screen lists ./presets-local too: an empty working directory keeps the screen the bundled list."""
    monkeypatch.chdir(tmp_path)


def pick_preset(name: str | None, *extra_keys: str):
    """run_before: on the start screen, highlight the preset (None: only wait for the list) and press enter."""
    async def run_before(pilot) -> None:
        app = pilot.app

        async def settle() -> None:
            for _ in range(3):
                await app.workers.wait_for_complete()
                await pilot.pause()

        await settle()
        if name is not None:
            ol = app.screen.query_one("#presets")
            ol.highlighted = ol.get_option_index(name)
            await pilot.press("enter")
            await settle()
        for key in extra_keys:
            await pilot.press(key)
            await settle()

    return run_before


@pytest.mark.parametrize("size", SIZES)
def test_start_screen_offers_the_presets(snap_compare, no_local_presets, size):
    assert snap_compare(app_for(["--run-dir", RUN_DIR]), terminal_size=SIZES[size], run_before=pick_preset(None))


@pytest.mark.long
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("preset", ["h200x4-fast", "4090x8"])
def test_preset_plan_says_what_its_pins_cost(snap_compare, no_local_presets, preset, size):
    """Picked on the start screen: the plan step with the preset's name in the step bar, its pins and their cost
    against the planner's best, host RAM and disk in the verdict, and a total time."""
    assert snap_compare(app_for(["--run-dir", RUN_DIR]), terminal_size=SIZES[size], run_before=pick_preset(preset))

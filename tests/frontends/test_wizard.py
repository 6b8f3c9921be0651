"""The Textual wizard driven by Textual's pilot: whole flows (a preset, a custom choice) end in real run directories.

NVML is replayed (`detect=`), so the same screens appear on a machine with or without GPUs; everything else is real:
the engine plans, the writers write, and one slow test launches a tiny CPU run through the real launcher.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from textual.worker import WorkerCancelled

from scaletrain.engine.estimate.memory import estimate_memory
from scaletrain.engine.devices.nvml import DetectedGpu, DetectionResult
from scaletrain.engine.request.presets import load_preset
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.launch.status import read_status
from scaletrain.tui.cli.parser import parse_args
from scaletrain.tui.widgets.help import key_rows
from scaletrain.tui.wizard.app import create_app

NO_GPU_REASON = "NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found"
H200_MIB = 143771  # what NVML reports for an H200 (MiB), as in the GPU catalog


def no_gpu() -> DetectionResult:
    return DetectionResult((), None, None, NO_GPU_REASON)


def four_h200() -> DetectionResult:
    gpus = tuple(DetectedGpu(i, "NVIDIA H200", H200_MIB * 2**20, nvlink_active_links=18, mig_enabled=False)
                 for i in range(4))
    return DetectionResult(gpus, "550.54.15", "12.4")


async def settle(pilot, app) -> None:
    """Let thread workers (detection, model checks, the solver) finish and their results land. A worker a newer
    keystroke superseded (exclusive workers: the solver, the model check) is cancelled: wait for it to leave."""
    for _ in range(3):
        for _attempt in range(200):
            try:
                await app.workers.wait_for_complete()
                break
            except WorkerCancelled:
                await pilot.pause(0.05)
        await pilot.pause()


async def press(pilot, app, *keys: str) -> None:
    for key in keys:
        await pilot.press(key)
        await settle(pilot, app)


KEY_NAMES = {" ": "space", "/": "slash", ".": "full_stop", "-": "minus", "_": "underscore", ",": "comma",
             ":": "colon", "!": "exclamation_mark"}


async def retype(pilot, app, field: str, text: str) -> None:
    """Clear a field and type into it: short entries key by key as a user would, long paths pasted at once."""
    inp = app.screen.query_one(f"#in-{field}")
    inp.focus()
    inp.value = ""
    await pilot.pause()
    if len(text) <= 12:
        for ch in text:
            await pilot.press(KEY_NAMES.get(ch, ch))
    else:
        inp.insert_text_at_cursor(text)
    await settle(pilot, app)


def field_message(app, field: str) -> str:
    return text_of(app, f"#field-{field} .field-msg")


def screen_name(app) -> str:
    return type(app.screen).__name__


def text_of(app, selector: str) -> str:
    """The plain text a Static shows (rich renderables rendered at a wide width, styles dropped)."""
    widget = app.screen.query_one(selector)
    content = widget.content if hasattr(widget, "content") else widget.render()
    if isinstance(content, str):
        return content
    console = Console(width=300, file=io.StringIO(), color_system=None)
    console.print(content)
    return console.file.getvalue()


def run(coro):
    return asyncio.run(coro)


# ---- whole flows ----------------------------------------------------------------------------------------------------
@pytest.mark.long
def test_preset_flow_writes_the_presets_plan(tmp_path):
    run_dir = tmp_path / "run"
    app = create_app(parse_args(["--preset", "h200x4-fast", "--run-dir", str(run_dir)]), detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            seen = [screen_name(app)]
            for _ in range(4):
                await press(pilot, app, "ctrl+n")
                seen.append(screen_name(app))
            assert seen == ["HardwareScreen", "ModelScreen", "BatchScreen", "PlanScreen", "WriteScreen"]
            assert "plan.json" in app.screen.files and "accelerate_config.yaml" in app.screen.files
            await press(pilot, app, "w")
            assert "wrote" in text_of(app, "#status") and "not launched" in text_of(app, "#status")
            await press(pilot, app, "ctrl+q")
        return app.return_code

    assert run(walk()) == 0
    written = json.loads((run_dir / "plan.json").read_text())
    preset = load_preset("h200x4-fast")
    expected = make_plan(PlanRequest(**preset.request_fields())).to_json()
    # the wizard walked straight through: the written plan is the preset's plan, number for number
    assert written["batch"] == expected["batch"]
    assert written["memory"] == expected["memory"]
    assert written["training"] == expected["training"]
    assert written["train"]["lr"] == preset.train.lr
    assert written["request"]["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert (run_dir / "accelerate_config.yaml").is_file() and (run_dir / "launch.sh").is_file()


def test_a_cpu_plans_alternatives_say_per_process(tmp_path):
    """The wizard's alternatives on a CPU preset head their memory column as the plan's lines say it."""
    app = create_app(parse_args(["--preset", "cpu-tiny", "--run-dir", str(tmp_path / "run")]), detect=no_gpu,
                     launch=False)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            for _ in range(3):
                await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "PlanScreen"
            for _ in range(100):
                if app.screen.alternatives:
                    break
                await pilot.pause(0.05)
            headers = [str(c.label) for c in app.screen.query_one("#alternatives").columns.values()]
            await press(pilot, app, "ctrl+q")
        return headers

    headers = run(walk())
    assert "per process" in headers and "per GPU" not in headers


@pytest.mark.long
def test_custom_flow_qwen7b_lora_on_4xh200(tmp_path):
    """The done-when walk: --gpus 4xH200 → Qwen2.5-7B-Instruct LoRA → effective batch 128 → plan → run directory."""
    run_dir = tmp_path / "run"
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"sample {i}"}) + "\n" for i in range(300)) + "\n")
    app = create_app(parse_args(["--gpus", "4xH200", "--run-dir", str(run_dir)]), detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            assert "4xH200" in text_of(app, "#hw-summary")
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "ModelScreen"
            await retype(pilot, app, "model", "qwen2.5 7b")
            await press(pilot, app, "enter")                      # picks the highlighted catalog match
            assert app.screen.query_one("#in-model").value == "Qwen/Qwen2.5-7B-Instruct"
            assert "7,615,616,512 params" in text_of(app, "#model-info")
            assert app.screen.query_one("#in-weights").value == "Qwen/Qwen2.5-7B-Instruct"   # follows the model
            assert app.screen.query_one("#method").pressed_button is None      # asked, not defaulted
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "ModelScreen" and "choose a method" in text_of(app, "#status")
            await pilot.click("#method-lora")
            await settle(pilot, app)
            await retype(pilot, app, "lora_rank", "8")
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "BatchScreen"
            assert app.state.train.model_source == "Qwen/Qwen2.5-7B-Instruct"
            assert app.state.request.method == "lora" and app.state.request.lora_rank == 8

            # bad entries are refused in place, with the reason, and the step does not advance
            await retype(pilot, app, "effective_batch", "12a")
            assert "whole number" in field_message(app, "effective_batch")
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "BatchScreen"
            await retype(pilot, app, "effective_batch", "130")
            assert "not a multiple" in field_message(app, "effective_batch")
            assert "132" in field_message(app, "effective_batch")  # the engine's nearest reachable batches
            await retype(pilot, app, "effective_batch", "128")
            assert not app.screen.query_one("#field-effective_batch").invalid
            await retype(pilot, app, "data", str(tmp_path / "missing.jsonl"))
            assert "does not exist" in field_message(app, "data")
            await retype(pilot, app, "data", str(data))             # the samples are counted from it
            assert "= 128 effective" in text_of(app, "#solver")
            await retype(pilot, app, "base_lr", "2e-4")        # half an LR reference is refused, in place
            assert "needs both" in field_message(app, "base_batch")
            await retype(pilot, app, "base_batch", "8")
            solver = text_of(app, "#solver")
            assert "√ rule" in solver and "linear rule" in solver
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "PlanScreen"

            plan = app.plan
            assert plan.fits and plan.setup.effective_batch == 128 and plan.setup.world_size == 4
            s = plan.setup            # the bundled trainer drops the last partial step: 300 rows over 4 ranks
            assert s.dataset_size == 300 and plan.time.steps_per_epoch == (300 // 4) // s.micro_batch // s.grad_accum
            assert plan.lr.base_lr == 2e-4 and plan.lr.base_batch == 8
            # what-if keys recompute through the engine and keep the effective batch
            ckpt = plan.setup.grad_ckpt
            await press(pilot, app, "c")
            assert app.plan.setup.grad_ckpt is (not ckpt)
            assert app.plan.setup.effective_batch == 128
            assert app.plan.memory == estimate_memory(app.plan.setup, app.plan.memory.headroom_fraction)
            strategy = app.plan.setup.strategy
            await press(pilot, app, "z")
            assert app.plan.setup.strategy != strategy
            micro = app.plan.setup.micro_batch
            await press(pilot, app, "minus")
            assert app.plan.setup.micro_batch < micro or micro == 1
            assert app.plan.setup.effective_batch == 128
            # the alternatives table: enter picks the planner's first choice again
            rows = app.screen.alternatives
            assert rows, "the planner offers alternatives"
            table = app.screen.query_one("#alternatives")
            table.focus()
            table.move_cursor(row=0)
            await press(pilot, app, "enter")
            s = app.plan.setup
            assert (s.strategy, s.micro_batch, s.grad_accum, s.grad_ckpt, s.offload) == tuple(
                getattr(rows[0], k) for k in ("strategy", "micro_batch", "grad_accum", "grad_ckpt", "offload"))
            assert app.plan.fits
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "WriteScreen"
            await press(pilot, app, "w")
            final = app.plan
            await press(pilot, app, "ctrl+q")
        return app.return_code, final

    code, final = run(walk())
    assert code == 0
    written = json.loads((run_dir / "plan.json").read_text())
    assert written["model"]["name"] == "Qwen/Qwen2.5-7B-Instruct"
    assert written["training"]["method"] == "lora" and written["training"]["lora_rank"] == 8
    assert written["batch"]["effective_batch"] == 128 and written["batch"]["world_size"] == 4
    assert written["batch"]["micro_batch"] == final.setup.micro_batch
    assert written["memory"]["per_gpu_bytes"]["total"] == final.memory.total_bytes
    assert written["train"]["dataset"] == str(data.resolve())
    assert written["hardware"]["gpu"] == "H200"
    assert run_dir.joinpath("accelerate_config.yaml").is_file()


# ---- hardware step ----------------------------------------------------------------------------------------------------
@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_no_gpu_and_no_flag_says_so_and_offers_the_catalog():
    app = create_app(parse_args([]), detect=no_gpu, launch=False)

    async def look():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            assert screen_name(app) == "StartScreen"      # no arguments: the presets first
            await press(pilot, app, "enter")              # "start from scratch" is the first row
            detected = text_of(app, "#detected")
            assert "No GPU detected" in detected and NO_GPU_REASON in detected
            assert app.screen.query_one("#src-detected").disabled
            assert app.screen.query_one("#src-catalog").value
            catalog = app.screen.query_one("#catalog")
            assert not catalog.disabled
            assert "planned from the catalog" in text_of(app, "#hw-summary")
            # the list has the keys, not the scroll body (it took them while the list was still disabled): ↓ is the
            # next GPU, and the summary follows it
            assert app.focused is catalog
            first = catalog.highlighted
            await press(pilot, app, "down")
            assert catalog.highlighted == first + 1
            assert catalog.highlighted_option.id in text_of(app, "#hw-summary")
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "ModelScreen"
            assert app.state.hw_source == "catalog"

    run(look())


@pytest.mark.long
def test_detected_gpus_are_used_by_default():
    app = create_app(parse_args([]), detect=four_h200, launch=False)

    async def look():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            assert screen_name(app) == "StartScreen"      # no arguments: the presets first
            await press(pilot, app, "enter")              # "start from scratch" is the first row
            detected = text_of(app, "#detected")
            assert "Detected 4 GPU(s)" in detected and "NVLink ×18" in detected and "550.54.15" in detected
            assert app.screen.query_one("#src-detected").value
            assert app.focused is app.screen.query_one("#source")
            summary = text_of(app, "#hw-summary")
            assert "4xH200" in summary and "detected here" in summary
            await press(pilot, app, "ctrl+n")
            assert app.state.request.gpus == "auto" and app.state.hw_source == "detected"

    run(look())


@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_bad_gpu_count_is_refused_in_place():
    app = create_app(parse_args(["--gpus", "4xH200"]), detect=no_gpu, launch=False)

    async def look():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await retype(pilot, app, "per_node", "four")
            assert "whole number" in field_message(app, "per_node")
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "HardwareScreen"
            await retype(pilot, app, "per_node", "200")
            assert "not a machine" in text_of(app, "#hw-summary")
            await retype(pilot, app, "per_node", "8")
            assert "8xH200" in text_of(app, "#hw-summary") and "8 processes in all" in text_of(app, "#hw-summary")
            await retype(pilot, app, "per_node", "1")
            assert "1 process in all" in text_of(app, "#hw-summary")      # not "1 processes"

    run(look())


@pytest.mark.long
def test_a_refused_next_puts_the_keys_on_the_field_it_names():
    """ctrl+n refused while the focus sits on another field: the keys go to the field the refusal names, so what is
    typed next fixes it (found in a tmux walk: 'choose a method' left the keys in the weights field, and a space
    meant for the radio set went into a text field)."""
    app = create_app(parse_args(["--gpus", "4xH200"]), detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await retype(pilot, app, "nodes", "x")
            app.screen.query_one("#in-per_node").focus()
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "HardwareScreen" and app.focused.id == "in-nodes"
            await press(pilot, app, "backspace", "1", "ctrl+n")         # typed where the refusal pointed
            assert screen_name(app) == "ModelScreen"
            await retype(pilot, app, "model", "qwen2.5 7b")
            await press(pilot, app, "enter")
            await retype(pilot, app, "weights", "Qwen/Qwen2.5-7B-Instruct")
            await press(pilot, app, "ctrl+n")
            assert "choose a method" in text_of(app, "#status") and app.focused.id == "method"
            await press(pilot, app, "right", "space")                    # the radio set's keys: lora
            assert app.screen.query_one("#method").pressed_button.id == "method-lora"
            await retype(pilot, app, "lora_rank", "x")
            app.screen.query_one("#in-residents").focus()
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "ModelScreen" and app.focused.id == "in-lora_rank"
            await press(pilot, app, "backspace", "8", "ctrl+n")
            assert screen_name(app) == "BatchScreen" and app.state.request.lora_rank == 8
            await retype(pilot, app, "effective_batch", "12a")
            app.screen.query_one("#in-epochs").focus()
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "BatchScreen" and app.focused.id == "in-effective_batch"

    run(walk())


# ---- model step -------------------------------------------------------------------------------------------------------
@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_missing_model_path_is_refused_in_place(tmp_path):
    """Refused in place, and the keys stay with it: enter picks the typed model and moves on to the method; when the
    model then fails to resolve, the keys come back to the model field (a newcomer's next keystrokes fix it instead
    of landing in the method's radio set)."""
    app = create_app(parse_args(["--gpus", "4xH200"]), detect=no_gpu, launch=False)
    missing = str(tmp_path / "nope" / "config.json")

    async def look():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await press(pilot, app, "ctrl+n")
            await retype(pilot, app, "model", missing)
            await press(pilot, app, "enter")
            assert app.focused is app.screen.query_one("#in-model")
            assert "unknown model" in text_of(app, "#model-info")
            await pilot.click("#method-full")
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "ModelScreen"
            msg = field_message(app, "model")
            assert "unknown model" in msg and "not a path" in msg
            assert app.screen.query_one("#field-model").invalid
            await retype(pilot, app, "model", "Qwen/Qwen3-4B")
            await press(pilot, app, "enter")
            assert app.focused is app.screen.query_one("#method")
            assert "unknown model" not in text_of(app, "#model-info")

    run(look())


@pytest.mark.long
def test_local_config_and_resident_model(tmp_path):
    cfg = json.loads((Path(__file__).parents[2] / "src/scaletrain/engine/catalog/models/scaletrain--tiny-llama.json").read_text())
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg["config"]))
    app = create_app(parse_args(["--gpus", "2xA100-80GB"]), detect=no_gpu, launch=False)

    async def look():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await press(pilot, app, "ctrl+n")
            await retype(pilot, app, "model", str(folder))
            await press(pilot, app, "enter")                  # no catalog match: kept as typed
            assert "my-model" in text_of(app, "#model-info")
            await pilot.click("#method-lora")
            await retype(pilot, app, "residents", "scaletrain/tiny-qwen2:8, nope/unknown")
            await press(pilot, app, "ctrl+n")
            assert "nope/unknown" in field_message(app, "residents")
            await retype(pilot, app, "residents", "scaletrain/tiny-qwen2:8")
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "BatchScreen"
            assert app.state.request.residents == (("scaletrain/tiny-qwen2", 8),)
            assert app.state.request.name == "my-model-lora"
            await press(pilot, app, "ctrl+n")
            assert [r.model.name for r in app.plan.setup.residents] == ["scaletrain/tiny-qwen2"]

    run(look())


# ---- keys that work everywhere ------------------------------------------------------------------------------------------
@pytest.mark.long
@pytest.mark.parametrize("steps", [0, 1, 2, 3, 4])
def test_ctrl_q_exits_0_at_every_step(steps, tmp_path):
    app = create_app(parse_args(["--gpus", "4xH200", "--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora",
                      "--run-dir", str(tmp_path / "run")]), detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, app)
            for _ in range(steps):
                await press(pilot, app, "ctrl+n")
            assert app.screen.STEP == steps + 1
            await pilot.press("ctrl+q")
            await pilot.pause()
        return app.return_code

    assert run(walk()) == 0
    assert not (tmp_path / "run").exists()     # quitting writes nothing


@pytest.mark.long
def test_help_and_save_preset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                 # presets are saved under ./presets-local/
    app = create_app(parse_args(["--gpus", "4xH200", "--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora"]),
                     detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await press(pilot, app, "f1")
            assert screen_name(app) == "HelpScreen"
            await press(pilot, app, "escape")
            for _ in range(3):
                await press(pilot, app, "ctrl+n")
            keys = [k for k, _ in key_rows(app.screen)]
            await press(pilot, app, "question_mark")          # on the plan step `?` opens help too
            assert screen_name(app) == "HelpScreen"
            # each key once: "-" was listed beside "+/-" (micro batch down), which already says it
            assert "+/-" in keys and "-" not in keys and len(keys) == len(set(keys))
            await press(pilot, app, "escape", "ctrl+s")
            assert screen_name(app) == "SavePresetScreen"
            await retype(pilot, app, "preset_name", "bad name!")
            await press(pilot, app, "enter")
            assert "not accepted" in field_message(app, "preset_name")
            await retype(pilot, app, "preset_name", "my-h200")
            await press(pilot, app, "enter")
            assert "saved to" in field_message(app, "preset_name")
            return app.plan

    plan = run(walk())
    saved = load_preset(str(tmp_path / "presets-local" / "my-h200.yaml"))
    replay = make_plan(PlanRequest(**saved.request_fields()))
    assert replay.setup.effective_batch == plan.setup.effective_batch
    assert replay.memory.total_bytes == plan.memory.total_bytes


@pytest.mark.long
def test_every_step_fits_80x24(tmp_path):
    """At the smallest terminal the wizard supports, each step's focused widget is on screen, the plan step's
    alternatives show every column (the last, what a row changes, was cut at 80 columns), and the write step's
    status says all of what to do next (its last line was cut at three)."""
    app = create_app(parse_args(["--gpus", "4xH200", "--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora",
                      "--run-dir", str(tmp_path / "run")]), detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, app)
            for step in range(5):
                focused = app.screen.focused
                assert focused is not None, f"step {step + 1} has nothing focused"
                region = focused.region
                assert region.width > 0 and region.height > 0
                assert 0 <= region.y < 24 and region.right <= 80, f"step {step + 1}: {focused} at {region}"
                if step == 3:       # the plan step: every column of the alternatives is on screen, none cut
                    table = app.screen.query_one("#alternatives")
                    assert table.row_count > 1 and table.max_scroll_x == 0, (table.virtual_size, table.size)
                if step < 4:
                    await press(pilot, app, "ctrl+n")
            await press(pilot, app, "w")        # written, not launched (no H200 here): what to do next, every word
            status = app.screen.query_one("#status")
            assert "not launched" in text_of(app, "#status") and "launch.sh" in text_of(app, "#status")
            width = status.content_region.width
            lines = status.get_content_height(status.parent.size, app.size, width)
            assert lines > 3 and status.content_region.height == lines, (lines, status.content_region)

    run(walk())


# ---- launch (slow: a real 2-process CPU run) -------------------------------------------------------------------------
async def wait_until(pilot, predicate, seconds: float = 180) -> None:
    for _ in range(int(seconds / 0.3)):
        if predicate():
            return
        await pilot.pause(0.3)
    raise AssertionError("timed out waiting for the run")


@pytest.mark.slow
def test_launch_from_the_wizard_opens_the_monitor(tmp_path):
    run_dir = tmp_path / "run"
    app = create_app(parse_args(["--preset", "cpu-tiny", "--set", "train.max_steps=2", "--run-dir", str(run_dir)]),
                     detect=no_gpu)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            for _ in range(4):
                await press(pilot, app, "ctrl+n")
            await press(pilot, app, "w")
            assert "l launches it here" in text_of(app, "#status")
            await pilot.press("l")
            await pilot.pause()
            monitor = screen_name(app)
            await wait_until(pilot, lambda: app.launch_error is not None
                             or read_status(run_dir / "status.json").over)
            return monitor, app.launched, app.launch_error

    monitor, launched, error = run(walk())
    assert monitor == "MonitorScreen"
    assert error is None and launched is not None and launched.run_dir == run_dir.resolve()
    assert read_status(run_dir / "status.json").state == "finished"
    assert "step 2/2" in (run_dir / "logs" / "rank-0.log").read_text()
    status = json.loads((run_dir / "status.json").read_text())
    assert status["exit_code"] == 0 and status["pids"]["launcher"] == launched.pid    # the background launcher


# ctrl+q leaving a wizard-launched run training (and the terminal's hang-up): tests/e2e/test_detach.py


@pytest.mark.long
def test_master_weights_key_switches_to_bf16_only_weights_and_back(tmp_path):
    """`m` on the plan step: bf16 weights with no fp32 master (DeepSpeed has none such, so ZeRO moves to DDP/FSDP);
    the plan the engine makes for it is what the screen shows, and the run directory records it."""
    run_dir = tmp_path / "run"
    app = create_app(parse_args(["--gpus", "8xH100", "--model", "Qwen/Qwen2.5-1.5B-Instruct", "--method", "full",
                      "--effective-batch", "64", "--seq-len", "1024", "--run-dir", str(run_dir)]),
                     detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            for _ in range(3):
                await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "PlanScreen"
            while not app.plan.setup.strategy.uses_deepspeed:
                await press(pilot, app, "z")
            before = app.plan
            assert before.setup.master_weights == "fp32"
            await press(pilot, app, "m")
            after = app.plan
            assert after.setup.master_weights == "bf16" and after.setup.strategy in ("ddp", "fsdp")
            assert after.setup.effective_batch == 64
            assert after.memory == estimate_memory(after.setup, after.memory.headroom_fraction)
            assert "bf16 weights only" in text_of(app, "#plan-head")
            await press(pilot, app, "ctrl+n")
            await press(pilot, app, "w")
            await press(pilot, app, "m")      # not a key of the write step: nothing changes
            await press(pilot, app, "ctrl+q")
        return after

    after = run(walk())
    written = json.loads((run_dir / "plan.json").read_text())
    assert written["training"]["master_weights"] == "bf16" and written["training"]["strategy"] in ("ddp", "fsdp")
    assert written["memory"]["per_gpu_bytes"]["weights"] == after.memory.weights_bytes


@pytest.mark.heavy                # a real trace process (transformers imported, tiny-phi3 traced: ~12 CPU s)
def test_a_traced_family_is_warmed_when_picked_and_the_solver_says_it_is_tracing(tmp_path, monkeypatch):
    """The first plan of a family with no analytic layout traces it (about 12 s here). The model step starts the
    trace process when such a model is picked (transformers imported, the family built) while the method and batch
    are chosen; the batch step's solver says "tracing phi3 … N s" instead of a silent "solving…"; quitting ends the
    trace process, not after it."""
    from scaletrain.engine.catalog import traced

    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "traces"))
    traced._WORKER.stop()
    app = create_app(parse_args(["--gpus", "1xCPU", "--run-dir", str(tmp_path / "run")]), detect=no_gpu,
                     launch=False)
    panels: list[str] = []

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await press(pilot, app, "ctrl+n")
            await retype(pilot, app, "model", "scaletrain/tiny-phi3")
            await pilot.press("enter")
            for _ in range(100):                  # the warm-up starts the trace process off the UI thread
                await pilot.pause(0.05)
                if traced._WORKER.proc is not None:
                    break
            assert traced._WORKER.proc is not None and traced._WORKER.proc.poll() is None
            await pilot.click("#method-full")
            await pilot.press("ctrl+n")
            for _ in range(600):
                await pilot.pause(0.05)
                if screen_name(app) == "BatchScreen":
                    panels.append(text_of(app, "#solver"))
                    if "fits" in panels[-1]:
                        break
            assert "fits" in panels[-1], panels[-1]
            assert any(p.startswith("tracing phi3") for p in panels), panels[:3]
            proc = traced._WORKER.proc
            assert proc is not None and proc.poll() is None          # one process for the warm-up and the plan
            await pilot.press("ctrl+q")
            await pilot.pause()
        return app.return_code, proc

    code, proc = run(walk())
    assert code == 0 and traced._WORKER.proc is None and proc.wait(timeout=10) is not None

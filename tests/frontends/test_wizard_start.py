"""The wizard's front door (issue 31): `scaletrain` with no arguments starts on the presets; picking one opens its
plan with its name in the step bar; the plan step says what pinned choices cost, weighs host RAM and disk, and
shows the whole run's time; every key of a step is listed on `?`, and no key means two things.

NVML is replayed; the engine plans for real (pilot tests, no mocks)."""

from __future__ import annotations

import pytest

from scaletrain.engine.plan.pins import pin_cost
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.presets import list_presets, load_preset
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.run.run_length import known_length, run_time, with_known_length
from scaletrain.engine.units import fmt_seconds
from scaletrain.tui.cli.parser import parse_args
from scaletrain.tui.wizard.app import create_app
from scaletrain.tui.wizard.screen_base import WizardStep
from test_wizard import no_gpu, press, run, screen_name, settle, text_of


@pytest.fixture(autouse=True)
def empty_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)          # ./presets-local is read from (and saved to) the working directory


async def pick(pilot, app, name: str) -> None:
    ol = app.screen.query_one("#presets")
    ol.highlighted = ol.get_option_index(name)
    await press(pilot, app, "enter")


def preset_plan(name: str):
    p = load_preset(name)
    req = PlanRequest(**p.request_fields())
    return req, make_plan(with_known_length(req, p.train)), p.train


@pytest.mark.long
def test_no_arguments_start_on_the_presets_and_a_pick_opens_its_plan():
    app = create_app(parse_args([]), detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            assert screen_name(app) == "StartScreen"
            ids = [app.screen.query_one("#presets").get_option_at_index(i).id
                   for i in range(app.screen.query_one("#presets").option_count)]
            assert ids[0] == "start-from-scratch" and {"h200x4-fast", "4090x8"} <= set(ids)
            await pick(pilot, app, "h200x4-fast")
            assert screen_name(app) == "PlanScreen" and app.state.preset == "h200x4-fast"
            assert "preset h200x4-fast" in str(app.screen.query_one("#stepbar").render())
            _req, expected, _train = preset_plan("h200x4-fast")
            assert app.plan.setup.strategy == expected.setup.strategy == "ddp"
            assert app.plan.memory.total_bytes == expected.memory.total_bytes
            stack = [type(s).__name__ for s in app.screen_stack[1:]]
            assert stack == ["StartScreen", "HardwareScreen", "ModelScreen", "BatchScreen", "PlanScreen"]
            for _ in range(4):                                   # escape walks back through the preset's steps
                await press(pilot, app, "escape")
            assert screen_name(app) == "StartScreen"
            await pick(pilot, app, "start-from-scratch")
            assert screen_name(app) == "HardwareScreen" and app.state.preset is None
            await press(pilot, app, "ctrl+q")
        return app.return_code

    assert run(walk()) == 0


@pytest.mark.long
@pytest.mark.parametrize("name", ["4090x8", "h200x4-fast"])
def test_pins_line_says_what_the_presets_pins_cost_and_u_unpins(name):
    req, plan, _train = preset_plan(name)
    cost = pin_cost(req, plan)
    assert cost is not None and cost.costs_time          # both seeds' setups are slower than the planner's best
    app = create_app(parse_args(["--preset", name.upper()]), detect=no_gpu, launch=False)   # any letter case

    async def walk():
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            for _ in range(3):
                await press(pilot, app, "ctrl+n")
            pins = text_of(app, "#pins")
            slower = app.plan.time.step_seconds
            await press(pilot, app, "u")
            return pins, slower, app.plan, text_of(app, "#pins")

    pins, slower, unpinned, after = run(walk())
    assert f"the {name} preset's pins" in pins and "u: unpin" in pins
    assert f"+{fmt_seconds(cost.step_delta)}/step" in pins and f"at {fmt_seconds(cost.best_step_seconds)}/step" in pins
    assert unpinned.time.step_seconds == pytest.approx(cost.best_step_seconds)
    assert unpinned.time.step_seconds < slower
    assert "pins: none" in after


@pytest.mark.long
def test_every_preset_plan_step_shows_a_total_time_and_every_resource():
    names = [p.name for p in list_presets()]

    async def walk(name):
        app = create_app(parse_args(["--preset", name]), detect=no_gpu, launch=False)
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            for _ in range(3):
                await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "PlanScreen", name
            return text_of(app, "#plan-fit"), app.plan

    for name in names:
        fit, plan = run(walk(name))
        p = load_preset(name)
        rt = run_time(plan, p.train)
        assert rt is not None and rt.total_seconds is not None, name
        assert f"{fmt_seconds(rt.total_seconds)} total" in fit, name
        assert "per 1,000 samples" in fit and "verdict:" in fit and "disk:" in fit, name
        if plan.setup.device == "cuda":
            assert "host RAM:" in fit, name


def test_bundled_data_counts_the_run_length():
    p = load_preset("h200x4-fast")
    req = PlanRequest(**p.request_fields())
    known = known_length(req, p.train)
    assert known.samples == 1000 and "demo.jsonl" in known.source     # the rows the trainer falls back to
    reward = known_length(req.with_(objective="reward"), p.train)
    assert reward.samples == 256 and "preference.jsonl" in reward.source


def test_preset_names_are_case_insensitive_with_did_you_mean():
    from scaletrain.engine.errors import ScaletrainError

    assert load_preset("H200X4-Fast").name == "h200x4-fast"
    with pytest.raises(ScaletrainError, match="did you mean h200x4-fast"):
        load_preset("h200x4fast")


@pytest.mark.long
def test_no_key_means_two_things_and_every_plan_key_is_listed():
    from scaletrain.tui.wizard.screen_batch import BatchScreen
    from scaletrain.tui.wizard.screen_hardware import HardwareScreen
    from scaletrain.tui.wizard.screen_model import ModelScreen
    from scaletrain.tui.wizard.screen_plan import PlanScreen
    from scaletrain.tui.wizard.screen_start import StartScreen
    from scaletrain.tui.wizard.screen_write import WriteScreen

    meaning: dict[str, str] = {}
    for screen in (StartScreen, HardwareScreen, ModelScreen, BatchScreen, PlanScreen, WriteScreen):
        for cls in screen.__mro__:
            for b in cls.__dict__.get("BINDINGS", []):
                for key in b.key.split(","):
                    assert meaning.setdefault(key, b.action) == b.action, f"{key}: {meaning[key]} and {b.action}"
    app = create_app(parse_args(["--preset", "h200x4-fast"]), detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, app)
            for _ in range(3):
                await press(pilot, app, "ctrl+n")
            await press(pilot, app, "question_mark")
            assert screen_name(app) == "HelpScreen"
            return app.screen.keys, {b.key: app.get_key_display(b) for b in PlanScreen.BINDINGS + WizardStep.BINDINGS}

    listed, displays = run(walk())
    # each row's keys: "? / f1" is ? and f1; "+/-" is + and - (the minus key is listed there, not on a row of its own)
    shown = [set(k.replace(" / ", "/").split("/")) for k, _ in listed]
    for key, display in displays.items():
        assert any(set(display.split("/")) <= keys for keys in shown), f"{key} ({display}) is not on the sheet: {shown}"
    descriptions = " ".join(w for _, w in listed)
    assert "chunked" in descriptions and "unpin" in descriptions and "objective" in descriptions


@pytest.mark.long
def test_every_footer_key_of_the_plan_step_does_something():
    """Each what-if key shown or listed on the plan step changes the plan or says why not (never silent)."""
    from scaletrain.tui.wizard.screen_plan import PlanScreen

    app = create_app(parse_args(["--preset", "h200x4-fast"]), detect=no_gpu, launch=False)
    keys = [b.key.split(",")[0] for b in PlanScreen.BINDINGS]

    async def walk():
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            for _ in range(3):
                await press(pilot, app, "ctrl+n")
            silent = []
            for key in keys:
                before, said = (app.state, app.plan), text_of(app, "#whatif")
                await press(pilot, app, key)
                if (app.state, app.plan) == before and text_of(app, "#whatif") == said:
                    silent.append(key)
                await press(pilot, app, "u")      # back to the planner's best before the next key
            return silent

    assert run(walk()) == []


@pytest.mark.long
def test_ctrl_s_saves_a_preset_on_every_step(tmp_path):
    app = create_app(parse_args(["--preset", "h200x4-fast", "--run-dir", str(tmp_path / "run")]), detect=no_gpu,
                     launch=False)

    async def walk():
        saved = []
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            for step in range(1, 6):
                await press(pilot, app, "ctrl+s")
                assert screen_name(app) == "SavePresetScreen", step
                inp = app.screen.query_one("#in-preset_name")
                inp.value = f"mine-{step}"
                await press(pilot, app, "enter", "escape")
                saved.append((tmp_path / "presets-local" / f"mine-{step}.yaml").is_file())
                if step < 5:
                    await press(pilot, app, "ctrl+n")
            # saving under an existing name keeps the old file beside it
            await press(pilot, app, "ctrl+s")
            app.screen.query_one("#in-preset_name").value = "mine-1"
            await press(pilot, app, "enter")
            msg = text_of(app, "#field-preset_name .field-msg")
        return saved, msg

    saved, msg = run(walk())
    assert saved == [True] * 5
    assert "the file it replaced" in msg
    assert load_preset("mine-5").request["strategy"] == "ddp"

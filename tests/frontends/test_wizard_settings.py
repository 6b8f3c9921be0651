"""The wizard reaches every plan setting and plans a preset as headless does: the strategy key's cycle includes
FSDP, precision / optimizer / implementation / attention keys, headroom and inter-node link on step 1, the method
asked rather than assumed, `l` writing and launching, the run's length as the trainer will run it, and the weights
rule (engine.request.weights): random-init is flagged in red, QLoRA from random-init is refused before writing."""

from __future__ import annotations

import json

import pytest

from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.presets import preset_names
from scaletrain.engine.run.run_length import RunLength, run_length, with_known_length
from scaletrain.engine.request.weights import weights_problem, weights_warning
from scaletrain.tui.cli.parser import build_parser
from scaletrain.engine.request.args import asked_from_args
from scaletrain.tui.cli.parser import parse_args
from scaletrain.tui.wizard.app import create_app
from scaletrain.tui.wizard.sources import model_weights, parse_data, parse_weights
from scaletrain.tui.wizard.state import plan_what_if
from scaletrain.engine.errors import ScaletrainError
from test_wizard import field_message, no_gpu, press, retype, run, screen_name, settle, text_of

BUNDLED = [n for n in preset_names() if not n.startswith(("my-", "test-"))]


# ---- one plan for one preset ----------------------------------------------------------------------------------------
@pytest.mark.long
@pytest.mark.parametrize("preset", BUNDLED)
def test_the_wizard_plans_a_preset_as_headless_does(preset, tmp_path):
    """Walked straight through, the wizard's plan is the headless plan of the same preset (cpu-tiny: micro 4 ×
    accum 2, where the wizard used to re-search to micro 8 × accum 1), and it says how long the run trains."""
    args = build_parser().parse_args(["--preset", preset])
    train = asked_from_args(args).train
    # the wizard counts the run's length as the plan step shows it (the bundled data when the preset sets none)
    headless = make_plan(with_known_length(asked_from_args(args).request(), train))
    app = create_app(parse_args(["--preset", preset, "--run-dir", str(tmp_path / "run")]), detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            for _ in range(2):
                await press(pilot, app, "ctrl+n")
            epochs_hint = field_message(app, "epochs")
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "PlanScreen"
            return app.plan, text_of(app, "#plan-fit"), epochs_hint

    plan, fit, epochs_hint = run(walk())
    if train.max_steps is not None:
        assert f"train.max_steps runs {train.max_steps:,} steps" in epochs_hint
    assert plan.setup == headless.setup
    assert plan.memory == headless.memory
    assert f"runs: {run_length(headless, train).text()}" in fit


def test_run_length_says_max_steps_overrides_epochs():
    assert RunLength(6, 6.45, True).text() == "6 steps (max_steps) = 6.45 epochs"
    assert RunLength(200, None, True).text() == "200 steps (max_steps) (epochs: give a dataset size)"
    assert RunLength(1258, 2.0, False).text() == "2 epochs = 1,258 steps"
    args = build_parser().parse_args(["--preset", "4090x8", "--set", "train.max_steps=100"])
    plan = make_plan(asked_from_args(args).request())
    got = run_length(plan, asked_from_args(args).train)
    assert got.by_max_steps and got.steps == 100 and got.epochs == pytest.approx(100 / plan.time.steps_per_epoch)


# ---- the plan step's keys -------------------------------------------------------------------------------------------
def plan_step_app(tmp_path, *extra):
    return create_app(parse_args(["--gpus", "8xH100", "--model", "Qwen/Qwen2.5-1.5B-Instruct", "--method", "full",
                       "--effective-batch", "64", "--seq-len", "1024", "--run-dir", str(tmp_path / "run"), *extra]),
                      detect=no_gpu, launch=False)


@pytest.mark.long
def test_strategy_key_cycles_through_fsdp_and_setting_keys_change_the_plan(tmp_path):
    app = plan_step_app(tmp_path)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            for _ in range(3):
                await press(pilot, app, "ctrl+n")
            seen = [str(app.plan.setup.strategy)]
            for _ in range(5):
                await press(pilot, app, "z")
                seen.append(str(app.plan.setup.strategy))
            s0 = app.plan.setup
            changed = {}
            for key, attr in (("p", "precision"), ("x", "optimizer"), ("i", "optimizer_impl"), ("a", "attn")):
                before = str(getattr(app.plan.setup, attr))
                await press(pilot, app, key)
                changed[attr] = (before, str(getattr(app.plan.setup, attr)))
                # what the screen shows is the engine's plan for the state, not a re-derivation
                assert app.plan.setup == plan_what_if(app.state, None)[0].setup
            return seen, s0, changed, text_of(app, "#plan-head")

    seen, s0, changed, head = run(walk())
    assert {"ddp", "zero1", "zero2", "zero3", "fsdp"} <= set(seen)
    assert seen[0] == seen[-1]                                  # five presses: round the whole cycle
    for attr, (before, after) in changed.items():
        assert before != after, attr
    assert changed["precision"][1] in head and f"attn {changed['attn'][1]}" in head


@pytest.mark.long
def test_headroom_and_inter_node_link_on_step_1(tmp_path):
    app = create_app(parse_args(["--gpus", "2x8xH100", "--model", "Qwen/Qwen2.5-1.5B-Instruct", "--method", "full",
                      "--run-dir", str(tmp_path / "run")]), detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await retype(pilot, app, "headroom", "1.5")
            assert "fraction in [0, 1)" in field_message(app, "headroom")
            await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "HardwareScreen"
            await retype(pilot, app, "headroom", "0.2")
            await retype(pilot, app, "link", "warp")
            assert "edr" in field_message(app, "link")             # the CLI's own refusal, naming the links
            await retype(pilot, app, "link", "ndr")
            for _ in range(3):
                await press(pilot, app, "ctrl+n")
            return app.plan

    plan = run(walk())
    assert plan.memory.headroom_fraction == 0.2
    assert plan.setup.hardware.inter_node_gbit_s == 400 and plan.setup.hardware.nodes == 2


# ---- write and launch -----------------------------------------------------------------------------------------------
@pytest.mark.long
def test_l_writes_then_launches_without_asking_for_w_first(tmp_path):
    run_dir = tmp_path / "run"
    app = plan_step_app(tmp_path)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            for _ in range(4):
                await press(pilot, app, "ctrl+n")
            assert not run_dir.exists()
            assert "l writes and launches" in text_of(app, "#status")
            await press(pilot, app, "l")
            return text_of(app, "#status"), screen_name(app)

    status, screen = run(walk())
    assert (run_dir / "plan.json").is_file()                   # written by `l` itself
    assert "write the files first" not in status
    assert "not launched" in status and "8xH100" in status     # this machine has no H100s: written, not launched
    assert screen == "WriteScreen"


@pytest.mark.long
def test_write_screen_flags_random_init_in_red(tmp_path):
    app = create_app(parse_args(["--preset", "cpu-tiny", "--run-dir", str(tmp_path / "run")]), detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await press(pilot, app, "ctrl+n")
            assert app.screen.query_one("#in-weights").value == "random-init"      # the preset's own choice
            for _ in range(3):
                await press(pilot, app, "ctrl+n")
            box = app.screen.query_one("#weights-warning")
            await press(pilot, app, "w")
            return box.display, str(box.content), box.styles.color, text_of(app, "#status")

    shown, warning, color, status = run(walk())
    assert shown and warning == weights_warning("random-init") and "testing only" in warning
    assert color.r > 150 and color.g < 100                     # red
    assert "wrote" in status
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["train"]["model_source"] == "random-init"


@pytest.mark.long
def test_choosing_random_init_on_the_model_step_shows_the_warning(tmp_path):
    app = create_app(parse_args(["--gpus", "4xH200", "--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora",
                      "--run-dir", str(tmp_path / "run")]), detect=no_gpu, launch=False)

    async def walk(weights):
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await press(pilot, app, "ctrl+n")
            assert app.screen.query_one("#in-weights").value == "Qwen/Qwen2.5-7B-Instruct"
            if weights:
                await retype(pilot, app, "weights", weights)
            for _ in range(3):
                await press(pilot, app, "ctrl+n")
            box = app.screen.query_one("#weights-warning")
            return box.display, str(box.content), app.state.train.model_source

    assert run(walk("random-init")) == (True, weights_warning("random-init"), "random-init")
    app = create_app(parse_args(["--gpus", "4xH200", "--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora",
                      "--run-dir", str(tmp_path / "run")]), detect=no_gpu, launch=False)
    assert run(walk(None)) == (False, "", "Qwen/Qwen2.5-7B-Instruct")       # no random-init unless chosen


@pytest.mark.long
def test_the_weights_field_shows_what_the_run_starts_from_and_follows_the_model_until_typed(tmp_path):
    """A config-only catalog model's run starts from random init: its weights field said the model's id
    (scaletrain/tiny-phi3) while the write step warned of random-init weights (walked at 80x24)."""
    app = create_app(parse_args(["--gpus", "2xCPU", "--run-dir", str(tmp_path / "run")]), detect=no_gpu,
                     launch=False)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await press(pilot, app, "ctrl+n")
            shown = []
            for model in ("scaletrain/tiny-phi3", "Qwen/Qwen2.5-7B-Instruct", "scaletrain/tiny-llama"):
                await retype(pilot, app, "model", model)
                shown.append(app.screen.query_one("#in-weights").value)
            await retype(pilot, app, "weights", "my-org/my-weights")       # typed: no longer follows
            await retype(pilot, app, "model", "scaletrain/tiny-phi3")
            shown.append(app.screen.query_one("#in-weights").value)
            return shown

    assert run(walk()) == [model_weights("scaletrain/tiny-phi3"), "Qwen/Qwen2.5-7B-Instruct",
                           model_weights("scaletrain/tiny-llama"), "my-org/my-weights"]
    assert model_weights("scaletrain/tiny-phi3") == "random-init"


@pytest.mark.long
def test_the_plan_step_checks_the_disk_where_the_run_will_be_written(tmp_path):
    """--run-dir elsewhere: the plan step's disk line read the free space of ./runs under the working directory,
    another filesystem than the run's, possibly (walked with --run-dir /tmp/s17/w2 from /tmp/s17)."""
    run_dir = tmp_path / "elsewhere" / "run"
    app = create_app(parse_args(["--preset", "cpu-tiny", "--run-dir", str(run_dir)]), detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            for _ in range(3):
                await press(pilot, app, "ctrl+n")
            return text_of(app, "#plan-fit")

    disk = next(line for line in run(walk()).splitlines() if line.strip().startswith("disk:"))
    assert f"free at {run_dir}" in disk, disk


@pytest.mark.long
def test_the_lora_targets_hint_names_the_models_own_linears(tmp_path):
    """phi3's blocks have qkv_proj and gate_up_proj: the hint said q_proj,k_proj,v_proj,… for every model, names the
    plan then refuses for it (walked at 120x40)."""
    from scaletrain.engine.catalog.architectures import load_model

    app = create_app(parse_args(["--gpus", "2xCPU", "--run-dir", str(tmp_path / "run")]), detect=no_gpu,
                     launch=False)

    async def walk():
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            await press(pilot, app, "ctrl+n")
            hints = []
            for model in ("scaletrain/tiny-phi3", "Qwen/Qwen2.5-7B-Instruct"):
                await retype(pilot, app, "model", model)
                await press(pilot, app, "enter")
                hints.append(field_message(app, "lora_targets").strip())
            return hints

    phi3, qwen = run(walk())
    assert phi3 == "comma list of this model's block linears: o_proj,qkv_proj,gate_up_proj,down_proj"
    assert load_model("scaletrain/tiny-phi3").block_linear_names == ("o_proj", "qkv_proj", "gate_up_proj", "down_proj")
    assert qwen == "comma list of this model's block linears: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


@pytest.mark.long
def test_an_hf_id_that_begins_a_catalog_id_is_kept_when_tabbed_past_the_list(tmp_path, monkeypatch):
    """Qwen/Qwen2.5-7B (the base model, here in the HF cache) begins the catalog's Qwen/Qwen2.5-7B-Instruct: enter
    picks the catalog's, as the hint says, and the hint says how to keep the typed id; tabbing past the list kept
    the text but checked nothing (no model line, the weights empty) until the write step (walked at 80x24)."""
    from scaletrain.engine.catalog.architectures import catalog_entry

    root = tmp_path / "hf" / "hub"
    snap = root / "models--Qwen--Qwen2.5-7B" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (root / "models--Qwen--Qwen2.5-7B" / "refs").mkdir()
    (root / "models--Qwen--Qwen2.5-7B" / "refs" / "main").write_text("0123abcd")
    (snap / "config.json").write_text(json.dumps(catalog_entry("Qwen/Qwen2.5-7B-Instruct")["config"]))
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    app = create_app(parse_args(["--gpus", "2xH100", "--run-dir", str(tmp_path / "run")]), detect=no_gpu,
                     launch=False)

    async def walk():
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, app)
            await press(pilot, app, "ctrl+n")
            await retype(pilot, app, "model", "Qwen/Qwen2.5-7B")
            hint = text_of(app, "#model-info")
            await press(pilot, app, "tab")                   # into the suggestions: still a search
            in_list = text_of(app, "#model-info")
            await press(pilot, app, "tab")                   # past them
            return (hint, in_list, text_of(app, "#model-info"), app.screen.query_one("#in-model").value,
                    app.screen.query_one("#in-weights").value)

    hint, in_list, info, model, weights = run(walk())
    assert "enter picks Qwen/Qwen2.5-7B-Instruct" in hint and "tab past the list keeps Qwen/Qwen2.5-7B" in hint
    assert in_list == hint
    assert model == weights == "Qwen/Qwen2.5-7B"
    assert info.startswith("Qwen/Qwen2.5-7B · qwen2 · 7,615,616,512 params"), info


@pytest.mark.long
def test_qlora_from_random_init_is_refused_before_writing(tmp_path):
    app = create_app(parse_args(["--gpus", "4xH200", "--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "qlora",
                      "--effective-batch", "64", "--run-dir", str(tmp_path / "run")]), detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await press(pilot, app, "ctrl+n")
            assert app.screen.query_one("#method").pressed_button.id == "method-qlora"   # --method: chosen
            await retype(pilot, app, "weights", "random-init")
            for _ in range(3):
                await press(pilot, app, "ctrl+n")
            assert screen_name(app) == "WriteScreen"
            warning = str(app.screen.query_one("#weights-warning").content)
            await press(pilot, app, "w")
            await press(pilot, app, "l")
            return warning, text_of(app, "#status")

    warning, status = run(walk())
    assert warning == weights_problem("qlora", None, "random-init")
    assert status.startswith("not written: a 4-bit base (qlora)") and not (tmp_path / "run").exists()


@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_fresh_wizard_preselects_no_method(tmp_path):
    app = create_app(parse_args(["--gpus", "4xH200"]), detect=no_gpu, launch=False)

    async def walk():
        async with app.run_test(size=(100, 32)) as pilot:
            await settle(pilot, app)
            await press(pilot, app, "ctrl+n")
            return app.screen.query_one("#method").pressed_button

    assert run(walk()) is None


# ---- the rules themselves -------------------------------------------------------------------------------------------
def test_weights_rules_and_what_the_fields_accept(tmp_path, monkeypatch):
    """The fields accept what --weights and --data accept: the engine's rules, not the wizard's own."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))          # an empty HF cache
    assert weights_warning("random-init") and weights_warning("Qwen/Qwen3-4B") is None
    assert weights_problem("qlora", None, "random-init") and weights_problem("lora", None, "random-init") is None
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    # a folder whose config.json names no model_type: transformers could only load it through custom code
    problem = weights_problem("qlora", None, str(model))
    assert problem and "no model_type" in problem and "\n" not in problem
    (model / "config.json").write_text('{"model_type": "llama"}')
    assert weights_problem("qlora", None, str(model)) is None
    assert parse_weights("random-init") == "random-init"
    assert parse_weights(str(model)) == str(model.resolve())
    assert parse_weights("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    assert model_weights("scaletrain/tiny-qwen2") == "random-init"       # a config-only model has no weights
    assert model_weights("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "x"}\n{"text": "y"}\n')
    got = parse_data(str(data))
    assert (got.spec, got.rows) == (str(data.resolve()), 2) and parse_data("") is None
    for bad, parse in (("", parse_weights), ("./nope", parse_weights), (str(tmp_path), parse_weights),
                       ("no such thing", parse_weights), (str(tmp_path / "none.jsonl"), parse_data),
                       ("HuggingFaceH4/ultrachat_200k", parse_data)):       # not in the (empty) HF cache
        with pytest.raises(ScaletrainError):
            parse(bad)

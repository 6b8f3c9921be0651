"""Presets: the seven bundled ones reproduce their seeds, bad input is one line, --set and --save-preset work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scaletrain.engine.request import presets as P
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.options import TrainOptions
from scaletrain.tui.cli.main import main

SEVEN = ("h200x4-fast", "4090x8", "4090x16-bs256", "h200x2-gemma27b-qlora", "grpo-7b-h200", "olmo32b-zero3", "cpu-tiny")
SEEDS = {"h200x4-fast": "003", "4090x8": "000", "4090x16-bs256": "000", "h200x2-gemma27b-qlora": "001",
         "grpo-7b-h200": "004", "olmo32b-zero3": "002"}


def _plan(name: str, *overrides: str):
    p = P.load_preset(name)
    req = PlanRequest(**P.apply_overrides(p.request_fields(), list(overrides)))
    return make_plan(req), req, P.train_options(p, list(overrides))


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("scaletrain: error: ") and "Traceback" not in err
    return lines[0]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---- the bundled presets ---------------------------------------------------------------------------------------
def test_all_seven_are_listed_valid_and_plannable(in_tmp):
    listed = {p.name: p for p in P.list_presets()}
    assert set(SEVEN) <= set(listed)
    for name in SEVEN:
        p = listed[name]
        assert p.source == "bundled" and p.description and "\n" not in p.description
        plan, _, _ = _plan(name)
        assert plan.name == name
        text = p.path.read_text()
        if name in SEEDS:
            assert f"seed {SEEDS[name]}" in text.split("\nname:")[0]       # the seed it reproduces, in a comment


def test_h200x4_fast_has_seed_003s_numbers():
    plan, req, train = _plan("h200x4-fast")
    s = plan.setup
    assert (s.micro_batch, s.grad_accum, s.world_size, s.effective_batch) == (16, 2, 4, 128)
    assert (s.method, s.base_bits, s.strategy, s.precision) == ("lora", 8, "ddp", "bf16")
    assert s.hardware.gpu.key == "H200" and req.epochs == 2 and train.lr == 3e-4
    assert s.model.name == "Qwen/Qwen2.5-7B-Instruct"


def test_4090_presets_have_seed_000s_numbers():
    plan, _, _ = _plan("4090x8")
    s = plan.setup
    assert (s.micro_batch, s.grad_accum, s.world_size, s.effective_batch, s.seq_len) == (2, 8, 8, 128, 2048)
    assert (s.method, s.strategy, s.grad_ckpt, s.attn, s.hardware.gpu.key) == ("full", "zero3", True, "flash", "RTX4090")
    assert s.model.name == "Qwen/Qwen3-4B"
    plan16, _, _ = _plan("4090x16-bs256")
    s16 = plan16.setup
    assert (s16.hardware.nodes, s16.hardware.gpus_per_node, s16.effective_batch) == (2, 8, 256)


def test_other_seeds():
    g = _plan("h200x2-gemma27b-qlora")[0].setup
    assert (g.method, g.base_bits, g.world_size, g.grad_ckpt, g.model.name) == ("qlora", 4, 2, True, "google/gemma-3-27b-it")
    grpo = _plan("grpo-7b-h200")[0]
    r = grpo.setup
    assert r.micro_batch == 8 and r.world_size == 1 and r.master_weights == "bf16"
    # the seed's ~94-103 GB holds for bf16-only weights; fp32 master weights would not fit the H200
    assert grpo.fits and not _plan("grpo-7b-h200", "master_weights=fp32")[0].fits
    assert [(x.model.name, x.bits) for x in r.residents] == [("Qwen/Qwen2.5-14B-Instruct", 16)]
    o = _plan("olmo32b-zero3")[0].setup
    assert (o.strategy, o.world_size, o.method, o.model.name) == ("zero3", 16, "full", "allenai/OLMo-2-0325-32B")


def test_cpu_tiny_is_a_two_process_cpu_run_on_the_bundled_data():
    plan, _, train = _plan("cpu-tiny")
    s = plan.setup
    assert (s.hardware.gpu.key, s.device, s.world_size, s.precision, s.strategy) == ("CPU", "cpu", 2, "fp32", "ddp")
    assert (s.micro_batch, s.grad_accum, s.seq_len) == (4, 2, 128)
    assert s.model.name.startswith("scaletrain/tiny-")
    assert train.model_source == "random-init" and train.dataset is None and train.max_steps
    assert plan.fits


# ---- bad input: one line, non-zero exit ----------------------------------------------------------------------
def test_unknown_preset(capsys, in_tmp):
    assert main(["plan", "--preset", "no-such-preset"]) == 2
    line = _one_error_line(capsys)
    assert "unknown preset 'no-such-preset'" in line and "cpu-tiny" in line


@pytest.mark.parametrize("body, expect", [
    ("description: x\nrequest: {model: scaletrain/tiny-qwen2, gpus: [2xCPU\n", "not valid YAML at line"),
    ("description: x\nrequest: {model: scaletrain/tiny-qwen2, micro_batch: lots}\n", "request.micro_batch"),
    ("description: x\nrequest: {model: scaletrain/tiny-qwen2, micro_bach: 4}\n", "unknown key 'request.micro_bach'"),
    ("description: x\nrequest: {model: scaletrain/tiny-qwen2}\ntrain: {lr: fast}\n", "train.lr"),
    ("description: x\nrequest: {model: scaletrain/tiny-qwen2}\nextra: 1\n", "unknown key 'extra'"),
    ("request: {model: scaletrain/tiny-qwen2}\n", "description is required"),
    ("- just\n- a list\n", "must be a mapping"),
])
def test_malformed_preset_file(tmp_path, capsys, body, expect):
    f = tmp_path / "bad.yaml"
    f.write_text(body)
    assert main(["plan", "--preset", str(f)]) == 2
    line = _one_error_line(capsys)
    assert expect in line and str(f) in line


def test_missing_dataset_in_a_preset_replay(tmp_path, capsys, in_tmp):
    rc = main(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(tmp_path / "r"),
               "--set", f"train.dataset={tmp_path / 'missing.jsonl'}"])
    assert rc == 2
    assert "missing.jsonl does not exist" in _one_error_line(capsys)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("item, expect", [
    ("micro_bach=4", "--set micro_bach: unknown key"),
    ("micro_batch=four", "request.micro_batch"),
    ("train.lr=quick", "train.lr"),
    ("micro_batch", "KEY=VALUE"),
    ("bogus.lr=1", "unknown section"),
])
def test_bad_overrides(capsys, item, expect):
    assert main(["plan", "--preset", "cpu-tiny", "--set", item]) == 2
    assert expect in _one_error_line(capsys)


# ---- --set ---------------------------------------------------------------------------------------------------
def test_overrides_reach_the_request_and_the_trainer(tmp_path, in_tmp):
    rc = main(["--preset", "cpu-tiny", "--headless", "--dry-run", "--run-dir", str(tmp_path / "r"),
               "--set", "micro_batch=2", "--set", "train.lr=1e-4", "--set", "max_steps=7",
               "--set", "lora_targets=q_proj,v_proj", "--set", "request.seq_len=64"])
    assert rc == 0
    doc = json.loads((tmp_path / "r" / "plan.json").read_text())
    assert doc["batch"]["micro_batch"] == 2 and doc["batch"]["seq_len"] == 64
    assert doc["train"]["lr"] == 1e-4 and doc["train"]["max_steps"] == 7
    assert doc["request"]["lora_targets"] == ["q_proj", "v_proj"]


def test_apply_train_overrides_on_existing_options():
    t = P.apply_train_overrides(TrainOptions(lr=1.0), ["train.warmup_ratio=0.5", "micro_batch=3"])
    assert (t.lr, t.warmup_ratio) == (1.0, 0.5)


# ---- saving ----------------------------------------------------------------------------------------------------
def test_save_preset_pins_the_plan_and_replays_identically(tmp_path, in_tmp, capsys):
    assert main(["--preset", "cpu-tiny", "--save-preset", "mine", "--set", "train.lr=2e-3"]) == 0
    saved = in_tmp / "presets-local" / "mine.yaml"
    assert "saved preset" in capsys.readouterr().out
    mine = P.load_preset("mine")
    assert mine.source == "local" and mine.train.lr == 2e-3
    assert mine.request["micro_batch"] == 4 and mine.request["strategy"] == "ddp"
    assert {p.name for p in P.list_presets()} >= {"mine", "cpu-tiny"}
    for name, d in (("cpu-tiny", "a"), ("mine", "b")):
        assert main(["--preset", name, "--headless", "--dry-run", "--run-dir", str(tmp_path / d)]) == 0
    a = json.loads((tmp_path / "a" / "plan.json").read_text())
    b = json.loads((tmp_path / "b" / "plan.json").read_text())
    for key in ("model", "hardware", "training", "batch", "memory"):
        assert a[key] == b[key]
    # saving again with different content keeps the previous file
    before = saved.read_text()
    assert main(["--preset", "mine", "--save-preset", "mine", "--set", "train.lr=1e-3"]) == 0
    assert saved.with_name("mine.yaml.bak").read_text() == before
    assert P.load_preset("mine").train.lr == 1e-3


def test_save_preset_refuses_bundled_names_and_bad_names(in_tmp):
    req = PlanRequest(model="scaletrain/tiny-qwen2", gpus="2xCPU")
    with pytest.raises(ScaletrainError, match="bundled preset"):
        P.save_preset("cpu-tiny", req, TrainOptions())
    with pytest.raises(ScaletrainError, match="not accepted"):
        P.save_preset("../escape", req, TrainOptions())


def test_local_preset_name_must_match_its_file(in_tmp):
    d = in_tmp / "presets-local"
    d.mkdir()
    (d / "one.yaml").write_text("name: two\ndescription: x\nrequest: {model: scaletrain/tiny-qwen2}\n")
    with pytest.raises(ScaletrainError, match="says name 'two'"):
        P.load_preset("one")


def test_presets_command_json(capsys, in_tmp):
    assert main(["presets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by = {r["name"]: r for r in rows}
    assert set(SEVEN) <= set(by)
    assert by["4090x8"]["hardware"] == "8xRTX4090" and by["4090x8"]["model"] == "Qwen/Qwen3-4B"
    assert main(["presets"]) == 0
    assert "h200x4-fast" in capsys.readouterr().out


# ---- the bundled demo data -------------------------------------------------------------------------------------
def test_demo_data_is_small_reproducible_and_readable():
    from scaletrain.trainer.data import ByteTokenizer, load_blocks, read_jsonl
    from scaletrain.presets import make_demo_data

    path = Path(make_demo_data.__file__).parent / "data" / "demo.jsonl"
    assert path.stat().st_size < 200 * 1024
    assert path.read_text() == make_demo_data.render(make_demo_data.make_records())   # the script made this file
    recs = read_jsonl(path)
    shapes = {("text" in r, "prompt" in r, "messages" in r) for r in recs}
    assert shapes == {(True, False, False), (False, True, False), (False, False, True)}
    plan, _, _ = _plan("cpu-tiny")
    blocks = load_blocks(path, ByteTokenizer(plan.setup.model.vocab_size), plan.setup.seq_len, packing=True)
    per_step = plan.setup.effective_batch
    assert len(blocks) >= 10 * per_step     # several optimizer steps per epoch for the demo

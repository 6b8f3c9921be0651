"""`scaletrain --plain` with answers fed on stdin (no TTY): the same questions, refusals and run directory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scaletrain.engine.devices.nvml import detect
from scaletrain.engine.request.presets import load_preset
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.plan.planner import make_plan

SCALETRAIN = [sys.executable, "-m", "scaletrain.tui.cli"]


def plain(args: list[str], answers: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*SCALETRAIN, "--plain", *args], input="\n".join(answers) + "\n", capture_output=True,
                          text=True, timeout=timeout)


def test_custom_answers_with_bad_entries_refused_and_asked_again(tmp_path):
    run_dir = tmp_path / "run"
    answers = [
        "",                            # GPUs: the --gpus default (4xH200)
        "Qwen/Qwen2.5-7B-Instruct",    # model
        "./nope", "",                  # weights: neither a folder nor an HF id (refused), then the model's own
        "lora", "8", "",               # method, rank, targets (all)
        "",                            # objective: sft
        "",                            # no resident models
        "12a", "130", "128",           # effective batch: letters, then a batch 4 GPUs cannot split, then 128
        "",                            # sequence length 2048
        str(tmp_path / "missing.jsonl"), "1000",   # dataset: a missing path, then a sample count
        "2", "",                       # epochs, learning rate
        "2e-4", "2e-4@8",              # LR reference: without its batch (refused), then with it
        "y", str(run_dir),             # write, where
    ]
    res = plain(["--gpus", "4xH200"], answers)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "✗ effective batch must be a whole number ≥ 1 (got '12a')" in out
    assert "✗ effective batch 130 is not a multiple of" in out
    assert "does not exist" in out
    assert "✗ give the LR reference as BASE_LR@BASE_BATCH" in out
    assert "square-root rule" in out and "linear rule" in out      # the engine's LR suggestion, in the plan
    assert "not launched" in out           # planned hardware is not this machine
    # the targets question names this model's block linears (phi3's differ: test_the_targets_question_…)
    assert "this model's: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj" in out
    assert res.stderr == ""
    written = json.loads((run_dir / "plan.json").read_text())
    assert written["batch"]["effective_batch"] == 128 and written["batch"]["world_size"] == 4
    assert written["training"]["method"] == "lora" and written["training"]["lora_rank"] == 8
    assert "✗ --weights ./nope: no such file or folder, and not an HF id" in out
    assert written["train"]["model_source"] == "Qwen/Qwen2.5-7B-Instruct" and "warning: random-init" not in out
    assert written["request"]["dataset_size"] == 1000 and written["request"]["epochs"] == 2
    assert written["request"]["base_lr"] == 2e-4 and written["request"]["base_batch"] == 8
    expected = make_plan(PlanRequest(**{k: tuple(v) if isinstance(v, list) else v
                                        for k, v in written["request"].items()}))
    assert written["memory"]["per_gpu_bytes"]["total"] == expected.memory.total_bytes


def test_preset_defaults_reproduce_the_preset(tmp_path):
    run_dir = tmp_path / "run"
    answers = [""] * 14 + ["y", str(run_dir)]     # take every default, then write
    res = plain(["--preset", "h200x4-fast"], answers)
    assert res.returncode == 0, res.stderr
    written = json.loads((run_dir / "plan.json").read_text())
    expected = make_plan(PlanRequest(**load_preset("h200x4-fast").request_fields())).to_json()
    assert written["batch"] == expected["batch"]
    assert written["memory"] == expected["memory"]


def test_input_that_ends_early_is_one_line_exit_2():
    res = plain(["--gpus", "4xH200"], ["", "Qwen/Qwen2.5-7B-Instruct"])
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "input ended before" in res.stderr
    assert "Traceback" not in res.stderr


def test_no_gpu_is_said_plainly():
    if detect().gpus:
        pytest.skip("this machine has GPUs; the no-GPU wording is covered by the pilot tests with replayed NVML")
    res = plain([], ["", "scaletrain/tiny-qwen2", "", "full", "", "", "", "", "", "", "", "", "n"])
    assert res.returncode == 0, res.stderr
    assert "No GPU detected on this machine" in res.stdout and "catalog" in res.stdout
    assert "nothing written" in res.stdout


def test_objective_and_its_knobs_are_asked(tmp_path):
    run_dir = tmp_path / "run"
    answers = [
        "", "Qwen/Qwen3-4B", "", "full",   # GPUs (4xH200), model, its own weights, method
        "ppo", "grpo",                 # objective: not one of the choices (refused), then grpo
        "1", "16",                     # completions per prompt: 1 refused (the engine's rule), then 16
        "4096", "256", "same",         # completion length: longer than seq 2048 (refused), 256; reference model
        "",                            # no resident models
        "40", "64",                    # effective batch: not whole groups of 16 (refused), then 64
        "", "", "", "", "",            # seq len, dataset, epochs, LR, LR reference
        "y", str(run_dir),
    ]
    res = plain(["--gpus", "4xH200"], answers)
    assert res.returncode == 0, res.stderr
    assert "✗ 'ppo' is not one of: sft/reward/dpo/grpo".replace("/", ", ") in res.stdout
    assert "✗ --num-generations must be a whole number ≥ 2" in res.stdout
    assert "✗ --completion-len 4096 leaves no room for a prompt" in res.stdout
    assert "multiple of 16; 40 is not" in res.stdout
    written = json.loads((run_dir / "plan.json").read_text())
    assert written["training"]["objective"] == "grpo" and written["training"]["num_generations"] == 16
    assert written["training"]["ref_model"] == "same"
    assert written["request"]["completion_len"] == 256


@pytest.mark.long
def test_random_init_is_warned_and_qlora_from_it_refused(tmp_path):
    """engine.request.weights in plain mode: a random-init run says so before writing; QLoRA from random-init is one
    line, exit 2, nothing written."""
    base = ["", "Qwen/Qwen2.5-7B-Instruct", "random-init"]
    batch = ["", "128", "", "1000", "", "", "none"]          # residents, batch, seq, samples, epochs, lr, LR ref
    res = plain(["--gpus", "4xH200"], [*base, "lora", "", "", "", *batch, "n"])     # objective sft
    assert res.returncode == 0, res.stderr
    assert "warning: random-init weights: testing only" in res.stdout and "nothing written" in res.stdout
    res = plain(["--gpus", "4xH200"], [*base, "qlora", "", "", "", *batch, "y", str(tmp_path / "run")])
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "4-bit base (qlora)" in res.stderr
    assert not (tmp_path / "run").exists()


def test_dpo_prompt_length_is_checked_by_the_engines_rule(tmp_path):
    run_dir = tmp_path / "run"
    answers = ["", "Qwen/Qwen3-4B", "", "lora", "", "",   # GPUs, model, weights, method, rank, targets
               "dpo", "4096", "512", "",                  # objective; prompt length too long (refused), 512; ref
               "", "64", "", "", "", "", "", "y", str(run_dir)]
    res = plain(["--gpus", "4xH200"], answers)
    assert res.returncode == 0, res.stderr
    assert "✗ --prompt-len must be a whole number from 1 to seq_len − 1 = 2047 (got 4096)" in res.stdout
    written = json.loads((run_dir / "plan.json").read_text())
    assert written["training"]["objective"] == "dpo" and written["training"]["prompt_len"] == 512
    assert written["training"]["ref_model"] == "same"


def test_the_targets_question_names_the_models_own_linears(tmp_path):
    """phi3's blocks have qkv_proj and gate_up_proj; the question named none, and q_proj was refused after."""
    answers = ["", "scaletrain/tiny-phi3", "", "lora", "", "q_proj", "qkv_proj"]     # then input ends
    out = plain(["--gpus", "2xCPU", "--run-dir", str(tmp_path / "run")], answers).stdout
    assert "this model's: o_proj,qkv_proj,gate_up_proj,down_proj" in out
    assert "unknown LoRA target(s) q_proj; accepted: o_proj, qkv_proj, gate_up_proj, down_proj" in out

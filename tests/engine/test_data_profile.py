"""Issue 22 (your data, understood): `plan --data` reads, tokenizes and blocks the data exactly as the trainer will
(measure/data_profile.py in a subprocess; planning imports no torch) and plans with the blocks it makes; a real run
counts the same blocks; --data-columns maps other column names onto TRL's."""

from __future__ import annotations

import json
import random

import pytest

from scaletrain.tui.cli.main import main

PLAN = ["plan", "--model", "scaletrain/tiny-qwen2", "--weights", "random-init", "--gpus", "2xCPU", "--seq-len", "128",
        "--micro-batch", "2", "--grad-accum", "1", "--precision", "fp32", "--strategy", "ddp", "--json"]


@pytest.fixture
def chat(tmp_path):
    rnd = random.Random(0)
    path = tmp_path / "chat.jsonl"
    with path.open("w") as f:
        for i in range(60):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"question {i} " + "x" * rnd.randint(1, 30)},
                                             {"role": "assistant", "content": "answer " + "y " * rnd.randint(2, 60)}]})
                    + "\n")
    return path


def test_plan_data_carries_token_statistics_and_plans_the_blocks(chat, capsys):
    assert main([*PLAN, "--data", str(chat)]) == 0
    out = json.loads(capsys.readouterr().out)
    prof = out["data"]["profile"]
    assert (prof["records"], prof["data_format"]) == (60, "messages")
    assert prof["tokens"]["p50"] <= prof["tokens"]["p95"] <= prof["tokens"]["max"]
    assert 0 < prof["truncated_share"] < 1                      # some records are longer than 128 tokens
    assert "«" in prof["examples"][0] and "»" in prof["examples"][0]      # the assistant turn is what trains
    # the plan's samples are the trainer's blocks: steps per epoch follow the packed token count
    assert out["data"]["rows"] == 60 and prof["blocks"] == prof["block_tokens"] // 128
    assert out["time"]["steps_per_epoch"] == prof["blocks"] // (2 * 1 * 2)


@pytest.mark.slow
def test_the_trainer_counts_the_blocks_the_plan_planned(chat, tmp_path, capsys):
    from scaletrain.engine.launch.launcher import launch
    from scaletrain.engine.run.metrics import read_metrics
    from test_train_cpu import deadline_tick

    run = tmp_path / "run"
    assert main(["--preset", "cpu-tiny", "--seq-len", "128", "--micro-batch", "2", "--grad-accum", "1",
                 "--effective-batch", "4", "--data", str(chat), "--headless", "--dry-run", "--run-dir", str(run),
                 "--set", "train.max_steps=3", "--set", "train.save_checkpoints=false"]) == 0
    doc = json.loads((run / "plan.json").read_text())
    assert doc["request"]["dataset_size"] == 57                  # the blocks, not the 60 records
    capsys.readouterr()
    res = launch(run, on_tick=deadline_tick())
    assert res.exit_code == 0
    last = read_metrics(run / "metrics.jsonl")[-1]
    assert last.epoch == pytest.approx(3 / doc["time"]["steps_per_epoch"], abs=1e-4)     # the trainer's epoch


def test_data_columns_map_other_names_onto_trls(tmp_path, capsys):
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"question": f"what is {i}?", "answer": f"it is {i}"}) + "\n" for i in range(40)))
    assert main([*PLAN, "--data", str(qa)]) == 2            # the trainer's refusal, at plan time (issue 29)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--data-columns" in err and "question" in err and "qa.jsonl:1" in err
    assert main([*PLAN, "--data", str(qa), "--data-columns", "prompt=question,completion=answer"]) == 0
    prof = json.loads(capsys.readouterr().out)["data"]["profile"]
    assert prof["data_format"] == "prompt-completion" and prof["examples"][0] == "what is 0?\n«it is 0»"
    assert main([*PLAN, "--data", str(qa), "--data-columns", "question=prompt"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--data-columns" in err

"""`scaletrain plan` end to end: the done-when numbers, JSON schema, one-line errors, no heavy imports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scaletrain.tui.cli.main import main

SCALETRAIN = [sys.executable, "-m", "scaletrain.tui.cli"]


def _plan_json(capsys, *args, code=0):
    assert main(["plan", *args, "--json"]) == code
    return json.loads(capsys.readouterr().out)


def test_qwen3_4b_on_8x4090_zero3(capsys):
    out = _plan_json(capsys, "--model", "Qwen/Qwen3-4B", "--gpus", "8xRTX4090", "--strategy", "zero3",
                     "--micro-batch", "2", "--grad-accum", "8", "--seq-len", "2048", "--grad-ckpt")
    assert out["model"]["params"] == 4_022_468_096
    assert out["model"]["trainable_params"] == 4_022_468_096
    assert out["hardware"] == {**out["hardware"], "gpu": "RTX4090", "gpus_per_node": 8, "nodes": 1}
    assert out["batch"]["effective_batch"] == 128 and out["batch"]["world_size"] == 8
    per_gpu = out["memory"]["per_gpu_bytes"]
    parts = ["weights", "gradients", "optimizer", "activations", "logits", "overhead"]
    assert all(isinstance(per_gpu[k], int) and per_gpu[k] >= 0 for k in parts)
    assert per_gpu["total"] == sum(per_gpu[k] for k in parts)
    assert out["memory"]["fits"] is True
    assert per_gpu["total"] < 24 * 1000**3
    assert out["memory"]["headroom_bytes"] == out["hardware"]["gpu_memory_bytes"] - per_gpu["total"]


def test_zero3_shards_model_states_compared_to_ddp(capsys):
    common = ["--model", "Qwen/Qwen3-4B", "--gpus", "8xRTX4090", "--micro-batch", "1", "--grad-accum", "16",
              "--seq-len", "1024", "--grad-ckpt", "--offload", "none"]
    z3 = _plan_json(capsys, *common, "--strategy", "zero3")["memory"]
    ddp = _plan_json(capsys, *common, "--strategy", "ddp", code=3)["memory"]   # nothing fits: exit 3
    assert ddp["fits"] is False  # 16 B/param of a 4B model is 64 GB
    states = lambda m: m["per_gpu_bytes"]["weights"] + m["per_gpu_bytes"]["optimizer"]   # noqa: E731
    assert states(z3) * 6 < states(ddp)   # (2 + 12/8) vs 12 bytes per parameter


@pytest.mark.parametrize("argv,needle", [
    (["--model", "Qwen/Qwen3-4B", "--gpus", "8xBanana"], "unknown GPU"),
    (["--model", "nobody/none", "--gpus", "8xH100"], "unknown model"),
    (["--model", "Qwen/Qwen3-4B", "--gpus", "8xH100", "--micro-batch", "0"], "micro-batch"),
    (["--model", "Qwen/Qwen3-4B", "--gpus", "8xH100", "--seq-len", "-5"], "seq-len"),
    (["--model", "Qwen/Qwen3-4B", "--gpus", "0xH100"], "at least 1"),
    (["--model", "pyproject.toml", "--gpus", "8xH100"], "not a JSON config.json"),
    (["--model", "Qwen/Qwen3-4B", "--gpus", "8xH100", "--micro-batch", "3", "--grad-accum", "2",
      "--effective-batch", "128"], "not the effective batch"),
    (["--model", "Qwen/Qwen3-4B", "--gpus", "8xH100", "--micro-batch", "3", "--grad-accum", "2",
      "--effective-batch", "128", "--strategy", "ddp", "--no-grad-ckpt", "--offload", "none"], "effective batch"),
    (["--model", "Qwen/Qwen3-4B", "--gpus", "8xH100", "--strategy", "zero9"], "invalid choice"),
    (["--model", "Qwen/Qwen3-4B", "--gpus", "4xV100", "--precision", "bf16"], "no bf16"),
])
def test_bad_input_is_one_line(capsys, argv, needle):
    code = main(["plan", *argv])
    err = capsys.readouterr().err
    assert code != 0
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv,help_of", [
    (["diagnose", "run", "--bogus"], "scaletrain diagnose"),
    (["export", "run", "--merge", "--zzz"], "scaletrain export"),
    (["config", "write", "--qq"], "scaletrain config write"),
    (["plan", "--model", "Qwen/Qwen3-4B", "extra"], "scaletrain plan"),
    (["--bogus"], "scaletrain"),
])
def test_a_word_no_parser_took_points_at_its_commands_help(capsys, argv, help_of):
    """argparse reports leftover words from the top parser, whose help lists no subcommand's flags."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.strip().endswith(f"(see `{help_of} --help`)"), err


def test_plan_subprocess_imports_no_torch_or_textual():
    code = ("import sys; from scaletrain.tui.cli.main import main; "
            "rc = main(['plan', '--model', 'Qwen/Qwen3-4B', '--gpus', '8xRTX4090', '--json']); "
            "heavy = sorted(m for m in ('torch', 'textual', 'transformers', 'deepspeed') if m in sys.modules); "
            "print('HEAVY', heavy, file=sys.stderr); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stderr
    assert json.loads(r.stdout)["model"]["params"] == 4_022_468_096


def test_rich_table_output(capsys):
    assert main(["plan", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--gpus", "1xL40S", "--micro-batch", "4",
                 "--grad-accum", "1", "--strategy", "ddp", "--no-grad-ckpt", "--offload", "none"]) == 0
    out = capsys.readouterr().out
    for word in ("weights", "gradients", "optimizer", "activations", "logits", "overhead", "fits"):
        assert word in out

"""`scaletrain --preset NAME --headless [--dry-run]`: the seeds' numbers in files accelerate and DeepSpeed accept,
the same numbers as `plan --preset NAME --json`, no TUI or torch on the way, and the hand-off to a real launch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from scaletrain.tui.cli.main import main
from test_writers import parse_run_dirs

SEED_RUNS = ("4090x8", "h200x4-fast")


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dry")
    for name in SEED_RUNS:
        assert main(["--preset", name, "--headless", "--dry-run", "--run-dir", str(root / name)]) == 0
    return root


def _plan_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_dry_run_writes_the_layout_and_launches_nothing(dry_runs):
    zero = dry_runs / "4090x8"
    assert {p.name for p in zero.iterdir()} == {"plan.json", "accelerate_config.yaml", "ds_config.json", "launch.sh",
                                                "logs", "checkpoints"}
    ddp = dry_runs / "h200x4-fast"
    assert {p.name for p in ddp.iterdir()} == {"plan.json", "accelerate_config.yaml", "launch.sh", "logs",
                                               "checkpoints"}
    assert not list((zero / "logs").iterdir()) and not (zero / "metrics.jsonl").exists()


def test_plan_preset_json_reports_the_same_numbers(dry_runs, capsys):
    for name in SEED_RUNS:
        doc = json.loads((dry_runs / name / "plan.json").read_text())
        printed = _plan_json(capsys, "--preset", name)
        weights = printed.pop("weights")
        assert printed.pop("data") is None
        assert printed.pop("resources")["fits"] is True     # `plan`'s verdict against this machine, not the run's
        assert printed.pop("cost")["gpus"] == doc["hardware"]["world_size"]     # `plan`'s prices, not the run's
        assert printed.pop("resume") is None                # no --resume-from
        assert printed == {k: v for k, v in doc.items() if k not in ("request", "train")}
        assert weights["source"] == doc["train"]["model_source"] and weights["warning"] is None


@pytest.mark.long
def test_seed_numbers_in_files_accelerate_and_deepspeed_accept(dry_runs):
    res = parse_run_dirs([{"key": n, "dir": str(dry_runs / n), "world": w}
                          for n, w in (("4090x8", 8), ("h200x4-fast", 4))])
    z = res["4090x8"]["ok"]
    assert z["cluster"]["distributed_type"] == "DEEPSPEED" and z["cluster"]["num_processes"] == 8
    assert (z["ds"]["micro"], z["ds"]["accum"], z["ds"]["train_batch_size"], z["ds"]["stage"]) == (2, 8, 128, 3)
    assert z["ds"]["bf16"] is True
    d = res["h200x4-fast"]["ok"]
    assert d["cluster"]["distributed_type"] == "MULTI_GPU" and d["cluster"]["num_processes"] == 4
    assert d["cluster"]["mixed_precision"] == "bf16"
    zdoc = json.loads((dry_runs / "4090x8" / "plan.json").read_text())
    assert zdoc["training"]["grad_ckpt"] is True and zdoc["batch"]["seq_len"] == 2048
    ddoc = json.loads((dry_runs / "h200x4-fast" / "plan.json").read_text())
    assert (ddoc["batch"]["micro_batch"], ddoc["batch"]["grad_accum"], ddoc["batch"]["effective_batch"]) == (16, 2, 128)
    assert (ddoc["training"]["method"], ddoc["training"]["base_bits"]) == ("lora", 8)
    assert ddoc["train"]["lr"] == 3e-4 and ddoc["request"]["epochs"] == 2


def test_rerun_into_the_same_dir_is_fine_and_a_different_plan_is_one_line(dry_runs, capsys):
    d = str(dry_runs / "4090x8")
    assert main(["--preset", "4090x8", "--headless", "--dry-run", "--run-dir", d]) == 0
    capsys.readouterr()
    assert main(["--preset", "h200x4-fast", "--headless", "--dry-run", "--run-dir", d]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "different plan" in err and "--overwrite" in err
    assert json.loads((dry_runs / "4090x8" / "plan.json").read_text())["name"] == "4090x8"


def test_headless_dry_run_imports_neither_textual_nor_torch(tmp_path):
    code = ("import sys; from scaletrain.tui.cli.main import main; "
            f"rc = main(['--preset', 'cpu-tiny', '--headless', '--dry-run', '--run-dir', {str(tmp_path / 'r')!r}]); "
            "print('RC', rc, 'textual' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "RC 0 False False"


def test_a_gpu_plan_is_not_launched_on_a_machine_without_its_gpus(tmp_path, capsys):
    from scaletrain.engine.devices.nvml import detect

    if len(detect().gpus) >= 4:
        pytest.skip("this machine has the GPUs h200x4-fast asks for")
    assert main(["--preset", "h200x4-fast", "--headless", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "needs 4 GPUs per node" in err and "scaletrain launch" in err
    assert (tmp_path / "r" / "plan.json").exists() and not (tmp_path / "r" / "status.json").exists()


def _replayed(run, returncode: int, output: str, strategy: str) -> None:
    assert returncode == 0, output[-4000:]
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert all(r["world_size"] == 2 for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    cfg = yaml.safe_load((run / "accelerate_config.yaml").read_text())
    assert cfg["distributed_type"] == ("DEEPSPEED" if strategy == "zero3" else "MULTI_GPU")


@pytest.mark.slow
def test_headless_replay_trains_cpu_tiny_ddp(demo_run):
    """The real hand-off: 2 CPU ranks train a few steps through accelerate; loss falls; exit code is training's.
    The shared `demo_run` (tests/conftest.py) is this command with --set strategy=ddp."""
    _replayed(demo_run.run.path, demo_run.exit_code, demo_run.console, "ddp")


@pytest.mark.slow
def test_headless_replay_trains_cpu_tiny_zero3(zero3_run):
    """The real hand-off under DeepSpeed ZeRO-3. The shared `zero3_run` (tests/conftest.py) is this command with
    --set strategy=zero3."""
    _replayed(zero3_run.run.path, zero3_run.exit_code, zero3_run.console, "zero3")

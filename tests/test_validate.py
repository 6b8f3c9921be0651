"""`scaletrain validate`: a real CPU run, the profiler's ground truth, and calibration profiles."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from scaletrain.engine.model.calibration import Calibration, load_calibration, save_calibration, stack_signature
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.plan.request import PlanRequest
from scaletrain.engine.plan.planner import make_plan
from scaletrain.trainer.validate import ValidationResult, derive_calibration
from scaletrain.tui.cli.main import main


@pytest.fixture()
def config_dir(tmp_path, monkeypatch):
    d = tmp_path / "config"
    monkeypatch.setenv("SCALETRAIN_CONFIG_DIR", str(d))
    return d


def test_validate_cpu_tiny_prints_predicted_vs_measured_and_saves(tmp_path, capsys, config_dir):
    code = main(["validate", "--preset", "cpu-tiny", "--steps", "6", "--run-dir", str(tmp_path / "v"), "--save",
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["steps"] == 6
    assert out["measured_allocated_bytes"] > 0 and out["predicted_allocated_bytes"] > 0
    assert abs(out["memory_error"]) <= 0.20                       # the CPU ground-truth bar
    assert out["measured_step_seconds"] > 0 and out["predicted_step_seconds"] > 0
    # the saved profile is used by the next plan on that hardware, which says so
    path = Path(out["calibration_path"])
    assert path.is_file() and path.parent == config_dir / "calibration"
    cal = load_calibration("CPU", "full")
    assert cal is not None and cal.stack == stack_signature()
    req = PlanRequest(model="scaletrain/tiny-qwen2", gpus="2xCPU", precision="fp32", strategy="ddp", micro_batch=4,
                      grad_accum=2, seq_len=128, grad_ckpt=False, offload="none")
    plan = make_plan(req)
    assert any(n.startswith("calibrated on CPU") for n in plan.notes)
    assert plan.time.constants.compute_scale == pytest.approx(cal.compute_scale)


def test_validate_text_output(tmp_path, capsys, config_dir):
    assert main(["validate", "--preset", "cpu-tiny", "--steps", "4", "--run-dir", str(tmp_path / "v")]) == 0
    out = capsys.readouterr().out
    assert "predicted" in out and "measured" in out and "allocated peak" in out and "step time" in out
    assert not (config_dir / "calibration").exists()              # no --save, no profile


def _result(step_measured: float, reserved: int | None = None, allocated: int | None = None) -> ValidationResult:
    plan = make_plan(PlanRequest(model="Qwen/Qwen2.5-0.5B-Instruct", gpus="1xH100", micro_batch=4, grad_accum=1,
                                 seq_len=1024, strategy="ddp", grad_ckpt=False, offload="none"))
    return ValidationResult(plan=plan, steps=20, memory_source="test", predicted_allocated_bytes=1,
                            measured_allocated_bytes=allocated, predicted_reserved_bytes=None,
                            measured_reserved_bytes=reserved, predicted_step_seconds=plan.time.step_seconds,
                            measured_step_seconds=step_measured, run_dir=Path("."))


def test_derive_calibration_arithmetic(config_dir):
    r = _result(1.0)
    t = r.plan.time
    cal = derive_calibration(r, "test")
    non_compute = t.step_seconds - t.compute_seconds
    assert cal.compute_scale == pytest.approx((1.0 - non_compute) / t.compute_seconds, rel=1e-3)
    assert cal.achieved_utilization == pytest.approx(t.model_flops_per_step / (1.0 * t.peak_flops), abs=1e-4)
    assert cal.allocator_reserve_fraction is None
    gpu = derive_calibration(_result(1.0, reserved=12 * 2**30, allocated=10 * 2**30), "test")
    assert gpu.allocator_reserve_fraction == pytest.approx(0.2)


def test_calibrated_plan_uses_profile_and_stale_stack_is_ignored(config_dir):
    req = PlanRequest(model="Qwen/Qwen2.5-0.5B-Instruct", gpus="1xH100", micro_batch=4, grad_accum=1, seq_len=1024,
                      strategy="ddp", grad_ckpt=False, offload="none")
    before = make_plan(req)
    cal = Calibration(device="H100-SXM", method="full", stack=stack_signature(), created="2026-11-22", source="t",
                      compute_scale=2.0, achieved_utilization=0.2, context_bytes=1 << 30,
                      allocator_reserve_fraction=0.25)
    save_calibration(cal)
    after = make_plan(req)
    assert after.time.compute_seconds == pytest.approx(2 * before.time.compute_seconds)
    assert after.memory.overhead_bytes == (after.memory.workspace_bytes + (1 << 30)
                                           + int(0.25 * after.memory.allocated_peak_bytes))
    assert any("calibrated on H100-SXM" in n for n in after.notes)
    save_calibration(replace(cal, stack={**cal.stack, "torch": "0.0.1"}))   # another stack: not this one's
    assert make_plan(req).time.compute_seconds == pytest.approx(before.time.compute_seconds)


def test_absurd_measurement_is_not_saved(config_dir):
    with pytest.raises(ScaletrainError, match="not saving"):
        save_calibration(Calibration(device="CPU", method="full", stack=stack_signature(), created="x", source="t",
                                     compute_scale=50.0, achieved_utilization=None))


def test_validate_bad_steps(capsys, config_dir):
    assert main(["validate", "--preset", "cpu-tiny", "--steps", "1"]) == 2
    assert "--steps must be at least" in capsys.readouterr().err


def test_accuracy_sweep_harness_runs_end_to_end_on_cpu(tmp_path, config_dir):
    """bench/accuracy.py is the GPU sweep; its CPU smoke mode proves the harness and the record schema."""
    import sys as _sys
    _sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import accuracy

    out = tmp_path / "acc.json"
    assert accuracy.main(["--cpu-smoke", "--only", "0", "--steps", "4", "--out", str(out),
                          "--run-root", str(tmp_path / "runs")]) == 0
    rec = json.loads(out.read_text())["records"][0]
    for key in ("gpu", "model", "method", "strategy", "grad_ckpt", "seq_len", "predicted_peak_bytes",
                "measured_peak_bytes", "measured_reserved_bytes", "predicted_step_seconds", "measured_step_seconds"):
        assert key in rec
    assert rec["gpu"] == "CPU" and rec["measured_peak_bytes"] > 0
    assert abs(rec["predicted_peak_bytes"] - rec["measured_peak_bytes"]) / rec["measured_peak_bytes"] <= 0.20


@pytest.mark.slow
def test_validate_measures_an_objective_with_trl(tmp_path, capsys, config_dir):
    """DPO (reference model included): predicted vs the profiler over one real TRL step, as for supervised steps."""
    assert main(["validate", "--preset", "cpu-tiny-dpo", "--steps", "3", "--run-dir", str(tmp_path / "v"),
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["plan"]["training"]["objective"] == "dpo"
    assert abs(r["memory_error"]) <= 0.05

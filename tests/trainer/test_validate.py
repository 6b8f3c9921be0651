"""`scaletrain validate`: a real CPU run, the profiler's ground truth, and calibration profiles."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from scaletrain.engine.estimate.calibration import Calibration, load_calibration, save_calibration, stack_signature
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.plan.planner import make_plan
from scaletrain.measure.validate import ValidationResult, derive_calibration
from scaletrain.tui.cli.main import main


@pytest.fixture()
def config_dir(tmp_path, monkeypatch):
    d = tmp_path / "config"
    monkeypatch.setenv("SCALETRAIN_CONFIG_DIR", str(d))
    return d


@pytest.mark.slow
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


@pytest.mark.slow
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


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def weight_files(run_dir: Path) -> list[Path]:
    return [p for p in run_dir.rglob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)]


@pytest.mark.slow
def test_issue12_done_when_seq_2048_on_the_demo_data_validates_and_leaves_no_weights(tmp_path, capsys, config_dir):
    """`scaletrain validate --preset cpu-tiny --set seq_len=2048 --set micro_batch=8 --set grad_accum=4 --steps 3`:
    the demo data gives 31 blocks of 2048 tokens and one step on 2 ranks needs 64, so the trainer repeats it to the
    plan's size; the run keeps logs and metrics, and no checkpoint weights at all."""
    run_dir = tmp_path / "v"
    code = main(["validate", "--preset", "cpu-tiny", "--set", "seq_len=2048", "--set", "micro_batch=8", "--set",
                 "grad_accum=4", "--steps", "3", "--run-dir", str(run_dir), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    assert out["steps"] == 3 and out["measured_step_seconds"] > 0 and out["measured_allocated_bytes"] > 0
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "the bundled demo data is repeated" in log and "one optimizer step needs 64" in log
    assert "no checkpoints written" in log
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == 3
    assert not list((run_dir / "checkpoints").iterdir()) and weight_files(run_dir) == []


@pytest.mark.slow
def test_validation_budget_stops_the_run_and_removes_weights(tmp_path, config_dir):
    """A budget shorter than the run: every rank is stopped, the error says so, and the run directory keeps its
    logs but no checkpoint weights (a checkpoint planted in it between two runs of the same plan is removed)."""
    from scaletrain.engine.request.presets import load_preset
    from scaletrain.measure.validate import ValidationTimedOut, validate

    preset = load_preset("cpu-tiny")
    run_dir = tmp_path / "v"
    for attempt in range(2):
        with pytest.raises(ValidationTimedOut, match="did not finish within its 3 s budget") as e:
            validate(PlanRequest(**preset.request_fields()), preset.train, steps=100000, run_dir=run_dir,
                     budget_seconds=3)
        assert e.value.run.path == run_dir.resolve()
        assert json.loads((run_dir / "status.json").read_text())["state"] == "interrupted"
        assert weight_files(run_dir) == [] and (run_dir / "logs" / "rank-0.log").is_file()
        planted = run_dir / "checkpoints" / "step-50"
        planted.mkdir()
        (planted / "model.safetensors").write_bytes(b"x" * 1024)
    assert not list(run_dir.glob("superseded-*"))          # the same plan: rewritten in place, nothing moved aside


def test_demo_data_is_sized_to_the_plan_and_user_data_is_not(tmp_path):
    """The bundled demo set repeats to the blocks one optimizer step needs; a user's file is taken as it is."""
    from scaletrain.engine.request.options import bundled_demo_dataset
    from scaletrain.trainer import data as D

    tok = D.ByteTokenizer(1000)
    demo = bundled_demo_dataset()
    once = D.load_blocks(demo, tok, 2048, packing=True)
    assert once.repeats == 1 and 0 < len(once) < 64
    sized = D.load_blocks(demo, tok, 2048, packing=True, min_blocks=64)
    assert len(sized) == 64 and sized.repeats > 1 and sized.input_ids[:len(once)] == once.input_ids
    padded = D.load_blocks(demo, tok, 64, packing=False, min_blocks=5000)
    assert len(padded) == 5000 and padded.repeats > 1
    huge = D.load_blocks(demo, tok, 1 << 17, packing=True, min_blocks=2)      # longer than the whole demo set
    assert len(huge) == 2 and all(len(r) == 1 << 17 for r in huge.input_ids)
    small = tmp_path / "small.jsonl"
    small.write_text('{"text": "only a few words"}\n')
    with pytest.raises(ScaletrainError, match="yields no training block of 2048 tokens"):
        D.load_blocks(small, tok, 2048, packing=True)


def _bench(name: str):
    import importlib
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    return importlib.import_module(name)


@pytest.mark.slow
def test_accuracy_sweep_harness_runs_end_to_end_on_cpu(tmp_path, config_dir):
    """bench/accuracy.py is the GPU sweep; its CPU smoke mode proves the harness and the record format that
    bench/gpu_records.py re-predicts."""
    accuracy, gpu_records = _bench("accuracy"), _bench("gpu_records")
    out = tmp_path / "acc.json"
    assert accuracy.main(["--cpu-smoke", "--only", "0", "--steps", "4", "--out", str(out),
                          "--run-root", str(tmp_path / "runs")]) == 0
    data = json.loads(out.read_text())
    assert {"machine", "measured_with", "source", "records", "outcomes"} <= set(data)
    rec = data["records"][0]
    assert rec["gpu"] == "CPU" and set(rec["as_run"]) == {"optimizer_impl", "base_bits", "grad_accum",
                                                          "master_weights"}
    m = rec["measured"]
    assert m["peak_allocated_bytes"] > 0 and m["step_seconds"] > 0 and m["steps"] == 4
    compared = rec["predicted_at_run"]["compared_allocated_bytes"]
    assert abs(compared - m["peak_allocated_bytes"]) / m["peak_allocated_bytes"] <= 0.20
    assert weight_files(tmp_path / "runs") == []
    again = gpu_records.repredict(json.loads(out.read_text()))          # the same file, re-predicted
    assert again["records"][0]["predicted"]["peak_allocated_bytes"] > 0


@pytest.mark.slow
def test_accuracy_sweep_records_no_fit_and_timeouts_as_outcomes(tmp_path, config_dir, monkeypatch):
    """A config the planner says does not fit runs briefly; its death (here a rank SIGKILLed after step 1, what the
    host OOM killer leaves) is an outcome with the doctor's kind, not an error. A config past its time budget is
    stopped and recorded as timed out. The file is whole after each config."""
    accuracy = _bench("accuracy")
    out, runs = tmp_path / "acc.json", str(tmp_path / "runs")
    monkeypatch.setenv("SCALETRAIN_FAIL_AT_STEP", "1")
    # ... as the host OOM killer would: the kernel's OOM-kill count rises during the run (an unchanged count makes
    # the same SIGKILL `killed`, not host_oom: tests/e2e/test_run_lifecycle.py)
    kills = itertools.count()
    monkeypatch.setattr("scaletrain.engine.launch.launcher.oom_kill_count", lambda: next(kills))
    assert accuracy.main(["--cpu-smoke", "--only", "3", "--steps", "6", "--out", str(out), "--run-root", runs]) == 0
    first = json.loads(out.read_text())
    (oom,) = first["outcomes"]
    assert oom["outcome"] == "out_of_memory" and oom["doctor_kind"] == "host_oom"
    assert oom["predicted_at_run"]["fits"] is False and oom["measured_fits"] is False and first["records"] == []
    monkeypatch.delenv("SCALETRAIN_FAIL_AT_STEP")
    assert accuracy.main(["--cpu-smoke", "--only", "0", "--steps", "4", "--budget-seconds", "1", "--out", str(out),
                          "--run-root", runs]) == 0
    outcomes = {o["grid_index"]: o for o in json.loads(out.read_text())["outcomes"]}
    assert set(outcomes) == {0, 3} and outcomes[0]["outcome"] == "timed_out"
    assert "1 s budget" in outcomes[0]["cause"]
    assert accuracy.main(["--cpu-smoke", "--only", "9"]) == 2                  # a bad index: one line, exit 2


def test_gpu_grid_has_qlora_two_predicted_ooms_and_re_predictable_setups():
    """The grid (no GPU needed to check it): ≥ 14 configs, QLoRA from random init, two that the planner says do not
    fit on an 80 GB H100, and each entry's fields rebuild its setup in bench/gpu_records.py."""
    accuracy, gpu_records = _bench("accuracy"), _bench("gpu_records")
    from scaletrain.engine.plan.plan import evaluate

    assert len(accuracy.GRID) >= 14 and any(c.method == "qlora" for c in accuracy.GRID)
    no_fit = 0
    for cfg in accuracy.GRID:
        req = cfg.request("1xH100-SXM", "bf16")
        s = cfg.training_setup(req)
        no_fit += not evaluate(s).fits
        entry = {**{k: getattr(req, k) for k in accuracy.CONFIG_KEYS}, "gpu": "H100-SXM",
                 "as_run": accuracy.as_run(s)}
        assert gpu_records.setup_for(entry) == s
    assert no_fit == 2


@pytest.mark.slow
def test_validate_measures_an_objective_with_trl(tmp_path, capsys, config_dir):
    """DPO (reference model included): predicted vs the profiler over one real TRL step, as for supervised steps."""
    assert main(["validate", "--preset", "cpu-tiny-dpo", "--steps", "3", "--run-dir", str(tmp_path / "v"),
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["plan"]["training"]["objective"] == "dpo"
    assert abs(r["memory_error"]) <= 0.05

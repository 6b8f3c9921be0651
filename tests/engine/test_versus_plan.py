"""Measured beside predicted: the engine's summary puts a run's steady speed next to the plan's (measured ÷ planned),
the monitor and the headless lines show it, and the doctor scales its remedies' step times by a failed run's
measured ÷ predicted ratio and says so."""

from __future__ import annotations

import io
import json
import shutil
import statistics
from pathlib import Path

import pytest
from rich.console import Console

from scaletrain.engine.doctor.diagnosis import diagnose, diagnose_paths
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.run.metrics import (MetricsWriter, RankMemory, StepMetrics, steady_step_seconds, summarize,
                                           versus_plan)
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.run.plan_document import read_plan_document
from scaletrain.engine.run.writers import write_run_dir
from scaletrain.tui.cli.main import main

LOGS = Path(__file__).parents[1] / "fixtures" / "logs"
T0 = 1763700000.0


def test_measured_beside_planned_texts():
    v = versus_plan(0.645, 25_400.0, 0.324, 50_500.0)
    assert v.step_ratio == pytest.approx(0.645 / 0.324) and v.tokens_ratio == pytest.approx(25_400 / 50_500)
    assert v.step_text() == "645 ms/step (plan 324 ms, ×1.99)"
    assert v.tokens_text() == "25,400 tok/s (plan 50,500, ×0.50)"
    assert versus_plan(0.645, 25_400.0, 0.324, None).tokens_text() == "25,400 tok/s"
    assert versus_plan(0.645, 25_400.0, None, 50_500.0) is None            # no planned step time: nothing to show


def _rec(step: int, seconds: float, total: int = 12) -> StepMetrics:
    return StepMetrics(step=step, total_steps=total, epoch=step / total, loss=3.0 - 0.1 * step, lr=1e-4,
                       tokens_per_second=4096 / seconds, step_seconds=seconds, world_size=2, time=T0 + step,
                       tokens=4096, peak_memory=(RankMemory(0, None, None, 2**28), RankMemory(1, None, None, 2**28)))


def test_summary_speed_leaves_warm_up_out_and_sits_beside_the_plan():
    series = [_rec(1, 5.0), _rec(2, 2.0)] + [_rec(s, 0.5) for s in range(3, 9)]
    s = summarize(series, planned_step_seconds=0.25, planned_tokens_per_second=16_384.0)
    assert s.step_seconds == pytest.approx(0.5) and s.eta_seconds == pytest.approx(4 * 0.5)
    assert s.versus.step_ratio == pytest.approx(2.0) and s.versus.tokens_ratio == pytest.approx(0.5)
    assert steady_step_seconds(series) == pytest.approx(0.5)
    early = summarize(series[:2], planned_step_seconds=0.25)       # only warm-up so far: it is all there is
    assert early.step_seconds == pytest.approx(3.5) and steady_step_seconds(series[:2]) is None
    # and says so beside the plan's (a one-step run's first step is not the time model's miss)
    assert early.versus.warm_up_only and early.versus.step_text().endswith(", warm-up steps only)")
    assert not s.versus.warm_up_only and "warm-up" not in s.versus.step_text()
    assert summarize(series).versus is None


def test_the_summary_names_its_ranks_by_what_they_ran_on():
    """The headless outcome line said "on 2 process(es)" for GPUs and CPU processes alike."""
    cpu = [_rec(s, 0.5) for s in range(1, 5)]
    assert summarize(cpu).ranks_text == "2 processes"
    gpu = [StepMetrics(**{**r.__dict__, "peak_memory": (RankMemory(0, 2**30, 2**31, 2**28),), "world_size": 1})
           for r in cpu]
    assert summarize(gpu).ranks_text == "1 GPU"
    eight = [StepMetrics(**{**r.__dict__, "world_size": 8}) for r in gpu]
    assert summarize(eight).ranks_text == "8 GPUs"


def _run_dir(tmp_path: Path, seconds: list[float]):
    req = PlanRequest(model="Qwen/Qwen2.5-0.5B-Instruct", gpus="2xRTX4090", strategy="ddp", micro_batch=2,
                      grad_accum=4, grad_ckpt=True, offload="none", seq_len=1024)
    run = write_run_dir(make_plan(req), req, TrainOptions(), tmp_path / "run")
    w = MetricsWriter(run.metrics)
    for i, sec in enumerate(seconds, 1):
        w.write(_rec(i, sec, total=len(seconds) + 4))
    w.close()
    return run


def test_monitor_lines_and_job_panel_show_measured_beside_planned(tmp_path, capsys):
    from scaletrain.engine.sampling.watcher import RunWatcher
    from scaletrain.tui.widgets.job_panel import JobPanel

    run = _run_dir(tmp_path, [3.0, 1.0, 1.2, 1.2, 1.2])
    doc = read_plan_document(run.plan)
    snap = RunWatcher(run.path).poll()
    v = snap.summary.versus
    assert v.planned_step_seconds == doc.planned_step_seconds and v.measured_step_seconds == pytest.approx(1.2)
    assert v.step_ratio == pytest.approx(1.2 / doc.planned_step_seconds)
    con = Console(file=io.StringIO(), width=200)
    con.print(JobPanel(world_size=2).render_job(snap))
    panel = con.file.getvalue()
    assert f"step {v.step_text()}" in panel and f"tokens/s {v.tokens_text()}" in panel
    # `scaletrain monitor RUN --once`: each step line beside the plan, from that step's own record
    assert main(["monitor", str(run.path), "--once"]) == 0
    out = capsys.readouterr().out
    last = versus_plan(1.2, 4096 / 1.2, doc.planned_step_seconds, doc.planned_tokens_per_second)
    assert "step 5/9 " in out and last.step_text() in out and last.tokens_text() in out


def test_remedies_after_a_failure_are_scaled_by_the_runs_measured_ratio(tmp_path):
    run = _run_dir(tmp_path, [4.0, 2.0, 1.5, 1.4, 1.6, 1.5])
    shutil.copy(LOGS / "torch_current_oom_4090x8_r3.log", run.rank_log(0))
    d = diagnose_paths([run.path])
    plain = diagnose([run.rank_log(0)], read_plan_document(run.plan))            # the same, nothing measured
    _, plan = read_plan_document(run.plan).replan()
    measured = statistics.median([1.5, 1.4, 1.6, 1.5])                          # after the 2 warm-up steps
    ratio = measured / plan.time.step_seconds
    assert d.kind == "cuda_oom" and d.remedies and [r.title for r in d.remedies] == [r.title for r in plain.remedies]
    for scaled, unscaled in zip(d.remedies, plain.remedies):
        assert scaled.time_scale == pytest.approx(ratio)
        assert scaled.predicted_step_seconds == pytest.approx(unscaled.predicted_step_seconds * ratio)
        assert scaled.predicted_per_gpu_bytes == unscaled.predicted_per_gpu_bytes      # memory is not scaled
    assert len(d.notes) == 1 and f"×{ratio:.2f}" in d.notes[0] and plain.notes == ()
    assert json.loads(json.dumps(d.to_json()))["notes"] == list(d.notes)

"""Issue 23: the whole job in the monitor. A replayed 128-GPU job (16 nodes × 8 H100, every rank's peak and
telemetry in metrics.jsonl as the trainer writes them) in the engine's job view, in `monitor --headless`, and on
screen at 80×24 and 120×40 (SVG snapshots; look at new ones before accepting them with `--snapshot-update`).
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.run.metrics import read_metrics
from scaletrain.engine.run.plan_document import read_plan_document
from scaletrain.engine.run.rank_telemetry import RankTelemetry
from scaletrain.engine.sampling.job_view import STRAGGLER_FRACTION, job_view
from scaletrain.engine.sampling.gpu import ReplaySource
from scaletrain.engine.sampling.sampler import Sampler
from scaletrain.engine.sampling.watcher import RunWatcher
from scaletrain.tui.cli.monitor import stream_run
from scaletrain.tui.monitor.app import create_monitor_app
from scaletrain.tui.widgets.job_grid import JobGrid
from test_monitor import NVML

RUN_DIR = Path("/tmp/scaletrain-snapshot/monitor-128gpu")
NODES, PER_NODE = 16, 8
SLOW_RANK, HOT_RANK = 45, 77            # a straggler (waits for data) and a rank past the plan's peak


def job_run_dir(path: Path, nodes: int = NODES, per_node: int = PER_NODE) -> Path:
    """A running job's directory with two logged steps of every rank (deterministic numbers)."""
    plan = make_plan(PlanRequest(model="Qwen/Qwen2.5-0.5B-Instruct", gpus=f"{nodes}x{per_node}xH100",
                                 strategy="zero2", micro_batch=2, grad_accum=4, seq_len=2048))
    path.mkdir(parents=True)
    (path / "plan.json").write_text(json.dumps(plan.to_json()))
    (path / "logs").mkdir()
    alloc = plan.memory.allocated_peak_bytes
    world = nodes * per_node

    def rank(r: int) -> dict:
        share = 1.08 if r == HOT_RANK else 0.80 + 0.15 * ((r * 7) % 11) / 10
        tel = RankTelemetry(node=r // per_node, local_rank=r % per_node, host=f"gpu-node-{r // per_node:02d}",
                            gpu_utilization_pct=40.0 if r == SLOW_RANK else 90.0 + (r % 9),
                            gpu_memory_used_bytes=int(alloc * share * 1.1), gpu_memory_total_bytes=80 * 2**30,
                            gpu_temperature_c=60.0 + r % 15, gpu_power_w=600.0 + 5 * (r % 10),
                            data_wait_seconds=0.9 if r == SLOW_RANK else 0.01, compute_seconds=1.2,
                            optimizer_seconds=0.1)
        return {"rank": r, "allocated_bytes": int(alloc * share), "reserved_bytes": int(alloc * share * 1.1),
                "host_rss_bytes": 6 * 2**30, "telemetry": tel.to_json()}

    lines = [{"step": s, "total_steps": 100, "epoch": s / 100, "loss": 2.0 - s / 10, "lr": 1e-5,
              "tokens_per_second": 9e5, "step_seconds": 2.2, "world_size": world, "time": 1763700000.0 + s,
              "peak_memory": [rank(r) for r in range(world)]} for s in (1, 2)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (path / "status.json").write_text(json.dumps({"state": "running"}))
    return path


@pytest.fixture
def run_128(tmp_path):
    if RUN_DIR.exists():
        shutil.rmtree(RUN_DIR)
    RUN_DIR.parent.mkdir(parents=True, exist_ok=True)
    yield job_run_dir(RUN_DIR)
    shutil.rmtree(RUN_DIR, ignore_errors=True)


def test_the_job_view_groups_ranks_by_node_and_names_the_straggler_and_the_hot_rank(tmp_path):
    d = job_run_dir(tmp_path / "run")
    doc = read_plan_document(d / "plan.json")
    view = job_view(doc, read_metrics(d / "metrics.jsonl")[-1])
    assert [n.node for n in view.nodes] == list(range(NODES))
    assert all([c.rank for c in n.cells] == list(range(n.node * PER_NODE, (n.node + 1) * PER_NODE)) for n in view.nodes)
    assert view.nodes[3].host == "gpu-node-03"
    slow = [c.rank for c in view.cells if c.straggler]
    assert slow == [SLOW_RANK]                           # 0.9 s of data wait vs a 1.31 s median step
    assert f"rank {SLOW_RANK} (node {SLOW_RANK // PER_NODE}) waits" in view.stragglers_line
    hot = max(view.cells, key=lambda c: c.of_plan)
    assert hot.rank == HOT_RANK and hot.of_plan == pytest.approx(1.08, rel=1e-6)
    assert f"peak 108% of plan: rank {HOT_RANK}, node {HOT_RANK // PER_NODE}" in view.summary_line
    assert "memory imbalance" in view.imbalance_line and f"rank {HOT_RANK}" in view.imbalance_line
    assert STRAGGLER_FRACTION > 0


def test_headless_prints_the_job_summary_and_every_rank_beside_the_plan(tmp_path):
    d = job_run_dir(tmp_path / "run", nodes=2, per_node=2)
    out = io.StringIO()
    assert stream_run(Sampler(None, None, RunWatcher(d), 3600), out, once=True) == 0
    text = out.getvalue()
    assert "step 2: 4 ranks, 2 nodes" in text
    for r in range(4):
        assert f"rank {r} node {r // 2} peak allocated:" in text and "(predicted " in text


async def grid_on_screen(pilot) -> None:
    """run_before: wait for the grid, then check all 16 nodes are drawn inside the terminal with the chart."""
    app = pilot.app
    for _ in range(50):
        grid = app.screen.query_one(JobGrid)
        if grid.display and grid.view is not None:
            break
        await pilot.pause(0.1)
    await pilot.pause(0.3)
    grid = app.screen.query_one(JobGrid)
    text = grid.render().plain if hasattr(grid.render(), "plain") else str(grid.render())
    assert all(f"n{n:<3}" in text for n in range(NODES)), text
    w, h = app.size
    assert grid.region.bottom <= h and grid.region.height >= 6
    chart = app.screen.query_one("#job-chart")
    assert chart.region.height >= 5, chart.region        # the chart stays readable below the grid


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_monitor_128_gpus(snap_compare, run_128, size):
    # this machine's 8 GPUs (recorded NVML samples) keep their lines beside the grid of the whole job
    sampler = Sampler(ReplaySource(NVML / "rtx4090x8_training.jsonl", loop=False), None, RunWatcher(run_128), 3600)
    assert snap_compare(create_monitor_app(run_128, sampler=sampler), terminal_size=size, run_before=grid_on_screen)


def test_telemetry_survives_the_gathered_vector_and_metrics_jsonl_and_nvml_fields_fail_alone():
    from types import SimpleNamespace as NS

    from scaletrain.engine.devices.nvml import device_reading
    from scaletrain.engine.run.metrics import RankMemory, StepMetrics

    t = RankTelemetry(node=1, local_rank=3, host="h1", gpu_utilization_pct=97.0, gpu_memory_used_bytes=70 << 30,
                      gpu_throttle_mask=0x4 | 0x40, data_wait_seconds=0.25, compute_seconds=1.5,
                      optimizer_seconds=0.125)
    assert RankTelemetry.from_vector(t.to_vector(), "h1") == t
    assert t.throttle_reasons == ("power cap", "HW thermal") and t.step_seconds == pytest.approx(1.875)
    rec = StepMetrics(step=1, total_steps=2, epoch=0.5, loss=1.0, lr=1e-4, tokens_per_second=1.0, step_seconds=1.0,
                      world_size=1, time=0.0, peak_memory=(RankMemory(0, 1, 2, 3, t),))
    assert StepMetrics.from_json(json.loads(json.dumps(rec.to_json()))).peak_memory[0].telemetry == t
    assert RankTelemetry.from_json({"node": "x", "gpu_power_w": float("nan"), "host": 5}) == RankTelemetry()

    class Nvml:                                   # utilization and power answer; the rest raise (N/A each)
        def nvmlDeviceGetUtilizationRates(self, h):
            return NS(gpu=55)

        def nvmlDeviceGetPowerUsage(self, h):
            return 300_000

        def __getattr__(self, name):
            def refuse(*a):
                raise RuntimeError("Not Supported")
            return refuse

    assert device_reading(Nvml(), 0) == {"gpu_utilization_pct": 55.0, "gpu_power_w": 300.0}


def test_the_doctor_scales_memory_remedies_by_the_peaks_the_run_measured():
    """Ranks that peaked at 120 % of the predicted allocated peak before rank 3 ran out: every memory remedy's
    allocated part is scaled ×1.2 (a remedy that barely fit may no longer), the peers are named, never scaled down."""
    from scaletrain.engine.doctor.diagnosis import diagnose
    from scaletrain.engine.run.metrics import RankMemory, StepMetrics
    from scaletrain.engine.run.plan_document import PlanDocument
    from test_doctor import LOGS

    req = PlanRequest(model="Qwen/Qwen2.5-7B-Instruct", gpus="8xRTX4090", method="lora", micro_batch=4,
                      grad_accum=4, seq_len=2048)
    doc = PlanDocument.from_json(json.loads(json.dumps(make_plan(req).to_json() | {"request": req.to_json()})))
    log = [LOGS / "torch_current_oom_4090x8_r3.log"]

    def last(share: float) -> StepMetrics:
        peaks = tuple(RankMemory(r, int(doc.allocated_peak_bytes * share), None, 0) for r in range(8))
        return StepMetrics(step=5, total_steps=9, epoch=0.1, loss=1.0, lr=1e-4, tokens_per_second=1.0,
                           step_seconds=1.0, world_size=8, time=0.0, peak_memory=peaks)

    plain = diagnose(log, doc)
    hot = diagnose(log, doc, last_step=last(1.2))
    cool = diagnose(log, doc, last_step=last(0.9))
    assert (hot.rank, hot.node) == (3, 0) and hot.peers.startswith("at step 5, before rank 3 (node 0) failed")
    assert "rank 0 (node 0) at 120% of the plan" in hot.peers
    assert any("scaled ×1.20" in n for n in hot.notes)
    by_title = {r.title: r for r in plain.remedies}
    for r in hot.remedies:
        base = by_title[r.title]
        assert r.memory_scale == pytest.approx(1.2)
        extra = r.predicted_per_gpu_bytes - base.predicted_per_gpu_bytes
        assert extra == pytest.approx(0.2 * r.plan.memory.allocated_peak_bytes, abs=16)   # peaks are whole bytes
    assert [r.predicted_per_gpu_bytes for r in cool.remedies] == [r.predicted_per_gpu_bytes for r in plain.remedies]

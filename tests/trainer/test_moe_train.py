"""The bundled trainer trains mixture-of-experts models for real: tiny qwen3_moe, mixtral, gpt_oss and qwen2_moe
configs on 2 CPU ranks under DDP, DeepSpeed ZeRO-3 (each MoE block a leaf module) and FSDP (torch's FSDP2 shards),
LoRA included, each run written by the config writers from a plan and launched through accelerate
(tests/trainer/test_train_cpu.py's helpers)."""

from __future__ import annotations

import pytest

from scaletrain.engine.run.layout import RunDir
from scaletrain.engine.launch.launcher import launch
from scaletrain.engine.run.metrics import read_metrics
from scaletrain.engine.request.options import TrainOptions
from test_train_cpu import deadline_tick, write_dataset

STEPS = 8


def _run(tmp_path, model: str, strategy: str, method: str, attn: str = "sdpa", experts: str = "grouped_mm") -> RunDir:
    from scaletrain.engine.plan.planner import make_plan
    from scaletrain.engine.request.request import PlanRequest
    from scaletrain.engine.run.writers import write_run_dir

    data = write_dataset(tmp_path / "data.jsonl")
    req = PlanRequest(model=model, gpus="2xCPU", precision="fp32", strategy=strategy, method=method, lora_rank=8,
                      attn=attn, experts_impl=experts, micro_batch=2, grad_accum=1, grad_ckpt=False, offload="none", seq_len=64)
    lr = 5e-3 if method == "full" else 2e-2
    return write_run_dir(make_plan(req), req, TrainOptions(dataset=str(data), lr=lr, max_steps=STEPS,
                                                           checkpoint_every=STEPS, warmup_ratio=0.0),
                         tmp_path / "run")


@pytest.mark.slow
@pytest.mark.parametrize("model,strategy,method,attn,experts", [
    ("scaletrain/tiny-qwen3-moe", "ddp", "full", "sdpa", "eager"),
    ("scaletrain/tiny-mixtral", "zero3", "full", "sdpa", "grouped_mm"),
    ("scaletrain/tiny-gpt-oss", "zero3", "lora", "eager", "grouped_mm"),
    ("scaletrain/tiny-qwen2-moe", "fsdp", "lora", "sdpa", "grouped_mm"),
])
def test_moe_trains_on_two_cpu_ranks(tmp_path, model, strategy, method, attn, experts):
    run = _run(tmp_path, model, strategy, method, attn, experts)
    res = launch(run.path, on_tick=deadline_tick())
    log0 = run.rank_log(0).read_text()
    assert res.exit_code == 0, log0[-3000:] + run.rank_log(1).read_text()[-2000:]
    # the experts implementation the plan counted is the one transformers runs (--experts-impl)
    assert f"MoE experts implementation {experts} (planned {experts})" in log0
    series = read_metrics(run.metrics)
    assert [r.step for r in series] == list(range(1, STEPS + 1))
    assert all(r.world_size == 2 and r.loss == r.loss for r in series)
    assert series[-1].loss < series[0].loss - (0.3 if method == "full" else 0.01), [r.loss for r in series]
    if strategy == "zero3":
        # every MoE block is gathered whole (deepspeed.utils.set_z3_leaf_modules), and ZeRO-3 really shards
        assert "ZeRO-3 leaf modules (gathered whole):" in log0 and "DeepSpeed data-parallel over 2" in log0
    assert (run.checkpoints / f"step-{STEPS}" / "trainer_state.json").is_file()
    if strategy == "fsdp":
        # FSDP2 for real (torch's fully_shard per decoder block, then the root): DTensor shards, DCP checkpoints
        from test_train_cpu import assert_fsdp_sharded

        assert_fsdp_sharded(run, STEPS)

"""Reward, DPO and GRPO with TRL on 2 CPU processes: `scaletrain --preset cpu-tiny-<objective> --headless` really
trains (gloo, MULTI_CPU), writes one metrics line per optimizer step from rank 0, and saves the final model."""

from __future__ import annotations

import json

import pytest

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.run.metrics import read_metrics
from scaletrain.tui.cli.main import main

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("objective", ["reward", "dpo", "grpo"])
def test_tiny_preset_trains_on_two_cpu_processes(tmp_path, objective):
    run = tmp_path / objective
    assert main(["--preset", f"cpu-tiny-{objective}", "--headless", "--run-dir", str(run)]) == 0
    series = read_metrics(run / "metrics.jsonl")
    assert [m.step for m in series] == list(range(1, 7))
    assert all(m.world_size == 2 and m.total_steps == 6 for m in series)
    assert all(m.loss == m.loss for m in series)        # finite, logged by TRL
    log = (run / "logs" / "rank-0.log").read_text()
    assert f"({objective} with TRL" in log and "MULTI_CPU" in log and "on 2 process(es)" in log
    assert (run / "checkpoints" / "final" / "config.json").is_file()
    plan = json.loads((run / "plan.json").read_text())
    assert plan["training"]["objective"] == objective


def test_objective_rows_are_checked_in_one_line(tmp_path):
    from scaletrain.trainer.objective_run import read_rows

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "chosen": "b"}\n')
    with pytest.raises(ScaletrainError, match="lacks rejected"):
        read_rows(bad, "dpo")
    assert read_rows(bad, "grpo")[0]["prompt"] == "a"


def test_objective_rows_from_csv_parquet_and_a_folder(tmp_path):
    """--data for reward/DPO/GRPO reads what SFT's --data reads (through `datasets`), checked the same way."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from scaletrain.trainer.objective_run import read_rows

    csv = tmp_path / "pairs.csv"
    csv.write_text("prompt,chosen,rejected\nhi,hello,go away\nq,a,b\n")
    rows = read_rows(csv, "reward")
    assert [(r["chosen"], r["rejected"]) for r in rows] == [("hello", "go away"), ("a", "b")]
    folder = tmp_path / "prompts"
    folder.mkdir()
    pq.write_table(pa.table({"prompt": ["x", "y", "z"]}), folder / "train.parquet")
    assert [r["prompt"] for r in read_rows(folder, "grpo")] == ["x", "y", "z"]
    with pytest.raises(ScaletrainError, match="lacks chosen, rejected"):
        read_rows(folder, "dpo")


def test_wizard_objective_key_cycles_and_replans():
    from scaletrain.engine.plan.planner import make_plan
    from scaletrain.engine.request.request import PlanRequest
    from scaletrain.tui.wizard.state import WizardState, what_if

    from scaletrain.engine.request.options import TrainOptions

    state = WizardState(request=PlanRequest(model="Qwen/Qwen3-4B", gpus="8xRTX4090", micro_batch=2, grad_accum=8,
                                            strategy="zero3", grad_ckpt=True), train=TrainOptions())
    seen = []
    for _ in range(4):
        plan = make_plan(state.request)
        seen.append((str(plan.setup.objective), plan.memory.logits_bytes))
        state = what_if(state, plan, "objective")
    assert [o for o, _ in seen] == ["sft", "reward", "dpo", "grpo"]
    assert seen[1][1] == 0 < seen[0][1]          # a reward model has no B·S·V logits

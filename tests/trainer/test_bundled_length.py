"""The plan's length of a run on the bundled data is the trainer's: the blocks its own data code makes of it.

The wizard's first run on the CPU (tiny-phi3, 2 processes, effective batch 128, seq 2048) said "1 epoch = 7 steps
of 1,000 samples": the plan counted the demo file's rows, the trainer packed them into 31 blocks of 2048 tokens,
repeated them to one optimizer step's 128 and ran 1 step.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.options import TrainOptions, bundled_demo_dataset
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.run.run_length import known_length, run_length, with_known_length
from scaletrain.trainer import data as data_mod
from scaletrain.trainer.model import tokenizer_for
from scaletrain.trainer.train import make_schedule

# the data profile runs as a subprocess and the trainer's data code blocks the demo: over test-fast's 2.5 CPU-seconds
pytestmark = pytest.mark.long


def _trainer_steps(plan, train: TrainOptions) -> tuple[int, Any]:
    """(blocks of the data, steps per epoch) as the trainer makes them of the bundled data for this plan
    (trainer/train.py: load_blocks with one optimizer step's blocks at least, then make_schedule)."""
    s = plan.setup
    tok = tokenizer_for(s.model.name, "random-init")
    per_step = s.micro_batch * s.grad_accum * s.world_size
    natural = data_mod.load_blocks(bundled_demo_dataset(), tok, s.seq_len, packing=train.packing)
    trained = data_mod.load_blocks(bundled_demo_dataset(), tok, s.seq_len, packing=train.packing,
                                   min_blocks=per_step)
    cfg = SimpleNamespace(micro_batch=s.micro_batch, grad_accum=s.grad_accum, seq_len=s.seq_len, epochs=s.epochs,
                          train=train)
    return len(natural), make_schedule(cfg, len(trained), s.world_size)


@pytest.mark.parametrize("model,gpus,batch,seq,packing", [
    ("scaletrain/tiny-phi3", "2xCPU", 128, 2048, True),     # the walk: 31 blocks, repeated to one step
    ("tiny-llama", "1xCPU", 8, 256, True),                  # more blocks than a step: several steps
    ("tiny-llama", "2xCPU", 16, 64, False),                  # padded: a block per row
])
def test_the_plan_counts_the_blocks_the_trainer_makes_of_the_bundled_data(model, gpus, batch, seq, packing):
    train = TrainOptions(packing=packing)
    req = PlanRequest(model=model, gpus=gpus, effective_batch=batch, seq_len=seq)
    plan = make_plan(with_known_length(req, train))
    blocks, schedule = _trainer_steps(plan, train)
    assert known_length(req, train).samples == blocks
    length = run_length(plan, train)
    assert length.steps == schedule.total_steps, known_length(req, train).source
    assert length.warmup_steps == schedule.warmup_steps
    # the walk's run: one step, the LR warmup's first, at lr 0 (trainer/schedules.py)
    assert ("at lr 0" in length.text()) == (schedule.total_steps == 1 and schedule.warmup_steps >= 1)
    if blocks < batch:
        assert "repeated by the trainer" in known_length(req, train).source


def test_a_real_tokenizer_is_not_fetched_to_count_the_demo_and_the_plan_says_it_counts_rows():
    known = known_length(PlanRequest(model="Qwen/Qwen3-4B", gpus="1xH100-SXM"), TrainOptions())
    assert known.samples == 1000 and "counted one sample each" in known.source


@pytest.mark.parametrize("eval_fraction", [0.0, 0.1])
def test_data_typed_in_the_wizard_is_counted_as_plan_data_counts_it(tmp_path, eval_fraction):
    """The wizard's data field counted rows where `scaletrain --data` counted the trainer's blocks (less the eval
    split): one engine, one number."""
    from scaletrain.engine.request.args import asked_from_args
    from scaletrain.tui.cli.parser import build_parser

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"sample {i} " + "with a few more words " * (i % 7)}) + "\n"
                            for i in range(300)))
    argv = ["--model", "tiny-llama", "--gpus", "1xCPU", "--seq-len", "128", "--data", str(data),
            "--eval-fraction", str(eval_fraction)]
    asked = asked_from_args(build_parser().parse_args(argv))
    typed = known_length(PlanRequest(model="tiny-llama", gpus="1xCPU", seq_len=128),
                         TrainOptions(dataset=str(data), eval_fraction=eval_fraction))
    assert typed.samples == asked.request().dataset_size, typed.source
    assert typed.samples < 300 and "blocks of 128 tokens" in typed.source

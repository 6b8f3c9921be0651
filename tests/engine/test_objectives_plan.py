"""Planner rules that belong to an objective: GRPO's whole groups of completions, ZeRO-3's gathered generation."""

from __future__ import annotations

import pytest

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.estimate.memory import simulate_step
from scaletrain.engine.estimate.objectives import generation_cost, objective_terms
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.request import PlanRequest
from scaletrain.tui.cli.main import main

GRPO = dict(model="Qwen/Qwen3-4B", objective="grpo", num_generations=8)


def test_grpo_effective_batch_must_hold_whole_groups(capsys):
    with pytest.raises(ScaletrainError, match="multiple of 8; 12 is not.*8 or 16"):
        make_plan(PlanRequest(gpus="1xH100", effective_batch=12, **GRPO))
    assert main(["plan", "--model", "Qwen/Qwen3-4B", "--gpus", "2xH100", "--objective", "grpo",
                 "--num-generations", "8", "--effective-batch", "20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "multiple of 8" in err[0] and "Traceback" not in err[0]


def test_grpo_without_a_target_only_picks_whole_groups():
    for gpus in ("1xH100", "2xH100", "3xH100"):
        plan = make_plan(PlanRequest(gpus=gpus, **GRPO))
        assert plan.setup.effective_batch % 8 == 0, gpus


def test_fully_fixed_grpo_split_is_checked_too():
    with pytest.raises(ScaletrainError, match="multiple of 8; 6 is not"):
        make_plan(PlanRequest(gpus="1xH100", micro_batch=2, grad_accum=3, strategy="ddp", offload="none",
                              grad_ckpt=True, **GRPO))


def test_zero3_generation_holds_the_whole_model_gathered():
    req = PlanRequest(gpus="4xH100", effective_batch=64, strategy="zero3", micro_batch=16, grad_ckpt=True,
                      offload="none", **GRPO)
    z3 = make_plan(req).setup
    gen = generation_cost(z3)
    params = z3.model.params
    assert gen.gathered_weights == 2 * params - 2 * params // 4            # bf16, this GPU's shard already held
    # the same step under ZeRO-2 (whole weights resident, nothing gathered) has no such term
    assert generation_cost(z3.with_(strategy="zero2")).gathered_weights == 0
    sim = simulate_step(z3)
    static = sim["states"].weights + sim["states"].optimizer
    assert sim["phase_peaks"]["generation"] == static + sim["states"].gradients_persistent + gen.peak
    named = objective_terms(z3, sim["head"], "generation")
    assert ("activations", "ZeRO-3 parameters gathered for generation", gen.gathered_weights) in named

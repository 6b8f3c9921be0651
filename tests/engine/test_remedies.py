"""Remedy ranking after an OOM (or for a plan that does not fit): real re-evaluations through the engine."""

from __future__ import annotations

import pytest

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.doctor.remedies import KIND_TIER, describe, rank_remedies
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.plan.planner import make_plan

GiB = 1024**3
SEED_REQ = PlanRequest(model="Qwen/Qwen3-4B", gpus="8xRTX4090", strategy="zero3", micro_batch=2, grad_accum=8,
                       grad_ckpt=True, offload="none", seq_len=2048)


@pytest.fixture(scope="module")
def seed_plan():
    return make_plan(SEED_REQ)


def _oom(plan, tried=2 * GiB, rank=3):
    return {"kind": "cuda_oom", "tried_to_allocate_bytes": tried, "rank": rank,
            "gpu_total_bytes": plan.memory.capacity_bytes}


def test_issue6_acceptance_first_two_fit_and_first_keeps_the_batch(seed_plan):
    rs = rank_remedies(seed_plan, _oom(seed_plan))
    assert len(rs) >= 2
    card = seed_plan.memory.capacity_bytes
    for r in rs[:2]:
        assert r.fits
        assert r.predicted_per_gpu_bytes <= card * (1 - seed_plan.memory.headroom_fraction)
    assert rs[0].keeps_effective_batch and rs[0].effective_batch == 128
    assert rs[0].plan.setup.effective_batch == 128


def test_observed_gap_is_charged_to_every_remedy(seed_plan):
    gap = seed_plan.memory.capacity_bytes - seed_plan.memory.total_bytes
    assert gap > 0   # the plan predicted a fit; the OOM says the real peak reached the card
    for r in rank_remedies(seed_plan, _oom(seed_plan)):
        assert r.predicted_per_gpu_bytes == r.plan.memory.total_bytes + gap
        assert r.predicted_per_gpu_bytes < seed_plan.memory.capacity_bytes   # each one lowers the need
    # without a failure the gap is zero
    for r in rank_remedies(seed_plan):
        assert r.predicted_per_gpu_bytes == r.plan.memory.total_bytes


def test_ordering_fit_then_batch_then_tier_then_speed(seed_plan):
    rs = rank_remedies(seed_plan, _oom(seed_plan))
    keys = [(not r.fits, not r.keeps_effective_batch, KIND_TIER[r.kind],
             r.predicted_step_seconds / r.effective_batch) for r in rs]
    assert keys == sorted(keys)
    kinds = {r.kind for r in rs}
    assert {"split", "offload", "sequence", "method", "gpus"} <= kinds


def test_remedy_changes_are_request_fields_that_reproduce_the_prediction(seed_plan):
    for r in rank_remedies(seed_plan, _oom(seed_plan))[:4]:
        req = SEED_REQ.with_(**r.changes)
        again = make_plan(req)
        assert again.memory.total_bytes == r.plan.memory.total_bytes, r.title
        assert again.time.step_seconds == pytest.approx(r.predicted_step_seconds), r.title
        assert again.setup.effective_batch == r.effective_batch


def test_a_plan_far_over_capacity_gets_a_combined_fix_first():
    plan = make_plan(PlanRequest(model="Qwen/Qwen3-4B", gpus="8xRTX4090", strategy="ddp", micro_batch=4,
                                 grad_accum=4, grad_ckpt=False, offload="none"))
    assert not plan.fits
    rs = rank_remedies(plan)
    assert rs[0].fits and rs[0].keeps_effective_batch
    assert len(rs[0].changes) >= 2            # no single change fixes a 4B DDP replica on 24 GB cards
    assert any(not r.fits for r in rs)        # single changes that help but are not enough stay listed, last
    assert all(r.fits for r in rs[:sum(r.fits for r in rs)])
    assert "per GPU" in describe(rs[0])


def test_bad_failure_input_is_one_line(seed_plan):
    with pytest.raises(ScaletrainError, match="cuda_oom"):
        rank_remedies(seed_plan, {"kind": "nccl_timeout"})
    with pytest.raises(ScaletrainError, match="byte count"):
        rank_remedies(seed_plan, {"kind": "cuda_oom", "tried_to_allocate_bytes": -1})

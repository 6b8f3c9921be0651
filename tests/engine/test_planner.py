"""Batch planner: the issue's done-when cases, the solver's edge cases, and a property check over random
requests (never a split off the target, never a plan that does not fit)."""

from __future__ import annotations

import json
import random

import pytest

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog.architectures import catalog_ids
from scaletrain.engine.plan.search import MAX_MICRO_BATCH_WITHOUT_TARGET, TIE_TOLERANCE, search
from scaletrain.engine.plan.tables import batch_table, with_tables
from scaletrain.engine.request.request import PlanRequest, base_setup
from scaletrain.engine.plan.planner import make_plan
from scaletrain.tui.cli.main import main

QWEN3_4B = "Qwen/Qwen3-4B"


def _plan_json(capsys, *args) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _split_ok(plan, target: int) -> bool:
    s = plan.setup
    return s.micro_batch * s.grad_accum * s.world_size == target == s.effective_batch


# ---- done-when --------------------------------------------------------------------------------------------------
def test_qwen3_4b_8x4090_target_128(capsys):
    # the seed's 1257 steps are HF Trainer's count (it keeps the last partial step); the bundled trainer drops it
    ours = _plan_json(capsys, "--model", QWEN3_4B, "--gpus", "8xRTX4090", "--effective-batch", "128",
                      "--seq-len", "2048", "--dataset-size", "160791")
    assert ours["time"]["steps_per_epoch"] == 160791 // 128 == 1256
    out = _plan_json(capsys, "--model", QWEN3_4B, "--gpus", "8xRTX4090", "--effective-batch", "128",
                     "--seq-len", "2048", "--dataset-size", "160791", "--loop", "hf-trainer")
    b = out["batch"]
    assert b["micro_batch"] * b["grad_accum"] * 8 == 128 == b["effective_batch"]
    assert out["memory"]["fits"] is True
    assert out["memory"]["per_gpu_bytes"]["total"] <= out["memory"]["usable_bytes"]
    assert out["time"]["steps_per_epoch"] == 1257
    assert out["time"]["epoch_seconds"] == pytest.approx(1257 * out["time"]["step_seconds"])
    assert out["time"]["assumptions"]
    assert out["explanation"].count(".") >= 1 and "because" in out["explanation"]
    assert out["planner"]["target_effective_batch"] == 128 and out["planner"]["fitting"] >= 1
    # the text view prints the epoch time with its assumptions
    assert main(["plan", "--model", QWEN3_4B, "--gpus", "8xRTX4090", "--effective-batch", "128",
                 "--dataset-size", "160791"]) == 0
    text = capsys.readouterr().out
    assert "/epoch" in text and "assumes:" in text and "because" in text


def test_16x4090_target_256_gives_629_steps(capsys):
    out = _plan_json(capsys, "--model", QWEN3_4B, "--gpus", "2x8xRTX4090", "--effective-batch", "256",
                     "--seq-len", "2048", "--dataset-size", "160791", "--loop", "hf-trainer")   # HF Trainer's count
    b = out["batch"]
    assert b["world_size"] == 16 and b["micro_batch"] * b["grad_accum"] * 16 == 256
    assert out["memory"]["fits"] is True
    assert out["time"]["steps_per_epoch"] == 629
    assert "inter-node" in " ".join(out["time"]["assumptions"]) or out["time"]["bus_bandwidth_bytes_per_second"] > 0


def test_qwen25_7b_lora_4xh200_micro16_target128_gives_accum_2(capsys):
    out = _plan_json(capsys, "--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora", "--gpus", "4xH200",
                     "--micro-batch", "16", "--effective-batch", "128")
    assert out["batch"]["micro_batch"] == 16 and out["batch"]["grad_accum"] == 2
    assert out["memory"]["fits"] is True
    assert out["planner"]["fixed"] == {"micro_batch": 16}


# ---- edge cases: one clear line each --------------------------------------------------------------------------
@pytest.mark.parametrize("argv,needles", [
    (["--gpus", "8xRTX4090", "--effective-batch", "127"], ["127 is prime", "nearest reachable: 120 or 128"]),
    (["--gpus", "8xRTX4090", "--effective-batch", "4"], ["below the GPU count 8", "smallest reachable", "is 8"]),
    (["--gpus", "8xRTX4090", "--effective-batch", "100"], ["not a multiple of 8 GPUs", "96 or 104"]),
    (["--gpus", "8xRTX4090", "--effective-batch", "128", "--micro-batch", "3"], ["micro batch 3", "120 or 144"]),
    (["--gpus", "8xRTX4090", "--effective-batch", "128", "--grad-accum", "3"], ["grad accum 3", "120 or 144"]),
    (["--gpus", "8xRTX4090", "--effective-batch", "128", "--strategy", "ddp"],
     ["nothing fits", "DDP", "drop --strategy ddp"]),
    (["--gpus", "8xRTX4090", "--effective-batch", "16", "--base-lr", "1e-4"], ["--base-batch"]),
    (["--gpus", "8xRTX4090", "--effective-batch", "128", "--micro-batch", "16"],
     ["micro batch 16 × accum 1 does not fit", "does fit as micro", "drop --micro-batch"]),
    (["--gpus", "8xRTX4090", "--effective-batch", "128", "--grad-accum", "1"],
     ["does not fit", "drop --grad-accum", "keep --grad-accum 1 at effective batch"]),
])
def test_unreachable_or_unfit_targets_are_one_line(capsys, argv, needles):
    assert main(["plan", "--model", QWEN3_4B, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    for n in needles:
        assert n in err, (n, err)


def test_nothing_fits_names_the_leanest_option(capsys):
    assert main(["plan", "--model", "meta-llama/Llama-3.1-70B", "--gpus", "2xRTX4090", "--effective-batch",
                 "64", "--offload", "none"]) == 2
    err = capsys.readouterr().err
    assert "nothing fits on 2xRTX4090 at effective batch 64" in err
    assert "needs" in err and "more GPUs" in err and err.count("\n") == 1


def test_full_offload_keeps_only_buckets_on_the_gpu_and_says_what_the_host_needs():
    """ZeRO-3 with everything offloaded: DeepSpeed moves each reduced gradient partition to pinned host memory as
    backward produces it, so the GPU holds the gathers, the reduce bucket and the activations; the host holds the
    rest, and the plan says how much."""
    plan = make_plan(PlanRequest(model="meta-llama/Llama-3.1-70B", gpus="2xRTX4090", effective_batch=64))
    s, m = plan.setup, plan.memory
    assert (s.strategy, s.offload) == ("zero3", "all") and plan.fits
    P = s.model.params
    assert m.host_bytes_per_gpu >= (16 * P) // 2          # fp32 master + Adam + fp32 gradients, over 2 GPUs
    assert m.weights_bytes == m.optimizer_bytes == 0


def test_prime_target_on_one_gpu_is_solved_exactly():
    plan = make_plan(PlanRequest(model="scaletrain/tiny-qwen3", gpus="1xRTX4090", effective_batch=13, seq_len=128))
    assert _split_ok(plan, 13)
    assert plan.setup.micro_batch in (1, 13) and plan.fits


def test_target_equal_to_gpu_count():
    plan = make_plan(PlanRequest(model="scaletrain/tiny-llama", gpus="8xH100", effective_batch=8, seq_len=256))
    assert (plan.setup.micro_batch, plan.setup.grad_accum) == (1, 1)


# ---- honouring what the user fixed --------------------------------------------------------------------------
def test_fixed_fields_are_kept_and_the_rest_is_chosen():
    req = PlanRequest(model=QWEN3_4B, gpus="8xRTX4090", effective_batch=128, strategy="zero3", grad_ckpt=True)
    plan = make_plan(req)
    assert plan.setup.strategy == "zero3" and plan.setup.grad_ckpt is True and _split_ok(plan, 128)
    assert "as requested" in plan.explanation
    # micro batch and accumulation fixed, strategy free: the planner still chooses a strategy that fits
    plan = make_plan(PlanRequest(model=QWEN3_4B, gpus="8xRTX4090", micro_batch=2, grad_accum=8))
    assert (plan.setup.micro_batch, plan.setup.grad_accum) == (2, 8)
    assert plan.setup.strategy != "ddp" and plan.fits          # 4B full cannot be replicated on 24 GB cards
    # a fixed offload with a free strategy searches the strategies that support it
    plan = make_plan(PlanRequest(model=QWEN3_4B, gpus="8xRTX4090", effective_batch=64, offload="optimizer"))
    assert plan.setup.offload == "optimizer" and plan.setup.strategy in ("zero1", "zero2", "zero3", "fsdp")


def test_without_target_the_largest_fitting_micro_batch_is_chosen():
    req = PlanRequest(model=QWEN3_4B, gpus="8xRTX4090", strategy="zero3", grad_ckpt=True, offload="none")
    plan = make_plan(req)
    s = plan.setup
    assert plan.fits and s.grad_accum == 1 and 1 <= s.micro_batch <= MAX_MICRO_BATCH_WITHOUT_TARGET
    assert "no --effective-batch" in plan.explanation
    if s.micro_batch < MAX_MICRO_BATCH_WITHOUT_TARGET:
        bigger = make_plan(PlanRequest(model=QWEN3_4B, gpus="8xRTX4090", strategy="zero3", grad_ckpt=True,
                                       offload="none", micro_batch=s.micro_batch + 1, grad_accum=1))
        assert not bigger.fits


def test_planner_picks_the_fastest_fitting_candidate():
    base = base_setup(PlanRequest(model=QWEN3_4B, gpus="8xRTX4090"))
    res = search(base, target=128, fixed={}, headroom=0.10)
    assert len(res.ranked) >= 2
    best = res.ranked[0]
    for c in res.ranked:
        assert c.fits and c.setup.effective_batch == 128
        assert best.seconds_per_sample <= c.seconds_per_sample * (1 + TIE_TOLERANCE)


# ---- property: random requests ---------------------------------------------------------------------------------
@pytest.mark.long
def test_random_requests_never_break_the_target_or_the_fit():
    rng = random.Random(20240611)
    models = catalog_ids()
    gpus = ["1xRTX4090", "2xRTX4090", "8xRTX4090", "4xH200", "8xH100", "2x8xH100", "3xA100-40GB", "6xL40S",
            "1xL4", "2x4xA6000"]
    solved = refused = 0
    for _ in range(60):
        target = rng.choice([None, rng.randint(1, 600), 2 ** rng.randint(0, 9)])
        req = PlanRequest(
            model=rng.choice(models), gpus=rng.choice(gpus), method=rng.choice(["full", "lora", "qlora"]),
            effective_batch=target, seq_len=rng.choice([128, 512, 2048, 4096]),
            micro_batch=rng.choice([None, None, None, 1, 2, 4]),
            strategy=rng.choice([None, None, None, "zero3", "ddp"]),
            grad_ckpt=rng.choice([None, None, True, False]))
        try:
            plan = make_plan(req)
        except ScaletrainError as e:
            msg = str(e)
            assert "\n" not in msg and msg
            refused += 1
            continue
        solved += 1
        s = plan.setup
        assert plan.fits, (req, plan.memory.total_bytes, plan.memory.usable_bytes)
        assert plan.memory.total_bytes <= plan.memory.usable_bytes
        assert s.micro_batch * s.grad_accum * s.world_size == s.effective_batch
        if target is not None:
            assert s.effective_batch == target, req
        for field in ("micro_batch", "strategy", "grad_ckpt"):
            if getattr(req, field) is not None:
                assert getattr(s, field) == getattr(req, field)
    assert solved >= 20 and refused >= 1


# ---- alternatives and tables ---------------------------------------------------------------------------------
def test_alternatives_and_batch_table_in_json(capsys):
    out = _plan_json(capsys, "--model", QWEN3_4B, "--gpus", "8xRTX4090", "--effective-batch", "128",
                     "--alternatives", "--table", "batch")
    alts = out["alternatives"]
    assert 1 <= len(alts) <= 5 and alts[0]["chosen"] is True
    for a in alts:
        assert a["fits"] and a["micro_batch"] * a["grad_accum"] * a["world_size"] == 128
        assert a["per_gpu_bytes"] <= a["usable_bytes"]
        assert a["step_seconds"] >= alts[0]["step_seconds"] * (1 - TIE_TOLERANCE)
    rows = out["table"]["rows"]
    assert out["table"]["kind"] == "batch"
    micros = [r["micro_batch"] for r in rows]
    assert micros == sorted(micros) and micros[0] == 1
    assert [r["per_gpu_bytes"] for r in rows] == sorted(r["per_gpu_bytes"] for r in rows)
    assert any(r["current"] for r in rows) and not rows[-1]["fits"]
    for r in rows:
        assert r["fits"] == (r["per_gpu_bytes"] <= r["usable_bytes"])


def test_fully_fixed_plan_still_gets_alternatives():
    plan = make_plan(PlanRequest(model=QWEN3_4B, gpus="8xRTX4090", strategy="zero3", micro_batch=2, grad_accum=8,
                                 grad_ckpt=True, offload="none"))
    alts = with_tables(plan, alternatives=True).alternatives
    assert alts and all(a.effective_batch == 128 for a in alts)
    assert {(a.strategy, a.offload) for a in alts} != {("zero3", "none")}   # it compares other setups


@pytest.mark.long
def test_gpus_table_rows(capsys):
    out = _plan_json(capsys, "--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora", "--gpus", "4xH200",
                     "--effective-batch", "64", "--table", "gpus")
    rows = out["table"]["rows"]
    by = {(r["gpu"], r["world_size"]): r for r in rows}
    assert by[("V100", 1)]["fits"] is False and "bf16" in by[("V100", 1)]["reason"]
    h200 = by[("H200", 4)]
    assert h200["fits"] and h200["micro_batch"] * h200["grad_accum"] * 4 == 64
    assert by[("H200", 16)]["nodes"] == 2
    for r in rows:
        if r["fits"]:
            assert r["per_gpu_bytes"] <= r["usable_bytes"]


def test_batch_table_keeps_the_effective_batch_where_it_divides():
    plan = make_plan(PlanRequest(model="scaletrain/tiny-qwen2", gpus="2xL4", effective_batch=24, seq_len=256))
    for r in batch_table(plan):
        if 12 % r.micro_batch == 0:
            assert r.keeps_effective_batch and r.effective_batch == 24


def test_rich_tables_render(capsys):
    assert main(["plan", "--model", QWEN3_4B, "--gpus", "8xRTX4090", "--effective-batch", "128",
                 "--alternatives", "--table", "batch"]) == 0
    out = capsys.readouterr().out
    assert "alternatives at effective batch 128" in out and "micro batch vs per-GPU memory" in out


# ---- learning rate --------------------------------------------------------------------------------------------
def test_lr_suggestion_shows_both_rules(capsys):
    # seed 003: 2e-4 at batch 8, moved to effective batch 128
    out = _plan_json(capsys, "--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora", "--gpus", "4xH200",
                     "--micro-batch", "16", "--effective-batch", "128", "--base-lr", "2e-4", "--base-batch", "8")
    lr = out["lr"]
    assert lr["batch_ratio"] == 16
    assert lr["sqrt_rule_lr"] == pytest.approx(8e-4)
    assert lr["linear_rule_lr"] == pytest.approx(3.2e-3)
    assert any("square-root rule" in n and "linear rule" in n for n in out["notes"])

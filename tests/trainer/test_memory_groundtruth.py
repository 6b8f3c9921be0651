"""The memory model against torch.profiler on real HF models (CPU): the issue's acceptance bar.

Each case builds the architecture from its config, runs a warm-up step, profiles one AdamW step, and compares
the measured allocated peak with the engine's `total - overhead`. Parameter, trainable and model-state bytes
must match the real tensors exactly. bench/cpu_groundtruth.py runs the full table for docs/accuracy.md.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from cpu_groundtruth import QUICK, run_case  # noqa: E402

pytestmark = pytest.mark.heavy          # real models' optimizer steps under torch.profiler


@pytest.fixture(scope="module")
def rows():
    return [run_case(c) for c in QUICK]


def test_covers_six_architectures_and_variants(rows):
    assert len({r["model"] for r in rows}) >= 6 or len(rows) >= 6
    assert {r["method"] for r in rows} == {"full", "lora", "qlora"}
    assert {r["attn"] for r in rows} == {"eager", "sdpa"}
    assert {r["grad_ckpt"] for r in rows} == {True, False}
    assert {r["precision"] for r in rows} == {"fp32", "bf16"}
    assert len({r["model"].split("-")[-1] for r in rows}) >= 5  # llama, qwen2, qwen3, gemma3, olmo2


def test_parameter_and_state_bytes_exact(rows):
    for r in rows:
        # NF4 weights are packed uint8 parameters with their scales outside the parameter list: QLoRA rows compare
        # the adapters and optimizer states exactly (the packed base is in the peak)
        keys = ("trainable", "optimizer_bytes") if r["method"] == "qlora" else (
            "params", "trainable", "weights_bytes", "optimizer_bytes")
        for k in keys:
            assert r[f"{k}_predicted"] == r[f"{k}_measured"], (r["case"], k)


def test_peak_within_bounds(rows):
    errors = [abs(r["error"]) for r in rows]
    table = "\n".join(f"{r['case']}: {100 * r['error']:+.1f}%" for r in rows)
    assert statistics.median(errors) <= 0.10, table
    assert max(errors) <= 0.20, table


def test_peaks_never_under_by_more_than_3pct(rows):
    """A plan under the measured peak OOMs: every row (LoRA on a bf16 base with checkpointing included, whose
    recompute at down_proj was once 11 % under) is at most 3 % below the profiler."""
    table = "\n".join(f"{r['case']}: {100 * r['error']:+.1f}%" for r in rows)
    assert min(r["error"] for r in rows) >= -0.03, table


def test_moe_peaks_err_on_the_safe_side(rows):
    """MoE rows (issue 19): within 3 % median and 8 % max of the profiler, never under it by more than 3 %."""
    moe = [r for r in rows if "experts=" in r["case"]]
    assert len(moe) >= 4
    table = "\n".join(f"{r['case']}: {100 * r['error']:+.1f}%" for r in moe)
    assert statistics.median(abs(r["error"]) for r in moe) <= 0.03, table
    assert max(abs(r["error"]) for r in moe) <= 0.08, table
    assert min(r["error"] for r in moe) >= -0.03, table


def test_each_loop_kind_and_the_chunked_loss_within_3pct(rows):
    """Issue 21: with the matching --loop (accelerate-loop holding its outputs, hf-trainer, trl, LoRA on a bf16 base
    without autocast) and with --loss chunked, the prediction is within 3 % of the profiler either way."""
    picked = [r for r in rows if "loop=" in r["case"] or "loss=chunked" in r["case"] or "no autocast" in r["case"]]
    kinds = {k for r in picked for k in ("accelerate-loop", "hf-trainer", "trl", "loss=chunked", "no autocast")
             if k in r["case"]}
    assert kinds == {"accelerate-loop", "hf-trainer", "trl", "loss=chunked", "no autocast"}, kinds
    table = "\n".join(f"{r['case']}: {100 * r['error']:+.1f}%" for r in picked)
    assert max(abs(r["error"]) for r in picked) <= 0.03, table


def test_every_loop_kind_under_autocast_within_1pct_where_the_logits_matter():
    """Issue 28: fp32 weights + bf16 autocast at a 32k vocabulary (the B·S·V logits are most of the peak), each loop
    kind with checkpointing on and off among them: within 1 % of the profiler. What a loop keeps of the logits is
    counted in the dtype it keeps (accelerate-loop: the fp32 copy accelerate's convert_outputs_to_fp32 makes; TRL: its
    fused head's bf16 casts of the fp32 head weight and hidden rows, in forward and in backward)."""
    from cpu_groundtruth import AMP_LOOP_QUICK

    picked = [run_case(c) for c in AMP_LOOP_QUICK]
    assert {r["loop"] for r in picked} == {"trainer", "accelerate-loop", "hf-trainer", "trl"}
    assert {r["grad_ckpt"] for r in picked} == {True, False}
    table = "\n".join(f"{r['case']}: {100 * r['error']:+.2f}%" for r in picked)
    assert max(abs(r["error"]) for r in picked) <= 0.01, table


def test_fsdp_rows_on_two_gloo_ranks_within_3pct():
    """Issue 29: FSDP2 as the trainer applies it (fully_shard per decoder block, then the root) on 2 gloo ranks, full
    fine-tuning and LoRA with checkpointing (tiny llama, vocabulary-dominated), each rank's profiler peak against
    the plan's per-GPU peak for --strategy fsdp on 2 GPUs: within 3 %; the parameters are DTensor shards whose bytes
    (and AdamW's) are half the model's, exactly as the plan says."""
    from cpu_groundtruth import FSDP_QUICK, run_cases

    picked = run_cases(FSDP_QUICK)
    assert {r["grad_ckpt"] for r in picked} == {True, False} and {r["ranks"] for r in picked} == {2}
    assert {r["method"] for r in picked} == {"full", "lora"}
    table = "\n".join(f"{r['case']}: {100 * r['error']:+.2f}% (ranks {r['ranks_peak_bytes']})" for r in picked)
    for r in picked:
        for k in ("params", "trainable", "weights_bytes", "optimizer_bytes"):
            assert r[f"{k}_predicted"] == r[f"{k}_measured"], (r["case"], k)
    full = next(r for r in picked if r["method"] == "full")
    assert full["weights_bytes_measured"] * 2 == full["params_measured"] * 4      # fp32 weights, half on each rank
    assert max(abs(r["error"]) for r in picked) <= 0.03, table

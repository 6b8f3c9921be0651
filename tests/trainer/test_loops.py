"""The loop the plan's numbers are for (issue 21): what each loop keeps, LoRA on a bf16 base without autocast, and the
refusals. The whole steps against torch.profiler are the QUICK rows of test_memory_groundtruth.py (every loop kind)
and bench/cpu_groundtruth.py's LOOP_CASES; test_memory_saved.py holds PEFT's fp32 input casts to the byte."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from scaletrain.engine.catalog.architectures import arch_from_config, catalog_entry
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.estimate.memory import estimate_memory, simulate_step
from scaletrain.engine.estimate.numerics import load_dtype, numerics
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.vocabulary import Precision, Strategy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def _setup(**kw) -> TrainingSetup:
    cfg = dict(catalog_entry("scaletrain/tiny-llama")["config"])
    base = dict(model=arch_from_config(cfg, "scaletrain/tiny-llama"), hardware=parse_gpus("1xCPU"), strategy="ddp",
                precision="fp32", micro_batch=2, seq_len=256, device="cpu")
    return TrainingSetup(**{**base, **kw})


@pytest.mark.parametrize("kw,per_element", [
    ({}, 4),                                                     # fp32 logits
    ({"precision": "bf16"}, 4),                                  # accelerate's autocast converts outputs to fp32
    ({"precision": "bf16", "grad_ckpt": True}, 4),
    ({"precision": "bf16", "master_weights": "bf16"}, 2),        # bf16 weights, no autocast: bf16 logits
    ({"method": "lora", "precision": "bf16", "master_weights": "bf16"}, 2),
])
def test_accelerate_loop_holds_the_logits_at_every_moment(kw, per_element):
    s = _setup(**kw)
    held = per_element * s.micro_batch * s.seq_len * s.model.vocab_size
    trainer = simulate_step(s)["phase_peaks"]
    loop = simulate_step(s.with_(loop="accelerate-loop"))["phase_peaks"]
    assert {k: loop[k] - trainer[k] for k in trainer if trainer[k]} == {k: held for k in trainer if trainer[k]}
    mem = estimate_memory(s.with_(loop="accelerate-loop"))
    assert ("logits", "outputs held by the loop (accelerate-loop: B·S·V logits through backward and the step)",
            held) in mem.terms


def test_hf_trainer_keeps_what_the_bundled_trainer_keeps_and_trl_has_no_vocabulary_logits():
    s = _setup(precision="bf16")
    assert estimate_memory(s.with_(loop="hf-trainer")).allocated_peak_bytes == estimate_memory(s).allocated_peak_bytes
    trl = s.with_(loop="trl")
    assert trl.fused_lm_head and not s.fused_lm_head
    assert any("TRL SFTTrainer's fused LM head" in t for _, t, _ in estimate_memory(trl).terms)


def test_lora_bf16_master_is_a_bf16_base_without_autocast():
    s = _setup(method="lora", precision="bf16", master_weights="bf16")
    nm = numerics(s)
    assert (nm.autocast, nm.compute, nm.residual, nm.frozen, nm.adapter) == (False, 2, 2, 2, 4)
    assert load_dtype("lora", 16, "bf16", Strategy.DDP, Precision.BF16) == "bfloat16"
    assert s.precision_label == "bf16 base, no autocast (fp32 adapters)"


@pytest.mark.parametrize("kw,needle", [
    ({"objective": "dpo", "ref_model": "same", "prompt_len": 128, "loop": "accelerate-loop"},
     "--loop accelerate-loop applies to sft"),
    ({"objective": "reward", "loop": "hf-trainer"}, "--loop hf-trainer applies to sft"),
    ({"method": "qlora", "precision": "bf16", "master_weights": "bf16"}, "not a base of 4 bits"),
    ({"method": "lora", "base_bits": 32, "precision": "bf16", "master_weights": "bf16"}, "not a base of 32 bits"),
    ({"loop": "while-true"}, "--loop 'while-true' is not accepted"),
])
def test_refusals_are_one_line(kw, needle):
    with pytest.raises(ScaletrainError) as e:
        _setup(**kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_user_script_is_planned_on_the_safe_side_unless_the_loop_is_asked():
    from types import SimpleNamespace

    from scaletrain.engine.request.args import asked_from_args

    def asked(*overrides: str, **kw):
        return asked_from_args(SimpleNamespace(preset="cpu-tiny", set=list(overrides), **kw))

    assert "loop" not in asked().fields
    assert asked("train.script=train.py").fields["loop"] == "accelerate-loop"
    assert asked("train.script=train.py", loop="trainer").fields["loop"] == "trainer"


def test_launch_with_a_script_says_which_loop_the_numbers_are_for():
    from types import SimpleNamespace

    from scaletrain.engine.launch.launcher import loop_notes
    from scaletrain.engine.request.options import TrainOptions

    def doc(loop, objective="sft"):
        return SimpleNamespace(training=SimpleNamespace(loop=loop), recorded=lambda name: objective)

    assert loop_notes(doc("trainer"), TrainOptions()) == ()
    assert loop_notes(doc("trl", "dpo"), TrainOptions()) == ()       # the bundled trainer runs TRL's DPOTrainer
    assert "the bundled trainer runs its own loop" in loop_notes(doc("hf-trainer"), TrainOptions())[0]
    note, = loop_notes(doc("trainer"), TrainOptions(script="/x/train.py"))
    assert "--loop accelerate-loop" in note and "train.py" in note
    assert loop_notes(doc("accelerate-loop"), TrainOptions(script="/x/train.py")) == (
        "plan.json's memory numbers are for --loop accelerate-loop",)


@pytest.mark.heavy                      # a profiled step
def test_accelerate_loop_peak_rises_by_exactly_the_held_logits_under_the_profiler():
    """A real accelerate.Accelerator loop against the bundled trainer's, same model and batch: the profiler's peak
    differs by the fp32 logits the loop's `outputs` keeps (plus its 4-byte loss and the window's one extra batch of
    int64 ids), and the engine predicts the logits."""
    from cpu_groundtruth import Case, config_for, setup_for

    from scaletrain.measure.step import measure_step

    case = Case("scaletrain/tiny-llama", micro_batch=1, seq_len=64)
    cfg = config_for(case)
    kw = dict(micro_batch=1, seq_len=64, precision="bf16", optimizer_impl="fused")
    trainer = measure_step(cfg, **kw).peak_allocated_bytes
    loop = measure_step(cfg, loop="accelerate-loop", **kw).peak_allocated_bytes
    held = 4 * 64 * cfg["vocab_size"]
    assert loop - trainer == held + 4 + 8 * 64      # + the output object's fp32 loss scalar, + one batch of ids
    s = replace(setup_for(case), precision="bf16", optimizer_impl="fused")
    assert (estimate_memory(s.with_(loop="accelerate-loop")).allocated_peak_bytes
            - estimate_memory(s).allocated_peak_bytes) == held

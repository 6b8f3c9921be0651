"""`--loss chunked` (issue 21): the trainer's chunked loss equals transformers' loss and gradients, the memory model
shrinks the logits term, refusals are one line, the planner and the doctor reach for it when the logits do not fit.
The profiler ground truth: bench/cpu_groundtruth.py's loss=chunked rows, two of them in QUICK
(tests/trainer/test_memory_groundtruth.py); a real 2-rank run: tests/trainer/test_train_cpu.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import import_when_run

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.estimate.chunked_loss import chunk_rows
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.request import PlanRequest
from scaletrain.tui.cli.main import main

_libs = import_when_run("torch")

TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256)


def _batch(vocab: int = 1000):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (2, 64), generator=g)
    labels = ids.clone()
    labels[0, :10] = -100          # a prompt
    labels[1, 50:] = -100          # padding
    return ids, labels


def _standard_and_chunked(model, ids, labels, **kw):
    from scaletrain.trainer.chunked_loss import causal_lm_loss, output_head

    params = [p for p in model.parameters() if p.requires_grad]
    ref = model(input_ids=ids, labels=labels, **kw).loss
    g_ref = torch.autograd.grad(ref, params)
    head = output_head(model)
    got = causal_lm_loss(model, {"input_ids": ids, "labels": labels}, head, **kw)
    g_got = torch.autograd.grad(got, params)
    return ref, got, g_ref, g_got


@pytest.mark.parametrize("tied", [False, True])
def test_full_fine_tuning_loss_and_gradients_equal_the_standard_loss(tied):
    from scaletrain.trainer import model as ml

    torch.manual_seed(0)
    model = ml.random_init({**TINY, "tie_word_embeddings": tied}, "sdpa")
    ids, labels = _batch()
    ref, got, g_ref, g_got = _standard_and_chunked(model, ids, labels)
    assert abs(float(ref) - float(got)) <= 1e-5
    for a, b in zip(g_ref, g_got):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    # gradient accumulation's num_items_in_batch: the sum over counted tokens divided by it
    n = int((labels[..., 1:] != -100).sum()) * 2
    ref2, got2, _, _ = _standard_and_chunked(model, ids, labels, num_items_in_batch=torch.tensor(n))
    assert abs(float(ref2) - float(got2)) <= 1e-5 and abs(float(ref2) - float(ref) / 2) <= 1e-5


def test_an_output_head_with_a_bias_trains_with_its_bias_gradient():
    """phi's lm_head has a bias (nn.Linear(h, V, bias=True)): the chunked loss adds it to each chunk's logits and
    gives it the gradient transformers' loss gives it (the head was refused before: phi-2 planned, then failed)."""
    from scaletrain.trainer import model as ml

    torch.manual_seed(0)
    model = ml.random_init({"model_type": "phi", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 256}, "sdpa")
    head = model.get_output_embeddings()
    assert head.bias is not None and head.bias.requires_grad
    with torch.no_grad():
        head.bias.normal_()          # a bias that moves the loss (random init leaves it zero)
    ids, labels = _batch()
    ref, got, g_ref, g_got = _standard_and_chunked(model, ids, labels)
    assert abs(float(ref) - float(got)) <= 1e-5
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    for name, a, b in zip(names, g_ref, g_got):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), name
    assert float(g_got[names.index("lm_head.bias")].abs().sum()) > 0


def test_lora_loss_and_adapter_gradients_equal_and_the_frozen_head_gets_none():
    from scaletrain.trainer import model as ml

    torch.manual_seed(0)
    model = ml.add_lora(ml.random_init(TINY, "sdpa"), rank=4, alpha=8, dropout=0.0,
                        targets=["q_proj", "v_proj", "down_proj"], quantized=False, grad_ckpt=False)
    ids, labels = _batch()
    ref, got, g_ref, g_got = _standard_and_chunked(model, ids, labels)
    assert abs(float(ref) - float(got)) <= 1e-5
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(g_ref, g_got))
    from scaletrain.trainer.chunked_loss import output_head
    assert not output_head(model).weight.requires_grad


def test_bf16_compute_matches_autocast_standard_loss():
    from scaletrain.trainer import model as ml
    from scaletrain.trainer.chunked_loss import causal_lm_loss, output_head

    torch.manual_seed(0)
    model = ml.random_init(TINY, "sdpa")
    ids, labels = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(input_ids=ids, labels=labels).loss
        got = causal_lm_loss(model, {"input_ids": ids, "labels": labels}, output_head(model), torch.bfloat16)
    assert abs(float(ref) - float(got)) <= 1e-3 * float(ref)     # the same bf16 GEMM, chunk by chunk


def test_chunk_rule_is_ligers():
    # liger: inc = ⌈V/h⌉, chunk = next_pow2(⌈N/inc⌉) — Qwen2.5-7B (V 152064, h 3584), 16 × 2048 tokens
    assert chunk_rows(16 * 2048, 152064, 3584) == 1024
    assert chunk_rows(512, 1024, 64) == 32 and chunk_rows(1, 152064, 3584) == 1


def test_plan_shows_the_logits_term_shrink_for_seed_003():
    """Seed 003 (h200x4-fast): 59.8 GB of logits at the peak with the standard loss; none with chunked."""
    from scaletrain.engine.request.presets import load_preset

    fields = load_preset("h200x4-fast").request_fields()
    std = make_plan(PlanRequest(**{**fields, "loss": "standard"}))
    ck = make_plan(PlanRequest(**{**fields, "loss": "chunked"}))
    assert std.memory.logits_bytes > 50e9 and ck.memory.logits_bytes < 1e9
    assert ck.memory.total_bytes < std.memory.total_bytes - 40e9
    assert ck.setup.loss == "chunked"
    # the wizard's what-if key `l` (standard ↔ chunked) re-plans with every other choice pinned
    from scaletrain.engine.plan.what_if import what_if_changes
    changes = what_if_changes(std, "loss")
    assert changes["loss"] == "chunked" and changes["micro_batch"] == std.setup.micro_batch


@pytest.mark.parametrize("flags,needle", [
    (["--strategy", "zero3"], "holds only this rank's shard"),
    (["--strategy", "fsdp"], "holds only this rank's shard"),
    (["--objective", "dpo", "--ref-model", "same"], "already chunks the vocabulary"),
    (["--objective", "reward"], "no vocabulary logits"),
])
def test_refusals_are_one_line(capsys, flags, needle):
    assert main(["plan", "--preset", "cpu-tiny", "--loss", "chunked", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_planner_chooses_chunked_when_the_standard_loss_fits_nowhere():
    """A 7B LoRA at 32 × 2048 tokens per GPU: the logits alone are over an H100, the chunked loss fits."""
    req = PlanRequest(model="Qwen/Qwen2.5-7B-Instruct", gpus="1xH100", method="lora", micro_batch=8, grad_accum=1,
                      seq_len=4096, strategy="ddp", offload="none", grad_ckpt=True)
    with pytest.raises(ScaletrainError):
        make_plan(PlanRequest(**{**req.__dict__, "loss": "standard", "grad_ckpt": None}))
    plan = make_plan(PlanRequest(**{**req.__dict__, "grad_ckpt": None}))
    assert plan.setup.loss == "chunked" and plan.fits and "--loss chunked because" in plan.explanation


def test_planner_says_which_offload_the_chunked_loss_spares():
    """A 14B full fine-tune on one H100 needs CPU offload either way: the standard loss's best offloads every state,
    the chunked one only the optimizer's, and the explanation says that (it said "fits without offload")."""
    plan = make_plan(PlanRequest(model="Qwen/Qwen2.5-14B-Instruct", gpus="1xH100", method="full"))
    assert plan.setup.loss == "chunked" and plan.setup.offload == "optimizer"
    assert "fits offloading only the optimizer states" in plan.explanation
    assert "without offload" not in plan.explanation and "offload all" in plan.explanation


def test_doctor_offers_chunked_first_for_an_oom_in_the_loss():
    from scaletrain.engine.doctor.remedies import rank_remedies

    req = PlanRequest(model="Qwen/Qwen2.5-7B-Instruct", gpus="4xH200", method="lora", base_bits=8, strategy="ddp",
                      offload="none", grad_ckpt=True, micro_batch=32, grad_accum=1, seq_len=2048, loss="standard")
    plan = make_plan(req)
    assert not plan.fits and plan.memory.logits_bytes > plan.memory.activations_bytes
    ranked = rank_remedies(plan, {"kind": "cuda_oom", "gpu_total_bytes": plan.memory.capacity_bytes,
                                  "tried_to_allocate_bytes": 1 << 30, "in_loss": True})
    first = ranked[0]
    assert first.changes == {"loss": "chunked"} and first.kind == "loss" and first.fits
    assert first.predicted_per_gpu_bytes < plan.memory.total_bytes / 2 and first.effective_batch == 128


def test_the_doctor_ranks_remedies_for_a_chunked_loss_run_without_the_strategies_it_cannot_run():
    """Offloading from DDP goes through ZeRO-3, where the chunked loss cannot read lm_head whole: that remedy is
    left out, not raised (the doctor stopped there with the strategy's refusal and ranked nothing)."""
    from scaletrain.engine.doctor.remedies import rank_remedies

    plan = make_plan(PlanRequest(model="Qwen/Qwen2.5-7B-Instruct", gpus="1xH100", method="full", seq_len=4096,
                                 micro_batch=8, grad_accum=1, strategy="ddp", offload="none", loss="chunked",
                                 grad_ckpt=False))
    ranked = rank_remedies(plan, {"kind": "cuda_oom", "gpu_total_bytes": plan.memory.capacity_bytes,
                                  "tried_to_allocate_bytes": 1 << 30})
    assert ranked and any(r.fits for r in ranked)
    assert all(r.changes.get("strategy") not in ("zero3", "fsdp") for r in ranked)


def test_an_oom_raised_in_the_loss_is_marked():
    from scaletrain.engine.doctor.diagnosis import diagnose

    d = diagnose([Path(__file__).parents[1] / "fixtures" / "logs" / "torch_current_oom_4090x8_r3.log"],
                 with_remedies=False)
    assert d.details.get("in_loss") is True


@pytest.mark.heavy                      # a profiled step
def test_validate_measures_with_the_plans_loss():
    from scaletrain.measure.validate import measure_cpu_memory

    plan = make_plan(PlanRequest(model="scaletrain/tiny-llama", gpus="1xCPU", precision="fp32", strategy="ddp",
                                 micro_batch=2, grad_accum=1, seq_len=128, grad_ckpt=False, offload="none",
                                 loss="chunked"))
    measured, _, _ = measure_cpu_memory(plan)
    err = plan.memory.allocated_peak_bytes / measured - 1
    assert -0.03 <= err <= 0.03


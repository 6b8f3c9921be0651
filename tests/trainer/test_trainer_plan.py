"""The bundled trainer honours the plan: weights in the dtype the memory model assumes (master_weights, LoRA/QLoRA
bases), accelerate's mixed precision off for bf16-only weights, the plan's optimizer implementation, random-init
models built on the meta device and materialised on the training device, QLoRA from random init quantized with
bitsandbytes on the CPU. The runs are real: plan.json written by the writers, 2 gloo ranks through
accelerate/torchrun, what the trainer wrote read back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scaletrain.engine.plan.plan import evaluate
from scaletrain.engine.request.request import PlanRequest, base_setup
from scaletrain.engine.launch.launcher import launch
from scaletrain.engine.run.metrics import read_metrics
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.run.writers import write_run_dir
from scaletrain.trainer.config import read_run_config

from test_train_cpu import deadline_tick

TINY = "scaletrain/tiny-qwen2"


def write_plan(tmp_path: Path, name: str = "run", *, gpus: str = "2xCPU", train: TrainOptions | None = None,
               setup_changes: dict | None = None, **request):
    """A run directory written by the writers from a fully fixed request (plus setup fields the request cannot
    name yet, e.g. master_weights)."""
    fields = dict(model=TINY, gpus=gpus, strategy="ddp", micro_batch=2, grad_accum=2, seq_len=64, grad_ckpt=False,
                  offload="none", precision="bf16")
    fields.update(request)
    req = PlanRequest(**fields)
    plan = evaluate(base_setup(req).with_(**(setup_changes or {})), headroom_fraction=req.headroom)
    return write_run_dir(plan, req, train or TrainOptions(max_steps=6, lr=5e-3), tmp_path / name,
                         random_quantized_ok=True)    # the trainer quantizes random weights on purpose here


# ---- what the plan says, as the trainer reads it -------------------------------------------------------------------
@pytest.mark.parametrize("request_fields,setup_changes,dtype,mixed", [
    ({"method": "full"}, {}, "float32", "bf16"),                                 # fp32 master under autocast
    ({"method": "full"}, {"master_weights": "bf16"}, "bfloat16", "no"),          # bf16 weights only, no autocast
    ({"method": "full", "precision": "fp32"}, {}, "float32", "no"),
    ({"method": "full", "strategy": "zero2"}, {}, "bfloat16", None),             # DeepSpeed casts to 16-bit anyway
    ({"method": "lora"}, {}, "bfloat16", "bf16"),                                # the base a pretrained load gets
    ({"method": "lora", "base_bits": 32}, {}, "float32", "bf16"),                # an fp32 base on purpose
    ({"method": "qlora"}, {}, "bfloat16", "bf16"),                               # quantized from bf16 on load
])
def test_weights_dtype_and_mixed_precision_follow_the_plan(tmp_path, request_fields, setup_changes, dtype, mixed):
    run = write_plan(tmp_path, gpus="1xH100", setup_changes=setup_changes, **request_fields)
    cfg = read_run_config(run.path)
    assert cfg.weights_dtype == dtype
    assert cfg.master_weights == setup_changes.get("master_weights", "fp32")
    assert cfg.optimizer_impl == "fused"                                          # the plan's default
    acc = yaml.safe_load(run.accelerate_config.read_text())
    assert acc.get("mixed_precision") == mixed


def test_optimizer_implementation_is_the_plans(tmp_path):
    import torch

    from scaletrain.trainer.model import make_optimizer

    model = torch.nn.Linear(8, 8)
    for impl, flags in (("fused", {"fused": True}), ("foreach", {"foreach": True}), ("for-loop", {"foreach": False})):
        for optimizer in ("adamw", "sgd"):
            run = write_plan(tmp_path, f"{impl}-{optimizer}", setup_changes={"optimizer_impl": impl},
                             optimizer=optimizer)
            cfg = read_run_config(run.path)
            opt = make_optimizer(cfg, model)
            assert {k: opt.defaults[k] for k in flags} == flags
            model(torch.randn(2, 8)).sum().backward()
            opt.step()                                                           # fused runs on the CPU too
            opt.zero_grad()


# ---- building: meta device, dtypes, quantization ------------------------------------------------------------------
@pytest.mark.parametrize("model_id", ["scaletrain/tiny-qwen2", "scaletrain/tiny-gemma3", "scaletrain/tiny-llama"])
def test_random_init_on_meta_materialises_a_complete_model(model_id):
    """Built on the meta device, materialised by to_empty and initialised by the model's own init: no parameter or
    buffer left empty, rotary/scale buffers equal to a normal build's, tied weights tied, weights at the
    config's initializer scale, in the dtype asked for."""
    import torch
    from transformers import AutoModelForCausalLM

    from scaletrain.trainer.model import hf_config, model_config_dict, random_init

    conf = hf_config(model_config_dict(model_id))
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(conf, dtype=torch.bfloat16)
    torch.manual_seed(0)
    model = random_init(conf, "sdpa", dtype="bfloat16", device="cpu")
    params = dict(model.named_parameters())
    assert params.keys() == dict(ref.named_parameters()).keys()
    assert all(p.device.type == "cpu" and p.dtype == torch.bfloat16 for p in params.values())
    for name, buf in ref.named_buffers():
        assert torch.equal(dict(model.named_buffers())[name], buf), name
    if conf.tie_word_embeddings:
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    std = conf.initializer_range
    for name, p in params.items():
        if p.ndim == 2:                        # linears and embeddings: N(0, initializer_range)
            assert abs(float(p.detach().float().std()) - std) < 0.2 * std, name
        elif "norm" in name and "weight" in name:
            # RMSNorm weights: ones (Gemma's zero-centred norms: zeros)
            assert torch.equal(p, torch.ones_like(p)) or torch.equal(p, torch.zeros_like(p)), name


def _dtypes(model, trainable: bool) -> set[str]:
    return {str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.requires_grad == trainable}


@pytest.mark.parametrize("request_fields,setup_changes,frozen,trainable", [
    ({"method": "full"}, {"master_weights": "bf16"}, set(), {"bfloat16"}),
    ({"method": "full"}, {}, set(), {"float32"}),
    ({"method": "lora"}, {}, {"bfloat16"}, {"float32"}),                        # PEFT keeps adapters in fp32
    ({"method": "lora", "base_bits": 32}, {}, {"float32"}, {"float32"}),
    # bitsandbytes packs NF4 weights into uint8; prepare_model_for_kbit_training upcasts the rest to fp32
    ({"method": "qlora"}, {}, {"uint8", "float32"}, {"float32"}),
    ({"method": "lora", "base_bits": 8}, {}, {"int8", "float32"}, {"float32"}),        # LLM.int8 base
])
def test_build_model_gives_the_planned_dtypes(tmp_path, request_fields, setup_changes, frozen, trainable):
    from scaletrain.trainer.model import build_model, check_capabilities

    run = write_plan(tmp_path, gpus="1xCPU", setup_changes=setup_changes, **request_fields)
    cfg = read_run_config(run.path)
    check_capabilities(cfg)                    # QLoRA from random init on a CPU: no longer refused
    model = build_model(cfg, "cpu")
    assert _dtypes(model, False) == frozen and _dtypes(model, True) == trainable
    if cfg.quantized_base:
        import bitsandbytes as bnb

        layer = bnb.nn.Linear4bit if cfg.base_bits == 4 else bnb.nn.Linear8bitLt
        assert any(isinstance(m, layer) for m in model.modules())


def test_adamw_8bit_steps_on_the_cpu(tmp_path):
    """bitsandbytes ≥ 0.45 runs its 8-bit AdamW on the CPU too, so the trainer no longer demands CUDA for it."""
    import torch

    from scaletrain.trainer.model import check_capabilities, make_optimizer

    run = write_plan(tmp_path, gpus="1xCPU", optimizer="adamw-8bit")
    cfg = read_run_config(run.path)
    check_capabilities(cfg)
    model = torch.nn.Linear(256, 256)                  # ≥ 4096 elements: bitsandbytes keeps 8-bit states for it
    opt = make_optimizer(cfg, model)
    before = model.weight.detach().clone()
    model(torch.randn(4, 256)).pow(2).sum().backward()
    opt.step()
    assert type(opt).__name__ == "AdamW8bit" and opt.state[model.weight]["state1"].dtype == torch.uint8
    assert not torch.equal(before, model.weight)


# ---- real 2-rank runs ------------------------------------------------------------------------------------------------
def _run(run) -> tuple[list, str]:
    res = launch(run.path, on_tick=deadline_tick())
    log = run.rank_log(0).read_text()
    assert res.exit_code == 0, log + run.rank_log(1).read_text()
    series = read_metrics(run.metrics)
    assert [r.step for r in series] == list(range(1, 7)) and all(r.world_size == 2 for r in series)
    assert all(r.loss == r.loss and 0 < r.loss < 20 for r in series)          # finite
    return series, log


@pytest.mark.slow
def test_qlora_from_random_init_trains_on_two_cpu_ranks(tmp_path):
    run = write_plan(tmp_path, method="qlora", lora_rank=8,
                     train=TrainOptions(max_steps=6, lr=5e-3, save_checkpoints=False))
    _, log = _run(run)
    assert "(qlora, ddp, bf16) on 2 process(es)" in log
    assert "frozen uint8" in log and "mixed precision bf16" in log             # a 4-bit base, trained under autocast
    assert not any(run.checkpoints.iterdir())                                 # save_checkpoints false: none at all
    assert "no checkpoints written" in log


@pytest.mark.slow
def test_bf16_master_weights_under_fsdp_shard_bf16_weights_on_two_cpu_ranks(tmp_path):
    """FSDP (torch's FSDP2, applied by the trainer) keeps the plan's bf16-only weights: no fp32 copy, no autocast,
    and the shards are bf16 DTensors."""
    run = write_plan(tmp_path, method="full", setup_changes={"master_weights": "bf16", "strategy": "fsdp"},
                     train=TrainOptions(max_steps=6, lr=5e-3, save_checkpoints=False))
    series, log = _run(run)
    assert "(full, fsdp, bf16) on 2 process(es)" in log
    from test_train_cpu import FSDP_LINE

    m = FSDP_LINE.search(log)
    assert m and m[3] == m[4], log[-3000:]
    assert "trainable bfloat16" in log and "mixed precision no" in log
    assert series[-1].loss < series[0].loss


@pytest.mark.slow
def test_bf16_master_weights_train_without_autocast_on_two_cpu_ranks(tmp_path):
    run = write_plan(tmp_path, method="full", setup_changes={"master_weights": "bf16", "optimizer_impl": "foreach"},
                     train=TrainOptions(max_steps=6, lr=5e-3, keep_checkpoints=1, checkpoint_every=2))
    series, log = _run(run)
    assert "trainable bfloat16" in log and "float32" not in log.split("weights", 1)[1].split("\n", 1)[0]
    assert "mixed precision no" in log and "adamw (foreach)" in log
    assert series[-1].loss < series[0].loss
    assert [p.name for p in run.checkpoints.iterdir()] == ["step-6"]           # keep_checkpoints 1: the newest

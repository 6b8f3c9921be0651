"""The LoRA target `experts`: every MoE block's fused gate_up_proj and down_proj through peft's target_parameters
(peft's ParamWrapper), against peft 0.21 and transformers 5.24 building the tiny MoE families.

(a) trainable counts, adapted modules and refusals; (b) what an MoE block saves for backward with its experts
adapted, byte for byte against torch's saved-tensor hooks; (c) the trainer's LoRA config carries the parameters.
"""

from __future__ import annotations

import pytest

from scaletrain.engine.catalog.architectures import BLOCK_LINEARS, arch_from_config, load_model
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.catalog.moe import EXPERT_PARAMETERS
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.estimate.activations import block_activations
from scaletrain.engine.estimate.setup import TrainingSetup
from test_moe_memory import FAMILIES, REGIMES, _config, _hf_model

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def _peft(family: str, targets: tuple[str, ...], rank: int = 4):
    """peft's model as the trainer builds it (trainer/model.py add_lora), and its trainable parameters."""
    from scaletrain.trainer.model import add_lora

    model = add_lora(_hf_model(_config(family), device="cpu"), rank=rank, alpha=2 * rank, dropout=0.0,
                     targets=list(targets), quantized=False, grad_ckpt=False)
    return model, [(n, p) for n, p in model.named_parameters() if p.requires_grad]


# ---- (a) counts -------------------------------------------------------------------------------------------------
TARGETS = [ATTN + ("experts",), ("experts",), BLOCK_LINEARS + ("experts",)]
EXTRA = {"qwen3-moe": [("gate_proj", "up_proj", "experts"), ("down_proj", "experts")],
         "mixtral": [("w1", "w3", "w2", "experts"), ("q_proj", "w2", "experts")]}


@pytest.mark.parametrize("family,targets", [(f, t) for f in FAMILIES for t in TARGETS + EXTRA.get(f, [])])
@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_experts_target_counts_match_peft(family, targets):
    """lora_A (R·E, in) and lora_B (out, R·E) per fused parameter, R = r (2r on gate_up_proj where peft also
    converted a fused pair named whole); gpt_oss's transposed experts the same, their biases frozen."""
    arch = arch_from_config(_config(family), family)
    model, trainable = _peft(family, targets)
    assert arch.lora_params(4, targets) == sum(p.numel() for _, p in trainable)
    assert 2 * arch.adapted_linears(targets) == len(trainable)
    experts = [p for n, p in trainable if ".mlp.experts." in n]
    moe_blocks = arch.num_layers - len(arch.moe.dense_layers)
    assert len(experts) == 4 * moe_blocks and sum(p.numel() for p in experts) == moe_blocks * arch.expert_lora(
        4, targets)[0]
    assert not any("bias" in n for n, _ in trainable)


def test_experts_adds_nothing_where_peft_converted_both_already():
    arch = load_model("scaletrain/tiny-qwen3-moe")
    assert arch.lora_params(8, BLOCK_LINEARS + ("experts",)) == arch.lora_params(8, BLOCK_LINEARS)
    assert arch.expert_lora(8, ("experts",))[0] < arch.expert_lora(8, BLOCK_LINEARS)[0]     # rank r, not 2r


@pytest.mark.parametrize("model,targets,needle", [
    ("scaletrain/tiny-llama", ("q_proj", "experts"), "has none"),
    ("scaletrain/tiny-llama", ("experts",), "has none"),
    ("scaletrain/tiny-qwen3-moe", ("gate_proj", "experts"), "needs up_proj too"),
    ("scaletrain/tiny-gpt-oss", ("expert",), "unknown LoRA target"),
])
def test_experts_target_refused_in_one_line(model, targets, needle):
    arch = load_model(model)
    with pytest.raises(ScaletrainError, match=needle) as e:
        arch.lora_params(8, targets)
    assert "\n" not in str(e.value)


def test_known_targets_name_the_constant():
    from scaletrain.engine.catalog.architectures import KNOWN_TARGETS
    from scaletrain.engine.catalog.moe import EXPERTS_TARGET

    assert EXPERTS_TARGET in KNOWN_TARGETS


# ---- (b) saved bytes per block ------------------------------------------------------------------------------------
LORA_REGIMES = ("lora-fp32", "lora-bf16-base", "lora-fp32-base")
# every regime × implementation on gpt_oss (transposed experts with biases), qwen2_moe's beside its shared expert, and
# qwen3_moe's experts at rank r (converted families save the same whatever the rank: test_moe_memory.py)
SAVED = ([("gpt-oss", r, impl) for r in LORA_REGIMES for impl in ("grouped_mm", "eager")
          if impl == "grouped_mm" or r != "lora-fp32"]
         + [("qwen2-moe", r, "grouped_mm") for r in LORA_REGIMES]
         + [("qwen2-moe", "lora-fp32-base", "eager"), ("qwen3-moe", "lora-fp32-base", "grouped_mm")])


@pytest.mark.parametrize("family,regime,impl", SAVED)
def test_adapted_experts_save_exactly_what_the_engine_counts(family, regime, impl):
    """peft's ParamWrapper computes W + ΔW for the experts (saved whole) and the experts keep their inputs; on
    gpt_oss the frozen biases add nothing of their own."""
    from scaletrain.measure.saved_activations import measure_saved_activation_bytes

    precision, master, base_bits, method, measured_as = REGIMES[regime]
    attn = "eager" if family == "gpt-oss" else "sdpa"
    targets = ATTN + ("experts",)
    cfg = dict(_config(family), experts_implementation=impl)
    setup = TrainingSetup(model=arch_from_config(cfg, family), hardware=parse_gpus("1xCPU"), method=method,
                          lora_rank=8, lora_targets=targets, strategy="ddp", precision=precision,
                          master_weights=master, base_bits=base_bits, attn=attn, micro_batch=2, seq_len=32,
                          device="cpu", experts_impl=impl)
    _, per_layer = measure_saved_activation_bytes(
        cfg, method=method, lora_rank=8, lora_alpha=16, lora_targets=targets, micro_batch=2, seq_len=32,
        attn=attn, precision=measured_as, device="cpu", per_layer=True)
    layer = block_activations(setup, kind="moe")
    assert per_layer["layer2"] == layer.saved + layer.weight_copies, (family, regime, impl)


# ---- (c) the trainer's LoRA config --------------------------------------------------------------------------------
def test_trainer_passes_experts_as_target_parameters():
    from scaletrain.trainer.model import lora_targets
    from scaletrain.trainer.objective_build import ObjectiveRun, peft_config

    assert lora_targets(["q_proj", "experts"]) == (["q_proj"], list(EXPERT_PARAMETERS))
    assert lora_targets(["experts"]) == ([], list(EXPERT_PARAMETERS))     # not None: peft's default targets
    assert lora_targets(["q_proj", "v_proj"]) == (["q_proj", "v_proj"], None)
    assert lora_targets("all-linear") == ("all-linear", None)
    run = ObjectiveRun(objective="dpo", model_config=_config("gpt-oss"), output_dir="/nonexistent", method="lora",
                       lora_targets=ATTN + ("experts",))
    lora = peft_config(run)
    assert set(lora.target_modules) == set(ATTN) and set(lora.target_parameters) == set(EXPERT_PARAMETERS)


def test_experts_with_lora_dropout_is_one_line():
    """peft's ParamWrapper raises on lora_dropout > 0; the trainer says so before peft does."""
    from scaletrain.trainer.model import add_lora

    with pytest.raises(ScaletrainError, match="lora_dropout 0") as e:
        add_lora(_hf_model(_config("gpt-oss"), device="cpu"), rank=4, alpha=8, dropout=0.1,
                 targets=["q_proj", "experts"], quantized=False, grad_ckpt=False)
    assert "\n" not in str(e.value)


def test_dry_run_refuses_lora_dropout_on_the_experts_in_one_line(tmp_path, capsys):
    from scaletrain.tui.cli.main import main

    base = ["--preset", "cpu-tiny", "--headless", "--dry-run", "--set", "model=scaletrain/tiny-gpt-oss", "--set",
            "method=lora", "--set", "lora_targets=q_proj,experts", "--set", "attn=eager"]
    assert main([*base, "--run-dir", str(tmp_path / "ok")]) == 0
    capsys.readouterr()
    assert main([*base, "--run-dir", str(tmp_path / "bad"), "--set", "train.lora_dropout=0.1"]) != 0
    err = capsys.readouterr().err.strip()
    assert "lora_dropout 0.1" in err and "\n" not in err

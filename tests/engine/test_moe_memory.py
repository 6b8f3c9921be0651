"""MoE families (qwen3_moe, qwen2_moe, mixtral, olmoe, gpt_oss) against transformers 5.24 and peft building them.

(a) parameter, active-parameter and LoRA trainable counts against the real modules; (b) what one MoE block saves
for backward, byte for byte against torch's saved-tensor hooks, per family × dtype regime × experts
implementation (the dense layers of qwen2_moe's mlp_only_layers too). Whole steps: test_memory_groundtruth.py.
"""

from __future__ import annotations

import pytest

from scaletrain.engine.catalog.architectures import BLOCK_LINEARS, arch_from_config, load_model
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.estimate.activations import block_activations
from scaletrain.engine.estimate.setup import TrainingSetup
from test_memory_saved import LAYERS, _config   # one copy of the tiny-config builder

FAMILIES = ("qwen3-moe", "qwen2-moe", "mixtral", "olmoe", "gpt-oss")
# (engine precision, master weights, LoRA base bits, method) → measure/step.py's regime name
REGIMES = {
    "fp32": ("fp32", "fp32", 16, "full", "fp32"),
    "autocast": ("bf16", "fp32", 16, "full", "bf16"),
    "bf16-weights": ("bf16", "bf16", 16, "full", "bf16-pure"),
    "lora-bf16-base": ("bf16", "fp32", 16, "lora", "bf16-autocast"),
    "lora-fp32-base": ("bf16", "fp32", 32, "lora", "bf16"),
    "lora-fp32": ("fp32", "fp32", 16, "lora", "fp32"),
}


def _hf_model(config: dict, device: str = "meta"):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    conf = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(conf)
    model.tie_weights()
    return model


# ---- (a) counts -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_params_and_active_params_match_transformers(family):
    cfg = _config(family)
    arch = arch_from_config(cfg, family)
    model = _hf_model(cfg)
    unique = {id(p): (n, p) for n, p in model.named_parameters()}.values()
    total = sum(p.numel() for _, p in unique)
    experts = sum(p.numel() for n, p in unique if ".mlp.experts." in n)
    assert arch.params == total
    assert arch.moe is not None and experts == sum(1 for x in range(LAYERS) if x not in arch.moe.dense_layers) \
        * arch.expert_params()
    # one token runs top_k of the E experts
    assert arch.active_params == total - experts + experts * arch.moe.top_k // arch.moe.experts
    assert arch.tensor_count == len(list(unique))
    linears = sum(mod.weight.numel() for name, mod in model.named_modules()
                  if type(mod).__name__ == "Linear" and name != "lm_head")
    assert arch.linear_weight_params() == linears        # what bitsandbytes would quantize
    assert arch.largest_gather_params == max(
        max(sum(p.numel() for p in layer.parameters()) for layer in model.model.layers), arch.embedding_params)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_config_transformers_saved_counts_its_experts(family):
    """transformers reads an expert count by either spelling (attribute_map) and saves its own: Qwen3MoeConfig in
    5.24 writes num_local_experts where the hub's Qwen3 MoE configs say num_experts, and the engine took the class
    default of 128 experts for a config saved by transformers (the sweep's qwen3_moe: 9.6 M parameters planned for
    a 0.7 M model). Both spellings, as the hub and as save_pretrained write them."""
    from transformers import AutoConfig

    cfg = _config(family)
    model_type = cfg["model_type"]
    saved = AutoConfig.for_model(model_type, **{k: v for k, v in cfg.items() if k != "model_type"}).to_dict()
    experts = saved.get("num_local_experts", saved.get("num_experts"))
    for spelled in ("num_experts", "num_local_experts"):
        written = {k: v for k, v in saved.items() if k not in ("num_experts", "num_local_experts")}
        written[spelled] = experts
        assert arch_from_config(written, family).moe.experts == experts, (family, spelled)
    assert arch_from_config(saved, family).params == arch_from_config(cfg, family).params


def test_dense_models_have_active_equal_to_params():
    m = load_model("scaletrain/tiny-llama")
    assert m.moe is None and m.active_params == m.params


TARGETS = [None, ("q_proj", "v_proj"), ("down_proj",)]
EXTRA = {"qwen2-moe": [("shared_expert_gate",), ("gate_proj", "up_proj")], "mixtral": [("w1", "w3", "w2")],
         "qwen3-moe": [("gate_proj", "up_proj", "o_proj")]}


@pytest.mark.parametrize("family,targets", [(f, t) for f in FAMILIES for t in TARGETS + EXTRA.get(f, [])
                                            if not (f in ("mixtral", "gpt-oss") and t == ("down_proj",))])
@pytest.mark.long                # over 2.5 s in test-fast's run (bench/suite_time.py)
def test_lora_counts_match_peft(family, targets):
    """peft adapts the nn.Linear targets a block has, and on qwen3_moe, olmoe and mixtral converts the expert names
    into adapters on the fused 3-D experts (rank 2r for gate_up_proj)."""
    from peft import LoraConfig, get_peft_model

    cfg = _config(family)
    arch = arch_from_config(cfg, family)
    model = _hf_model(cfg, device="cpu")
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=list(targets or BLOCK_LINEARS), lora_dropout=0.0,
                      task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, lora)
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    assert arch.lora_params(4, targets) == sum(p.numel() for p in trainable)
    assert 2 * arch.adapted_linears(targets) == len(trainable)
    frozen_linear = sum(m.weight.numel() for n, m in peft_model.named_modules()
                        if type(m).__name__ == "Linear" and n.endswith("base_layer") and "lm_head" not in n)
    assert arch.targeted_linear_params(targets) == frozen_linear


@pytest.mark.parametrize("family,targets,needle", [
    ("qwen3-moe", ("qkv_proj",), "unknown LoRA target"),
    ("qwen3-moe", ("shared_expert_gate",), "none of the LoRA targets"),
    ("qwen3-moe", ("gate_proj",), "needs up_proj too"),
    ("mixtral", ("w1",), "needs w3 too"),
    ("gpt-oss", ("gate_proj", "up_proj", "down_proj"), "none of the LoRA targets"),
])
def test_lora_targets_refused_in_one_line(family, targets, needle):
    arch = load_model(f"scaletrain/tiny-{family}")
    with pytest.raises(ScaletrainError, match=needle) as e:
        arch.lora_params(8, targets)
    assert "\n" not in str(e.value)


def test_experts_impl_is_validated_and_reported_for_moe_only():
    hw = parse_gpus("1xCPU")
    moe = TrainingSetup(model=load_model("scaletrain/tiny-qwen3-moe"), hardware=hw, device="cpu")
    assert moe.experts_impl == "grouped_mm" and moe.to_json()["experts_impl"] == "grouped_mm"
    assert "experts_impl" not in TrainingSetup(model=load_model("scaletrain/tiny-llama"), hardware=hw,
                                               device="cpu").to_json()
    with pytest.raises(ScaletrainError, match="experts-impl"):
        TrainingSetup(model=load_model("scaletrain/tiny-qwen3-moe"), hardware=hw, device="cpu", experts_impl="fast")


def test_qlora_keeps_experts_16_bit():
    """bitsandbytes quantizes nn.Linear only: the fused experts stay in the frozen base (fp32 after
    prepare_model_for_kbit_training), so QLoRA on an MoE saves little."""
    from scaletrain.engine.estimate.states import model_states

    arch = load_model("scaletrain/tiny-qwen3-moe")
    s = TrainingSetup(model=arch, hardware=parse_gpus("1xCPU"), method="qlora", device="cpu")
    lin = arch.targeted_linear_params(s.lora_targets)
    assert lin < arch.params - arch.embedding_params - arch.num_layers * arch.expert_params() + 1
    assert model_states(s).weights >= 4 * arch.num_layers * arch.expert_params()


# ---- (b) saved bytes per block ------------------------------------------------------------------------------------
CASES = [(f, r, impl) for f in FAMILIES for r in REGIMES for impl in ("grouped_mm", "eager")
         if impl == "grouped_mm" or r in ("fp32", "autocast", "lora-fp32-base", "lora-bf16-base")]


@pytest.mark.heavy                      # saved tensors of real MoE blocks, recorded
@pytest.mark.parametrize("family,regime,impl", CASES)
def test_moe_block_saves_exactly_what_the_engine_counts(family, regime, impl):
    from scaletrain.measure.saved_activations import measure_saved_activation_bytes

    precision, master, base_bits, method, measured_as = REGIMES[regime]
    attn = "eager" if family == "gpt-oss" else "sdpa"      # gpt_oss has no sdpa path in transformers 5.24
    cfg = dict(_config(family), experts_implementation=impl)
    b, s = 2, 32
    setup = TrainingSetup(model=arch_from_config(cfg, family), hardware=parse_gpus("1xCPU"), method=method,
                          lora_rank=8, lora_targets=BLOCK_LINEARS, strategy="ddp", precision=precision,
                          master_weights=master, base_bits=base_bits, attn=attn, micro_batch=b, seq_len=s,
                          device="cpu", experts_impl=impl)
    _, per_layer = measure_saved_activation_bytes(
        cfg, method=method, lora_rank=8, lora_alpha=16, lora_targets=BLOCK_LINEARS, micro_batch=b, seq_len=s,
        attn=attn, precision=measured_as, device="cpu", per_layer=True)
    layer = block_activations(setup, kind="moe")
    assert per_layer["layer2"] == layer.saved + layer.weight_copies, (family, regime, impl)
    if setup.model.moe.dense_layers:          # qwen2-moe's tiny config makes layer 1 a dense MLP
        assert 1 in setup.model.moe.dense_layers
        dense = block_activations(setup, kind="dense")
        assert per_layer["layer1"] == dense.saved + dense.weight_copies, (family, regime, impl, "dense")


@pytest.mark.heavy                      # saved tensors recorded
@pytest.mark.parametrize("family,regime", [("qwen3-moe", "fp32"), ("qwen3-moe", "autocast"), ("gpt-oss", "lora-fp32"),
                                           ("gpt-oss", "autocast")])
def test_batched_mm_counts_the_gathered_weights(family, regime):
    from scaletrain.measure.saved_activations import measure_saved_activation_bytes

    precision, master, base_bits, method, measured_as = REGIMES[regime]
    attn = "eager" if family == "gpt-oss" else "sdpa"
    cfg = dict(_config(family), experts_implementation="batched_mm")
    setup = TrainingSetup(model=arch_from_config(cfg, family), hardware=parse_gpus("1xCPU"), method=method,
                          lora_rank=8, precision=precision, master_weights=master, base_bits=base_bits, attn=attn,
                          micro_batch=2, seq_len=32, device="cpu", experts_impl="batched_mm")
    _, per_layer = measure_saved_activation_bytes(cfg, method=method, lora_rank=8, lora_targets=BLOCK_LINEARS,
                                                  micro_batch=2, seq_len=32, attn=attn, precision=measured_as,
                                                  per_layer=True)
    layer = block_activations(setup, kind="moe")
    assert per_layer["layer2"] == layer.saved + layer.weight_copies


@pytest.mark.heavy                      # saved tensors recorded
@pytest.mark.parametrize("family,precision", [("qwen3-moe", "fp32"), ("mixtral", "bf16")])
def test_router_aux_loss_saves_what_the_engine_counts(family, precision):
    """output_router_logits adds the load-balancing loss over every layer's router logits (outside the blocks)."""
    from scaletrain.engine.estimate.activations import outside_blocks
    from scaletrain.measure.saved_activations import measure_saved_activation_bytes

    measured, predicted = [], []
    for aux in (False, True):
        cfg = dict(_config(family), output_router_logits=aux)
        _, per_layer = measure_saved_activation_bytes(cfg, micro_batch=2, seq_len=32, precision=precision,
                                                      per_layer=True)
        measured.append(per_layer["post-layers"])
        setup = TrainingSetup(model=arch_from_config(cfg, family), hardware=parse_gpus("1xCPU"), precision=precision,
                              micro_batch=2, seq_len=32, device="cpu")
        predicted.append(outside_blocks(setup)["final"])
    assert measured[1] - measured[0] == predicted[1] - predicted[0] > 0


@pytest.mark.parametrize("method", ["full", "lora"])
def test_qwen3_moe_dense_layer_under_peft_conversion(method):
    """qwen3_moe's mlp_only_layers are dense MLPs; peft moves gate/up/down_proj to the experts, so under LoRA those
    dense linears stay unadapted (and their inputs unsaved)."""
    from scaletrain.measure.saved_activations import measure_saved_activation_bytes

    cfg = dict(_config("qwen3-moe"), mlp_only_layers=[1])
    setup = TrainingSetup(model=arch_from_config(cfg, "q"), hardware=parse_gpus("1xCPU"), method=method, lora_rank=8,
                          precision="fp32", micro_batch=2, seq_len=32, device="cpu")
    _, per_layer = measure_saved_activation_bytes(cfg, method=method, lora_rank=8, lora_targets=BLOCK_LINEARS,
                                                  micro_batch=2, seq_len=32, per_layer=True)
    assert per_layer["layer1"] == block_activations(setup, kind="dense").saved
    assert per_layer["layer2"] == block_activations(setup, kind="moe").saved

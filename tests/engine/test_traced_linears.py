"""A traced family's block linears are every module that computes as nn.Linear: subclasses and Conv1D included.

falcon's blocks are four `FalconLinear`s (an nn.Linear subclass whose forward is `input @ weight.T + bias`), gpt2's
four transformers `Conv1D`s (a linear whose weight is stored [in, out]). The trace once kept only modules running
nn.Linear's own forward, so both had no block linears: their plans had no block GEMMs in their time (a 7B falcon
LoRA step predicted 40 times too fast on an H100), QLoRA quantized nothing, the LoRA targets hint was empty, and a
full plan without checkpointing on a GPU failed (the largest linear of none), while peft adapted and bitsandbytes
would quantize all four. MoE routers that are nn.Linear subclasses answering a tuple stay out (no plain GEMM, no
LoRA target).
"""

from __future__ import annotations

import pytest

from scaletrain.engine.catalog import traced
from scaletrain.engine.catalog.architectures import arch_from_config
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.estimate.device_time import micro_step
from scaletrain.engine.estimate.memory import estimate_memory
from scaletrain.engine.estimate.setup import TrainingSetup

from conftest import import_when_run

_libs = import_when_run("torch", "transformers")

FALCON_LINEARS = {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}
LINEARS = {"falcon": FALCON_LINEARS, "gpt2": {"c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"}}
B, S = 2, 128


def _tiny_config(model_type: str) -> dict:
    from scaletrain.measure.tiny_configs import config_dict, shrink

    return shrink(config_dict(model_type), model_type)


def _meta_layers(config: dict) -> list:
    from scaletrain.measure.saved_activations import decoder_layers
    from scaletrain.measure.trace_layers import meta_model

    return decoder_layers(meta_model(config))


@pytest.fixture(scope="module", params=sorted(LINEARS))
def family(request, tmp_path_factory):
    """The tiny family traced into a fresh cache by measure/trace.py in this process (torch is imported anyway)."""
    from scaletrain.measure.trace import run

    mp = pytest.MonkeyPatch()
    mp.setenv("SCALETRAIN_CACHE", str(tmp_path_factory.mktemp("traces")))
    config = _tiny_config(request.param)
    regime = {"method": "full", "lora_rank": 0, "lora_targets": None, "precision": "fp32", "attn": "sdpa"}
    assert traced.prefetch(config, [regime], "test", run) == 1
    yield request.param, config, arch_from_config(config, f"tiny-{request.param}")
    mp.undo()


@pytest.mark.long                # four meta builds of transformers models
def test_a_linear_subclass_that_computes_as_one_is_a_block_linear_and_a_router_is_not():
    """Asked of transformers' own layers on the meta device: falcon's FalconLinear counts, llama4's and phimoe's
    routers (a tuple out) and deepseek_v4's grouped output projection (an input of groups) do not."""
    from scaletrain.measure.trace_layers import block_linears

    layer = _meta_layers(_tiny_config("falcon"))[0]
    found = block_linears(layer)
    assert set(found) == FALCON_LINEARS
    for name, mod in layer.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in FALCON_LINEARS:
            assert found[leaf] == [mod.in_features, mod.out_features, mod.bias is not None]
    gpt2 = _meta_layers(_tiny_config("gpt2"))[0]
    # two linears named c_proj (attn's and mlp's): each by its path in the block, as peft's suffix match needs
    assert block_linears(gpt2) == {name if name.endswith("c_proj") else name.rsplit(".", 1)[-1]:
                                   [m.weight.shape[0], m.weight.shape[1], True]          # Conv1D: weight [in, out]
                                   for name, m in gpt2.named_modules() if type(m).__name__ == "Conv1D"}
    for model_type, left_out in (("llama4_text", "router"), ("phimoe", "router"), ("deepseek_v4", "o_a_proj")):
        from scaletrain.measure.tiny_configs import config_dict, shrink

        names = block_linears(_meta_layers(shrink(config_dict(model_type), model_type))[0])
        assert names and not any(n.rsplit(".", 1)[-1] == left_out for n in names), (model_type, names)


@pytest.mark.heavy               # traces a family in this process
def test_a_traced_family_plans_its_block_gemms_and_quantizes_its_linears(family):
    import torch
    from transformers.pytorch_utils import Conv1D

    model_type, config, arch = family
    assert set(arch.block_linear_names) == LINEARS[model_type]
    layers = _meta_layers(config)
    weights = sum(m.weight.numel() for layer in layers for m in layer.modules()
                  if isinstance(m, (torch.nn.Linear, Conv1D)))
    assert arch.linear_weight_params() == weights          # what bitsandbytes quantizes: every block linear

    def setup(method: str) -> TrainingSetup:
        return TrainingSetup(model=arch, hardware=parse_gpus("1xH100"), method=method, lora_rank=8,
                             strategy="ddp", precision="bf16", attn="sdpa", grad_ckpt=False, micro_batch=B,
                             seq_len=S, device="cuda")

    lora = setup("lora")
    # the block GEMMs alone (forward and the input gradient of every linear, every layer) at the device's peak: a
    # floor under the micro-step's matmul time, which once held the output head's only
    flops = 2 * 2 * B * S * weights
    assert micro_step(lora).matmul >= flops / (lora.hardware.gpu.peak_tflops("bf16") * 1e12)
    # QLoRA: bitsandbytes holds each block linear's weight in 4 bits (and its scales), everything else in fp32
    # (prepare_model_for_kbit_training), the adapters beside them. With no linear quantized, the base alone was 4
    # bytes a parameter: the weights, adapters included, are now under that
    qlora = estimate_memory(setup("qlora")).weights_bytes
    assert qlora < 4 * arch.params, (qlora, arch.params, weights)
    # full fine-tuning without checkpointing on a GPU: the largest linear's 16-bit gradient is counted (the plan
    # failed on an empty list of linears)
    assert estimate_memory(setup("full")).total_bytes > 6 * arch.params

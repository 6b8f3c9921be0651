"""What one decoder block saves for backward, byte for byte: the engine's per-token formulas against torch's
saved-tensor hooks on real HF blocks, for every family the catalog models and every dtype regime the stack runs
(fp32; fp32 weights under autocast; bf16 weights; LoRA on fp32, bf16-under-autocast and fp32-under-autocast bases).

The whole-step peaks are checked in test_memory_groundtruth.py; this pins the structure under them exactly.
"""

from __future__ import annotations

import pytest

from scaletrain.engine.catalog.architectures import BLOCK_LINEARS, arch_from_config, catalog_entry
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.estimate.activations import block_activations
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.measure.saved_activations import measure_saved_activation_bytes

pytestmark = pytest.mark.heavy          # saved tensors of real blocks, recorded

# (engine precision, master weights, LoRA base bits) → measure/step.py's regime name
REGIMES = {
    "fp32": ("fp32", "fp32", 16, "fp32"),
    "autocast": ("bf16", "fp32", 16, "bf16"),
    "bf16-weights": ("bf16", "bf16", 16, "bf16-pure"),
    "lora-bf16-base": ("bf16", "fp32", 16, "bf16-autocast"),
    "lora-fp32-base": ("bf16", "fp32", 32, "bf16"),
    "lora-bf16-no-autocast": ("bf16", "bf16", 16, "bf16-pure"),   # --master-weights bf16: PEFT's fp32 input casts
    "qlora": ("bf16", "fp32", 4, "bf16"),     # NF4 base, the rest upcast to fp32, autocast (bitsandbytes on CPU)
}
LAYERS = 4
MIDDLE = "layer2"   # a block that is neither the first (rotary tables, no input gradient under LoRA) nor Gemma's
                    # first global-attention layer


def _config(family: str) -> dict:
    cfg = dict(catalog_entry(f"scaletrain/tiny-{family}")["config"])
    cfg["num_hidden_layers"] = LAYERS
    if "layer_types" in cfg:
        pattern = list(cfg["layer_types"])
        cfg["layer_types"] = [pattern[i % len(pattern)] for i in range(LAYERS)]
    return cfg


CASES = [(fam, regime, attn) for fam in ("llama", "qwen2", "qwen3", "gemma3", "olmo2", "mistral")
         for regime in REGIMES for attn in ("sdpa", "eager")
         if (attn == "sdpa" or regime in ("autocast", "lora-bf16-base"))
         and (regime != "qlora" or fam in ("qwen2", "qwen3", "gemma3"))]


@pytest.mark.parametrize("family,regime,attn", CASES)
def test_block_saves_exactly_what_the_engine_counts(family, regime, attn):
    precision, master, base_bits, measured_as = REGIMES[regime]
    method = "lora" if regime.startswith("lora") or (regime == "fp32" and family in ("qwen2", "olmo2")) else "full"
    method = "qlora" if regime == "qlora" else method
    cfg = _config(family)
    b, s = 2, 32
    setup = TrainingSetup(model=arch_from_config(cfg, family), hardware=parse_gpus("1xCPU"), method=method,
                          lora_rank=8, lora_targets=BLOCK_LINEARS, strategy="ddp", precision=precision,
                          master_weights=master, base_bits=base_bits, attn=attn, micro_batch=b, seq_len=s,
                          device="cpu")
    _, per_layer = measure_saved_activation_bytes(
        cfg, method=method, lora_rank=8, lora_alpha=16, lora_targets=BLOCK_LINEARS, micro_batch=b, seq_len=s,
        attn=attn, precision=measured_as, device="cpu", per_layer=True)
    layer = block_activations(setup)
    assert per_layer[MIDDLE] == layer.saved + layer.weight_copies, (family, regime, attn, method)


@pytest.mark.parametrize("regime", ["fp32", "lora-bf16-base", "lora-fp32-base"])
def test_down_proj_adapter_input_cast(regime):
    """Checkpointing recomputes each block in backward; at down_proj PEFT copies the B·S·I input to the adapter's
    dtype (an fp32 copy under autocast) before lora_A: the copy the engine's recompute transient counts."""
    import torch

    from scaletrain.engine.estimate.activations import adapter_input_cast
    from scaletrain.engine.estimate.numerics import numerics
    from scaletrain.measure.step import build_harness

    precision, master, base_bits, measured_as = REGIMES[regime]
    cfg = _config("llama")
    b, s = 2, 32
    setup = TrainingSetup(model=arch_from_config(cfg, "llama"), hardware=parse_gpus("1xCPU"), method="lora",
                          lora_rank=8, lora_targets=BLOCK_LINEARS, strategy="ddp", precision=precision,
                          master_weights=master, base_bits=base_bits, micro_batch=b, seq_len=s, device="cpu")
    h = build_harness(cfg, method="lora", lora_targets=BLOCK_LINEARS, precision=measured_as, device="cpu")
    down = h.model.base_model.model.model.layers[2].mlp.down_proj
    seen = {}
    down.register_forward_pre_hook(lambda mod, args: seen.update(x=args[0]))
    down.lora_A["default"].register_forward_pre_hook(lambda mod, args: seen.update(a=args[0]))
    ids = torch.randint(0, cfg["vocab_size"], (b, s))
    with h.autocast():
        h.model(input_ids=ids, labels=ids)
    x, a = seen["x"], seen["a"]
    copied = 0 if a.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() else a.untyped_storage().nbytes()
    nm = numerics(setup)
    assert copied == b * s * adapter_input_cast(nm, cfg["intermediate_size"], x.element_size())
    assert copied == b * s * adapter_input_cast(nm, cfg["intermediate_size"], nm.mlp_bytes)


def test_checkpointing_keeps_the_cpu_generator_state_per_block_as_the_engine_counts():
    """torch.utils.checkpoint (non-reentrant, preserve_rng_state, as transformers calls it) keeps
    torch.get_rng_state() beside each checkpointed block until backward: the profiler sees it, and the engine counts
    it on a CPU device only (its CUDA twin is host memory). Without it LoRA + checkpointing rows were 0.13 % under."""
    import dataclasses

    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.checkpoint import checkpoint

    from scaletrain.engine.estimate.memory import CPU_RNG_STATE_BYTES, rng_state_bytes
    from scaletrain.measure.memory_timeline import read_cpu_timeline

    blocks = [torch.nn.Linear(16, 16) for _ in range(3)]

    def held_after_forward(preserve: bool) -> int:
        """Bytes the profiler cannot tie to a tensor's role (the generator states), alive after forward."""
        x = torch.randn(4, 16, requires_grad=True)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            h = x
            for block in blocks:
                h = checkpoint(block, h, use_reentrant=False, preserve_rng_state=preserve)
        held = read_cpu_timeline(prof).peak_by_category.get("unknown", 0)
        h.sum().backward()
        return held

    assert torch.get_rng_state().nbytes == CPU_RNG_STATE_BYTES
    assert held_after_forward(True) == len(blocks) * CPU_RNG_STATE_BYTES
    assert held_after_forward(False) == 0
    setup = TrainingSetup(model=arch_from_config(_config("llama"), "llama"), hardware=parse_gpus("1xCPU"),
                          grad_ckpt=True, device="cpu")
    assert rng_state_bytes(setup) == CPU_RNG_STATE_BYTES
    assert rng_state_bytes(dataclasses.replace(setup, grad_ckpt=False)) == 0
    assert rng_state_bytes(dataclasses.replace(setup, device="cuda", hardware=parse_gpus("1xH100"))) == 0

"""Traced model families: a model_type without an analytic layout is measured, not planned as Llama.

phi3 (fused qkv_proj / gate_up_proj), granite (Llama-like with multipliers) and glm4 (four norms per block, fused
gate_up_proj, biased q/k/v) have no analytic layout: their structure and saved bytes come from trainer/trace.py
(a 2-layer slice at the real widths), cached by engine/catalog/traced.py. The engine's allocated peak is checked
against torch.profiler's measured peak of one real optimizer step (trainer/measure.py), parameters exactly.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from scaletrain.engine.catalog.architectures import _FAMILIES, arch_from_config, catalog_entry, load_model
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog import traced
from scaletrain.engine.model.activations import block_activations
from scaletrain.engine.model.memory import estimate_memory
from scaletrain.engine.model.setup import TrainingSetup
from scaletrain.engine.model.traced_blocks import trace_regime

FAMILIES = ("phi3", "granite", "glm4")
# each block's nn.Linear modules as transformers 5 names them (what peft matches LoRA targets against)
LINEARS = {"phi3": {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"},
           "granite": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
           "glm4": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"}}
# each family full and LoRA, checkpointing on and off (bench/cpu_groundtruth.py runs all twelve combinations)
CASES = [("phi3", "full", False), ("phi3", "lora", True), ("granite", "full", False), ("granite", "lora", True),
         ("glm4", "full", True), ("glm4", "lora", False)]
B, S, RANK = 2, 128, 8


def _config(family: str) -> dict:
    return dict(catalog_entry(f"scaletrain/tiny-{family}")["config"])


def _regime(family: str, method: str) -> dict:
    lora = method == "lora"
    return {"method": method, "lora_rank": RANK if lora else 0, "lora_targets": sorted(LINEARS[family]) if lora
            else None, "precision": "fp32", "attn": "sdpa"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache for the module, filled by trainer/trace.py in this process (torch is imported here anyway; the
    subprocess path is what the starcoder2 and refusal tests run)."""
    from scaletrain.trainer.trace import run

    mp = pytest.MonkeyPatch()
    mp.setenv("SCALETRAIN_CACHE", str(tmp_path_factory.mktemp("traces")))
    for family in FAMILIES:
        assert traced.prefetch(_config(family), [_regime(family, m) for m in ("full", "lora")], "test", run) == 2
    yield
    mp.undo()


def _setup(family: str, method: str, ckpt: bool) -> TrainingSetup:
    arch = arch_from_config(_config(family), f"tiny-{family}")
    return TrainingSetup(model=arch, hardware=parse_gpus("1xCPU"), method=method, lora_rank=RANK,
                         strategy="ddp", precision="fp32", optimizer_impl="for-loop", attn="sdpa", grad_ckpt=ckpt,
                         micro_batch=B, seq_len=S, device="cpu")


def test_a_traced_family_is_not_llama_and_reads_its_trace(cache):
    for family in FAMILIES:
        s = _setup(family, "lora", False)
        m = s.model
        assert m.memory_source == "traced" and m.family != _FAMILIES["llama"] and m.family["traced"]
        assert set(m.linear_shapes()) == LINEARS[family] and set(s.lora_targets) == LINEARS[family]
        assert trace_regime(s) == _regime(family, "lora")       # the prefetched answer is the one planning reads
        blk = traced.activations(m.config, trace_regime(s), "")["blocks"][0]
        layer = block_activations(s)
        assert layer.saved_attn == B * S * blk["attn"][1] and layer.saved_mlp == B * S * blk["mlp"][1]
        assert m.to_json()["memory_source"] == "traced"       # this process traced it (the fixture)
        assert m.memory_source_line() == f"memory: traced from a 2-layer slice of {family}"
    llama = load_model("scaletrain/tiny-llama")
    assert llama.memory_source == "analytic" and llama.to_json()["memory_source"] == "analytic"


def test_the_engine_predicts_the_measured_peak(cache):
    from scaletrain.trainer.measure import measure_step

    errors = []
    for family, method, ckpt in CASES:
        s = _setup(family, method, ckpt)
        predicted = estimate_memory(s).allocated_peak_bytes
        m = measure_step(_config(family), method=method, lora_rank=RANK, lora_alpha=2 * RANK,
                         lora_targets=s.lora_targets, micro_batch=B, seq_len=S, grad_ckpt=ckpt, attn="sdpa",
                         precision="fp32", device="cpu", optimizer_impl="for-loop")
        lora = s.trainable_params if method == "lora" else 0
        assert (s.model.params + lora, s.trainable_params) == (m.params, m.trainable_params), (family, method)
        err = (predicted - m.peak_allocated_bytes) / m.peak_allocated_bytes
        assert -0.03 <= err <= 0.08, (family, method, ckpt, err)
        errors.append(abs(err))
    assert statistics.median(errors) <= 0.03


def test_the_cache_is_hit_without_a_subprocess_or_torch(cache, monkeypatch):
    def no_subprocess(*a, **k):
        raise AssertionError("a cached trace ran a subprocess")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    _, hit = traced.trace(_config("glm4"), _regime("glm4", "full"), "")
    assert hit
    code = ("import sys; from scaletrain.engine.catalog.architectures import load_model; "
            "from scaletrain.engine.catalog.hardware import parse_gpus; "
            "from scaletrain.engine.model.setup import TrainingSetup; "
            "from scaletrain.engine.model.memory import estimate_memory; "
            "s = TrainingSetup(model=load_model('scaletrain/tiny-glm4'), hardware=parse_gpus('1xCPU'), "
            "method='full', strategy='ddp', precision='fp32', optimizer_impl='for-loop', attn='sdpa', "
            "micro_batch=2, seq_len=256, device='cpu'); estimate_memory(s); "
            "print(s.model.to_json()['memory_source'], 'torch' in sys.modules)")
    monkeypatch.undo()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "traced (cached) False" and "tracing" not in r.stderr, r.stderr


def test_a_family_transformers_knows_is_traced(tmp_path, monkeypatch, capsys):
    """starcoder2: LayerNorm with biases, a two-linear MLP (c_fc, c_proj), tied embeddings."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "traces"))
    cfg = {"model_type": "starcoder2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "bos_token_id": 1,
           "eos_token_id": 2, "pad_token_id": 0}
    regime = {"method": "full", "lora_rank": 0, "lora_targets": None, "precision": "fp32", "attn": "sdpa"}
    assert traced.prefetch(cfg, [regime], "test") == 1
    assert capsys.readouterr().err.startswith("tracing starcoder2 (full, fp32, sdpa) … ")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    arch = load_model(str(tmp_path / "config.json"))
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    assert arch.params == sum(p.numel() for p in {id(p): p for p in hf.parameters()}.values())
    assert set(arch.linear_shapes()) == {"q_proj", "k_proj", "v_proj", "o_proj", "c_fc", "c_proj"}
    s = TrainingSetup(model=arch, hardware=parse_gpus("1xCPU"), method="full", strategy="ddp", precision="fp32",
                      attn="sdpa", micro_batch=1, seq_len=64, device="cpu")
    assert trace_regime(s) == regime and block_activations(s).saved > 0


def test_a_family_transformers_does_not_know_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "traces"))
    cfg = {"model_type": "no_such_family", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "vocab_size": 512}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, "-m", "scaletrain.tui.cli.main", "plan", "--model",
                        str(tmp_path / "config.json"), "--gpus", "1xCPU"], capture_output=True, text=True,
                       timeout=300)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(lines) == 1 and len(lines[0].removeprefix("scaletrain: error: ")) <= 300, r.stderr
    assert "no_such_family" in lines[0] and "no analytic layout" in lines[0]
    with pytest.raises(ScaletrainError):
        arch_from_config(cfg, "x")


def test_a_layer_too_large_for_the_cpu_is_refused_before_it_is_built():
    """A 16k-wide glm4 layer is ~13 GiB in fp32: the trace says so in one line instead of allocating it."""
    from scaletrain.trainer.trace import TraceError, run

    cfg = dict(_config("glm4"), hidden_size=16384, intermediate_size=65536, num_attention_heads=128,
               num_key_value_heads=8, head_dim=128)
    with pytest.raises(TraceError, match=r"one decoder layer of glm4 is 1\d\.\d GiB .* over the 2 GiB") as e:
        run({"config": cfg, "regime": _regime("glm4", "full")})
    assert "\n" not in str(e.value) and len(str(e.value)) <= 280


def test_a_layer_pattern_is_traced_once_per_position_and_mapped_back_by_type():
    """A config with a layer_types pattern: the slice holds a first layer plus one layer per pattern position, and
    the engine gives each real layer the traced block of its own type."""
    from types import SimpleNamespace

    from scaletrain.engine.model.traced_blocks import _per_layer
    from scaletrain.trainer.trace import slice_config

    pattern = ["sliding_attention"] * 2 + ["full_attention"]
    cfg = dict(_config("glm4"), num_hidden_layers=7, layer_types=[pattern[i % 3] for i in range(7)],
               pad_token_id=151329)
    sliced, types = slice_config(cfg)
    assert sliced["num_hidden_layers"] == 4 == len(types) and sliced["layer_types"] == types
    assert sliced["vocab_size"] < 1024 and sliced["pad_token_id"] < sliced["vocab_size"]
    blocks = [{"type": types[i], "attn": [0, i, 0]} for i in range(1, 4)]
    s = SimpleNamespace(model=SimpleNamespace(config=cfg, num_layers=7))
    assert [b["type"] for b in _per_layer(s, blocks)] == cfg["layer_types"]


def test_the_structure_a_catalog_entry_records_is_what_a_trace_finds():
    """The tiny traced entries carry their structure (so listing the catalog runs no trace): it must be what
    transformers builds today."""
    from scaletrain.trainer.trace import structure

    for family in FAMILIES:
        entry = catalog_entry(f"scaletrain/tiny-{family}")
        assert entry["traced_structure"] == structure(entry["config"]), family
        assert load_model(f"scaletrain/tiny-{family}").params == entry["traced_structure"]["params"]


def test_the_fit_is_exact_or_refuses():
    from scaletrain.trainer.trace import TraceError, fit

    f = lambda S: 4096 + 1234 * S + 64 * S * S          # noqa: E731 - weight copies, per token, eager softmax
    assert fit([(S, f(S)) for S in (16, 32, 48)]) == [4096, 1234, 64]
    with pytest.raises(TraceError, match="layer1.mlp: saved bytes .* not a quadratic"):
        fit([(16, 2052), (32, 4096), (48, 6145)], "layer1.mlp")

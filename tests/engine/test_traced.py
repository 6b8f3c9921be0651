"""Traced model families: a model_type without an analytic layout is measured, not planned as Llama.

phi3 (fused qkv_proj / gate_up_proj), granite (Llama-like with multipliers) and glm4 (four norms per block, fused
gate_up_proj, biased q/k/v) have no analytic layout: their structure and saved bytes come from measure/trace.py
(a 2-layer slice at the real widths), cached by engine/catalog/traced.py. The engine's allocated peak is checked
against torch.profiler's measured peak of one real optimizer step (measure/step.py), parameters exactly.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from scaletrain.engine.catalog.architectures import _FAMILIES, arch_from_config, catalog_entry, load_model
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.catalog import traced
from scaletrain.engine.estimate.activations import block_activations
from scaletrain.engine.estimate.memory import estimate_memory
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.estimate.traced_blocks import trace_regime
from scaletrain.engine.plan.search import search

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
    """One cache for the module, filled by measure/trace.py in this process (torch is imported here anyway; the
    subprocess path is what the starcoder2 and refusal tests run)."""
    from scaletrain.measure.trace import run

    mp = pytest.MonkeyPatch()
    mp.setenv("SCALETRAIN_CACHE", str(tmp_path_factory.mktemp("traces")))
    for family in FAMILIES:
        regimes = [_regime(family, m) for m in ("full", "lora")]
        regimes += [dict(r, grad_ckpt=True) for r in regimes]      # checkpointing's recompute is traced too
        assert traced.prefetch(_config(family), regimes, "test", run) == 4
    yield
    mp.undo()


def _setup(family: str, method: str, ckpt: bool) -> TrainingSetup:
    arch = arch_from_config(_config(family), f"tiny-{family}")
    return TrainingSetup(model=arch, hardware=parse_gpus("1xCPU"), method=method, lora_rank=RANK,
                         strategy="ddp", precision="fp32", optimizer_impl="for-loop", attn="sdpa", grad_ckpt=ckpt,
                         micro_batch=B, seq_len=S, device="cpu")


@pytest.mark.heavy                      # the module's traced families (30 CPU s on the loaded VM)
def test_a_traced_family_is_not_llama_and_reads_its_trace(cache):
    for family in FAMILIES:
        s = _setup(family, "lora", False)
        m = s.model
        assert m.memory_source == "traced" and m.family != _FAMILIES["llama"] and m.family["traced"]
        assert set(m.linear_shapes()) == LINEARS[family] and set(s.lora_targets) == LINEARS[family]
        assert trace_regime(s) == _regime(family, "lora")       # the prefetched answer is the one planning reads
        (kind,) = traced.activations(m.config, trace_regime(s), "")["kinds"]
        layer = block_activations(s)
        assert kind["count"] == m.num_layers
        assert layer.saved_attn == B * S * kind["attn"][1] + B * S * S * kind["attn"][2]
        assert layer.saved_mlp == B * S * kind["mlp"][1] + B * S * S * kind["mlp"][2]
        assert m.to_json()["memory_source"] == "traced"       # this process traced it (the fixture)
        assert m.memory_source_line() == f"memory: traced from a 2-layer slice of {family} (one layer kind)"
    llama = load_model("scaletrain/tiny-llama")
    assert llama.memory_source == "analytic" and llama.to_json()["memory_source"] == "analytic"


@pytest.mark.heavy                      # the module's traced families (30 CPU s on the loaded VM)
def test_the_engine_predicts_the_measured_peak(cache):
    from scaletrain.measure.step import measure_step

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


@pytest.mark.heavy                      # the module's traced families (30 CPU s on the loaded VM)
def test_the_cache_is_hit_without_a_subprocess_or_torch(cache, monkeypatch):
    def no_subprocess(*a, **k):
        raise AssertionError("a cached trace ran a subprocess")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    _, hit = traced.trace(_config("glm4"), _regime("glm4", "full"), "")
    assert hit
    code = ("import sys; from scaletrain.engine.catalog.architectures import load_model; "
            "from scaletrain.engine.catalog.hardware import parse_gpus; "
            "from scaletrain.engine.estimate.setup import TrainingSetup; "
            "from scaletrain.engine.estimate.memory import estimate_memory; "
            "s = TrainingSetup(model=load_model('scaletrain/tiny-glm4'), hardware=parse_gpus('1xCPU'), "
            "method='full', strategy='ddp', precision='fp32', optimizer_impl='for-loop', attn='sdpa', "
            "micro_batch=2, seq_len=256, device='cpu'); estimate_memory(s); "
            "print(s.model.memory_source_line().rsplit(' ', 1)[-1], 'torch' in sys.modules)")
    monkeypatch.undo()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "(cached) False" and "tracing" not in r.stderr, r.stderr


@pytest.mark.heavy                      # traces a family
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


@pytest.mark.heavy                      # a trace subprocess or a model built (14-18 CPU s on the loaded VM)
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
    assert len(lines) == 1 and len(lines[0].removeprefix("scaletrain: error: ")) <= traced.MAX_ERROR_CHARS, r.stderr
    assert "no_such_family" in lines[0] and "no analytic layout" in lines[0]
    with pytest.raises(ScaletrainError):
        arch_from_config(cfg, "x")


def test_a_refusal_keeps_its_reason_whole_before_the_list_of_what_is_accepted():
    """A big MoE's real slice is refused by size; with the accepted list first in line, the 300-character line cut
    the reason to "the 4-layer slice of qwen3_next that holds each …", the size and the limit gone."""
    from scaletrain.engine.catalog.architectures import analytic_types

    why = ("the 4-layer slice of qwen3_next that holds each of its 2 layer kinds is 12.3 GiB in the traced dtype, "
           "over the 4 GiB a trace may take on this CPU (no reduced-width trace is proven exact for it)")
    line = str(traced._fail("qwen3_next", why, analytic_types()))
    assert why in line and "accepted: gemma2" in line and len(line) <= traced.MAX_ERROR_CHARS
    line = str(traced._fail("x", "Unrecognized model " + "aimv2, albert, " * 400, analytic_types()))
    assert len(line) <= traced.MAX_ERROR_CHARS and "\n" not in line and "accepted: " in line


def test_a_layer_too_large_for_the_cpu_is_refused_before_it_is_built():
    """A 16k-wide glm4 layer is ~13 GiB in fp32: the trace says so in one line instead of allocating it."""
    from scaletrain.measure.trace import TraceError, run

    cfg = dict(_config("glm4"), hidden_size=16384, intermediate_size=65536, num_attention_heads=128,
               num_key_value_heads=8, head_dim=128)
    with pytest.raises(TraceError, match=r"the 2-layer slice of glm4 .* is \d+\.\d GiB .* over the 4 GiB") as e:
        run({"config": cfg, "regime": _regime("glm4", "full")})
    assert "\n" not in str(e.value) and len(str(e.value)) <= 280


@pytest.mark.parametrize("model_type, counts, slice_layers", [
    ("deepseek_v3", [1, 5], 2),          # first_k_dense_replace: one dense layer, then MoE layers
    ("jamba", [2, 3, 1], 5),             # mamba + dense MLP, mamba + MoE (odd layers), attention at layer 4
    ("qwen3_next", [5, 1], 4),           # linear attention, full attention every 4th (full_attention_interval)
])
def test_layers_are_grouped_by_what_they_are_and_the_slice_holds_each_kind(model_type, counts, slice_layers):
    """Kinds come from the module tree (classes, plain attributes, parameter shapes), not from a family table; the
    slice is the shortest prefix whose layers are the real model's first layers, one of each kind."""
    from scaletrain.measure.tiny_configs import config_dict
    from scaletrain.measure.trace import structure

    st = structure(config_dict(model_type))
    assert sorted(k["count"] for k in st["kinds"]) == sorted(counts), st["kinds"]
    assert st["slice_layers"] == slice_layers and len(st["layer_kinds"]) == sum(counts)
    assert set(st["layer_kinds"][:slice_layers]) == set(range(len(counts)))
    assert st["block_params"] == max(k["params"] for k in st["kinds"])


def test_the_structure_counts_buffers_and_the_heads_own_width():
    """What a full step holds that no parameter count shows: gpt_bigcode's n_positions² causal-mask table (a 1 MiB
    buffer at the tiny config: the sweep was 4.4 % under without it), and the logits' width where the class sizes
    its head its own way (inkling2's unpadded_vocab_size: the sweep was 43-70 % under with the config's vocabulary);
    the engine plans with both."""
    from scaletrain.measure.tiny_configs import config_dict
    from scaletrain.measure.trace import structure

    cfg = config_dict("gpt_bigcode")
    st = structure(cfg)
    assert st["buffer_other_bytes"] >= cfg["n_positions"] ** 2 and st["head_out"] == cfg["vocab_size"]
    cfg = config_dict("inkling2_text")
    st = structure(cfg)
    assert st["head_out"] == cfg["unpadded_vocab_size"] != cfg["vocab_size"]
    assert arch_from_config(cfg, "tiny-inkling2", st).vocab_size == cfg["unpadded_vocab_size"]


@pytest.mark.heavy                      # traces a family
def test_three_fresh_caches_trace_the_same_bytes(tmp_path, monkeypatch):
    """The recorder keeps every saved tensor alive while it counts: no freed address is reused and taken for an
    earlier tensor, so a trace is a measurement that repeats (qwen3_next gave 527, 956 and 527 MiB before)."""
    from scaletrain.measure.tiny_configs import config_dict

    cfg = config_dict("qwen3_next")
    regime = {"method": "full", "lora_rank": 0, "lora_targets": None, "precision": "fp32", "attn": "sdpa"}
    answers = []
    for i in range(3):
        monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / f"cache{i}"))
        traced._WORKER.stop()                    # a fresh trace process each time
        answers.append(traced.trace(cfg, regime, "test")[0]["activations"])
    assert answers[0] == answers[1] == answers[2]
    assert all(k["attn"][1] > 0 and k["mlp"][1] > 0 for k in answers[0]["kinds"])


@pytest.mark.heavy                      # traces a family, in a fresh cache
def test_plan_json_of_a_traced_family_is_the_same_bytes_traced_or_cached(tmp_path):
    """`scaletrain plan --json` of a traced family said "memory_source": "traced" when it traced and "traced
    (cached)" the next time: plan.json depended on the cache's state. The text line still says (cached)."""
    env = dict(os.environ, SCALETRAIN_CACHE=str(tmp_path / "cache"))
    cli = [sys.executable, "-m", "scaletrain.tui.cli.main", "plan", "--model", "scaletrain/tiny-phi3", "--gpus",
           "2xCPU", "--effective-batch", "16", "--seq-len", "128"]
    runs = [subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=300, env=env,
                           stdin=subprocess.DEVNULL) for _ in range(2)]
    assert runs[0].returncode == 0 and runs[1].returncode == 0, runs[0].stderr + runs[1].stderr
    first, second = (json.loads(r.stdout) for r in runs)
    for out in (first, second):            # the machine's free memory and disk (and the line saying them): the
        for check in out["resources"]["checks"]:      # trace process and its cache were in between
            check.pop("have_bytes", None)
            check.pop("where", None)
    assert first == second
    assert first["model"]["architecture"]["memory_source"] == "traced"
    text = subprocess.run(cli, capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert "memory: traced from a 2-layer slice of phi3 (one layer kind) (cached)" in text.stdout, text.stdout


def test_the_structure_a_catalog_entry_records_is_what_a_trace_finds():
    """The tiny traced entries carry their structure (so listing the catalog runs no trace): it must be what
    transformers builds today."""
    from scaletrain.measure.trace import structure

    for family in FAMILIES:
        entry = catalog_entry(f"scaletrain/tiny-{family}")
        assert entry["traced_structure"] == structure(entry["config"]), family
        assert load_model(f"scaletrain/tiny-{family}").params == entry["traced_structure"]["params"]


def test_the_fit_is_exact_non_negative_and_checked_or_refuses():
    from scaletrain.measure.trace import TraceError, fit

    f = lambda S: 4096 + 1234 * S + 64 * S * S          # noqa: E731 - weight copies, per token, eager softmax
    assert fit([(S, f(S)) for S in (64, 128, 192, 256)]) == [4096, 1234, 64]
    # three points through a parabola that dips below zero between them: never a negative coefficient
    pts = [(64, 64 * 100), (128, 128 * 100 + 10_000), (192, 192 * 100 + 10_000), (256, 256 * 100 + 10_000)]
    c = fit(pts, "layer1.mlp", slack=20_000)
    assert min(c) >= 0 and all(c[0] + c[1] * x + c[2] * x * x >= 0 for x in range(0, 4096, 64))
    with pytest.raises(TraceError, match="layer1.mlp: saved bytes .* not c0 \\+ c1·S \\+ c2·S² with c ≥ 0"):
        fit(pts, "layer1.mlp")
    with pytest.raises(TraceError, match="off by"):        # the fourth length is not what the first three say
        fit([(64, 6400), (128, 12800), (192, 19200), (256, 40000)], "x")


@pytest.mark.heavy                      # a trace subprocess and a model built and stepped (~60 CPU s)
def test_a_looped_stack_is_traced_run_by_run_and_planned_as_measured(tmp_path, monkeypatch):
    """hrm_text runs its layers several times per forward, in turns (its L module H_cycles × L_cycles times, the
    last runs of each cycle with gradients, its H module once a cycle), from two lists of one layer class. Refused
    before ("decoder layer 0 ran 6 times in one forward"); traced whole, every run counted, it is planned as
    torch.profiler measures its full step, and its checkpointing, measured 2.4 % under, is refused in one line."""
    from dataclasses import replace

    from scaletrain.measure.step import measure_step
    from scaletrain.measure.tiny_configs import config_dict

    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path))
    traced._WORKER.stop()
    # its cycles as the sweep's config has them (H 2 × L 3, the last 2 of each with gradients), 4 layers a stack
    # where the sweep's has 16: the same turns at a quarter of the trace and the step
    cfg = {**config_dict("hrm_text"), "num_layers_per_stack": 4}
    arch = arch_from_config(cfg, "tiny-hrm_text")
    s = TrainingSetup(model=arch, hardware=parse_gpus("1xCPU"), method="full", strategy="ddp", precision="fp32",
                      optimizer_impl="for-loop", attn="sdpa", micro_batch=B, seq_len=S, device="cpu")
    act = traced.activations(arch.config, trace_regime(s), "")
    per_stack = cfg["num_layers_per_stack"]
    assert act["looped"] == cfg["H_cycles"] * cfg["L_cycles"] and arch.num_layers == 2 * per_stack
    assert sorted(set(act["call_order"])) == list(range(2 * per_stack))          # both stacks, every layer
    assert len(act["call_order"]) == per_stack * (sum(cfg["L_bp_cycles"]) + 1 + cfg["H_cycles"])
    m = measure_step(cfg, method="full", micro_batch=B, seq_len=S, attn="sdpa", precision="fp32", device="cpu",
                     optimizer_impl="for-loop")
    assert m.params == arch.params
    assert abs(estimate_memory(s).allocated_peak_bytes / m.peak_allocated_bytes - 1) <= 0.005
    with pytest.raises(ScaletrainError, match="runs layers several times in one forward"):
        estimate_memory(replace(s, grad_ckpt=True))
    # a search left free to checkpoint leaves it out, and plans the rest
    found = search(s, target=None, fixed={"micro_batch": B})
    assert found.ranked and not any(c.setup.grad_ckpt for c in found.ranked)


@pytest.mark.heavy                      # a trace subprocess and a model built and stepped (~30 CPU s)
def test_a_stack_that_loops_in_its_forward_and_counts_blocks_as_layers_is_traced_whole(tmp_path, monkeypatch):
    """dory's forward runs its middle layers n_recurrent_loops times from one list, and its config.json counts each
    layer's attention and mlp blocks as two of num_hidden_layers (its class halves them; the input, recurrent and
    output counts must sum to that). No prefix of it builds, and cutting the whole model's config to the model's
    layer count failed its validator ("its forward failed"): refused before. Traced whole as written, every run
    counted, its full step is planned as torch.profiler measures it; its checkpointing is refused from the trace."""
    from dataclasses import replace

    from scaletrain.measure.step import measure_step
    from scaletrain.measure.tiny_configs import config_dict

    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path))
    blocks = ["sliding_attention", "mlp", "full_attention", "mlp"] * 3         # config.json's: 6 layers, 12 blocks
    cfg = {**config_dict("dory"), "num_hidden_layers": 12, "layer_types": blocks, "n_input_layers": 2,
           "n_recurrent_layers": 8, "n_output_layers": 2, "n_recurrent_loops": 3}
    arch = arch_from_config(cfg, "tiny-dory")
    s = TrainingSetup(model=arch, hardware=parse_gpus("1xCPU"), method="full", strategy="ddp", precision="fp32",
                      optimizer_impl="for-loop", attn="sdpa", micro_batch=B, seq_len=S, device="cpu")
    act = traced.activations(arch.config, trace_regime(s), "")
    assert arch.num_layers == 6 and act["slice_layers"] == 6 and act["looped"] == 3
    assert act["call_order"] == [0, *[1, 2, 3, 4] * 3, 5]        # 1 input layer, 4 recurrent 3 times, 1 output
    m = measure_step(cfg, method="full", micro_batch=B, seq_len=S, attn="sdpa", precision="fp32", device="cpu",
                     optimizer_impl="for-loop")
    assert m.params == arch.params
    # the bound (never 2 % under, at most 5 % over): measured -1.3 % here, -0.4 % at the sweep's 36 layers
    assert -0.02 <= estimate_memory(s).allocated_peak_bytes / m.peak_allocated_bytes - 1 <= 0.05
    with pytest.raises(ScaletrainError, match="runs layers several times in one forward"):
        estimate_memory(replace(s, grad_ckpt=True))


def test_a_traced_familys_per_layer_widths_are_read_not_refused():
    """gemma3n writes intermediate_size as one width per layer: a valid config transformers builds, which the
    config reader refused ("must be a whole number"); a traced family's list is read as its widest layer, and a
    list that is not whole numbers is still refused in one line."""
    cfg = {"model_type": "gemma3n_text", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 3, "vocab_size": 512, "intermediate_size": [128, 256, 128]}
    st = {"params": 1000, "tied": True, "head_out": 512}
    assert arch_from_config(cfg, "tiny-gemma3n", st).intermediate_size == 256
    with pytest.raises(ScaletrainError, match="intermediate_size must be a whole number"):
        arch_from_config({**cfg, "intermediate_size": [128, "wide"]}, "tiny-gemma3n", st)
    with pytest.raises(ScaletrainError, match="intermediate_size must be a whole number"):
        arch_from_config({**cfg, "model_type": "llama"}, "tiny-llama")      # an analytic family's stays one number


@pytest.mark.long                       # imports transformers' config classes
def test_a_config_with_per_layer_sizes_gives_the_sizes_it_answers_globally():
    """gemma4's head_dim is a per-layer attribute: reading it from the whole config raises (transformers'
    heterogeneity configs), and the structure of every gemma4 family failed ("transformers cannot build it"). The
    sizes the config answers are read; the per-layer one is left to the traced layers."""
    from transformers import AutoConfig

    from scaletrain.measure.trace_structure import config_sizes

    conf = AutoConfig.for_model("gemma4_text")
    with pytest.raises(RuntimeError):
        conf.head_dim
    sizes = config_sizes(conf)
    assert "head_dim" not in sizes and sizes["hidden_size"] == conf.hidden_size


def test_for_loop_adamw_holds_two_copies_of_the_largest_parameter_tensor():
    """for-loop AdamW's `exp_avg_sq.sqrt() / bias_correction2_sqrt` holds two temporaries of the parameter being
    stepped; the largest was taken to be the embedding. roc_bert's shape embedding (24858×512) is 390 times
    larger than its word embedding at the sweep's shrunk sizes, and its full fine-tune was planned 32 % under
    the profiler (bench/architecture_sweep.py). A traced structure names its largest tensor; an analytic MoE's
    fused experts (E, 2I, h) count where they exceed the embedding."""
    from scaletrain.engine.estimate.states import _optimizer_step_temporaries
    from scaletrain.engine.estimate.numerics import numerics

    cfg = {"model_type": "roc_bert", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
           "vocab_size": 512, "intermediate_size": 128}
    st = {"params": 13_000_000, "tied": True, "head_out": 512, "embedding_params": 512 * 64,
          "largest_param": 24858 * 512, "linears": {}}
    arch = arch_from_config(cfg, "tiny-roc_bert", st)
    assert arch.largest_param_elems == 24858 * 512
    s = TrainingSetup(model=arch, hardware=parse_gpus("1xCPU"), method="full", strategy="ddp", precision="fp32",
                      optimizer_impl="for-loop", attn="sdpa", micro_batch=1, seq_len=16, device="cpu")
    assert _optimizer_step_temporaries(s, numerics(s), 0) == 2 * 4 * 24858 * 512
    older = {k: v for k, v in st.items() if k != "largest_param"}          # a trace cached before it was named
    assert arch_from_config(cfg, "tiny-roc_bert", older).largest_param_elems == 512 * 64
    mixtral = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
               "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 512, "num_local_experts": 8,
               "num_experts_per_tok": 2}
    assert arch_from_config(mixtral, "tiny-mixtral").largest_param_elems == 8 * 2 * 128 * 64


def test_a_class_that_cannot_checkpoint_is_refused_checkpointing_in_one_line():
    """jetmoe and cpmant set supports_gradient_checkpointing False: the whole family was refused ("its forward
    failed") because one traced regime asked for checkpointing; now only --grad-ckpt is refused, saying why."""
    cfg = {"model_type": "jetmoe", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 3, "vocab_size": 512, "intermediate_size": 128}
    arch = arch_from_config(cfg, "tiny-jetmoe", {"params": 1000, "tied": True, "head_out": 512,
                                                 "checkpointing": False, "linears": {}})
    with pytest.raises(ScaletrainError, match="cannot checkpoint its layers"):
        TrainingSetup(model=arch, hardware=parse_gpus("1xCPU"), method="full", strategy="ddp", precision="fp32",
                      attn="eager", grad_ckpt=True, micro_batch=1, seq_len=16, device="cpu")


def test_a_padding_kernels_chunk_puts_the_planned_lengths_residue_in_the_trace():
    """mamba2's scan pads every sequence to its chunk (bamba, granitemoehybrid: 256). Traced at multiples of the
    chunk and read at the planned 128 rounded up to 256, every per-token tensor counted twice: +18.6 % and +36 %
    over the profiler (bench/results/architecture_sweep.json, format 7). The trace now runs lengths in the planned
    length's residue class, where what pads and what does not are both exact in one quadratic fit."""
    cfg = dict(_config("phi3"), mamba_chunk_size=256)
    assert traced.granule(cfg) == 256 and traced.granule(_config("phi3")) == traced.BASE_GRANULE
    arch = arch_from_config(cfg, "tiny-phi3-chunked", catalog_entry("scaletrain/tiny-phi3")["traced_structure"])
    at = lambda S: TrainingSetup(model=arch, hardware=parse_gpus("1xCPU"), method="full", strategy="ddp",  # noqa: E731
                                 precision="fp32", attn="sdpa", micro_batch=B, seq_len=S, device="cpu")
    assert trace_regime(at(128))["residue"] == 128 and trace_regime(at(300))["residue"] == 44
    assert "residue" not in trace_regime(at(512))        # a multiple of the chunk: the regime every plan had
    # learned positions fewer than the trace lengths need (blenderbot's 128): a finer tile, all lengths under 128
    assert traced.granule({"max_position_embeddings": 128}) == 16
    assert traced.granule({"max_position_embeddings": 512, "chunk_size": 256}) == 256     # never below a chunk


@pytest.mark.long                       # imports transformers' config classes
def test_a_slice_of_a_config_without_special_ids_moves_its_class_defaults_into_the_small_vocabulary():
    """Phi3Config's default pad_token_id is 32000: a config.json naming none, sliced with the trace's small
    vocabulary, could not be built (padding_idx outside the embedding), so no prefix matched and the whole
    32-layer stack was taken as the slice and refused as too large for the CPU."""
    from scaletrain.measure.trace_structure import SLICE_VOCAB, meta_model, prefix_config

    cfg = {"model_type": "phi3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 32,
           "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 32064}
    sliced = prefix_config(cfg, 2)
    assert sliced["num_hidden_layers"] == 2 and sliced["pad_token_id"] == SLICE_VOCAB - 1
    assert meta_model(sliced).get_input_embeddings().padding_idx == SLICE_VOCAB - 1


def test_a_window_the_plan_does_not_meet_is_kept_out_of_the_traced_lengths():
    """A sliding window at least the planned length is causal attention at that length; traced at lengths beyond it,
    the fit took in a window the plan never meets (lfm3's 256: refused by the fit's check; granite_swa's 128 at a
    planned 128: 4 % over). It is traced longer than every trace length; a shorter window than the planned length
    is traced shorter than every one (the `windowed` regime)."""
    from scaletrain.engine.catalog.traced import LENGTHS_PER_GRANULE, granule
    from scaletrain.measure.trace_structure import TRACE_MULTIPLES, WINDOWED_TRACE, shrink_windows

    cfg = {"model_type": "lfm3", "sliding_window": 256, "max_position_embeddings": 4096}
    g = granule(cfg)
    longest = g * TRACE_MULTIPLES[-1] + g - 1                 # the last multiple, with the largest residue
    causal = dict(cfg)
    shrink_windows(causal, {"method": "full"})
    assert causal["sliding_window"] > longest and causal["sliding_window"] == LENGTHS_PER_GRANULE * g
    windowed = dict(cfg)
    shrink_windows(windowed, {"method": "full", "windowed": True})
    assert windowed["sliding_window"] == WINDOWED_TRACE < g
    wide = {**cfg, "sliding_window": 4096}
    shrink_windows(wide, {"method": "full"})
    assert wide["sliding_window"] == 4096
    plain = {"model_type": "llama"}
    shrink_windows(plain, {"method": "full"})
    assert "sliding_window" not in plain


def test_a_config_whose_depth_is_its_list_of_layer_types_is_sliced_by_that_list():
    """transformers 5.24's NemotronHConfig writes layers_block_type (mamba, attention, MoE, MLP layers) and no
    num_hidden_layers: the trace refused it ("names no number of layers"). Its slice is the list's first layers."""
    from scaletrain.measure.trace_structure import prefix_config

    cfg = {"model_type": "nemotron_h", "hidden_size": 64, "vocab_size": 512,
           "layers_block_type": ["mamba", "moe", "attention", "mlp", "mamba", "moe"]}
    sliced = prefix_config(cfg, 4)
    assert sliced["layers_block_type"] == ["mamba", "moe", "attention", "mlp"]
    assert "num_hidden_layers" not in sliced
    # prophetnet's decoder, built alone as a causal LM, counts its layers as num_decoder_layers
    assert prefix_config({"model_type": "prophetnet", "hidden_size": 64, "vocab_size": 512, "num_encoder_layers": 12,
                          "num_decoder_layers": 12}, 2)["num_decoder_layers"] == 2


def test_a_slice_shrinks_the_logits_width_that_follows_the_vocabulary():
    """MarianConfig's decoder_vocab_size is the width of MarianForCausalLM's logits (vocab_size when unset): left at
    58101 beside the slice's small vocabulary, the trace's forward failed reshaping the logits and marian was refused
    (found by bench/architecture_sweep.py). A width that differs from vocab_size is left as the config says."""
    from scaletrain.measure.trace_structure import SLICE_VOCAB, meta_model, prefix_config

    cfg = {"model_type": "marian", "d_model": 64, "decoder_ffn_dim": 128, "decoder_layers": 4,
           "decoder_attention_heads": 4, "vocab_size": 58101, "decoder_vocab_size": 58101, "pad_token_id": 58100,
           "decoder_start_token_id": 58100}
    sliced = prefix_config(cfg, 2)
    assert sliced["vocab_size"] == sliced["decoder_vocab_size"] == SLICE_VOCAB
    assert meta_model(sliced).get_output_embeddings().out_features == SLICE_VOCAB
    assert prefix_config({**cfg, "decoder_vocab_size": 1000}, 2)["decoder_vocab_size"] == 1000
    # gemma3n's per-layer embedding: a row per token id, 262 144 rows (512 MiB in the slice) for 509 ids
    gemma3n = {"model_type": "gemma3n_text", "num_hidden_layers": 35, "vocab_size": 262400,
               "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256}
    assert prefix_config(gemma3n, 2)["vocab_size_per_layer_input"] == SLICE_VOCAB


@pytest.mark.heavy                      # two trace processes (about 15 CPU s)
def test_a_trace_past_its_memory_cap_is_refused_in_one_line_and_the_next_one_runs(tmp_path, monkeypatch):
    """The trace process caps its heap below the memory free when it starts (measure/trace.py _memory_cap): rwkv's
    sweep config (64 wide, attention_hidden_size 4096 as its class derives it from the default width; the sweep's
    shrink keeps the two equal now) took its trace process to 23.6 GB of a 24 GiB machine and the kernel's OOM
    killer ended it (-9). Past the cap an allocation fails, the model is refused in one line that names the cap and
    how to raise it, and the next request gets a fresh process."""
    from scaletrain.measure.tiny_configs import config_dict

    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "traces"))
    monkeypatch.setenv("SCALETRAIN_TRACE_MEMORY_GB", "1.5")
    regime = {"method": "full", "lora_rank": 0, "lora_targets": None, "precision": "fp32", "attn": "eager"}
    traced._WORKER.stop()                        # a trace process started under the cap
    try:
        with pytest.raises(ScaletrainError) as e:
            traced.trace({**config_dict("rwkv"), "attention_hidden_size": 4096}, regime, "test")
        text = str(e.value)
        assert "out of memory at 1.5 GiB (SCALETRAIN_TRACE_MEMORY_GB)" in text and "\n" not in text, text
        assert traced._WORKER.proc is None           # its heap full to the cap, that process has ended
        answer, _ = traced.trace(config_dict("gpt_neo"), regime, "test")
        assert answer["activations"]["kinds"]
    finally:
        traced._WORKER.stop()


@pytest.mark.heavy                      # one trace process (about 10 CPU s)
def test_threads_trace_one_at_a_time_in_one_process_that_outlives_them(tmp_path, monkeypatch):
    """The wizard plans from threads (a solve per keystroke, the model step's warm-up). Two threads asking the
    trace process at once read each other's answers ("the trace answered in another format", or one regime's
    bytes filed under another's key), and a process started by a thread died with that thread (prctl's
    PR_SET_PDEATHSIG is per thread), so the next plan imported transformers again. Now: one trace at a time, each
    thread its own answer, one process for both, alive after the threads end, and `tracing_now` says what runs."""
    import threading
    import time

    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "traces"))
    traced._WORKER.stop()
    cfg = _config("phi3")
    full = _regime("phi3", "full")
    ckpt = dict(full, grad_ckpt=True)
    out: dict[str, object] = {}
    seen: list[tuple[str, float]] = []

    def first() -> None:
        out["first"] = traced.prefetch(cfg, [full], "test")

    def second() -> None:
        out["second"] = traced.activations(cfg, ckpt, "test")

    try:
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
            time.sleep(0.2)
        while any(t.is_alive() for t in threads):
            now = traced.tracing_now()
            if now is not None:
                seen.append(now)
            time.sleep(0.1)
        assert out["first"] == 1 and "seq_lens" in out["second"], out
        pid = traced._WORKER.proc.pid
        time.sleep(1.0)                                  # the threads that started and used it have ended
        assert traced._WORKER.proc.poll() is None
        assert traced.activations(cfg, ckpt, "test")["kinds"] == out["second"]["kinds"]      # the cache, now
        answer, cached = traced.trace(cfg, dict(full, attn="eager"), "test")
        assert not cached and traced._WORKER.proc.pid == pid and answer["activations"]["kinds"]
        assert traced.tracing_now() is None
        assert seen and all(what.startswith("phi3 (") and seconds >= 0 for what, seconds in seen)
    finally:
        traced._WORKER.stop()


@pytest.mark.heavy                      # a trace process importing torch (about 5 CPU s)
def test_the_trace_process_ends_with_the_planning_process_and_a_warm_up_builds_the_family(tmp_path):
    """A planning process killed outright (SIGKILL: no atexit) takes its trace process with it, even mid-trace.
    `warm` (the wizard, when a model is picked) starts the trace process and builds the family, caching its
    structure, and does nothing when that structure is cached."""
    import os
    import signal
    import time

    script = (
        "import json, os, sys\n"
        "from scaletrain.engine.catalog import traced\n"
        "from scaletrain.engine.catalog.architectures import catalog_entry\n"
        "cfg = dict(catalog_entry('scaletrain/tiny-granite')['config'])\n"
        "first, again = traced.warm(cfg), traced.warm(cfg)\n"
        "print(json.dumps([first, again, traced._WORKER.proc.pid]), flush=True)\n"
        "traced._WORKER.proc.stdin.write(json.dumps({'config': cfg, 'regime': {'method': 'full', 'lora_rank': 0, "
        "'lora_targets': None, 'precision': 'fp32', 'attn': 'sdpa'}}) + '\\n')\n"
        "traced._WORKER.proc.stdin.flush()\n"
        "import time; time.sleep(60)\n")
    env = dict(os.environ, SCALETRAIN_CACHE=str(tmp_path / "traces"))
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env,
                              stdin=subprocess.DEVNULL)
    try:
        first, again, child = json.loads(parent.stdout.readline())
        assert first is True and again is False
        assert list((tmp_path / "traces").rglob("*.json"))       # the structure, cached
        os.kill(parent.pid, signal.SIGKILL)                       # mid-trace: its regime was asked
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.path.exists(f"/proc/{child}"):
            time.sleep(0.2)
        status = open(f"/proc/{child}/status").read() if os.path.exists(f"/proc/{child}") else "gone"
        assert status == "gone" or "zombie" in status, status
    finally:
        parent.kill()


@pytest.mark.heavy                      # a trace process importing transformers (about 8 CPU s)
def test_ctrl_c_on_a_first_plan_ends_it_and_its_trace_process_at_once(tmp_path):
    """`scaletrain plan` interrupted while its first plan of a traced family traces: exit 130 within a second or
    two, its trace process gone with it (not waited for: it was mid-trace and nobody reads its answer), no cache
    file half written."""
    import os
    import signal
    import time

    env = dict(os.environ, SCALETRAIN_CACHE=str(tmp_path / "traces"))
    # SIGINT as a terminal leaves it: a suite started in the background (a non-interactive shell's `&`, as the
    # clean-clone run was) ignores SIGINT, a child inherits that, and Python then installs no KeyboardInterrupt
    # handler
    proc = subprocess.Popen([sys.executable, "-m", "scaletrain.tui.cli.main", "plan", "--model",
                             "scaletrain/tiny-glm4", "--gpus", "1xCPU", "--json"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        child = None
        deadline = time.monotonic() + 60
        while child is None and time.monotonic() < deadline:
            kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
            child = int(kids[0]) if kids else None
            time.sleep(0.1)
        assert child is not None, "no trace process started"
        time.sleep(1.0)                                          # importing transformers, mid-trace
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)                         # the planning process alone: not its group
        assert proc.wait(timeout=10) == 130
        assert time.monotonic() - t0 < 3, time.monotonic() - t0
        while time.monotonic() - t0 < 5 and os.path.exists(f"/proc/{child}"):
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{child}") or "zombie" in open(f"/proc/{child}/status").read()
        assert "interrupted" in proc.stderr.read()
        assert not list((tmp_path / "traces").rglob(".*.tmp"))              # atomic_write's temporaries
    finally:
        proc.kill()


@pytest.mark.heavy                      # one trace process, a 1 GB trace (about 15 CPU s)
def test_the_trace_process_hands_back_what_a_trace_freed(tmp_path):
    """The trace process lives as long as the planning process (a wizard session), idle between traces; glibc kept
    what a trace had freed, and zamba's sweep trace process held 14.3 GB idle beside the step the sweep then
    measured, which took the 24 GiB machine into reclaim. After each answer it returns the free heap: resident
    memory falls well below the trace's peak (here 0.38 of it; 0.83 without)."""
    import os
    import time

    from scaletrain.engine.probes import probe_argv

    cfg = dict(_config("phi3"), hidden_size=1024, intermediate_size=4096, num_attention_heads=16,
               num_key_value_heads=16, vocab_size=32064)
    proc = subprocess.Popen(probe_argv("trace", "--serve"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, SCALETRAIN_CACHE=str(tmp_path)))
    try:
        proc.stdin.write(json.dumps({"config": cfg, "regime": _regime("phi3", "full")}) + "\n")
        proc.stdin.flush()
        assert "ok" in json.loads(proc.stdout.readline())
        for _ in range(50):          # it answers first, then hands the memory back
            status = dict(line.split(":", 1) for line in open(f"/proc/{proc.pid}/status"))
            rss, peak = (int(status[k].split()[0]) for k in ("VmRSS", "VmHWM"))
            if rss <= 0.6 * peak:
                break
            time.sleep(0.1)
        assert rss <= 0.6 * peak, (rss, peak)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.mark.heavy                      # two trace processes, 4 regimes each (about 20 CPU s)
def test_served_regimes_traced_by_forked_copies_answer_as_one_process_does(tmp_path):
    """A first plan asks for 4 regimes at once; served, forked copies of the trace process trace them side by side
    (no second transformers import). Their answers are byte-identical to one process tracing them in turn, a regime
    that fails in a copy is traced again by the server and fails with the same line, and no copy outlives its
    answer."""
    import os

    from scaletrain.engine.probes import probe_argv

    cfg = _config("phi3")
    regimes = [dict(_regime("phi3", "full"), precision=p, **({"grad_ckpt": True} if ck else {}))
               for p in ("bf16", "bf16-pure") for ck in (False, True)]
    bad = [*regimes[:2], dict(regimes[0], attn="no_such_kernel")]
    answers = {}
    for copies in ("1", "4"):
        env = dict(os.environ, SCALETRAIN_CACHE=str(tmp_path), SCALETRAIN_TRACE_COPIES=copies)
        proc = subprocess.Popen(probe_argv("trace", "--serve"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=env)
        try:
            for what in (regimes, bad):
                proc.stdin.write(json.dumps({"config": cfg, "regime": None, "regimes": what}) + "\n")
                proc.stdin.flush()
                answers[copies, len(what)] = json.loads(proc.stdout.readline())
            children = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
            # CPU time of the children it waited for (/proc/PID/stat's cutime, clock ticks): the copies traced
            copies_cpu = int(open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[13])
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)
        assert children == []                                       # every copy ended with its answer
        assert (copies_cpu > 0) == (copies != "1"), (copies, copies_cpu)
    assert "ok" in answers["1", 4] and json.dumps(answers["1", 4], sort_keys=True) == \
        json.dumps(answers["4", 4], sort_keys=True)
    assert "error" in answers["1", 3] and answers["1", 3] == answers["4", 3]


@pytest.mark.heavy                      # two regimes traced in this process (about 5 CPU s)
def test_regimes_no_copy_could_be_forked_for_are_traced_by_the_server(monkeypatch):
    """Out of processes or memory, os.fork fails: the served trace answers every regime itself, as before copies."""
    import os

    from scaletrain.measure import trace

    def no_fork():
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(trace, "_SERVING", True)
    monkeypatch.setattr(trace, "_CAP", 16 << 30)
    monkeypatch.setenv("SCALETRAIN_TRACE_COPIES", "2")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "fork", no_fork)
    regimes = [_regime("phi3", "full"), dict(_regime("phi3", "full"), grad_ckpt=True)]
    assert trace._copies(len(regimes), trace.structure(_config("phi3"))) == 2
    answer = trace.run({"config": _config("phi3"), "regime": None, "regimes": regimes})
    by_regime = answer["activations_by_regime"]
    assert len(by_regime) == 2 and all(a["kinds"] and a["seq_lens"] for a in by_regime)

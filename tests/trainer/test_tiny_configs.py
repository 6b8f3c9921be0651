"""The sweep's tiny configs are ones transformers' own validators accept, and the traced structure gives peft
targets peft adapts (issue 28: nothing refused that transformers and peft build on CPU)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.heavy          # builds small models on the CPU


@pytest.mark.parametrize("model_type, check", [
    # sizes the class leaves None and needs at build (dots1's experts, hunyuan's head_dim) are filled
    ("hunyuan_v1_dense", lambda c: c["head_dim"] * c["num_attention_heads"] == c["hidden_size"]),
    # a rotary width within the shrunk head (codegen's default rotary_dim 64 on a 16-wide head failed the forward)
    ("codegen", lambda c: c["rotary_dim"] <= c["n_embd"] // c["n_head"]),
    # a mamba2 mixer's heads × head width = expand × hidden, as its validator demands
    ("mamba2", lambda c: c["num_heads"] * c["head_dim"] == c["expand"] * c["hidden_size"]),
    # a validator that ties the depth to another list (attention_types): the default depth kept
    ("gpt_neo", lambda c: c["num_layers"] == len(c["attention_layers"])),
    # key/value heads the class leaves None and divides by (nemotron's attention): every head its own
    ("nemotron", lambda c: c["num_key_value_heads"] == c["num_attention_heads"]),
    # widths tied to the shrunk ones: xlnet's d_head = d_model // n_head, xlstm's embedding_dim = hidden_size
    ("xlnet", lambda c: c["d_head"] * c["n_head"] == c["d_model"]),
    ("xlstm", lambda c: c["embedding_dim"] == c["hidden_size"]),
    # keys transformers' own model tester sets where the class defaults build nothing (TRANSFORMERS_KEYS)
    ("dbrx", lambda c: c["attn_config"]["clip_qkv"] == 8 and c["attn_config"]["rope_theta"] == 500000),
    ("lfm2_moe", lambda c: c["layer_types"][:2] == ["full_attention", "conv"]
     and len(c["layer_types"]) == c["num_hidden_layers"]),
    ("cohere_compass_text", lambda c: c["rope_parameters"]["full_attention"]["rope_theta"] == 10000),
    ("qwen4_exp", lambda c: c["model_type"] == "qwen4_exp_text"
     and c["indexer_budget"] % c["indexer_compress_ratio"] == 0),
    ("reformer", lambda c: c["axial_pos_embds"] is False and c["is_decoder"] is True),
])
def test_the_shrunk_config_is_one_transformers_builds(model_type, check):
    from transformers import AutoConfig

    from scaletrain.measure import tiny_configs as tc

    cfg = tc.config_dict(model_type)
    assert tc.builds(cfg) and check(cfg), cfg
    plain = tc.shrink(AutoConfig.for_model(model_type).to_dict(), model_type)
    assert not tc.builds(plain)           # the plain shrink alone is what the sweep refused before


def test_widths_the_class_derived_at_full_size_are_derived_again_from_the_shrunk_ones():
    """zamba2 (refused before: "num_hidden_layers (6) must be equal to the number of layer_types (54)", then a
    mamba head width of 640 on a 64-wide model): its attention reads the concatenated embeddings (2 × hidden), its
    head width and kv channels follow the heads, its mamba heads × head width = expand × hidden. dots3's per-layer
    overrides (64 heads, kv_lora_rank 1024, a 192-wide nope head on the sliding layers) shrink with the rest, their
    key/value heads as many as the heads, and the sliding layers' head_dim stays nope + rope as its validator
    demands. Both build; the rungs before built neither."""
    from transformers import AutoConfig

    from scaletrain.measure import tiny_configs as tc

    z = tc.config_dict("zamba2")
    assert z["attention_hidden_size"] == 2 * z["hidden_size"]
    assert z["attention_head_dim"] * z["num_attention_heads"] == 2 * z["hidden_size"]
    assert z["n_mamba_heads"] * z["mamba_headdim"] == z["mamba_expand"] * z["hidden_size"]
    assert tc.builds(z) and tc.meta_parameters(z) < 1_000_000
    d = tc.config_dict("dots3_note")
    swa = next(o for o in d["per_layer_config"].values() if "qk_nope_head_dim" in o)
    assert swa["num_key_value_heads"] == swa["num_attention_heads"] <= tc.SIZES["num_attention_heads"]
    assert d["head_dim"] == swa["qk_nope_head_dim"] + d["qk_rope_head_dim"] and tc.builds(d)
    defaults = AutoConfig.for_model("zamba2").to_dict()
    assert not any(tc.builds(tc.shrink(defaults, "zamba2", **r)) for r in tc.RUNGS[:4])


def test_a_text_config_that_the_auto_mapping_does_not_list_builds_with_its_familys_causal_lm():
    """mllama's and emu3's config.json keep the language model under text_config (model_type mllama_text_model),
    which AutoModelForCausalLM does not map: their family's causal-LM class takes it (its config class), as the
    engine's plan of the config.json reads it. Both were refused ("Unrecognized configuration class")."""
    from scaletrain.measure import tiny_configs as tc
    from scaletrain.trainer.model import hf_config, random_init

    cfg = tc.config_dict("mllama")
    assert cfg["model_type"] == "mllama_text_model" and tc.builds(cfg)
    assert type(random_init(hf_config(cfg), "sdpa", device=None)).__name__ == "MllamaForCausalLM"


def test_a_bart_style_decoder_gets_heads_that_divide_its_shrunk_width():
    """plbart's 12 decoder heads do not divide the shrunk d_model of 64 ("embed_dim must be divisible by num_heads":
    the sweep listed it as refused); heads that divide it, as bart's 16 do, are left as the class wrote them."""
    from scaletrain.measure import tiny_configs as tc

    cfg = tc.config_dict("plbart")
    assert cfg["d_model"] % cfg["decoder_attention_heads"] == 0 and tc.builds(cfg)
    assert tc.config_dict("bart")["decoder_attention_heads"] == 16


def test_a_family_that_needs_a_default_language_gets_one_of_its_own():
    """xmod's defaults name no default language, and transformers runs no forward of it without one (it asks for
    set_default_language()): the shrunk config names the first of its own `languages`, as that call would."""
    from scaletrain.measure import tiny_configs as tc

    cfg = tc.config_dict("xmod")
    assert cfg["default_language"] == cfg["languages"][0] and tc.builds(cfg)
    why = tc.build_error({**cfg, "default_language": None})
    assert why and "set_default_language" in why
    # a user's config without one: the trace says which key to set (a scaletrain user calls no Python method)
    from scaletrain.measure.trace import TraceError, run

    with pytest.raises(TraceError,
                       match=r'set "default_language" in its config.json to one of its languages \(en_XX\)'):
        run({"config": {**cfg, "default_language": None}})


_REFORMER = {"model_type": "reformer", "vocab_size": 512, "hidden_size": 64, "num_attention_heads": 2,
             "attention_head_size": 32, "feed_forward_size": 128, "attn_layers": ["local", "lsh", "local", "lsh"],
             "num_hidden_layers": 4, "axial_pos_embds": False, "is_decoder": True, "max_position_embeddings": 512,
             "num_buckets": 4, "lsh_attn_chunk_length": 64, "local_attn_chunk_length": 64, "use_cache": False}


def test_a_reversible_stack_is_planned_as_the_profiler_measures_it():
    """reformer's layers run under no_grad in the forward and are recomputed, last first, inside their own autograd
    Function's backward. The trace opens each layer's backward window where its parts run there, over what the
    Function keeps (its saved outputs, the rebuilt hidden states and their gradients): planned -17 % before it
    was refused, then refused (TRACE_FORMAT 23); now within the sweep's bounds of a full build's step."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import architecture_sweep as sweep

    from scaletrain.measure import tiny_configs as tc

    assert tc.builds(_REFORMER)
    row = sweep.one_family("reformer", cases=(("full", False),), config=_REFORMER)
    assert "refused" not in row, row.get("refused")
    (case,) = row["cases"]
    assert case["params_exact"], case
    assert -0.02 <= case["error"] <= 0.05, case


def test_a_forward_that_writes_its_config_is_refused_naming_the_key():
    """Unset, reformer's num_buckets is set by its first hashed forward from that forward's length: a trace at
    other lengths (and a real run's first batch) would run another model than the planned one. Refused in one
    line that names the key; LoRA, whose frozen embedding gives the reversible Function's input no gradient (no
    adapter trains), too."""
    from scaletrain.measure.trace import TraceError, run

    full = {"method": "full", "precision": "fp32", "attn": "eager"}
    with pytest.raises(TraceError, match=r"^its forward sets config num_buckets .* set num_buckets in config.json$"):
        run({"config": {**_REFORMER, "num_buckets": None}, "regime": full})
    with pytest.raises(TraceError, match=r"^no trainable parameter gets a gradient from its loss: .*--method full"):
        run({"config": _REFORMER, "regime": {**full, "method": "lora", "lora_rank": 4}})


def _git() -> dict:
    """git's shrunk config with a small vision tower (its class defaults: 12 layers 768 wide, 86 M parameters)."""
    from scaletrain.measure import tiny_configs as tc

    cfg = tc.config_dict("git")
    cfg["vision_config"] = {**cfg["vision_config"], "hidden_size": 32, "intermediate_size": 64,
                            "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 32}
    return cfg


def test_a_family_whose_own_loss_fails_on_text_is_planned_and_measured_with_the_chunked_loss(tmp_path):
    """git's loss slices off its image-token positions even with no image, so transformers' own loss fails on a
    text batch: the standard loss is refused in one line naming --loss chunked, and the chunked loss (the trainer's,
    which git's biased lm_head now runs through) is traced as it runs and planned within the sweep's bounds of the
    profiler. Its vision tower gets no gradient: no optimizer state and no for-loop AdamW temporaries of its
    largest tensor (the sweep's git, full: +1.3 % before). Its LoRA + checkpointing fails in transformers (the
    frozen embedding's output made a leaf that requires grad, then added to in place): that regime is refused, and
    a LoRA plan is searched without checkpointing rather than refused whole."""
    import json
    import sys
    from pathlib import Path

    from scaletrain.engine.errors import ScaletrainError
    from scaletrain.engine.plan.planner import make_plan
    from scaletrain.engine.request.request import PlanRequest
    from scaletrain.measure.trace import TraceError, run

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import architecture_sweep as sweep

    cfg = _git()
    row = sweep.one_family("git", cases=(("full", False),), config=cfg)
    assert "refused" not in row, row.get("refused")
    assert row["loss"] == "chunked" and "own loss for it fails on a batch of text" in row["standard_loss_refused"]
    assert "--loss chunked" in row["standard_loss_refused"]
    (case,) = row["cases"]
    assert case["params_exact"], case
    assert -0.02 <= case["error"] <= 0.05, case
    with pytest.raises(TraceError, match=r"^LoRA \+ checkpointing fails in its forward: .*without --grad-ckpt$"):
        run({"config": cfg, "regime": {"method": "lora", "lora_rank": 4, "precision": "fp32", "attn": "eager",
                                       "grad_ckpt": True, "loss": "chunked"}})
    model = tmp_path / "git"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(cfg))
    req = dict(model=str(model), gpus="1xCPU", method="lora", attn="eager", seq_len=128, micro_batch=2,
               grad_accum=1, strategy="ddp", offload="none", loss="chunked")
    plan = make_plan(PlanRequest(**req))
    assert plan.setup.grad_ckpt is False and plan.fits
    with pytest.raises(ScaletrainError, match="without --grad-ckpt"):
        make_plan(PlanRequest(**{**req, "grad_ckpt": True}))
    # the vision tower gets no gradient: none in one process, none in DDP's buckets either (the trainer freezes it)
    full = {**req, "method": "full", "grad_ckpt": False}
    one, two = (make_plan(PlanRequest(**{**full, "gpus": g})) for g in ("1xCPU", "2xCPU"))
    from scaletrain.measure.trace_structure import meta_model

    tower = sum(p.numel() for n, p in meta_model(cfg).named_parameters()
                if n.startswith(("git.image_encoder.", "git.visual_projection.")))
    assert tower > 0 and two.memory.gradients_bytes == 4 * (two.setup.trainable_params - tower)
    assert one.memory.optimizer_bytes == two.memory.optimizer_bytes     # AdamW's state: the stepped ones only


def test_a_config_transformers_does_not_build_is_the_configs_refusal_not_the_engines():
    """The sweep asks transformers first: a shrunk config it does not build as a causal LM (its own defaults do not
    run on text: musicgen's decoder takes 4 codebooks of audio codes a position) is refused by 'config' with
    transformers' error, so the engine's refusals are the engine's."""
    import sys
    from pathlib import Path

    from scaletrain.measure import tiny_configs as tc

    assert tc.build_error(tc.config_dict("llama")) is None
    cfg = tc.config_dict("musicgen")
    assert cfg["model_type"] == "musicgen_decoder"        # the part its causal-LM class is built from
    why = tc.build_error(cfg)
    assert why and "[-1, 4, 16]" in why and "\n" not in why
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from architecture_sweep import one_family

    row = one_family("musicgen", ())
    assert row["refused"].startswith("config: transformers does not build it as a causal LM: ")


def test_a_config_of_nested_parts_is_shrunk_whole_and_a_wide_rung_is_not_built():
    """blt: a vocabulary of its own name (encoder_hash_byte_group_vocab, 500 002 rows a group) and a width that names
    another part's hidden size (encoder_config.hidden_size_global: global_config's 2048) shrink with the rest; the
    plain rung, sub-configs still at full width, holds 1.56 B parameters and is not built (it ran the sweep out of
    memory): the config is the sub-configs' rung, and it builds."""
    from transformers import AutoConfig

    from scaletrain.measure import tiny_configs as tc

    defaults = AutoConfig.for_model("blt").to_dict()
    plain = tc.shrink(defaults, "blt")
    assert plain["encoder_hash_byte_group_vocab"] == tc.VOCAB
    assert tc.meta_parameters(plain) > tc.MAX_TINY_PARAMETERS
    cfg = tc.config_dict("blt")
    assert cfg["encoder_config"]["hidden_size_global"] == cfg["global_config"]["hidden_size"] == tc.HIDDEN
    assert tc.meta_parameters(cfg) < 2_000_000 and tc.builds(cfg)
    # a width equal to its own part's hidden size under another name stays (embedding_gemma2's per-layer input)
    gemma = AutoConfig.for_model("embedding_gemma2_text").to_dict()
    assert tc.shrink(gemma, "embedding_gemma2_text")["hidden_size_per_layer_input"] == gemma["hidden_size_per_layer_input"]


def test_a_plain_family_keeps_its_plain_shrink():
    """Families that built before keep the same config (their recorded sweep rows stand)."""
    from transformers import AutoConfig

    from scaletrain.measure import tiny_configs as tc

    assert tc.config_dict("llama") == tc.shrink(AutoConfig.for_model("llama").to_dict(), "llama")


def test_default_lora_targets_are_what_peft_adapts(tmp_path, monkeypatch):
    """ctrl's feed-forward is a Sequential (linears named 0 and 2: to peft's suffix match, the decoder layers
    themselves) and peft refuses LoRA on a mamba mixer's out_proj: the traced default targets name the first by
    their path in the block and leave the second out, and peft adapts them all. peft is asked apart from the
    structure (a LoRA plan's question), through the engine's trace process and its cache."""
    from scaletrain.engine.catalog.architectures import arch_from_config
    from scaletrain.measure.tiny_configs import config_dict
    from scaletrain.measure.trace_structure import lora_count, peft_refuses, structure

    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path))
    cfg = config_dict("ctrl")
    st = structure(cfg)
    assert {"ffn.0", "ffn.2"} <= set(st["linears"]) and not peft_refuses(cfg, list(st["linears"]))
    assert lora_count(cfg, list(st["linears"]))["adapted"] == 6 * cfg["n_layer"]
    cfg = config_dict("mamba")
    st = structure(cfg)
    assert "peft_refuses" not in st and peft_refuses(cfg, list(st["linears"])) == ["out_proj"]
    targets = arch_from_config(cfg, "tiny-mamba", st).default_lora_targets
    assert "out_proj" not in targets and "in_proj" in targets
    assert lora_count(cfg, list(targets))["adapted"] == len(targets) * cfg["num_hidden_layers"]


def test_decoders_of_encoder_decoder_families_and_hyphenated_types_are_traced(tmp_path, monkeypatch):
    """bart's ForCausalLM is its decoder alone (decoder_layers deep; refused before as "names no number of
    layers"), and model_types such as bert-generation carry a hyphen (refused before as "no model_type transformers
    could know"): both plan on the traced path."""
    from scaletrain.engine.catalog import traced
    from scaletrain.engine.catalog.architectures import arch_from_config
    from scaletrain.measure.tiny_configs import config_dict
    from scaletrain.measure.trace_structure import prefix_config

    cfg = config_dict("bart")
    cut = prefix_config(cfg, 2)
    assert cut["decoder_layers"] == 2 and cut["encoder_layers"] == cfg["encoder_layers"]
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path))
    traced._WORKER.stop()
    arch = arch_from_config(config_dict("bert-generation"), "tiny-bert-generation")
    assert arch.memory_source == "traced" and arch.params > 0



@pytest.mark.long                       # a fresh interpreter importing torch and transformers
def test_a_full_plans_trace_never_imports_peft():
    """peft's import (bitsandbytes, torch inductor) cost more than torch's in the first plan of a traced family
    (bench/results/trace_latency-vm.json): the structure and a full regime's activations are traced without it."""
    import json
    import subprocess
    import sys

    code = ("import json, sys; from scaletrain.measure.trace import run; from scaletrain.measure.tiny_configs import "
            "config_dict; r = run({'config': config_dict('ctrl'), 'regime': json.loads(sys.argv[1])}); "
            "print(json.dumps(['peft' in sys.modules, sorted(r)]))")
    regime = {"method": "full", "lora_rank": 0, "lora_targets": None, "precision": "fp32", "attn": "eager"}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(regime)], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=600, check=True).stdout.splitlines()[-1]
    assert json.loads(out) == [False, ["activations", "format", "model_type", "structure"]]


@pytest.mark.slow
def test_a_reversible_stack_with_a_parameter_no_step_reaches_trains_on_two_ddp_ranks(tmp_path):
    """transformers 5 leaves reformer's lm_head.bias untied from its decoder, so no step gives it a gradient, and
    DDP's reducer, waiting for it, failed the second step ("Expected to have finished reduction in the prior
    iteration"; find_unused_parameters fails the reversible layers instead: "marked as ready twice"). The trace
    names it, plan.json carries the name, and the trainer freezes it under DDP: the run trains as planned."""
    import json
    import os
    import subprocess
    import sys

    from scaletrain.engine.run.metrics import read_metrics

    model = tmp_path / "reformer"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(_REFORMER))
    run = tmp_path / "run"
    scaletrain = os.path.join(os.path.dirname(sys.executable), "scaletrain")
    r = subprocess.run([scaletrain, "--preset", "cpu-tiny", "--headless", "--model", str(model), "--attn", "eager",
                        "--run-dir", str(run), "--set", "train.max_steps=3"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=420)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:], (run / "logs" / "rank-0.log").read_text()[-3000:])
    plan = json.loads((run / "plan.json").read_text())
    assert plan["model"]["without_gradient"] == {"names": ["lm_head.bias"]}
    series = read_metrics(run / "metrics.jsonl")
    assert [s.step for s in series] == [1, 2, 3] and all(s.world_size == 2 for s in series)

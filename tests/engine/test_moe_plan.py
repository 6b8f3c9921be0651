"""MoE in the plan: total vs active parameters and the experts implementation in `plan --json` and the text,
FLOPs from the active parameters, the experts' dtype under autocast, the notes an MoE user needs, and the three MoE
presets planned and dry-run into files accelerate and DeepSpeed accept."""

from __future__ import annotations

import json

import pytest

from scaletrain.engine.catalog.architectures import load_model
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.estimate.moe_time import experts_dtype_bytes
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.estimate.timing import estimate_time, sample_flops
from scaletrain.tui.cli.main import main
from test_writers import parse_run_dirs

MOE_PRESETS = ("gptoss20b-lora-h100", "qwen3moe30b-lora-8xh100", "qwen3moe30b-full-2x8xh100")


def _plan_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _setup(model: str, **kw) -> TrainingSetup:
    base = dict(model=load_model(model), hardware=parse_gpus("8xH100"), method="full", strategy="zero3",
                precision="bf16", grad_ckpt=True, micro_batch=1, seq_len=4096)
    base.update(kw)
    return TrainingSetup(**base)


def test_plan_json_and_text_name_total_active_and_the_experts_implementation(capsys):
    arch = load_model("Qwen/Qwen3-30B-A3B")
    doc = _plan_json(capsys, "--model", "Qwen/Qwen3-30B-A3B", "--gpus", "8xH100", "--method", "lora")
    model = doc["model"]
    assert model["params"] == arch.params == 30_532_122_624
    assert model["active_params"] == arch.active_params and 3.0e9 < arch.active_params < 3.5e9   # "A3B"
    assert model["moe"]["experts"] == 128 and model["moe"]["top_k"] == 8
    assert model["moe"]["experts_implementation"] == "grouped_mm" and model["moe"]["expert_parallelism"] is False
    assert any("no expert parallelism" in n for n in doc["notes"])
    assert main(["plan", "--model", "Qwen/Qwen3-30B-A3B", "--gpus", "8xH100", "--method", "lora"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (f"MoE: {arch.params:,} total, {arch.active_params:,} active per token · 128 experts, top 8 · "
            "experts grouped_mm") in text
    dense = _plan_json(capsys, "--model", "Qwen/Qwen3-4B", "--gpus", "8xH100")
    assert dense["model"]["active_params"] == dense["model"]["params"] and "moe" not in dense["model"]


def test_moe_flops_come_from_the_active_parameters():
    """Forward FLOPs = 2 × the parameters a token multiplies (the active ones, less the embedding lookup) × tokens
    + the attention core; a dense model with the same total would be ~9× more."""
    s = _setup("Qwen/Qwen3-30B-A3B", grad_ckpt=False)
    m = s.model
    tokens = s.seq_len
    fl = sample_flops(s, tokens)
    attn = 2 * 2 * tokens * tokens * 0.5 * m.q_dim * m.num_layers           # causal (flash skips half)
    matmul_params = m.active_params - m.embedding_params
    assert fl.forward == pytest.approx(2 * matmul_params * tokens + attn, rel=0.01)
    assert fl.forward < 2 * (m.params - m.embedding_params) * tokens / 5
    # full fine-tuning trains the experts (weight gradients), LoRA does not
    lora = sample_flops(s.with_(method="lora", lora_rank=8, lora_targets=("q_proj", "v_proj")), tokens)
    assert fl.backward - lora.backward == pytest.approx(2 * matmul_params * tokens, rel=0.02)


def test_thin_expert_gemms_cost_more_per_token():
    """Each expert sees t·k/E rows: at a short micro-step (t = 256 → 16 rows per expert) the routed GEMMs run far
    below their efficiency at t = 8192 (512 rows)."""
    short = estimate_time(_setup("Qwen/Qwen3-30B-A3B", seq_len=256, grad_ckpt=False))
    long = estimate_time(_setup("Qwen/Qwen3-30B-A3B", seq_len=8192, grad_ckpt=False))
    assert short.micro.matmul / 256 > 1.5 * long.micro.matmul / 8192


def test_grouped_mm_experts_run_in_the_weights_dtype_under_autocast():
    """grouped_mm is not autocast-enabled: fp32 master weights under accelerate's autocast run the experts in
    fp32 (slower, said in the assumptions); bf16 weights (DeepSpeed, --master-weights bf16) or eager do not."""
    s = _setup("Qwen/Qwen3-30B-A3B", strategy="ddp", hardware=parse_gpus("1xH100"), method="full")
    assert experts_dtype_bytes(s) == 4
    assert any("experts compute in fp32" in a for a in estimate_time(s).assumptions)
    assert experts_dtype_bytes(s.with_(master_weights="bf16")) == 2
    assert experts_dtype_bytes(s.with_(strategy="zero3")) == 2            # DeepSpeed casts the module to 16-bit
    assert experts_dtype_bytes(s.with_(experts_impl="eager")) == 2
    fp32 = estimate_time(s).micro.matmul
    assert estimate_time(s.with_(master_weights="bf16")).micro.matmul < fp32


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_moe_presets_plan_and_fit(name, capsys):
    doc = _plan_json(capsys, "--preset", name)
    assert doc["memory"]["fits"] and doc["model"]["moe"]["experts"] >= 32
    notes = " ".join(doc["notes"])
    if "zero3" == doc["training"]["strategy"]:
        assert "leaf module" in notes
    if name.startswith("gptoss"):
        assert doc["training"]["attn"] == "eager" and "MXFP4" in notes


@pytest.mark.long
def test_moe_presets_dry_run_into_files_accelerate_and_deepspeed_accept(tmp_path):
    items = []
    for name in MOE_PRESETS:
        run = tmp_path / name
        assert main(["--preset", name, "--headless", "--dry-run", "--run-dir", str(run)]) == 0
        doc = json.loads((run / "plan.json").read_text())
        items.append({"key": name, "dir": str(run), "world": doc["hardware"]["world_size"]})
    parsed = parse_run_dirs(items)
    assert all("ok" in parsed[name] for name in MOE_PRESETS), parsed


def test_gpt_oss_without_sdpa_is_one_line(capsys):
    """transformers has no sdpa path for gpt_oss (attention sinks): planning it with sdpa would launch a run that
    raises at model build, so the plan refuses it in one line naming what is accepted."""
    assert main(["plan", "--model", "openai/gpt-oss-20b", "--gpus", "1xH100", "--method", "lora"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no sdpa attention" in err[0] and "--attn eager or flash" in err[0]
    assert main(["plan", "--model", "openai/gpt-oss-20b", "--gpus", "1xH100", "--method", "lora", "--attn",
                 "eager"]) == 0


def test_experts_impl_is_a_plan_field(capsys):
    """--experts-impl (one declaration in the field table): the plan counts eager's per-expert copies and names it;
    the run directory records it for the trainer."""
    grouped = _plan_json(capsys, "--model", "scaletrain/tiny-qwen3-moe", "--gpus", "1xCPU", "--micro-batch", "2",
                         "--seq-len", "256", "--grad-accum", "1", "--no-grad-ckpt")
    eager = _plan_json(capsys, "--model", "scaletrain/tiny-qwen3-moe", "--gpus", "1xCPU", "--micro-batch", "2",
                       "--seq-len", "256", "--grad-accum", "1", "--no-grad-ckpt", "--experts-impl", "eager")
    assert grouped["model"]["moe"]["experts_implementation"] == "grouped_mm"
    assert eager["model"]["moe"]["experts_implementation"] == "eager"
    assert eager["training"]["experts_impl"] == "eager"
    assert eager["memory"]["allocated_peak_bytes"] > grouped["memory"]["allocated_peak_bytes"]   # eager keeps more
    assert main(["plan", "--model", "scaletrain/tiny-qwen3-moe", "--gpus", "1xCPU", "--experts-impl", "fast"]) == 2
    assert not [n for n in eager["notes"] if "--experts-impl" in n]
    # a dense model: the flag changes nothing, and the plan says so instead of taking it in silence
    dense = _plan_json(capsys, "--model", "scaletrain/tiny-qwen2", "--gpus", "1xCPU", "--experts-impl", "eager")
    assert "--experts-impl eager changes nothing for scaletrain/tiny-qwen2: it has no routed experts" in dense["notes"]
    assert not [n for n in _plan_json(capsys, "--model", "scaletrain/tiny-qwen2", "--gpus", "1xCPU")["notes"]
                if "--experts-impl" in n]


def test_grpo_prefill_runs_the_experts_a_prompt_token_is_routed_to():
    """GRPO's generation prefills the prompts through every block: an MoE's routed experts too (they were left out,
    and a top-8 model prefilled as fast as a top-2 one)."""
    from dataclasses import replace

    arch = load_model("Qwen/Qwen3-30B-A3B")
    fewer = replace(arch, moe=replace(arch.moe, top_k=2))
    grpo = dict(objective="grpo", num_generations=8, prompt_len=512, seq_len=1024, micro_batch=8, grad_accum=1,
                method="lora", strategy="ddp", hardware=parse_gpus("1xH200"))
    top8, top2 = (estimate_time(TrainingSetup(model=a, precision="bf16", **grpo)).generation for a in (arch, fewer))
    assert top8.prefill > top2.prefill > 0
    assert top8.decode == top2.decode           # a decode step reads every weight either way

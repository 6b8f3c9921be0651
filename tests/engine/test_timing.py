"""Time model: exact step arithmetic, FLOP accounting from the architecture, and the modelled effects
(communication, overlap, QLoRA dequantization, offload) moving the prediction the way they must."""

from __future__ import annotations

import json
import math

import pytest

from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.catalog.architectures import load_model
from scaletrain.engine.request.request import PlanRequest, base_setup
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.estimate.time_constants import DEFAULT_CONSTANTS
from scaletrain.engine.estimate.timing import bus_bandwidth, estimate_time, sample_flops
from scaletrain.tui.cli.main import main

QWEN3_4B = "Qwen/Qwen3-4B"


def _seed_setup(gpus: str = "8xRTX4090", **kw) -> TrainingSetup:
    """Seed 000's configuration: Qwen3-4B full, ZeRO-3, micro 2 × accum 8, seq 2048, checkpointing."""
    req = PlanRequest(model=QWEN3_4B, gpus=gpus, strategy="zero3", micro_batch=2, grad_accum=8,
                      grad_ckpt=True, offload="none", seq_len=2048, dataset_size=160_791)
    return base_setup(req).with_(**kw) if kw else base_setup(req)


def test_steps_per_epoch_follow_the_loop_and_epoch_time_follows():
    """HF Trainer (the seed's count) keeps the last partial step: ceil; the bundled trainer shards the rows per rank
    and drops it (trainer/train.make_schedule): floor."""
    s = _seed_setup().with_(loop="hf-trainer")
    t = estimate_time(s)
    assert s.effective_batch == 128
    assert estimate_time(s.with_(loop="trainer")).steps_per_epoch == (160_791 // 8) // 2 // 8 == 1256
    assert t.steps_per_epoch == math.ceil(160_791 / 128) == 1257
    assert t.epoch_seconds == pytest.approx(1257 * t.step_seconds)
    assert t.total_seconds == pytest.approx(t.epoch_seconds)
    t15 = estimate_time(s.with_(epochs=1.5))
    assert t15.total_steps == math.ceil(1257 * 1.5) == 1886
    assert t15.total_seconds == pytest.approx(1886 * t15.step_seconds)
    assert estimate_time(s.with_(dataset_size=None)).steps_per_epoch is None


def test_sixteen_gpus_at_256_give_629_steps_and_a_sublinear_speedup():
    s8 = _seed_setup("8xRTX4090").with_(loop="hf-trainer")          # the seed's count (ceil)
    s16 = _seed_setup("2x8xRTX4090").with_(loop="hf-trainer")
    assert s16.effective_batch == 256
    t8, t16 = estimate_time(s8), estimate_time(s16)
    assert t16.steps_per_epoch == math.ceil(160_791 / 256) == 629
    speedup = t8.epoch_seconds / t16.epoch_seconds
    assert 1.0 < speedup < 2.0
    # the per-GPU matmuls are identical; each GPU copies a smaller ZeRO-3 shard, and what grows is the
    # collectives' (n-1)/n share over PCIe without P2P
    assert t16.micro.matmul == pytest.approx(t8.micro.matmul)
    assert t16.micro.gathers < t8.micro.gathers
    assert t16.communication_seconds > t8.communication_seconds


def test_forward_flops_are_two_per_weight_per_token_plus_attention():
    m = load_model(QWEN3_4B)
    s = _seed_setup(grad_ckpt=False)
    block_weights = sum(i * o for i, o, _ in m.linear_shapes().values())
    p_active = m.num_layers * block_weights + m.vocab_size * m.hidden_size  # tied: lm_head reuses the embedding
    one = sample_flops(s, 1)
    assert one.forward == pytest.approx(2 * p_active + 2 * m.q_dim * m.num_layers)  # causal s=1: QK + AV, halved
    f = sample_flops(s, 2048)
    attention = f.forward - 2 * p_active * 2048
    assert attention == pytest.approx(4 * 0.5 * 2048**2 * m.q_dim * m.num_layers)
    assert sample_flops(s.with_(attn="eager"), 2048).forward - 2 * p_active * 2048 == pytest.approx(2 * attention)


def test_backward_and_recompute_accounting():
    s = _seed_setup(grad_ckpt=False)
    full = sample_flops(s, 2048)
    assert full.backward == pytest.approx(2 * full.forward)          # dgrad + wgrad for every GEMM
    assert full.recompute == 0
    ck = sample_flops(s.with_(grad_ckpt=True), 2048)
    assert full.forward * 0.8 < ck.recompute < full.forward          # blocks re-run, lm_head does not
    lora = sample_flops(s.with_(method="lora"), 2048)
    assert lora.forward > full.forward                               # adapters add a little
    assert lora.backward < 0.6 * full.backward                       # frozen weights skip wgrad
    assert estimate_time(s.with_(method="lora")).model_flops_per_step < estimate_time(s).model_flops_per_step


def test_mfu_is_model_flops_over_the_predicted_step_and_calibration_scales_the_micro_steps():
    s = _seed_setup()
    t = estimate_time(s)
    assert 0 < t.mfu < 1
    assert t.mfu == pytest.approx(t.model_flops_per_step / (t.step_seconds * t.peak_flops))
    slower = estimate_time(s, DEFAULT_CONSTANTS.with_(compute_scale=2.0))
    assert slower.compute_seconds == pytest.approx(2 * t.compute_seconds)
    assert slower.optimizer_seconds == pytest.approx(t.optimizer_seconds)   # the step is not a micro-step term
    assert slower.mfu < t.mfu


def test_geforce_without_p2p_and_slow_inter_node_links_are_slower():
    l40s = base_setup(PlanRequest(model=QWEN3_4B, gpus="8xL40S"))
    r4090 = base_setup(PlanRequest(model=QWEN3_4B, gpus="8xRTX4090"))
    assert l40s.hardware.gpu.interconnect == r4090.hardware.gpu.interconnect == "pcie4"
    assert bus_bandwidth(r4090)[0] < bus_bandwidth(l40s)[0]
    fast = _seed_setup("2x8xH100")
    slow = fast.with_(hardware=parse_gpus("2x8xH100", inter_node_gbps=10))
    bw, what = bus_bandwidth(slow)
    assert bw == pytest.approx(10 / 8 * DEFAULT_CONSTANTS.inter_node_efficiency * 1e9)
    assert "inter-node" in what
    assert estimate_time(slow).step_seconds > estimate_time(fast).step_seconds
    assert estimate_time(fast.with_(hardware=parse_gpus("1xH100"))).communication_seconds == 0


def test_strategy_communication_rules():
    s = _seed_setup("8xH100", grad_ckpt=False)
    ddp, z2, z3 = (estimate_time(s.with_(strategy=x)) for x in ("ddp", "zero2", "zero3"))
    # ZeRO-3 gathers the parameters every micro-step; DDP all-reduces once per optimizer step
    assert z3.communication_seconds > z2.communication_seconds > 0
    assert z3.communication_seconds > ddp.communication_seconds > 0
    assert estimate_time(s.with_(strategy="zero3", grad_ckpt=True)).communication_seconds > z3.communication_seconds
    # fewer, larger micro-steps mean fewer ZeRO-3 gathers per sample
    assert (estimate_time(s.with_(strategy="zero3", micro_batch=4, grad_accum=4)).communication_seconds
            < z3.communication_seconds)


def test_qlora_pays_dequantization_and_offload_pays_cpu_adam():
    s = _seed_setup("1xRTX4090", strategy="zero2", grad_ckpt=True)
    lora = estimate_time(s.with_(method="lora"))
    qlora = estimate_time(s.with_(method="qlora", base_bits=4))
    assert lora.dequant_seconds == 0 and qlora.dequant_seconds > 0
    assert qlora.step_seconds > lora.step_seconds
    off = estimate_time(s.with_(offload="optimizer"))
    on_gpu = estimate_time(s)
    assert off.offload_seconds > 0 and on_gpu.offload_seconds == 0
    assert off.optimizer_seconds > on_gpu.optimizer_seconds          # CPU-Adam is host-memory bound
    assert any("CPU-Adam" in a for a in off.assumptions)


def test_tokens_per_sample_override():
    s = _seed_setup()
    short = estimate_time(s.with_(tokens_per_sample=512))
    assert short.tokens_per_step == 128 * 512
    assert estimate_time(s).tokens_per_step == 128 * 2048
    assert short.step_seconds < estimate_time(s).step_seconds
    assert any("--tokens-per-sample" in a for a in short.assumptions)


def test_plan_json_time_keys_and_cli_prints_assumptions(capsys):
    args = ["plan", "--model", QWEN3_4B, "--gpus", "8xRTX4090", "--strategy", "zero3", "--micro-batch", "2",
            "--grad-accum", "8", "--grad-ckpt", "--offload", "none", "--seq-len", "2048",
            "--dataset-size", "160791", "--epochs", "2", "--loop", "hf-trainer"]
    assert main([*args, "--json"]) == 0
    t = json.loads(capsys.readouterr().out)["time"]
    for key in ("step_seconds", "tokens_per_second", "steps_per_epoch", "epoch_seconds", "total_seconds", "mfu"):
        assert isinstance(t[key], (int, float)) and t[key] > 0, key
    assert t["steps_per_epoch"] == 1257 and t["total_steps"] == 2514
    assert t["total_seconds"] == pytest.approx(2 * t["epoch_seconds"])
    assert t["tokens_per_second"] == pytest.approx(128 * 2048 / t["step_seconds"])
    assert t["assumptions"] and all(isinstance(a, str) for a in t["assumptions"])
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "1,257 steps/epoch" in out and "assumes:" in out


def test_fully_fixed_plan_time_matches_engine():
    plan = make_plan(PlanRequest(model=QWEN3_4B, gpus="8xRTX4090", strategy="zero3", micro_batch=2, grad_accum=8,
                                 grad_ckpt=True, offload="none", dataset_size=160_791))
    assert plan.time.step_seconds == estimate_time(plan.setup).step_seconds


def test_cpu_plans_are_bound_by_activation_traffic_for_tiny_models():
    from scaletrain.engine.estimate.time_constants import CPU_MATMUL_FLOPS

    s = base_setup(PlanRequest(model="scaletrain/tiny-qwen2", gpus="2xCPU", precision="fp32", strategy="ddp",
                               micro_batch=4, grad_accum=2, seq_len=128, grad_ckpt=False, offload="none"))
    assert s.device == "cpu"
    t = estimate_time(s)
    assert t.compute_seconds > t.flops_per_step / CPU_MATMUL_FLOPS        # elementwise passes dominate
    t2 = estimate_time(s.with_(micro_batch=8))
    assert t2.compute_seconds == pytest.approx(2 * t.compute_seconds, rel=0.05)   # linear in tokens
    assert any(a.startswith("CPU:") for a in t.assumptions)


def test_micro_step_is_bound_by_the_slower_of_host_and_device():
    """A tiny batch leaves the GPU waiting for Python and autograd; a large one keeps the host ahead."""
    small = estimate_time(_seed_setup("1xH100", strategy="ddp", micro_batch=1, seq_len=128, grad_ckpt=False))
    large = estimate_time(_seed_setup("1xH100", strategy="ddp", micro_batch=8, seq_len=4096, grad_ckpt=True))
    assert small.micro.host_bound and small.micro.seconds == small.micro.host
    assert not large.micro.host_bound and large.micro.seconds == pytest.approx(large.micro.device)
    assert any("host-bound" in a for a in small.assumptions)
    # the host cost per micro-step does not depend on the tokens in it
    assert small.micro.host == pytest.approx(estimate_time(_seed_setup(
        "1xH100", strategy="ddp", micro_batch=2, seq_len=128, grad_ckpt=False)).micro.host)


def test_every_device_term_grows_with_its_own_driver():
    base = _seed_setup("1xH100", strategy="ddp", micro_batch=4, seq_len=2048, grad_ckpt=False)
    t = estimate_time(base).micro
    longer = estimate_time(base.with_(seq_len=4096, micro_batch=2)).micro     # same tokens, longer sequences
    assert longer.matmul == pytest.approx(t.matmul, rel=0.01) and longer.attention > 1.9 * t.attention
    ck = estimate_time(base.with_(grad_ckpt=True)).micro                      # the forward runs twice
    assert ck.matmul > 1.2 * t.matmul and ck.memory_bound > t.memory_bound
    lora = estimate_time(base.with_(method="lora")).micro                     # no weight gradients, adapters' traffic
    assert lora.matmul < 0.8 * t.matmul and lora.memory_bound > t.memory_bound
    eager = estimate_time(base.with_(attn="eager")).micro
    assert eager.attention > t.attention


def test_optimizer_bytes_by_implementation_and_deepspeed_step_work():
    s = _seed_setup("1xH100", strategy="ddp", micro_batch=1, grad_accum=1, grad_ckpt=True)
    fused = estimate_time(s.with_(optimizer_impl="fused")).optimizer_seconds
    foreach = estimate_time(s.with_(optimizer_impl="foreach")).optimizer_seconds
    P = s.model.params
    hbm = s.hardware.gpu.hbm_gbps * 1e9 * DEFAULT_CONSTANTS.hbm_efficiency
    # fused: weight r+w, gradient r, two fp32 moments r+w, + clipping's three gradient passes
    assert fused == pytest.approx(P * (2 * 4 + 4 + 4 * 4 + 3 * 4) / hbm)
    assert foreach == pytest.approx(P * (4 * 4 + 2 * 4 + 14 * 4 + 3 * 4) / hbm)
    pure = estimate_time(s.with_(optimizer_impl="fused", master_weights="bf16")).optimizer_seconds
    assert pure == pytest.approx(P * (2 * 2 + 2 + 4 * 2 + 3 * 2) / hbm)      # bf16 weights, grads and moments
    z2 = estimate_time(s.with_(strategy="zero2")).optimizer_seconds
    assert z2 > fused                                                          # flatten, fp32 conversion, copy back


def test_zero3_on_one_gpu_pays_gathers_and_serial_hooks():
    s = _seed_setup("1xH100", strategy="zero3", micro_batch=4, grad_accum=1)
    t = estimate_time(s)
    assert t.micro.serial_host and t.micro.gathers > 0
    assert t.micro.seconds == pytest.approx(t.micro.device + t.micro.host)
    ddp = estimate_time(s.with_(strategy="ddp"))
    assert t.step_seconds > ddp.step_seconds


def test_objectives_time_their_own_work():
    """reward: twice the sequences, no vocabulary head; dpo: the reference's forward on top; grpo: generation once
    per step, on the learner's clock unless vLLM runs on other GPUs."""
    base = base_setup(PlanRequest(model="Qwen/Qwen2.5-1.5B-Instruct", gpus="1xH100", micro_batch=4, grad_accum=2,
                                  seq_len=1024, strategy="ddp", offload="none", grad_ckpt=True))
    sft = estimate_time(base)
    reward = estimate_time(base.with_(objective="reward"))
    assert reward.micro.loss == 0 and sft.micro.loss > 0
    assert reward.tokens_per_step == 2 * sft.tokens_per_step          # chosen and rejected
    assert reward.micro.attention == pytest.approx(2 * sft.micro.attention)
    dpo = estimate_time(base.with_(objective="dpo", prompt_len=512, ref_model="same"))
    dpo_noref = estimate_time(base.with_(objective="dpo", prompt_len=512, ref_model="precomputed"))
    assert dpo.micro.reference > 0 and dpo_noref.micro.reference == 0
    assert dpo.step_seconds > dpo_noref.step_seconds
    grpo = estimate_time(base.with_(objective="grpo", prompt_len=512, num_generations=8))
    assert grpo.generation is not None and grpo.generation.completions == 4 * 2   # micro × accumulation
    assert grpo.generation.host_bound                                  # HF generate dispatches a forward per token
    assert grpo.step_seconds > grpo.compute_seconds + grpo.generation.seconds * 0.99
    colocated = estimate_time(base.with_(objective="grpo", prompt_len=512, num_generations=8,
                                         generation="colocate", generation_memory=0.3))
    assert 0 < colocated.generation.seconds < grpo.generation.seconds
    server = estimate_time(base.with_(objective="grpo", prompt_len=512, num_generations=8,
                                      generation="server"))
    assert server.generation.seconds == 0
    assert any("completions per step" in a for a in grpo.assumptions)

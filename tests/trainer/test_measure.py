"""Tests for scaletrain.measure.step (CPU ground truth of one training step's memory).

Tiny random-init models only; the whole file runs in well under a minute on 2 CPU cores.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
from conftest import import_when_run

from scaletrain.measure import step as M
from scaletrain.measure import saved_activations as SA

_libs = import_when_run("torch", "transformers", "peft")

pytestmark = pytest.mark.heavy          # profiled steps of tiny real models

# hidden 64, 2 layers, 4 heads (head_dim 16), 2 kv heads (kv dim 32), intermediate 128, vocab 512
LLAMA = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=128, vocab_size=512, tie_word_embeddings=False,
             max_position_embeddings=2048)
QWEN2_TIED = dict(model_type="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, vocab_size=512, tie_word_embeddings=True,
                  max_position_embeddings=2048)
CONFIGS = {"llama": LLAMA, "qwen2": QWEN2_TIED}


def _dims(cfg):
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    kvd = cfg["num_key_value_heads"] * (h // nh)
    return h, cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"], nh, kvd


def _linear_shapes(cfg):
    """(in, out) of every linear inside one decoder block."""
    h, inter, _, _, _, kvd = _dims(cfg)
    return {"q_proj": (h, h), "k_proj": (h, kvd), "v_proj": (h, kvd), "o_proj": (h, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}


def _hand_param_count(cfg, qkv_bias=False):
    h, _, vocab, n_layers, _, kvd = _dims(cfg)
    per_layer = sum(i * o for i, o in _linear_shapes(cfg).values()) + 2 * h  # + two RMSNorm weights
    if qkv_bias:
        per_layer += h + 2 * kvd
    head = 0 if cfg["tie_word_embeddings"] else vocab * h
    return vocab * h + n_layers * per_layer + h + head


@functools.lru_cache(maxsize=None)
def _measure(name, **kw):
    dbg: dict = {}
    res = M.measure_step(CONFIGS[name], _debug=dbg, **kw)
    return res, dbg


@functools.lru_cache(maxsize=None)
def _saved(name, **kw):
    return SA.measure_saved_activation_bytes(CONFIGS[name], **kw)


@functools.lru_cache(maxsize=None)
def _step_tensor_bytes(name, **kw):
    """Exact bytes of the optimizer's per-parameter 'step' tensors, read from its state dict."""
    setup = M.build_harness(CONFIGS[name], **kw)
    (ids,) = M.make_batches(1, 1, 16, setup.vocab_size, "cpu", 0)
    M._full_step(setup, [ids])
    steps = [s["step"] for s in setup.optimizer.state_dict()["state"].values()]
    n_tensors = len(setup.optimizer.param_groups[0]["params"])
    assert len(steps) == n_tensors and all(isinstance(s, torch.Tensor) for s in steps)
    return sum(s.numel() * s.element_size() for s in steps), n_tensors


# ------------------------------------------------------------------------------------------------


def test_import_is_cheap():
    code = ("import sys, scaletrain.measure.step; "
            "bad = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_full_fp32_exact_byte_counts():
    r, _ = _measure("llama")
    n = _hand_param_count(LLAMA)
    assert r.device == "cpu" and r.peak_reserved_bytes is None
    assert r.params == n == r.trainable_params
    assert r.param_bytes == 4 * r.params == r.trainable_param_bytes
    assert r.grad_bytes == 4 * r.trainable_params
    step_bytes, n_tensors = _step_tensor_bytes("llama")
    assert step_bytes == 4 * n_tensors  # 0-dim float32 step per parameter tensor on cpu
    assert r.optimizer_state_bytes == 8 * r.trainable_params + step_bytes
    assert r.step_seconds > 0


def test_tied_embeddings_count_once():
    r, _ = _measure("qwen2")
    setup = M.build_harness(QWEN2_TIED)
    emb, head = setup.model.get_input_embeddings(), setup.model.get_output_embeddings()
    assert emb.weight.data_ptr() == head.weight.data_ptr()
    assert r.params == _hand_param_count(QWEN2_TIED, qkv_bias=True)
    assert r.param_bytes == 4 * r.params
    assert r.grad_bytes == 4 * r.params
    step_bytes, _ = _step_tensor_bytes("qwen2")
    assert r.optimizer_state_bytes == 8 * r.params + step_bytes


def test_peak_bounds_and_independent_check():
    r, dbg = _measure("llama")
    reading = dbg["reading"]
    _, _, vocab, _, _, _ = _dims(LLAMA)
    b, s = 1, 128
    logits = 4 * b * s * vocab
    saved = _saved("llama")
    states = r.param_bytes + r.optimizer_state_bytes
    largest = 4 * vocab * LLAMA["hidden_size"]  # embedding / lm_head: the largest parameter tensors

    # lower bound: params, Adam state and a full set of grads all exist at the optimizer step
    assert r.peak_allocated_bytes >= states + r.grad_bytes
    # loose upper bound: everything that can physically coexist -- states, grads, every tensor
    # saved for backward, the fp32 log-softmax output + its grad + the logits grad, and the two
    # param-sized temporaries of the single-tensor AdamW step -- plus 5 % slack.
    upper = states + r.grad_bytes + saved + 3 * logits + 2 * largest
    assert r.peak_allocated_bytes <= 1.05 * upper

    # the timeline includes pre-existing allocations: params + optimizer state + batch are in it
    assert reading.preexisting_by_category["PARAMETER"] == r.param_bytes
    assert reading.preexisting_by_category["OPTIMIZER_STATE"] == r.optimizer_state_bytes
    assert 0 <= dbg["live_before"] - reading.preexisting_bytes < 1024  # only untouched buffers missing
    # independent check 1: allocator's own running counter agrees with the tensor-level timeline
    assert reading.peak_bytes == reading.preexisting_bytes + reading.counter_peak_delta
    # independent check 2 (hand model): with a vocab this large relative to hidden the peak is the
    # start of backward: states + every saved activation + d(log_softmax) + d(logits), no grads yet.
    by_hand = states + saved + 2 * logits
    assert abs(r.peak_allocated_bytes - by_hand) <= 0.01 * r.peak_allocated_bytes
    assert r.peak_by_category["AUTOGRAD_DETAIL"] == 2 * logits
    assert "GRADIENT" not in r.peak_by_category
    assert sum(r.peak_by_category.values()) == r.peak_allocated_bytes


def test_determinism():
    a = M.measure_step(LLAMA)
    b, _ = _measure("llama")
    assert a.peak_allocated_bytes == b.peak_allocated_bytes
    assert a.peak_by_category == b.peak_by_category
    assert _saved("llama") == SA.measure_saved_activation_bytes(LLAMA)


def test_lora_all_linear_trainable_formula():
    r, _ = _measure("llama", method="lora", lora_rank=8)
    setup = M.build_harness(LLAMA, method="lora", lora_rank=8)
    assert not any("lm_head" in t for t in setup.lora_targets)  # peft "all-linear" skips the head
    assert len(setup.lora_targets) == 7 * LLAMA["num_hidden_layers"]
    per_layer = sum(8 * (i + o) for i, o in _linear_shapes(LLAMA).values())
    assert r.trainable_params == LLAMA["num_hidden_layers"] * per_layer
    assert r.params == _hand_param_count(LLAMA) + r.trainable_params
    assert r.trainable_param_bytes == r.grad_bytes == 4 * r.trainable_params
    n_lora_tensors = 2 * len(setup.lora_targets)
    assert r.optimizer_state_bytes == 8 * r.trainable_params + 4 * n_lora_tensors
    assert r.peak_allocated_bytes >= r.param_bytes + r.optimizer_state_bytes + r.grad_bytes
    assert r.peak_allocated_bytes < _measure("llama")[0].peak_allocated_bytes


def test_lora_explicit_targets():
    setup = M.build_harness(LLAMA, method="lora", lora_rank=4, lora_targets=("q_proj", "v_proj"))
    trainable = sum(p.numel() for p in setup.model.parameters() if p.requires_grad)
    shapes = _linear_shapes(LLAMA)
    expect = LLAMA["num_hidden_layers"] * sum(4 * sum(shapes[k]) for k in ("q_proj", "v_proj"))
    assert trainable == expect
    assert len(setup.lora_targets) == 2 * LLAMA["num_hidden_layers"]


def test_grad_ckpt_lowers_peak():
    off, _ = _measure("llama", seq_len=256)
    on, _ = _measure("llama", seq_len=256, grad_ckpt=True)
    assert on.peak_allocated_bytes < off.peak_allocated_bytes
    assert on.grad_bytes == off.grad_bytes and on.optimizer_state_bytes == off.optimizer_state_bytes
    assert _saved("llama", seq_len=256, grad_ckpt=True) < _saved("llama", seq_len=256)


def test_eager_peak_exceeds_sdpa_at_512():
    eager, _ = _measure("llama", seq_len=512, attn="eager")
    sdpa, _ = _measure("llama", seq_len=512, attn="sdpa")
    assert eager.peak_allocated_bytes > sdpa.peak_allocated_bytes
    # eager keeps heads x s x s fp32 probabilities per layer, sdpa does not
    h, _, _, n_layers, nh, _ = _dims(LLAMA)
    assert eager.peak_allocated_bytes - sdpa.peak_allocated_bytes > n_layers * nh * 512 * 512 * 4


@pytest.mark.parametrize("mode", ["full-sdpa", "full-eager", "lora-sdpa", "bf16-sdpa"])
def test_saved_activation_bytes_per_layer_formula(mode):
    """Bytes saved for backward by one decoder layer, derived by hand from the llama code path."""
    b, s, r = 2, 64, 8
    h, inter, _, _, nh, kvd = _dims(LLAMA)
    kv_rep = h if LLAMA["num_key_value_heads"] > 1 else kvd  # eager repeat_kv copies unless 1 kv head
    method = "lora" if mode.startswith("lora") else "full"
    attn = mode.split("-")[1]
    precision = "bf16" if mode.startswith("bf16") else "fp32"
    if mode == "full-sdpa":  # 2 RMSNorms (x, rsqrt, x*rsqrt, normed) + q,k,v,lse,out + MLP 4I
        expect = 4 * b * s * (8 * h + 2 * kvd + nh + 2 + 4 * inter)
    elif mode == "full-eager":  # q, repeated k/v, probs (nh*s per token), out
        expect = 4 * b * s * (8 * h + 2 * kv_rep + nh * s + 2 + 4 * inter)
    elif mode == "lora-sdpa":  # frozen norm weights: x*rsqrt not saved; + r per adapted linear
        expect = 4 * b * s * (6 * h + 2 * kvd + nh + 2 + 4 * inter + 7 * r)
    else:  # autocast: fp32 norms, a bf16 input copy per linear, bf16 attention/MLP, bf16 weight copies
        lin = sum(i * o for i, o in _linear_shapes(LLAMA).values())
        expect = b * s * (30 * h + 4 * kvd + 4 * nh + 8 + 8 * inter) + 2 * lin
    total, by_layer = SA.measure_saved_activation_bytes(LLAMA, method=method, attn=attn, precision=precision,
                                                       micro_batch=b, seq_len=s, per_layer=True)
    assert by_layer["layer1"] == expect
    assert total == sum(by_layer.values())


def test_grad_accum_keeps_grads_alive():
    one, _ = _measure("llama")
    two, _ = _measure("llama", grad_accum=2)
    assert two.peak_by_category.get("GRADIENT") == two.grad_bytes
    extra = two.peak_allocated_bytes - one.peak_allocated_bytes
    assert two.grad_bytes <= extra <= two.grad_bytes + 8 * 128 + 64  # grads + the second batch


def test_other_precisions_and_sgd():
    pure, _ = _measure("llama", precision="bf16-pure")
    n = _hand_param_count(LLAMA)
    assert pure.param_bytes == 2 * n and pure.grad_bytes == 2 * n
    step_bytes, _ = _step_tensor_bytes("llama")
    assert pure.optimizer_state_bytes == 4 * n + step_bytes  # bf16 exp_avg/exp_avg_sq, fp32 steps
    mixed, _ = _measure("llama", precision="bf16")
    assert mixed.param_bytes == 4 * n and mixed.optimizer_state_bytes == 8 * n + step_bytes
    sgd, _ = _measure("llama", optimizer="sgd")
    assert sgd.optimizer_state_bytes == 4 * n  # momentum buffers only


def test_errors():
    with pytest.raises(ValueError):
        M.measure_step(LLAMA, attn="flash")
    with pytest.raises(ValueError):
        M.measure_step(LLAMA, method="prefix")
    with pytest.raises(ValueError):
        M.measure_step({"hidden_size": 8})


def test_qlora_measures_on_cpu_with_bitsandbytes():
    """bitsandbytes ≥ 0.45 runs NF4 layers on the CPU: the packed base is uint8, the adapters train."""
    m = M.measure_step(LLAMA, method="qlora", precision="bf16", micro_batch=2, seq_len=32)
    assert m.trainable_params > 0 and m.peak_allocated_bytes > m.param_bytes

"""A traced MoE family's time holds its routed experts' GEMMs, as its trace found and counted them.

transformers builds the experts as 3-D weights, no nn.Linear: the trace's block linears missed them, and a traced
MoE's time had no expert GEMMs (granitemoe at 1B-A400M sizes, full, micro 8 × 2048 on one H100: 23 ms of matmul
a micro-step, where its experts alone take 50). The trace now records each expert weight's [E, a, b] and counts
the rows a token sends through them in a forward (measure/trace_experts.py). Checked here against transformers'
own configs (the top-k each family names its own way) and against the analytic layout of qwen3_moe, traced as if
it had none.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from scaletrain.engine.catalog import traced
from scaletrain.engine.catalog.architectures import _FAMILIES, arch_from_config
from scaletrain.engine.catalog.hardware import parse_gpus
from scaletrain.engine.estimate import device_time, moe_time, traced_blocks
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.estimate.timing import estimate_time, sample_flops
from scaletrain.engine.plan.model_notes import moe_facts, moe_line

from conftest import import_when_run

_libs = import_when_run("torch", "transformers")

REGIME = {"method": "full", "lora_rank": 0, "lora_targets": None, "precision": "fp32", "attn": "sdpa"}
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "top_k", "moe_k", "num_selected_experts")
T = 8 * 2048            # tokens of a micro-step: 8 × 2048


def _tiny(model_type: str, top_k: int | None = 3) -> dict:
    """The family's tiny sweep config, its top-k set to `top_k` under whichever key the family reads (3 of 8
    experts: not the sweep's 2, so a count that happened to be 2 would not pass)."""
    from scaletrain.measure.tiny_configs import config_dict, shrink

    cfg = shrink(config_dict(model_type), model_type)
    if top_k is not None:
        for key in TOP_K_KEYS:
            if cfg.get(key) is not None:
                cfg[key] = top_k
    return cfg


def _measured(cfg: dict) -> tuple[dict, dict]:
    from scaletrain.measure.trace import activations, structure

    struct = structure(cfg)
    return struct, activations(cfg, REGIME, struct)


@pytest.mark.heavy                      # a tiny trace (about 10 CPU s)
def test_routed_and_shared_experts_in_one_block_are_counted_apart():
    """inkling's block holds its routed experts (3 of 8 here) and shared ones as 3-D weights of one expert each,
    which every token runs through once: each weight has its own count (one count for both said 1.5 at 2 of 8)."""
    cfg = _tiny("inkling_text")
    struct, act = _measured(cfg)
    kind = next(i for i, k in enumerate(struct["kinds"]) if k.get("experts"))
    pairs = list(zip(struct["kinds"][kind]["experts"], act["kinds"][kind]["experts_per_token"]))
    assert {E for (E, _, _), _ in pairs} == {1, 8}
    assert all(rows == (3 if E == 8 else 1) for (E, _, _), rows in pairs), pairs


@pytest.mark.heavy                      # a tiny trace per family (about 2-15 CPU s each)
@pytest.mark.parametrize("model_type, rows", [
    ("granitemoe", 3),        # num_experts_per_tok; the experts in a block_sparse_moe
    ("deepseek_v3", 3),       # its first layer dense: a kind without experts
    ("hunyuan_v1_moe", 3),    # moe_topk
    ("jetmoe", 3),            # two expert modules a block, its attention's run outside their own forward
    ("llama4_text", 8),       # transformers' llama4 runs every token through all 8 experts, whatever its top-k
])
def test_the_rows_a_token_sends_through_the_experts_are_counted_in_a_forward(model_type, rows):
    cfg = _tiny(model_type)
    if model_type == "hunyuan_v1_moe":
        cfg["num_experts"] = 8          # its class default is a single expert
    struct, act = _measured(cfg)
    with_experts = [i for i, k in enumerate(struct["kinds"]) if k.get("experts")]
    assert with_experts, f"{model_type}: no routed experts found"
    for i, kind in enumerate(struct["kinds"]):
        if i in with_experts:
            assert all(w[0] == 8 and len(w) == 3 for w in kind["experts"]), kind["experts"]
            assert act["kinds"][i]["experts_per_token"] == [rows] * len(kind["experts"])
        else:
            assert "experts_per_token" not in act["kinds"][i]
    if model_type == "deepseek_v3":
        assert len(with_experts) < len(struct["kinds"])      # the dense first layer is its own kind


def test_a_dense_family_has_no_experts_and_no_routed_time():
    cfg = _tiny("llama", None)
    from scaletrain.measure.trace import structure

    assert not any(k.get("experts") for k in structure(cfg)["kinds"])


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    """The tiny qwen3_moe at 3 of 8 experts, as its analytic layout plans it and traced as if it had none."""
    from scaletrain.measure.trace import run

    mp = pytest.MonkeyPatch()
    mp.setenv("SCALETRAIN_CACHE", str(tmp_path_factory.mktemp("traces")))
    cfg = _tiny("qwen3_moe")
    analytic = arch_from_config(cfg, "tiny-qwen3-moe")
    layout = _FAMILIES["qwen3_moe"]
    mp.delitem(_FAMILIES, "qwen3_moe")
    regimes = [REGIME, {**REGIME, "method": "lora", "lora_rank": 8, "lora_targets": ["o_proj", "q_proj"]}]
    assert traced.prefetch(cfg, regimes, "test", run) == 2
    # its MoeSpec is read from config.json whatever the layout: a traced family has none (MOE_TYPES are analytic)
    traced_arch = replace(arch_from_config(cfg, "tiny-qwen3-moe"), moe=None)
    mp.setitem(_FAMILIES, "qwen3_moe", layout)      # back for the analytic one; the trace stays cached
    yield analytic, traced_arch
    mp.undo()


def _setup(arch, method: str = "full", **kw) -> TrainingSetup:
    lora = dict(lora_rank=8, lora_targets=("o_proj", "q_proj")) if method == "lora" else {}
    return TrainingSetup(model=arch, hardware=parse_gpus("1xH100"), method=method, strategy="ddp", precision="fp32",
                         attn="sdpa", micro_batch=8, seq_len=2048, **lora, **kw)


def _router_seconds(s: TrainingSetup, gemm) -> float:
    """The analytic layout's router GEMMs (the traced families' routers are no expert weights: not in its time)."""
    m = s.model
    t, E, h = T, m.moe.experts, m.hidden_size
    full = s.method == "full"
    return moe_time.moe_layers(s) * (gemm(t, E, h) + gemm(t, h, E) + (gemm(E, h, t) if full else 0.0))


@pytest.mark.heavy                      # traces a family
@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_traced_moe_times_its_experts_as_the_analytic_layout_does(qwen3_moe, method):
    analytic, traced_arch = qwen3_moe
    assert analytic.moe is not None and traced_arch.moe is None and traced_arch.trace is not None
    a, t = _setup(analytic, method), _setup(traced_arch, method)
    assert moe_time.moe_layers(t) == moe_time.moe_layers(a) == analytic.num_layers
    gemm = device_time.gemm_for(a, device_time.DEFAULT_CONSTANTS)
    want = moe_time.routed_matmul_seconds(a, T, gemm) - _router_seconds(a, gemm)
    got = moe_time.routed_matmul_seconds(t, T, gemm)
    assert got > 0
    assert got == pytest.approx(want, rel=1e-9)
    # FLOPs: the active experts' (3 of 8), forward and backward, less the router's 2·E·h a token
    fa, ft = moe_time.routed_sample_flops(a, 2048), moe_time.routed_sample_flops(t, 2048)
    router = 2 * analytic.moe.experts * analytic.hidden_size * 2048 * analytic.num_layers
    assert ft[0] == pytest.approx(fa[0] - router, rel=1e-12)
    assert ft[1] == pytest.approx(fa[1] - router * (2 if method == "full" else 1), rel=1e-12)


@pytest.mark.heavy                      # traces a family
def test_the_time_says_what_it_counted_and_what_it_could_not(qwen3_moe, monkeypatch):
    analytic, traced_arch = qwen3_moe
    s = _setup(traced_arch)
    lines = estimate_time(s).assumptions
    assert any("3 expert rows per token, as its trace counted them" in line for line in lines)
    # the parameters a token runs through: what the analytic layout counts (router and 3 of 8 experts)
    assert moe_facts(s) == {"experts": 8, "rows_per_token": [3.0], "moe_layers": 6, "counted": True,
                            "active_params": analytic.active_params, "experts_implementation": "grouped_mm",
                            "expert_parallelism": False}
    assert traced_arch.params == analytic.params > analytic.active_params
    assert "8 experts in 6 of 6 layers, 3 expert rows per token" in moe_line(s)
    counted = device_time.micro_step(s).matmul
    # a trace whose forward could not be counted: no expert GEMMs, and the plan says so
    real = traced_blocks._trace

    def uncounted(setup):       # what a forward the FLOP counter could not follow leaves
        act = real(setup)
        return {**act, "kinds": [{**kind, "experts_per_token": [None] * len(kind["experts_per_token"])}
                                 for kind in act["kinds"]]}

    monkeypatch.setattr(traced_blocks, "_trace", uncounted)
    assert moe_time.uncounted_experts(s)
    assert moe_time.TRACED_EXPERTS_UNCOUNTED in estimate_time(s).assumptions
    assert moe_facts(s)["counted"] is False and "uncounted expert rows" in moe_line(s)
    assert device_time.micro_step(s).matmul < counted / 2


@pytest.mark.heavy                      # traces a family
def test_an_experts_implementation_a_traced_moe_does_not_run_is_said_in_the_plan(qwen3_moe):
    """The trainer passes --experts-impl only to the MoE families whose layout the catalog knows
    (with_experts_implementation): asked for a traced one, the plan says it runs transformers' default."""
    from scaletrain.engine.plan.model_notes import model_notes

    analytic, traced_arch = qwen3_moe
    said = [n for n in model_notes(_setup(traced_arch, experts_impl="eager")) if "--experts-impl" in n]
    assert said == ["--experts-impl eager changes nothing for tiny-qwen3-moe: its experts run transformers' "
                    "default, grouped_mm (a traced MoE family: the trainer passes no implementation to it, and "
                    "the plan counts grouped_mm)"]
    assert not [n for n in model_notes(_setup(traced_arch)) if "--experts-impl" in n]
    assert not [n for n in model_notes(_setup(analytic, experts_impl="eager")) if "--experts-impl" in n]


@pytest.mark.heavy                      # traces a family
def test_each_traced_kind_times_its_own_linears(tmp_path, monkeypatch):
    """deepseek_v3's dense first layer has a wide MLP its MoE layers do not: the block GEMMs take each kind's own
    linears by its count, as the FLOPs do (once, every layer was timed with the first kind's)."""
    from scaletrain.measure.trace import run

    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path))
    cfg = _tiny("deepseek_v3")
    assert traced.prefetch(cfg, [REGIME], "test", run) == 1
    s = _setup(arch_from_config(cfg, "tiny-deepseek-v3"))
    flops_gemm = lambda M, N, K: 2.0 * M * N * K            # noqa: E731 - seconds as FLOPs
    blocks = device_time._block_matmul_seconds(s, 2048, flops_gemm, forward_only=True)
    assert blocks == 2.0 * 2048 * s.model.linear_weight_params()
    kinds = s.model.trace["kinds"]
    assert len({json.dumps(k["linears"], sort_keys=True) for k in kinds}) > 1
    assert sample_flops(s, 2048).forward > 2.0 * 2048 * s.model.linear_weight_params()     # the experts in it

"""A profiled run of the trace hands its record back before the next one (measure/trace_record.release_memory):
torch.profiler's record stayed alive in reference cycles, and zamba's trace stopped at its process's memory cap."""

from __future__ import annotations

import gc

import pytest

pytestmark = pytest.mark.heavy          # builds and profiles a small model on the CPU

CONFIG = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "use_cache": False}


def _records() -> int:
    """Profiler records alive (torch.profiler.profile keeps one in torch.autograd.profiler.profile)."""
    from torch.autograd.profiler import profile

    return sum(1 for o in gc.get_objects() if isinstance(o, profile))


def test_no_profiler_record_outlives_a_traced_run_and_the_bytes_repeat():
    from scaletrain.measure.step import build_harness
    from scaletrain.measure.trace_record import saved_by_scope

    h = build_harness(CONFIG, method="full", precision="fp32", device="cpu")
    gc.collect()
    before = _records()
    first = saved_by_scope(h, 64)
    assert _records() == before            # dropped when the run returns, not at the collector's leisure
    again = saved_by_scope(h, 64)
    assert first[0] == again[0] and first[2]["fwd0"] == again[2]["fwd0"] > 0

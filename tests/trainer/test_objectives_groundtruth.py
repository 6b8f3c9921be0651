"""The objectives' memory terms against torch.profiler over real TRL steps (CPU): issue 16's acceptance bar.

Each case runs RewardTrainer, DPOTrainer or GRPOTrainer (generation included) on a random-init tiny model, profiles
one optimizer step after a warm-up step, and compares the measured allocated peak with the engine's. Parameter,
reference-model and optimizer-state bytes must match the real tensors exactly; the peak within 5 % (median).
bench/objective_groundtruth.py runs the full table for docs/accuracy.md.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from objective_groundtruth import QUICK, run_case  # noqa: E402

pytestmark = pytest.mark.heavy          # TRL steps under torch.profiler, one process


@pytest.fixture(scope="module")
def rows():
    return [run_case(c) for c in QUICK]


def test_covers_each_objective_and_reference(rows):
    assert {r["objective"] for r in rows} == {"reward", "dpo", "grpo"}
    assert {r["method"] for r in rows} == {"full", "lora"}
    assert "same" in {r["ref_model"] for r in rows}


def test_parameter_reference_and_state_bytes_exact(rows):
    for r in rows:
        for k in ("params", "trainable", "weights_bytes", "reference_bytes", "optimizer_bytes"):
            assert r[f"{k}_predicted"] == r[f"{k}_measured"], (r["case"], k)


def test_peak_within_five_percent(rows):
    errors = [abs(r["error"]) for r in rows]
    table = "\n".join(f"{r['case']}: {100 * r['error']:+.1f}%" for r in rows)
    assert statistics.median(errors) <= 0.05, table
    assert max(errors) <= 0.10, table

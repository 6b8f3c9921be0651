"""The model against what a real H100 measured (bench/results/h100-2026-11-23.json, copied from
../shared/measurements/h100-2026-11-23/ with its source named): re-predicted by the current engine, it must stay
within issue 12's bounds. Memory must never be predicted below the measured peak by more than 3 %."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from gpu_records import RESULTS, repredict  # noqa: E402


@pytest.fixture(scope="module")
def data():
    stored = json.loads(RESULTS.read_text())
    for r in stored["records"]:        # predictions are recomputed here; only the measured values are read
        r.pop("predicted", None)
    return repredict(stored)


def test_records_are_measured_facts_with_their_source(data):
    assert data["source"].startswith("../shared/measurements/h100-2026-11-23")
    assert len(data["records"]) >= 8
    for r in data["records"]:
        assert r["measured"]["peak_allocated_bytes"] > 0 and r["measured"]["step_seconds"] > 0
        assert r["source"] in ("accuracy-sweep.json", "e2e-headless-lora-1.5b.txt")


def test_memory_within_bounds_and_never_far_under(data):
    errs = [r["memory_error"] for r in data["records"]]
    assert statistics.median(abs(e) for e in errs) <= 0.03
    assert max(abs(e) for e in errs) <= 0.08
    assert min(errs) >= -0.03


def test_step_time_within_bounds(data):
    errs = [abs(r["time_error"]) for r in data["records"]]
    assert statistics.median(errs) <= 0.15
    assert max(errs) <= 0.30


def test_runs_that_ran_out_of_memory_are_predicted_not_to_fit(data):
    ooms = [o for o in data["outcomes"] if "OOM" in o["cause"]]
    assert len(ooms) == 2
    assert all(o["predicted"]["fits"] is False for o in ooms)

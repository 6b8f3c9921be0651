"""How counts and times read: in the unit that shows them, never "0.00B" or "4.73e-05 h"."""

from __future__ import annotations

import re

from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.options import TrainOptions
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.run.run_length import run_time
from scaletrain.engine.units import fmt_params


def test_a_parameter_count_is_written_in_the_unit_that_shows_it():
    assert fmt_params(7_615_616_512) == "7.62B"
    assert fmt_params(1_000_000_000) == "1.00B"
    assert fmt_params(999_999_999) == "1000.0M"
    assert fmt_params(14_040_000) == "14.0M"
    assert fmt_params(229_696) == "230K"        # scaletrain/tiny-phi3: the catalog list said "0.00B"


def _time_text(**request) -> str:
    return run_time(make_plan(PlanRequest(**request)), TrainOptions()).text()


def test_the_time_per_1000_samples_of_a_tiny_model_is_in_seconds_not_in_a_power_of_ten_of_an_hour():
    tiny = _time_text(model="tiny-llama", gpus="8xH100-SXM")       # the wizard's plan step said "4.73e-05 h"
    assert re.search(r"\d (ms|s) per 1,000 samples$", tiny) and not re.search(r"\de-\d", tiny), tiny
    big = _time_text(model="Qwen/Qwen3-4B", gpus="8xRTX4090", effective_batch=128)
    assert re.search(r"\d h per 1,000 samples$", big), big

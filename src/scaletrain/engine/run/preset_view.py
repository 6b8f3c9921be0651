"""A preset as a starting point: its hardware, model, objective, what its seed guide claimed, and what scaletrain
predicts for it (memory per GPU, step time, the whole run) — the rows of the wizard's first screen.

The prediction is the preset's own plan (make_plan of its request, the run length counted as the plan step counts
it: engine.run.run_length.known_length); nothing here estimates.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.plan.planner import make_plan
from scaletrain.engine.request.presets import Preset, bundled_dir
from scaletrain.engine.request.request import PlanRequest
from scaletrain.engine.run.run_length import run_time, with_known_length
from scaletrain.engine.units import fmt_bytes, fmt_seconds


@dataclass(frozen=True)
class PresetView:
    name: str
    hardware: str                 # "4xH200"
    model: str                    # "Qwen/Qwen2.5-7B-Instruct"
    method: str                   # "lora"
    objective: str                # "sft", "reward", ...
    description: str
    seed: str | None              # what the seed guide claimed
    predicted: str                # "scaletrain: 89.00 GiB per GPU, 8.8 s/step, 2.1 min in all" or why not
    bundled: bool                 # shipped with scaletrain (else the user's own, ./presets-local)

    def setup_words(self) -> str:
        """'4xH200 · Qwen/Qwen2.5-7B-Instruct · lora · sft'."""
        return f"{self.hardware} · {self.model} · {self.method} · {self.objective}"


def predicted_words(preset: Preset) -> str:
    """What scaletrain predicts for a preset's own plan, in one short phrase (or the planner's refusal)."""
    from scaletrain.engine.run.run_length import known_length

    train = preset.train
    request = PlanRequest(**preset.request_fields())
    try:
        plan = make_plan(with_known_length(request, train))
    except ScaletrainError as e:
        return f"scaletrain: does not plan ({e})"
    per = "per GPU" if plan.setup.device == "cuda" else "per process"
    parts = [f"{fmt_bytes(plan.memory.total_bytes)} {per}" + ("" if plan.fits else " (does not fit)")]
    rt = run_time(plan, train)
    if rt is not None:
        parts.append(f"{fmt_seconds(rt.step_seconds)}/step")
        if rt.total_seconds is not None:
            counted = known_length(request, train).source
            where = " on the bundled data" if "bundled" in counted else ""
            parts.append(f"{fmt_seconds(rt.total_seconds)} in all{where}")
    return "scaletrain: " + ", ".join(parts)


def preset_view(preset: Preset) -> PresetView:
    r = preset.request
    return PresetView(preset.name, preset.hardware, preset.model, str(r.get("method", "full")),
                      str(r.get("objective", "sft")), preset.description, preset.seed, predicted_words(preset),
                      preset.path.parent == bundled_dir())

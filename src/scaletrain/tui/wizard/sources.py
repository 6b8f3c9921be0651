"""What the wizard's weights and data fields accept, as the CLI's --weights and --data do: the engine's rules
(engine/request/weights.py, engine/request/data_source.py), here only turned into field values. No Textual, so the plain
wizard uses it too."""

from __future__ import annotations

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.request.data_source import DataSource, resolve_data
from scaletrain.engine.request.weights import RANDOM_INIT, default_weights, resolve_weights, weights_problem


def parse_weights(text: str) -> str:
    """The weights field: random-init, a local model folder (with config.json), or an HF model id (org/name)."""
    t = (text or "").strip()
    if not t:
        raise ScaletrainError("weights are empty; give an HF id (org/name), a local model folder, or random-init "
                              "(testing only)")
    if t.lower() == RANDOM_INIT:
        return RANDOM_INIT
    problem = weights_problem("full", None, t)      # the method's own rule is checked at the write step
    if problem:
        raise ScaletrainError(problem)
    return resolve_weights(t, t)


def model_weights(model: str) -> str:
    """The weights a run of `model` starts from when none are named, as --weights means when not given (the model's
    own; random-init for a config-only model: engine.request.weights.default_weights); "" for no model, and the text
    as typed for what is not a model yet (a catalog search, a half-typed path: the model field's own check speaks)."""
    if not model.strip():
        return ""
    try:
        return default_weights(model)
    except Exception:          # noqa: BLE001 - not a model yet (above)
        return model.strip()


def parse_data(text: str) -> DataSource | None:
    """The data field: a local JSONL/JSON/Parquet/CSV file or folder, an HF dataset id in the HF cache, or empty
    (the bundled demo data)."""
    t = (text or "").strip()
    return resolve_data(t) if t else None

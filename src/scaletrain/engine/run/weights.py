"""Where the trained weights come from (TrainOptions.model_source), and what that means before anything is written:
random-init trains a model from noise (tests, demos, memory and speed checks), and a quantized base (QLoRA) cannot
be built from random weights by a real run. One rule, used by the wizard's write step (and any front end)."""

from __future__ import annotations

RANDOM_INIT = "random-init"


def is_random_init(model_source: str | None) -> bool:
    return (model_source or RANDOM_INIT).strip().lower() == RANDOM_INIT


def weights_warning(model_source: str | None) -> str | None:
    """The warning a run from random weights carries (None for real weights: a local folder or an HF id)."""
    if is_random_init(model_source):
        return ("random-init weights: testing only — the model starts from noise and learns nothing useful; "
                "give a local folder or an HF id as the weights for a real run")
    return None


def weights_problem(method: str, model_source: str | None) -> str | None:
    """Why these weights cannot be written for this method (None when they can): QLoRA needs pretrained weights."""
    if str(method).lower() == "qlora" and is_random_init(model_source):
        return ("QLoRA quantizes a pretrained base to 4 bits; with random-init weights there is nothing to "
                "quantize — give the weights (a local folder or an HF id), or choose LoRA or full fine-tuning")
    return None

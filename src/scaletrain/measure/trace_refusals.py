"""Why a trace is refused, in one line: where the model's own code, not the trace, fails on a training step.

    own_loss_fails(harness, length, error)   the step failed in the model's own loss, its forward runs without
                                             labels: git's loss slices off image-token positions on a text batch
    forward_failed(regime, error)            any other failure of a regime's step, LoRA + checkpointing's in-place
                                             change of a leaf (git's embeddings) named
torch is imported inside functions.
"""

from __future__ import annotations

from scaletrain.measure.trace_fit import TraceError

OWN_LOSS_FAILS = "transformers' own loss for it fails on a batch of text"


def own_loss_fails(harness, seq_len: int, error: BaseException) -> TraceError | None:
    """When the step failed in the model's own loss (its forward without labels runs): one line saying so and that
    `--loss chunked` does not run it. git's loss slices off its image-token positions (197) even with no image, so a
    text batch leaves it no logits for its targets. None when the forward fails too, or the loss was the chunked
    one (the caller's error stands)."""
    import torch

    from scaletrain.measure.step import make_batches

    if harness.loss != "standard":
        return None
    (ids,) = make_batches(1, 1, seq_len, harness.vocab_size, harness.device, 0)
    try:
        with torch.no_grad(), harness.autocast():
            harness.model(input_ids=ids)
    except Exception:           # noqa: BLE001 - the forward fails too: not the loss's failure
        return None
    return TraceError(f"{OWN_LOSS_FAILS} ({type(error).__name__}: {one_line(error, 160)}); "
                      "--loss chunked computes the loss from the final hidden states instead")


# LoRA + checkpointing: transformers' activation_checkpointing_enable makes the frozen input embedding's output
# require grad (enable_input_require_grads), a leaf; a forward that adds to it in place (git's embeddings:
# `embeddings += position_embeddings`) fails in torch
IN_PLACE_ON_LEAF = "a leaf Variable that requires grad is being used in an in-place operation"
IN_PLACE_WHY = ("LoRA + checkpointing fails in its forward: transformers makes the frozen embedding's output a leaf "
                "that requires grad, which the forward changes in place; plan LoRA without --grad-ckpt")


def forward_failed(regime: dict, error: BaseException) -> TraceError:
    """One line for a regime whose step failed in the model's code (not the trace's)."""
    if regime.get("method") == "lora" and regime.get("grad_ckpt") and IN_PLACE_ON_LEAF in str(error):
        return TraceError(IN_PLACE_WHY)
    return TraceError(f"its forward failed: {one_line(error)}")


def one_line(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split()) or e.__class__.__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"

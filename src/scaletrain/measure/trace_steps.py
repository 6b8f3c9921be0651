"""Single steps a trace takes on the slice apart from its measured runs (measure/trace.py): a forward before
anything is counted, a backward that finds the parameters a step on text gives no gradient, the output head's
width, and a forward that counts the routed experts' rows (trace_experts)."""

from __future__ import annotations

from scaletrain.measure.saved_activations import decoder_layers
from scaletrain.measure.trace_slice import SLICE_VOCAB


def head_width(model) -> int:
    """The output head's width (the logits' last dimension): the config's vocabulary, or a width the model class
    sets its own way (inkling2's unpadded_vocab_size)."""
    head = model.get_output_embeddings()
    w = getattr(head, "weight", None)
    return int(w.shape[0]) if w is not None and w.dim() == 2 else SLICE_VOCAB


def warm_up(harness, seq_len: int) -> None:
    import torch

    from scaletrain.measure.step import make_batches, step_loss

    (ids,) = make_batches(1, 1, seq_len, harness.vocab_size, harness.device, 0)
    with torch.no_grad(), harness.autocast():
        step_loss(harness, ids)


def gradless_params(harness, seq_len: int) -> tuple[int, list[str]]:
    """Elements of the trainable parameters outside the decoder layers that one step on text gives no gradient (a
    multimodal causal LM's vision and audio towers: phi4_multimodal's; reformer's lm_head.bias, which transformers
    5 no longer ties to its decoder's), and their names. torch's optimizers skip a parameter whose .grad is None:
    no gradient and no optimizer state is allocated for them in a single-process step; DDP waits for their
    gradients, so the trainer freezes them by name."""
    import torch

    from scaletrain.measure.step import make_batches, step_loss

    model = harness.model
    in_layers = {id(p) for layer in decoder_layers(model) for p in layer.parameters()}
    (ids,) = make_batches(1, 1, seq_len, harness.vocab_size, harness.device, 0)
    model.zero_grad(set_to_none=True)
    with harness.autocast():
        loss = step_loss(harness, ids)
    loss.backward()
    del loss
    none = [(name, p) for name, p in model.named_parameters()
            if p.requires_grad and p.grad is None and id(p) not in in_layers]
    model.zero_grad(set_to_none=True)
    return int(sum(p.numel() for _, p in none)), sorted(name for name, _ in none)


def routed_rows(harness, seq_len: int) -> list:
    """Per decoder layer of the slice: the rows one token runs through each of its expert weights (trace_experts),
    counted in one forward of TRACE_BATCH sequences."""
    from scaletrain.measure.step import make_batches, step_loss
    from scaletrain.measure.trace_experts import experts_per_token
    from scaletrain.measure.trace_structure import TRACE_BATCH

    (ids,) = make_batches(1, TRACE_BATCH, seq_len, harness.vocab_size, harness.device, 0)

    def forward() -> None:
        with harness.autocast():
            step_loss(harness, ids)

    return experts_per_token(decoder_layers(harness.model), TRACE_BATCH * seq_len, forward)

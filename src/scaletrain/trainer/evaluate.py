"""The eval split (issue 22): --eval-data, or train.eval_fraction of --data's blocks held out, evaluated every
train.eval_every optimizer steps (default checkpoint_every) and after the last one.

Every rank evaluates an equal share of the eval blocks (a ZeRO-3 forward is a collective: the same number of
micro-batches everywhere), in the training micro batch, without gradients; the loss is weighted by each batch's
trained tokens and summed over the ranks, so eval_loss is the mean over every trained token of the split (and
perplexity its exponential). No torch at import.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from scaletrain.trainer import data as data_mod


def split_eval(blocks: data_mod.Blocks, fraction: float) -> tuple[data_mod.Blocks, data_mod.Blocks | None]:
    """(training blocks, held-out blocks): the last ⌈fraction × N⌉ blocks, at least one, when fraction > 0."""
    if fraction <= 0:
        return blocks, None
    n = max(1, int(-(-fraction * len(blocks) // 1)))
    if n >= len(blocks):
        from scaletrain.engine.errors import ScaletrainError
        raise ScaletrainError(f"eval_fraction {fraction} of {len(blocks)} blocks leaves nothing to train on; lower "
                              "it or add data")

    def cut(a: int, b: int | None) -> data_mod.Blocks:
        return replace(blocks, input_ids=blocks.input_ids[a:b], labels=blocks.labels[a:b],
                       attention_mask=blocks.attention_mask[a:b])
    return cut(0, len(blocks) - n), cut(len(blocks) - n, None)


def rank_rows(n_rows: int, rank: int, world: int) -> list[int]:
    """This rank's equal share of the eval blocks (every rank one block when there are fewer than ranks)."""
    per = n_rows // world
    if per == 0:
        return [rank % n_rows]
    return list(range(rank * per, (rank + 1) * per))


def evaluate(model: Any, blocks: data_mod.Blocks, micro_batch: int, device: Any, rank: int, world: int,
             all_sum: Any, loss_of: Any = None) -> tuple[float, float]:
    """(eval loss over the split's trained tokens, seconds it took); every rank calls it. `loss_of(batch)`: the
    training loop's loss (the chunked one under --loss chunked: no B·S·V logits in evaluation either)."""
    import torch

    t0 = time.perf_counter()
    rows = rank_rows(len(blocks), rank, world)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    tokens = 0
    was = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(rows), micro_batch):
            idx = rows[i:i + micro_batch]
            batch = {k: torch.tensor([getattr(blocks, k)[j] for j in idx], device=device)
                     for k in ("input_ids", "labels", "attention_mask")}
            counted = int((batch["labels"][:, 1:] != data_mod.IGNORE_INDEX).sum())
            if counted:
                loss = loss_of(batch) if loss_of is not None else model(**batch).loss
                loss_sum += loss.double() * counted
                tokens += counted
    model.train(was)
    total, n = all_sum([float(loss_sum), float(tokens)])
    return (total / n if n else float("nan")), time.perf_counter() - t0

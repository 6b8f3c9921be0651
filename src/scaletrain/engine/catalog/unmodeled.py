"""What the memory model does not count yet, by model_type: a plan that would rely on it is refused in one line
saying what was measured (never planned silently under), and the sweep (bench/architecture_sweep.py) records why."""

from __future__ import annotations

UNMODELED_EAGER = {"gemma2": "its eager attention (scores capped by tanh, attn_logit_softcapping) is not in the "
                             "analytic model yet: 14-18 % under torch.profiler (bench/results/architecture_sweep.json)"}
# Checkpointed plans a model_type's trace does not count yet, refused with what was measured (planned without
# checkpointing, which was measured right): gemma3n's per-layer inputs (B·S·L·256, projected and normed outside
# the blocks) are normed backward after every block, when checkpointing has freed the blocks' tensors
UNMODELED_CHECKPOINTING = {"gemma3n_text": "the backward of its per-layer inputs' norm (B·S·layers·256, outside the "
                                           "blocks) is not in its trace yet: checkpointed plans measured 10-11 % "
                                           "under torch.profiler, without checkpointing within 1.1 % "
                                           "(bench/results/architecture_sweep.json)"}
# gemma4 (per-layer inputs as gemma3n, one layer with a wider head_dim): its checkpointed step peaks in that layer's
# recomputed attention backward, above the traced moments; why is not found yet (bench/results/architecture_sweep.json)
_GEMMA4 = ("its checkpointed backward peaks above what its trace counts (per-layer inputs, a layer of wider heads): "
           "LoRA + checkpointing measured 6-8 % under torch.profiler, without checkpointing within 0.2 % "
           "(bench/results/architecture_sweep.json)")
UNMODELED_CHECKPOINTING.update(gemma4_text=_GEMMA4, gemma4_unified_text=_GEMMA4)
# recurrent_gemma: its recurrence runs as a Python loop over positions, and a checkpointed backward keeps about ten
# B·S·lru_width gradients per recurrent layer until the backward ends (torch.profiler at the peak: 42 of them over
# 4 layers at 128 tokens), which one layer's traced backward at a time does not count
UNMODELED_CHECKPOINTING["recurrent_gemma"] = (
    "a checkpointed backward keeps gradients of every recurrent layer until it ends, which its trace does not count "
    "yet: LoRA + checkpointing measured 25-50 % under torch.profiler (64-256 tokens), full fine-tuning without "
    "checkpointing 7.7 % over (bench/results/architecture_sweep.json)")

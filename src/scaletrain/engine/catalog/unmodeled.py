"""What the memory model does not count yet, by model_type: a plan that would rely on it is refused in one line
saying what was measured (never planned silently under), and the sweep (bench/architecture_sweep.py) records why."""

from __future__ import annotations

UNMODELED_EAGER = {"gemma2": "its eager attention (scores capped by tanh, attn_logit_softcapping) is not in the "
                             "analytic model yet: 14-18 % under torch.profiler (bench/results/architecture_sweep.json)"}
# Checkpointed plans a model_type's trace does not count yet, refused with what was measured (planned without
# checkpointing). Empty since TRACE_FORMAT 18: gemma3n_text (10-11 % under), gemma4_text and gemma4_unified_text
# (6-8 % under) and recurrent_gemma (25-50 % under) were refused here. What their checkpointed layers leave alive
# to the end of backward (gemma4's keys/values shared with later layers, recurrent_gemma's per-position loop) is now
# traced (fwd_left/bwd_left), and the trace reads the allocator, not a dispatch mode that changed the program: their
# LoRA + checkpointing steps measure +0.1 %, -0.1 % and gemma3n_text's +5.7 % (bench/results/architecture_sweep.json)
UNMODELED_CHECKPOINTING: dict[str, str] = {}

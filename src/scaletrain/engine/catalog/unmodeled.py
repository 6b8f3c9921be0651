"""What the memory model does not count yet, by model_type: a plan that would rely on it is refused in one line
saying what was measured (never planned silently under), and the sweep (bench/architecture_sweep.py) records why."""

from __future__ import annotations

# Attention kernels a model_type's plan does not count yet, refused with what was measured. gemma2's eager
# attention (scores capped by tanh, attn_logit_softcapping) was here, 14-18 % under, until its tanh output was
# counted (engine/catalog/softcaps.py).
UNMODELED_EAGER: dict[str, str] = {}
# Checkpointed plans a model_type's trace does not count yet, refused with what was measured (planned without
# checkpointing). gemma3n_text (10-11 % under) and recurrent_gemma (25-50 % under) were refused here until
# TRACE_FORMAT 18: what a checkpointed layer's backward leaves alive to the end of backward (recurrent_gemma's
# per-position loop) is traced (`bwd_left`) and the trace reads the allocator, not a dispatch mode that changed the
# program; their LoRA + checkpointing steps measure -0.1 % and +5.4 % (over: safe side).
# gemma4_text and gemma4_unified_text were here (LoRA + checkpointing 6 % under) until TRACE_FORMAT 28: the last
# layer of each attention type stores its keys and values in a dict every layer's checkpoint keeps, so they outlive
# the forward; the trace measures what a layer's forward allocated and is still alive when the forward ends
# (`fwd_kept`) and the engine keeps it to the end of backward (LoRA + checkpointing +0.0 %, full +0.1 %).
# hrm_text was here (-2.4 % under, LoRA + checkpointing) until every looped stack's checkpointing was refused from
# its trace (engine/estimate/traced_blocks.py LOOPED_CHECKPOINTING): dory's measured the same.
UNMODELED_CHECKPOINTING: dict[str, str] = {}

"""The engine's side of the measuring room (`scaletrain/measure/`): the one module it runs, and the formats of the
answers it caches.

The engine never imports torch or transformers; what only they can answer (a model's traced structure, your data
read and tokenized as the trainer will) is asked of one child process, `python -m scaletrain.measure.probe KIND`.
Both sides import the formats from here: an answer cached in another format is asked again.
"""

from __future__ import annotations

import sys

PROBE_MODULE = "scaletrain.measure.probe"      # the one entry point the engine runs (measure/probe.py)
# trace (engine/catalog/traced.py ↔ measure/trace.py) — 4: layer kinds, non-negative fits checked at a fourth
# length, trace lengths on the kernels' chunks, peft's counts, the sizes as transformers reads them, the attention
# kernels the model class supports. 5: the model's buffers and the head's own width. 6: traced at two sequences
# (measure/trace_structure.py TRACE_BATCH), rises fitted through the longest lengths. 7: the embedding output
# a frozen embedding hands checkpointed blocks as a leaf, counted with the shared tensors. 8: each kind's `input`,
# the bytes of the hidden states its layers receive (what a checkpointed layer keeps; hy_v4's hyper-connections).
# 9: a sliding window at least the planned length traced as longer than every trace length (causal there).
# 10: the structure names its largest parameter tensor (for-loop AdamW's temporaries: roc_bert's shape embedding).
# 11: the backward between the output head and the last layer (`tail_bwd`: rembert's head transform).
# 12: a layer's input counts what the layer before returned beside its hidden states (zaya's router states).
# 13: a view of a parameter or buffer is no allocation in a layer's rise (gpt_neo's causal-mask buffer).
# 14: carried checkpoint inputs only where a gradient flows (hy_v4's top-k indices stay with the shared tensors).
# 15: the decoder layers leave out a multimodal model's towers; `gradless_params` (trainable, no gradient on text).
# 16: a rise's fit over the three longest lengths, the shorter ones' shortfall apart (`*_below`, `long_from`).
# 17: a window's rise is the CPU allocator's (torch.profiler), not a dispatch mode's count of storages.
# 18: checkpointed layers' forward and backward leave-behinds (`fwd_left`, `bwd_left`: gemma4's shared keys/values).
# 19: a layer spread over parallel module lists is counted per layer (XLM's attentions beside its ffns).
# 20: peft's LoRA count per decoder layer (`per_rank_by_layer`: beam's MoE layers hold 10× its dense layers').
# 21: the backward before the stack (`front_bwd`) and what the first layer's backward leaves for the whole stack
#     (`bwd_carry`: gemma3n's gradient of the per-layer inputs), apart from its kind's leave-behind.
# 22: a looped stack traced (a layer run k times: its k runs' saved bytes and checkpointed inputs, its largest rise,
#     its k backward nets); a stack built as several lists of one layer class traced whole (hrm_text's L and H).
# 23: a stack whose layers ran without autograd in the forward (reformer's reversible layers) is refused, not traced.
# 24: that stack traced: each layer's backward window opens where its parts are recomputed in the backward, over
#     the run's start less the gradients made (reformer, +0.5 %); a forward that writes its own config (reformer's
#     unset num_buckets) is refused, naming the key; a loss with no gradient path under LoRA is refused in one line.
# 25: `gradless_names`: the names of the trainable parameters a step on text gives no gradient (the trainer freezes
#     them under DDP, whose reducer would wait for them).
# 26: a regime's `loss` ("chunked": the trainer's chunked loss runs in the trace, not the model's own, which fails
#     on a text batch for git); `gradless_params` counted on the real model's meta build (the slice's vocabulary
#     is shrunk) and `largest_stepped_param` (for-loop AdamW's temporaries: git's largest tensor is its tower's).
# 27: `buffer_fixed_elems`/`buffer_fixed_bytes`: floating buffers a 16-bit build keeps in their own dtype (gptj's
#     and codegen's fp32 sin/cos table beside a bf16 base).
# 28: `frozen_params` (what transformers builds frozen: no gradient, no optimizer state, as the trainer runs it); a
#     model whose stacks are all pretrained sub-models of its decoder (blt's local encoder, global transformer and
#     local decoder) traced over every stack, its frozen one (the entropy patcher) left out of the layers; a
#     checkpointed layer's forward allocations still alive when the forward ends (`fwd_kept`: gemma4's stored keys
#     and values).
# 29: block linears include nn.Linear subclasses whose forward answers as nn.Linear's does (falcon's FalconLinear:
#     it had none, so no block GEMM in its time, nothing quantized under QLoRA and no LoRA targets to show).
# 30: and transformers' Conv1D (gpt2, gpt-sw3, openai-gpt: the same gaps, and a full plan without checkpointing on
#     a GPU failed on an empty list of linears); `position_table`: the rows of a learned position table (gpt2's
#     1024), past which a sequence cannot run.
# 31: a kind's routed experts (`experts`: each 3-D expert weight's [E, a, b]) and, per regime, the expert rows a
#     token runs through (`experts_per_token`, counted in a forward: measure/trace_experts.py): a traced MoE's time
#     had no expert GEMMs (granitemoe 1B-A400M on one H100: 23 ms of matmul where its experts alone take 50).
TRACE_FORMAT = 31
TRACE_OUT_OF_MEMORY = 4     # a served answer's code: refused at the trace process's memory cap, and that process ends
# data profile (engine/request/data_profile.py ↔ measure/data_profile.py)
PROFILE_FORMAT = 2
PROBES = ("trace", "data-profile", "tokenizer-check")


def probe_argv(kind: str, *args: str) -> list[str]:
    """The argument list of one probe process (this interpreter, the probe entry point, its kind and arguments)."""
    if kind not in PROBES:
        raise ValueError(f"no probe {kind!r}; probes: {', '.join(PROBES)}")
    return [sys.executable, "-m", PROBE_MODULE, kind, *args]

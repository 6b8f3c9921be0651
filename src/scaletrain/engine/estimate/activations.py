"""What a step keeps for backward, per micro-batch: each decoder block's saved tensors, and what lives outside the
blocks (rotary tables, the final norm, lm_head's inputs, the cross-entropy over the vocabulary)."""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.engine.catalog.layer_types import layer_types, windowed_layers
from scaletrain.engine.catalog.moe import peft_converted_names
from scaletrain.engine.catalog.softcaps import attn_softcap, final_softcap
from scaletrain.engine.estimate.chunked_loss import chunked, hidden_saved
from scaletrain.engine.estimate.moe_activations import moe_half
from scaletrain.engine.estimate.numerics import Numerics, numerics
from scaletrain.engine.estimate.setup import TrainingSetup
from scaletrain.engine.estimate.traced_blocks import traced_block_terms, traced_outside_blocks


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one decoder block keeps for backward, split at the attention/MLP boundary.

    Backward runs the MLP half first and frees its tensors before the attention half runs, so the block's
    backward peak is max(everything + MLP-gradient temporaries, attention half + attention temporaries).
    `weight_copies` are the 16-bit copies of fp32 weights autocast makes for this block (saved for backward).
    """

    saved_attn: int      # norms, what the q/k/v readers keep, q/k/v, attention output, softmax (eager)
    saved_mlp: int       # norms, what gate/up keep, the four B·S·I MLP tensors (three under LoRA + the adapter's)
    fwd_transient: int   # extra bytes alive while the block runs forward
    mlp_bwd_transient: int
    attn_bwd_transient: int
    weight_copies: int = 0
    cached_copies: int = 0   # the part autocast's cache holds until forward returns (trainable fp32 weights)
    recompute_transient: int = 0   # on top of `saved` while checkpointing recomputes the block, at down_proj
    # what a checkpointed block keeps: its input as the layer receives it (traced: its real width, several residual
    # streams under hyper-connections); 0: t·h in the residual dtype, the analytic layouts' input
    checkpointed_input: int = 0
    # a stack of unlike layers (a traced model's kinds): the largest block's moments, the fields above averaged
    worst: "LayerActivations | None" = None
    # checkpointed (traced): what a block's backward leaves alive until the end of backward, beyond its gradients
    # (recurrent_gemma's per-position loop)
    bwd_left: int = 0
    # checkpointed (traced): what a block's forward leaves alive beyond its output, held by the stack's loop until
    # the next block's forward returns (megatron-bert's layers return their attention probabilities, B·heads·S²)
    fwd_left: int = 0
    # checkpointed (traced): of that, what outlives the forward, per block on average, alive to the end of backward
    # (gemma4's keys and values, stored for the layers that share them in a dict every checkpoint keeps)
    fwd_kept: int = 0
    # traced: what the first block to run backward leaves for the rest of backward, once for the whole stack (gemma3n:
    # the gradient of the per-layer inputs every block reads, which the blocks after it accumulate into)
    bwd_carry: int = 0
    # and layer by layer, first to last: (bytes it keeps for backward, its backward moment, its parameters, what
    # its backward leaves)
    stack: tuple[tuple[int, int, int, int], ...] = ()
    # traced: a looped stack (a layer runs several times in one forward: hrm_text's cycles), the layers' runs with
    # gradients in the order they ran (the fields above per layer: its runs' sum); empty for a stack run once
    looped: tuple[int, ...] = ()

    @property
    def saved(self) -> int:
        return self.saved_attn + self.saved_mlp

    @property
    def bwd_peak(self) -> int:
        """Peak bytes of this block's own tensors during its backward (saved + gradient temporaries)."""
        return max(self.saved + self.mlp_bwd_transient, self.saved_attn + self.attn_bwd_transient)


def _norm_saved(width: int, rows: int, in_bytes: int, trainable: bool, style: str) -> int:
    """Per token: what one RMSNorm over `width` saves for backward (transformers' RMSNorm modules).

    Its input in fp32 (the input itself when it is fp32 already, else an upcast copy) and 1/rms per row; when its
    weight trains, also the normalized value the weight multiplies: `weight * y.to(input dtype)` (Llama, Qwen,
    Mistral) or fp32 y (OLMo 2's `(weight * y).to(dtype)`, Gemma's `y * (1 + weight)`).
    """
    out = 4 * width + 4 * rows
    if trainable:
        out += in_bytes * width if style == "llama" else 4 * width
    return out


def _reader_saved(width: int, src_bytes: int, readers: int, adapted: int, nm: Numerics, full: bool,
                  shared_with_attention: bool = False) -> int:
    """Per token: what the linears reading one tensor of `width` (`src_bytes` per element) save of it.

    Full fine-tuning: each weight gradient needs the input. Under autocast an fp32 input is cast per linear (one
    16-bit copy each); otherwise all readers share the tensor (`shared_with_attention`: sdpa already keeps it).
    LoRA: frozen base linears save nothing of their input (torch saves only what a needed gradient reads); each
    adapter saves what lora_A multiplies: its own 16-bit cast under autocast, else PEFT's cast to the adapter
    dtype (a no-op, so one shared tensor, when the dtypes already agree).
    """
    if full:
        if nm.autocast and src_bytes == 4:
            return readers * 2 * width
        return 0 if shared_with_attention else src_bytes * width
    if adapted == 0:
        return 0
    if nm.autocast:
        return adapted * 2 * width
    if src_bytes == nm.adapter:
        return 0 if shared_with_attention else src_bytes * width
    return adapted * nm.adapter * width


ATTENTION_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")


def block_activations(s: TrainingSetup, micro_batch: int | None = None, kind: str | None = None) -> LayerActivations:
    """Tensors one HF decoder block (Llama/Qwen/Mistral/Gemma/OLMo 2 layout) saves for backward, per micro-batch.

    Per token: each RMSNorm's fp32 input and 1/rms (+ the normalized value when its weight trains), what the
    linears keep of their inputs (see _reader_saved), q/k/v as attention receives them (sdpa/flash keep k and v at
    the kv-head width and an fp32 log-sum-exp; eager repeats k and v to all heads and keeps the fp32 softmax and its
    16-bit cast), the attention output, and the MLP's gate, up, act(gate) and act·up. LoRA adds each adapter's
    rank-r intermediate. Checked byte for byte against torch's saved-tensor hooks (tests/trainer/test_memory_saved.py).
    MoE models: the MLP half is moe_activations.py's; `kind` "moe" / "dense" gives one block kind, None the
    average over the model's blocks (dense layers of mlp_only_layers included), rounded up.
    """
    if s.model.memory_source == "traced":
        terms = traced_block_terms(s, micro_batch, weight_copies_bytes(s), _flash_backward_bytes)
        worst = terms.pop("worst", None)
        return LayerActivations(**terms, worst=LayerActivations(**worst) if worst else None)
    m = s.model
    nm = numerics(s)
    b = micro_batch or s.micro_batch
    t = b * s.seq_len
    S = s.seq_len
    h, i, nh = m.hidden_size, m.intermediate_size, m.num_heads
    c, r = nm.compute, nm.residual
    fam = m.family
    style = fam.get("norm_style", "llama")
    full = s.method == "full"
    # LoRA targets peft adapts as nn.Linear (on qwen3_moe/olmoe/mixtral it moves the expert names to the experts)
    targets = set() if full else set(s.lora_targets) - set(peft_converted_names(m.model_type))

    def n_adapted(*names: str) -> int:
        return sum(1 for x in names if x in targets)

    def adapter_out(*names: str) -> int:
        return n_adapted(*names) * s.lora_rank * (2 if nm.autocast else nm.adapter)

    attn = _attention_half(s, nm, targets)
    eager = eager_attention(s)

    # -- MLP half (per token) -------------------------------------------------------------------------------------
    pre_mlp = _norm_saved(h, 1, r, full, style) if "pre_mlp" in fam["norms"] else 0
    mlp = pre_mlp
    mlp += _reader_saved(h, r, 2, n_adapted("gate_proj", "up_proj"), nm, full)
    mb = nm.mlp_bytes
    mlp += 3 * mb * i                                    # gate (act input), up, act(gate)
    down_in = mb * i if full else _reader_saved(i, mb, 1, n_adapted("down_proj"), nm, full)
    mlp += down_in                                       # act·up (or what down_proj's adapter keeps of it)
    mlp += adapter_out("gate_proj", "up_proj", "down_proj")
    if "post_mlp" in fam["norms"]:
        mlp += _norm_saved(h, 1, c, full, style)

    # -- per block, independent of tokens --------------------------------------------------------------------------
    const = 0
    if style == "gemma":   # each norm keeps its fp32 (1 + weight)
        const += 4 * h * len(fam["norms"]) + (8 * m.head_dim if fam["qk_norm"] == "head" else 0)
    copies, cached = weight_copies_bytes(s, kind)

    s2 = b * nh * S * S   # attention score elements
    # forward: eager holds the raw scores and the masked scores (fp32) while softmax runs
    fwd_t = 2 * s2 * 4 if eager else t * i * mb
    # backward: gradients of the B·S·I intermediates; eager's softmax input/output gradients (2 × B·heads·S²);
    # sdpa's gradients of q, k, v (CPU kernels) or FlashAttention-2's (CUDA, see _flash_backward_bytes)
    mlp_bwd_t = 2 * t * i * mb
    if m.moe is not None:
        half = moe_half(s, nm, full, lambda w, sb, rd, ad: _reader_saved(w, sb, rd, ad, nm, full))
        shared = [x for x in m.lora_target_shapes(tuple(targets) or None) if x not in ATTENTION_LINEARS]
        moe_mlp = pre_mlp + half.per_token + (adapter_out(*shared) if targets else 0)
        n_moe = sum(n for d, n in m.block_kinds() if not d)
        n_dense = m.num_layers - n_moe
        if kind == "moe" or (kind is None and n_dense == 0):
            mlp, const = moe_mlp, const + half.const
        elif kind is None:
            mlp = -(-(n_moe * moe_mlp + n_dense * mlp) // m.num_layers)
            const += -(-n_moe * half.const // m.num_layers)
        # batched_mm under autocast: at down's gather the block's saved tensors so far, with the fp32 gathers beside
        fwd_t = max(fwd_t, t * half.fwd_transient, t * (attn + moe_mlp + half.gather_rise) if half.gather_rise else 0)
        mlp_bwd_t = max(mlp_bwd_t, half.backward_bytes(t))
    o_proj_saved = _reader_saved(m.q_dim, c, 1, n_adapted("o_proj"), nm, full) + adapter_out("o_proj")
    attn_bwd_t = _attention_backward_transient(s, nm, b, o_proj_saved)
    if nm.trainable_copies:   # the 16-bit weight gradient of the largest linear before its fp32 conversion
        mlp_bwd_t += c * max((a * o for a, o, _ in m.linear_shapes().values()), default=0)
    recompute_t = 0
    sinks_cast = eager and fam.get("sinks") and c < nm.residual     # gpt_oss's probabilities cast under autocast
    if sinks_cast:
        # the block's forward at the probabilities' cast, on top of the blocks before it (no MoE gradient yet)
        fwd_t = max(fwd_t, t * (attn - o_proj_saved) + _sinks_recompute(s, nm, b, 0))
    if m.moe is not None and s.grad_ckpt:
        recompute_t = t * half.gather_rise
        if sinks_cast:
            recompute_t = max(recompute_t, _sinks_recompute(s, nm, b, half.first_backward) - t * (mlp + o_proj_saved))
    if m.moe is None:
        # at gate_proj's / up_proj's adapter add, what down_proj keeps does not exist yet (counted in `saved`)
        add_t = _adapter_add_transient(s, nm, n_adapted("gate_proj", "up_proj"))
        recompute_t = t * max(_down_proj_transient(s, nm, full, "down_proj" in targets),
                              add_t - down_in if add_t else 0)
    return LayerActivations(t * attn + const, t * mlp, fwd_t, mlp_bwd_t, attn_bwd_t, copies, cached, recompute_t)


def _down_proj_transient(s: TrainingSetup, nm: Numerics, full: bool, down_adapted: bool) -> int:
    """Per token: what a block's forward holds besides its saved tensors while down_proj runs (read from
    torch.profiler's timeline at the peak of a checkpointed LoRA step, bf16 base under autocast).

    act·up, down_proj's input (LoRA: the frozen base linear does not save it; full: it is saved already); PEFT's
    cast of it to the adapter's dtype when they differ (lora/layer.py `_cast_input_dtype`: fp32 adapters under
    autocast upcast the 16-bit B·S·I input, then autocast casts it back for lora_A); down_proj's output; the MLP's
    input, held by LlamaMLP.forward's frame until it returns; the attention residual, held by the decoder layer's
    frame for the second residual add. Under checkpointing this happens again in backward on top of everything.
    """
    m = s.model
    i, h = m.intermediate_size, m.hidden_size
    mb, c, r = nm.mlp_bytes, nm.compute, nm.residual
    # act·up: counted in `saved` already when it is the very tensor lora_A keeps (same dtype, no autocast)
    act_up = 0 if full or (down_adapted and not nm.autocast and mb == nm.adapter) else mb * i
    upcast = adapter_input_cast(nm, i, mb) if down_adapted else 0
    return act_up + upcast + c * h + c * h + r * h


def _adapter_add_transient(s: TrainingSetup, nm: Numerics, adapted_in_mlp: int) -> int:
    """Per token, on top of the block's saved tensors: a checkpointed block's recompute at gate_proj's or up_proj's
    adapter when LoRA's fp32 adapters meet a 16-bit base without autocast (--master-weights bf16).

    peft's `result + lora_B(lora_A(x)) * scaling` (lora/layer.py Linear.forward) adds the fp32 branch (B·S·I) to the
    base layer's 16-bit output into an fp32 sum, then casts it back; the CPU's add first copies the 16-bit operand
    to fp32 (TensorIterator's type promotion: torch.profiler shows three fp32 B·S·I `_to_copy`/add tensors alive at
    this add). The projection's own output is not saved yet (−mb·i); the MLP's input and the attention residual are
    held by their frames (c·h + r·h, as at down_proj). The caller takes off what down_proj keeps (recomputed after
    this add). Zero under autocast, where the branch is 16-bit."""
    if nm.autocast or nm.adapter == nm.compute or not adapted_in_mlp or not s.grad_ckpt:
        return 0
    i, h = s.model.intermediate_size, s.model.hidden_size
    mb = nm.mlp_bytes
    fp32_copies = 3 if s.device == "cpu" else 2
    return mb * i + fp32_copies * nm.adapter * i - mb * i + nm.compute * h + nm.residual * h


def adapter_input_cast(nm: Numerics, width: int, src_bytes: int) -> int:
    """Per token: PEFT's copy of an adapted linear's input in the adapter's dtype, alive while lora_A runs
    (peft tuners_utils.py `_cast_input_dtype`; none when the dtypes agree)."""
    return nm.adapter * width if nm.adapter != src_bytes else 0


def eager_attention(s: TrainingSetup) -> bool:
    """Attention runs transformers' eager path: asked for, or gpt_oss asked for sdpa, which transformers 5.24 refuses
    for it (GptOssPreTrainedModel._supports_sdpa = False): eager is what such a run can use."""
    return s.attn == "eager" or (s.attn == "sdpa" and bool(s.model.family.get("sinks")))


def eager_masks(s: TrainingSetup) -> int:
    """Additive masks eager attention keeps: one per attention type the layers use. The models build a mask per
    entry of config.layer_types (gpt_oss, gemma2, gemma3: sliding and full, each B×1×S×S even where the window is
    longer than the sequence: modeling_gemma2.py Gemma2Model.forward causal_mask_mapping)."""
    m = s.model
    return len(set(layer_types(m.config, m.model_type, m.num_layers)))



def _attention_half(s: TrainingSetup, nm: Numerics, targets: set[str]) -> int:
    """Per token: what a block's attention half saves (block_activations): its norms, what q/k/v keep of their
    input, q/k norms, the attention core as sdpa or eager keeps it, o_proj's input, the adapters' rank-r
    intermediates and a post-attention norm."""
    m = s.model
    S = s.seq_len
    h, qd, kvd = m.hidden_size, m.q_dim, m.kv_dim
    nh, nkv = m.num_heads, m.num_kv_heads
    c, r = nm.compute, nm.residual
    fam = m.family
    style = fam.get("norm_style", "llama")
    full = s.method == "full"

    def n_adapted(*names: str) -> int:
        return sum(1 for x in names if x in targets)

    def adapter_out(*names: str) -> int:
        return n_adapted(*names) * s.lora_rank * (2 if nm.autocast else nm.adapter)

    attn = 0
    if "pre_attn" in fam["norms"]:
        attn += _norm_saved(h, 1, r, full, style)
    attn += _reader_saved(h, r, 3, n_adapted("q_proj", "k_proj", "v_proj"), nm, full)
    qk = fam["qk_norm"]
    if qk:
        qk_style = "gemma" if style == "gemma" else ("olmo" if style == "olmo" else "llama")
        rows_q, rows_k = (nh, nkv) if qk == "head" else (1, 1)
        attn += _norm_saved(qd, rows_q, c, full, qk_style) + _norm_saved(kvd, rows_k, c, full, qk_style)
    eager = eager_attention(s)
    if eager and fam.get("sinks"):
        # gpt_oss: q, k and v repeated to every head, the max's indices (int64 per head), the softmax over the
        # scores and the sink column in the mask's (residual) dtype, and its cast to the compute dtype for
        # attention·V when they differ (modeling_gpt_oss.py eager_attention_forward)
        attn += 3 * c * qd + 8 * nh + nh * (S + 1) * r + (nh * S * c if r != c else 0)
        attn += _reader_saved(qd, c, 1, n_adapted("o_proj"), nm, full)
    elif eager:
        # q, k and v repeated to every head, fp32 softmax (+ its 16-bit cast), the transposed output for o_proj;
        # gemma2 caps the scores (scores / cap, tanh, · cap) and tanh keeps its output for backward
        capped = c if attn_softcap(m.config, m.model_type) else 0
        attn += 3 * c * qd + nh * S * (4 + (c if c < 4 else 0) + capped)
        attn += _reader_saved(qd, c, 1, n_adapted("o_proj"), nm, full)
    else:
        attn += c * (qd + 2 * kvd) + 4 * nh + c * qd       # q, k, v, fp32 log-sum-exp, output (o_proj's input)
        attn += _reader_saved(qd, c, 1, n_adapted("o_proj"), nm, full, shared_with_attention=True)
    windowed = sliding_layers(s)
    if windowed and not eager:
        # a sliding-window layer passes sdpa a mask, so transformers repeats k and v to every head
        # (integrations/sdpa_attention.py use_gqa_in_sdpa): the extra width, averaged over the blocks
        attn += windowed * 2 * c * (qd - kvd) // m.num_layers
    attn += adapter_out("q_proj", "k_proj", "v_proj", "o_proj")
    if "post_attn" in fam["norms"]:
        attn += _norm_saved(h, 1, c, full, style)

    return attn


def _attention_backward_transient(s: TrainingSetup, nm: Numerics, b: int, o_proj_saved: int) -> int:
    """Bytes the attention core's backward allocates beyond the saved tensors, per micro-batch, net of the saved ones
    it has freed by then (eager); `o_proj_saved`: per token, what o_proj and its adapter keep."""
    m = s.model
    S, nh, c, r = s.seq_len, m.num_heads, nm.compute, nm.residual
    s2 = b * nh * S * S   # attention score elements
    eager = eager_attention(s)
    if eager and m.family.get("sinks"):
        return _sinks_backward_transient(s, b * nh * S * (S + 1), s2 * c if c < r else 0, r)
    elif eager:
        # at softmax's backward (torch.profiler at the peak of a chunked-loss step, eager, bf16 and fp32): the
        # gradients of its fp32 output and input, and the residual stream's gradient; o_proj's saved input and,
        # under 16-bit compute, the 16-bit probabilities are gone (their backward ran), and the gradient of the
        # repeated V stands where the repeated V was
        return 2 * s2 * 4 - (s2 * c if c < 4 else 0) + b * S * (r * m.hidden_size - o_proj_saved)
    elif s.device == "cuda":
        return b * S * _flash_backward_bytes(s, c)
    else:
        return 3 * b * S * m.q_dim * c


def _sinks_recompute(s: TrainingSetup, nm: Numerics, b: int, moe_first_backward: int) -> int:
    """gpt_oss under autocast, checkpointed: the recompute's forward at the probabilities' 16-bit cast
    (modeling_gpt_oss.py eager_attention_forward), beyond the attention half's saved tensors (all but o_proj's
    input, made later; the MLP half is not recomputed yet). Its frames hold the masked scores and the logits with
    the sink column in the mask's (residual) dtype; q and k after the rotary embedding, promoted to that dtype by
    its cos/sin, and k repeated to every head; v as v_proj gave it; and the decoder layer's frame the normed input
    (autocast's 16-bit casts of it are what the linears save). The MoE's first backward node has written its
    gradient before the recompute began (`moe_first_backward` per token). Read from torch.profiler's timeline:
    tiny-gpt-oss, full fine-tuning, bf16 autocast + checkpointing, 2×256, where the step peaks."""
    m = s.model
    S, c, r = s.seq_len, nm.compute, nm.residual
    t = b * S
    scores = r * b * m.num_heads * S * (2 * S + 1)
    frames = t * (r * (2 * m.q_dim + m.kv_dim) + c * m.kv_dim + r * m.hidden_size)
    return scores + frames + t * moe_first_backward


def _sinks_backward_transient(s: TrainingSetup, scores: int, cast: int, r: int) -> int:
    """gpt_oss's eager attention backward (modeling_gpt_oss.py eager_attention_forward), beyond the block's saved
    tensors: the largest of its moments over the `scores` elements (the scores and the sink column, B·heads·S·(S+1),
    in the mask's dtype `r`). `cast`: the probabilities' 16-bit copy under autocast, saved for attention·V.

    - the softmax's backward: its incoming gradient, padded by the slice, and its output;
    - the max's backward (the logits minus their row max): the logits' gradient beside the zeros the max's gradient
      is scattered into, the probabilities freed by then; on the CPU a 16-bit scatter_ also allocates a buffer of
      the scores in fp32 (torch.profiler: bf16 LoRA + checkpointing at 1×512 peaks there; the softmax's moment
      alone planned it 6.4 % under);
    - (the checkpointed recompute's forward under autocast is _sinks_recompute's)."""
    softmax = 2 * scores * r - cast
    max_backward = scores * r - cast + (4 * scores if s.device == "cpu" and r < 4 else 0)
    return max(softmax, max_backward)


def sliding_layers(s: TrainingSetup) -> int:
    """Blocks whose attention is windowed at this sequence length (Gemma 3's local layers, Mistral v0.1): they
    need an explicit mask once the sequence reaches the window. Every spelling of which layers slide
    (layer_types, sliding_window_pattern, use_sliding_window + max_window_layers, the config classes' defaults) is
    read as transformers reads it: catalog/layer_types.py."""
    m = s.model
    return windowed_layers(m.config, m.model_type, m.num_layers, s.seq_len)


def _flash_backward_bytes(s: TrainingSetup, c: int) -> int:
    """Per token: what FlashAttention-2's backward allocates (flash_api.cpp mha_bwd, used by torch's sdpa on CUDA).

    dq, dk, dv (dk/dv at all heads when kv heads are shared, then summed to the kv width), the fp32 dq accumulator
    and the fp32 softmax row sums.
    """
    m = s.model
    qd, kvd, nh = m.q_dim, m.kv_dim, m.num_heads
    grads = c * 3 * qd + (c * 2 * kvd if m.num_kv_heads < nh else 0)
    return grads + 4 * qd + 4 * nh


def weight_copies_bytes(s: TrainingSetup, kind: str | None = None) -> tuple[int, int]:
    """16-bit copies of one block's fp32 weights that autocast makes per forward and backward keeps: (all, cached).

    Trainable fp32 weights (full fine-tuning under accelerate's mixed precision) are cast once per forward and
    cached until forward returns; frozen fp32 base linears (LoRA on an fp32 base) are cast at every call and
    not cached (torch caches only leaves that require grad); PEFT's fp32 adapters under autocast are cached.
    MoE models: the router's weight and eager's per-expert weights too (moe_activations.py), per block `kind`
    ("moe" / "dense"; None: the average over the blocks, rounded up).
    """
    m = s.model
    kinds = m.block_kinds()
    if kind is None and len(kinds) > 1:
        parts = [(n, weight_copies_bytes(s, "dense" if d else "moe")) for d, n in kinds]
        return tuple(-(-sum(n * c[j] for n, c in parts) // m.num_layers) for j in (0, 1))
    dense = kind == "dense" or m.moe is None
    nm = numerics(s)
    block_w = sum(a * o for a, o, _ in m.linear_shapes(dense).values())
    cached = 2 * block_w if nm.trainable_copies else 0
    moe_all = moe_cached = 0
    if not dense:   # the router's weight (F.linear) and eager's per-expert F.linear weights
        half = moe_half(s, nm, s.method == "full", lambda *a: 0)
        moe_all, moe_cached = half.weight_copies, half.cached_copies
    if s.method != "full" and nm.autocast and nm.adapter == 4:
        if m.moe is None:
            cached += 2 * s.trainable_params // max(m.num_layers, 1)
        else:   # this block's adapters; peft's expert adapters are cast only to a 16-bit base's dtype
            r = s.lora_rank
            adapters = sum(r * (a + o) for a, o, _ in m.lora_target_shapes(s.lora_targets, dense).values())
            adapters += m.expert_lora(r, s.lora_targets)[0] if not dense and nm.frozen == 2 else 0
            cached += 2 * adapters
    return cached + moe_all + (2 * block_w if nm.frozen_copies else 0), cached + moe_cached


def outside_blocks(s: TrainingSetup, micro_batch: int | None = None) -> dict[str, int]:
    """What the step keeps outside the decoder blocks, per micro-batch.

    `shared`: rotary cos/sin (one set; Gemma 3 has a local and a global one), the token ids and a sliding-window
    mask; `final`: the final norm and what lm_head keeps of its input, plus autocast's 16-bit copy of an fp32
    lm_head; `labels`: the shifted labels cross-entropy keeps (int64).
    """
    if s.model.memory_source == "traced":
        return traced_outside_blocks(s, micro_batch)
    m = s.model
    nm = numerics(s)
    b = micro_batch or s.micro_batch
    t = b * s.seq_len
    h = m.hidden_size
    full = s.method == "full"
    style = m.family.get("norm_style", "llama")
    rope_sets = 2 if m.model_type == "gemma3_text" else 1
    shared = rope_sets * 2 * t * m.head_dim * nm.residual + 8 * t
    windowed = 0 if eager_attention(s) else sliding_layers(s)
    window_mask = b * s.seq_len * s.seq_len * nm.compute if windowed else 0
    final = t * _norm_saved(h, 1, nm.residual, full, style)
    own_head = not (s.fused_lm_head or chunked(s))   # TRL's fused head, the chunked loss: their own saves
    if full and own_head:
        final += t * _reader_saved(h, nm.residual, 1, 0, nm, True)
    head_out = m.vocab_size if m.vocab_head else 1
    if (nm.trainable_copies or nm.fp32_head) and own_head:
        final += 2 * head_out * h
    final += hidden_saved(s, t) if chunked(s) else 0
    moe = m.moe
    if moe is not None and moe.aux_loss:
        # output_router_logits: load_balancing_loss_func keeps each MoE layer's softmax over the router logits (in
        # the logits' dtype) and its top-k indices, and the fp32 per-expert token counts of the final product
        n_moe = sum(n for d, n in m.block_kinds() if not d)
        final += n_moe * t * (moe.experts * nm.compute + 8 * moe.top_k) + 4 * moe.experts
    # a windowed layer passes sdpa transformers' boolean mask (one S×S storage expanded over the batch, one for the
    # model, gone when forward returns unless checkpointing keeps it as every block's input), which sdpa converts to
    # a B×1×S×S tensor of the q dtype at each call and keeps for backward: one per windowed layer through backward
    # without checkpointing, with it only while a block is recomputed (torch.profiler, tiny-mistral LoRA at 512
    # tokens, 4 layers: four converted masks alive at the loss; one counted, the step was 8.3 % under)
    bool_mask = s.seq_len * s.seq_len if (windowed and s.grad_ckpt) else 0
    return {"shared": shared + bool_mask + (0 if s.grad_ckpt else windowed * window_mask), "final": final,
            "labels": 8 * t, "window_mask": window_mask}


def logits_bytes(s: TrainingSetup, micro_batch: int | None = None) -> dict[str, int]:
    """Cross-entropy over the vocabulary, as transformers' ForCausalLMLoss runs it.

    lm_head writes B·S·V logits in the compute dtype; the loss upcasts them to fp32 (a copy under 16-bit) and
    log_softmax keeps its fp32 output for backward. Backward then holds that output, its incoming gradient and
    the gradient it produces: three fp32 B·S·V tensors at once. A model that caps its logits (gemma2:
    tanh(logits / cap) · cap, final_logit_softcapping) keeps tanh's output too, in the compute dtype.
    """
    b = micro_batch or s.micro_batch
    tv = b * s.seq_len * s.model.vocab_size
    c = numerics(s).compute
    saved = 4 * tv                                   # log_softmax output
    # a capped model's tanh output; a trace measures it itself (traced_blocks._head_tail)
    if final_softcap(s.model.config, s.model.model_type) and s.model.memory_source != "traced":
        saved += c * tv
    fwd = c * tv + (4 * tv if c == 2 else 0)         # logits (+ fp32 copy) while log_softmax runs
    bwd = 4 * tv + 4 * tv                            # grad of log_softmax output, grad of its input
    return {"saved": saved, "forward_transient": fwd, "backward_transient": bwd}

"""What each objective adds to a step, as the code that runs it does it (TRL 1.16 on transformers 5).

memory.py's `simulate_step` walks forward → loss → backward → step for every objective; what differs is asked here:

  head          the loss at the end of the model. sft: B·S·V logits and transformers' cross-entropy
                (activations.logits_bytes). reward: a score head (h×1) on 2× sequences, no logits at all. dpo/grpo:
                TRL's fused LM head (trl/trainer/utils.py add_fused_lm_head → trl/kernels/chunked_logprob.py), which
                never materialises B·S·V: it projects tiles of at most 4096 tokens × 32768 vocabulary columns into one
                buffer and folds each into running log-sum-exp statistics; its backward recomputes every tile and
                turns it into the logits' gradient in place, accumulating fp32 gradients of the hidden states and
                the head's weight. On CUDA (Triton) only the completion tokens are scored and the fold is one kernel;
                elsewhere (the CPU) every position is scored and the fold is torch ops with fp32 tile temporaries.
  reference     dpo `same`: a frozen copy of the policy (TRL builds it in the policy's dtype; none under LoRA, the
                base with adapters disabled) whose no-grad forward runs after the policy's, while the policy's graph
                is alive; grpo `same` (beta > 0): the same copy, run when completions are scored.
  generation    grpo: model.generate over micro × steps_per_generation completions (TRL generates once per optimizer
                step): a KV cache of 2·L·kv_dim per token, the prefill's block transients and the sampler's fp32
                rows; or a vLLM engine colocated in the process (a fixed share of the card, outside torch's
                allocator); or vLLM on separate GPUs (nothing here).

Every constant names the line it was read from; the CPU tile counts were checked against torch.profiler on the
kernel alone and match to the byte (tests/trainer/test_objectives_groundtruth.py checks whole steps).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from scaletrain.engine.estimate.activations import logits_bytes
from scaletrain.engine.estimate.chunked_loss import chunked, chunked_head
from scaletrain.engine.estimate.output_head import head_weight
from scaletrain.engine.estimate.numerics import numerics
from scaletrain.engine.estimate.setup import TrainingSetup

# trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE: tokens per tile row block
FUSED_TOKEN_CHUNK = 4096
# trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE: the tile buffer's columns, allocated whole even when V is smaller
FUSED_VOCAB_CHUNK = 32768
# _forward_tile (torch fallback) holds z, z − max and exp(z − max) at once: three fp32 tiles (+ tile.float() in 16-bit)
CPU_FORWARD_TILES = 3
# _backward_tile holds y, z, log_p, p, grad, is_target.float() and its difference with p (fp32) and is_target (bool,
# a quarter of an fp32 tile) at once: 7.25 fp32 tiles (torch.profiler on the kernel alone: 7.2529 incl. row vectors)
CPU_BACKWARD_TILES = 7.25
# transformers' sampler upcasts the last position's logits to fp32 and keeps their softmax (utils.py _sample)
SAMPLER_ROWS = 3


@dataclass(frozen=True)
class HeadCost:
    """The loss head of one micro-step, in the moments simulate_step walks."""

    name: str                # what it is, for the plan's breakdown
    forward_transient: int   # alive while the head's forward runs, on top of `saved`
    saved: int               # kept for backward from the head's forward to its backward
    backward_transient: int  # alive while the head's backward runs, on top of `saved`
    output_grad: int         # the head output's gradient while the head weight's gradient forms (sft: c·t·V)
    weight_params: int       # the head's weight: what its gradient holds
    labels: int              # int64 labels/targets (or the attention mask) kept through backward
    weight_grad_early: bool = False   # the head's fp32 weight gradient exists during its own backward (TRL fused)
    input_grad: int = 0      # the gradient of the head's input, formed in the same backward node as the weight's
    input_live: int = 0      # the head's input while the loss runs, when nothing saves it (a frozen head)


def tokens_per_micro(s: TrainingSetup, micro_batch: int | None = None) -> int:
    b = micro_batch or s.micro_batch
    return (2 * b if s.objective.pairs else b) * s.seq_len


def sequences(s: TrainingSetup, micro_batch: int | None = None) -> int:
    b = micro_batch or s.micro_batch
    return 2 * b if s.objective.pairs else b


def head_cost(s: TrainingSetup, micro_batch: int | None = None) -> HeadCost:
    """The objective's loss head (see the module doc)."""
    m = s.model
    nm = numerics(s)
    t = tokens_per_micro(s, micro_batch)
    c = nm.compute
    if s.objective == "reward":
        # GenericForSequenceClassification: score(hidden) → (2B, S, 1) logits, pooled at the last real token;
        # RewardTrainer's -logsigmoid(r_chosen − r_rejected) is over 2B scalars. Backward scatters into zeros of
        # the logits' shape. The attention mask (int64) goes in with the ids.
        return HeadCost("score head (h×1, no B·S·V logits)", forward_transient=c * t, saved=0,
                        backward_transient=c * t, output_grad=c * t, weight_params=m.hidden_size, labels=8 * t)
    if s.objective.log_probs:
        return fused_log_prob_head(s, micro_batch)
    if s.fused_lm_head:   # SFT under TRL's SFTTrainer: log-probs, entropy and top-1 hits from the fused head
        return sft_fused_head(s, micro_batch)
    if chunked(s):
        ck = chunked_head(s, t)
        return HeadCost("chunked lm_head + cross-entropy (no B·S·V logits)", ck["forward_transient"], ck["saved"],
                        ck["backward_transient"], ck["output_grad"], head_weight(m)[0], 8 * t,
                        weight_grad_early=True)
    lg = logits_bytes(s, micro_batch)
    weight, width = head_weight(m)
    # the model's forward holds the head's input (its last hidden states) until the loss returns; a trained head
    # saves it (counted with the final tensors), a frozen one does not (torch.profiler, OPT LoRA + checkpointing:
    # its B·S·768 head input alive beside the logits and log-softmax at the peak)
    live = nm.residual * t * width if s.method != "full" else 0
    return HeadCost("logits and cross-entropy (B·S·V)", lg["forward_transient"], lg["saved"],
                    lg["backward_transient"], c * t * m.vocab_size, weight, 8 * t, input_grad=c * t * width,
                    input_live=live)


def scored_tokens(s: TrainingSetup, micro_batch: int | None = None) -> int:
    """Positions TRL's fused head scores: on CUDA (Triton) only completion tokens; elsewhere every shifted position."""
    seqs = sequences(s, micro_batch)
    if s.device == "cuda":
        return seqs * s.completion_len
    return seqs * (s.seq_len - 1)


def fused_log_prob_head(s: TrainingSetup, micro_batch: int | None = None, entropy: bool | None = None,
                        trains_weight: bool | None = None) -> HeadCost:
    """TRL's ChunkedLogProbFunction over this micro-step's scored tokens (trl/kernels/chunked_logprob.py).

    Forward: the hidden states of the scored positions are copied (`hidden[mask]` on CUDA, `reshape` of the
    shifted slice elsewhere) and saved with the int64 targets and fp32 log-normaliser (and entropy for GRPO's
    policy); the tile buffer is min(N, 4096) × 32768 in the compute dtype. Backward: the fp32 gradients of the
    hidden states (N×h) and, when the head trains, of its weight (V×h) are allocated first, then the buffer again.
    The CPU's torch fold adds fp32 tile temporaries (CPU_FORWARD_TILES, CPU_BACKWARD_TILES).
    """
    m = s.model
    nm = numerics(s)
    c = nm.compute
    N = scored_tokens(s, micro_batch)
    V, h = m.vocab_size, m.hidden_size
    rows = min(N, FUSED_TOKEN_CHUNK)
    buffer = c * rows * FUSED_VOCAB_CHUNK
    tile = 4 * rows * min(V, FUSED_VOCAB_CHUNK)
    cpu = s.device != "cuda"
    entropy = s.objective == "grpo" if entropy is None else entropy
    trains_weight = s.method == "full" if trains_weight is None else trains_weight
    hidden_copy = nm.residual * N * h
    saved = hidden_copy + 8 * N + 4 * N * (2 if entropy else 1)
    fwd = buffer
    if cpu:
        fwd += CPU_FORWARD_TILES * tile + (tile if c == 2 else 0)
    grad_hidden = 4 * N * h
    grad_weight = 4 * V * h if trains_weight else 0
    bwd = buffer + grad_hidden + (int(CPU_BACKWARD_TILES * tile) if cpu else 0)
    casts = _fused_head_casts(s, rows)
    return HeadCost("log-prob tiles (TRL fused LM head, no B·S·V logits)", fwd + casts, saved,
                    bwd + casts + grad_weight, output_grad=0, weight_params=V * h if trains_weight else 0, labels=8 * N,
                    weight_grad_early=trains_weight)


def _fused_head_casts(s: TrainingSetup, rows: int) -> int:
    """The compute-dtype copies ChunkedLogProbFunction makes of what it reads in another dtype, alive while a tile is
    folded, in forward and again in backward (trl/kernels/chunked_logprob.py: `weight[start:end].to(compute_dtype)`,
    `hidden[token_start:token_end].to(compute_dtype)`; `.to` of a tensor already in that dtype copies nothing): the
    head's weight chunk when the weight is kept wider than the compute dtype (fp32 weights under autocast, a frozen
    fp32 head of LoRA on an fp32 base) and the hidden rows when the residual is (autocast's fp32 residual). Seen in
    the profiler's timeline at TRL's backward peak (bench/cpu_groundtruth.py, loop=trl under bf16 autocast: a bf16
    V×h and a bf16 rows×h temporary beside the fp32 tiles)."""
    m = s.model
    nm = numerics(s)
    c = nm.compute
    head_dtype = nm.weight if s.method == "full" else nm.frozen
    weight_cast = c * min(m.vocab_size, FUSED_VOCAB_CHUNK) * m.hidden_size if head_dtype > c else 0
    hidden_cast = c * rows * m.hidden_size if nm.residual > c else 0
    return weight_cast + hidden_cast


def sft_fused_head(s: TrainingSetup, micro_batch: int | None = None) -> HeadCost:
    """TRL 1.16's SFTTrainer (sft_trainer.py compute_loss): the fused head with outputs log_probs, entropy and
    is_top1 (its mean_token_accuracy metric), each masked back to B×(S−1) per-token tensors (utils.py
    _fused_forward: masked_fill), and the loss −log_probs.sum() / tokens. Those per-token tensors (fp32 log-probs,
    its negation and the fp32 entropy, the bool top-1 hits and label mask) live until compute_loss returns."""
    head = fused_log_prob_head(s, micro_batch, entropy=True)
    n = sequences(s, micro_batch) * (s.seq_len - 1)
    per_token = n * (4 + 4 + 4 + 1 + 1)
    return replace(head, name="log-prob tiles (TRL SFTTrainer's fused LM head, no B·S·V logits)",
                   forward_transient=head.forward_transient + per_token)


def held_outputs_bytes(s: TrainingSetup, micro_batch: int | None = None) -> int:
    """What `--loop accelerate-loop` keeps beyond the bundled trainer: the model's output object, bound to
    `outputs` from one forward until the next forward returns (`outputs = model(**batch);
    accelerator.backward(outputs.loss)`), so its B·S·V logits live through backward, the optimizer step and the next
    micro-step's forward: at every moment of the step (torch.profiler: the peak rises by exactly this at each phase).
    Their dtype: accelerate's mixed precision wraps forward in autocast and converts 16-bit outputs to fp32 copies
    (accelerator.py prepare_model → utils/operations.py convert_outputs_to_fp32; native amp is on for bf16/fp16 except
    under DeepSpeed), so 4 bytes; the compute dtype otherwise (fp32, bf16 weights without autocast, DeepSpeed's
    16-bit model). The other loops drop the object before backward; the chunked loss writes no logits.
    The profiler's timeline at the peak (backward through the loss) under fp32 weights + bf16 autocast, qwen2 with a
    64k vocabulary at 4 × 512 and a 32k one at 2 × 256 (bench/cpu_groundtruth.py AMP_LOOP_CASES), checkpointing on
    and off: four fp32 B·S·V tensors live -- the held copy (aten::to, accelerate's `.float()`), log_softmax's saved
    output and the two loss gradients; lm_head's bf16 logits are gone (freed when forward returns: the copy's
    ToCopyBackward saves nothing, nor does the loss's own `.float()`), so nothing 16-bit is held and the plan is
    within 0.05 % of the profiler."""
    if not s.loop.holds_outputs or s.objective != "sft" or s.loss == "chunked":
        return 0
    native_amp = s.precision != "fp32" and s.master_weights != "bf16" and not s.strategy.uses_deepspeed
    per = 4 if native_amp else numerics(s).compute
    return per * tokens_per_micro(s, micro_batch) * s.model.vocab_size


def reference_weight_bytes(s: TrainingSetup) -> int:
    """A frozen copy of the policy (`--ref-model same` under full fine-tuning): TRL builds it with the policy's
    dtype (trl/trainer/dpo_trainer.py, grpo_trainer.py: dtype=self.model.dtype); ZeRO-3 shards it like the policy
    (prepare_deepspeed). LoRA needs none: the base with adapters disabled is the reference."""
    if s.ref_model != "same" or s.method != "full":
        return 0
    nm = numerics(s)
    bytes_ = nm.weight * s.model.params
    if s.strategy in ("zero3", "fsdp"):
        bytes_ //= s.world_size
    return bytes_


def reference_forward_bytes(s: TrainingSetup, block_forward: int, micro_batch: int | None = None) -> int:
    """The reference's no-grad forward on top of what is alive: one block's transients, the residual stream in and
    out, and its fused head's forward (the hidden copy and the tile buffer; nothing is saved under no_grad)."""
    if s.ref_model != "same":
        return 0
    nm = numerics(s)
    t = tokens_per_micro(s, micro_batch)
    head = fused_log_prob_head(s, micro_batch, entropy=False, trains_weight=False)
    return block_forward + 2 * nm.residual * t * s.model.hidden_size + head.saved + head.forward_transient


@dataclass(frozen=True)
class GenerationCost:
    """GRPO's generation in the training process, per GPU."""

    completions: int         # generated at once: micro × steps_per_generation (= accumulation, TRL's default)
    kv_cache: int            # the whole cache at the last token
    transient: int           # the larger of the prefill's block transients and a decode step's sampler rows
    vllm_share: int          # colocated vLLM: a fixed share of the card outside torch's allocator
    gathered_weights: int = 0  # ZeRO-3: the rest of the model gathered for generate (beyond this GPU's shard)

    @property
    def peak(self) -> int:
        return self.kv_cache + self.transient + self.gathered_weights


def generation_cost(s: TrainingSetup) -> GenerationCost:
    """model.generate over micro × accumulation completions of prompt_len + completion_len tokens.

    transformers' DynamicCache keeps K and V per layer at the kv-head width in the compute dtype and grows them with
    torch.cat (one layer's K is briefly held twice); the prefill runs every prompt through one block at a time
    without saving anything (MLP: gate, act(gate), up and their product alive at once, B·P·I each); each decode
    step upcasts the last position's logits to fp32 and samples from their softmax (SAMPLER_ROWS rows of V).
    """
    if s.objective != "grpo" or s.generation == "server":
        return GenerationCost(0, 0, 0, 0)
    if s.generation == "colocate":
        return GenerationCost(s.micro_batch * s.grad_accum, 0, 0,
                              int(s.generation_memory * s.hardware.memory_per_process_bytes) if s.device == "cuda" else 0)
    m = s.model
    c = numerics(s).compute
    n = s.micro_batch * s.grad_accum
    T = s.seq_len
    per_token_layer = 2 * m.kv_dim * c
    kv = m.num_layers * n * T * per_token_layer
    cat = n * T * m.kv_dim * c
    prefill = 3 * n * (s.prompt_len or 0) * m.intermediate_size * c + 2 * n * (s.prompt_len or 0) * m.hidden_size * c
    decode = n * m.vocab_size * (c + 4 * SAMPLER_ROWS)
    gathered = 0
    if s.strategy == "zero3" and s.world_size > 1:
        gb = 4 if s.precision == "fp32" else 2
        gathered = gb * m.params - gb * m.params // s.world_size
    return GenerationCost(n, kv, cat + max(prefill, decode), 0, gathered)


def objective_terms(s: TrainingSetup, head: HeadCost, phase: str) -> tuple[tuple[str, str, int], ...]:
    """(component, term, bytes) the plan names for this objective at the peak `phase`."""
    out: list[tuple[str, str, int]] = []
    ref = reference_weight_bytes(s)
    if ref:
        out.append(("weights", "reference model (frozen copy of the policy)", ref))
    if (s.objective != "sft" or s.fused_lm_head) and phase in ("loss", "backward"):
        size = head.backward_transient if phase == "backward" else head.forward_transient
        out.append(("logits", head.name, size + head.saved))
    held = held_outputs_bytes(s)
    if held:
        out.append(("logits", f"outputs held by the loop ({s.loop}: B·S·V logits through backward and the step)",
                    held))
    gen = generation_cost(s)
    if gen.kv_cache and phase == "generation":
        out.append(("activations", f"KV cache of {gen.completions} completions × {s.seq_len} tokens", gen.kv_cache))
    if gen.gathered_weights and phase == "generation":
        out.append(("activations", "ZeRO-3 parameters gathered for generation", gen.gathered_weights))
    if gen.vllm_share:
        out.append(("overhead", f"vLLM engine colocated ({s.generation_memory:.0%} of the card)", gen.vllm_share))
    return tuple(out)

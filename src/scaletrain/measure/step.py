"""Ground truth for the memory model: measure one real optimizer step.

``measure_step`` builds a random-init Hugging Face causal LM from a ``config.json`` dict, runs
``warmup_steps`` full optimizer steps (so optimizer state exists, as in steady-state training),
then measures exactly one more optimizer step (all its micro-steps, ``optimizer.step()`` and
``optimizer.zero_grad(set_to_none=True)``).

CPU: the measured step runs under ``torch.profiler.profile(activities=[CPU], profile_memory=True,
record_shapes=True, with_stack=True)``; the allocated peak is read from the profiler's memory
timeline (``prof._memory_profile()`` -> ``MemoryProfileTimeline``), summed over all categories,
including the tensors that were already live when the step began (parameters, optimizer state,
buffers, the batch), which the timeline carries as ``PREEXISTING`` entries.  How that was verified
(torch 2.13): the PREEXISTING bytes equal, per category, the exact parameter and optimizer-state
bytes plus the batch and the buffers the forward reads; the only live storages missing are buffers
no op touches (e.g. llama's 32-byte ``original_inv_freq``), which are added back as
``PREEXISTING_UNTRACKED`` (live-at-start = params + buffers + optimizer state + batch, itself
checked against a ``gc`` walk of every live tensor).  The in-window part agrees byte for byte with
the CPU allocator's own running counter (max ``total_allocated`` of the profiler's allocation
events minus its value at window start); and for a vocab-dominated tiny llama the peak matches the
hand model params + Adam state + saved-for-backward bytes + d(log_softmax) + d(logits) to 0.1 %.

CUDA: ``torch.cuda.reset_peak_memory_stats()`` after warm-up, ``max_memory_allocated`` /
``max_memory_reserved`` over the measured step, step time = median of 3 further synchronised steps.

Optimizer implementation (torch 2.13, nothing forced): AdamW's foreach is only the default on cuda/xpu/mtia,
fused never. CPU: the single-tensor loop, whose ``denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)`` holds two
temporaries of the largest parameter tensor at once. CUDA: foreach, whose ``_foreach_sqrt(exp_avg_sqs)`` copies
every second moment (one trainable-size fp32 temporary). ``state["step"]`` is a 0-dim fp32 tensor per parameter on
CPU (counted in ``optimizer_state_bytes``). SGD(momentum=0.9): one momentum buffer per parameter, no step tensor.

FSDP (measure/fsdp_step.py): each rank's harness is sharded after it is built, its optimizer rebuilt over the
shards, and measured here (``measure_harness``); a DTensor counts its local shard.

This module must stay cheap to import: torch / transformers / peft are imported inside functions.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from scaletrain.engine.vocabulary import Attention, LossImpl, Method
from scaletrain.trainer import model as model_lib
from scaletrain.measure.frozen import mark_frozen_stacks
from scaletrain.measure.memory_timeline import (allocation_events_reading, counter_only_reading,
                                                 read_cpu_timeline)

__all__ = [
    "MeasuredStep",
    "measure_step",
    "build_harness",
    "unique_storage_bytes",
]

# Precisions of a measured step: fp32; bf16 = autocast over fp32 weights (accelerate's mixed precision, LoRA on an
# fp32 base); bf16-pure = bf16 weights without autocast (DeepSpeed's 16-bit model, --master-weights bf16, a plain
# loop on a bf16 model); bf16-autocast = bf16 weights under autocast (the trainer's LoRA on a bf16 base).
_PRECISIONS = ("fp32", "bf16", "bf16-pure", "bf16-autocast")
# torch's optimizer implementations; "default" leaves the choice to torch (foreach on CUDA, for-loop on CPU).
_OPTIMIZER_IMPLS = ("default", "fused", "foreach", "for-loop")
_OPTIMIZERS = ("adamw", "sgd")
# the training loop that runs the measured step (engine/vocabulary.py Loop): trainer (the bundled trainer's
# `loss = model(**batch).loss`), accelerate-loop (accelerate's examples: the output object bound to `outputs` through
# backward, the optimizer step and the next forward), hf-trainer and trl (transformers.Trainer, trl.SFTTrainer:
# measure/loops.py runs them)
LOOPS = ("trainer", "accelerate-loop", "hf-trainer", "trl")
# transformers' name for flash attention is accepted as well as the plan's "flash".
_ATTN_ALIASES = ("flash_attention_2",)


@dataclass(frozen=True)
class MeasuredStep:
    device: str  # "cpu" or "cuda:0"
    peak_allocated_bytes: int  # allocated peak during ONE profiled optimizer step, incl. pre-existing
    peak_reserved_bytes: int | None  # cuda only (torch.cuda.max_memory_reserved), None on cpu
    param_bytes: int  # unique storages of all parameters
    trainable_param_bytes: int
    grad_bytes: int  # sum of .grad of trainable params after backward (before zero_grad)
    optimizer_state_bytes: int  # sum over optimizer.state tensors (incl. step tensors)
    params: int  # unique parameter count (tied once)
    trainable_params: int
    peak_by_category: dict[str, int] = field(default_factory=dict)  # cpu: bytes per category at peak
    step_seconds: float = 0.0


def _local(t):
    """A DTensor's shard on this rank (FSDP's parameters, gradients and optimizer state), else the tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def storage_key(t) -> tuple[str, int]:
    st = _local(t).untyped_storage()
    return (str(t.device), st.data_ptr())


def unique_storage_bytes(tensors) -> int:
    """Bytes of the unique storages behind ``tensors`` (tied / aliased tensors count once; a DTensor: its shard)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if t is None:
            continue
        t = _local(t)
        st = t.untyped_storage()
        key = (str(t.device), st.data_ptr())
        seen[key] = max(seen.get(key, 0), st.nbytes())
    return sum(seen.values())


def _unique_params(model) -> list:
    out, seen = [], set()
    for p in model.parameters():
        k = (storage_key(p), _local(p).storage_offset(), tuple(p.shape))
        if k in seen:
            continue
        seen.add(k)
        out.append(p)
    return out


def _resolve_device(device: str) -> str:
    import torch

    if device == "cpu":
        return "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"device={device!r} requested but torch.cuda.is_available() is False")
        idx = torch.device(device).index
        return f"cuda:{0 if idx is None else idx}"
    raise ValueError(f"unknown device {device!r} (expected 'cpu' or 'cuda[:N]')")


def _attn_implementation(attn: str) -> str:
    return attn if attn in _ATTN_ALIASES else Attention(attn).hf_implementation


def check_arguments(method, attn, precision, optimizer, device, grad_accum, micro_batch, seq_len, warmup_steps,
                    optimizer_impl="default", loop="trainer"):
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {LOOPS}, got {loop!r}")
    if method not in Method.values():
        raise ValueError(f"method must be one of {Method.values()}, got {method!r}")
    if attn not in (*Attention.values(), *_ATTN_ALIASES):
        raise ValueError(f"attn must be one of eager|sdpa|flash, got {attn!r}")
    if _attn_implementation(attn) == "flash_attention_2" and device == "cpu":
        raise ValueError("attn='flash' (flash_attention_2) needs a CUDA device; use 'sdpa' or 'eager' on cpu")
    if precision not in _PRECISIONS:
        raise ValueError(f"precision must be one of {_PRECISIONS}, got {precision!r}")
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {_OPTIMIZERS}, got {optimizer!r}")
    if optimizer_impl not in _OPTIMIZER_IMPLS:
        raise ValueError(f"optimizer_impl must be one of {_OPTIMIZER_IMPLS}, got {optimizer_impl!r}")
    if grad_accum < 1 or micro_batch < 1 or seq_len < 2 or warmup_steps < 0:
        raise ValueError("grad_accum>=1, micro_batch>=1, seq_len>=2 and warmup_steps>=0 are required")


@dataclass
class StepHarness:
    """Everything a measured step needs (model, optimizer, autocast); returned by ``build_harness``."""

    model: Any
    optimizer: Any
    device: str
    vocab_size: int
    autocast: Any  # zero-arg callable returning a context manager
    lora_targets: tuple[str, ...] | None
    loop: str = "trainer"
    accelerator: Any = None      # accelerate-loop: the Accelerator that prepared model and optimizer
    step_optimizer: Any = None   # accelerate-loop: the prepared optimizer the loop steps (`optimizer` stays torch's)
    held: Any = None             # accelerate-loop: the loop's `outputs`, rebound only after the next forward returns
    loss: str = "standard"   # "chunked": trainer/chunked_loss.py through lm_head, never B·S·V logits


def build_harness(hf_config: dict, *, method: str = "full", lora_rank: int = 8, lora_alpha: int = 16,
                  lora_targets: tuple[str, ...] | None = None, grad_ckpt: bool = False,
                  attn: str = "sdpa", precision: str = "fp32", optimizer: str = "adamw",
                  device: str = "cpu", seed: int = 0, optimizer_impl: str = "default", loop: str = "trainer",
                  grad_accum: int = 1, loss: str = "standard") -> StepHarness:
    """Build model (+LoRA) and optimizer exactly as ``measure_step`` does (exposed for tests)."""
    import warnings

    with warnings.catch_warnings():
        # transformers 5 renamed gradient_checkpointing_* -> activation_checkpointing_*; peft still
        # reads the old property and triggers a FutureWarning that says nothing about this measurement.
        warnings.filterwarnings("ignore", message=r".*is deprecated and will be removed in v6.*",
                                category=FutureWarning)
        return _build_harness(hf_config, method=method, lora_rank=lora_rank, lora_alpha=lora_alpha,
                              lora_targets=lora_targets, grad_ckpt=grad_ckpt, attn=attn,
                              precision=precision, optimizer=optimizer, device=device, seed=seed,
                              optimizer_impl=optimizer_impl, loop=loop, grad_accum=grad_accum, loss=loss)


def _build_harness(hf_config, *, method, lora_rank, lora_alpha, lora_targets, grad_ckpt, attn,
                   precision, optimizer, device, seed, optimizer_impl="default", loop="trainer",
                   grad_accum=1, loss="standard") -> StepHarness:
    import torch

    dev = _resolve_device(device)
    cfg = model_lib.hf_config(hf_config)
    torch.manual_seed(seed)
    attn_impl = _attn_implementation(attn)

    if method == "qlora":
        import importlib.util

        if importlib.util.find_spec("bitsandbytes") is None:
            raise RuntimeError("method='qlora' needs bitsandbytes (≥ 0.45 also runs 4-bit layers on the CPU)")
        model = model_lib.quantized_random_init(cfg, attn_impl, 4, "bfloat16", dev)
    else:
        dtype = "bfloat16" if precision in ("bf16-pure", "bf16-autocast") else "float32"
        model = model_lib.random_init(cfg, attn_impl, dtype=dtype, device=dev)
        mark_frozen_stacks(model)       # before peft freezes the rest

    if grad_ckpt:
        # What a trainer does (model_lib.enable_checkpointing, the bundled trainer's own call), no KV cache.
        model_lib.enable_checkpointing(model)
    model.config.use_cache = False

    targets_used = None
    if method in ("lora", "qlora"):
        # peft 0.21 "all-linear" excludes the output embedding (lm_head) via get_output_embeddings()
        target = list(lora_targets) if lora_targets else "all-linear"
        model = model_lib.add_lora(model, rank=lora_rank, alpha=lora_alpha, dropout=0.0, targets=target,
                                   quantized=method == "qlora", grad_ckpt=grad_ckpt)
        from peft.tuners.lora import LoraLayer

        # the modules that really got an adapter, by their name in the base model
        targets_used = tuple(sorted(name.removeprefix("base_model.model.") for name, mod in model.named_modules()
                                    if isinstance(mod, LoraLayer)))
        if target == "all-linear" and any(t.endswith("lm_head") for t in targets_used):
            # not the case with peft 0.21 (it drops get_output_embeddings()); guard for other versions
            raise RuntimeError("peft 'all-linear' adapted lm_head; pass lora_targets=BLOCK_LINEARS")
    # full fine-tuning trains what transformers built trainable, as the trainer does (blt's frozen entropy patcher,
    # marian's sinusoidal positions: no gradient, no optimizer state; the structure's `frozen_params`)
    model.train()

    trainable = [p for p in _unique_params(model) if p.requires_grad]
    impl = {"default": {}, "fused": {"fused": True}, "foreach": {"foreach": True},
            "for-loop": {"foreach": False}}[optimizer_impl]
    if optimizer == "adamw":
        opt = torch.optim.AdamW(trainable, lr=1e-4, **impl)
    else:
        opt = torch.optim.SGD(trainable, lr=1e-4, momentum=0.9, **impl)

    dev_type = torch.device(dev).type
    if precision in ("bf16", "bf16-autocast"):
        def autocast():
            return torch.autocast(device_type=dev_type, dtype=torch.bfloat16)
    else:
        def autocast():
            return contextlib.nullcontext()

    harness = StepHarness(model=model, optimizer=opt, device=dev, vocab_size=int(cfg.vocab_size),
                          autocast=autocast, lora_targets=targets_used, loop=loop,
                          loss=LossImpl(loss).value)
    if loop == "accelerate-loop":
        _prepare_with_accelerate(harness, autocast_on=precision in ("bf16", "bf16-autocast"), grad_accum=grad_accum)
    return harness


def _prepare_with_accelerate(h: StepHarness, *, autocast_on: bool, grad_accum: int) -> None:
    """accelerate's examples: `Accelerator(mixed_precision=...)`, `model, optimizer = accelerator.prepare(...)`. Its
    mixed precision wraps the model's forward in autocast and converts 16-bit outputs to fp32 copies
    (accelerator.py prepare_model: convert_outputs_to_fp32), so the harness's own autocast steps aside."""
    import contextlib as _cl

    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)   # one process measures many cases, each with its own mixed precision
    acc = Accelerator(cpu=h.device == "cpu", mixed_precision="bf16" if autocast_on else "no",
                      gradient_accumulation_steps=grad_accum)
    h.model, h.step_optimizer = acc.prepare(h.model, h.optimizer)
    h.accelerator = acc
    h.autocast = _cl.nullcontext


def make_batches(n: int, micro_batch: int, seq_len: int, vocab: int, device: str, seed: int) -> list:
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=g)
        out.append(ids.to(device))
    return out


def _micro_step(setup: StepHarness, ids, grad_accum: int) -> None:
    if setup.loop == "accelerate-loop":
        # `outputs = model(**batch); accelerator.backward(outputs.loss)`: the previous micro-step's outputs are
        # released only when this forward has returned and `outputs` is rebound; backward divides by grad_accum
        outputs = setup.model(input_ids=ids, labels=ids)
        setup.held = outputs
        setup.accelerator.backward(outputs.loss)
        return
    with setup.autocast():
        loss = step_loss(setup, ids)
    if grad_accum > 1:
        loss = loss / grad_accum
    loss.backward()


def step_loss(setup: StepHarness, ids):
    """The micro-batch's loss as the harness's loss computes it: the model's own (labels in), or the chunked one."""
    if setup.loss == LossImpl.CHUNKED:
        return _chunked_loss(setup, ids)
    return setup.model(input_ids=ids, labels=ids).loss


def _chunked_loss(setup: StepHarness, ids):
    """The chunked loss as the bundled trainer computes it (trainer/chunked_loss.py)."""
    import torch

    from scaletrain.trainer.chunked_loss import causal_lm_loss, compute_dtype_for, output_head

    head = output_head(setup.model)
    amp = "bf16" if torch.is_autocast_enabled(torch.device(setup.device).type) else None
    return causal_lm_loss(setup.model, {"input_ids": ids, "labels": ids}, head,
                          compute_dtype_for(head.weight, amp))


def _finish_step(setup: StepHarness) -> None:
    opt = setup.step_optimizer or setup.optimizer
    opt.step()
    opt.zero_grad(set_to_none=True)


def _full_step(setup: StepHarness, batches) -> None:
    for ids in batches:
        _micro_step(setup, ids, len(batches))
    _finish_step(setup)




def _live_state_bytes(setup: StepHarness, batches) -> int:
    """Bytes of every storage we know is live at the start of the measured step."""
    tensors = list(setup.model.parameters()) + list(setup.model.buffers()) + list(batches)
    for st in setup.optimizer.state.values():
        tensors += [v for v in st.values() if _is_tensor(v)]
    return unique_storage_bytes(tensors)


def _is_tensor(x) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def _optimizer_state_bytes(opt) -> int:
    tensors = []
    for st in opt.state.values():
        tensors += [v for v in st.values() if _is_tensor(v)]
    return unique_storage_bytes(tensors)


def _profile_cpu_step(setup: StepHarness, lead: list, measured: list,
                      debug: dict | None) -> tuple[int, dict[str, int], float]:
    """The `lead` steps and the measured step under torch.profiler: (peak bytes, bytes per category at the peak,
    the measured step's seconds)."""
    from torch.profiler import ProfilerActivity, profile

    live_before = _live_state_bytes(setup, [b for st in lead for b in st] + list(measured))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        for st in lead:
            _full_step(setup, st)
        t0 = time.perf_counter()
        _full_step(setup, measured)
        step_seconds = time.perf_counter() - t0
    try:
        reading = read_cpu_timeline(prof)
    except AssertionError as exc:   # its data-flow graph refused the step: the raw allocation events
        reading = allocation_events_reading(prof, live_before, exc)
    except Exception as exc:  # private profiler API: degrade to the allocator counter
        reading = counter_only_reading(prof, live_before, exc)
    # The timeline's PREEXISTING entries only cover tensors some op touched during the window
    # (parameters, optimizer state, the batch, used buffers).  Live storages it never saw
    # (e.g. rotary `original_inv_freq`, frozen-but-unused buffers) are added back here so the
    # peak means "everything allocated", like torch.cuda.max_memory_allocated.
    untracked = max(0, live_before - reading.preexisting_bytes)
    peak_by_cat = dict(reading.peak_by_category)
    if untracked:
        peak_by_cat["PREEXISTING_UNTRACKED"] = untracked
    if debug is not None:
        debug["reading"] = reading
        debug["live_before"] = live_before
    return reading.peak_bytes + untracked, peak_by_cat, step_seconds


def measure_step(hf_config: dict, *, method: str = "full", lora_rank: int = 8, lora_alpha: int = 16,
                 lora_targets: tuple[str, ...] | None = None, micro_batch: int = 1, seq_len: int = 128,
                 grad_ckpt: bool = False, attn: str = "sdpa", precision: str = "fp32",
                 optimizer: str = "adamw", grad_accum: int = 1, device: str = "cpu", seed: int = 0,
                 warmup_steps: int = 1, optimizer_impl: str = "default", loop: str = "trainer",
                 loss: str = "standard",
                 _debug: dict | None = None) -> MeasuredStep:
    """Measure the memory (and time) of one steady-state optimizer step; see the module doc. `loop` (LOOPS)
    picks the loop that runs it: hf-trainer and trl train through the real library (measure/loops.py).

    ``_debug`` (internal): a dict that receives the raw ``CpuTimelineReading`` and the live-at-start
    byte count on cpu, for tests and calibration scripts.
    """
    check_arguments(method, attn, precision, optimizer, device, grad_accum, micro_batch, seq_len, warmup_steps,
                    optimizer_impl, loop)
    setup = build_harness(hf_config, method=method, lora_rank=lora_rank, lora_alpha=lora_alpha,
                          lora_targets=lora_targets, grad_ckpt=grad_ckpt, attn=attn, precision=precision,
                          optimizer=optimizer, device=device, seed=seed, optimizer_impl=optimizer_impl,
                          loop="trainer" if loop in ("hf-trainer", "trl") else loop, grad_accum=grad_accum,
                          loss=loss)
    if loop in ("hf-trainer", "trl"):
        from scaletrain.measure.loops import measure_library_step

        if loss != "standard":
            raise ValueError(f"loop {loop!r} is measured with the library's own loss only (got loss {loss!r})")
        if optimizer != "adamw":
            raise ValueError(f"loop {loop!r} is measured with the library's AdamW only (got {optimizer!r})")

        return MeasuredStep(**measure_library_step(
            setup, loop=loop, micro_batch=micro_batch, seq_len=seq_len, grad_accum=grad_accum, precision=precision,
            optimizer_impl=optimizer_impl, grad_ckpt=grad_ckpt, warmup_steps=warmup_steps, seed=seed,
            storage_bytes=unique_storage_bytes))
    return measure_harness(setup, micro_batch=micro_batch, seq_len=seq_len, grad_accum=grad_accum, seed=seed,
                           warmup_steps=warmup_steps, debug=_debug)


def measure_harness(setup: StepHarness, *, micro_batch: int, seq_len: int, grad_accum: int = 1, seed: int = 0,
                    warmup_steps: int = 1, debug: dict | None = None) -> MeasuredStep:
    """The warm-up steps and the measured step of a built harness (measure_step's, or one whose model another
    module wrapped and whose optimizer it rebuilt: measure/fsdp_step.py)."""
    import torch

    dev = setup.device
    model, opt = setup.model, setup.optimizer

    uparams = _unique_params(model)
    params = sum(p.numel() for p in uparams)
    trainable = [p for p in uparams if p.requires_grad]
    trainable_params = sum(p.numel() for p in trainable)
    param_bytes = unique_storage_bytes(uparams)
    trainable_param_bytes = unique_storage_bytes(trainable)

    n_timed = 3 if dev.startswith("cuda") else 0
    batches = make_batches((warmup_steps + 1 + n_timed) * grad_accum, micro_batch, seq_len,
                            setup.vocab_size, dev, seed)
    step_batches = [batches[k * grad_accum:(k + 1) * grad_accum] for k in range(warmup_steps + 1 + n_timed)]

    # accelerate-loop: the profiler cannot see a tensor allocated before its window being freed inside it, so the
    # window opens on the last warm-up step with nothing bound to `outputs` yet (as a loop's first step) and the
    # measured step's forward runs while that step's outputs are still bound, as in any later step
    lead = [step_batches[warmup_steps - 1]] if setup.loop == "accelerate-loop" and warmup_steps else []
    for k in range(warmup_steps - len(lead)):
        _full_step(setup, step_batches[k])
    setup.held = None
    measured = step_batches[warmup_steps]

    # exact grad bytes of the measured step: hook the optimizer step (runs after the last backward,
    # before zero_grad) -- the hook itself is outside any allocation.
    grad_box: dict[str, int] = {}

    def _pre_step_hook(optim, args, kwargs):
        grad_box["grad"] = unique_storage_bytes([p.grad for p in trainable if p.grad is not None])

    handle = opt.register_step_pre_hook(_pre_step_hook)
    try:
        if dev == "cpu":
            peak, peak_by_cat, step_seconds = _profile_cpu_step(setup, lead, measured, debug)
            peak_reserved = None
        else:
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            t0 = time.perf_counter()
            _full_step(setup, measured)
            torch.cuda.synchronize(dev)
            first = time.perf_counter() - t0
            peak = int(torch.cuda.max_memory_allocated(dev))
            peak_reserved = int(torch.cuda.max_memory_reserved(dev))
            peak_by_cat = {}
            handle.remove()
            times = []
            for k in range(n_timed):
                torch.cuda.synchronize(dev)
                t0 = time.perf_counter()
                _full_step(setup, step_batches[warmup_steps + 1 + k])
                torch.cuda.synchronize(dev)
                times.append(time.perf_counter() - t0)
            step_seconds = statistics.median(times) if times else first
    finally:
        handle.remove()

    return MeasuredStep(
        device=dev, peak_allocated_bytes=int(peak), peak_reserved_bytes=peak_reserved,
        param_bytes=param_bytes, trainable_param_bytes=trainable_param_bytes,
        grad_bytes=int(grad_box.get("grad", 0)), optimizer_state_bytes=_optimizer_state_bytes(opt),
        params=params, trainable_params=trainable_params, peak_by_category=peak_by_cat,
        step_seconds=float(step_seconds))

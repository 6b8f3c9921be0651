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

Optimizer implementation (torch 2.13, defaults, no ``foreach``/``fused`` forced):
``torch.optim.AdamW`` resolves ``foreach=None`` through ``_default_to_fused_or_foreach``; foreach is
only picked when every param is on a device in ``_get_foreach_kernels_supported_devices()``
(cuda, xpu, mtia, privateuse1), fused is never the default.  So:
  * CPU  -> single-tensor loop (``_single_tensor_adam``).  Per parameter tensor it does in place
    ``param.mul_(1-lr*wd)``, ``exp_avg.lerp_``, ``exp_avg_sq.mul_().addcmul_()``, then
    ``denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)`` -- two param-sized temporaries alive at
    once (the sqrt result and the quotient) -- then ``param.addcdiv_``.  Step temporary peak is
    therefore ~2 x the largest single parameter tensor (fp32), not a function of the total size.
  * CUDA -> foreach (``_multi_tensor_adam``): ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)``
    allocates one full copy of all (trainable) params per device/dtype group, then updates in
    place; step temporary peak ~1 x trainable param bytes (fp32 state dtype).
  ``state["step"]`` is a 0-dim float32 tensor per parameter on CPU (4 bytes each) when not
  capturable/fused; it is counted in ``optimizer_state_bytes``.
SGD(momentum=0.9): one momentum buffer per param, no step tensor; the default on CPU is again the
single-tensor loop.

This module must stay cheap to import: torch / transformers / peft are imported inside functions.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MeasuredStep",
    "measure_step",
    "measure_saved_activation_bytes",
    "build_training_setup",
    "unique_storage_bytes",
]

_ATTN = {"eager": "eager", "sdpa": "sdpa", "flash": "flash_attention_2", "flash_attention_2": "flash_attention_2"}
_PRECISIONS = ("fp32", "bf16", "bf16-pure")
_METHODS = ("full", "lora", "qlora")
_OPTIMIZERS = ("adamw", "sgd")
# Linear modules inside the decoder blocks of llama-like models.  peft 0.21's "all-linear" gives exactly
# these (it excludes lm_head); pass them as lora_targets where a peft version would adapt the head.
DECODER_LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


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


# --------------------------------------------------------------------------------------------
# helpers (torch imported lazily)
# --------------------------------------------------------------------------------------------


def _storage_key(t) -> tuple[str, int]:
    st = t.untyped_storage()
    return (str(t.device), st.data_ptr())


def unique_storage_bytes(tensors) -> int:
    """Bytes of the unique storages behind ``tensors`` (tied / aliased tensors count once)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        key = (str(t.device), st.data_ptr())
        seen[key] = max(seen.get(key, 0), st.nbytes())
    return sum(seen.values())


def _unique_params(model) -> list:
    out, seen = [], set()
    for p in model.parameters():
        k = (_storage_key(p), p.storage_offset(), tuple(p.shape))
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


def _validate(method, attn, precision, optimizer, device, grad_accum, micro_batch, seq_len, warmup_steps):
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if attn not in _ATTN:
        raise ValueError(f"attn must be one of eager|sdpa|flash, got {attn!r}")
    if _ATTN[attn] == "flash_attention_2" and device == "cpu":
        raise ValueError("attn='flash' (flash_attention_2) needs a CUDA device; use 'sdpa' or 'eager' on cpu")
    if precision not in _PRECISIONS:
        raise ValueError(f"precision must be one of {_PRECISIONS}, got {precision!r}")
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {_OPTIMIZERS}, got {optimizer!r}")
    if grad_accum < 1 or micro_batch < 1 or seq_len < 2 or warmup_steps < 0:
        raise ValueError("grad_accum>=1, micro_batch>=1, seq_len>=2 and warmup_steps>=0 are required")


def _make_config(hf_config: dict):
    from transformers import AutoConfig

    cfg = dict(hf_config)
    if "model_type" not in cfg:
        raise ValueError("hf_config must contain 'model_type'")
    model_type = cfg.pop("model_type")
    # keys that describe a checkpoint, not the architecture; dtype is chosen by `precision`
    for k in ("architectures", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
              "quantization_config", "auto_map"):
        cfg.pop(k, None)
    return AutoConfig.for_model(model_type, **cfg)


@dataclass
class TrainingSetup:
    """Everything a measured step needs; returned by ``build_training_setup``."""

    model: Any
    optimizer: Any
    device: str
    vocab_size: int
    autocast: Any  # zero-arg callable returning a context manager
    lora_targets: tuple[str, ...] | None


def build_training_setup(hf_config: dict, *, method: str = "full", lora_rank: int = 8, lora_alpha: int = 16,
                         lora_targets: tuple[str, ...] | None = None, grad_ckpt: bool = False,
                         attn: str = "sdpa", precision: str = "fp32", optimizer: str = "adamw",
                         device: str = "cpu", seed: int = 0) -> TrainingSetup:
    """Build model (+LoRA) and optimizer exactly as ``measure_step`` does (exposed for tests)."""
    import warnings

    with warnings.catch_warnings():
        # transformers 5 renamed gradient_checkpointing_* -> activation_checkpointing_*; peft still
        # reads the old property and triggers a FutureWarning that says nothing about this measurement.
        warnings.filterwarnings("ignore", message=r".*is deprecated and will be removed in v6.*",
                                category=FutureWarning)
        return _build_training_setup(hf_config, method=method, lora_rank=lora_rank, lora_alpha=lora_alpha,
                                     lora_targets=lora_targets, grad_ckpt=grad_ckpt, attn=attn,
                                     precision=precision, optimizer=optimizer, device=device, seed=seed)


def _build_training_setup(hf_config, *, method, lora_rank, lora_alpha, lora_targets, grad_ckpt, attn,
                          precision, optimizer, device, seed) -> TrainingSetup:
    import torch
    from transformers import AutoModelForCausalLM

    dev = _resolve_device(device)
    cfg = _make_config(hf_config)
    torch.manual_seed(seed)
    attn_impl = _ATTN[attn]

    if method == "qlora":
        model = _build_qlora_base(cfg, attn_impl, dev, seed)
    else:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_impl, dtype=torch.float32)
        if getattr(model.config, "tie_word_embeddings", False):
            model.tie_weights()
        if precision == "bf16-pure":
            model = model.to(torch.bfloat16)
        model = model.to(dev)

    if grad_ckpt:
        # What a trainer does: non-reentrant checkpointing on every decoder layer, no KV cache.
        # transformers itself calls `enable_input_require_grads()` here for input_ids models, so the
        # embedding output requires grad (needed for LoRA, harmless for full fine-tuning).
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:  # transformers < 5.x name
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False

    targets_used = None
    if method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        if method == "qlora":
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=grad_ckpt,
                gradient_checkpointing_kwargs={"use_reentrant": False})
        # peft 0.21 "all-linear" excludes the output embedding (lm_head) via get_output_embeddings()
        target = list(lora_targets) if lora_targets else "all-linear"
        lcfg = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, target_modules=target, lora_dropout=0.0,
                          task_type="CAUSAL_LM")
        model = get_peft_model(model, lcfg)
        from peft.tuners.lora import LoraLayer

        # the modules that really got an adapter, by their name in the base model
        targets_used = tuple(sorted(name.removeprefix("base_model.model.") for name, mod in model.named_modules()
                                    if isinstance(mod, LoraLayer)))
        if target == "all-linear" and any(t.endswith("lm_head") for t in targets_used):
            # not the case with peft 0.21 (it drops get_output_embeddings()); guard for other versions
            raise RuntimeError("peft 'all-linear' adapted lm_head; pass lora_targets=DECODER_LINEAR_NAMES")
    else:
        for p in model.parameters():
            p.requires_grad_(True)
    model.train()

    trainable = [p for p in _unique_params(model) if p.requires_grad]
    if optimizer == "adamw":
        opt = torch.optim.AdamW(trainable, lr=1e-4)
    else:
        opt = torch.optim.SGD(trainable, lr=1e-4, momentum=0.9)

    dev_type = torch.device(dev).type
    if precision == "bf16":
        def autocast():
            return torch.autocast(device_type=dev_type, dtype=torch.bfloat16)
    else:
        def autocast():
            return contextlib.nullcontext()

    return TrainingSetup(model=model, optimizer=opt, device=dev, vocab_size=int(cfg.vocab_size),
                         autocast=autocast, lora_targets=targets_used)


def _build_qlora_base(cfg, attn_impl: str, dev: str, seed: int):
    import importlib.util

    import torch

    if not dev.startswith("cuda") or importlib.util.find_spec("bitsandbytes") is None:
        raise RuntimeError("method='qlora' needs bitsandbytes and a CUDA device "
                           f"(device={dev!r}, bitsandbytes installed: "
                           f"{importlib.util.find_spec('bitsandbytes') is not None})")
    import tempfile

    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    # Quantisation is applied at load time, so write the random-init weights and load them back 4-bit.
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_impl, dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        base.save_pretrained(tmp)
        del base
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=bnb, attn_implementation=attn_impl,
                                                     dtype=torch.bfloat16, device_map={"": dev})
    return model


def _make_batches(n: int, micro_batch: int, seq_len: int, vocab: int, device: str, seed: int) -> list:
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=g)
        out.append(ids.to(device))
    return out


def _micro_step(setup: TrainingSetup, ids, grad_accum: int) -> None:
    with setup.autocast():
        loss = setup.model(input_ids=ids, labels=ids).loss
    if grad_accum > 1:
        loss = loss / grad_accum
    loss.backward()


def _finish_step(setup: TrainingSetup) -> None:
    setup.optimizer.step()
    setup.optimizer.zero_grad(set_to_none=True)


def _full_step(setup: TrainingSetup, batches) -> None:
    for ids in batches:
        _micro_step(setup, ids, len(batches))
    _finish_step(setup)


# --------------------------------------------------------------------------------------------
# CPU timeline reading
# --------------------------------------------------------------------------------------------

_CATEGORY_NAMES = ("INPUT", "TEMPORARY", "ACTIVATION", "GRADIENT", "AUTOGRAD_DETAIL", "PARAMETER",
                   "OPTIMIZER_STATE")


@dataclass
class CpuTimelineReading:
    peak_bytes: int  # max over time of the sum over all categories (incl. pre-existing)
    peak_by_category: dict[str, int]
    preexisting_bytes: int  # sum of PREEXISTING entries of the timeline
    preexisting_by_category: dict[str, int]
    end_bytes: int  # total at the end of the window
    counter_peak_delta: int  # allocator counter: max(total_allocated) - total at window start
    coalesced_peak_bytes: int  # max row sum of MemoryProfileTimeline._coalesce_timeline (us buckets)
    n_events: int


def _read_cpu_timeline(prof) -> CpuTimelineReading:
    """Walk ``MemoryProfileTimeline(prof._memory_profile()).timeline`` event by event.

    Each timeline entry is ``(t_ns, Action, (Key, version), nbytes)`` sorted by (t, action).
    PREEXISTING entries (t = -1) are tensors that were alive before the profiler started and were
    touched during the window (parameters, optimizer state, buffers, inputs); CREATE/DESTROY are
    allocations/frees inside the window; INCREMENT_VERSION moves bytes between versions (a tensor's
    category can change between versions, e.g. a gradient).  The category of (key, version) comes
    from ``timeline.categories.get(key, version)``; keys that are not ``TensorKey`` (allocations the
    profiler could not tie to a tensor) have category None -> "unknown".

    Compared with ``MemoryProfileTimeline._coalesce_timeline`` (the source of the HTML plot) this
    keeps nanosecond resolution -- ``_coalesce_timeline`` buckets by microsecond, which could hide a
    short-lived temporary -- and evaluates the total after every distinct timestamp.  (On the tiny
    llama configs of the tests both give the same peak; ``coalesced_peak_bytes`` records it.)
    """
    import torch
    from torch.profiler._memory_profiler import Action, MemoryProfileTimeline, TensorKey

    mem_profile = prof._memory_profile()
    tl = MemoryProfileTimeline(mem_profile)
    cpu = torch.device("cpu")

    def cat_name(key, version) -> str:
        c = tl.categories.get(key, version) if isinstance(key, TensorKey) else None
        return "unknown" if c is None else c.name

    cur: dict[str, int] = {}
    pre: dict[str, int] = {}
    peak, peak_cats = -1, {}
    events = [e for e in tl.timeline if e[2][0].device == cpu]
    i, n = 0, len(events)
    while i < n:
        t = events[i][0]
        while i < n and events[i][0] == t:
            _, action, (key, version), nbytes = events[i]
            if action in (Action.PREEXISTING, Action.CREATE):
                c = cat_name(key, version)
                cur[c] = cur.get(c, 0) + nbytes
                if action == Action.PREEXISTING:
                    pre[c] = pre.get(c, 0) + nbytes
            elif action == Action.INCREMENT_VERSION:
                c0, c1 = cat_name(key, version), cat_name(key, version + 1)
                cur[c0] = cur.get(c0, 0) - nbytes
                cur[c1] = cur.get(c1, 0) + nbytes
            elif action == Action.DESTROY:
                c = cat_name(key, version)
                cur[c] = cur.get(c, 0) - nbytes
            i += 1
        total = sum(cur.values())
        if total > peak:
            peak, peak_cats = total, {k: v for k, v in cur.items() if v}

    # Independent cross-check: the CPU allocator's running counter reported with every allocation
    # event.  It only counts blocks allocated while profiling is on (and keeps leftovers of earlier
    # profiling sessions), so only differences within this window are meaningful.
    counter_peak = _allocator_counter_peak(mem_profile._op_tree.sorted_nodes, cpu)
    # The plot's own reduction, for comparison (microsecond buckets; index 0 of each row is unused).
    _, sizes = tl._coalesce_timeline("cpu")
    coalesced = max((sum(row) for row in sizes), default=0)
    return CpuTimelineReading(
        peak_bytes=max(peak, 0), peak_by_category=peak_cats, preexisting_bytes=sum(pre.values()),
        preexisting_by_category={k: v for k, v in pre.items() if v}, end_bytes=sum(cur.values()),
        counter_peak_delta=counter_peak, coalesced_peak_bytes=coalesced, n_events=n)


def _counter_only_reading(prof, live_before: int, exc: Exception) -> CpuTimelineReading:
    """Fallback when the memory timeline cannot be built: live-at-start + allocator counter delta."""
    import warnings

    import torch
    from torch.profiler._memory_profiler import OpTree

    warnings.warn(f"profiler memory timeline failed ({exc!r}); peak from the allocator counter, "
                  "no per-category split", RuntimeWarning, stacklevel=3)
    delta = _allocator_counter_peak(OpTree(prof.profiler.kineto_results).sorted_nodes, torch.device("cpu"))
    return CpuTimelineReading(
        peak_bytes=live_before + delta, peak_by_category={"PREEXISTING": live_before, "unknown": delta},
        preexisting_bytes=live_before, preexisting_by_category={"PREEXISTING": live_before},
        end_bytes=live_before, counter_peak_delta=delta, coalesced_peak_bytes=0, n_events=0)


def _allocator_counter_peak(nodes, device) -> int:
    """max(total_allocated) - total_allocated at window start, from the raw allocation events."""
    from torch._C._profiler import _EventType

    allocs = [e.typed[1] for e in nodes if e.typed[0] == _EventType.Allocation and e.typed[1].device == device]
    if not allocs:
        return 0
    start = allocs[0].total_allocated - allocs[0].alloc_size
    return max(a.total_allocated for a in allocs) - start


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def _live_state_bytes(setup: TrainingSetup, batches) -> int:
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


def measure_step(hf_config: dict, *, method: str = "full", lora_rank: int = 8, lora_alpha: int = 16,
                 lora_targets: tuple[str, ...] | None = None, micro_batch: int = 1, seq_len: int = 128,
                 grad_ckpt: bool = False, attn: str = "sdpa", precision: str = "fp32",
                 optimizer: str = "adamw", grad_accum: int = 1, device: str = "cpu", seed: int = 0,
                 warmup_steps: int = 1, _debug: dict | None = None) -> MeasuredStep:
    """Measure the memory (and time) of one steady-state optimizer step; see the module doc.

    ``_debug`` (internal): a dict that receives the raw ``CpuTimelineReading`` and the live-at-start
    byte count on cpu, for tests and calibration scripts.
    """
    _validate(method, attn, precision, optimizer, device, grad_accum, micro_batch, seq_len, warmup_steps)
    import torch

    setup = build_training_setup(hf_config, method=method, lora_rank=lora_rank, lora_alpha=lora_alpha,
                                 lora_targets=lora_targets, grad_ckpt=grad_ckpt, attn=attn,
                                 precision=precision, optimizer=optimizer, device=device, seed=seed)
    dev = setup.device
    model, opt = setup.model, setup.optimizer

    uparams = _unique_params(model)
    params = sum(p.numel() for p in uparams)
    trainable = [p for p in uparams if p.requires_grad]
    trainable_params = sum(p.numel() for p in trainable)
    param_bytes = unique_storage_bytes(uparams)
    trainable_param_bytes = unique_storage_bytes(trainable)

    n_timed = 3 if dev.startswith("cuda") else 0
    batches = _make_batches((warmup_steps + 1 + n_timed) * grad_accum, micro_batch, seq_len,
                            setup.vocab_size, dev, seed)
    step_batches = [batches[k * grad_accum:(k + 1) * grad_accum] for k in range(warmup_steps + 1 + n_timed)]

    for k in range(warmup_steps):
        _full_step(setup, step_batches[k])
    measured = step_batches[warmup_steps]

    # exact grad bytes of the measured step: hook the optimizer step (runs after the last backward,
    # before zero_grad) -- the hook itself is outside any allocation.
    grad_box: dict[str, int] = {}

    def _pre_step_hook(optim, args, kwargs):
        grad_box["grad"] = unique_storage_bytes([p.grad for p in trainable if p.grad is not None])

    handle = opt.register_step_pre_hook(_pre_step_hook)
    try:
        if dev == "cpu":
            from torch.profiler import ProfilerActivity, profile

            live_before = _live_state_bytes(setup, measured)
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                         with_stack=True) as prof:
                t0 = time.perf_counter()
                _full_step(setup, measured)
                step_seconds = time.perf_counter() - t0
            try:
                reading = _read_cpu_timeline(prof)
            except Exception as exc:  # private profiler API: degrade to the allocator counter
                reading = _counter_only_reading(prof, live_before, exc)
            # The timeline's PREEXISTING entries only cover tensors some op touched during the window
            # (parameters, optimizer state, the batch, used buffers).  Live storages it never saw
            # (e.g. rotary `original_inv_freq`, frozen-but-unused buffers) are added back here so the
            # peak means "everything allocated", like torch.cuda.max_memory_allocated.
            untracked = max(0, live_before - reading.preexisting_bytes)
            peak = reading.peak_bytes + untracked
            peak_reserved = None
            peak_by_cat = dict(reading.peak_by_category)
            if untracked:
                peak_by_cat["PREEXISTING_UNTRACKED"] = untracked
            if _debug is not None:
                _debug["reading"] = reading
                _debug["live_before"] = live_before
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


def measure_saved_activation_bytes(hf_config: dict, *, method: str = "full", lora_rank: int = 8,
                                   lora_alpha: int = 16, lora_targets: tuple[str, ...] | None = None,
                                   micro_batch: int = 1, seq_len: int = 128, grad_ckpt: bool = False,
                                   attn: str = "sdpa", precision: str = "fp32", optimizer: str = "adamw",
                                   grad_accum: int = 1, device: str = "cpu", seed: int = 0,
                                   warmup_steps: int = 1, per_layer: bool = False):
    """Bytes saved for backward by one forward + loss (one micro-batch), parameters excluded.

    Uses ``torch.autograd.graph.saved_tensors_hooks``; every packed tensor is deduplicated by its
    storage (device, data_ptr) -- views and the same tensor saved by several nodes count once; a
    storage that is a parameter's (or a buffer's) is excluded.  With ``per_layer=True`` returns
    ``(total, {scope: bytes})`` where scope is ``"pre-layers"`` (embedding: the int64 ids),
    ``"layer{i}"`` (decoder block i; layer0 also gets the rotary cos/sin, first saved there) or
    ``"post-layers"`` (final norm, lm_head, loss), by which forward was running when the storage
    was first saved.  With ``grad_ckpt=True`` torch's non-reentrant checkpoint packs its own hooks
    inside each block, so only what stays saved between forward and backward is seen: the block
    input (b*s*h per layer, saved through the same hook mechanism) plus everything outside blocks.
    ``optimizer``/``grad_accum``/``warmup_steps`` are accepted for signature parity and ignored.

    Verified per decoder layer (llama code path, 7 shapes x 5 modes, exact to the byte), with
    b=micro_batch, s=seq_len, h=hidden, I=intermediate, nh=heads, kvd=kv_heads*head_dim,
    kvr = h if kv_heads > 1 else kvd (eager's repeat_kv copies unless it is a stride-0 view):
      fp32 full sdpa : 4*b*s*(8h + 2kvd + nh + 2 + 4I)
      fp32 full eager: 4*b*s*(8h + 2kvr + nh*s + 2 + 4I)
      fp32 LoRA sdpa : 4*b*s*(6h + 2kvd + nh + 2 + 4I + r*n_adapted)   (eager: same substitution)
      bf16 autocast  : b*s*(30h + 4kvd + 4nh + 8 + 8I) + 2*(linear weights of the block)
    and outside the blocks: ids 8*b*s; final norm + lm_head + log_softmax
    4*b*s*(3h+1 + V) (full) or 4*b*s*(h+1 + V) (LoRA, frozen norm/head) + 8*b*s shifted labels.
    """
    _validate(method, attn, precision, optimizer, device, grad_accum, micro_batch, seq_len, warmup_steps)
    import torch

    setup = build_training_setup(hf_config, method=method, lora_rank=lora_rank, lora_alpha=lora_alpha,
                                 lora_targets=lora_targets, grad_ckpt=grad_ckpt, attn=attn,
                                 precision=precision, optimizer=optimizer, device=device, seed=seed)
    model = setup.model
    excluded = {_storage_key(t) for t in list(model.parameters()) + list(model.buffers())}
    (ids,) = _make_batches(1, micro_batch, seq_len, setup.vocab_size, setup.device, seed)

    seen: dict[tuple[str, int], int] = {}
    owner: dict[tuple[str, int], str] = {}
    scope = ["pre-layers"]

    def pack(t):
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta":
            k = _storage_key(t)
            if k not in excluded:
                nb = t.untyped_storage().nbytes()
                if nb > seen.get(k, 0):
                    seen[k] = nb
                    owner.setdefault(k, scope[-1])
        return t

    hooks = []
    layers = _decoder_layers(model)
    def enter(i):
        def hook(module, args):
            scope.append(f"layer{i}")
        return hook

    def leave(last):
        def hook(module, args, output):
            scope.pop()
            if last:
                scope[0] = "post-layers"
        return hook

    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_pre_hook(enter(i)))
        hooks.append(layer.register_forward_hook(leave(i == len(layers) - 1)))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with setup.autocast():
                loss = model(input_ids=ids, labels=ids).loss
    finally:
        for h in hooks:
            h.remove()
    del loss
    total = sum(seen.values())
    if not per_layer:
        return total
    by: dict[str, int] = {}
    for k, nb in seen.items():
        by[owner[k]] = by.get(owner[k], 0) + nb
    return total, by


def _decoder_layers(model) -> list:
    """The repeated decoder blocks (``...model.layers``) of a (possibly peft-wrapped) causal LM."""
    import torch

    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and name.endswith("layers"):
            if best is None or len(mod) > len(best):
                best = mod
    return list(best) if best is not None else []

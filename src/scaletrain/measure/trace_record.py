"""What the traced slice's forward saves and how far live memory rises while each layer runs forward and backward
(measure/trace.py): a saved-tensor recorder and the CPU allocator's live bytes (torch.profiler), per layer window."""

from __future__ import annotations

from scaletrain.measure.saved_activations import decoder_layers, layer_siblings
from scaletrain.measure.trace_fit import TraceError
from scaletrain.measure.trace_steps import head_width
from scaletrain.measure.trace_structure import ATTN_NAMES, MLP_NAMES, SLICE_VOCAB


def _tensors_in(x) -> list:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors_in(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors_in(v)]
    return []


def _child(layer, names: tuple[str, ...], cls_word: str):
    for name, mod in layer.named_children():
        if name in names or cls_word in type(mod).__name__:
            return mod
    return None


class _Recorder:
    """Saved storages by where forward was when autograd first packed them. Every packed tensor is kept alive
    until the forward ends, so a storage's address stays its own: a freed temporary cannot hand its address to a
    later saved tensor, which would then be taken for the first and go uncounted."""

    def __init__(self, torch, excluded: set, count_passed: bool = False):
        self.torch, self.excluded = torch, excluded
        self.count_passed = count_passed   # checkpointing: what a layer receives is held until its recompute
        self.scope = "shared"
        self.shared_keys: set = set()
        self.alive: list = []
        self.seen: dict = {}            # storage key → [bytes, scope, shape, dtype]
        self.leaf = None                # the input embedding's output when it is a leaf that requires grad
        self.inputs: dict[int, int] = {}  # layer → bytes of the hidden states it receives (what checkpointing keeps)
        self.input_keys: set = set()      # (layer, storage) of those counted
        self.carried: set = set()         # storages the last layer returned beside its hidden states

    def pack(self, t):
        from scaletrain.measure.step import storage_key

        torch = self.torch
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta":
            self.alive.append(t)
            k = storage_key(t)
            if k not in self.excluded:
                nb = t.untyped_storage().nbytes()
                rec = self.seen.get(k)
                scope = "shared" if k in self.shared_keys else self.scope
                if rec is None:
                    self.seen[k] = [nb, scope, tuple(t.shape), t.dtype]
                elif nb > rec[0]:
                    rec[0] = nb
        return t

    def hooks(self, model) -> list:
        from scaletrain.measure.step import storage_key

        out = []
        layers = decoder_layers(model)

        def enter(i):
            def hook(module, args, kwargs):
                if i == 0:
                    self._held_leaf(args, kwargs)
                passed = _tensors_in(list(args[1:])) + _tensors_in({k: v for k, v in kwargs.items()
                                                                    if k != "hidden_states"})
                # a state the layer before returned beside its hidden states that gradients flow through (zaya's
                # router states): per layer, a second residual stream its checkpoint keeps, not a tensor every layer
                # shares (hy_v4's top-k indices, no gradient, stay with the shared ones: measured over as they were)
                carried = {storage_key(t): t for t in passed if storage_key(t) in self.carried and t.requires_grad}
                passed = [t for t in passed if storage_key(t) not in carried]
                self._input(i, args, kwargs, sum(t.untyped_storage().nbytes() for t in carried.values()))
                self.shared_keys.update(storage_key(t) for t in passed)
                if self.count_passed:
                    scope, self.scope = self.scope, "shared"
                    for t in passed:
                        self.pack(t)
                    self.scope = scope
                self.alive += passed
                self.scope = f"layer{i}.attn"
            return hook

        def half(i, name):
            def hook(module, args):
                self.scope = f"layer{i}.{name}"
            return hook

        # a layer spread over parallel lists (XLM's attention, norms and feed-forward): what element i of each saves
        # is layer i's, the bytes after it too (its residual add) until another layer's part starts. Counted as the
        # final norm's before, once: XLM's LoRA step was planned 4.7 % under at 6 layers (2 traced)
        # Under checkpointing a part beside the layer is not recomputed with it (blt's cross-attention beside its
        # local decoder's layers): what it saves is kept to the backward, as the layer's input is (`beside`, added
        # to the layer's `input`: trace.py)
        for name, parts in layer_siblings(model, layers):
            half_name = "attn" if any(w in name for w in ("attn", "attention")) else "mlp"
            which = "beside" if self.count_passed else half_name
            for i, part in parts.items():
                out.append(part.register_forward_pre_hook(half(i, which)))

        def leave(module, args, output):
            self.scope = "final_norm"
            self.carried = {storage_key(t) for t in _tensors_in(output)[1:]}

        for i, layer in enumerate(layers):
            out.append(layer.register_forward_pre_hook(enter(i), with_kwargs=True))
            out.append(layer.register_forward_hook(leave))
            for name, names, word in (("attn", ATTN_NAMES, "Attention"), ("mlp", MLP_NAMES, "MLP")):
                child = _child(layer, names, word)
                if child is not None:
                    out.append(child.register_forward_pre_hook(half(i, name)))
        head = model.get_output_embeddings()
        embed = model.get_input_embeddings()

        def embedded(module, args, output):     # after transformers' own hook (registered before this one)
            torch = self.torch
            if isinstance(output, torch.Tensor) and output.requires_grad and output.is_leaf:
                self.leaf = output
        if embed is not None:
            out.append(embed.register_forward_hook(embedded))

        def head_in(module, args):
            self.scope = "head_input"

        def head_out(module, args, output):
            self.scope = "loss"
        out.append(head.register_forward_pre_hook(head_in))
        out.append(head.register_forward_hook(head_out))
        return out


    def _input(self, i: int, args, kwargs, carried: int = 0) -> None:
        """The storage of the hidden states layer `i` receives: what a checkpointed layer keeps for its recompute.
        Its real width, not the config's hidden size: hyper-connections (hy_v4's hc_mult) hand every layer several
        copies of the residual stream (torch.profiler: hy_v4 LoRA + checkpointing, 4·h per token per layer).
        `carried`: the bytes of what the layer before returned beside them."""
        from scaletrain.measure.step import storage_key

        x = _first_tensor(list(args[:1])) if args else _first_tensor(kwargs.get("hidden_states"))
        if isinstance(x, self.torch.Tensor) and x.layout == self.torch.strided and x.device.type != "meta":
            # a layer a looped stack runs several times keeps each run's input (a run under no_grad keeps none);
            # a checkpoint's recompute hands it the same storage again
            key = (i, storage_key(x))
            if self.torch.is_grad_enabled() and key not in self.input_keys:
                self.input_keys.add(key)
                self.inputs[i] = self.inputs.get(i, 0) + x.untyped_storage().nbytes() + carried

    def _held_leaf(self, args, kwargs) -> None:
        """LoRA + checkpointing: transformers (gradient_checkpointing_enable) and peft make the frozen embedding's
        output require grad, so the checkpointed blocks build a graph; that output is then a leaf its AccumulateGrad
        node holds until backward ends, though nothing saves it. Counted with the shared tensors unless the first
        block receives it itself (its input, which the engine counts as the block's checkpoint): granite's
        embedding multiplier, BERT's embedding LayerNorm and dropout make another tensor of it (torch.profiler:
        one B·S·h fp32 tensor alive at the peak beside the blocks' inputs, granite LoRA + checkpointing)."""
        from scaletrain.measure.step import storage_key

        leaf, self.leaf = self.leaf, None
        if leaf is None:
            return
        x = _first_tensor(list(args[:1])) if args else _first_tensor(kwargs.get("hidden_states"))
        if x is None or storage_key(x) != storage_key(leaf):
            scope, self.scope = self.scope, "shared"
            self.pack(leaf)
            self.scope = scope


class _Live:
    """The rise of the CPU allocator's live bytes within each window: a layer's forward, a layer's backward (from
    the gradient of its output to the gradient of its input), the tail's backward. The windows' ends are marks in a
    torch.profiler session (profile_memory) around the forward and backward; after it, the allocator's own running
    total between the marks gives each window's peak over its start: what torch.profiler reads for a whole step.
    A Python dispatch mode counting storages (TRACE_FORMAT ≤ 16) changed the program it watched: autograd
    accumulated gradients out of place under it, and a per-position loop's backward (jamba's mamba scan) rose 2 MB
    higher than without it. Kernels' own scratch (aten::_safe_softmax's masks) is seen too."""

    PREFIX = "scaletrain.window/"

    def __init__(self, torch):
        self.torch = torch
        self.rises: dict[str, int] = {}
        self.nets: dict[str, int] = {}                 # live bytes at a window's end over its start
        self.calls: dict[int, int] = {}               # layer → forwards it ran (a looped stack's: several)
        self.front_hooked = False                      # the stack's first input that requires grad is hooked
        self.order: list[int] = []                     # the layers' forwards with gradients, in the order they ran
        self.backward = False                          # the backward pass runs (its recomputes are no forward)
        self.recomputing: int | None = None            # a reversible layer whose recompute runs in the backward
        self.recomputed: dict[str, int] = {}           # a recompute window → parameter gradient bytes at its open
        self.front_grads: int | None = None            # parameter gradient bytes when the front's window opened
        self.kept: dict[str, int] = {}                 # a layer's forward allocations still alive when forward ends
        self.prof = None

    def profiling(self):
        from torch.profiler import ProfilerActivity, profile

        self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        return self.prof

    def _mark(self, what: str, name: str) -> None:
        with self.torch.autograd.profiler.record_function(f"{self.PREFIX}{what}/{name}"):
            pass

    def open(self, name: str) -> None:
        self._mark("open", name)

    def forward_ends(self) -> None:
        """The forward is over: what each layer's forward allocated and is still alive is counted (`kept`)."""
        self._mark("mark", "forward_end")

    def close(self, name: str) -> None:
        """The window's rise (its peak over its start) is kept; later allocations no longer raise it."""
        self._mark("close", name)

    def front(self, model) -> None:
        """The first layer's input gradient: its backward window ends, the front's opens (what runs backward
        before the stack: the embedding's, gemma3n's per-layer input projection). Its peak is taken over what is
        alive when backward ends less the gradients the front made (`front.grads`), not over its start: what the
        stack's backward freed before the front began (gemma3n's per-layer inputs, held by the checkpoints) is
        not counted twice. The engine takes the front's gradients off again (it counts every gradient itself):
        apart, both fit as the traced lengths' curves do (their difference has a negative constant)."""
        self.close("bwd0")
        self.front_grads = _grad_bytes(model)
        self.open("front")

    def tail_then(self, name: str) -> None:
        """A layer's output gradient: the tail's window (open from the head's input gradient) ends, the layer's
        backward window opens."""
        self.close("tail")
        self.open(name)

    def release(self) -> None:
        """Drop the profiler's record of the run now. torch.profiler.profile refers to itself (its action map of
        bound methods), so it lives until the collector runs, and its record with it: zamba's 8-layer slice, traced
        at 64, 128 and 192 tokens, held 1.1, 3.0 and 4.3 GiB after each run (its per-position mamba loop makes the
        record large), and its trace stopped at the process's 18 GiB cap; released and trimmed, about 0.5 GiB. A
        collector run instead costs ~0.1-0.2 s a run, seconds of a first plan. The measured bytes are allocator
        events inside the run's windows, read before: unchanged."""
        if self.prof is not None:
            self.prof.profiler = None
            self.prof = None
        _trim_heap()

    def close_all(self) -> dict[str, int]:
        """The windows' rises from the profiler's events, in time order; a window still open at the end closes
        there, but the tail's (no layer's output gradient ended it: no tail measured, not all backward)."""
        from torch._C._profiler import _EventType

        if self.prof is None:
            return self.rises
        alloc, cpu, prefix = _EventType.Allocation, self.torch.device("cpu"), self.PREFIX
        nodes = time_ordered(self.prof.profiler.kineto_results)
        typed = [n.typed for n in nodes]           # a property that builds its tuple anew: read once each
        first = next((e for kind, e in typed if kind == alloc and e.device == cpu), None)
        live = first.total_allocated - first.alloc_size if first is not None else 0
        session = live                 # the allocator's running total when the run began (it drifts from run to run)
        windows: dict[str, list[int]] = {}
        owned: dict[int, tuple[str, int]] = {}     # a forward window's allocations not freed: ptr → (window, bytes)
        forward: list[str] = []                    # the forward windows open now, the last opened last
        for n, (kind, event) in zip(nodes, typed):
            if kind == alloc:
                if event.device != cpu:
                    continue
                live = event.total_allocated
                for w in windows.values():
                    w[1] = max(w[1], live)
                if event.alloc_size < 0:
                    owned.pop(event.ptr, None)
                elif forward:           # made while a layer's forward window is open: that window's until freed
                    owned[event.ptr] = (forward[-1], int(event.alloc_size))
                continue
            name = n.name
            if not name.startswith(prefix):
                continue
            what, name = name[len(prefix):].split("/", 1)
            if what == "mark":              # forward_end: the forward windows' allocations still alive
                for window, nb in owned.values():
                    self.kept[window] = self.kept.get(window, 0) + nb
                owned.clear()
            elif what == "open":
                windows[name] = [live, live]
                if name.startswith("fwd"):
                    forward.append(name)
                if name in self.recomputed:      # over the run's start, less the gradients made (_recompute)
                    windows[name][0] = session + self.recomputed[name]
            elif name in windows:        # a layer a looped stack runs k times: its largest rise, its k nets
                start, peak = windows.pop(name)
                if name in forward:
                    forward.remove(name)
                self.rises[name] = max(self.rises.get(name, 0), peak - start)
                self.nets[name] = self.nets.get(name, 0) + live - start
        windows.pop("tail", None)
        for name, (start, peak) in windows.items():
            self.rises[name] = max(self.rises.get(name, 0), peak - start)
        if "front" in windows:      # over what outlives backward, not over the front's start (front())
            self.rises["front"] = windows["front"][1] - live
        return self.rises


def time_ordered(result) -> list:
    """The profiler's events in the order torch's memory profiler reads them (torch/profiler/_memory_profiler.py
    OpTree: its depth-first walk, stably sorted by start time), without building its OpTree: that walk went through
    a generic traversal and each event's `typed` property several times, about a third of a tiny trace's time
    (cProfile, qwen3_next's sweep config: 0.7 of 1.8 s a regime)."""
    nodes = []
    stack = list(reversed(result.experimental_event_tree()))
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(reversed(node.children))
    nodes.sort(key=lambda x: x.start_time_ns)
    return nodes


def _grad_bytes(model) -> int:
    return sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)


def _first_tensor(x):
    found = _tensors_in(x)
    return found[0] if found else None


def _window_hooks(model, live: _Live) -> list:
    """Each decoder layer's forward and backward as a window of `live` (the backward's ends are gradient hooks on
    the layer's output and input), and the backward between the output head and the last layer (`tail`: from the
    gradient of the head's input to that of the last layer's output: the final norm's backward, and a head
    transform's, rembert's width-1664 dense + LayerNorm before its decoder)."""
    out = []
    head = model.get_output_embeddings()
    if head is not None:
        def head_pre(module, args):
            x = _first_tensor(list(args[:1]))
            if x is not None and x.requires_grad and not live.backward:
                x.register_hook(lambda g: live.open("tail"))
        out.append(head.register_forward_pre_hook(head_pre))
    for i, layer in enumerate(decoder_layers(model)):
        def pre(module, args, kwargs, i=i):
            if live.backward:          # a checkpoint's recompute: its rise is in the layer's backward window
                return
            live.calls[i] = live.calls.get(i, 0) + 1
            if live.torch.is_grad_enabled():
                live.order.append(i)
            live.open(f"fwd{i}")
            x = _first_tensor(list(args[:1])) if args else _first_tensor(kwargs.get("hidden_states"))
            if x is not None and x.requires_grad:
                first = not i and not live.front_hooked     # the stack's first input: the front's backward follows
                live.front_hooked |= first
                x.register_hook(lambda g, i=i: live.front(model) if first else live.close(f"bwd{i}"))

        def post(module, args, output, i=i):
            if live.backward:
                return
            live.close(f"fwd{i}")
            y = _first_tensor(output)
            if y is not None and y.requires_grad:
                y.register_hook(lambda g, i=i: live.tail_then(f"bwd{i}"))
        out.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        out.append(layer.register_forward_hook(post))
        out += [child.register_forward_pre_hook(lambda m, a, i=i: _recompute(live, model, i))
                for child in layer.children()]
    return out


def _recompute(live: _Live, model, i: int) -> None:
    """A part of layer `i` runs in the backward although the layer's forward never ran with gradients: a reversible
    residual stack (reformer's), whose own autograd Function rebuilds each layer's input from its output and
    recomputes it, last layer first, inside its backward. The layer's backward window opens at the first of its
    parts to run there and closes when another layer's part starts (or when backward ends). Its rise is taken
    over the tail's start (the head's input gradient), less the gradients the layers after it made: what the
    Function keeps (its saved outputs, the rebuilt hidden states and their gradients, which no window of a
    layer's own sees being made) is in it, the layers' gradients are counted by the engine."""
    if not live.backward or live.recomputing == i or i in live.order or i not in live.calls:
        return
    if live.recomputing is not None:
        live.close(f"bwd{live.recomputing}")
    live.recomputing = i
    live.recomputed[f"bwd{i}"] = _grad_bytes(model)
    live.open(f"bwd{i}")


def _trim_heap() -> None:
    """Hand the heap freed since the last call back to the system (glibc keeps it otherwise): after a profiled
    run's record is dropped (_Live.release). A no-op off glibc."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def saved_by_scope(harness, seq_len: int, batch: int = 1) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """One forward + loss + backward at micro-batch 1: saved bytes per scope (and per layer the bytes of its input,
    `layer{i}.input`), the largest per-token tensor per scope, and per layer the rise of live bytes in its forward (`fwd{i}`) and in its backward (`bwd{i}`)."""
    import torch

    from scaletrain.measure.step import make_batches, step_loss, storage_key

    model = harness.model
    excluded = {storage_key(t) for t in list(model.parameters()) + list(model.buffers())}
    rec = _Recorder(torch, excluded, count_passed=any(getattr(m, "gradient_checkpointing", False) is True
                                                        for m in model.modules()))
    live = _Live(torch)
    (ids,) = make_batches(1, batch, seq_len, harness.vocab_size, harness.device, 0)
    rec.scope = "shared"
    hooks = rec.hooks(model) + _window_hooks(model, live)
    try:
        with live.profiling():
            with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t), harness.autocast():
                loss = step_loss(harness, ids)
            rec.alive.clear()
            if not loss.requires_grad:
                raise TraceError("no trainable parameter gets a gradient from its loss: its layers run inside an "
                                 "autograd Function that tracks only its input (a reversible residual stack), and "
                                 "the frozen embedding gives that input none; train it fully (--method full)")
            live.forward_ends()
            live.backward = True
            loss.backward()
    finally:
        for h in hooks:
            h.remove()
    del loss
    # the gradients made in the front (front()'s doc), read before they are dropped
    front_grads = None if live.front_grads is None else _grad_bytes(model) - live.front_grads
    # layers whose every forward ran without autograd (a reversible stack) yet whose parameters got gradients with
    # no part of them seen running in the backward: recomputed where no window here opens
    unseen = [i for i, layer in enumerate(decoder_layers(model)) if i in live.calls and i not in live.order
              and f"bwd{i}" not in live.recomputed and any(p.grad is not None for p in layer.parameters())]
    model.zero_grad(set_to_none=True)
    total: dict[str, int] = {}
    largest: dict[str, int] = {}
    vocab = head_width(model)
    for nb, scope, shape, dtype in rec.seen.values():
        if scope == "loss" or (shape and shape[-1] in (SLICE_VOCAB, vocab)):
            if scope == "loss" and shape and shape[-1] == vocab:     # what the head's tail saves over the logits
                total["loss_vocab"] = total.get("loss_vocab", 0) + nb
            continue              # logits, log-softmax, labels: the engine's cross-entropy terms
        total[scope] = total.get(scope, 0) + nb
        if list(shape).count(seq_len) == 1:
            largest[scope] = max(largest.get(scope, 0), nb // (seq_len * batch))
    for i, nb in rec.inputs.items():
        total[f"layer{i}.input"] = nb
    rises = dict(live.close_all())
    rises["calls.max"] = max(live.calls.values(), default=1)    # > 1: a looped stack (a layer ran several times)
    rises["calls.order"] = live.order                           # type: ignore[assignment]  (its runs, in order)
    rises["calls.unseen"] = unseen                              # type: ignore[assignment]
    if "front" in rises and front_grads is not None:
        rises["front.grads"] = front_grads
        rises["front"] = max(rises["front"] + rises["front.grads"], 0)
    live.release()
    # what each layer's backward leaves alive past its own gradients (without checkpointing, past its saved tensors
    # freed too: the backward's net is their release); checkpointed, also what its forward leaves (module doc)
    rng = torch.get_rng_state().nbytes if rec.count_passed else 0
    for i, layer in enumerate(decoder_layers(model)):
        grads = sum(p.numel() * p.element_size() for p in layer.parameters() if p.requires_grad)
        own = 0 if rec.count_passed else total.get(f"layer{i}.attn", 0) + total.get(f"layer{i}.mlp", 0)
        if f"bwd{i}" in live.nets:
            rises[f"bwd{i}.left"] = max(live.nets[f"bwd{i}"] + own - grads, 0)
        if rec.count_passed:
            rises[f"fwd{i}.left"] = max(live.nets.get(f"fwd{i}", 0) - total.get(f"layer{i}.input", 0), 0)
            # of that, what outlives the forward (gemma4's keys and values, kept for the layers that share them,
            # held through backward by the dict every checkpoint keeps): its output, the next one's input, aside,
            # and the checkpoint's CPU generator state (taken in the window; the engine counts it: rng_state_bytes)
            kept = max(live.kept.get(f"fwd{i}", 0) - total.get(f"layer{i}.input", 0) - rng, 0)
            rises[f"fwd{i}.kept"] = min(kept, rises[f"fwd{i}.left"])
    return total, largest, rises

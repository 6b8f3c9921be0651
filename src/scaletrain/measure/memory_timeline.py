"""Reading torch.profiler's memory timeline of one CPU step: the allocated peak, per category, live tensors included.

measure.py runs the profiled step; this module turns the profiler's record into bytes. Private profiler API
(torch 2.13): when the timeline cannot be built, the allocator's own counter is the fallback.
"""

from __future__ import annotations

from dataclasses import dataclass



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
    source: str = "timeline"   # or "allocation events" (allocation_events_reading: the timeline could not be built)


def read_cpu_timeline(prof) -> CpuTimelineReading:
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


def counter_only_reading(prof, live_before: int, exc: Exception) -> CpuTimelineReading:
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


def allocation_events_reading(prof, live_before: int, exc: Exception) -> CpuTimelineReading:
    """The profiler's raw allocation events when its data-flow graph cannot be built (torch 2.13 asserts "duplicate
    outputs" / "version mismatch" on some FSDP2 steps over gloo, whose worker threads drop tensors the main thread
    allocated). Walked in time order: a free of a storage allocated before the window is live-at-start memory too
    (FSDP2's last all-gather buffer of the previous step, say), so it is added to `live_before` (the parameters,
    buffers, optimizer state and batch the caller counted); the peak is that plus the running sum's maximum. On the
    FSDP steps whose timeline did build, this gives the timeline's peak byte for byte (bench/cpu_groundtruth.py)."""
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import OpTree

    cpu = "cpu"
    events = sorted((e for e in OpTree(prof.profiler.kineto_results).sorted_nodes
                     if e.typed[0] == _EventType.Allocation and e.typed[1].device.type == cpu),
                    key=lambda e: e.start_time_ns)
    running = peak = freed_before = 0
    allocated: set[int] = set()
    for e in events:
        f = e.typed[1]
        if f.alloc_size > 0:
            allocated.add(f.ptr)
        elif f.ptr in allocated:
            allocated.discard(f.ptr)
        else:
            freed_before -= f.alloc_size
        running += f.alloc_size
        peak = max(peak, running)
    pre = live_before + freed_before
    return CpuTimelineReading(
        peak_bytes=pre + peak, peak_by_category={"PREEXISTING": pre, "unknown": peak}, preexisting_bytes=pre,
        preexisting_by_category={"PREEXISTING": pre}, end_bytes=pre + running, counter_peak_delta=peak,
        coalesced_peak_bytes=0, n_events=len(events), source=f"allocation events ({str(exc).split(':')[0]})")

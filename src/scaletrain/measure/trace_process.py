"""The trace process's surroundings: it ends with the planning process that started it, and runs on one thread.
torch is imported inside functions."""

from __future__ import annotations

import os
import sys


def die_with_parent() -> None:
    """End with the planning process that started this one, even mid-trace: a daemon thread watches the parent
    process id (it changes when the parent dies and this process is re-parented). Not prctl's PR_SET_PDEATHSIG: that
    fires when the THREAD that started this process ends, and the wizard plans from threads that end after each
    plan, which killed the trace process between two plans (and the next paid transformers' import again)."""
    import threading
    import time

    parent = os.getppid()
    if parent == 1:                           # the parent was gone before this process started watching
        sys.exit(0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def one_thread() -> None:
    """The slices are small: a second intra-op thread buys nothing, and on a loaded machine (a training run beside
    the planner, a CI worker) OpenMP's threads wait on each other — a 512×64×192 linear took 15.7 ms on 2 threads
    with the other core busy and 0.22 ms on one (this 2-core VM, torch 2.13). Allocation sizes do not change with
    it (tiny-phi3's traces are byte-identical on 1 and 2 threads); the trace's answer is bytes, not time."""
    try:
        import torch
    except ImportError:         # answered per request: "the train extra is missing"
        return
    torch.set_num_threads(1)

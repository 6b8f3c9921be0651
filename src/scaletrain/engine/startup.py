"""Loading the training stack (torch, transformers, accelerate, peft) with Python's cyclic garbage collector paused.

Why: those imports create a few million objects that live as long as the process, and while they load the
collector walks them again and again (a collection every 700 new objects, its older generations ever larger):
importing torch, transformers, accelerate, peft and one model's module took 3.5 CPU-s with the collector on and
2.8 with it off (this 2-core VM, 2026-12-02, three runs each). Every rank, and every probe that traces a model,
pays that at start, so a launch's two ranks start about 1.4 CPU-s sooner. Imports make no garbage worth
collecting; what they made is then frozen out of the collector's sight (gc.freeze) for the rest of the process, so
a later collection walks only what the run itself creates.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
from collections.abc import Iterator

# torch and what building any transformers model loads (its modeling base, masks, activations, the Auto classes):
# loaded by every rank (trainer/train.py adds accelerate, peft, deepspeed, trl as the run needs) and trace probe
TRANSFORMERS_STACK = ("torch", "transformers", "transformers.modeling_utils", "transformers.masking_utils",
                      "transformers.activations", "transformers.models.auto.modeling_auto")


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off inside (on again after, if it was on), and everything alive at the end frozen."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.freeze()


def import_stack(*modules: str) -> None:
    """Import these modules with the collector paused (a module not installed is left to the code that needs it to
    report, in its own words)."""
    with collector_paused():
        for name in modules:
            try:
                importlib.import_module(name)
            except ImportError:
                pass

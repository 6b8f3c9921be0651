"""engine/startup.py: the stack loads with the garbage collector paused, and what it loaded is frozen after."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from scaletrain.engine.startup import collector_paused, import_stack


def test_the_collector_is_off_inside_back_on_after_and_what_lived_is_frozen():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with collector_paused():
        assert not gc.isenabled()
        kept = [[i] for i in range(1000)]           # objects alive at the end: frozen with the rest
    assert gc.isenabled() and gc.get_freeze_count() >= frozen + 1000
    gc.unfreeze()
    del kept


def test_a_collector_turned_off_before_stays_off_and_an_error_inside_still_restores():
    gc.disable()
    try:
        with pytest.raises(ValueError):
            with collector_paused():
                raise ValueError("inside")
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


def test_a_process_imports_the_stack_with_no_collection_and_skips_what_is_not_installed():
    """In a fresh interpreter: the modules are imported, a missing one is left for its user to report, and no
    collection ran while they loaded (gc.callbacks see every collection)."""
    code = ("import gc, sys\n"
            "runs = []\n"
            "gc.callbacks.append(lambda phase, info: runs.append(phase))\n"
            "from scaletrain.engine.startup import import_stack\n"
            "before = len(runs)\n"
            "import_stack('json', 'email.mime.text', 'no_such_module_here')\n"
            "during = len(runs) - before\n"
            "print('email.mime.text' in sys.modules, 'no_such_module_here' in sys.modules, during, gc.isenabled())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "0", "True"]
    import_stack()                                  # nothing to import: a no-op that still leaves gc on
    assert gc.isenabled()
    gc.unfreeze()

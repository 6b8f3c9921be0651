"""Hermetic tests: no user calibration profile leaks in, and no process a test started outlives it.

Shared, session-scoped trained runs (`ddp_run`, `zero3_run`, `fsdp_run`, `demo_run`, `options_run`): one real 2-rank
training each, asserted on by every test that needs "a run that trained" instead of each launching its own. They are
read-only: a test that changes a run (exports another step, edits a file, resumes it) copies it first
(`TrainedRun.copy`). Under pytest-xdist every test that
uses one is sent to the same worker (its `xdist_group`), so each run is trained once per session.
"""

from __future__ import annotations

import atexit
import functools
import gc
import io
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import pytest

_CONFIG = tempfile.mkdtemp(prefix="scaletrain-test-config-")
os.environ["SCALETRAIN_CONFIG_DIR"] = _CONFIG
# the run registry (engine/launch/registry.py: every launch writes an entry) never lands in the user's state dir
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="scaletrain-test-state-")
# traced model families (engine/catalog/traced.py) cache here, never in the user's ~/.cache
os.environ["SCALETRAIN_CACHE"] = tempfile.mkdtemp(prefix="scaletrain-test-traces-")
# and go when this process does (each xdist worker and the controller made their own)
for _made in (_CONFIG, os.environ["XDG_STATE_HOME"], os.environ["SCALETRAIN_CACHE"]):
    atexit.register(shutil.rmtree, _made, True)


def import_when_run(*names: str):
    """A module-scoped autouse fixture for a test file that needs heavy libraries (torch, transformers, peft):
    imported (or the file skipped, as pytest.importorskip) when the file's first test runs, not when it is collected
    — every pytest-xdist worker collects every file, and `make test-fast` deselects most of these tests. Each name's
    top-level module becomes a global of the test file (`torch`). Use: `_libs = import_when_run("torch", ...)`."""

    @pytest.fixture(autouse=True, scope="module")
    def _imports(request):
        from scaletrain.engine.startup import collector_paused

        # the collector paused while they load, then their objects frozen out of its sight (engine/startup.py)
        with collector_paused():
            for name in names:
                pytest.importorskip(name)
                top = name.split(".")[0]
                setattr(request.module, top, __import__(top))

    return _imports


@pytest.fixture(autouse=True)
def _no_stray_processes():
    """A test that fails midway (a timeout in a pilot, an assertion while ranks run) must not leave training
    processes behind: kill whatever this pytest process still has below it once the test is over."""
    yield
    me = psutil.Process()
    strays = me.children(recursive=True)
    for p in strays:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(strays, timeout=5)


# ---- shared trained runs ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainedRun:
    """A finished 2-rank run of scaletrain/tiny-qwen2 (the RunDir) and what launching it said."""
    run: object                 # scaletrain.engine.run.layout.RunDir
    exit_code: int
    console: str                # stream_run's console (ddp_run), the console script's output (demo_run,
                                # zero3_run) or "" (launched with launch())
    baton: Path | None = None   # zero3_run: the stale DeepSpeed build lock it started over

    def ok(self):
        """The run, once its training is known to have finished with exit code 0."""
        assert self.exit_code == 0, self.console + self.run.rank_log(0).read_text()[-3000:]
        return self.run

    def copy(self, to: Path):
        """A writable copy of the run (a run folder travels: tests/e2e/test_portable_run.py); the shared one stays as
        it was trained for the tests after this one."""
        from scaletrain.engine.run.layout import RunDir

        shutil.copytree(self.ok().path, to, symlinks=True)
        return RunDir(to)


def _launched(tmp: Path, strategy: str, env: dict[str, str] | None = None, **train) -> TrainedRun:
    from scaletrain.engine.launch.launcher import launch
    from test_train_cpu import deadline_tick, make_run, write_dataset

    run = make_run(tmp, strategy, dataset=str(write_dataset(tmp / "data.jsonl")), **train)
    res = launch(run.path, on_tick=deadline_tick(), env=env)
    return TrainedRun(run, res.exit_code, "")


def _stale_deepspeed_baton(root: Path) -> tuple[Path, dict[str, str]]:
    """A torch extensions folder of the run's own (TORCH_EXTENSIONS_DIR) holding DeepSpeed's CPU comm op as built
    for this venv (copied, so not built again) and the `lock` file a rank killed while torch's FileBaton held it
    leaves (O_EXCL, empty). Its own folder: a DeepSpeed run of another test running beside it cannot take the
    stale lock away first."""
    from deepspeed.accelerator import get_accelerator
    from torch.utils.cpp_extension import _get_build_directory

    from scaletrain.trainer.distributed import load_deepspeed_cpu_comm_op

    load_deepspeed_cpu_comm_op()            # built whole first (`make ds-op` did it already: then a quick load)
    name = get_accelerator().create_op_builder("ShareMemCommBuilder").name
    built = Path(_get_build_directory(name, verbose=False))
    own = root / built.name                    # torch's layout under TORCH_EXTENSIONS_DIR: ROOT/NAME
    shutil.copytree(built, own, dirs_exist_ok=True, ignore=shutil.ignore_patterns("lock", "*.flock"))
    (own / "lock").write_text("")
    an_hour_ago = time.time() - 3600          # a dead process's: older than any live build (STALE_BATON_S)
    os.utime(own / "lock", (an_hour_ago, an_hour_ago))
    return own / "lock", dict(os.environ, TORCH_EXTENSIONS_DIR=str(root))


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory) -> TrainedRun:
    """`scaletrain launch`'s path (progress.stream_run → launcher → accelerate/torchrun → trainer) on the bundled
    demo data: 24 steps with warmup and cosine decay, checkpoints at 10, 20 and 24, the last exported."""
    from rich.console import Console

    from scaletrain.tui.monitor.stream import stream_run
    from test_train_cpu import make_run

    run = make_run(tmp_path_factory.mktemp("ddp-run"), "ddp", lr=5e-3, max_steps=24, checkpoint_every=10,
                   warmup_ratio=0.1)
    out = io.StringIO()
    code = stream_run(run.path, console=Console(file=out, width=240, force_terminal=False))
    return TrainedRun(run, code, out.getvalue())


@pytest.fixture(scope="session")
def zero3_run(tmp_path_factory) -> TrainedRun:
    """DeepSpeed ZeRO-3 over 2 ranks as a user replays it: the `scaletrain` console script, `--preset cpu-tiny
    --headless --set strategy=zero3` (the bundled demo data), 12 steps, checkpoints at 6 and 12, the last exported
    through DeepSpeed's gather; started over a stale DeepSpeed build lock (`baton`: that lock's path); the console is
    what it printed (stdout and stderr)."""
    tmp = tmp_path_factory.mktemp("zero3-run")
    baton, env = _stale_deepspeed_baton(tmp / "torch_extensions")
    run, proc = _console_script(tmp / "zero3", env, "strategy=zero3", "train.max_steps=12", "train.checkpoint_every=6")
    return TrainedRun(run, proc.returncode, proc.stdout + proc.stderr, baton=baton)


def _console_script(run_dir: Path, env: dict[str, str], *settings: str):
    """`scaletrain --preset cpu-tiny --headless --run-dir RUN_DIR --set S...` as a user types it: (RunDir, process)."""
    import subprocess
    import sys

    from scaletrain.engine.run.layout import RunDir

    scaletrain = os.path.join(os.path.dirname(sys.executable), "scaletrain")
    sets = [a for s in settings for a in ("--set", s)]
    proc = subprocess.run([scaletrain, "--preset", "cpu-tiny", "--headless", "--run-dir", str(run_dir), *sets],
                          capture_output=True, text=True, env=dict(env, PYTHONWARNINGS="ignore"),
                          stdin=subprocess.DEVNULL, timeout=420)
    return RunDir(run_dir), proc


@pytest.fixture(scope="session")
def fsdp_run(tmp_path_factory) -> TrainedRun:
    """FSDP2 (torch's fully_shard, applied by the trainer) over 2 ranks, 12 steps, DCP checkpoints at 6 and 12, the
    last exported from its shards."""
    return _launched(tmp_path_factory.mktemp("fsdp-run"), "fsdp", lr=5e-3, max_steps=12, checkpoint_every=6,
                     warmup_ratio=0.1)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> TrainedRun:
    """`make demo` as a user types it, shortened: the `scaletrain` console script, `--preset cpu-tiny --headless`
    (DDP on 2 processes, the bundled demo data), 12 steps with checkpoints at 6 and 12, step 12 exported; the
    console is what it printed (stdout and stderr)."""
    run, proc = _console_script(tmp_path_factory.mktemp("demo-run") / "ddp", dict(os.environ), "strategy=ddp",
                                "train.max_steps=12", "train.checkpoint_every=6")
    return TrainedRun(run, proc.returncode, proc.stdout + proc.stderr)


@pytest.fixture(scope="session")
def options_run(tmp_path_factory) -> TrainedRun:
    """A 2-rank DDP run with the options that change what the trainer computes and writes, not how it is launched:
    `--preset cpu-tiny --data D --eval-data E --loss chunked --report-to wandb`, 12 steps evaluated every 6, no
    checkpoints, launched with launch() with no WANDB_API_KEY or WANDB_MODE in its environment (W&B offline). The
    eval test (tests/trainer/test_eval.py), the W&B tracker test (tests/trainer/test_trackers.py) and the chunked
    loss test (tests/trainer/test_train_cpu.py) each launched one such run of their own before. Without the optional
    wandb package it reports to TensorBoard instead, and the W&B test skips."""
    import importlib.util

    from scaletrain.engine.launch.launcher import launch
    from scaletrain.engine.run.layout import RunDir
    from scaletrain.tui.cli.main import main
    from test_train_cpu import deadline_tick, write_dataset

    tmp = tmp_path_factory.mktemp("options-run")
    data, held = write_dataset(tmp / "d.jsonl", n=120), write_dataset(tmp / "e.jsonl", n=30)
    tracker = "wandb" if importlib.util.find_spec("wandb") else "tensorboard"
    run = RunDir(tmp / "run")
    assert main(["--preset", "cpu-tiny", "--seq-len", "64", "--data", str(data), "--eval-data", str(held),
                 "--loss", "chunked", "--report-to", tracker, "--headless", "--dry-run", "--run-dir", str(run.path),
                 "--set", "train.max_steps=12", "--set", "train.eval_every=6", "--set",
                 "train.save_checkpoints=false"]) == 0
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE")}
    res = launch(run.path, on_tick=deadline_tick(), env=env)
    return TrainedRun(run, res.exit_code, "")


SHARED_RUNS = ("ddp_run", "zero3_run", "fsdp_run", "demo_run", "options_run")


# ---- scheduling under pytest-xdist (`make test`: -n 2 --dist loadgroup) -----------------------------------------
def _drives_a_screen(item) -> bool:
    """A test that runs a Textual app under a pilot or a snapshot: most of its wall time is the screen's own
    waits (timers, refresh intervals, a sampler's ticks), not CPU."""
    if "snap_compare" in getattr(item, "fixturenames", ()):
        return True
    return "run_test(" in _module_source(str(item.fspath))


@functools.cache
def _module_source(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError:
        return ""


def _start_order(path: str, heavy: set[str], screens: set[str]) -> int:
    """0: files that drive a screen; 1: files with multi-process or heavy tests; 2: the rest."""
    return 0 if path in screens else 1 if path in heavy else 2


@pytest.hookimpl(tryfirst=True)         # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    """Each test file is one unit of work (its module-scoped fixtures are built once), except that the tests of a
    shared trained run go together wherever they are. xdist hands a worker the next file as it runs out, in this
    order (tests/passes.py passes --no-loadscope-reorder; xdist's own order puts the files with the most tests
    first, and the 70 CPU-s profiler file then ran last, alone on one worker): the files that drive a screen first,
    then those with multi-process or heavy tests, then the short ones. In `make test` the single-process pass runs
    beside the training runs at idle priority and ends after them (tests/passes.py): a screen's waits (timers, a
    sampler's ticks) then pass while the runs hold the cores, and the pass ends on CPU-bound work, both workers
    together. Measured (`make test`, the 2-core AMD VM, 2026-12-03; docs/design/tests.md): heavy files first, the
    screens' waits then fell in the tail, 27-46 % of the cores idle there: 684 s; screens first: 655 s. Files stay
    whole and in their collection order otherwise."""
    heavy = {it.nodeid.split("::", 1)[0] for it in items
             if it.get_closest_marker("slow") or it.get_closest_marker("heavy")}
    screens = {it.nodeid.split("::", 1)[0] for it in items if _drives_a_screen(it)}
    items.sort(key=lambda it: _start_order(it.nodeid.split("::", 1)[0], heavy, screens))
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        shared = [f for f in SHARED_RUNS if f in getattr(item, "fixturenames", ())]
        item.add_marker(pytest.mark.xdist_group(shared[0] if shared else item.nodeid.split("::", 1)[0]))


# ---- the collector's work -------------------------------------------------------------------------------------
def pytest_collection_finish(session):
    """Every module the tests import is imported by now and lives as long as the process: moved out of the
    collector's sight (gc.freeze), so a full collection walks what tests create, not Textual's, rich's and
    pytest's own objects; and the five full collections pytest runs at its end (its unraisable-exception check)
    become one, which finds the same (each took ~0.8 s with torch in the process)."""
    gc.freeze()
    from _pytest.unraisableexception import gc_collect_iterations_key

    session.config.stash[gc_collect_iterations_key] = 1


def _ended_as_interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    """A SIGTERM (`pkill`, a CI job's timeout) ends the session as Ctrl-C does, so the tests' `finally` blocks and
    fixtures stop the runs they started: killed by SIGTERM's default, pytest left test_detach's detached run (100,000
    steps) training for 40 minutes beside the next session's tests."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _ended_as_interrupted)

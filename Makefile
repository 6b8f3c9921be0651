# The two commands the README promises: `make demo` and `make test`. Both build .venv first.
# `make test` runs every test, the docs site's among them (tests/test_docs.py: the command reference is current,
# `mkdocs build --strict` builds it; `make docs` alone does both). `make test-fast` is the inner loop: no
# multi-process training, no profiler ground truth.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Python caches compiled modules (__pycache__): some sandboxes set PYTHONDONTWRITEBYTECODE, and then every process
# the tests start (each CLI call, probe and rank) compiles scaletrain's sources again
unexport PYTHONDONTWRITEBYTECODE
# DeepSpeed on a CPU JIT-builds its shared-memory comm op on first use (about 80 s of g++): built once with the venv,
# into the venv, so no test pays it and another venv's build never collides with this one's
export TORCH_EXTENSIONS_DIR := $(abspath $(VENV))/torch_extensions
# pytest-xdist (the dev extra) when the venv has it. `make test` runs two passes side by side (tests/passes.py): the
# multi-process training runs (`slow`) on JOBS workers at normal priority, and the single-process tests on FAST_JOBS
# workers (each test file one unit of work, tests/conftest.py) at idle priority, in the cycles the 2-rank runs leave
# idle. JOBS is one by default: on 2 cores a second worker beside a 2-rank training run doubles the wall time of the
# timed tests (--detach's 5 s return, pilots' waits) and they fail; `make test JOBS=2` on a larger machine.
# FAST_JOBS=1 JOBS=1: one process each. Deferred (=): evaluated after the venv is built.
JOBS   ?= 1
FAST_JOBS ?= 2
DS_OP   = $(PY) -c 'from scaletrain.trainer.distributed import load_deepspeed_cpu_comm_op as f; f()'
PYTEST_ARGS ?=
# pip installs without compiling every module to bytecode: Python compiles a module the first time it is imported
# (and caches it, PYTHONDONTWRITEBYTECODE unexported above), and a run imports a fraction of what is installed
# (transformers' 400 model folders, torch's inductor). What a rank and a trace load (3529 modules) is imported once
# while the DeepSpeed op builds, so the processes the tests start together do not each compile it (a cache only: its
# failure is left to the import that needs the module to report). Measured on the 2-core VM, 2026-12-03: the four
# installs 57.8 -> 32.1 s; that first import 12.6 s, 5.2 s once compiled; `make venvs` on a fresh clone, back to
# back, 90 and 119 s before, 85, 87 and 74 s now.
PIP     = $(PY) -m pip install -q --no-compile
WARM_IMPORTS = $(PY) -c 'from scaletrain.engine.startup import TRANSFORMERS_STACK as s, import_stack; import_stack(*s, "accelerate", "peft", "scaletrain.trainer.train")'
fast_xdist = $(if $(filter 1,$(FAST_JOBS)),,$(shell $(PY) -c 'import xdist' 2>/dev/null && printf '%s' '-n $(FAST_JOBS) --dist $(1)'))
# FAST_JOBS workers share the cores: each worker's torch (and what it starts) gets cores ÷ FAST_JOBS threads. Two
# workers of two threads each on 2 cores wait on each other's OpenMP threads: tests/trainer/test_memory_saved.py
# took 61.5 s that way and 28.5 s on one thread each; the not-slow pass of `make test` 20:46 -> 10:44 (this VM)
FAST_THREADS = OMP_NUM_THREADS=$$(( $$(nproc) / $(FAST_JOBS) > 0 ? $$(nproc) / $(FAST_JOBS) : 1 ))

.PHONY: venv venvs demo test test-fast test-sweep ds-op specs-venv docs docs-images bench clean

venv: $(STAMP)

# torch is pinned here (a local CPU build on the dev machines), every other library by constraints.txt (the set the
# suite ran with: a clean clone got transformers 5.25.0 the day it came out, four model types the recorded sweep had
# not seen); pyproject keeps ranges. deepspeed's setup imports torch, so it is built without isolation against it.
$(STAMP): pyproject.toml Makefile constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel
	$(PIP) torch==2.13.0
	DS_BUILD_OPS=0 $(PIP) --no-build-isolation -c constraints.txt deepspeed
	$(PIP) -c constraints.txt -e '.[train,dev,wandb]'
	($(WARM_IMPORTS) >/dev/null 2>&1 || true) & warm=$$!; $(DS_OP); op=$$?; wait $$warm; exit $$op
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/scaletrain --preset cpu-tiny --headless

test: venvs
	$(DS_OP)
	$(PY) tests/passes.py --jobs $(JOBS) --fast-jobs $(FAST_JOBS) $(PYTEST_ARGS)

# both venvs, side by side: on a clean clone the main one (pip, then DeepSpeed's op build: about 95 s here) and the
# specs one (about 30 s of pip) need not wait for each other (measured back to back on the 2-core VM, 2026-12-03:
# one after the other 111 s and 157 s, side by side 95 s)
venvs:
	@$(MAKE) --no-print-directory -j2 $(STAMP) $(SPECS_STAMP)

# the inner loop (target: 2 minutes on 2 cores): every test but the multi-process training runs (`slow`), the
# profiler/tracing ground truth (`heavy`) and the other tests over ~2.5 CPU-seconds (`long`: pilot flows across
# screens, validators run as subprocesses); `make test` runs them all. No training and no timed wait runs here, so
# FAST_JOBS workers, one test at a time each, an idle worker taking tests from the other's queue (worksteal: the two
# ended up to 20 s apart with `load`); FAST_JOBS=1: one process
test-fast: $(STAMP)
	$(FAST_THREADS) $(PY) -m pytest -q $(call fast_xdist,worksteal) -m "not slow and not heavy and not long" $(PYTEST_ARGS)

# CI's share of the architecture sweep rotates (tests/trainer/test_architecture_sweep.py: one pair of its checks a
# day, a costly one with a cheap one); this runs every check of it, on FAST_JOBS workers
test-sweep: $(STAMP)
	SCALETRAIN_SWEEP=all $(FAST_THREADS) $(PY) -m pytest -q $(call fast_xdist,worksteal) tests/trainer/test_architecture_sweep.py $(PYTEST_ARGS)

# DeepSpeed's CPU comm op, built (or found built) the way the trainer loads it: a no-op of seconds once built
ds-op: $(STAMP)
	$(DS_OP)

# SkyPilot's own task loader for the job-spec tests (tests/engine/test_jobspecs.py): skypilot cannot be installed
# beside the train extra's transformers, so it gets a venv of its own that the tests run it in.
SPECS_VENV  := .venv-specs
SPECS_STAMP := $(SPECS_VENV)/.installed
specs-venv: $(SPECS_STAMP)

$(SPECS_STAMP):
	$(PYTHON) -m venv $(SPECS_VENV)
	$(SPECS_VENV)/bin/python -m pip install -q --no-compile 'skypilot==0.14.1'
	touch $(SPECS_STAMP)

# Offline: the reference is checked, not fetched or rewritten; the site goes to site/ (not committed).
docs: $(STAMP)
	$(PY) docs/gen_reference.py --check
	$(VENV)/bin/mkdocs build --strict --quiet

# The README's pictures are the test suite's snapshots: copy them after a snapshot update.
docs-images:
	cp 'tests/frontends/__snapshots__/test_wizard_snapshots/test_preset_plan_says_what_its_pins_cost[h200x4-fast-120x40].svg' \
	   docs/images/wizard-plan.svg
	cp 'tests/frontends/__snapshots__/test_monitor_snapshots/test_monitor_8_gpus[120x40].svg' docs/images/monitor.svg

bench: $(STAMP)
	$(PY) bench/bench_plan.py

clean:
	rm -rf $(VENV) $(SPECS_VENV) build site *.egg-info

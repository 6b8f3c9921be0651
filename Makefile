# The two commands the README promises: `make demo` and `make test`. Both build .venv first.
# `make test` builds the docs site first (`make docs`: the command reference is current, `mkdocs build --strict`).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo test docs docs-images bench clean

venv: $(STAMP)

# torch is pinned here (a local CPU build on the dev machines); pyproject keeps a range.
# deepspeed's setup imports torch, so it is built without isolation against the pinned torch.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q torch==2.13.0
	DS_BUILD_OPS=0 $(PY) -m pip install -q --no-build-isolation deepspeed
	$(PY) -m pip install -q -e '.[train,dev,wandb]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/scaletrain --preset cpu-tiny --headless

test: $(STAMP) docs
	$(PY) -m pytest -q

# Offline: the reference is checked, not fetched or rewritten; the site goes to site/ (not committed).
docs: $(STAMP)
	$(PY) docs/gen_reference.py --check
	$(VENV)/bin/mkdocs build --strict --quiet

# The README's pictures are the test suite's snapshots: copy them after a snapshot update.
docs-images:
	cp 'tests/__snapshots__/test_wizard_snapshots/test_preset_plan_says_what_its_pins_cost[h200x4-fast-120x40].svg' \
	   docs/images/wizard-plan.svg
	cp 'tests/__snapshots__/test_monitor_snapshots/test_monitor_8_gpus[120x40].svg' docs/images/monitor.svg

bench: $(STAMP)
	$(PY) bench/bench_plan.py

clean:
	rm -rf $(VENV) build site *.egg-info

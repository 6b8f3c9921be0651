# The two commands the README promises: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo test bench clean

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

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/bench_plan.py

clean:
	rm -rf $(VENV) build *.egg-info

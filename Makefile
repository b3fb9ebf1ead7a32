# Retire — one venv, two commands: `make demo` (main job) and `make test` (everything CI runs).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0

.PHONY: setup setup-vllm demo scenario test test-core lint check clean

$(VENV)/.core-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.core-installed

$(VENV)/.vllm-installed: $(VENV)/.core-installed integrations/vllm/install_cpu.sh
	bash integrations/vllm/install_cpu.sh $(VENV)
	touch $@

setup-vllm: $(VENV)/.vllm-installed

demo: setup-vllm
	$(VENV)/bin/retire demo

scenario: setup
	$(VENV)/bin/retire scenario

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --strict spec retire_core

test-core: setup lint
	$(VENV)/bin/pytest -q -m "not vllm"

test: setup-vllm lint
	$(VENV)/bin/pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Retire — one venv, two commands: `make demo` (main job) and `make test` (everything CI runs).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0

.PHONY: setup setup-vllm demo scenario test test-core lint typecheck check mutation clean

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

# mypy --strict over every package. Import names differ from folder names (pyproject's
# package-dir), which mypy cannot map, so it reads the packages through links named after them.
TYPECHECK := .typecheck
typecheck: setup-vllm
	mkdir -p $(TYPECHECK)
	ln -sfn ../spec $(TYPECHECK)/retire_spec
	ln -sfn ../retire_core $(TYPECHECK)/retire_core
	ln -sfn ../model_checks $(TYPECHECK)/retire_checks
	ln -sfn ../integrations/vllm $(TYPECHECK)/retire_vllm
	ln -sfn ../benchmarks $(TYPECHECK)/retire_bench
	ln -sfn ../retire_cli $(TYPECHECK)/retire_cli
	MYPYPATH=$(TYPECHECK) $(VENV)/bin/mypy --strict --follow-imports=silent \
		-p retire_spec -p retire_core -p retire_checks -p retire_vllm -p retire_bench -p retire_cli

test-core: setup lint
	$(VENV)/bin/pytest -q -n auto -m "not vllm"

# pytest-xdist: one worker per CPU; every vLLM test on one of them (tests/conftest.py), which is
# the run's critical path: the slowest tests are listed at the end (CI's budget is 30 minutes)
test: setup-vllm lint typecheck
	$(VENV)/bin/pytest -q -n auto --durations=25

# Mutation testing of retire_core's protocol modules (not part of `make test`): mutmut, killed by
# the core tests and then the explorer of `retire check --profile quick` (pyproject's
# [tool.mutmut]); the survivors then meet the Hypothesis lock-step machine. Resumes where a
# stopped run left off. Writes mutation-report.json. MUTATE='retire_core.txn.*' runs only the
# mutants it names (mutmut's patterns); the report then keeps docs/mutation-report.json's
# verdicts for the modules not run.
MUTATION_JOBS ?= 2
MUTATE ?=
mutation: setup
	RETIRE_MUTATION=1 $(VENV)/bin/mutmut run --max-children $(MUTATION_JOBS) $(MUTATE)
	$(PY) -m retire_checks.mutation_report --out mutation-report.json --jobs $(MUTATION_JOBS) \
		--recheck tests/test_core_hypothesis.py $(if $(MUTATE),--keep docs/mutation-report.json)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis $(TYPECHECK) mutants

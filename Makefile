# perfsweep: two commands on a fresh machine.
#   make run    set up .venv and sweep the bundled ResNet-50
#   make test   set up .venv (with the test extra) and run lint, types and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: run test setup setup-test lint typecheck pytest clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	# A real Triton server for differential tests (Linux x86_64 only; tests skip elsewhere).
	-$(BIN)/pip install --quiet --no-deps nvidia-pytriton==0.7.0
	touch $(VENV)/.installed $@

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

run: setup
	$(BIN)/perfsweep run --model resnet50 $(ARGS)

lint: setup-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup-test
	$(BIN)/mypy

pytest: setup-test
	$(BIN)/pytest $(ARGS)

test: lint typecheck pytest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

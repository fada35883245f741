# Thin wrappers; each target is a line or two.
PYTHON ?= python3
PLUGINS := $(patsubst %/pyproject.toml,%,$(wildcard plugins/*/*/pyproject.toml))

# llama-cpp-python (test extra: llama.cpp's own quantizer is the oracle of `tallow quantize`) is
# built from its sdist: CPU only, no OpenMP, no multimodal library, tools or tests, and for the
# x86-64 baseline (no FMA contraction: the scalar reference paths whose bytes the tests compare).
LLAMA_CPP_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF \
	-DGGML_F16C=OFF -DGGML_BMI2=OFF -DGGML_OPENMP=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF

.PHONY: install test test-alone serve bench lint format docs dist
install:  ## the core and every first-party plugin, editable, with the test, docs and default-model extras, at the pins of constraints.txt
	$(PYTHON) -m pip install -q 'pip>=25'  # pip 23's resolver cannot match an editable plugin that another one listed before it requires
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
	$(PYTHON) -m pip install -q -c constraints.txt -e '.[test,docs,default-model]' $(foreach p,$(PLUGINS),-e '$(p)[test]')
	$(PYTHON) -m pip install -q -c constraints.txt --no-deps autoawq==0.2.9  # test oracle of tallow-quant-int4 (one pure-torch file)
	[ -x /usr/bin/chromium ] || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)  # Debian's browser for tallow-ui-web's tests (driven by Playwright; no browser download)

# pytest workers (xdist): CI's runner has two cores; PYTEST_WORKERS=0 runs the suite in one process
PYTEST_WORKERS ?= 2

# what tests/test_plugins_alone.py runs in each plugin's own environment (its conformance suites,
# else its whole tests folder): the main run leaves these paths to it, so they run once
ALONE_PATHS := $(foreach p,$(PLUGINS),$(or $(wildcard $(p)/tests/test_conformance*.py),$(p)/tests))

test: install  ## pytest's "no tests collected" (5) counts as success; the log ends naming the slowest tests
	$(PYTHON) -m pytest -n $(PYTEST_WORKERS) --durations=40 $(foreach p,$(ALONE_PATHS),--ignore=$(p)) $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

test-alone:  ## every first-party plugin's whole test suite, each in an environment of its own with only the core and what it declares (tests/test_plugins_alone.py; `make test` runs its short form)
	PLUGINS_ALONE=full $(PYTHON) -m pytest -n $(PYTEST_WORKERS) -p no:cacheprovider --durations=20 tests/test_plugins_alone.py $(PYTEST_ARGS)

serve: install
	tallow serve

bench:
	tallow bench latency --model random:llama-3-8b --dtype bfloat16

docs: install  ## the documentation site, into site/ (strict: a stale reference fails)
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict

lint:  ## ruff (the rules of [tool.ruff], the layout of ruff format) and the layer boundaries
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m pytest -q tests/test_boundaries.py

format:  ## lay out every Python file as ruff format writes it
	$(PYTHON) -m ruff format .

DIST ?= dist
dist:  ## the wheel and sdist of the core and of every first-party plugin, into $(DIST)/
	rm -rf '$(DIST)'
	for p in . $(PLUGINS); do $(PYTHON) -m build --no-isolation --outdir '$(DIST)' "$$p" >/dev/null || exit 1; done
	rm -rf framework/*.egg-info $(foreach p,$(PLUGINS),$(p)/*.egg-info)  # setuptools' metadata, left in the sources
	$(PYTHON) -m twine check --strict '$(DIST)'/*

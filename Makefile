# The two commands a newcomer types: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: run test venv bench clean

$(STAMP): pyproject.toml
	# A venv whose creation was interrupted has python but no pip: create it again.
	test -x $(VENV)/bin/pip || $(PYTHON) -m venv --clear $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Tests also run against a real llama.cpp server, which needs the real-upstream extra.
$(TEST_STAMP): $(STAMP)
	$(VENV)/bin/pip install --quiet -e '.[dev,real-upstream]'
	touch $(TEST_STAMP)

venv: $(STAMP)

# `make run LISTEN=0.0.0.0:9090` to listen elsewhere.
LISTEN ?= 127.0.0.1:8080

run: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/llamaswap serve --config examples/config.yaml --listen $(LISTEN)

test: $(TEST_STAMP)
	$(VENV)/bin/python -m pytest

# Every benchmark in one run (about 10 minutes), its report written into BENCHMARKS.md;
# `make bench BENCH_ARGS=--quick` runs each part smaller (about 5.5 minutes).
bench: $(STAMP)
	$(VENV)/bin/python bench/suite.py --write BENCHMARKS.md $(BENCH_ARGS)

clean:
	rm -rf $(VENV) data

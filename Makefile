# The two commands a newcomer types: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: run test test-fast bytecode chaos venv bench clean

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

# The tests start the service some thousand times. Where PYTHONDONTWRITEBYTECODE is set, each start would compile
# every module of the project again (a sixth of its start-up): compiled once here, they are read from __pycache__,
# and a module changed since is compiled afresh as always.
bytecode: $(STAMP)
	$(VENV)/bin/python -m compileall -q llamaswap_site scheduling proxy fakemodel tests bench

# The slowest tests are listed at the end, so the suite's time is watched as it grows. Three pytest
# processes on two cores (TEST_PROCESSES=1 for one): many tests wait seconds on the real processes they
# start, an outage or a timer, and a third process uses what those leave of the CPU.
TEST_PROCESSES ?= 3
test: $(TEST_STAMP) bytecode
	$(VENV)/bin/python -m pytest --durations=25 -n $(TEST_PROCESSES)

# The fast lane while working: the scheduling core, the config reader, the proxy's units, the runtime with
# fake models and the architecture rules; outside CI the core's property tests search a third as hard. The
# runtime's tests over a real Redis (its outages take seconds) are left to `make test`.
REDIS_RUNTIME_TESTS := tests/runtime/test_channel_layer.py tests/runtime/test_takeover.py tests/runtime/test_transport_properties.py
FAST_TESTS := tests/core tests/config tests/keys tests/proxy tests/runtime tests/test_layers.py $(addprefix --ignore=,$(REDIS_RUNTIME_TESTS))
test-fast: $(TEST_STAMP) bytecode
	$(VENV)/bin/python -m pytest -q -n $(TEST_PROCESSES) $(FAST_TESTS)

# A long fault run of both topologies: `make chaos SECONDS=600 SEED=7` (SEED=0 draws one, printed).
SECONDS ?= 300
SEED ?= 0

chaos: $(TEST_STAMP)
	LLAMASWAP_CHAOS_SECONDS=$(SECONDS) LLAMASWAP_CHAOS_SEED=$(SEED) $(VENV)/bin/python -m pytest tests/faults/test_chaos.py -s --timeout=0

# Every benchmark in one run, its report (with how long it took) written into BENCHMARKS.md;
# `make bench BENCH_ARGS=--quick` runs each part smaller.
bench: $(STAMP)
	$(VENV)/bin/python bench/suite.py --write BENCHMARKS.md $(BENCH_ARGS)

clean:
	rm -rf $(VENV) data

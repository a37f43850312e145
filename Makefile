# `make` = lint + type check + tests, in a project venv it creates and fills on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
PYTEST := $(PY) -m pytest
# Python processes make starts keep their bytecode, pytest's rewritten test modules too
# (`bytecode` below says why); an empty value is unset to Python.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: all check lint typecheck test unit bytecode demo format bench faults chaos clean
all: check
# The type check beside the tests' parallel run (it is done long before the serial tests;
# its few lines of output may land among the tests' progress dots).
check: lint
	$(MAKE) --no-print-directory --jobs=2 typecheck test

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "agent-fleet needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	@echo "installing agent-fleet and its dependencies into $(VENV) (a minute or two on a fresh machine)"
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install --progress-bar off -e '.[dev]'
	touch $@

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP)
	$(PY) -m mypy

# The suite on TEST_PROCESSES processes (pytest-xdist): its tests mostly wait on servers,
# subprocesses and timers. Each file stays on one process (its module fixtures start once);
# then the `serial` tests, time bounds that other processes' load would break, one at a
# time in each of two lanes side by side: the `in_process` ones (their whole load runs in
# one process, at most one core; output shown when both lanes end) and the rest.
# (Not xdist's loadgroup: with pytest 9.2, xdist 3.8's groups are not applied.)
TEST_PROCESSES ?= 6
LANE_LOG := $(VENV)/serial-in-process.log
test: $(STAMP) bytecode
	$(PYTEST) -q -m "not serial" -n $(TEST_PROCESSES) --dist loadfile
	$(PYTEST) -q -m "serial and in_process" > $(LANE_LOG) 2>&1 & lane=$$!; \
	$(PYTEST) -q -m "serial and not in_process"; rest=$$?; \
	wait $$lane; own=$$?; cat $(LANE_LOG); exit $$(( rest || own ))

# The fast tier: no server (the memory store, fakeredis with Lua, in-process fakes), <= 60 s.
unit: $(STAMP) bytecode
	$(PYTEST) -q -m "not integration and not serial" -n 4
	$(PYTEST) -q -m "not integration and serial"

# Every worker, CLI and fleet process a test starts imports the checkout: compiled once
# here, not in each of them where PYTHONDONTWRITEBYTECODE is set (as on these machines).
# pytest keeps its assertion-rewritten test modules only where bytecode may be written:
# without that cache each pytest process spends ~8 s of CPU rewriting the 190 test files,
# so make clears the variable (the export above), and one collection fills the cache
# before the parallel processes start (again when a test file changed).
REWRITTEN := $(VENV)/.tests-rewritten
bytecode: $(STAMP) $(REWRITTEN)
	$(PY) -m compileall -q fleet fleetops workers tests

$(REWRITTEN): $(STAMP) $(wildcard tests/*.py tests/*/*.py)
	$(PYTEST) -q -p no:cacheprovider --collect-only > /dev/null
	touch $@

# The demo surveys docs/: the checkout itself holds .venv and fleet/, the workers' own code,
# which no workspace root may contain (docs/security.md, "Second round").
demo: $(STAMP)
	$(VENV)/bin/fleet demo --workspace docs

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench: $(STAMP)
	$(PY) bench/explore_bench.py --quick
	$(PY) bench/cli_bench.py --quick
	$(PY) bench/branch_cost_bench.py --quick

# Fault injection (docs/reliability.md): every scenario x 20 runs, ~40 min; not part of `make`.
faults: $(STAMP)
	$(PY) bench/faults.py --runs 20

# The randomised fleet (docs/reliability.md): >= 1,000 faults over every backend, three seeds
# side by side, ~70-90 min on a loaded 2-core machine. `make` runs a small seeded one
# (tests/test_chaos.py, ~30-60 s). One seed alone: bench/chaos.py (its --help).
chaos: $(STAMP)
	$(PY) bench/chaos_many.py --faults 1000 --processes 3 --per-round 2 5 --rounds-per-backend 5

clean:
	rm -rf $(VENV) .fleet .mypy_cache .ruff_cache .pytest_cache

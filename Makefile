# `make` = lint + type check + tests, in a project venv it creates and fills on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
PYTEST := $(PY) -m pytest
# Python processes make starts keep their bytecode, pytest's rewritten test modules too
# (`bytecode` below says why); an empty value is unset to Python.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: all check lint typecheck test unit durations bytecode demo format bench faults chaos clean
all: check
# The type check beside the tests (at the tests' lower CPU priority, below; its few lines of
# output may land among the tests' progress dots).
check: lint
	$(MAKE) --no-print-directory --jobs=2 typecheck test

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "agent-fleet needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP)
	nice -n 10 $(PY) -m mypy

# The suite on TEST_PROCESSES processes (pytest-xdist): its tests mostly wait on servers,
# subprocesses and timers. Each file stays on one process (its module fixtures start once).
# Beside them, one at a time, the `serial` tests: time bounds that other processes' CPU
# would break, so the rest run at a lower CPU priority (nice 10) and yield the CPU to them;
# their report is printed after the others'. tests/conftest.py says more.
TEST_PROCESSES ?= 6
# $(call beside_serial,MARKS,OPTIONS): the tests MARKS selects, the serial ones at full priority.
define beside_serial
	log=$$(mktemp); \
	$(PYTEST) -q -m "$(1) serial" > $$log 2>&1 & serial=$$!; \
	nice -n 10 $(PYTEST) -q -m "$(1) not serial" $(2); rest=$$?; \
	wait $$serial; serial=$$?; echo "the serial tests:"; cat $$log; rm -f $$log; \
	[ $$rest -eq 0 ] && [ $$serial -eq 0 ]
endef

# Files are handed out longest first (tests/durations.py); `make durations` records them.
PARALLEL := -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder
test: $(STAMP) bytecode
	$(call beside_serial,,$(PARALLEL))

durations: $(STAMP) bytecode
	report=$$(mktemp); nice -n 10 $(PYTEST) -q -m "not serial" $(PARALLEL) --junitxml=$$report; \
	$(PY) -m tests.durations $$report; rm -f $$report

# The fast tier: no server (the memory store, fakeredis with Lua, in-process fakes), <= 60 s.
unit: $(STAMP) bytecode
	$(call beside_serial,not integration and,-n 4)

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

# Fault injection (docs/reliability.md): every scenario x 20 runs, ~40 min; not part of `make`.
faults: $(STAMP)
	$(PY) bench/faults.py --runs 20

# Randomised lifecycle (docs/reliability.md): >= 500 faults at random instants, ~25 min.
chaos: $(STAMP)
	$(PY) bench/chaos.py --faults 500

clean:
	rm -rf $(VENV) .fleet .mypy_cache .ruff_cache .pytest_cache

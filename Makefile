# `make` = lint + type check + tests, in a project venv it creates and fills on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: all check lint typecheck test unit demo format bench faults chaos clean
all: check
check: lint typecheck test

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
	$(PY) -m mypy

test: $(STAMP)
	$(PY) -m pytest -q

# The fast tier: no server (the memory store, fakeredis with Lua, in-process fakes), <= 60 s:
# four processes (pytest-xdist), as its tests mostly wait on subprocesses and timers.
unit: $(STAMP)
	$(PY) -m pytest -q -m "not integration" -n 4

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

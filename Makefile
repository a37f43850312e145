PY ?= python
.PHONY: all lint typecheck test format install
all: lint typecheck test

install:
	$(PY) -m pip install -e '.[dev]'

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format:
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

typecheck:
	$(PY) -m mypy

test:
	$(PY) -m pytest -q

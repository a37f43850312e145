"""Thin tasks: every Celery task body parses ids, makes one `fleet` call, maps the outcome."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fleet.settings import forget_process_settings

TASKS = Path(__file__).resolve().parent.parent / "workers" / "tasks.py"
MAX_BODY_LINES = 8


def task_bodies() -> dict[str, int]:
    """Each `@app.task` function's body length in lines, its docstring left out."""
    tree = ast.parse(TASKS.read_text())
    bodies = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        decorators = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
        if not any(isinstance(d, ast.Attribute) and d.attr == "task" for d in decorators):
            continue
        body = node.body
        if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        bodies[node.name] = (body[-1].end_lineno or 0) - body[0].lineno + 1
    return bodies


def test_every_task_body_is_at_most_eight_lines() -> None:
    bodies = task_bodies()
    assert set(bodies) >= {"run_agent", "resume_agent", "collect", "collect_failed"}
    assert {n: lines for n, lines in bodies.items() if lines > MAX_BODY_LINES} == {}


def test_a_run_lost_with_its_worker_is_retried_after_one_lease_ttl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Read when the retry is sent, from this process's settings, not frozen at import.
    from workers.tasks import run_agent

    monkeypatch.setenv("FLEET_LEASE_TTL_MS", "7000")
    forget_process_settings()
    try:
        assert run_agent.default_retry_delay == 7.0
    finally:
        monkeypatch.undo()
        forget_process_settings()

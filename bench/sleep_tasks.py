"""Bench-only Celery tasks for the plain-chord baseline; workers load them with `-I`.

Kept out of `workers/` on purpose: production workers never register them.
"""

from __future__ import annotations

import time
from typing import Any

from celery import chord

from workers.app import QUEUE_BY_MODE, app


@app.task(name="bench.sleep")  # type: ignore[untyped-decorator]
def sleep(seconds: float) -> None:
    """Stand-in for a branch: only the model time, no fleet work."""
    if seconds > 0:
        time.sleep(seconds)


@app.task(name="bench.done")  # type: ignore[untyped-decorator]
def done(results: list[Any]) -> float:
    """No-op chord body; returns when it ran, so polling granularity doesn't count."""
    return time.time()


@app.task(name="bench.sleep_root")  # type: ignore[untyped-decorator]
def sleep_root(n: int, seconds: float, body_id: str) -> None:
    """The scripted rows' same-calls peer: the root's first call (`seconds`), then the chord
    of N branches' two calls (`2 x seconds` each), sent from the worker as the fleet's root
    sends its own; the body makes the root's second call. What a Celery user would write."""
    if seconds > 0:
        time.sleep(seconds)
    header = [sleep.si(2 * seconds).set(queue=QUEUE_BY_MODE["explore"]) for _ in range(n)]
    body = sleep_body.s(seconds).set(queue=QUEUE_BY_MODE["main"], task_id=body_id)
    chord(header, body).apply_async()


@app.task(name="bench.sleep_body")  # type: ignore[untyped-decorator]
def sleep_body(results: list[Any], seconds: float) -> float:
    """The root's second call, then when it ended (see `done`)."""
    if seconds > 0:
        time.sleep(seconds)
    return time.time()

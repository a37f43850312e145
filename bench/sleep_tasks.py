"""Bench-only Celery tasks for the plain-chord baseline; workers load them with `-I`.

Kept out of `workers/` on purpose: production workers never register them.
"""

from __future__ import annotations

import time
from typing import Any

from workers.app import app


@app.task(name="bench.sleep")  # type: ignore[untyped-decorator]
def sleep(seconds: float) -> None:
    """Stand-in for a branch: only the model time, no fleet work."""
    if seconds > 0:
        time.sleep(seconds)


@app.task(name="bench.done")  # type: ignore[untyped-decorator]
def done(results: list[Any]) -> float:
    """No-op chord body; returns when it ran, so polling granularity doesn't count."""
    return time.time()

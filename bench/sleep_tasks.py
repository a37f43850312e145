"""Bench-only Celery tasks for the plain-chord baseline; workers load them with `-I`.

Kept out of `workers/` on purpose: production workers never register them.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import chord

from fleet.storage.backends.redis.connect import Lua, connect
from workers.app import QUEUE_BY_MODE, app

DURABLE_WRITE = Lua(
    "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]);"
    " redis.call('XADD', KEYS[2], 'MAXLEN', '~', '1000', '*', 'event', ARGV[3]);"
    " redis.call('EXPIRE', KEYS[1], 600); return 1"
)
"""A store write's shape: a field of the task's hash, an event, the key's TTL."""
WRITE_BYTES = 900
"""About what a fleet branch's writes carry each (messages, fields, events)."""
_store: list[redis.Redis] = []


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


@app.task(name="bench.durable_sleep")  # type: ignore[untyped-decorator]
def durable_sleep(seconds: float, key: str) -> None:
    """`bench.sleep` plus a branch's three store round trips (begin, after the first call,
    the finish): the floor under a fleet branch of Celery and the writes it must make."""
    if not _store:
        _store.append(connect(os.environ["FLEET_REDIS_URL"]))
    payload = "x" * WRITE_BYTES
    for step in range(3):
        keys = [f"bench:durable:{key}", "bench:durable:events"]
        DURABLE_WRITE(_store[0], keys, [f"m:{step}", payload, f'{{"step": {step}}}'])
        if step < 2 and seconds > 0:
            time.sleep(seconds / 2)

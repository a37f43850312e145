"""Import a module as if an optional dependency of it were not installed.

For the processes that start often (the `fleet` command, a worker: `workers.start`), where
a library imports an optional package at import time for a feature the fleet never uses.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

OTEL_METRICS_SDK = "opentelemetry.sdk.metrics"


@contextmanager
def hidden(name: str) -> Iterator[None]:
    """While the block runs, `import name` raises ImportError ("not installed").

    A module already imported stays as it is (nothing is hidden then); one imported inside
    the block is not. After the block, `name` imports as usual.
    """
    if name in sys.modules:
        yield
        return
    sys.modules[name] = None  # type: ignore[assignment]  # "not installed"
    try:
        yield
    finally:
        if sys.modules.get(name, ...) is None:
            del sys.modules[name]


def import_redis_without_metrics_sdk() -> None:
    """Import redis-py as if the OpenTelemetry metrics SDK were not installed.

    redis-py 8 imports `opentelemetry.sdk.metrics` at import time whenever it is installed
    (the `otel` extra brings it) for client metrics the fleet never enables (it does not
    call `redis.observability`): ~150 M instructions, a twentieth of `fleet run`'s start,
    ~80 ms of a worker's. The SDK is hidden only while redis-py imports; the fleet's own
    OTel imports it as usual.
    """
    if "redis" in sys.modules:
        return
    with hidden(OTEL_METRICS_SDK):
        import redis  # noqa: F401

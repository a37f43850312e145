"""Import redis-py without the OpenTelemetry metrics SDK it would load for nothing.

Called first by the processes that start often: the `fleet` command and a worker
(`workers.start`).
"""

from __future__ import annotations

import sys

OTEL_METRICS_SDK = "opentelemetry.sdk.metrics"


def import_redis_without_metrics_sdk() -> None:
    """Import redis-py as if the OpenTelemetry metrics SDK were not installed.

    redis-py 8 imports `opentelemetry.sdk.metrics` at import time whenever it is installed
    (the `otel` extra brings it) for client metrics the fleet never enables (it does not
    call `redis.observability`): ~150 M instructions, a twentieth of `fleet run`'s start,
    ~80 ms of a worker's. The SDK is hidden only while redis-py imports; the fleet's own
    OTel imports it as usual.
    """
    if "redis" in sys.modules or OTEL_METRICS_SDK in sys.modules:
        return
    sys.modules[OTEL_METRICS_SDK] = None  # type: ignore[assignment]  # "not installed"
    try:
        import redis  # noqa: F401
    finally:
        if sys.modules.get(OTEL_METRICS_SDK, ...) is None:
            del sys.modules[OTEL_METRICS_SDK]

"""The per-process runtime of a worker: Redis store, Celery dispatcher, presets, models."""

from __future__ import annotations

import threading

from fleet.observe.operator import build_hooks
from fleet.runtime import Runtime
from fleet.settings import forget_process_settings, process_settings
from fleet.storage.backends.redis.store import RedisStore
from workers.dispatch import CeleryDispatcher

_lock = threading.Lock()
_runtime: Runtime | None = None
draining = threading.Event()
"""Set when this worker is shutting down: runners hand their traces back between turns."""


def get_runtime() -> Runtime:
    """Built on first use in each worker process (after fork), then shared by its threads."""
    global _runtime
    with _lock:
        if _runtime is None:
            settings = process_settings()
            store = RedisStore.from_url(
                settings.redis_url, settings.redis_sentinel_master, cluster=settings.redis_cluster
            )
            hooks = build_hooks(settings, store)  # OTel when asked, and FLEET_HOOKS
            _runtime = Runtime.build(settings, store, CeleryDispatcher(), hooks=hooks)
        return _runtime


def reset_runtime() -> None:
    """Forget the runtime and the settings (after fork, or when tests change the environment)."""
    global _runtime
    forget_process_settings()
    with _lock:
        if _runtime is not None:
            _runtime.store.close()
        _runtime = None


def flush_hooks() -> None:
    """Send what the hooks buffered (spans) before this process exits."""
    with _lock:
        runtime = _runtime
    if runtime is not None:
        runtime.hooks.flush()

"""The one Celery app (the one allowed global) and its configuration."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from kombu.entity import Queue
from kombu.messaging import Producer

from fleet.settings import Settings

QUEUES = ("fleet.main", "fleet.delegate", "fleet.explore", "fleet.evaluate")
QUEUE_BY_MODE = {
    "main": "fleet.main",
    "delegate": "fleet.delegate",
    "explore": "fleet.explore",
    "evaluate": "fleet.evaluate",
}

MAX_RUN_S = 2 * 3600
"""The longest one task may run: the hard time limit."""
SOFT_LIMIT_S = MAX_RUN_S - 60
VISIBILITY_TIMEOUT_S = MAX_RUN_S + 1800
"""Above the hard limit, so Redis never redelivers a task that is still running."""
MAX_WORKER_LOST_RETRIES = 3
"""A task that keeps killing its worker is retried this often, then fails for good."""


def make_config(settings: Settings) -> dict[str, Any]:
    """Celery settings for a fleet on these URLs."""
    transport = {"visibility_timeout": VISIBILITY_TIMEOUT_S}
    return {
        "broker_url": settings.broker_url,
        "result_backend": settings.redis_url,
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_retry_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_time_limit": MAX_RUN_S,
        "task_soft_time_limit": SOFT_LIMIT_S,
        "task_track_started": True,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "result_expires": 24 * 3600,
        "result_extended": True,
        "task_queues": [Queue(name) for name in QUEUES],
        "task_default_queue": "fleet.main",
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
    }


class FleetCelery(Celery):  # type: ignore[misc]
    """Celery whose sends on one thread can share one producer: see `one_pipeline`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As `Celery`."""
        super().__init__(*args, **kwargs)
        self._pipelined = threading.local()

    def producer_or_acquire(self, producer: Producer | None = None) -> Any:
        """The producer given, else this thread's pipelined one, else one from the pool."""
        return super().producer_or_acquire(producer or getattr(self._pipelined, "producer", None))


@contextmanager
def one_pipeline(app: Celery) -> Iterator[None]:
    """Everything this thread sends through `app` inside the block goes out in one pipeline.

    Celery's group publishes each header message (and its task-sent event) with a round
    trip of its own; in a worker whose other threads run the first branches, each round
    trip waits for the GIL again. kombu's `Producer.batch` buffers the publishes of one
    producer (Redis: a non-transactional pipeline, flushed when the block ends, discarded
    if it raises), and `FleetCelery.producer_or_acquire` hands every send in the block that
    producer. Elsewhere (another app class, a transport without batches) sends go one by one.
    """
    if not isinstance(app, FleetCelery):
        yield
        return
    with app.producer_or_acquire() as producer, producer.batch():
        app._pipelined.producer = producer
        try:
            yield
        finally:
            del app._pipelined.producer


def create_app(settings: Settings | None = None, *, set_as_current: bool = True) -> Celery:
    """A configured app; `workers.tasks` registers the tasks on import."""
    app = FleetCelery("fleet", set_as_current=set_as_current)
    app.conf.update(make_config(settings or Settings.from_env()))
    return app


app = create_app()

app.conf.imports = ("workers.tasks", "workers.signals")

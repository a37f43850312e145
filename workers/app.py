"""The one Celery app (the one allowed global) and its configuration."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from celery.app.backends import by_url
from celery.signals import before_task_publish
from kombu.entity import Queue
from kombu.messaging import Producer

from fleet.limits.trees import Priority
from fleet.models import TASK_SCHEMA
from fleet.settings import Settings, process_settings
from fleet.storage.backends.redis import sentinel as redis_sentinel
from fleet.storage.backends.redis.connect import SENTINEL_TIMEOUT_S
from fleet.storage.backends.redis.urls import is_sentinel, parse_sentinel
from workers import patches
from workers.patches import events, result_backend
from workers.patches.header_messages import constant_headers

QUEUES = ("fleet.main", "fleet.delegate", "fleet.explore", "fleet.evaluate")
QUEUE_BY_MODE = {
    "main": "fleet.main",
    "delegate": "fleet.delegate",
    "explore": "fleet.explore",
    "evaluate": "fleet.evaluate",
    # A remote child holds a slot only to send its message (`fleet.remote`): delegate's queue.
    "remote": "fleet.delegate",
}

MAX_RUN_S = 2 * 3600
"""The longest one task may run: the hard time limit."""
SOFT_LIMIT_S = MAX_RUN_S - 60
VISIBILITY_TIMEOUT_S = MAX_RUN_S + 1800
"""Above the hard limit, so Redis never redelivers a task that is still running."""
MAX_WORKER_LOST_RETRIES = 3
"""A task that keeps killing its worker is retried this often, then fails for good."""


TIMER_PRECISION_S = 0.1
"""Celery's `worker_timer_precision`: see make_config."""

AMQP_MAX_PRIORITY = 10
"""RabbitMQ queues are declared with `x-max-priority` (a priority queue) at this size."""


def is_amqp(broker_url: str) -> bool:
    """True for a RabbitMQ (AMQP) broker URL."""
    return broker_url.split(":", 1)[0] in ("amqp", "amqps", "pyamqp")


def message_priority(priority: Priority, broker_url: str) -> int:
    """The broker priority of a tree's tasks: interactive trees are served first.

    Redis (kombu lists per priority step 0, 3, 6, 9): 0 is taken first. RabbitMQ
    (`x-max-priority`): the highest number is. Tasks sent without one (chord bodies) get
    the interactive level either way: they are short and unblock a waiting parent.
    """
    if is_amqp(broker_url):
        return AMQP_MAX_PRIORITY - 1 if priority == "interactive" else 2
    return 0 if priority == "interactive" else 6


def transport_options(url: str, sentinel_master: str | None) -> dict[str, Any]:
    """The transport options of kombu and the result backend for a Redis at `url`.

    A `sentinel://` URL gets the master's name (`master_name`: kombu's sentinel transport
    and Celery's `SentinelBackend` both read it) and short timeouts for asking a sentinel.
    """
    options: dict[str, Any] = {"visibility_timeout": VISIBILITY_TIMEOUT_S}
    if is_sentinel(url):  # the sentinels' password, from the URL's options
        asking = redis_sentinel.sentinel_kwargs(parse_sentinel(url).options, SENTINEL_TIMEOUT_S)
        options |= {"master_name": sentinel_master, "sentinel_kwargs": asking}
    return options


def celery_urls(settings: Settings) -> dict[str, Any]:
    """The broker and result backend URLs as Celery reads them, and their TLS settings.

    A `sentinel://` URL's options (`backends.redis.sentinel`) are not Celery's: the URL
    goes without them, TLS to the master as `broker_use_ssl`/`redis_backend_use_ssl`.
    """
    broker, broker_tls = redis_sentinel.for_celery(settings.broker_url)
    results, results_tls = redis_sentinel.for_celery(settings.result_backend_url)
    found: dict[str, Any] = {"broker_url": broker, "result_backend": results}
    if broker_tls is not None:
        found["broker_use_ssl"] = broker_tls
    if results_tls is not None:
        found["redis_backend_use_ssl"] = results_tls
    return found


TRACE_URL_TEMPLATE_CONF = "fleet_trace_url_template"
"""The app's own setting (not Celery's): FLEET_TRACE_URL_TEMPLATE, read where tasks are sent."""


def make_config(settings: Settings) -> dict[str, Any]:
    """Celery settings for a fleet on these URLs."""
    master = settings.redis_sentinel_master
    if is_amqp(settings.broker_url):
        priorities = {
            "task_queue_max_priority": AMQP_MAX_PRIORITY,
            "task_default_priority": AMQP_MAX_PRIORITY - 1,
        }
    else:
        priorities = {}
    return (
        priorities
        | celery_urls(settings)
        | {
            "broker_transport_options": transport_options(settings.broker_url, master),
            "result_backend_transport_options": transport_options(
                settings.result_backend_url, master
            ),
            "broker_connection_retry_on_startup": True,
            TRACE_URL_TEMPLATE_CONF: settings.trace_url_template,  # Flower's link to the page
            "task_serializer": "json",
            "result_serializer": "json",
            "accept_content": ["json"],
            "result_accept_content": ["json"],
            "task_acks_late": True,
            "task_reject_on_worker_lost": True,
            "task_retry_on_worker_lost": True,
            "worker_prefetch_multiplier": 1,
            # The worker's event loop sleeps up to this long: a slot that frees waits that long
            # to fetch the next message, and a countdown (a throttled run's booked turn) is
            # late by as much. 1.0 s (Celery's default) let a batch tree's slot turnover delay
            # an interactive tree's branches by ~0.6 s each.
            "worker_timer_precision": TIMER_PRECISION_S,
            "task_time_limit": MAX_RUN_S,
            "task_soft_time_limit": SOFT_LIMIT_S,
            # No STARTED result per task (a GET and a SETEX + PUBLISH): Flower and `celery
            # inspect active` know a task started from its task-started event.
            "task_track_started": False,
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
    )


PIPELINE_FLUSH_COMMANDS = 64
"""`one_pipeline` flushes every this many commands (a header message and its task-sent
event are two), so the first branches start while the rest of a large chord is built."""


class FleetCelery(Celery):  # type: ignore[misc]
    """Celery that sends a thread's messages in one pipeline (`one_pipeline`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As `Celery`."""
        super().__init__(*args, **kwargs)
        self._pipelined = threading.local()

    def producer_or_acquire(self, producer: Producer | None = None) -> Any:
        """The producer given, else this thread's pipelined one, else one from the pool."""
        return super().producer_or_acquire(producer or getattr(self._pipelined, "producer", None))

    def _get_backend(self) -> Any:
        # Celery's own three lines, with the fleet's classes for the Redis backends.
        backend, url = by_url(self.backend_cls or self.conf.result_backend, self.loader)
        return result_backend.fleet_class(backend)(app=self, url=url)


@contextmanager
def one_pipeline(app: Celery) -> Iterator[None]:
    """Everything this thread sends through `app` inside the block goes out in pipelines.

    Celery's group publishes each header message (and its task-sent event) with a round
    trip of its own; in a worker whose other threads run the first branches, each round
    trip waits for the GIL again. kombu's `Producer.batch` buffers the publishes of one
    producer (Redis: a non-transactional pipeline, flushed every PIPELINE_FLUSH_COMMANDS
    and when the block ends; what is not flushed yet is discarded if the block raises), and
    `FleetCelery.producer_or_acquire` hands every send in the block that producer.
    Elsewhere (another app class, a transport without batches) sends go one by one.
    """
    if not isinstance(app, FleetCelery):
        yield
        return
    with app.producer_or_acquire() as producer, producer.batch(PIPELINE_FLUSH_COMMANDS):
        app._pipelined.producer = producer
        try:
            with events.hold_sent_events(app, producer):  # task-sent events in batches too
                yield
        finally:
            del app._pipelined.producer


def create_app(settings: Settings | None = None, *, set_as_current: bool = True) -> Celery:
    """A configured app; `workers.tasks` registers the tasks on import."""
    # Every event this app sends (Flower reads them) has its text fields redacted.
    app = FleetCelery(
        "fleet", set_as_current=set_as_current, events="workers.events:RedactingEvents"
    )
    if settings is not None:
        app.conf.update(configured(settings))
    else:  # read when the configuration is first used, not when this module is imported
        app.add_defaults(lambda: configured(process_settings()))
    return app


def configured(settings: Settings) -> dict[str, Any]:
    """`make_config(settings)`, with the Celery patches the settings leave on installed.

    Where an app is configured (a worker's, before it connects; a client's): the process's
    kombu and Celery patches follow `FLEET_CELERY_PATCHES_OFF` (`workers.patches`).
    """
    patches.configure(settings.celery_patches_off)
    return make_config(settings)


SCHEMA_HEADER = "fleet_schema"
"""The task message header: the oldest schema that runs it right (`fleet.models.Record`)."""


@before_task_publish.connect
@constant_headers  # the same header on every message: header templates carry it
def _stamp_schema(headers: dict[str, Any] | None = None, **_: Any) -> None:
    # Every message this release sends, whatever sends it (a client, a chord, a sweeper):
    # a worker of an older release than the header names hands it back instead of running it.
    if headers is not None:
        headers.setdefault(SCHEMA_HEADER, TASK_SCHEMA)


app = create_app()

app.conf.imports = ("workers.tasks", "workers.signals", "workers.batch_poll")

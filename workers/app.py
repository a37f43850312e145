"""The one Celery app (the one allowed global) and its configuration."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from celery.app.backends import by_url
from celery.backends.redis import RedisBackend, SentinelBackend
from kombu.entity import Queue
from kombu.messaging import Producer

from fleet.limits.trees import Priority
from fleet.settings import Settings, process_settings
from fleet.storage.redis_connect import SENTINEL_TIMEOUT_S, Lua
from fleet.storage.redis_urls import is_sentinel
from workers.patches import chord_join, events, kombu_redis

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
    if is_sentinel(url):
        asking = {
            "socket_timeout": SENTINEL_TIMEOUT_S,
            "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        }
        options |= {"master_name": sentinel_master, "sentinel_kwargs": asking}
    return options


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
    return priorities | {
        "broker_url": settings.broker_url,
        "result_backend": settings.result_backend_url,
        "broker_transport_options": transport_options(settings.broker_url, master),
        "result_backend_transport_options": transport_options(settings.result_backend_url, master),
        "broker_connection_retry_on_startup": True,
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


PIPELINE_FLUSH_COMMANDS = 64
"""`one_pipeline` flushes every this many commands (a header message and its task-sent
event are two), so the first branches start while the rest of a large chord is built."""


class SendOnlyRedisBackend(RedisBackend):  # type: ignore[misc]
    """Celery's Redis result backend: no subscriptions while sending; the fleet's own join.

    Sending a chord registers every header result with the sender's backend (the
    `GroupResult` that `apply_chord` builds, and the group's barrier), and each
    registration subscribes the sender to that task's result channel: a round trip per
    branch, and in a worker a subscription nobody reads. Nothing that sends inside
    `one_pipeline` waits on those results (the chord body runs from the header tasks'
    own counter), so registrations made there are dropped; everywhere else (`get`, `then`)
    this is `RedisBackend`.

    A chord whose body is `fleet.children.collect` with its size in its options
    (`workers.patches.chord_join.is_fleet_join`) is joined by `workers.patches.chord_join`:
    nothing is written when it
    is sent (no `.s` size key, no saved group), each header part counted once. Every
    other chord gets Celery's join.
    """

    _fleet_group: str | None = None
    """The group of the fleet chord this thread is sending (its size key is not written)."""

    fleet_join_script = Lua(chord_join.PART_RETURN)
    """`workers.patches.chord_join.PART_RETURN`: `fleet_join_script(backend.client, keys, args)`."""

    def apply_chord(self, header_result_args: Any, body: Any, **kwargs: Any) -> None:
        """Celery's, except for a fleet chord: nothing to save, and no size key to write."""
        if chord_join.is_fleet_join(body):
            self._fleet_group = header_result_args[0]
            return
        self._fleet_group = None
        super().apply_chord(header_result_args, body, **kwargs)

    def set_chord_size(self, group_id: str, chord_size: int) -> None:
        """Celery's `.s` key, which only Celery's join reads: not for a fleet chord."""
        if group_id != self._fleet_group:
            super().set_chord_size(group_id, chord_size)

    def on_chord_part_return(self, request: Any, state: str, result: Any, **kwargs: Any) -> None:
        """A header task ended (any state, its result stored or not): count it in its chord."""
        if chord_join.is_fleet_join(request.chord):
            chord_join.part_returned(self, request, state, result)
        else:
            super().on_chord_part_return(request, state, result, **kwargs)

    def add_pending_result(
        self, result: Any, weak: bool = False, start_drainer: bool = True
    ) -> Any:
        """Register a result someone waits on; not while this thread sends in one pipeline."""
        if getattr(self.app._pipelined, "producer", None) is not None:
            return result
        return super().add_pending_result(result, weak=weak, start_drainer=start_drainer)


class SendOnlySentinelBackend(SendOnlyRedisBackend, SentinelBackend):  # type: ignore[misc]
    """`SendOnlyRedisBackend` on Celery's Sentinel backend (a `sentinel://` result backend).

    The method resolution order puts `SendOnlyRedisBackend`'s overrides first and lets
    their `super()` calls reach `SentinelBackend`, which finds the master through the
    sentinels (`result_backend_transport_options["master_name"]`).
    """


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
        # Celery's own three lines, with the send-only classes for the Redis backends.
        backend, url = by_url(self.backend_cls or self.conf.result_backend, self.loader)
        if backend is RedisBackend:
            backend = SendOnlyRedisBackend
        elif backend is SentinelBackend:
            backend = SendOnlySentinelBackend
        return backend(app=self, url=url)


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
        "fleet", set_as_current=set_as_current, events="workers.patches.events:RedactingEvents"
    )
    if settings is not None:
        app.conf.update(make_config(settings))
    else:  # read when the configuration is first used, not when this module is imported
        app.add_defaults(lambda: make_config(process_settings()))
    return app


kombu_redis.install()  # a worker must reconnect when Redis restarts, not exit
events.install()  # a cheaper repr of a run's result for its task-succeeded event
app = create_app()

app.conf.imports = ("workers.tasks", "workers.signals", "workers.batch_poll")

"""The one Celery app (the one allowed global) and its configuration."""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu.entity import Queue

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


def create_app(settings: Settings | None = None, *, set_as_current: bool = True) -> Celery:
    """A configured app; `workers.tasks` registers the tasks on import."""
    # Every event this app sends (Flower reads them) has its text fields redacted.
    app = Celery("fleet", set_as_current=set_as_current, events="workers.naming:RedactingEvents")
    app.conf.update(make_config(settings or Settings.from_env()))
    return app


app = create_app()

app.conf.imports = ("workers.tasks", "workers.signals")

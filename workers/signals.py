"""Worker lifecycle: code checks, redacted logs, fresh runtime, sweeper, heartbeat, probes."""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Any

from celery.concurrency import get_implementation, solo, thread
from celery.signals import (
    task_revoked,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from fleet.errors import ConfigError
from fleet.models import WorkerPresence
from fleet.observe.operator import operator_members
from fleet.security.redact import install_log_redaction
from fleet.security.trust import check_interpreter
from fleet.settings import process_redactor, process_settings
from fleet.storage.backends.redis.probe import is_cluster_node
from workers import loglines, probes
from workers.batch_poll import BatchWaker
from workers.remote_poll import RemotePoller
from workers.revoked import stop_revoked
from workers.runtime import draining, flush_hooks, get_runtime, reset_runtime
from workers.sweeper import Sweeper

log = logging.getLogger(__name__)
UNKILLABLE_POOLS = (thread.TaskPool, solo.TaskPool)
"""Pools whose `terminate_job` is Celery's NotImplementedError (a thread, the main one)."""
_sweeper: Sweeper | None = None
_heartbeat: probes.HeartbeatFile | None = None
_remote_poller: RemotePoller | None = None
_batch_waker: BatchWaker | None = None


@worker_init.connect
def _refuse_writable_code(**_: Any) -> None:
    # Before the worker takes a task: an interpreter or package inside a workspace root is
    # code an agent can rewrite (a `.pth` runs at every start, the grep helper's included).
    # And FLEET_HOOKS, loaded here once so that a name that does not load (or loads from a
    # workspace root) stops the worker at start, not at its first task.
    try:
        settings = process_settings()
        check_interpreter(settings.workspace_roots)
        operator_members(settings.hooks, settings.workspace_roots, settings.hook_timeout_s)
    except ConfigError as exc:
        print(f"fleet worker: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None  # not an Exception: Celery's signal dispatch lets it out


@worker_init.connect
def _say_shell_limits(**_: Any) -> None:
    # Where bash may run, the operator learns at start whether one call's fork bomb or
    # memory hog is bounded per call (a cgroup each) or, on a host without cgroups the
    # worker may make, only per user (`fleet.tools.cgroups`; `fleet doctor` says the same).
    if process_settings().allow_shell:
        from fleet.tools import cgroups

        print(f"fleet worker: bash limits {cgroups.probe().describe()}", file=sys.stderr)


@worker_init.connect
def _refuse_results_on_a_cluster(**_: Any) -> None:
    # A cluster store's results must be a single Redis apart (`backends.redis.probe`):
    # on a cluster node every explore's chord join would fail. Unreachable: not refused
    # here (Celery retries its connections as it always does).
    settings = process_settings()
    if settings.redis_cluster and is_cluster_node(settings.result_backend_url):
        print(
            "fleet worker: FLEET_RESULT_BACKEND_URL is a node of a Redis Cluster: Celery's"
            " results need a single Redis apart from the cluster",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2)


@worker_init.connect
def _no_cancel_where_the_pool_cannot(sender: Any = None, **_: Any) -> None:
    # A thread cannot be killed: after a broker connection loss Celery cancels the runs in
    # flight (worker_cancel_long_running_tasks_on_connection_loss), which on the threads
    # pool raised NotImplementedError, a traceback per run per loss (found by bench/chaos).
    # Such a run goes on under its lease; its message, redelivered, finds the lease held
    # and returns. A pool that can end a job (prefork) still has it ended.
    pool = get_implementation(getattr(sender, "pool_cls", None) or "prefork")
    if issubclass(pool, UNKILLABLE_POOLS):
        sender.app.conf.worker_cancel_long_running_tasks_on_connection_loss = False


@worker_init.connect
def _redact_logs(**_: Any) -> None:
    # Every log line of the worker (Celery's own task-failure lines and their tracebacks
    # included) has the process's secrets and credential shapes masked; pool children
    # inherit the record factory across fork.
    install_log_redaction(process_redactor())
    loglines.install()  # Celery's own outage tracebacks in one line


@worker_process_init.connect
def _after_fork(**_: Any) -> None:
    # Redis connections must not be shared across fork.
    reset_runtime()


@worker_ready.connect
def _announce(sender: Any = None, **_: Any) -> None:
    # Presence in Redis: `fleet run` learns from one read that a queue has a live consumer.
    queues = sorted(q.name for q in getattr(getattr(sender, "task_consumer", None), "queues", []))
    presence = WorkerPresence(
        node=str(getattr(sender, "hostname", "") or socket.gethostname()),
        queues=queues,
        host=socket.gethostname(),
        pid=os.getpid(),
        roots=[str(r) for r in process_settings().workspace_roots],
    )
    get_runtime().lease_keeper().announce(presence)


@worker_ready.connect
def _start_sweeper(**_: Any) -> None:
    global _sweeper
    settings = process_settings()
    _sweeper = Sweeper(
        settings.sweep_interval_s, settings.owner_check_interval_s, settings.batch_poll_s
    )
    _sweeper.start()
    global _remote_poller
    _remote_poller = RemotePoller(settings.remote_poll_s)
    _remote_poller.start()
    global _batch_waker
    _batch_waker = BatchWaker()
    _batch_waker.start()


@worker_ready.connect
def _report_ready(**_: Any) -> None:
    # `fleet probe`: liveness from a heartbeat file, readiness once the worker consumes.
    global _heartbeat
    _heartbeat = probes.HeartbeatFile(process_settings().probe_dir)
    _heartbeat.start()
    probes.mark_ready(process_settings().probe_dir)


@worker_shutting_down.connect
def _report_draining(**_: Any) -> None:
    # Not ready while draining; the heartbeat goes on, so liveness never kills a drain.
    probes.mark_ready(process_settings().probe_dir, ready=False)


@worker_shutting_down.connect
def _withdraw(**_: Any) -> None:
    # No new work comes to a draining worker: clients must not count it as a consumer.
    get_runtime().lease_keeper().withdraw()


@worker_shutting_down.connect
def _drain(**_: Any) -> None:
    # SIGTERM (scale-down, deploy): running agents stop after their current turn and are
    # re-queued, so the grace period only has to cover one model call, not a whole run.
    draining.set()


@worker_shutdown.connect
def _stop_sweeper(**_: Any) -> None:
    if _sweeper is not None:
        _sweeper.stop()
    if _remote_poller is not None:
        _remote_poller.stop()
    if _batch_waker is not None:
        _batch_waker.stop()


@worker_shutdown.connect
def _stop_heartbeat(**_: Any) -> None:
    if _heartbeat is not None:
        _heartbeat.stop()


@worker_process_shutdown.connect
@worker_shutdown.connect
def _flush_hooks(**_: Any) -> None:
    # Spans wait in a batch: send them before the process goes (a pool child may skip atexit).
    flush_hooks()


@task_revoked.connect
def _stop_revoked_run(
    sender: Any = None, request: Any = None, expired: bool = False, **_: Any
) -> None:
    # A run discarded because a stop revoked its stamps (`workers.revoked`); an expired
    # task was not stopped. A store away: the owner check looks again later, no traceback.
    if request is None or expired:
        return
    runtime = get_runtime()
    stamps = getattr(request, "stamps", None) or {}
    try:
        stop_revoked(runtime, str(getattr(sender, "name", "")), request.args or (), stamps)
    except Exception as exc:
        if not runtime.store.unavailable(exc):
            raise
        log.warning("revoked run %s: the store is unreachable (%s)", request.id, exc)

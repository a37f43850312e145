"""The fleet's Celery tasks: parse ids, make one `fleet` call, map its outcome to Celery."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import redis
from celery import Task
from celery.exceptions import Ignore
from kombu.exceptions import OperationalError

from fleet.children import after
from fleet.errors import TraceNotFound
from fleet.loop.runner import NEWER_RECORD_RETRY_S, Runner, RunResult, run_safely
from fleet.models import newer_than_this, now_ms
from fleet.runtime import Runtime
from fleet.settings import process_settings
from fleet.storage import outbox
from fleet.storage.outage import is_outage, warn_failed
from fleet.storage.writes import WriteExtension
from workers import settle
from workers.app import MAX_WORKER_LOST_RETRIES, SCHEMA_HEADER, app
from workers.dispatch import start_window
from workers.patches import chord_join
from workers.runtime import draining, get_runtime

log = logging.getLogger(__name__)


class RunTask(Task):  # type: ignore[misc]
    """A run task: retried after a lost worker once the lost runner's lease is free."""

    @property
    def default_retry_delay(self) -> float:
        """One lease TTL: a lost runner's lease lapses within it (renewed every quarter).

        Read when a retry is sent, not at import: importing the tasks reads no settings.
        """
        return process_settings().lease_ttl_ms / 1000


STORE_BLIPS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)
"""What the chord body retries: the store away for a moment."""


def envelope(result: RunResult) -> dict[str, str]:
    """What a run task returns: never an exception, so a chord body always runs."""
    return {"trace_id": result.trace_id, "outcome": result.outcome}


@app.task(
    name="fleet.run_agent",
    bind=True,
    base=RunTask,
    max_retries=MAX_WORKER_LOST_RETRIES,
)
def run_agent(
    self: Task, trace_id: str, recovered: bool = False, windowed: bool = False, **newer: Any
) -> dict[str, str]:
    """Run a trace (main agent or branch) until it finishes or waits on children.

    `busy` returns too, retry or not: a retry after a lost worker waits out the lost lease,
    so another live runner holds the trace; a sweeper recovered it, and that run settles.
    `windowed`: a child of a tree with `max_concurrent` (no chord): when it ends it starts
    the next waiting child and, if it was the last of its call, settles the call.
    """
    refuse_newer(self)
    runtime = get_runtime()
    part = counted_part(self, runtime)
    result = run_safely(Runner(runtime, should_yield=draining.is_set, end_step=part), trace_id)
    hand_back(self, result)
    after_run(runtime, result, recovered=recovered, windowed=windowed)
    return envelope(result)


def counted_part(task: Task, runtime: Runtime) -> WriteExtension | None:
    """The chord part this run counts in the write that ends it (`count_in_run`), if any."""
    settings = runtime.settings
    return chord_join.count_in_run(
        task.backend, task.request, settings.redis_url, cluster=settings.redis_cluster
    )


def after_run(runtime: Runtime, result: RunResult, *, recovered: bool, windowed: bool) -> None:
    """A windowed child starts the next one; then the settlements its run owes its parent."""
    trace_id = result.trace_id
    ended = result.outcome in ("completed", "failed", "stopped")
    if ended and (windowed or recovered):  # a sweeper's re-send does not say `windowed`
        next_in_window(runtime, trace_id)
    try:
        for by in after.owed_after_run(result.outcome, recovered=recovered, windowed=windowed):
            settle.apply(after.settle_child(runtime, trace_id, by))
    except TraceNotFound as exc:  # its parent went with a killed Cluster master's writes
        log.warning("%r's settlement was not made: %s", trace_id, exc)  # (seed 41 round 62)
    except Exception as exc:  # the run task must not raise (a failover: make chaos seed 40)
        if not is_outage(exc):
            raise
        warn_failed(log, "%r's settlement was not made (the owner check will)", trace_id)


def next_in_window(runtime: Runtime, trace_id: str) -> None:
    """Send the root's next windowed child; a broker or store away is one line, not a raise.

    The run task must not raise (its chord part would count as failed, and the settlements
    below would not be made): a child the window took but could not send stays `queued`
    without a lease, and the owner check sends it (make chaos, seed 40: a RabbitMQ restart).
    """
    try:
        start_window(runtime, runtime.store.get_trace(trace_id).root_trace_id, ended=trace_id)
    except Exception as exc:
        if not is_outage(exc):
            raise
        warn_failed(
            log, "the next child of %r's window was not sent (the owner check will)", trace_id
        )


@app.task(name="fleet.resume_agent", bind=True, max_retries=MAX_WORKER_LOST_RETRIES)
def resume_agent(self: Task, trace_id: str, **newer: Any) -> dict[str, str]:
    """Continue a trace from its persisted messages once its children were collected."""
    refuse_newer(self)
    result = run_safely(Runner(get_runtime(), should_yield=draining.is_set), trace_id)
    hand_back(self, result)
    return envelope(result)


def refuse_newer(task: Task) -> None:
    """A message only a newer release runs right goes back for one (`Ignore`), in one line.

    Its arguments beyond this release's (`**newer`) are ignored otherwise: a sender adds
    only arguments an older worker may ignore, unless it raises the header's schema.
    """
    schema = getattr(task.request, SCHEMA_HEADER, None)
    if newer_than_this(schema):
        log.warning("%s handed back: its schema %s is newer than this worker's", task.name, schema)
        requeue(task, countdown_s=NEWER_RECORD_RETRY_S)


def hand_back(task: Task, result: RunResult) -> None:
    """A drained run goes back at once; a throttled one when its limit lets it in."""
    if result.outcome == "yielded":
        requeue(task, why="drained: handed back")
    if result.outcome == "throttled":
        # The countdown lives in this worker's memory: the outbox sends the run again if
        # the worker dies (or loses its broker) before it is due.
        due_ms = now_ms() + int(result.retry_in_s * 1000) + 2 * get_runtime().settings.lease_ttl_ms
        get_runtime().store.outbox_put(outbox.run_entry(result.trace_id), due_ms)
        requeue(task, countdown_s=result.retry_in_s, why="throttled: runs again when let in")


def requeue(task: Task, countdown_s: float = 0.0, why: str = "handed back") -> NoReturn:
    """Hand a run back: the same task (id, chord membership) for any worker, maybe later.

    Not `Task.retry`: its count is what bounds restarts after a lost worker
    (`MAX_WORKER_LOST_RETRIES`), and a drain or a rate limit is not a failure. A countdown
    is held by a worker as an ETA task, which takes no pool slot until it is due.
    `Ignore` sends no event, so Flower would count the execution as processed but neither
    succeeded nor failed, and show the task STARTED until it runs again: a `task-retried`
    event says what happened (Flower's RETRY state and its workers' "retried" count).
    """
    signature = task.signature_from_request(task.request, retries=task.request.retries)
    signature.apply_async(countdown=countdown_s or None)
    try:
        task.send_event("task-retried", exception=why, traceback="")
    except (OperationalError, OSError):  # the run is handed back already; only a count lags
        log.warning("fleet: no task-retried event for %s (broker unreachable)", task.request.id)
    raise Ignore()


@app.task(
    name="fleet.collect",
    # Nobody reads the body's result: stored, it outlived its chord by `result_expires`.
    ignore_result=True,
    # A Redis blip must not fail the chord body (its errback would fail the parent); a
    # Cluster master replaced answers CLUSTERDOWN / TRYAGAIN meanwhile (make chaos, seed 42)
    autoretry_for=STORE_BLIPS,
    retry_backoff=True,
    max_retries=5,
)
def collect(results: list[dict[str, str]], parent_trace_id: str, tool_call_id: str) -> bool:
    """Chord body: settle the call from its children (the header results' trace ids).

    True when the parent was resumed (`fleet.children.after` decides).
    """
    child_ids = [r["trace_id"] for r in results]
    call = after.Call(parent_trace_id, tool_call_id)
    return settle.apply(after.settle_call(get_runtime(), call, child_ids, "chord"))


@app.task(name="fleet.collect_failed", ignore_result=True)
def collect_failed(parent_trace_id: str, tool_call_id: str, *_: Any) -> None:
    """Errback of a broken chord: settle the call from the children's own state.

    Branches never raise (their envelope carries their outcome), so a header "failed" only
    when its worker lost Redis or the broker; the children still end, and the call is
    settled once they all have (now, or by a sweeper from the outbox).
    """
    call = after.Call(parent_trace_id, tool_call_id)
    try:
        settle.apply(after.settle_from_store(get_runtime(), call, "errback"))
    except Exception as exc:  # the store or broker away: the outbox's settle entry stays
        if not chord_join.broker_away(app, exc):
            raise
        warn_failed(log, "the errback of %r's call did not settle it (a sweeper will)", call)

"""Sub-agent calls as Celery canvas: a chord of `run_agent` headers and a `collect` body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.canvas import Signature, chord

from fleet.conversation.continuation import stamp, turn_of
from fleet.limits.trees import DEFAULT_SCHEDULE, Priority, Schedule
from fleet.models import Trace
from fleet.runtime import Runtime, SpawnRequest
from workers import confirmed
from workers.app import (
    QUEUE_BY_MODE,
    TRACE_URL_TEMPLATE_CONF,
    app,
    message_priority,
    one_pipeline,
)
from workers.naming import task_names, trace_page
from workers.patches import chord_join
from workers.patches.chords import send_chord
from workers.patches.switches import enabled


def stamps(parent_trace_id: str, root_trace_id: str, turn: int = 0) -> dict[str, Any]:
    """Signature options that stamp a task with the tree (and the root's turn) it belongs to.

    A continued root's tasks carry turn-qualified values
    (`fleet.conversation.continuation.stamp`): a
    worker remembers revoked stamps until it restarts, so a stop of an earlier turn must
    not discard the next one.

    What a `StampingVisitor` would leave in each signature's options (the stamps and
    `stamped_headers`), set directly: visiting a chord deep-copies the stamps twice per
    header task, which cost a tenth of a worker's CPU in an explore of 1000.
    `revoke_by_stamped_headers` and `request.stamps` see the same headers either way.
    """
    return {
        "stamped_headers": ["parent_trace_id", "root_trace_id"],
        "parent_trace_id": stamp(parent_trace_id, turn) if parent_trace_id else "",
        "root_trace_id": stamp(root_trace_id, turn),
    }


@dataclass(frozen=True)
class Sending:
    """What every task of one send shares, read from the app's settings once."""

    sender: Celery
    page_template: str | None
    level: int
    """The broker priority (`message_priority`)."""

    @classmethod
    def of(cls, via: Celery | None, priority: Priority) -> Sending:
        """The settings of `via` (the worker's own app by default) for tasks of `priority`."""
        sender = via or app
        level = message_priority(priority, sender.conf.broker_url)
        return cls(sender, sender.conf.get(TRACE_URL_TEMPLATE_CONF), level)


def run_signature(
    trace: Trace,
    task: str = "fleet.run_agent",
    *,
    via: Celery | None = None,
    kwargs: dict[str, Any] | None = None,
    priority: Priority = "interactive",
    sending: Sending | None = None,
) -> Signature:
    """`fleet.run_agent(trace_id)` on its mode's queue, readable in Flower, stamped.

    `sending`: the app and priority level of a chord's every header, read once for all.
    """
    sending = sending or Sending.of(via, priority)
    sender = sending.sender
    argsrepr, shadow = task_names(trace)
    page = trace_page(trace.trace_id, sending.page_template)
    return Signature(
        task,
        args=(trace.trace_id,),
        kwargs=kwargs or {},
        queue=QUEUE_BY_MODE[trace.mode],
        options={
            "argsrepr": argsrepr,
            "shadow": shadow,
            **({"kwargsrepr": page} if page else {}),
            "priority": sending.level,
            # Nobody reads a run's stored result: a chord's join takes its part as it ends.
            "ignore_result": True,
            **stamps(trace.parent_trace_id or "", trace.root_trace_id, turn_of(trace)),
        },
        immutable=True,
        app=sender,
    )


def send(
    trace: Trace,
    task: str = "fleet.run_agent",
    *,
    via: Celery | None = None,
    priority: Priority = "interactive",
    **kwargs: Any,
) -> None:
    """Send one run/resume task for a trace, stamped with its parent and root ids.

    `via`: the app (broker) to send with; the worker's own app by default. A recovered run
    (a re-send that heals a tree) is confirmed by a RabbitMQ broker (`workers.confirmed`).
    """
    signature = run_signature(trace, task, via=via, kwargs=kwargs, priority=priority)
    if not kwargs.get("recovered"):
        # Outside a chord nobody reads the result: don't store it, and don't make the
        # sender subscribe to its result channel (the Redis backend does that per send).
        signature.apply_async(ignore_result=True)
        return
    with confirmed.producer(signature.app) as producer:
        signature.apply_async(
            ignore_result=True, producer=producer, confirm_timeout=confirmed.CONFIRM_TIMEOUT_S
        )


def send_answered(
    trace: Trace, *, via: Celery | None = None, priority: Priority = "interactive"
) -> None:
    """Send a trace to run on: a root, or one a person answered (reply, approval, timeout).

    A sub-agent that waited on a person is outside its chord now (its header part was
    counted when its run ended waiting, and the collect found it unfinished): like a
    recovered run, it settles its parent's call itself when it ends.
    """
    if trace.parent_trace_id:
        send(trace, via=via, priority=priority, recovered=True)
    else:
        send(trace, via=via, priority=priority)


class CeleryDispatcher:
    """Hands children to the fleet; the parent's task ends while they run."""

    children_survive_restart = True

    def dispatch(self, runtime: Runtime, request: SpawnRequest) -> None:
        """Send `chord(run_agent per child)(collect)` stamped with the tree's ids.

        Every header message and its task-sent event go out in one pipeline. A tree with
        `max_concurrent` has no chord: its children enter the tree's run window, and the
        one that ends last settles the call (`fleet.run_agent(windowed=True)`).
        """
        schedule = (
            DEFAULT_SCHEDULE  # the root says it has none: nothing to read
            if request.scheduled is False
            else tree_schedule(runtime, request.root_trace_id)
        )
        if schedule.max_concurrent:
            start_window(runtime, request.root_trace_id, new=request.children)
            return
        sending = Sending.of(app, schedule.priority)
        header = [run_signature(c, sending=sending) for c in request.children]
        turn = turn_of(request.children[0])
        tree = stamps(request.parent_trace_id, request.root_trace_id, turn)
        # No child ids in the body or errback: every header message embeds both, so a list
        # of N ids would make an explore of N branches move O(N^2) bytes. `collect` reads
        # the ids from the header results instead.
        body = Signature(
            "fleet.collect",
            args=(request.parent_trace_id, request.tool_call_id),
            queue=QUEUE_BY_MODE["main"],
            options={
                "argsrepr": f"collect {request.parent_trace_id} {request.tool_call_id}",
                **join_size(len(header)),
                **tree,
            },
        )
        body.link_error(
            Signature(
                "fleet.collect_failed",
                args=(request.parent_trace_id, request.tool_call_id),
                queue=QUEUE_BY_MODE["main"],
                immutable=True,
                options=dict(tree),
            )
        )
        with one_pipeline(app):  # and no result subscriptions: see `result_backend`
            if enabled("chord-send"):
                send_chord(app, header, body)
            else:
                chord(header, body).apply_async()


def join_size(size: int) -> dict[str, int]:
    """The body's option that gives the chord the fleet's join (`workers.patches.chord_join`).

    None with `fleet-join` off: the chord then gets Celery's own join (its `.s` size key).
    """
    return {chord_join.SIZE_OPTION: size} if enabled("fleet-join") else {}


def tree_schedule(runtime: Runtime, root_trace_id: str) -> Schedule:
    """The tree's max_concurrent and priority (defaults without the Redis store)."""
    return runtime.trees.schedule(root_trace_id) if runtime.trees else DEFAULT_SCHEDULE


def trace_schedule(runtime: Runtime, trace: Trace) -> Schedule:
    """`tree_schedule` of `trace`'s tree, not read for a root that says it has none."""
    if trace.trace_id == trace.root_trace_id and trace.run.scheduled is False:
        return DEFAULT_SCHEDULE
    return tree_schedule(runtime, trace.root_trace_id)


def start_window(
    runtime: Runtime, root_trace_id: str, *, ended: str = "", new: tuple[Trace, ...] = ()
) -> None:
    """Free `ended`'s run slot, queue `new` children, send every child whose turn it is."""
    schedule = tree_schedule(runtime, root_trace_id)
    if runtime.trees is None or not schedule.max_concurrent:
        return
    ids = tuple(c.trace_id for c in new)
    known = {c.trace_id: c for c in new}
    started = runtime.trees.window(root_trace_id, schedule.max_concurrent, ended=ended, new=ids)
    for child_id in started:
        child = known.get(child_id) or runtime.store.get_trace(child_id)
        send(child, priority=schedule.priority, windowed=True)

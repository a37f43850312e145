"""Sub-agent calls as Celery canvas: a chord of `run_agent` headers and a `collect` body."""

from __future__ import annotations

from typing import Any

from celery import Celery, chord
from celery.canvas import Signature, StampingVisitor

from fleet.conversation import stamp, turn_of
from fleet.models import Trace
from fleet.runtime import Runtime
from fleet.subagents import SpawnRequest
from workers.app import QUEUE_BY_MODE, app
from workers.naming import shadow_name, task_repr


class TraceStamp(StampingVisitor):  # type: ignore[misc]
    """Stamps every task of a canvas with the tree it belongs to."""

    def __init__(self, parent_trace_id: str, root_trace_id: str) -> None:
        """Remember the ids to stamp."""
        self.headers = {"parent_trace_id": parent_trace_id, "root_trace_id": root_trace_id}

    def on_signature(self, sig: Signature, **headers: Any) -> dict[str, Any]:
        """Every signature, header and body, gets the same stamps."""
        return dict(self.headers)


def run_signature(
    trace: Trace,
    task: str = "fleet.run_agent",
    *,
    via: Celery | None = None,
    kwargs: dict[str, Any] | None = None,
) -> Signature:
    """`fleet.run_agent(trace_id)` on its mode's queue, readable in Flower."""
    return Signature(
        task,
        args=(trace.trace_id,),
        kwargs=kwargs or {},
        queue=QUEUE_BY_MODE[trace.mode],
        options={"argsrepr": task_repr(trace), "shadow": shadow_name(trace)},
        immutable=True,
        app=via or app,
    )


def send(
    trace: Trace, task: str = "fleet.run_agent", *, via: Celery | None = None, **kwargs: Any
) -> None:
    """Send one run/resume task for a trace, stamped with its parent and root ids.

    `via`: the app (broker) to send with; the worker's own app by default.
    """
    signature = run_signature(trace, task, via=via, kwargs=kwargs)
    turn = turn_of(trace)
    parent = stamp(trace.parent_trace_id, turn) if trace.parent_trace_id else ""
    signature.stamp(visitor=TraceStamp(parent, stamp(trace.root_trace_id, turn)))
    # Outside a chord nobody reads the result: don't store it, and don't make the sender
    # subscribe to its result channel (the Redis backend does that for every send).
    signature.apply_async(ignore_result=True)


class CeleryDispatcher:
    """Hands children to the fleet; the parent's task ends while they run."""

    children_survive_restart = True

    def dispatch(self, runtime: Runtime, request: SpawnRequest) -> None:
        """Send `chord(run_agent per child)(collect)` stamped with the tree's ids."""
        header = [run_signature(child) for child in request.children]
        # No child ids in the body or errback: every header message embeds both, so a list
        # of N ids would make an explore of N branches move O(N^2) bytes. `collect` reads
        # the ids from the header results instead.
        body = Signature(
            "fleet.collect",
            args=(request.parent_trace_id, request.tool_call_id),
            queue=QUEUE_BY_MODE["main"],
            options={"argsrepr": f"collect {request.parent_trace_id} {request.tool_call_id}"},
        )
        body.link_error(
            Signature(
                "fleet.collect_failed",
                args=(request.parent_trace_id, request.tool_call_id),
                queue=QUEUE_BY_MODE["main"],
                immutable=True,
            )
        )
        canvas = chord(header, body)
        turn = turn_of(request.children[0])
        parent, root = request.parent_trace_id, request.root_trace_id
        canvas.stamp(visitor=TraceStamp(stamp(parent, turn), stamp(root, turn)))
        drop_subscriptions(canvas.apply_async())


def drop_subscriptions(result: Any) -> None:
    """Unsubscribe the sender from the header results' channels.

    Celery's group barrier subscribes the sending process to every header task's result
    channel and, holding the results weakly, never unsubscribes: a long-lived worker would
    collect thousands of subscriptions. Nothing here waits on these results.
    """
    consumer = getattr(app.backend, "result_consumer", None)
    header = getattr(result, "parent", None)
    if consumer is None or header is None:
        return
    for item in header.results:
        consumer.cancel_for(item.id)

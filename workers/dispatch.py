"""Sub-agent calls as Celery canvas: a chord of `run_agent` headers and a `collect` body."""

from __future__ import annotations

from typing import Any

from celery import Celery, chord
from celery.canvas import Signature

from fleet.conversation import stamp, turn_of
from fleet.models import Trace
from fleet.runtime import Runtime, SpawnRequest
from workers.app import QUEUE_BY_MODE, app, one_pipeline
from workers.naming import shadow_name, task_repr


def stamps(parent_trace_id: str, root_trace_id: str, turn: int = 0) -> dict[str, Any]:
    """Signature options that stamp a task with the tree (and the root's turn) it belongs to.

    A continued root's tasks carry turn-qualified values (`fleet.conversation.stamp`): a
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


def run_signature(
    trace: Trace,
    task: str = "fleet.run_agent",
    *,
    via: Celery | None = None,
    kwargs: dict[str, Any] | None = None,
) -> Signature:
    """`fleet.run_agent(trace_id)` on its mode's queue, readable in Flower, stamped."""
    return Signature(
        task,
        args=(trace.trace_id,),
        kwargs=kwargs or {},
        queue=QUEUE_BY_MODE[trace.mode],
        options={
            "argsrepr": task_repr(trace),
            "shadow": shadow_name(trace),
            **stamps(trace.parent_trace_id or "", trace.root_trace_id, turn_of(trace)),
        },
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
    # Outside a chord nobody reads the result: don't store it, and don't make the sender
    # subscribe to its result channel (the Redis backend does that for every send).
    signature.apply_async(ignore_result=True)


class CeleryDispatcher:
    """Hands children to the fleet; the parent's task ends while they run."""

    children_survive_restart = True

    def dispatch(self, runtime: Runtime, request: SpawnRequest) -> None:
        """Send `chord(run_agent per child)(collect)` stamped with the tree's ids.

        Every header message and its task-sent event go out in one pipeline.
        """
        header = [run_signature(child) for child in request.children]
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
        with one_pipeline(app):  # and no result subscriptions: see SendOnlyRedisBackend
            chord(header, body).apply_async()

"""`fleet serve`'s control API: submit and run traces from anything that speaks HTTP.

    POST /api/traces                      {task | explore, preset, model, workspace, budget,
                                           max_concurrent, priority, images, memory, ...}
                                          202 {"trace_id", "status": "started", "turn": 0}
    POST /api/traces/{id}/run             {messages: [{role: user, content}], after_sequence}
                                          continue; with after_sequence a rewind; with
                                          after_sequence and no message a regenerate
    POST /api/traces/{id}/reflect         {focus?, scope?, model?}  202 {"reflection_trace_id"}
    POST /api/traces/{id}/compact         {}  200 {"status": "compacted", "summary_sequence"...}
    GET  /api/traces/running              every trace that has not ended, newest first
    GET  /api/traces/{id}/dag             the plan as a graph (`fleetops.serve.dag`)
    GET  /api/openapi.json                the OpenAPI document of every route

`POST /api/traces/{id}/stop` and the messages, events and approvals routes are the page's
(app.py, api_messages.py, api_approvals.py). Each call goes through the `Fleet` client, so
the API decides nothing the CLI does not: a body that does not fit is refused with 422
naming its field (`fleetops.serve.submission`) and nothing is written; a trace that cannot
be continued now is 409. The work runs on the workers: each POST answers once the trace is
queued, and `GET /api/traces/{id}/events` follows it.

A reflection's proposals are stored by this process once the reflection ends (a thread of
`REFLECTIONS`); if `fleet serve` stops first, the reflection trace stays readable but its
proposals are not stored (run `fleet reflect` again).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from fleet.errors import FleetError
from fleetops.serve import dag, listing, openapi
from fleetops.serve.actions import JSON_TYPE, ActionHandler
from fleetops.serve.app import ApiError
from fleetops.serve.submission import (
    Body,
    CompactBody,
    FieldError,
    ReflectBody,
    RunBody,
    Submission,
    SubmitBody,
    checked,
    parsed,
)

if TYPE_CHECKING:
    from fleet.client import Fleet, Handle

log = logging.getLogger(__name__)
B = TypeVar("B", bound=Body)
REFLECTIONS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="serve-reflect")
"""Threads that wait for reflections to end and store their proposals."""
REFLECTION_TIMEOUT_S = 3600.0


class ControlHandler(ActionHandler):
    """A handler whose POST body is one of `submission`'s models."""

    def body_of(self, kind: type[B]) -> B:
        """The JSON body as `kind`: 415 for another type, 422 naming the field at fault."""
        sent = self.request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if sent != JSON_TYPE:
            raise ApiError(415, f"send the body as {JSON_TYPE}")
        try:
            return parsed(kind, bytes(self.body))
        except FieldError as exc:
            raise ApiError(422, str(exc), exc.field) from None

    def started(self, handle: Handle, **more: Any) -> None:
        """202: the trace is queued; its events tell the rest."""
        self.set_status(202)
        self.reply({"trace_id": handle.trace_id, "status": "started", "turn": handle.turn} | more)


class TracesHandler(ControlHandler):
    """`GET /api/traces` (the list, as before) and `POST /api/traces` (submit a root)."""

    async def get(self) -> None:
        query = {k: self.get_query_argument(k) for k in self.request.query_arguments}
        try:
            parsed_filter = listing.TraceFilter.parse(query)
        except listing.BadRequest as exc:
            raise ApiError(400, str(exc)) from None
        self.reply(await self.call(listing.list_traces, self.config.store, parsed_filter))

    async def post(self) -> None:
        body = self.body_of(SubmitBody)
        try:
            submission = await self.act(checked, self.fleet, body)
        except FieldError as exc:
            raise ApiError(422, str(exc), exc.field) from None
        self.started(await self.act(_submit, self.fleet, submission))


def _submit(fleet: Fleet, submission: Submission) -> Handle:
    return fleet.submit_spec(
        submission.spec,
        budget=submission.budget,
        max_concurrent=submission.max_concurrent,
        priority=submission.priority,
    )


class RunHandler(ControlHandler):
    """`POST /api/traces/{id}/run`: continue, rewind or regenerate a finished root."""

    async def post(self, raw_id: str) -> None:
        trace_id = self.trace_id(raw_id)
        body = self.body_of(RunBody)
        after = body.after_sequence
        if body.messages:
            text = body.messages[0].content
            handle = await self.act(self.fleet.continue_trace, trace_id, text, after)
            self.started(handle, run="continue" if after is None else "rewind")
        elif after is not None:
            handle = await self.act(self.fleet.regenerate, trace_id, after)
            self.started(handle, run="regenerate")
        else:
            why = "give one user message, or after_sequence alone to regenerate"
            raise ApiError(422, f"messages: {why}", "messages")


class ReflectHandler(ControlHandler):
    """`POST /api/traces/{id}/reflect {focus?}`: a read-only reflection over the tree."""

    async def post(self, raw_id: str) -> None:
        trace_id = self.trace_id(raw_id)
        body = self.body_of(ReflectBody)
        start = self.fleet.start_reflection
        handle, scope = await self.act(
            lambda: start(trace_id, model=body.model, scope=body.scope, focus=body.focus)
        )
        REFLECTIONS.submit(_keep, self.fleet, trace_id, handle, scope)
        self.set_status(202)
        self.reply(
            {
                "trace_id": trace_id,
                "status": "started",
                "reflection_trace_id": handle.trace_id,
                "scope": scope,
            }
        )


def _keep(fleet: Fleet, trace_id: str, handle: Handle, scope: str) -> None:
    """Wait for the reflection and store its proposals (unapproved unless the policy says)."""
    try:
        fleet.keep_reflection(trace_id, handle.wait(REFLECTION_TIMEOUT_S), scope)
    except (FleetError, TimeoutError) as exc:
        log.warning("reflection %s on %s kept nothing: %s", handle.trace_id, trace_id, exc)


class CompactHandler(ControlHandler):
    """`POST /api/traces/{id}/compact {}`: summarise a finished root through a side branch."""

    async def post(self, raw_id: str) -> None:
        trace_id = self.trace_id(raw_id)
        self.body_of(CompactBody)
        done = await self.act(self.fleet.compact, trace_id)
        self.reply({"trace_id": trace_id, "status": "compacted", **done.__dict__})


class DagHandler(ControlHandler):
    """`GET /api/traces/{id}/dag`: goals with their messages and sub-agents, the branches."""

    async def get(self, raw_id: str) -> None:
        trace_id = self.trace_id(raw_id)
        self.reply(await self.call(dag.trace_dag, self.config.store, trace_id))


class RunningHandler(ControlHandler):
    """`GET /api/traces/running`: every trace not ended (queued, running, waiting)."""

    async def get(self) -> None:
        if self.request.query_arguments:
            raise ApiError(400, "GET /api/traces/running takes no query arguments")
        self.reply({"traces": await self.call(running, self.fleet)})


def running(fleet: Fleet) -> list[dict[str, Any]]:
    """The newest `listing.SCAN_TRACES` traces that have not ended, as the list shows them."""
    recent = fleet.store.list_traces(listing.SCAN_TRACES)
    return [listing.summary(t) for t in recent if not t.is_terminal]


class OpenApiHandler(ControlHandler):
    """`GET /api/openapi.json`: the document (behind the token like every API route)."""

    def get(self) -> None:
        self.reply(openapi.document())


def routes(fleet: Fleet, base: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    """The control endpoints, for `ServeConfig.routes` (before app.py's: `running` is no id)."""
    kwargs = {**base, "fleet": fleet}
    return [
        (r"/api/openapi.json", OpenApiHandler, kwargs),
        (r"/api/traces", TracesHandler, kwargs),
        (r"/api/traces/running", RunningHandler, kwargs),
        (r"/api/traces/([^/]+)/run", RunHandler, kwargs),
        (r"/api/traces/([^/]+)/reflect", ReflectHandler, kwargs),
        (r"/api/traces/([^/]+)/compact", CompactHandler, kwargs),
        (r"/api/traces/([^/]+)/dag", DagHandler, kwargs),
    ]

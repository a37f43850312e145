"""`fleet serve`'s approval endpoints: what `fleet approve` and `fleet deny` do, as JSON.

    GET  /api/approvals[?limit=N]                         {"approvals": [...]}
    POST /api/traces/{id}/approve  {approval_id, digest}          {"approved": id, ...}
    POST /api/traces/{id}/deny     {approval_id, digest, reason}  {"denied": id, ...}

Each answer goes through `Fleet.approve` / `Fleet.deny` (`fleet.conversation.approval`), so
the API decides nothing the CLI does not: exactly one answer lands per wait; a second one,
a trace with nothing pending, or an `approval_id` that is not the call the trace waits on
(a forged id, another tree's) is refused with 409 and nothing runs. The API requires the
`approval_id` and the `digest` of the call as it was shown (`shown`, see
`fleet.conversation.shown_call`; the CLI's `--id` and `--digest` are optional): a button
answers the call it showed, never one that came after it or one cut out of sight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleet.conversation import approval
from fleet.models import Trace
from fleetops.serve.actions import ActionHandler
from fleetops.serve.app import ApiError

if TYPE_CHECKING:
    from fleet.client import Fleet

DEFAULT_LIMIT, MAX_LIMIT = 50, 500
EVERY_WAIT = 100_000
"""Waits on a person read at most (from their index): every one, in practice."""
MAX_REASON_CHARS = 2000


def waiting_approvals(fleet: Fleet, limit: int) -> list[dict[str, Any]]:
    """The traces waiting for an approval, newest first, each with the call it waits on."""
    out = []
    for trace in fleet.waiting(EVERY_WAIT):  # questions too: the approvals among them
        pending = approval.pending(trace)
        if pending is not None:
            out.append(_approval(trace, pending))
    return out[:limit]


def _approval(trace: Trace, pending: dict[str, Any]) -> dict[str, Any]:
    return {
        "trace_id": trace.trace_id,
        "root_trace_id": trace.root_trace_id,
        "mode": trace.mode,
        "approval_id": pending["tool_call_id"],
        "tool": pending["tool"],
        "arguments": pending["arguments"],  # as stored: the worker's secrets masked
        "shown": pending.get("shown", ""),  # what a person reads: acted-on arguments in full
        "digest": pending.get("digest", ""),
        "question": pending.get("question", ""),
        "updated_at_ms": trace.updated_at_ms,
    }


class ApprovalsHandler(ActionHandler):
    """`GET /api/approvals`: every tool call waiting for a person."""

    async def get(self) -> None:
        raw = self.get_query_argument("limit", str(DEFAULT_LIMIT))
        if set(self.request.query_arguments) - {"limit"}:
            raise ApiError(400, "the only query argument is limit")
        if not raw.isdigit() or not 0 < int(raw) <= MAX_LIMIT:
            raise ApiError(400, f"limit must be a number from 1 to {MAX_LIMIT}")
        found = await self.act(waiting_approvals, self.fleet, int(raw))
        self.reply({"approvals": found})


class ApproveHandler(ActionHandler):
    """`POST /api/traces/{id}/approve {"approval_id", "digest"}`: the call runs, the trace on."""

    async def post(self, raw_id: str) -> None:
        trace_id = self.trace_id(raw_id)
        data = self.fields(frozenset({"approval_id", "digest"}))
        approval_id, digest = self.text(data, "approval_id"), self.text(data, "digest")
        await self.act(self.fleet.approve, trace_id, approval_id, digest)
        self.reply({"approved": trace_id, "approval_id": approval_id})


class DenyHandler(ActionHandler):
    """`POST /api/traces/{id}/deny {"approval_id", "digest", "reason"}`: the model reads it."""

    async def post(self, raw_id: str) -> None:
        trace_id = self.trace_id(raw_id)
        data = self.fields(frozenset({"approval_id", "digest", "reason"}))
        approval_id, digest = self.text(data, "approval_id"), self.text(data, "digest")
        reason = self.text(data, "reason")
        assert reason is not None  # required
        if len(reason) > MAX_REASON_CHARS:
            raise ApiError(400, f"the reason is at most {MAX_REASON_CHARS} characters")
        await self.act(self.fleet.deny, trace_id, reason, approval_id, digest)
        self.reply({"denied": trace_id, "approval_id": approval_id})


def routes(fleet: Fleet, base: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    """The approval endpoints, for `ServeConfig.routes`."""
    kwargs = {**base, "fleet": fleet}
    return [
        (r"/api/approvals", ApprovalsHandler, kwargs),
        (r"/api/traces/([^/]+)/approve", ApproveHandler, kwargs),
        (r"/api/traces/([^/]+)/deny", DenyHandler, kwargs),
    ]

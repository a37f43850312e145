"""What a person may do to a trace from the page: stop, reply, continue (no HTTP here).

Approve and deny are `api_approvals`' endpoints. Each action is one call of the fleet client
(`fleet.client.Fleet` satisfies `Actions`): the policy (who may be answered, once) lives in
`fleet.conversation`, never here. A second answer to the same question is the
`ConversationError` those functions raise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fleetops.serve.listing import BadRequest

MAX_TEXT_CHARS = 32_000
"""The longest reply, reason or message taken (a body is capped at 64 KiB anyway)."""


class Actions(Protocol):
    """The fleet operations the page's buttons call; `Fleet` is one."""

    def stop(self, trace_id: str) -> list[str]:
        """Stop the trace and its subtree; the ids told to stop."""
        ...

    def reply(self, trace_id: str, answer: str) -> object:
        """Answer the trace's `ask_human` question."""
        ...

    def continue_trace(
        self, trace_id: str, message: str, after_sequence: int | None = None
    ) -> object:
        """Give a finished root a new user message (after `after_sequence`: a rewind)."""
        ...


@dataclass(frozen=True)
class Action:
    """One action route: the body fields it takes and what it does with them."""

    fields: dict[str, type]
    """Field name -> str or int; those in `required` must be there."""
    required: frozenset[str]
    run: Callable[[Actions, str, dict[str, Any]], dict[str, Any]]


def _stop(actions: Actions, trace_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"stopped": actions.stop(trace_id)}


def _reply(actions: Actions, trace_id: str, body: dict[str, Any]) -> dict[str, Any]:
    actions.reply(trace_id, body["answer"])
    return {"replied": trace_id}


def _continue(actions: Actions, trace_id: str, body: dict[str, Any]) -> dict[str, Any]:
    actions.continue_trace(trace_id, body["message"], body.get("after_sequence"))
    return {"continued": trace_id}


ACTIONS: dict[str, Action] = {
    "stop": Action({}, frozenset(), _stop),
    "reply": Action({"answer": str}, frozenset({"answer"}), _reply),
    "continue": Action({"message": str, "after_sequence": int}, frozenset({"message"}), _continue),
}


def parse_body(action: str, raw: bytes) -> dict[str, Any]:
    """The action's JSON object, checked field by field; `BadRequest` names what is wrong."""
    spec = ACTIONS[action]
    if not raw.strip():
        body: Any = {}
    else:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise BadRequest(f"the {action} body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the {action} body must be a JSON object")
    unknown = sorted(set(body) - set(spec.fields))
    if unknown:
        raise BadRequest(f"{action}: unknown field(s) {unknown!r}")
    missing = sorted(spec.required - set(body))
    if missing:
        raise BadRequest(f"{action}: missing field(s) {missing!r}")
    for name, value in body.items():
        _check_field(action, name, value, spec.fields[name])
    return body


def _check_field(action: str, name: str, value: Any, kind: type) -> None:
    if value is None and name not in ACTIONS[action].required:
        return
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise BadRequest(f"{action}: {name} must be a non-negative integer")
    if kind is str:
        if not isinstance(value, str):
            raise BadRequest(f"{action}: {name} must be a string")
        if len(value) > MAX_TEXT_CHARS:
            raise BadRequest(f"{action}: {name} is longer than {MAX_TEXT_CHARS} characters")

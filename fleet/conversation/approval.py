"""Tool calls that wait for a person's approval before they run.

A call that an `approve:` rule matches (its preset's, or fleet.yaml's) is not run: its
result stays missing and the trace goes `waiting` on a person (`kind: approval` under
`run.waiting_on`, a `{type: approval, tool, arguments}` collaborator), holding no
slot and no lease, as `ask_human` does; the same deadline index ends it (the fleet's
human timeout or the tree's wall_s, as a denial) and a stop ends it leaving the call
unrun. `approve` marks the call approved and queues the trace: the run that resumes it
runs the call first (`fleet.loop.resume`). `deny` writes the refusal as the call's
result. Exactly one answer lands per wait: each claims the wait's deadline entry first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleet import lifecycle
from fleet.config.approval_rules import PathForms, as_written, needs_approval, rules_of
from fleet.conversation.human import wait_for_person
from fleet.conversation.shown_call import call_digest, neutral, show_call
from fleet.errors import ConfigError, ConversationError, ToolError
from fleet.llm.base import ToolCall
from fleet.models import Message, Trace
from fleet.runtime import Runtime
from fleet.tools.base import ToolResult
from fleet.tools.workspace import lexical_parts, resolve_in_workspace

APPROVAL = "approval"
"""The `kind` of an approval wait in the trace's `run.waiting_on`; the call a person
approved is its `run.approved_call` until the next run took it to run."""


def required(runtime: Runtime, trace: Trace, call: ToolCall) -> bool:
    """Whether a call the trace may make waits for approval (preset rules, then fleet.yaml)."""
    preset = runtime.permissions(trace)
    if not preset.allows(call.name):
        return False  # refused as it is: nobody need approve a call that cannot run
    rules = (*preset.approve, *rules_of(runtime.config.approve))
    return needs_approval(rules, call.name, call.arguments, _path_forms(runtime, trace))


def _path_forms(runtime: Runtime, trace: Trace) -> PathForms:
    """A `path` as the file tools will act on it in the trace's workspace (see approval_rules).

    Each form relative to the root and absolute: folded (`a.py/.` is `a.py`), then with
    every symlink followed. A path the tools would refuse (it leaves the workspace) has
    no such form; it is matched as written, and the tool refuses it when it runs.
    """
    try:
        root = runtime.workspace_of(trace)
        base = root.resolve(strict=True)
    except (ConfigError, OSError):
        return as_written  # the run fails before any tool acts on a path

    def forms(path: str) -> tuple[str, ...]:
        found: list[str] = []
        try:
            found += _both(base, base.joinpath(*lexical_parts(root, base, path)))
            found += _both(base, resolve_in_workspace(root, path))
        except ToolError:
            pass
        return tuple(found)

    return forms


def _both(base: Path, real: Path) -> list[str]:
    """`real` relative to the workspace root (`.` for the root itself), and absolute."""
    return [real.relative_to(base).as_posix(), str(real)]


def refusal(
    call: ToolCall, trace: Trace, *, first: bool, children_wait: bool = True
) -> ToolResult | None:
    """Why this call cannot wait for approval, or None when it may.

    One person-wait per turn. A sub-agent waits alone (its siblings and parent go on or
    wait as they would) only where children outlive their spawner's run: on a task queue
    (`children_wait`); an in-process dispatcher's child is refused instead.
    """
    why = None
    if trace.mode != "main" and not children_wait:
        why = f"{call.name!r} needs a person's approval: an in-process sub-agent cannot wait"
    elif not first:
        why = "one approval or question per turn: call it again in a later turn"
    if why is None:
        return None
    return ToolResult(title=f"{call.name} refused", output=why, is_error=True)


def request(runtime: Runtime, trace: Trace, call: ToolCall) -> Trace:
    """Put the trace in `waiting` for the call's approval; its run then ends.

    The wait holds the call as a person is shown it (`shown`, see `shown_call`: the acted-on
    arguments in full, a marker for anything cut, escapes neutralised) and the `digest` of
    the call as it will run, which an approval must carry to be accepted.
    """
    masked = runtime.redactor.values_only(call.arguments)
    try:
        arguments: Any = json.loads(masked)
    except ValueError:
        arguments = masked
    # Of the call as stored (masked), which is the one a resume runs.
    digest = call_digest(trace.trace_id, call.id, call.name, masked)
    waiting = {
        "kind": APPROVAL,
        "tool_call_id": call.id,
        "tool": call.name,
        "arguments": arguments,
        "shown": show_call(call.name, masked),
        "digest": digest,
        "question": f"approve {neutral(call.name)}? (digest {digest})",
    }
    return wait_for_person(runtime, trace, waiting)


def approve(
    runtime: Runtime, trace_id: str, approval_id: str | None = None, digest: str | None = None
) -> Trace:
    """Approve the pending call: the trace is `queued`, the caller enqueues it.

    `digest`, when given, must be the digest of the waiting call as shown (`shown_call`);
    whatever is given, the call stored in the conversation, the one that will run, must
    have the digest the wait showed (a forged wait names another call).

    Raises:
        ConversationError: no approval pending, another id or digest, or answered already.
        TraceNotFound: no such trace.
    """
    trace, waiting = _claim(runtime, trace_id, approval_id, digest, check_stored=True)
    call_id = str(waiting["tool_call_id"])
    summary = f"approved {waiting['tool']}"
    return lifecycle.person_answered(runtime, trace, "completed", summary, approved_call=call_id)


def deny(
    runtime: Runtime,
    trace_id: str,
    reason: str,
    approval_id: str | None = None,
    digest: str | None = None,
) -> Trace:
    """Deny the pending call: the model reads `reason` as its result; `queued` to go on.

    Raises:
        ConversationError: as `approve`.
        TraceNotFound: no such trace.
    """
    reason = " ".join(reason.split()) or "no reason given"
    trace, waiting = _claim(runtime, trace_id, approval_id, digest)
    tool = str(waiting["tool"])
    text = f"A person denied this call; it was not run. Reason: {reason}"
    runtime.store.append_collected(
        Message(
            trace_id=trace.trace_id,
            role="tool",
            tool_call_id=str(waiting["tool_call_id"]),
            name=tool,
            content=text,
            metadata={"title": f"{tool} denied", "is_error": True, "denied": True},
        )
    )
    return lifecycle.person_answered(runtime, trace, "failed", f"denied: {reason}")


def pending(trace: Trace) -> dict[str, Any] | None:
    """The approval a trace waits for (tool_call_id, tool, arguments), else None."""
    waiting = trace.run.waiting_on
    if trace.status != "waiting" or not isinstance(waiting, dict):
        return None
    return waiting if waiting.get("kind") == APPROVAL else None


def approved(trace: Trace, tool_call_id: str) -> bool:
    """Whether a person approved this call and it has not been taken to run yet."""
    return trace.run.approved_call == tool_call_id


def _claim(
    runtime: Runtime,
    trace_id: str,
    approval_id: str | None,
    digest: str | None,
    *,
    check_stored: bool = False,
) -> tuple[Trace, dict[str, Any]]:
    """The pending approval, claimed by this answer alone (its deadline entry goes)."""
    trace = runtime.store.get_trace(trace_id)
    waiting = pending(trace)
    if waiting is None:
        status = trace.status
        raise ConversationError(f"trace {trace_id!r} has no approval pending (it is {status})")
    if approval_id is not None and approval_id != waiting["tool_call_id"]:
        raise ConversationError(
            f"approval id {approval_id!r} is not the call trace {trace_id!r} waits on"
        )
    if digest is not None and digest != waiting.get("digest"):
        raise ConversationError(
            f"digest {digest[:40]!r} is not the call trace {trace_id!r} waits on"
            " (it was not the call shown): nothing ran"
        )
    if check_stored and _stored_digest(runtime, trace_id, str(waiting["tool_call_id"])) != (
        waiting.get("digest")
    ):
        raise ConversationError(f"trace {trace_id!r}: the waiting call is not the one shown")
    # One winner between approve, deny, a second answer and the timeout sweeper.
    if not runtime.store.forget_human_wait(trace_id):
        raise ConversationError(f"trace {trace_id!r}: that approval was answered already")
    return trace, waiting


def _stored_digest(runtime: Runtime, trace_id: str, call_id: str) -> str | None:
    """The digest of call `call_id` as the conversation holds it (what a resume runs)."""
    for message in reversed(runtime.store.messages(trace_id)):
        for call in message.tool_calls or () if message.role == "assistant" else ():
            function = call.get("function") or {}
            if call.get("id") == call_id:
                name, arguments = str(function.get("name")), str(function.get("arguments"))
                return call_digest(trace_id, call_id, name, arguments)
    return None

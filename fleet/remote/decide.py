"""From a remote task's state to what the child does: one pure rule (`decide`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fleet.lifecycle.remote import RemoteCall
from fleet.remote.task import TERMINAL, RemoteError, RemoteRefused, RemoteTask

MAX_POLL_ERRORS = 3
"""Polls in a row that cannot reach the agent before the child fails (a killed agent)."""


@dataclass(frozen=True)
class Unchanged:
    """Nothing new: ask again next poll."""

    call: RemoteCall
    kind: Literal["unchanged"] = "unchanged"


@dataclass(frozen=True)
class Progress:
    """The task works and said something new: an event of the child."""

    call: RemoteCall
    text: str
    kind: Literal["progress"] = "progress"


@dataclass(frozen=True)
class AskPerson:
    """input-required: the child waits on a person, whose reply goes to the remote task."""

    call: RemoteCall
    question: str
    kind: Literal["ask"] = "ask"


@dataclass(frozen=True)
class Ended:
    """The task ended (or the fleet ends it): `call.ok` and `call.result` say how."""

    call: RemoteCall
    cancel: bool = False
    """The remote task still runs: cancel it (a timeout)."""
    kind: Literal["ended"] = "ended"


Decision = Unchanged | Progress | AskPerson | Ended


def decide(call: RemoteCall, seen: RemoteTask | RemoteError, at_ms: int) -> Decision:
    """What `seen` (the task now, or why it could not be read) means for the child."""
    name = call.agent
    if isinstance(seen, RemoteRefused):
        return _end(call, False, f"remote agent {name!r}: {seen}")
    if call.deadline_ms is not None and at_ms >= call.deadline_ms:
        return _end(call, False, f"remote agent {name!r}: no answer in time", cancel=True)
    if isinstance(seen, RemoteError):
        errors = call.errors + 1
        if errors >= MAX_POLL_ERRORS:
            return _end(call, False, f"remote agent {name!r} unreachable: {seen}")
        return Unchanged(call.model_copy(update={"errors": errors}))
    call = call.model_copy(update={"errors": 0})
    if seen.state == "completed":
        return _end(call, True, seen.artifact or seen.message or "(the remote task gave no text)")
    if seen.state in TERMINAL or seen.state == "auth-required":
        why = f": {seen.message}" if seen.message else ""
        return _end(call, False, f"remote task {seen.state}{why}"[:500])
    if seen.state == "input-required":
        question = seen.message or "(the remote agent asks for input, without a question)"
        return AskPerson(call.model_copy(update={"state": "input"}), question)
    if seen.message and seen.message != call.seen:
        return Progress(call.model_copy(update={"seen": seen.message}), seen.message)
    return Unchanged(call)


def _end(call: RemoteCall, ok: bool, text: str, *, cancel: bool = False) -> Ended:
    result = text if ok else " ".join(text.split())[:500]
    return Ended(call.model_copy(update={"state": "ended", "ok": ok, "result": result}), cancel)

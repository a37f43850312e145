"""What happens after a child settles: the one after-child policy, as a value.

Whoever settles a tool call — a chord body, a windowed child, a broken chord's errback, a
recovered run, a sweeper, the in-process dispatcher — gets a `Settlement`
(`fleet.children.settling`) and asks `decide` what it owes next:

- `Resume`: the settlement answered the parent's last open call; the parent runs on.
- `Defer`: some children still run and nobody else will settle the call when they end;
  a sweeper looks again at `due_ms` (an outbox settle entry, kept in the store).
- `Nothing`: nothing is owed here (the turn has other open calls, another collector won,
  or whoever settles the call later is already on its way).

The hosts apply the value: the Celery host (`workers.settle.apply`) sends
`fleet.resume_agent` or writes the outbox entry; the in-process host
(`fleet.inprocess.InProcessDispatcher`) lets its caller's runner go on, and is never
deferred to (it has no sweeper).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, assert_never

from fleet.children import settling
from fleet.children.settling import AlreadyCollected, Settled, Settlement, Waiting
from fleet.models import now_ms
from fleet.runtime import Runtime
from fleet.storage.gone import present

Settler = Literal["chord", "window", "errback", "recovery", "sweep", "inline"]
"""Who settled the call, which decides who else may still settle it:

- `chord`: a chord body; a branch still pending was re-sent by a sweeper, and that
  recovered run settles the call when it ends.
- `window`: a child of a tree with `max_concurrent` that ended; the window's last child to
  end settles the call.
- `errback`: a broken chord's errback; its body will never run.
- `recovery`: a recovered run that ended; the chord of its lost worker never runs its body.
- `sweep`: a sweeper's due outbox settle entry.
- `inline`: the in-process dispatcher, once every child ran to its end in this process;
  a child that has not ended (it waits on a person) is healed when the parent runs on
  (`fleet.loop.resume`), as children that do not survive a restart are.
"""

SURVIVE_WAITING: frozenset[Settler] = frozenset({"chord", "window", "inline"})
"""The settlers after whom, while children still run, someone else settles the call."""


@dataclass(frozen=True)
class Resume:
    """The parent's last open call was answered: run the parent on."""

    parent_trace_id: str
    kind: Literal["resume"] = "resume"


@dataclass(frozen=True)
class Defer:
    """Children still run and nobody else settles the call: a sweeper looks again later."""

    parent_trace_id: str
    tool_call_id: str
    due_ms: int
    """When a sweeper settles the call again (one lease TTL on: a lost runner lapses)."""
    pending: tuple[str, ...]
    """The children that had not ended (a sweeper re-sends those stranded `queued`)."""
    kind: Literal["defer"] = "defer"


@dataclass(frozen=True)
class Nothing:
    """Nothing owed after this settlement."""

    kind: Literal["nothing"] = "nothing"


AfterChild = Resume | Defer | Nothing


@dataclass(frozen=True)
class Call:
    """The parent's tool call a settlement answered (or left open)."""

    parent_trace_id: str
    tool_call_id: str


def decide(
    settlement: Settlement, call: Call, by: Settler, *, lease_ttl_ms: int, at_ms: int
) -> AfterChild:
    """What `by` owes after `settlement` of `call`; pure (`at_ms` is now)."""
    match settlement:
        case Settled(turn_complete=True):
            return Resume(settlement.parent_trace_id)
        case Settled() | AlreadyCollected():
            return Nothing()
        case Waiting() if by in SURVIVE_WAITING:
            return Nothing()
        case Waiting():
            due_ms = at_ms + lease_ttl_ms
            return Defer(call.parent_trace_id, call.tool_call_id, due_ms, settlement.pending)
        case _:
            assert_never(settlement)


def owed_after_run(outcome: str, *, recovered: bool, windowed: bool) -> tuple[Settler, ...]:
    """The settlements a run task owes its parent's call once its run returned `outcome`.

    A windowed child that ended settles as the window's; a recovered run settles, `busy`
    included (another runner holds the child: the call is deferred to a sweeper), unless
    the store was unreachable (`interrupted`: a sweeper resumes it and it settles then) or
    the child has no record (`gone`: the owner check answers for its parent).
    """
    ended = outcome in ("completed", "failed", "stopped")
    owed: tuple[Settler, ...] = ("window",) if ended and windowed else ()
    if recovered and outcome not in ("interrupted", "gone"):
        owed += ("recovery",)
    return owed


def settle_call(runtime: Runtime, call: Call, child_ids: Sequence[str], by: Settler) -> AfterChild:
    """Settle `call` from `child_ids` (`settling.settle`) and decide what is owed."""
    settlement = settling.settle(runtime, call.parent_trace_id, call.tool_call_id, child_ids)
    return _decide(runtime, settlement, call, by)


def settle_from_store(runtime: Runtime, call: Call, by: Settler) -> AfterChild:
    """`settle_call` on the children `call` spawned, as the store lists them."""
    children = settling.call_children(runtime.store, call.parent_trace_id, call.tool_call_id)
    if not children and not present(runtime.store, [call.parent_trace_id])[0]:
        return Nothing()  # the parent is gone (a failover lost it): nobody to settle
    return settle_call(runtime, call, children, by)


def settle_child(runtime: Runtime, child_id: str, by: Settler) -> AfterChild:
    """Settle the call that spawned `child_id` once every child of it ended; what is owed.

    A trace that is nobody's child owes nothing.
    """
    child = runtime.store.get_trace(child_id)
    if child.parent_trace_id is None or child.parent_tool_call_id is None:
        return Nothing()
    call = Call(child.parent_trace_id, child.parent_tool_call_id)
    return _decide(runtime, settling.settle_siblings(runtime, child), call, by)


def _decide(runtime: Runtime, settlement: Settlement, call: Call, by: Settler) -> AfterChild:
    ttl_ms = runtime.settings.lease_ttl_ms
    return decide(settlement, call, by, lease_ttl_ms=ttl_ms, at_ms=now_ms())

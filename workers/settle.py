"""The Celery host of the after-child policy: apply what `fleet.children.after` decided.

`Resume` sends `fleet.resume_agent` for the parent; `Defer` puts the call's settle entry in
the outbox (in Redis, not a countdown task a dying worker would take with it), where a
sweeper settles it once every child ended (`workers.sweeper.settle_due`).
"""

from __future__ import annotations

from typing import assert_never

from fleet.children.after import AfterChild, Defer, Nothing, Resume
from fleet.storage import outbox
from workers.dispatch import send, trace_schedule
from workers.runtime import get_runtime


def apply(action: AfterChild) -> bool:
    """Do what the policy decided; True when the parent was resumed."""
    match action:
        case Resume():
            resume(action.parent_trace_id)
            return True
        case Defer():
            entry = outbox.settle_entry(action.parent_trace_id, action.tool_call_id)
            get_runtime().store.outbox_put(entry, action.due_ms)
            return False
        case Nothing():
            return False
        case _:
            assert_never(action)


def resume(trace_id: str) -> None:
    """Enqueue `resume_agent` on the trace's queue."""
    runtime = get_runtime()
    trace = runtime.store.get_trace(trace_id)
    priority = trace_schedule(runtime, trace).priority
    send(trace, "fleet.resume_agent", priority=priority)
    runtime.store.count("resumes")

"""What Flower shows for a task: mode, trace ids and the first words, never a whole prompt."""

from __future__ import annotations

from fleet.models import Trace

TASK_WORDS = 8


def first_words(text: str, words: int = TASK_WORDS) -> str:
    """The first few words of a task, on one line."""
    parts = text.split()
    head = " ".join(parts[:words])
    return head + (" …" if len(parts) > words else "")


def task_repr(trace: Trace) -> str:
    """`argsrepr`: ids and the first words of the task."""
    parent = trace.parent_trace_id or "-"
    return (
        f"({trace.trace_id!r}) mode={trace.mode} parent={parent} task={first_words(trace.task)!r}"
    )


def shadow_name(trace: Trace) -> str:
    """The name Flower lists instead of `fleet.run_agent`."""
    return f"fleet.{trace.mode}: {first_words(trace.task, 5)}"

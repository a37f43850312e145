"""Batches of root tasks run through a bounded window, results yielded as they finish.

`run_batch` never has more than `max_in_flight` unfinished roots: it submits the next entry
only after a root it submitted has finished. It follows each root through the tree's event
stream (the finish event ends it; sub-agent events give the live sub-agent count), with a
periodic status check as a safety net. The entries, options, results and hooks are
`fleet.batch.values`' (importable from here too); parsing and validation live in
`fleet.batch.file`, the results file and its resume state in `fleet.batch.journal`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Protocol

from fleet.batch.values import (
    BATCH_KEY,
    ENTRY_KEY,
    POLL_MS,
    BatchCounts,
    BatchEntry,
    BatchHooks,
    BatchOptions,
    BatchResult,
    ChainHooks,
    ResumeState,
    entry_images,
    entry_spec,
)
from fleet.batchapi.route import in_batches, wants_batch
from fleet.conversation.human import waiting_on
from fleet.conversation.roots import create_root
from fleet.errors import TraceNotFound
from fleet.limits.capability import budget_state
from fleet.limits.trees import Priority
from fleet.models import TERMINAL, Event, Trace, now_ms
from fleet.runtime import Runtime
from fleet.storage.store import TraceStore

__all__ = [  # the values live in fleet.batch.values; callers may import them from here
    "BATCH_KEY",
    "ENTRY_KEY",
    "POLL_MS",
    "BatchClient",
    "BatchCounts",
    "BatchEntry",
    "BatchHooks",
    "BatchOptions",
    "BatchResult",
    "ChainHooks",
    "ResumeState",
    "entry_images",
    "run_batch",
]


class BatchClient(Protocol):
    """What a batch needs of a fleet client (`fleet.client.Fleet` is the one)."""

    @property
    def runtime(self) -> Runtime:
        """Presets, models and settings to validate and create roots with."""
        ...

    @property
    def store(self) -> TraceStore:
        """Where the roots and their events are read."""
        ...

    def enqueue(self, trace: Trace, priority: Priority = "interactive") -> None:
        """Start running a persisted root somewhere in the fleet (batches: `batch`)."""
        ...

    def stop(self, trace_id: str) -> list[str]:
        """Stop a root and its subtree."""
        ...


MAX_POLL_MS = 500
"""The longest blocking event read: `POLL_MS` doubled per quiet step up to this, so an idle
batch of long tasks costs Redis a few reads a second."""
STATUS_CHECK_S = 5.0
"""How often every in-flight root's status is read, in case its finish event was missed."""


def run_batch(
    fleet: BatchClient,
    entries: Iterable[BatchEntry],
    options: BatchOptions | None = None,
    *,
    on_result: Callable[[BatchResult], None] | None = None,
    resume: ResumeState | None = None,
    hooks: BatchHooks | None = None,
) -> Iterator[BatchResult]:
    """Submit `entries` through a window of `options.max_in_flight`; yield results as they end.

    Entries in `resume.done_ids` are skipped; those in `resume.attached` are followed on
    their existing root. Stopping the iteration (Ctrl-C) submits nothing more and leaves
    submitted roots running.
    """
    options = options or BatchOptions()
    resume = resume or ResumeState()
    hooks = hooks or BatchHooks()
    entries = list(entries)
    window = _Window(fleet, options, hooks, BatchCounts(total=len(entries)))
    todo: deque[BatchEntry] = deque()
    for entry in entries:
        if entry.id in resume.done_ids:
            window.counts.skipped += 1
        elif entry.id in resume.attached:
            window.attach(entry, resume.attached[entry.id])
        else:
            todo.append(entry)
    while todo or window.slots:
        while todo and len(window.slots) < options.max_in_flight:
            window.submit(todo.popleft())
        for result in window.step(pending=len(todo)):
            hooks.finished(result)
            if on_result is not None:
                on_result(result)
            yield result


@dataclass
class _Slot:
    """One unfinished root the window follows."""

    entry: BatchEntry
    trace_id: str
    since_s: float = field(default_factory=time.monotonic)
    cursor: str = "0"
    status: str = "queued"
    children: set[str] = field(default_factory=set)
    ended: bool = False
    timed_out: bool = False


class _Window:
    """The in-flight roots: submit, follow their event streams, hand back finished ones."""

    def __init__(
        self, fleet: BatchClient, options: BatchOptions, hooks: BatchHooks, counts: BatchCounts
    ) -> None:
        self.fleet = fleet
        self.store = fleet.store
        self.options = options
        self.hooks = hooks
        self.counts = counts
        self.slots: dict[str, _Slot] = {}
        self._checked_s = time.monotonic()
        self._quiet = 0
        self._batched = False
        """A root of this batch goes through provider batches: their progress is shown."""
        self._batch_counted_s = 0.0

    def submit(self, entry: BatchEntry) -> None:
        """Create the root, tell the hooks, then enqueue it."""
        self.hooks.submitting(entry)
        runtime = self.fleet.runtime
        # The line's metadata is kept as the caller's; the fleet's own marks are typed options.
        spec = entry_spec(runtime, entry, dict(entry.metadata))
        model_name = runtime.model_name(spec.model, entry.preset or "default")
        routed = wants_batch(runtime, entry.batch_api, model_name)
        self._batched = self._batched or routed
        images = entry_images(self.fleet.runtime, entry)
        spec = replace(
            spec,
            budget=entry.budget,
            priority="batch",
            images=images,
            memory=entry.memory,
            batch_api=routed,
            batch_key=self.options.batch_key,
            batch_entry=entry.id,
        )
        trace = create_root(self.fleet.runtime, spec)
        self.hooks.submitted(entry, trace.trace_id)
        self.fleet.enqueue(trace, "batch")
        self.slots[trace.trace_id] = _Slot(entry, trace.trace_id)

    def attach(self, entry: BatchEntry, trace_id: str) -> None:
        """Follow a root an earlier run submitted; re-enqueue it if no worker started it.

        A duplicate delivery is harmless: the runner's lease turns it away while the trace
        runs, and a finished trace is not run again.
        """
        slot = _Slot(entry, trace_id)
        self.slots[trace_id] = slot
        try:
            trace = self.store.get_trace(trace_id)
        except TraceNotFound:
            slot.ended = True
            return
        slot.status = trace.status
        if trace.status == "queued":
            self.fleet.enqueue(trace, "batch")
        slot.ended = trace.is_terminal

    def step(self, pending: int) -> list[BatchResult]:
        """Read what happened, stop overdue roots, return the roots that ended."""
        moved = False
        for slot in self.slots.values():
            moved = self._read(slot, None) or moved
        self._quiet = 0 if moved else self._quiet + 1
        if not moved and self.slots and not any(s.ended for s in self.slots.values()):
            oldest = min(self.slots.values(), key=lambda s: s.since_s)
            self._read(oldest, min(self.options.poll_ms << min(self._quiet - 1, 8), MAX_POLL_MS))
        self._stop_overdue()
        self._check_statuses()
        results = [self._result(s) for s in list(self.slots.values()) if s.ended]
        for result in results:
            del self.slots[result.trace_id]
            if result.status == "completed":
                self.counts.done += 1
            elif result.question is not None:
                self.counts.waiting += 1
            else:
                self.counts.failed += 1
        self._count(pending)
        self.hooks.progress(self.counts)
        return results

    def _read(self, slot: _Slot, block_ms: int | None) -> bool:
        if slot.ended:
            return False
        entries = self.store.read_events(slot.trace_id, slot.cursor, block_ms=block_ms)
        for entry_id, event in entries:
            slot.cursor = entry_id
            _apply(slot, event)
        return bool(entries)

    def _stop_overdue(self) -> None:
        timeout_s = self.options.timeout_s
        if timeout_s is None:
            return
        now_s = time.monotonic()
        for slot in self.slots.values():
            if not slot.ended and not slot.timed_out and now_s - slot.since_s > timeout_s:
                slot.timed_out = True
                self.fleet.stop(slot.trace_id)

    def _check_statuses(self) -> None:
        if time.monotonic() - self._checked_s < STATUS_CHECK_S:
            return
        self._checked_s = time.monotonic()
        for slot in self.slots.values():
            if not slot.ended:
                trace = self.store.get_trace(slot.trace_id)
                slot.ended = trace.is_terminal or waiting_on(trace) is not None

    def _result(self, slot: _Slot) -> BatchResult:
        try:
            trace = self.store.get_trace(slot.trace_id)
        except TraceNotFound:
            gone = f"trace {slot.trace_id!r} not found (expired?)"
            return BatchResult(slot.entry.id, slot.trace_id, "failed", error=gone)
        error = trace.error
        if slot.timed_out and trace.status != "completed":
            error = f"timed out after {self.options.timeout_s} s ({trace.error or trace.status})"
        return BatchResult(
            slot.entry.id,
            trace.trace_id,
            trace.status,
            answer=trace.answer,
            stats=trace.stats.model_dump(),
            error=error,
            question=(waiting_on(trace) or {}).get("question"),
            budget=state.to_json() if (state := budget_state(self.store, trace.trace_id)) else None,
        )

    def _count(self, pending: int) -> None:
        if self._batched and time.monotonic() - self._batch_counted_s >= STATUS_CHECK_S:
            self._batch_counted_s = time.monotonic()
            count, oldest_ms = in_batches(self.fleet.runtime)
            self.counts.in_batches = count
            self.counts.oldest_batch_s = (now_ms() - oldest_ms) / 1000 if oldest_ms else None
        slots = self.slots.values()
        self.counts.pending = pending
        self.counts.queued = sum(1 for s in slots if s.status == "queued")
        self.counts.running = len(self.slots) - self.counts.queued
        self.counts.sub_agents = sum(len(s.children) for s in slots)


def _apply(slot: _Slot, event: Event) -> None:
    """Fold one event of the root's tree into its slot."""
    if event.trace_id == slot.trace_id:
        if event.kind == "finish" or _asks_a_person(event):
            slot.ended = True  # a question ends the slot: the batch goes on, `fleet reply` resumes
        elif event.kind == "trace" and event.status:
            slot.status = event.status
        return
    if event.kind == "finish" or (event.status or "") in TERMINAL:
        slot.children.discard(event.trace_id)
    elif event.kind in ("collaborator", "trace") and event.status in ("queued", "running"):
        slot.children.add(event.trace_id)


def _asks_a_person(event: Event) -> bool:
    return (
        event.kind == "collaborator"
        and event.status == "waiting"
        and event.data.get("type") == "human"
    )

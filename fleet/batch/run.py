"""Batches of root tasks run through a bounded window, results yielded as they finish.

`run_batch` never has more than `max_in_flight` unfinished roots: it submits the next entry
only after a root it submitted has finished. It follows each root through the tree's event
stream (the finish event ends it; sub-agent events give the live sub-agent count), with a
periodic status check as a safety net. Parsing and validation live in `fleet.batch.file`,
the results file and its resume state in `fleet.batch.journal`.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from fleet.batch import DEFAULT_MAX_IN_FLIGHT
from fleet.batchapi.route import BATCH_API_KEY, in_batches, wants_batch
from fleet.conversation.human import waiting_on
from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import TraceNotFound
from fleet.limits.backends import budget_state
from fleet.limits.budget import Budget
from fleet.limits.trees import Priority
from fleet.models import TERMINAL, Event, Trace, now_ms
from fleet.runtime import Runtime
from fleet.storage.store import TraceStore
from fleet.tools.imagecheck import Image
from fleet.tools.imagesource import load_images


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


POLL_MS = 20
"""How long a blocking event read waits when no root moved; doubled per quiet step..."""
MAX_POLL_MS = 500
"""...up to this, so an idle batch of long tasks costs Redis a few reads a second."""
STATUS_CHECK_S = 5.0
"""How often every in-flight root's status is read, in case its finish event was missed."""
BATCH_KEY = "batch"
ENTRY_KEY = "batch_entry"
"""Metadata keys every batch root carries: the batch's key and the entry's id."""


@dataclass(frozen=True)
class BatchEntry:
    """One task of a batch, validated."""

    id: str
    task: str
    line: int
    """Where the entry starts in its file (1-based); the position for Python iterables."""
    preset: str | None = None
    model: str | None = None
    workspace: Path | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    budget: Budget | None = None
    """What this entry's whole tree may spend."""
    batch_api: bool | None = None
    """Model calls through the provider's Batch API (None: the model alias's default)."""
    images: tuple[str, ...] = ()
    """Paths inside the entry's workspace, or http(s) URLs (`fleet.tools.imagesource`)."""


def entry_images(runtime: Runtime, entry: BatchEntry) -> tuple[Image, ...]:
    """The entry's images, each path confined to the entry's workspace; `ConfigError` if not."""
    if not entry.images:
        return ()
    settings = runtime.settings.with_workspace(entry.workspace or runtime.settings.workspace)
    return load_images(
        entry.images,
        workspace=settings.workspace,
        web_allow=settings.web_allow,
        private=settings.private_dirs,
    )


@dataclass(frozen=True)
class BatchResult:
    """How one task ended: a line of the results file."""

    id: str
    trace_id: str
    status: str
    """The root's terminal status (completed, failed, stopped); `failed` if the trace is gone;
    `waiting` when it asked a person (`fleet reply` resumes it)."""
    answer: str | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    question: str | None = None
    """What the root asked a person, when it ended the batch `waiting`."""
    budget: Mapping[str, Any] | None = None
    """The tree's budget (limit, used, reserved) when it had one."""

    def to_json(self) -> dict[str, Any]:
        """The results-file object."""
        out = {
            "id": self.id,
            "trace_id": self.trace_id,
            "status": self.status,
            "answer": self.answer,
            "stats": dict(self.stats),
            "error": self.error,
        } | ({"question": self.question} if self.question is not None else {})
        if self.budget is not None:
            out["budget"] = dict(self.budget)
        return out


@dataclass(frozen=True)
class BatchOptions:
    """How a batch runs."""

    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    """Most unfinished roots at any time."""
    timeout_s: float | None = None
    """Per task, from its submission (or re-attachment): then it is stopped."""
    batch_key: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    """Stamped into each root's metadata (`batch`); the journal uses it to find orphans."""
    poll_ms: int = POLL_MS


@dataclass(frozen=True)
class ResumeState:
    """What an earlier run of the same batch left: finished ids and submitted roots."""

    done_ids: frozenset[str] = frozenset()
    attached: Mapping[str, str] = field(default_factory=dict)
    """Entry id -> trace id of roots submitted but not finished: followed, never resubmitted."""


@dataclass
class BatchCounts:
    """The progress of a batch, updated on every step of the window."""

    total: int
    done: int = 0
    """Completed."""
    failed: int = 0
    """Failed, stopped or timed out."""
    waiting: int = 0
    """Waiting on a person (`ask_human`): left for `fleet reply`, no longer followed."""
    running: int = 0
    """Roots a worker runs (or that wait on their sub-agents)."""
    queued: int = 0
    """Submitted roots no worker has started yet."""
    pending: int = 0
    """Entries not submitted yet."""
    sub_agents: int = 0
    """Live sub-agents under the in-flight roots."""
    skipped: int = 0
    """Finished in an earlier run (resume)."""
    in_batches: int = 0
    """Model calls queued for or held in provider batches, fleet-wide (`fleet.batchapi`)."""
    oldest_batch_s: float | None = None
    """How long the oldest of them has waited."""


class BatchHooks:
    """Typed no-op hooks; the results journal and the progress display override them."""

    def submitting(self, entry: BatchEntry) -> None:
        """Before the root is created: a write-ahead point."""

    def submitted(self, entry: BatchEntry, trace_id: str) -> None:
        """The root exists and is about to be enqueued."""

    def finished(self, result: BatchResult) -> None:
        """A root ended (or a re-attached one was found gone)."""

    def progress(self, counts: BatchCounts) -> None:
        """After every step of the window."""


class ChainHooks(BatchHooks):
    """Several hooks called in order."""

    def __init__(self, *hooks: BatchHooks) -> None:
        """Call each of `hooks` in turn."""
        self.hooks = hooks

    def submitting(self, entry: BatchEntry) -> None:
        """See `BatchHooks`."""
        for hook in self.hooks:
            hook.submitting(entry)

    def submitted(self, entry: BatchEntry, trace_id: str) -> None:
        """See `BatchHooks`."""
        for hook in self.hooks:
            hook.submitted(entry, trace_id)

    def finished(self, result: BatchResult) -> None:
        """See `BatchHooks`."""
        for hook in self.hooks:
            hook.finished(result)

    def progress(self, counts: BatchCounts) -> None:
        """See `BatchHooks`."""
        for hook in self.hooks:
            hook.progress(counts)


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
        metadata = {**entry.metadata, BATCH_KEY: self.options.batch_key, ENTRY_KEY: entry.id}
        runtime = self.fleet.runtime
        model_name = runtime.model_name(entry.model, entry.preset or "default")
        if wants_batch(runtime, entry.batch_api, model_name):
            metadata[BATCH_API_KEY] = self._batched = True
        spec = TaskSpec(
            entry.task, entry.model, entry.preset or "default", entry.workspace, "main", metadata
        )
        images = entry_images(self.fleet.runtime, entry)
        spec = replace(spec, budget=entry.budget, priority="batch", images=images)
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

"""MemoryStore: the in-process TraceStore for tests and inline runs (fleet.testing ships it)."""

from __future__ import annotations

import copy
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Unpack

from fleet.errors import LeaseLost, TraceExists, TraceNotFound
from fleet.models import (
    Collaborator,
    Event,
    Message,
    Trace,
    TracePatch,
    TraceStats,
    WorkerPresence,
    check_patch,
    now_ms,
)
from fleet.runstate import RunPatch
from fleet.runstate import check_patch as check_run_patch
from fleet.storage.backends.memory.workers import MemoryWorkerTables
from fleet.storage.capability import Capability, Kept, T
from fleet.storage.inbox import INBOX
from fleet.storage.keys import CounterName
from fleet.storage.one_by_one import apply_one_by_one
from fleet.storage.root_queue import queue_in_steps
from fleet.storage.store import (
    STATS_FIELDS,
    OutboxDue,
    Serving,
    StartRun,
    TraceSnapshot,
    starts,
    with_sequence,
)
from fleet.storage.writes import InboxSeen, TraceWrite, WriteResult, put_entry


class MemoryStore(MemoryWorkerTables):
    """A thread-safe in-process TraceStore for `--inline` runs and fast tests."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._traces: dict[str, dict[str, Any]] = {}
        self._stats: dict[str, dict[str, float]] = defaultdict(dict)
        self._messages: dict[str, dict[int, Message]] = defaultdict(dict)
        self._children: dict[str, list[str]] = defaultdict(list)
        self._collaborators: dict[str, dict[str, Collaborator]] = defaultdict(dict)
        self._events: dict[str, list[tuple[str, Event]]] = defaultdict(list)
        self._stops: set[str] = set()
        self._leases: dict[str, tuple[str, int]] = {}
        self._running: dict[str, int] = {}
        self._collected: set[tuple[str, str]] = set()
        self._cache: dict[str, tuple[str, int]] = {}
        self._human_waits: dict[str, int] = {}
        self._counters: dict[str, int] = defaultdict(int)
        self.fallbacks: dict[tuple[str, str], int] = defaultdict(int)
        """(from, to) model names -> how many traces moved, as `fleet metrics` shows them."""
        self._presence: dict[str, tuple[WorkerPresence, int]] = {}
        self._outbox: dict[str, int] = {}
        self._open_trees: dict[str, int] = {}
        self.images: dict[str, str] = {}
        """Image key -> base64 bytes (`fleet.storage.backends.memory.images`)."""
        self._fence: tuple[str, str] | None = None
        """(trace id, owner) in a `fenced` view: writes need that lease."""
        self._kept = Kept()

    def capability(self, kind: Capability[T]) -> T:
        """The in-memory twin of `kind`, one per store (its fenced views share it)."""
        return self._kept.get(kind, kind.in_memory)

    def close(self) -> None:
        """Nothing to close: the tables go with the store."""

    def _check_fence(self) -> None:
        """`LeaseLost` unless this view's runner holds its lease (call under the lock)."""
        if self._fence is None:
            return
        trace_id, owner = self._fence
        holder = self._leases.get(trace_id)
        if holder is None or holder[0] != owner or holder[1] <= now_ms():
            raise LeaseLost(f"the lease of {trace_id!r} is no longer held by this runner")

    def create_trace(self, trace: Trace) -> None:
        if not self.create_traces([trace])[0]:
            raise TraceExists(f"trace {trace.trace_id!r} already exists")

    def create_traces(self, traces: Sequence[Trace], outbox: OutboxDue | None = None) -> list[bool]:
        with self._lock:
            self._check_fence()
            if outbox is not None:
                self.outbox_put(*outbox)
            return [self._created(trace) for trace in traces]

    def _created(self, trace: Trace) -> bool:
        if trace.trace_id in self._traces:
            return False
        self._traces[trace.trace_id] = trace.model_dump(mode="json", exclude={"stats"})
        self._stats[trace.trace_id] = trace.stats.model_dump()
        if trace.parent_trace_id:
            self._children[trace.parent_trace_id].append(trace.trace_id)
        return True

    def get_trace(self, trace_id: str) -> Trace:
        with self._lock:
            data = self._traces.get(trace_id)
            if data is None:
                raise TraceNotFound(f"no trace {trace_id!r}")
            stats = TraceStats.model_validate(self._stats[trace_id])
            return Trace.model_validate({**data, "stats": stats})

    def get_traces(self, trace_ids: Sequence[str]) -> list[Trace]:
        with self._lock:
            return [self.get_trace(t) for t in trace_ids]

    def update_trace(self, trace_id: str, **fields: Unpack[TracePatch]) -> None:
        fields.setdefault("updated_at_ms", now_ms())
        check_patch(fields)
        patch = Trace.model_validate(
            {**self.get_trace(trace_id).model_dump(), **fields}
        ).model_dump(mode="json", include=set(fields))
        with self._lock:
            self._check_fence()
            self._traces[trace_id].update(patch)

    def update_trace_and_emit(
        self, trace_id: str, root_trace_id: str, event: Event, /, **fields: Unpack[TracePatch]
    ) -> None:
        with self._lock:
            self.update_trace(trace_id, **fields)
            self.emit(root_trace_id, event)

    def update_run(self, trace_id: str, **fields: Unpack[RunPatch]) -> None:
        patch = check_run_patch(fields)  # each field set on its own, as Redis sets `r:{name}`
        with self._lock:
            self._check_fence()
            data = self._traces.get(trace_id)
            if data is None:
                raise TraceNotFound(f"no trace {trace_id!r}")
            data["run"] = {**data["run"], **patch}

    def snapshot(self, trace_id: str) -> TraceSnapshot:
        with self._lock:
            return TraceSnapshot(
                self.get_trace(trace_id), self.messages(trace_id), self.stop_requested(trace_id)
            )

    def begin_run(
        self,
        trace_id: str,
        owner: str,
        ttl_ms: int,
        start: StartRun | None = None,
        pauses: Sequence[str] = (),
    ) -> TraceSnapshot | None:
        with self._lock:  # no provider pauses here: a gate on this store has no limiter
            data = self._traces.get(trace_id)
            if data is None:
                raise TraceNotFound(f"no trace {trace_id!r}")
            if not self.acquire_lease(trace_id, owner, ttl_ms):
                return None
            if start is not None and starts(data, start):
                data.update(status="running", updated_at_ms=now_ms())
                self.emit(start.root_trace_id, start.event)
            seen = InboxSeen(self.capability(INBOX).newest(trace_id))  # as BEGIN_RUN reads it
            return replace(self.snapshot(trace_id), inbox=seen)

    def apply(self, write: TraceWrite) -> WriteResult:
        with self._lock:
            if write.trace_id not in self._traces:
                raise TraceNotFound(f"no trace {write.trace_id!r}")
            self._check_fence()  # once for the whole write, as the Redis script does: a
            plain = copy.copy(self)  # write may release the lease before its last op
            plain._fence = None
            written = apply_one_by_one(plain, write)
            if not write.inbox:
                return written
            return replace(written, inbox=InboxSeen(self.capability(INBOX).newest(write.trace_id)))

    def track_tree(self, root_trace_id: str) -> None:
        with self._lock:
            self._open_trees[root_trace_id] = now_ms()

    def queue_root(
        self, trace: Trace, event: Event, serving: Serving | None = None, *, listed: bool = True
    ) -> None:
        queue_in_steps(self, trace, event, serving, listed)

    def list_traces(self, limit: int = 50) -> list[Trace]:
        with self._lock:
            ids = sorted(self._traces, key=lambda t: self._traces[t]["created_at_ms"])
        return [self.get_trace(t) for t in reversed(ids[-limit:])]

    def children(self, trace_id: str) -> list[str]:
        with self._lock:
            return list(self._children.get(trace_id, []))

    def append_message(self, message: Message) -> Message:
        with self._lock:
            self._check_fence()
            data = self._traces.get(message.trace_id)
            if data is None:
                raise TraceNotFound(f"no trace {message.trace_id!r}")
            sequence = data["last_sequence"] + 1
            stored = message.model_copy(
                update={"sequence": sequence, "parent_sequence": data["head_sequence"]}
            )
            self._messages[message.trace_id][sequence] = stored
            data.update(last_sequence=sequence, head_sequence=sequence)
            return stored

    def record_turn(
        self, root_trace_id: str, message: Message, event: Event, *, iteration: int | None = None
    ) -> Message:
        with self._lock:
            stored = self.append_message(message)
            if iteration is not None:
                self.add_stats(
                    message.trace_id,
                    messages=1,
                    prompt_tokens=message.prompt_tokens,
                    completion_tokens=message.completion_tokens,
                    cost_usd=message.cost_usd,
                    cached_tokens=message.cached_tokens,
                    cache_write_tokens=message.cache_write_tokens,
                )
                self.update_trace(message.trace_id, iteration=iteration)
            self.emit(root_trace_id, with_sequence(event, stored.sequence))
            return stored

    def messages(self, trace_id: str) -> list[Message]:
        with self._lock:
            stored = self._messages.get(trace_id, {})
            return [stored[s] for s in sorted(stored)]

    def set_head(self, trace_id: str, sequence: int | None) -> None:
        self.update_trace(trace_id, head_sequence=sequence)

    def add_stats(self, trace_id: str, **deltas: float) -> None:
        with self._lock:
            self._check_fence()
            row = self._stats[trace_id]
            for name, delta in deltas.items():
                if name not in STATS_FIELDS:
                    raise ValueError(f"unknown stats field {name!r}")
                row[name] = row.get(name, 0) + delta

    def put_collaborator(self, parent_trace_id: str, collaborator: Collaborator) -> None:
        with self._lock:
            self._check_fence()
            put_entry(self._collaborators[parent_trace_id], collaborator)

    def put_collaborator_and_emit(
        self, parent_trace_id: str, root_trace_id: str, collaborator: Collaborator, event: Event
    ) -> None:
        with self._lock:
            self.put_collaborator(parent_trace_id, collaborator)
            self.emit(root_trace_id, event)

    def collaborators(self, parent_trace_id: str) -> list[Collaborator]:
        with self._lock:
            return list(self._collaborators.get(parent_trace_id, {}).values())

    def emit(self, root_trace_id: str, event: Event) -> str:
        with self._lock:
            self._check_fence()
            stream = self._events[root_trace_id]
            entry_id = f"{len(stream) + 1}-0"
            stream.append((entry_id, event))
            self._lock.notify_all()
            return entry_id

    def read_events(
        self, root_trace_id: str, after: str = "0", *, block_ms: int | None = None, count: int = 500
    ) -> list[tuple[str, Event]]:
        start = int(after.split("-")[0]) if after not in ("0", "$") else 0
        with self._lock:
            if block_ms and len(self._events[root_trace_id]) <= start:
                self._lock.wait_for(
                    lambda: len(self._events[root_trace_id]) > start, timeout=block_ms / 1000
                )
            return self._events[root_trace_id][start : start + count]

    def request_stop(self, trace_id: str) -> None:
        with self._lock:
            if trace_id in self._traces:  # as in Redis, where the flag is a field of the trace
                self._stops.add(trace_id)

    def stop_requested(self, trace_id: str) -> bool:
        with self._lock:
            return trace_id in self._stops

    def clear_stop(self, trace_id: str) -> None:
        with self._lock:
            self._stops.discard(trace_id)

    def index_human_wait(self, trace_id: str, deadline_ms: int) -> None:
        with self._lock:
            self._human_waits[trace_id] = deadline_ms

    def human_wait_indexed(self, trace_id: str) -> bool:
        return trace_id in self._human_waits  # one dict read: atomic, no lock needed

    def expired_human_waits(self, at_ms: int) -> list[str]:
        with self._lock:
            return [t for t, deadline in self._human_waits.items() if deadline < at_ms]

    def forget_human_wait(self, trace_id: str) -> bool:
        with self._lock:
            return self._human_waits.pop(trace_id, None) is not None

    def acquire_lease(self, trace_id: str, owner: str, ttl_ms: int) -> bool:
        with self._lock:
            holder = self._leases.get(trace_id)
            if holder and holder[0] != owner and holder[1] > now_ms():
                return False
            deadline = now_ms() + ttl_ms
            self._leases[trace_id], self._running[trace_id] = (owner, deadline), deadline
            return True

    def _renew_lease(self, trace_id: str, owner: str, ttl_ms: int) -> bool:
        with self._lock:
            holder = self._leases.get(trace_id)
            if not holder or holder[0] != owner:
                return False
            deadline = now_ms() + ttl_ms
            self._leases[trace_id], self._running[trace_id] = (owner, deadline), deadline
            return True

    def release_lease(self, trace_id: str, owner: str) -> None:
        with self._lock:
            holder = self._leases.get(trace_id)
            if holder and holder[0] == owner:
                del self._leases[trace_id]
                self._running.pop(trace_id, None)

    def expired_leases(self, at_ms: int) -> list[str]:
        with self._lock:
            return [t for t, deadline in self._running.items() if deadline < at_ms]

    def forget_running(self, trace_id: str) -> bool:
        with self._lock:
            return self._running.pop(trace_id, None) is not None

    def append_collected(self, message: Message) -> Message | None:
        if message.tool_call_id is None:
            raise ValueError("append_collected needs a tool result (tool_call_id)")
        with self._lock:
            key = (message.trace_id, message.tool_call_id)
            self._check_fence()
            if message.trace_id in self._traces and key in self._collected:
                return None
            stored = self.append_message(message)  # the lock is re-entrant
            self._collected.add(key)
            return stored

    def cache_get(self, key: str) -> str | None:
        with self._lock:
            hit = self._cache.get(key)
            return hit[0] if hit and hit[1] > now_ms() else None

    def cache_set(self, key: str, value: str, ttl_s: int) -> None:
        with self._lock:
            self._cache[key] = (value, now_ms() + ttl_s * 1000)

    def count(self, counter: CounterName, by: int = 1) -> None:
        with self._lock:
            self._counters[counter] += by

    def count_fallback(self, from_model: str, to_model: str) -> None:
        with self._lock:
            self.fallbacks[from_model, to_model] += 1

    def unavailable(self, exc: BaseException) -> bool:
        return False

    def lease_holder(self, trace_id: str) -> str | None:
        with self._lock:
            holder = self._leases.get(trace_id)
            return holder[0] if holder and holder[1] > now_ms() else None

    def fenced(self, trace_id: str, owner: str) -> MemoryStore:
        view = copy.copy(self)  # shares every table and the lock
        view._fence = (trace_id, owner)
        return view

    def beat(
        self, leases: Sequence[tuple[str, str]], ttl_ms: int, presence: WorkerPresence | None
    ) -> list[bool]:
        renewed = [self._renew_lease(trace_id, owner, ttl_ms) for trace_id, owner in leases]
        if presence is not None:
            with self._lock:
                self._presence[presence.node] = (presence, now_ms() + ttl_ms)
        return renewed

"""A batch of writes to one trace, applied in order as one atomic step.

A runner's turn writes several things: the model's message and its event, its usage,
tool results, a status, a finish, the parent's collaborator entry. `TraceWrite` collects
them and `TraceStore.apply` runs them together: on Redis one Lua script, one round trip
(`fleet.storage.backends.redis.scripts.APPLY`), which also answers whether a stop was
requested, so the next turn needs no read of its own.

    write = TraceWrite(trace.trace_id, trace.root_trace_id)
    write.append(message, event, iteration=3)
    write.update(Event(kind="trace", ...), status="running")
    result = store.apply(write)        # result.messages[0].sequence, result.stop_requested

A write can also read provider pauses (`TraceWrite.pauses`: `fleet.limits.providers.pause_keys`) for
the model call that follows it, so that call needs no round trip of its own to check them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Unpack

from fleet.models import Collaborator, Event, Message, TracePatch
from fleet.runstate import RunPatch


@dataclass(frozen=True)
class SetFields:
    """Overwrite top-level trace fields (as `update_trace`), with an optional event."""

    fields: TracePatch
    event: Event | None = None


@dataclass(frozen=True)
class SetRun:
    """Set run-state fields, each on its own (as `update_run`): never the whole run state."""

    fields: RunPatch


@dataclass(frozen=True)
class Append:
    """Append a message (as `append_message`); with `event`, as `record_turn`."""

    message: Message
    event: Event | None = None
    iteration: int | None = None
    """Set for a model turn: its usage goes to the stats and the iteration is set."""


@dataclass(frozen=True)
class AddStats:
    """Add to TraceStats fields (as `add_stats`)."""

    deltas: dict[str, float]


@dataclass(frozen=True)
class PutCollaborator:
    """Insert or replace one child's entry in its parent (as `put_collaborator`)."""

    parent_trace_id: str
    collaborator: Collaborator
    event: Event | None = None


def put_entry(entries: dict[str, Collaborator], entry: Collaborator) -> None:
    """Put `entry` in a parent's `entries` (by child), keeping the one it replaces' strangers.

    The fields of the old entry that `entry` lacks and this release does not know are a
    newer release's, kept for it (as every store writes an entry; on Redis
    `fleet.storage.backends.redis.entries.KEEP`).
    """
    old = entries.get(entry.trace_id)
    theirs, mine = (old.model_extra or {}) if old else {}, entry.model_extra or {}
    if theirs.keys() - mine.keys():
        entry = entry.model_copy()
        entry.__pydantic_extra__ = theirs | mine
    entries[entry.trace_id] = entry


@dataclass(frozen=True)
class Emit:
    """Append an event to the tree's stream."""

    event: Event


@dataclass(frozen=True)
class ReleaseLease:
    """Give the trace's lease up if `owner` holds it (as `release_lease`)."""

    owner: str


@dataclass(eq=False)
class WriteExtension:
    """A host's own step in a write, run in the same atomic step (Redis stores only).

    A host registers a Lua function under `name` with the Redis store
    (`fleet.storage.backends.redis.scripts.register_write_extension`; the Celery binding registers
    its chord join) and adds this op to a write (`TraceWrite.extend`). The store calls the
    function with `keys`, then `args()` (computed as the write is sent), inside the write's
    script, and reports back once the write is applied: `applied`, and `reply` (what the
    function returned; None for false or nil). The store knows nothing of what it does.
    """

    name: str
    keys: list[str]
    args: Callable[[], list[str]]
    applied: bool = False
    reply: Any = None


WriteOp = (
    SetFields | SetRun | Append | AddStats | PutCollaborator | Emit | ReleaseLease | WriteExtension
)


@dataclass(frozen=True)
class PauseRead:
    """Provider pauses as a store round trip read them, for the model call after it.

    The pause keys are set by any worker's 429/503/529: a call that goes by this read sees
    another worker's pause as of that round trip (micro- to milliseconds before the call),
    not as of the call itself.
    """

    left_ms: Mapping[str, int]
    """Pause key -> its PTTL when read (0 or less: not paused)."""
    read_at_s: float
    """`time.monotonic()` when the reply came."""

    @classmethod
    def of(cls, pause_keys: Sequence[str], ttls_ms: Sequence[object]) -> PauseRead:
        """The read of these keys, with the PTTLs a script returned for them, in order."""
        left = {key: int(str(ttl)) for key, ttl in zip(pause_keys, ttls_ms, strict=True)}
        return cls(left, time.monotonic())

    def left_s(self, pause_keys: Sequence[str]) -> float | None:
        """Seconds the longest of these pauses still runs (0.0: none); None if one was not read."""
        if any(key not in self.left_ms for key in pause_keys):
            return None
        longest_ms = max((self.left_ms[key] for key in pause_keys), default=0)
        return max(0.0, longest_ms / 1000 - (time.monotonic() - self.read_at_s))


@dataclass(frozen=True)
class InboxSeen:
    """A trace's inbox as a round trip the run made anyway saw it (`fleet.storage.inbox`).

    Entries are never removed while the trace lives, so `newest` None means no message
    ever came; a message that comes after the read is found by the next write's read, or
    by the call watcher (`fleet.loop.cut`) while a call is in flight.
    """

    newest: str | None
    """The newest entry's id when read; None: the inbox is empty."""


@dataclass
class TraceWrite:
    """Writes to one trace (and its parent's collaborator entry), in order."""

    trace_id: str
    root_trace_id: str
    ops: list[WriteOp] = field(default_factory=list)
    pauses: tuple[str, ...] = ()
    """Pause keys to read in the same step (`WriteResult.pauses`): the next call's."""
    inbox: bool = False
    """Read the trace's inbox (its newest entry) in the same step (`WriteResult.inbox`)."""
    unless_stopped: bool = False
    """Refuse the whole write (`StopLanded`, nothing written) if a stop was requested: a
    run's last write, so a stop that landed as its last call returned ends it `stopped`."""
    _parent: str | None = field(default=None, init=False, repr=False, compare=False)
    """The parent whose collaborators `ops` write, if any: checked per entry without a
    scan of every op (a spawn of 1000 children puts 1000 entries in one write)."""

    def __post_init__(self) -> None:
        for op in self.ops:
            if isinstance(op, PutCollaborator):
                self._check_parent(op.parent_trace_id)

    def _check_parent(self, parent_trace_id: str) -> None:
        if self._parent is not None and self._parent != parent_trace_id:
            raise ValueError("one write puts collaborators into one parent only")
        self._parent = parent_trace_id

    def update(self, event: Event | None = None, /, **fields: Unpack[TracePatch]) -> TraceWrite:
        """Overwrite these fields; emit `event` with them."""
        self.ops.append(SetFields(fields, event))
        return self

    def update_run(self, **fields: Unpack[RunPatch]) -> TraceWrite:
        """Set these run-state fields (`fleet.runstate`), each on its own."""
        self.ops.append(SetRun(fields))
        return self

    def append(
        self, message: Message, event: Event | None = None, *, iteration: int | None = None
    ) -> TraceWrite:
        """Append a message; its event gets `data["sequence"]`."""
        if message.trace_id != self.trace_id:
            raise ValueError(f"message of {message.trace_id!r} in a write to {self.trace_id!r}")
        if iteration is not None and event is None:
            raise ValueError("a model turn (iteration) needs its event")
        self.ops.append(Append(message, event, iteration))
        return self

    def add_stats(self, **deltas: float) -> TraceWrite:
        """Add to the trace's stats."""
        self.ops.append(AddStats(deltas))
        return self

    def put_collaborator(
        self, parent_trace_id: str, collaborator: Collaborator, event: Event | None = None
    ) -> TraceWrite:
        """Write this trace's entry into its parent's collaborators."""
        self._check_parent(parent_trace_id)
        self.ops.append(PutCollaborator(parent_trace_id, collaborator, event))
        return self

    def emit(self, event: Event) -> TraceWrite:
        """Append an event to the tree's stream."""
        self.ops.append(Emit(event))
        return self

    def release_lease(self, owner: str) -> TraceWrite:
        """Give the lease up at the end of the write."""
        self.ops.append(ReleaseLease(owner))
        return self

    def extend(self, extension: WriteExtension) -> TraceWrite:
        """Run a host's registered step in the same atomic step (one per write)."""
        if any(isinstance(op, WriteExtension) for op in self.ops):
            raise ValueError("one write runs one extension")
        self.ops.append(extension)
        return self

    def read_pauses(self, pause_keys: Sequence[str]) -> TraceWrite:
        """Read these provider pauses in the same step, for the model call after the write."""
        self.pauses = tuple(dict.fromkeys([*self.pauses, *pause_keys]))
        return self

    def read_inbox(self) -> TraceWrite:
        """Read the trace's inbox state in the same step, for the model call after the write."""
        self.inbox = True
        return self

    def refused_if_stopped(self) -> TraceWrite:
        """Write nothing (`StopLanded`) if the trace's stop flag is raised (`unless_stopped`)."""
        self.unless_stopped = True
        return self


@dataclass(frozen=True)
class WriteResult:
    """What `TraceStore.apply` reports."""

    messages: list[Message]
    """The appended messages as stored (sequence, parent_sequence), in write order."""
    stop_requested: bool
    """Whether a stop was requested for the trace, as of the write."""
    pauses: PauseRead | None = None
    """The write's `pauses`, as of the write (None: none read; the in-memory store)."""
    inbox: InboxSeen | None = None
    """The inbox as of the write, when it asked (`TraceWrite.inbox`); None: not read."""

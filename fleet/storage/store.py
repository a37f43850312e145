"""The trace store seam: one protocol; MemoryStore in memory_store, Redis in redis_store."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Unpack

from fleet.models import (
    Collaborator,
    Event,
    Message,
    Status,
    Trace,
    TracePatch,
    TraceStats,
    WorkerPresence,
)
from fleet.runstate import RunPatch
from fleet.storage.capability import Capability, T
from fleet.storage.keys import CounterName
from fleet.storage.root_message import RootMessage
from fleet.storage.writes import (
    InboxSeen,
    PauseRead,
    TraceWrite,
    WriteResult,
)

STATS_FIELDS = tuple(TraceStats.model_fields)
"""The `TraceStats` counters, each added to on its own (`add_stats`)."""
OutboxDue = tuple[str, int]
"""An outbox entry (`fleet.storage.outbox`) and the ms it comes due at."""


@dataclass(frozen=True)
class TraceSnapshot:
    """What a runner reads at the top of a turn, taken in one step."""

    trace: Trace
    messages: list[Message]
    """Every message of the trace (all branches), by sequence."""
    stop_requested: bool
    pauses: PauseRead | None = None
    """Provider pauses read in the same step (`begin_run`, a write), for the next call."""
    inbox: InboxSeen | None = None
    """The inbox read in the same step (`begin_run`, a write); None: not read, ask it."""
    budgeted: bool | None = None
    """Whether the tree has a budget (`begin_run`); None: not read (the limits ask it)."""
    experiences: tuple[str | None, int] | None = None
    """The experiences' version and count (`begin_run`, `StartRun.experiences`); None: not
    read (their store asks); count -1: not read, the version `StartRun.experiences_held`."""


@dataclass(frozen=True)
class StartRun:
    """How `begin_run` starts a trace it finds `queued` or `waiting`, in the same step.

    It sets the trace `running` and appends `event` to `root_trace_id`'s stream; only when
    the trace belongs to that root (a guess from the trace id, checked there). Else nothing
    is written and the caller starts the trace itself.
    """

    root_trace_id: str
    event: Event
    experiences: frozenset[str] = frozenset()
    """Presets showing experiences: a first run of one reads their version in the step."""
    experiences_held: str | None = None
    """The version the process holds them at ("": no counter, None: none): count not read."""


@dataclass(frozen=True)
class Serving:
    """What `queue_root` checks first: some live worker of `queue` accepts `workspace`.

    As `fleet.storage.watchdog.check_served` does: a worker announces its workspace roots;
    when none is live, or none announced roots, nothing is refused.
    """

    queue: str
    workspace: Path
    """The root's workspace, resolved."""
    message: RootMessage | None = None
    """The root's task message, put in the same step where the broker is the store."""


STARTABLE: tuple[Status, ...] = ("queued", "waiting")
"""The statuses a runner sets `running` when it takes the trace: no runner holds it then.

The one source of the rule: `starts` (the memory store), `redis_begin.BEGIN_RUN` (its
condition is generated from this) and `lifecycle.stop_subtree` read it.
"""


def starts(data: dict[str, object], start: StartRun) -> bool:
    """Whether `begin_run` sets this trace (its stored fields) running, as the script decides."""
    return data["status"] in STARTABLE and data["root_trace_id"] == start.root_trace_id


def with_sequence(event: Event, sequence: int) -> Event:
    """The event of an appended message, its `data` naming the message's sequence."""
    return event.model_copy(update={"data": {**event.data, "sequence": sequence}})


class TraceRecords(Protocol):
    """Traces as records: create, read, update, list; a run's first read."""

    def create_trace(self, trace: Trace) -> None:
        """Persist a new trace (and index it under its parent); `TraceExists` if the id is taken."""
        ...

    def create_traces(self, traces: Sequence[Trace], outbox: OutboxDue | None = None) -> list[bool]:
        """`create_trace` for each in one step (False: id taken), and a spawn's `outbox_put`."""
        ...

    def get_trace(self, trace_id: str) -> Trace:
        """The trace with its current stats; `TraceNotFound` if missing."""
        ...

    def get_traces(self, trace_ids: Sequence[str]) -> list[Trace]:
        """Several traces in one read, in order; `TraceNotFound` names the first missing."""
        ...

    def update_trace(self, trace_id: str, **fields: Unpack[TracePatch]) -> None:
        """Overwrite these top-level fields only (other writers' fields are untouched)."""
        ...

    def update_trace_and_emit(
        self, trace_id: str, root_trace_id: str, event: Event, /, **fields: Unpack[TracePatch]
    ) -> None:
        """`update_trace` and `emit` in one atomic step."""
        ...

    def update_run(self, trace_id: str, **fields: Unpack[RunPatch]) -> None:
        """Set these run-state fields (`fleet.runstate`), each on its own: never the whole."""
        ...

    def snapshot(self, trace_id: str) -> TraceSnapshot:
        """The trace, all its messages and its stop flag, read together."""
        ...

    def begin_run(
        self,
        trace_id: str,
        owner: str,
        ttl_ms: int,
        start: StartRun | None = None,
        pauses: Sequence[str] = (),
    ) -> TraceSnapshot | None:
        """`acquire_lease`, then `snapshot`, in one step; None when another runner holds it.

        With `start`, a queued or waiting trace is set running first (see `StartRun`); the
        snapshot shows it so. `pauses`: provider pause keys read in the same step, for the
        first model call (`TraceSnapshot.pauses`; the in-memory store has none).

        Raises:
            TraceNotFound: no such trace (and no lease was taken).
        """
        ...

    def apply(self, write: TraceWrite) -> WriteResult:
        """Every op of the write, in order, as one atomic step; then the stop flag."""
        ...

    def track_tree(self, root_trace_id: str) -> None:
        """Index a root whose tree is open (created or continued), for the owner check."""
        ...

    def queue_root(
        self, trace: Trace, event: Event, serving: Serving | None = None, *, listed: bool = True
    ) -> None:
        """Create a new root with its first event, its tree open, in one step where it can.

        `listed`: in the roots index too (`fleet.storage.root_index`).

        Raises:
            ConfigError: `serving` is given and no live worker of its queue accepts its
                workspace (nothing written).
            TraceExists: the id is taken (nothing written).
        """
        ...

    def list_traces(self, limit: int = 50) -> list[Trace]:
        """Newest first."""
        ...

    def children(self, trace_id: str) -> list[str]:
        """Child trace ids in creation order."""
        ...


class TraceContent(Protocol):
    """What a trace holds: its message tree, stats, collaborators and events."""

    def append_message(self, message: Message) -> Message:
        """Atomically give the message the next sequence, hang it under the head, move the head."""
        ...

    def record_turn(
        self, root_trace_id: str, message: Message, event: Event, *, iteration: int | None = None
    ) -> Message:
        """`append_message` and emit its event, with `data["sequence"]` set, in one step.

        With `iteration` the message is a model turn: its usage is added to the stats
        (`messages` + 1) and the trace's iteration is set, in the same step.
        """
        ...

    def messages(self, trace_id: str) -> list[Message]:
        """Every message of the trace (all branches), by sequence."""
        ...

    def set_head(self, trace_id: str, sequence: int | None) -> None:
        """Point the head elsewhere (rewind); later appends branch from there."""
        ...

    def add_stats(self, trace_id: str, **deltas: float) -> None:
        """Atomically add to TraceStats fields."""
        ...

    def put_collaborator(self, parent_trace_id: str, collaborator: Collaborator) -> None:
        """Insert or replace the entry of one child; atomic per child."""
        ...

    def put_collaborator_and_emit(
        self, parent_trace_id: str, root_trace_id: str, collaborator: Collaborator, event: Event
    ) -> None:
        """`put_collaborator` and `emit` in one atomic step."""
        ...

    def collaborators(self, parent_trace_id: str) -> list[Collaborator]:
        """Entries in the order the children were first added."""
        ...

    def append_collected(self, message: Message) -> Message | None:
        """Append a tool call's collected result once: None if it was collected already.

        The once-mark and the message are one atomic step, so a collector killed halfway
        leaves neither and a redelivered collect writes the result.
        """
        ...

    def emit(self, root_trace_id: str, event: Event) -> str:
        """Append to the tree's event stream; returns the entry id."""
        ...

    def read_events(
        self, root_trace_id: str, after: str = "0", *, block_ms: int | None = None, count: int = 500
    ) -> list[tuple[str, Event]]:
        """Entries after `after`; with `block_ms`, wait up to that long for the first one."""
        ...


class StopsAndWaits(Protocol):
    """The stop flag runners check between turns, and traces waiting on a person."""

    def request_stop(self, trace_id: str) -> None:
        """Raise the stop flag that runners check between turns (none for a missing trace)."""
        ...

    def stop_requested(self, trace_id: str) -> bool:
        """Whether a stop was requested for this trace."""
        ...

    def clear_stop(self, trace_id: str) -> None:
        """Lower the stop flag (a stopped root is being continued)."""
        ...

    def index_human_wait(self, trace_id: str, deadline_ms: int) -> None:
        """Remember that this trace waits on a person until `deadline_ms`."""
        ...

    def expired_human_waits(self, at_ms: int) -> list[str]:
        """Traces whose wait on a person passed its deadline before `at_ms`."""
        ...

    def human_wait_indexed(self, trace_id: str) -> bool:
        """Whether the trace's wait on a person is in the index (its deadline will fire)."""
        ...

    def forget_human_wait(self, trace_id: str) -> bool:
        """Drop a trace's wait from the index; True for the one caller that removed it."""
        ...


class Leases(Protocol):
    """Who runs a trace now: leases, the running index, worker heartbeats and presence."""

    def acquire_lease(self, trace_id: str, owner: str, ttl_ms: int) -> bool:
        """Take the runner lease if free (or already ours); index it as running."""
        ...

    def release_lease(self, trace_id: str, owner: str) -> None:
        """Give the lease up if it is ours."""
        ...

    def expired_leases(self, at_ms: int) -> list[str]:
        """Traces indexed as running whose lease deadline passed before `at_ms`."""
        ...

    def lease_holder(self, trace_id: str) -> str | None:
        """The owner of the trace's live lease, if any."""
        ...

    def forget_running(self, trace_id: str) -> bool:
        """Drop a trace from the running index; True for the one caller that removed it."""
        ...

    def unavailable(self, exc: BaseException) -> bool:
        """Whether `exc` means the store could not be reached just now (not a bug).

        A run interrupted so keeps its lease until it lapses, and a sweeper resumes it.
        """
        ...

    def fenced(self, trace_id: str, owner: str) -> TraceStore:
        """A view of the store whose writes first check that `owner` holds the lease.

        The check and the write are one atomic step; a write whose lease is not `owner`'s
        raises `LeaseLost` and changes nothing. Reads are as usual.
        """
        ...

    def beat(
        self, leases: Sequence[tuple[str, str]], ttl_ms: int, presence: WorkerPresence | None
    ) -> list[bool]:
        """One heartbeat of a worker process, in one round trip.

        Renews every `(trace_id, owner)` lease it holds and announces `presence`.
        Returns one bool per lease: still ours.
        """
        ...

    def drop_presence(self, presence: WorkerPresence) -> None:
        """The worker is going away: no longer count it as a consumer of its queues."""
        ...

    def presences(self, nodes: Sequence[str]) -> list[WorkerPresence]:
        """What each live worker of `nodes` announced (a node gone since is left out)."""
        ...

    def live_consumers(self, queue: str) -> list[str]:
        """Node names of the workers whose heartbeat says they consume `queue` now."""
        ...


class Outbox(Protocol):
    """Work to hand to the queue, kept until it was (`fleet.storage.outbox`)."""

    def outbox_put(self, entry: str, due_ms: int) -> None:
        """Record work to hand to the queue (`storage.outbox`), due at `due_ms` unless done."""
        ...

    def outbox_done(self, entry: str) -> None:
        """The entry's work was handed to the queue."""
        ...

    def outbox_claim(self, at_ms: int, retry_ms: int, limit: int = 100) -> list[str]:
        """Entries due by `at_ms`, each given to one caller.

        An entry the caller does not mark done comes due again `retry_ms` later.
        """
        ...


class Services(Protocol):
    """What else lives beside the traces: the result cache, counters, capabilities."""

    def cache_get(self, key: str) -> str | None:
        """A cached sub-agent answer."""
        ...

    def cache_set(self, key: str, value: str, ttl_s: int) -> None:
        """Cache a sub-agent answer for `ttl_s`."""
        ...

    def count(self, counter: CounterName, by: int = 1) -> None:
        """Add to a fleet-wide counter (`fleet metrics`); best effort: a failure is logged."""
        ...

    def count_fallback(self, from_model: str, to_model: str) -> None:
        """Count a trace moved to a fallback model (`fleet metrics`); best effort too."""
        ...

    def capability(self, kind: Capability[T]) -> T:
        """The service `kind` beside this store (limits, budgets, ...): Redis or memory."""
        ...

    def close(self) -> None:
        """Let go of what the store opened (its own Redis client)."""
        ...


class TraceStore(TraceRecords, TraceContent, StopsAndWaits, Leases, Outbox, Services, Protocol):
    """Where traces, messages, collaborators and events live: every role above.

    A caller annotates the narrowest role it needs; a host (a runtime, a fleet) holds the
    whole store. `MemoryStore` and `RedisStore` implement it all.
    """

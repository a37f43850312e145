"""Every Redis key agent-fleet uses, with its TTL and what it holds.

One screen tells the whole storage schema. All keys share `PREFIX`; ids are trace ids,
checked by `ids.check_trace_id`: `ROOT:messages` is not a trace id, so no caller can make
a trace key name another one.

Two layouts: the plain one (a single Redis), and the cluster one (`use_cluster_layout`,
FLEET_REDIS_CLUSTER=1), where a tree's keys carry its root as the hash tag
(`fleet:trace:{ROOT}@explore-001-...`) and the limiter's carry `{limits}`.
"""

from __future__ import annotations

from typing import Literal

from fleet.ids import check_trace_id, root_of

PREFIX = "fleet"

_layout = {"cluster": False}
"""Which layout this process names keys in; set once at start-up (`use_cluster_layout`)."""


def use_cluster_layout(on: bool) -> None:
    """Name every key of a tree with its root as the hash tag (FLEET_REDIS_CLUSTER=1).

    Redis Cluster keeps the keys of one tag in one slot, so a script over a tree's keys runs
    on one node. Set once per process, before any key is named (`redis_connect.connect`);
    a fleet's processes must all agree (a cluster store is never read in the plain layout).
    """
    _layout["cluster"] = on


def cluster_layout() -> bool:
    """Whether keys are named in the cluster layout."""
    return _layout["cluster"]


def _tree_id(trace_id: str) -> str:
    """The id in a tree's key: as it is, or (cluster layout) its root part as the hash tag.

    `{root}@explore-001-...`: a child's id starts with its root's, so every key of a tree
    lands in the root's slot, whatever its depth.
    """
    check_trace_id(trace_id)
    if not _layout["cluster"]:
        return trace_id
    root = root_of(trace_id)
    return f"{{{root}}}{trace_id[len(root) :]}"


TRACE_TTL_S = 7 * 24 * 3600
"""How long a trace and everything under it stays readable after its last change; once its
tree ended and was compacted, the retention (`Settings.retention_s`, this by default)."""

LEASE_TTL_MS = 5_000
"""A runner's lease (default of `Settings.lease_ttl_ms`); the worker's one heartbeat thread
(`fleet.storage.leases.LeaseKeeper`) renews every lease it holds every LEASE_TTL_MS / 5."""

EVENTS_MAXLEN = 10_000
"""Approximate cap of one trace tree's event stream."""


def trace(trace_id: str) -> str:
    """Hash: one field per top-level Trace attribute, each a JSON value, and its messages.

    `stats` (TraceStats) is added to inside the write scripts; `m:{sequence}` holds each
    message (Message JSON); `stop` ("1") is present while a stop is requested (runners check
    it between turns); `uncounted` (`{model: [prompt, completion, cost]}`) holds the usage of
    model turns not yet added to USAGE, while a run has some. Messages, the stop flag and
    `uncounted` are not Trace attributes.
    """
    return f"{PREFIX}:trace:{_tree_id(trace_id)}"


# Layout 1 (up to wave 2) kept these three apart from the trace hash; layout 2 folded them in
# (`m:{sequence}`, `stats`, `stop`). Only `fleet migrate` (fleetops/migrate.py) reads them.


def legacy_messages(trace_id: str) -> str:
    """Layout 1: hash sequence -> Message JSON."""
    return f"{PREFIX}:trace:{check_trace_id(trace_id)}:messages"


def legacy_stats(trace_id: str) -> str:
    """Layout 1: hash of TraceStats counters (HINCRBY / HINCRBYFLOAT)."""
    return f"{PREFIX}:trace:{check_trace_id(trace_id)}:stats"


def legacy_stop(trace_id: str) -> str:
    """Layout 1: string, present while a stop was requested."""
    return f"{PREFIX}:trace:{check_trace_id(trace_id)}:stop"


LEGACY_SUFFIXES = ("messages", "stats", "stop")
"""The last part of each layout-1 key, in the order `fleet migrate` passes them."""


def collaborators(trace_id: str) -> str:
    """Hash: child trace id -> Collaborator JSON (one field per child: atomic per child)."""
    return f"{PREFIX}:trace:{_tree_id(trace_id)}:collaborators"


def collaborator_order(trace_id: str) -> str:
    """List: child trace ids in the order their collaborator entries were first added."""
    return f"{PREFIX}:trace:{_tree_id(trace_id)}:collaborator-order"


def children(trace_id: str) -> str:
    """Sorted set: child trace ids scored by creation time."""
    return f"{PREFIX}:trace:{_tree_id(trace_id)}:children"


def events(root_trace_id: str) -> str:
    """Stream: the events of a whole trace tree, read by watch/run/batch."""
    return f"{PREFIX}:trace:{_tree_id(root_trace_id)}:events"


def events_archive(root_trace_id: str) -> str:
    """String with the retention TTL: a finished tree's events, packed, once its stream is gone.

    Written by compaction (`fleet.storage.redis_compact`); read where the stream has nothing.
    """
    return f"{PREFIX}:trace:{_tree_id(root_trace_id)}:events-archive"


def tree_dict(root_trace_id: str) -> str:
    """String with the retention TTL: the text a compacted tree's traces are packed against.

    base64 (`fleet.storage.compaction.TreeDict`); set once per tree (SET NX), its TTL renewed
    by each compaction of the tree, so it outlives every trace packed against it.
    """
    return f"{PREFIX}:trace:{_tree_id(root_trace_id)}:dict"


def lease(trace_id: str) -> str:
    """String with PX TTL: the id of the one live runner of this trace."""
    return f"{PREFIX}:lease:{_tree_id(trace_id)}"


def worker(node: str) -> str:
    """String with PX TTL (the lease TTL): a live worker's presence, JSON `WorkerPresence`."""
    return f"{PREFIX}:worker:{node}"


def consumers(queue: str) -> str:
    """Sorted set: node names of the workers consuming `queue`, scored by presence deadline.

    In ms; entries dead for a minute are trimmed by every heartbeat.
    """
    return f"{PREFIX}:consumers:{queue}"


def collected(trace_id: str, tool_call_id: str) -> str:
    """String: set once when a tool call's children were collected (dedupes redelivery)."""
    return f"{PREFIX}:trace:{_tree_id(trace_id)}:collected:{tool_call_id}"


def cache(preset: str, digest: str) -> str:
    """String with TTL: a cached sub-agent answer for a preset and argument digest."""
    return f"{PREFIX}:cache:{preset}:{digest}"


TRACES = f"{PREFIX}:traces"
"""Sorted set: every trace id scored by creation time (newest last)."""

RUNNING = f"{PREFIX}:running"
"""Sorted set: trace ids in status running, scored by their lease deadline in ms."""

HUMAN_WAITS = f"{PREFIX}:human-waits"
"""Sorted set, no TTL: trace ids waiting on a person (`ask_human`, an approval), scored by
the deadline in ms after which the wait ends with a timeout result; an answer removes its
entry, and whoever removes it (reply, approve, deny, the sweeper) is the one that answers."""

EXPERIENCES = f"{PREFIX}:experiences"
"""Hash, no TTL: experience id -> Experience JSON (`fleet.experiences`), counts excluded."""

EXPERIENCE_COUNTS = f"{PREFIX}:experience-counts"
"""Hash, no TTL: `{id}:uses` and `{id}:successes`, added to with HINCRBY (one writer each)."""


def experiences_used(trace_id: str) -> str:
    """List with TRACE_TTL_S: the experience ids injected into this trace.

    Taken (once) when the trace ends, to count their successes.
    """
    return f"{PREFIX}:experiences-used:{_tree_id(trace_id)}"


USAGE = f"{PREFIX}:usage"
"""Hash, no TTL: fleet-wide model usage for `fleet metrics`, one field per `{kind}:{model}`
(kind prompt_tokens, completion_tokens or cost_usd); added to once per run, by the write
that ends it (a status other than running), from the trace's `uncounted` field: a run that
died leaves its calls there for the trace's next run to add."""

COUNTERS = f"{PREFIX}:counters"
"""Hash, no TTL: fleet-wide event counts for `fleet metrics`, one field per `CounterName`."""
CounterName = Literal["lease_expiries", "resumes", "stuck_traces"]
"""The fields of `COUNTERS`: runs re-enqueued after their lease expired, parents resumed,
non-terminal traces the owner check found with nothing to move them (`fleet.owners`)."""

OPEN_TREES = f"{PREFIX}:open-trees"
"""Sorted set, no TTL: root trace ids whose tree may still have a non-terminal trace, scored
by when they were (re)opened in ms; the owner check (`fleet.owners`) removes a tree once
every trace of it ended, or once its root is gone (expired)."""

OWNER_CHECK = f"{PREFIX}:owner-check"
"""String with TTL: which worker runs the fleet's owner check this interval (SET NX PX)."""

OUTBOX = f"{PREFIX}:outbox"
"""Sorted set, no TTL: work to hand to the queue (`fleet.storage.outbox` entries: a spawn whose
children are created but not yet dispatched, a recovered run not yet re-sent), scored by
when a sweeper may do it (ms)."""


# -- provider limits and tree budgets (fleet.limits.providers, fleet.limits.budget) -----------

LIMITS_TAG = "{limits}"
"""In the cluster layout every limiter key (each scope's, the tickets, the stats) carries this
hash tag: one slot, so an admission over several scopes stays one script on a cluster too."""


def _limits(name: str) -> str:
    """`fleet:limit{name}` (`fleet:limit:openai`); `fleet:{limits}{name}` in the cluster layout."""
    return f"{PREFIX}:{LIMITS_TAG}{name}" if _layout["cluster"] else f"{PREFIX}:limit{name}"


LIMIT_STATE_TTL_S = 3600
"""Limiter state of a scope: gone an hour after its last use (an idle scope needs none)."""

LIMIT_TICKET_GRACE_MS = 60_000
"""A booked admission is kept this long past its time for the trace to come back for it."""

LIMIT_LINE_STALE_MS = 30_000
"""A trace waiting for a concurrency slot that has not asked again for this long leaves the
line (it finished, was stopped, or its worker died)."""


def limit_state(scope: str) -> str:
    """Hash: `rtat`/`ttat` (GCRA next-free times of requests and tokens, ms), `rnext`...

    `rnext`/`tnext`: the earliest next admission after the last one (a pause moves any of
    the four that is earlier to its end); `dur_ms` is the mean call time.
    """
    return _limits(f":{scope}")


def limit_slots(scope: str) -> str:
    """Sorted set: trace ids holding a concurrency slot, scored by the slot's deadline in ms."""
    return _limits(f":{scope}:slots")


def limit_line(scope: str) -> str:
    """Sorted set: trace ids waiting for a concurrency slot, scored by when they first asked."""
    return _limits(f":{scope}:line")


def limit_seen(scope: str) -> str:
    """Sorted set: the same trace ids, scored by when they last asked (stale ones are dropped)."""
    return _limits(f":{scope}:seen")


def limit_pause(scope: str) -> str:
    """String with PX TTL: present while every worker must back off this provider.

    Set by a 429/503/529 (for its retry-after) or by rate-limit headers saying nothing is left.
    """
    return _limits(f":{scope}:pause")


def limit_sends(scope: str) -> str:
    """Sorted set with PX TTL: the calls that left in the scope's last send window, by when.

    Scored in ms; one more call is held back while it holds the window's limit (`pacing`).
    """
    return _limits(f":{scope}:sends")


def limit_ticket(trace_id: str) -> str:
    """Hash with PX TTL: the booked admission a handed-back trace comes back for.

    Field `at` (ms, the booked turn); TTL until `at` + LIMIT_TICKET_GRACE_MS.
    """
    return _limits(f"-ticket:{check_trace_id(trace_id)}")


def limit_stats() -> str:
    """Hash, no TTL: fleet-wide limiter counts for `fleet metrics`, by `{what}:{scope}`.

    what: admitted, waited, overloaded, paused, budget_exhausted. `fleet:limit-stats` (a
    function, not a constant: its name depends on the layout).
    """
    return _limits("-stats")


def budget(root_trace_id: str) -> str:
    """Hash: a tree's budget, TRACE_TTL_S.

    `limit_*` and `used_*` (tokens, usd, sub_agents), `final` (tokens set aside for the root's
    last turn), `exhausted` (why the tree stopped).
    """
    return f"{PREFIX}:budget:{_tree_id(root_trace_id)}"


def budget_held(root_trace_id: str) -> str:
    """Hash: trace id -> `tokens usd` reserved by that trace's model call in flight.

    One field per trace, so a run redelivered after a crash replaces its own reservation.
    """
    return f"{PREFIX}:budget:{_tree_id(root_trace_id)}:held"


def window_running(root_trace_id: str) -> str:
    """Set: the children of this tree that hold one of its `max_concurrent` run slots."""
    return f"{PREFIX}:window:{_tree_id(root_trace_id)}:running"


def window_pending(root_trace_id: str) -> str:
    """List: children of this tree waiting for a run slot, in spawn order (per-root window)."""
    return f"{PREFIX}:window:{_tree_id(root_trace_id)}:pending"


def tree(root_trace_id: str) -> str:
    """Hash: how a tree is scheduled, TRACE_TTL_S; absent for a tree with defaults.

    `max_concurrent` (children running at once), `priority` (interactive | batch).
    """
    return f"{PREFIX}:tree:{_tree_id(root_trace_id)}"


def searches(root_trace_id: str) -> str:
    """String (a counter), TRACE_TTL_S: `web_search` calls made by this tree so far.

    Checked against `search.max_searches_per_tree` of fleet.yaml (`fleet.limits.searches`).
    """
    return f"{PREFIX}:searches:{_tree_id(root_trace_id)}"

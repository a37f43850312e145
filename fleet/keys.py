"""Every Redis key agent-fleet uses, with its TTL and what it holds.

One screen tells the whole storage schema. All keys share `PREFIX`; ids are trace ids.
"""

from __future__ import annotations

PREFIX = "fleet"

TRACE_TTL_S = 7 * 24 * 3600
"""How long a finished trace and everything under it stays readable."""

LEASE_TTL_MS = 5_000
"""A runner's lease (default of `Settings.lease_ttl_ms`); the worker's one heartbeat thread
(`fleet.leases.LeaseKeeper`) renews every lease it holds every LEASE_TTL_MS / 5."""

OUTBOX_GRACE_MS = 15_000
"""How long a spawn may take between creating its children and handing them to the queue
before the sweeper dispatches them itself (only if the spawning runner's lease is gone)."""

STOP_TTL_S = TRACE_TTL_S
EVENTS_MAXLEN = 10_000
"""Approximate cap of one trace tree's event stream."""


def trace(trace_id: str) -> str:
    """Hash: one field per top-level Trace attribute, each a JSON value."""
    return f"{PREFIX}:trace:{trace_id}"


def messages(trace_id: str) -> str:
    """Hash: sequence -> Message JSON."""
    return f"{PREFIX}:trace:{trace_id}:messages"


def stats(trace_id: str) -> str:
    """Hash: TraceStats fields, incremented atomically (HINCRBY / HINCRBYFLOAT)."""
    return f"{PREFIX}:trace:{trace_id}:stats"


def collaborators(trace_id: str) -> str:
    """Hash: child trace id -> Collaborator JSON (one field per child: atomic per child)."""
    return f"{PREFIX}:trace:{trace_id}:collaborators"


def collaborator_order(trace_id: str) -> str:
    """List: child trace ids in the order their collaborator entries were first added."""
    return f"{PREFIX}:trace:{trace_id}:collaborator-order"


def children(trace_id: str) -> str:
    """Sorted set: child trace ids scored by creation time."""
    return f"{PREFIX}:trace:{trace_id}:children"


def events(root_trace_id: str) -> str:
    """Stream: the events of a whole trace tree, read by watch/run/batch."""
    return f"{PREFIX}:trace:{root_trace_id}:events"


def stop(trace_id: str) -> str:
    """String: present when a stop was requested; runners check it between turns."""
    return f"{PREFIX}:trace:{trace_id}:stop"


def lease(trace_id: str) -> str:
    """String with PX TTL: the id of the one live runner of this trace."""
    return f"{PREFIX}:lease:{trace_id}"


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
    return f"{PREFIX}:trace:{trace_id}:collected:{tool_call_id}"


def cache(preset: str, digest: str) -> str:
    """String with TTL: a cached sub-agent answer for a preset and argument digest."""
    return f"{PREFIX}:cache:{preset}:{digest}"


TRACES = f"{PREFIX}:traces"
"""Sorted set: every trace id scored by creation time (newest last)."""

RUNNING = f"{PREFIX}:running"
"""Sorted set: trace ids in status running, scored by their lease deadline in ms."""

USAGE = f"{PREFIX}:usage"
"""Hash, no TTL: fleet-wide model usage for `fleet metrics`, one field per `{kind}:{model}`
(kind prompt_tokens, completion_tokens or cost_usd); added to with each model turn."""

COUNTERS = f"{PREFIX}:counters"
"""Hash, no TTL: fleet-wide event counts for `fleet metrics` (`lease_expiries`, `resumes`)."""

OUTBOX = f"{PREFIX}:outbox"
"""Sorted set, no TTL: work to hand to the queue (`fleet.outbox` entries: a spawn whose
children are created but not yet dispatched, a recovered run not yet re-sent), scored by
when a sweeper may do it (ms)."""

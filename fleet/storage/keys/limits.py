"""Provider limits, tree budgets, run windows and search counts: their Redis keys.

The keys `fleet.limits` owns, grouped by their owner as `keys.batch` groups the provider
batches'; importable from `fleet.storage.keys` like every other key.
"""

from __future__ import annotations

from fleet.ids import check_trace_id
from fleet.storage.keys.layout import LAYOUT, PREFIX
from fleet.storage.keys.layout import tree_id as _tree_id

# -- provider limits and tree budgets (fleet.limits.providers, fleet.limits.budget) -----------

LIMITS_TAG = "{limits}"
"""In the cluster layout every limiter key (each scope's, the tickets, the stats) carries this
hash tag: one slot, so an admission over several scopes stays one script on a cluster too."""


def _limits(name: str) -> str:
    """`fleet:limit{name}` (`fleet:limit:openai`); `fleet:{limits}{name}` in the cluster layout."""
    return f"{PREFIX}:{LIMITS_TAG}{name}" if LAYOUT["cluster"] else f"{PREFIX}:limit{name}"


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

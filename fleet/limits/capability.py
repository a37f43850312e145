"""The limits a store keeps beside it: `store.capability(LIMITS)`.

On Redis, the Lua-backed `Limiter`, `Budgets`, `Trees` and search counter every worker
shares; on a `MemoryStore`, their memory twins (`fleet.limits.backends.memory`), one set
per store, so an in-process fleet keeps the same limits, budgets and fan-out caps.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from fleet.limits.backends.memory.limiter import LimitState, MemoryLimiter
from fleet.limits.backends.memory.searches import MemorySearchCounter
from fleet.limits.backends.memory.trees import MemoryBudgets, MemoryTrees
from fleet.limits.backends.redis.budgets import Budgets
from fleet.limits.backends.redis.limiter import Limiter
from fleet.limits.backends.redis.searches import RedisSearchCounter
from fleet.limits.backends.redis.trees import Trees
from fleet.limits.budget import BudgetState
from fleet.limits.protocols import ProviderLimits, TreeBudgets, TreeSchedules
from fleet.limits.searches import SearchCounter
from fleet.storage.capability import Capability
from fleet.storage.store import Services


@dataclass(frozen=True)
class Limits:
    """Everything fleet-wide a model call, a spawn or a search is held to."""

    limiter: ProviderLimits
    budgets: TreeBudgets
    trees: TreeSchedules
    searches: SearchCounter


def _on_redis(client: redis.Redis) -> Limits:
    return Limits(Limiter(client), Budgets(client), Trees(client), RedisSearchCounter(client))


def _in_memory() -> Limits:
    state = LimitState()  # a pause set by the limiter holds the budgets' reservations too
    return Limits(MemoryLimiter(state), MemoryBudgets(state), MemoryTrees(), MemorySearchCounter())


LIMITS = Capability("limits", _on_redis, _in_memory)


def budget_state(store: Services, root_trace_id: str) -> BudgetState | None:
    """A tree's budget now, from the limits its store keeps (None: the tree has none)."""
    return store.capability(LIMITS).budgets.state(root_trace_id)

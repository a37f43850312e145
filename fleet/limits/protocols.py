"""The limits' seams: provider limits, tree budgets and tree schedules, each a Protocol.

Each has a Redis implementation in `backends/redis` (`Limiter`, `Budgets`, `Trees`: one
Lua script per decision) and a memory twin in `backends/memory` that decides the same way
in Python; `capability.LIMITS` is how a store builds the ones that fit it. The tests of
each run against both (tests/test_limits.py, test_budget.py, test_fanout.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fleet.limits.budget import Budget, BudgetState, Reservation
from fleet.limits.providers import Admission, Refused, Scope
from fleet.limits.trees import Schedule
from fleet.llm.ratelimit import RateSignal


class ProviderLimits(Protocol):
    """Requests/min, tokens/min, concurrency and pauses per scope, shared by the fleet."""

    @property
    def max_wait_s(self) -> float:
        """The longest a worker thread sleeps on a limit for one call."""
        ...

    def admit(self, holder: str, scopes: tuple[Scope, ...], est_tokens: int) -> Admission:
        """Book a call of `est_tokens` for `holder` (a trace id) in every scope."""
        ...

    def send(self, holder: str, scopes: tuple[Scope, ...]) -> Refused | None:
        """Right before a booked call leaves: None (go, its send is logged), or not yet."""
        ...

    def paused(self, scopes: tuple[Scope, ...]) -> Refused | None:
        """A call no limit books, whose provider is paused: not now (None: go)."""
        ...

    def held(self, scopes: tuple[Scope, ...], pause_left_s: float) -> Refused | None:
        """A call no limit books, whose provider pause runs `pause_left_s` more: not now."""
        ...

    def count_waited(self, scopes: tuple[Scope, ...]) -> None:
        """Count a call held back by a pause (`fleet metrics`)."""
        ...

    def settle(
        self,
        holder: str,
        scopes: tuple[Scope, ...],
        est_tokens: int,
        used_tokens: int | None,
        duration_ms: int | None,
    ) -> None:
        """Give the slot back and correct the token booking by what the call really used."""
        ...

    def pause(self, scope: Scope, pause_s: float, why: str = "paused") -> None:
        """Hold every worker back from this provider for `pause_s`."""
        ...

    def overloaded(self, scopes: tuple[Scope, ...], retry_after_s: float | None) -> float:
        """A 429/503/529: pause the provider scopes; the seconds to wait before asking again."""
        ...

    def observe(self, scopes: tuple[Scope, ...], signal: RateSignal | None) -> None:
        """Headers saying the provider has nothing left pause it until one unit is back."""
        ...

    def stats(self) -> dict[str, int]:
        """`{what}:{scope}` -> count, for `fleet metrics`."""
        ...


class TreeBudgets(Protocol):
    """Every tree's budget: reserved before each model call, settled after it."""

    def create(self, root_trace_id: str, budget: Budget) -> None:
        """Write a new tree's budget (before its root is enqueued)."""
        ...

    def has(self, root_trace_id: str) -> bool:
        """Whether the tree has a budget."""
        ...

    def learn(self, root_trace_id: str, budgeted: bool) -> None:
        """Whether the tree has a budget, as a read made anyway found it (`begin_run`).

        A tree's budget is written before its root exists and stays for the tree's life,
        so `has` need not ask again.
        """
        ...

    def reserve(
        self,
        trace_id: str,
        root_trace_id: str,
        est_tokens: int,
        est_usd: float,
        pause_keys: Sequence[str] = (),
    ) -> Reservation:
        """Reserve one call's estimate; `Exhausted` once the tree is spent."""
        ...

    def settle(
        self,
        trace_id: str,
        root_trace_id: str,
        used_tokens: int,
        used_usd: float,
        *,
        final_refund: bool = False,
    ) -> None:
        """Replace the call's reservation by its real usage (0 for a call that failed)."""
        ...

    def release(self, trace_id: str, root_trace_id: str) -> None:
        """The trace ended: what it still holds goes, and the root's set-aside with the root."""
        ...

    def rearm(self, root_trace_id: str) -> None:
        """The root is continued: its set-aside final turn is kept again (unless used)."""
        ...

    def spawn(self, root_trace_id: str, children: int, depth: int) -> str | None:
        """Count `children` new sub-agents at `depth`; a refusal for the model, or None."""
        ...

    def deadline_ms(self, root_trace_id: str) -> int | None:
        """When the tree's `wall_s` runs out (ms), if it has one."""
        ...

    def state(self, root_trace_id: str) -> BudgetState | None:
        """The tree's budget now, or None if it has none."""
        ...


class TreeSchedules(Protocol):
    """Each tree's schedule (max_concurrent, priority) and its run window."""

    def create(self, root_trace_id: str, schedule: Schedule) -> None:
        """Record a new tree's schedule (nothing for the default one)."""
        ...

    def schedule(self, root_trace_id: str) -> Schedule:
        """The tree's schedule."""
        ...

    def window(
        self, root_trace_id: str, limit: int, *, ended: str = "", new: tuple[str, ...] = ()
    ) -> list[str]:
        """Free `ended`'s slot, queue `new` children; the children to start now, in order."""
        ...

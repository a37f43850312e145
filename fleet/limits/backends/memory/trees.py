"""Each tree's budget, schedule and run window in memory: `MemoryStore`'s twins.

`MemoryBudgets` decides what `BUDGET_RESERVE`, `BUDGET_SETTLE` and `BUDGET_SPAWN` decide,
`MemoryTrees` what `WINDOW` does (`fleet.limits.backends.redis.scripts`); provider pauses
and the counters are the limiter's (`fleet.limits.backends.memory.limiter.LimitState`),
shared with the budgets.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

from fleet.limits.backends.memory.limiter import LimitState
from fleet.limits.budget import (
    FINAL_SHARE,
    UNBUDGETED,
    Budget,
    BudgetState,
    Exhausted,
    Paused,
    Reservation,
    Reserved,
    budget_fields,
    spawn_refusal,
    state_of,
)
from fleet.limits.trees import DEFAULT_SCHEDULE, Schedule
from fleet.models import now_ms


class MemoryBudgets:
    """Tree budgets of one process: `backends.redis.budgets.Budgets` in memory."""

    def __init__(self, state: LimitState | None = None) -> None:
        """Share `state` (provider pauses, counters) with the limiter of the same store."""
        self._state = state or LimitState()
        self._budgets: dict[str, dict[str, Any]] = {}
        self._held: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)

    def create(self, root_trace_id: str, budget: Budget) -> None:
        """See `Budgets.create`."""
        with self._state.lock:
            self._budgets[root_trace_id] = budget_fields(budget)

    def has(self, root_trace_id: str) -> bool:
        """See `Budgets.has`."""
        with self._state.lock:
            return root_trace_id in self._budgets

    def learn(self, root_trace_id: str, budgeted: bool) -> None:
        """Nothing: this store's budgets are in this process."""

    def reserve(
        self,
        trace_id: str,
        root_trace_id: str,
        est_tokens: int,
        est_usd: float,
        pause_keys: Sequence[str] = (),
    ) -> Reservation:
        """See `Budgets.reserve` (BUDGET_RESERVE)."""
        with self._state.lock:
            data = self._budgets.get(root_trace_id)
            if data is None:
                return UNBUDGETED
            paused = self._state.left_ms(pause_keys)
            if paused > 0:
                return Paused(paused / 1000)
            held = self._held[root_trace_id]
            mine = held.pop(trace_id, None)
            why, newly = data.get("exhausted"), False
            if why is None:
                why = _over(data, held, est_tokens, est_usd)
                newly = why is not None
                if why is not None:
                    data["exhausted"] = why
            if why is None:
                held[trace_id] = (est_tokens, float(est_usd))
                return Reserved()
            if trace_id == root_trace_id and data.get("final_used") != "1":
                held[trace_id] = (_num(data, "final_tokens"), _num(data, "final_usd"))
                data.update(final_used="1", final_tokens=0, final_usd=0)
                return Reserved(final=True)
            if trace_id == root_trace_id and mine is not None:  # its final turn, run again
                held[trace_id] = mine
                return Reserved(final=True)
            if newly:
                self._state.stats[f"budget_exhausted:{why}"] += 1
            return Exhausted(str(why))

    def settle(
        self,
        trace_id: str,
        root_trace_id: str,
        used_tokens: int,
        used_usd: float,
        *,
        final_refund: bool = False,
    ) -> None:
        """See `Budgets.settle` (BUDGET_SETTLE)."""
        with self._state.lock:
            held = self._held[root_trace_id].pop(trace_id, None)
            data = self._budgets.get(root_trace_id)
            if data is None:
                return
            if final_refund and held is not None:
                data.update(final_used="0", final_tokens=held[0], final_usd=held[1])
            data["used_tokens"] = int(_num(data, "used_tokens")) + used_tokens
            data["used_usd"] = _num(data, "used_usd") + float(used_usd)

    def release(self, trace_id: str, root_trace_id: str) -> None:
        """See `Budgets.release` (BUDGET_RELEASE)."""
        with self._state.lock:
            self._held[root_trace_id].pop(trace_id, None)
            data = self._budgets.get(root_trace_id)
            if trace_id == root_trace_id and data is not None:
                data.update(final_tokens=0, final_usd=0)

    def rearm(self, root_trace_id: str) -> None:
        """See `Budgets.rearm` (BUDGET_RELEASE)."""
        with self._state.lock:
            data = self._budgets.get(root_trace_id)
            if data is None or data.get("final_used") == "1":
                return
            if "limit_tokens" in data:
                data["final_tokens"] = int(_num(data, "limit_tokens") * FINAL_SHARE)
            if "limit_usd" in data:
                data["final_usd"] = _num(data, "limit_usd") * FINAL_SHARE

    def spawn(self, root_trace_id: str, children: int, depth: int) -> str | None:
        """See `Budgets.spawn` (BUDGET_SPAWN)."""
        with self._state.lock:
            data = self._budgets.get(root_trace_id)
            if data is None:
                return None
            if why := data.get("exhausted"):
                return spawn_refusal(str(why), 0, children, depth)
            if "limit_depth" in data and depth > _num(data, "limit_depth"):
                return spawn_refusal("depth", 0, children, depth)
            used = int(_num(data, "used_sub_agents"))
            if "limit_sub_agents" in data:
                limit = int(_num(data, "limit_sub_agents"))
                if used + children > limit:
                    return spawn_refusal("sub_agents", limit - used, children, depth)
            data["used_sub_agents"] = used + children
            return None

    def deadline_ms(self, root_trace_id: str) -> int | None:
        """See `Budgets.deadline_ms`."""
        with self._state.lock:
            data = self._budgets.get(root_trace_id) or {}
            return int(_num(data, "deadline_ms")) if "deadline_ms" in data else None

    def state(self, root_trace_id: str) -> BudgetState | None:
        """See `Budgets.state`."""
        with self._state.lock:
            data = self._budgets.get(root_trace_id)
            if data is None:
                return None
            held = [f"{t} {d}" for t, d in self._held[root_trace_id].values()]
            return state_of({k: str(v) for k, v in data.items()}, held)


def _num(data: dict[str, Any], name: str) -> float:
    return float(data.get(name) or 0)


def _over(
    data: dict[str, Any], held: dict[str, tuple[float, float]], est: int, usd: float
) -> str | None:
    """Why one more call of `est` tokens and `usd` would spend past the budget, if it would."""
    tokens = sum(t for t, _ in held.values()) + _num(data, "final_tokens") + est
    dollars = sum(d for _, d in held.values()) + _num(data, "final_usd") + usd
    if "deadline_ms" in data and now_ms() >= _num(data, "deadline_ms"):
        return "wall_s"
    if "limit_tokens" in data and _num(data, "used_tokens") + tokens > _num(data, "limit_tokens"):
        return "tokens"
    if "limit_usd" in data and _num(data, "used_usd") + dollars > _num(data, "limit_usd"):
        return "usd"
    return None


class MemoryTrees:
    """Tree schedules and run windows of one process: `backends.redis.trees.Trees` in memory."""

    def __init__(self) -> None:
        """No tree yet."""
        self._lock = threading.Lock()
        self._schedules: dict[str, Schedule] = {}
        self._running: dict[str, set[str]] = defaultdict(set)
        self._pending: dict[str, deque[str]] = defaultdict(deque)

    def create(self, root_trace_id: str, schedule: Schedule) -> None:
        """See `Trees.create`."""
        if schedule != DEFAULT_SCHEDULE:
            with self._lock:
                self._schedules[root_trace_id] = schedule

    def schedule(self, root_trace_id: str) -> Schedule:
        """See `Trees.schedule`."""
        with self._lock:
            return self._schedules.get(root_trace_id, DEFAULT_SCHEDULE)

    def window(
        self, root_trace_id: str, limit: int, *, ended: str = "", new: tuple[str, ...] = ()
    ) -> list[str]:
        """See `Trees.window` (WINDOW)."""
        with self._lock:
            running, pending = self._running[root_trace_id], self._pending[root_trace_id]
            running.discard(ended)
            pending.extend(new)
            started: list[str] = []
            while len(running) < limit and pending:
                started.append(pending.popleft())
                running.add(started[-1])
            return started

"""The limits in memory: `MemoryStore`'s twins of the Redis limiter, budgets and trees.

Each method decides what its Lua script in `fleet.limits.limit_scripts` decides, step for
step (the comments name the script), on tables guarded by one lock per object, with this
process's clock instead of Redis's. The tests of the Redis ones run against these too
(tests/test_limits.py, test_budget.py, test_fanout.py), so the in-process fleet keeps the
same limits, budgets and fan-out caps as a fleet on Redis. Keys expire nowhere here: an
in-process fleet lives for one run.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from typing import Any

from fleet.limits import pacing
from fleet.limits.budget import (
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
from fleet.limits.providers import (
    MAX_PAUSE_S,
    MAX_WAIT_S,
    SLOT_TTL_S,
    Admission,
    LimiterPolicy,
    Refused,
    Scope,
    pause_keys,
)
from fleet.limits.trees import DEFAULT_SCHEDULE, Schedule
from fleet.models import now_ms
from fleet.storage import keys


class LimitState:
    """Provider pauses and the limits' counters, shared by the limiter and the budgets."""

    def __init__(self) -> None:
        """No pause, nothing counted."""
        self.lock = threading.RLock()
        self.pauses: dict[str, int] = {}
        """Pause key -> when it ends (ms)."""
        self.stats: Counter[str] = Counter()

    def left_ms(self, names: Sequence[str]) -> int:
        """The longest pause left among `names` (ms; 0 or less: none), as PTTL reads it."""
        now = now_ms()
        return max((self.pauses.get(name, 0) - now for name in names), default=0)


class MemoryLimiter(LimiterPolicy):
    """Provider limits of one process: `fleet.limits.providers.Limiter` in memory."""

    def __init__(self, state: LimitState | None = None, *, max_wait_s: float = MAX_WAIT_S) -> None:
        """Share `state` (pauses, counters) with the budgets of the same store."""
        super().__init__(max_wait_s)
        self._state = state or LimitState()
        self._scopes: dict[str, dict[str, float]] = defaultdict(dict)
        """Scope -> rtat, ttat, rnext, tnext, dur_ms (`keys.limit_state`)."""
        self._slots: dict[str, dict[str, float]] = defaultdict(dict)
        self._line: dict[str, dict[str, float]] = defaultdict(dict)
        self._seen: dict[str, dict[str, float]] = defaultdict(dict)
        self._sends: dict[str, list[float]] = defaultdict(list)
        self._tickets: dict[str, tuple[float, float]] = {}
        """Holder -> (booked turn, when the ticket lapses)."""

    def _count(self, what: str, scopes: tuple[Scope, ...]) -> None:
        for scope in scopes:
            self._state.stats[f"{what}:{scope.name}"] += 1

    def admit(self, holder: str, scopes: tuple[Scope, ...], est_tokens: int) -> Admission:
        """See `Limiter.admit` (LIMIT_ADMIT)."""
        with self._state.lock:
            ok, wait_ms, reason = self._admit(holder, scopes, est_tokens, now_ms())
        return self.admission(ok, wait_ms, reason)

    def _admit(
        self, holder: str, scopes: tuple[Scope, ...], est: int, now: int
    ) -> tuple[int, int, str]:
        paused = self._state.left_ms([keys.limit_pause(s.name) for s in scopes])
        if paused > 0:
            self._count("waited", scopes)
            return 0, paused, "pause"
        for scope in scopes:
            full = self._line_wait(holder, scope, now)
            if full is not None:
                self._count("waited", scopes)
                return 0, full, "concurrency"
        return self._turn(holder, scopes, est, now)

    def _line_wait(self, holder: str, scope: Scope, now: int) -> int | None:
        """The wait of a holder behind a full concurrency line, None when it may go."""
        most = scope.limits.max_concurrency or 0
        slots, line, seen = self._slots[scope.name], self._line[scope.name], self._seen[scope.name]
        if most <= 0 or holder in slots:
            return None
        for gone in [h for h, deadline in slots.items() if deadline <= now]:
            del slots[gone]
        for gone in [h for h, at in seen.items() if at <= now - keys.LIMIT_LINE_STALE_MS]:
            line.pop(gone, None)
            del seen[gone]
        free = most - len(slots)
        order = sorted(line, key=lambda h: (line[h], h))
        ahead = order.index(holder) if holder in line else len(line)
        if ahead < free:
            return None
        line.setdefault(holder, now)
        seen[holder] = now
        mean = self._scopes[scope.name].get("dur_ms", 0) or 1000
        return math.floor(mean * (ahead - free + 1) / most) + 1

    def _turn(
        self, holder: str, scopes: tuple[Scope, ...], est: int, now: int
    ) -> tuple[int, int, str]:
        """The GCRA turn of an admitted call: booked once, kept as a ticket while far."""
        specs = [(s, float(s.args()[1]), s.ms_per_token) for s in scopes]
        ticket = self._tickets.get(holder)
        at = ticket[0] if ticket is not None and ticket[1] > now else None
        if at is None:
            at = now
            for scope, per_request, per_token in specs:
                state = self._scopes[scope.name]
                at = max(at, state.get("rtat", 0) if per_request > 0 else at)
                at = max(at, state.get("ttat", 0) if per_token > 0 else at)
            for scope, per_request, per_token in specs:
                state = self._scopes[scope.name]
                if per_request > 0:
                    state["rtat"] = at + per_request
                if per_token > 0:
                    state["ttat"] = at + est * per_token
        go = at
        for scope, per_request, per_token in specs:
            state = self._scopes[scope.name]
            go = max(go, state.get("rnext", 0) if per_request > 0 else go)
            go = max(go, state.get("tnext", 0) if per_token > 0 else go)
        wait = go - now
        if wait > self._max_wait_ms:
            self._tickets[holder] = (at, now + wait + keys.LIMIT_TICKET_GRACE_MS)
            self._count("waited", scopes)
            return 0, math.floor(wait), "rate"
        go = max(go, now)
        for scope, per_request, per_token in specs:
            self._book(holder, scope, go, est, per_request, per_token)
        self._tickets.pop(holder, None)
        self._count("admitted", scopes)
        return 1, math.floor(max(wait, 0)), "ok"

    def _book(
        self, holder: str, scope: Scope, go: float, est: int, per_request: float, per_token: float
    ) -> None:
        state = self._scopes[scope.name]
        if per_request > 0:
            state["rnext"] = go + per_request
        if per_token > 0:
            state["tnext"] = go + est * per_token
        if scope.limits.max_concurrency:
            self._slots[scope.name][holder] = go + SLOT_TTL_S * 1000
            self._line[scope.name].pop(holder, None)
            self._seen[scope.name].pop(holder, None)

    def send(self, holder: str, scopes: tuple[Scope, ...]) -> Refused | None:
        """See `Limiter.send` (LIMIT_SEND)."""
        with self._state.lock:
            now = now_ms()
            paused = self._state.left_ms([keys.limit_pause(s.name) for s in scopes])
            if paused > 0:
                return Refused(paused / 1000, "pause")
            windows = [
                (s, *pacing.send_window(s.limits.requests_per_minute or 0, s.margin_s))
                for s in scopes
            ]
            wait = 0.0
            for scope, window, most in windows:
                if most > 0:
                    sends = [t for t in self._sends[scope.name] if t > now - window]
                    self._sends[scope.name] = sends
                    if len(sends) >= most:
                        wait = max(wait, sorted(sends)[len(sends) - most] + window - now)
            if wait > 0:
                return Refused(math.ceil(wait) / 1000, "window")
            for scope, _, most in windows:
                if most > 0:
                    self._sends[scope.name].append(now)
            return None

    def paused(self, scopes: tuple[Scope, ...]) -> Refused | None:
        """See `Limiter.paused`."""
        names = pause_keys(scopes)
        if not names:
            return None
        with self._state.lock:
            left_ms = self._state.left_ms(names)
        return self.held(scopes, left_ms / 1000)

    def count_waited(self, scopes: tuple[Scope, ...]) -> None:
        """See `Limiter.count_waited`."""
        with self._state.lock:
            self._count("waited", scopes)

    def settle(
        self,
        holder: str,
        scopes: tuple[Scope, ...],
        est_tokens: int,
        used_tokens: int | None,
        duration_ms: int | None,
    ) -> None:
        """See `Limiter.settle` (LIMIT_SETTLE)."""
        with self._state.lock:
            for scope in scopes:
                self._slots[scope.name].pop(holder, None)
                state = self._scopes[scope.name]
                if scope.ms_per_token > 0 and state:
                    delta = ((used_tokens or 0) - est_tokens) * scope.ms_per_token
                    state["ttat"] = state.get("ttat", 0) + delta
                    state["tnext"] = state.get("tnext", 0) + delta
                if duration_ms is not None and duration_ms >= 0:
                    mean = state.get("dur_ms", duration_ms)
                    state["dur_ms"] = mean * 0.8 + duration_ms * 0.2

    def pause(self, scope: Scope, pause_s: float, why: str = "paused") -> None:
        """See `Limiter.pause` (LIMIT_PAUSE)."""
        pause_ms = math.ceil(min(pause_s, MAX_PAUSE_S) * 1000)
        if pause_ms <= 0:
            return
        with self._state.lock:
            now = now_ms()
            name = keys.limit_pause(scope.name)
            self._state.pauses[name] = max(self._state.pauses.get(name, 0), now + pause_ms)
            state = self._scopes[scope.name]
            for field in ("rtat", "ttat", "rnext", "tnext"):
                state[field] = max(state.get(field, 0), now + pause_ms)
            self._state.stats[f"{why}:{scope.name}"] += 1

    def stats(self) -> dict[str, int]:
        """See `Limiter.stats`."""
        with self._state.lock:
            return dict(self._state.stats)


class MemoryBudgets:
    """Tree budgets of one process: `fleet.limits.budget.Budgets` in memory."""

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
            held.pop(trace_id, None)
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
    """Tree schedules and run windows of one process: `fleet.limits.trees.Trees` in memory."""

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

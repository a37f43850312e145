"""Provider limits in memory: `MemoryStore`'s twin of the Redis limiter.

Each method decides what its Lua script in `fleet.limits.backends.redis.scripts` decides,
step for step (each docstring names the script), on tables guarded by one lock, with this
process's
clock instead of Redis's. The tests of the Redis limiter run against this one too
(tests/test_limits.py), so the in-process fleet keeps the same provider limits as a fleet
on Redis; budgets and run windows are in `trees` beside it. Nothing expires here: an
in-process fleet lives for one run.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, defaultdict
from collections.abc import Sequence

from fleet.limits import pacing
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
    """Provider limits of one process: `fleet.limits.backends.redis.limiter.Limiter` in memory."""

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

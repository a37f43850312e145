"""The fleet-wide provider limiter on Redis: `fleet.limits.providers` says what it decides."""

from __future__ import annotations

import math
import time

import redis

from fleet.limits import pacing
from fleet.limits.backends.redis import scripts as limit_scripts
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
from fleet.storage import keys


class Limiter(LimiterPolicy):
    """The fleet-wide limiter on one Redis (decoded responses)."""

    def __init__(self, client: redis.Redis, *, max_wait_s: float = MAX_WAIT_S) -> None:
        """Register the scripts; `max_wait_s` bounds a worker thread's sleep."""
        super().__init__(max_wait_s)
        self._client = client
        self._admit = client.register_script(limit_scripts.LIMIT_ADMIT)
        self._settle = client.register_script(limit_scripts.LIMIT_SETTLE)
        self._pause = client.register_script(limit_scripts.LIMIT_PAUSE)
        self._send = client.register_script(limit_scripts.LIMIT_SEND)

    def admit(self, holder: str, scopes: tuple[Scope, ...], est_tokens: int) -> Admission:
        """Book a call of `est_tokens` for `holder` (a trace id) in every scope: one round trip."""
        script_keys = [keys.limit_ticket(holder), keys.limit_stats()]
        args: list[str | int | float] = [holder, est_tokens, self._max_wait_ms]
        args.append(int(SLOT_TTL_S * 1000))
        args += [keys.LIMIT_TICKET_GRACE_MS, keys.LIMIT_LINE_STALE_MS, keys.LIMIT_STATE_TTL_S]
        for scope in scopes:
            name = scope.name
            script_keys += [keys.limit_state(name), keys.limit_slots(name), keys.limit_line(name)]
            script_keys += [keys.limit_seen(name), keys.limit_pause(name)]
            args += scope.args()
        ok, wait_ms, reason = self._admit(keys=script_keys, args=args)
        return self.admission(ok, wait_ms, reason)

    def send(self, holder: str, scopes: tuple[Scope, ...]) -> Refused | None:
        """Right before a booked call leaves: None (go, its send is logged), or not yet.

        Refused for a pause set since the call was admitted, or because its scope's send
        window already holds the provider's limit (`pacing.send_window`): one round trip.
        """
        script_keys: list[str] = []
        args: list[str | int | float] = [f"{holder}:{time.time_ns()}"]
        for scope in scopes:
            script_keys += [keys.limit_pause(scope.name), keys.limit_sends(scope.name)]
            per_minute = scope.limits.requests_per_minute or 0
            args += pacing.send_window(per_minute, scope.margin_s)
        ok, wait_ms, reason = self._send(keys=script_keys, args=args)
        if int(ok) == 1:
            return None
        return Refused(int(wait_ms) / 1000, str(reason))

    def paused(self, scopes: tuple[Scope, ...]) -> Refused | None:
        """Is the provider of a call no limit books paused? One command of its own.

        For a call whose runner did not read the pause in its last store round trip (see
        `held`). A pause set by any worker's 429/503/529 (or exhausted headers) holds this
        call back as it would a booked one; nothing else is read or written.
        """
        names = pause_keys(scopes)
        if not names:
            return None
        if len(names) == 1:
            left_ms = [self._client.pttl(names[0])]
        else:
            pipe = self._client.pipeline(transaction=False)
            for name in names:
                pipe.pttl(name)
            left_ms = pipe.execute()
        return self.held(scopes, max(int(left) for left in left_ms) / 1000)

    def count_waited(self, scopes: tuple[Scope, ...]) -> None:
        """Count a call held back by a pause, as `admit` does (`fleet metrics`)."""
        pipe = self._client.pipeline(transaction=False)
        for scope in scopes:
            pipe.hincrby(keys.limit_stats(), f"waited:{scope.name}", 1)
        pipe.execute()

    def settle(
        self,
        holder: str,
        scopes: tuple[Scope, ...],
        est_tokens: int,
        used_tokens: int | None,
        duration_ms: int | None,
    ) -> None:
        """Give the slot back and correct the token booking by what the call really used.

        `used_tokens` None (the call failed before the provider counted it) refunds the
        whole booking; `duration_ms` None leaves the mean call time alone.
        """
        script_keys: list[str] = []
        args: list[str | int | float] = [holder, est_tokens, used_tokens or 0]
        args += [-1 if duration_ms is None else duration_ms, keys.LIMIT_STATE_TTL_S]
        for scope in scopes:
            script_keys += [keys.limit_state(scope.name), keys.limit_slots(scope.name)]
            args.append(scope.ms_per_token)
        self._settle(keys=script_keys, args=args)

    def pause(self, scope: Scope, pause_s: float, why: str = "paused") -> None:
        """Hold every worker back from this provider for `pause_s` (at most `MAX_PAUSE_S`)."""
        script_keys = [keys.limit_state(scope.name), keys.limit_pause(scope.name)]
        script_keys.append(keys.limit_stats())
        pause_ms = math.ceil(min(pause_s, MAX_PAUSE_S) * 1000)
        args: list[str | int] = [pause_ms, keys.LIMIT_STATE_TTL_S]
        self._pause(keys=script_keys, args=[*args, scope.name, why])

    def stats(self) -> dict[str, int]:
        """`{what}:{scope}` -> count, for `fleet metrics`."""
        return {str(k): int(v) for k, v in self._client.hgetall(keys.limit_stats()).items()}

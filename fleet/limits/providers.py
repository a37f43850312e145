"""Provider limits shared by every worker: requests/min, tokens/min and concurrency in Redis.

Each model call with a limit is admitted before it is sent, counted as it leaves and settled
after it (`Limiter.admit` / `Limiter.send` / `Limiter.settle`), one Lua script each
(`fleet.limits.backends.redis.scripts`). A scope
is a provider and its key (`provider:NAME:KEYHASH`) or a model alias (`model:ALIAS`), each with
the `limits:` of fleet.yaml. The provider scope exists even without `limits:`: a 429/503/529
pauses it for every worker (`Limiter.pause`), and rate-limit headers that say nothing is left
do the same (`Limiter.observe`). A call that no scope limits books nothing: it only checks
that pause, and settles nothing. The runner has the pause read by its last store round trip
before the call (`fleet.storage.writes.PauseRead`; `Limiter.held`); without one it costs a command
of its own (`Limiter.paused`).

Pacing is GCRA without burst: each admission books the next free time of every scope it
needs, so calls are spread evenly at the configured rate, less a margin for jitter
(`fleet.limits.pacing`), and booked in arrival order. An
admission more than `max_wait_s` away is kept as a ticket for the trace; the caller hands the
trace back (the worker re-enqueues it with a countdown) and takes its booked turn when it
returns. No worker thread sleeps longer than `max_wait_s` on a limit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from fleet.limits import pacing
from fleet.llm.config import FleetConfig, RateLimits, resolve_target
from fleet.llm.ratelimit import RateSignal
from fleet.storage import keys

NO_LIMITS = RateLimits()

MAX_WAIT_S = 1.0
"""The longest a worker thread sleeps for its booked turn; later turns hand the trace back."""
SLOT_TTL_S = 300.0
"""A concurrency slot lapses this long after admission if its holder never settles (died)."""
MAX_PAUSE_S = 60.0
"""The longest one answer pauses a provider for (its headers may say anything); a provider
still refusing after it is paused again by the next refusal."""
OVERLOAD_PAUSE_S = 1.0
"""How long a 429/503/529 without retry-after pauses the provider."""
CHARS_PER_TOKEN = 3
"""Input estimate: one token per 3 characters of the request (English runs ~4: it over-books
a little rather than under-books)."""


@dataclass(frozen=True)
class Scope:
    """One thing that is limited: a provider+key or a model alias."""

    name: str
    limits: RateLimits
    provider: bool
    """Provider scopes take pauses and header corrections (they are per key)."""

    @property
    def limited(self) -> bool:
        """True when fleet.yaml sets a rate or concurrency limit here: calls are booked."""
        lim = self.limits
        return bool(lim.requests_per_minute or lim.tokens_per_minute or lim.max_concurrency)

    def args(self) -> list[str | int | float]:
        """The script's per-scope arguments: name, ms per request, ms per token, concurrency.

        The spacings are `fleet.limits.pacing`'s, margin for jitter included (0: no limit).
        """
        lim = self.limits
        per_request = pacing.spacing_ms(lim.requests_per_minute or 0, margin_s=self.margin_s)
        return [self.name, per_request, self.ms_per_token, lim.max_concurrency or 0]

    @property
    def margin_s(self) -> float:
        """The lateness a call may have and still fit the provider's window (`pacing`)."""
        margin_ms = self.limits.jitter_margin_ms
        return pacing.JITTER_MARGIN_S if margin_ms is None else margin_ms / 1000

    @property
    def ms_per_token(self) -> float:
        """How long one token holds the scope's token line (0.0: no token limit)."""
        return pacing.spacing_ms(self.limits.tokens_per_minute or 0, margin_s=self.margin_s)


@dataclass(frozen=True)
class Admitted:
    """Go, after `wait_s` (at most `MAX_WAIT_S`): the booked turn."""

    wait_s: float
    kind: Literal["admitted"] = "admitted"


@dataclass(frozen=True)
class Refused:
    """Not now: ask again in `retry_in_s` (a pause, a full concurrency line, a later turn)."""

    retry_in_s: float
    reason: str
    kind: Literal["refused"] = "refused"


Admission = Admitted | Refused


def scopes_for(config: FleetConfig, model_name: str, env: Mapping[str, str]) -> tuple[Scope, ...]:
    """The scopes a call to `model_name` counts against; none for `scripted:` models."""
    target = resolve_target(config, model_name)
    if target.kind == "scripted":
        return ()
    provider = config.providers[target.provider]
    key = env.get(target.api_key_env, "") if target.api_key_env else ""
    # A digest, never the key: scope names show up in Redis and in `fleet metrics`.
    digest = hashlib.sha256(key.encode()).hexdigest()[:12] if key else "nokey"
    scopes = [Scope(f"provider:{target.provider}:{digest}", provider.limits or NO_LIMITS, True)]
    alias = config.models.get(model_name)
    if alias is not None and alias.limits is not None:
        scopes.append(Scope(f"model:{model_name}", alias.limits, False))
    return tuple(scopes)


def booked(scopes: tuple[Scope, ...]) -> bool:
    """Whether a call in these scopes is booked (admit + settle) or only checks the pause."""
    return any(scope.limited for scope in scopes)


def pause_keys(scopes: tuple[Scope, ...]) -> list[str]:
    """The pause keys a call in these scopes must respect (provider scopes only)."""
    return [keys.limit_pause(scope.name) for scope in scopes if scope.provider]


class LimiterPolicy:
    """What every limiter decides the same way on top of its own `pause` and counters.

    `Limiter` keeps the state in Redis, `fleet.limits.backends.memory.limiter.MemoryLimiter`
    in memory.
    """

    def __init__(self, max_wait_s: float) -> None:
        """`max_wait_s` bounds a worker thread's sleep."""
        self._max_wait_ms = int(max_wait_s * 1000)

    @property
    def max_wait_s(self) -> float:
        """The longest a worker thread sleeps on a limit for one call."""
        return self._max_wait_ms / 1000

    def admission(self, ok: int, wait_ms: int, reason: str) -> Admission:
        """The admit script's answer `{ok, wait_ms, reason}` as an `Admission`."""
        wait_s = int(wait_ms) / 1000
        if int(ok) == 1:
            return Admitted(wait_s)
        if reason == "rate":  # come back a little early and sleep the rest of the way
            wait_s -= self._max_wait_ms / 2000
        return Refused(max(wait_s, 0.001), str(reason))

    def held(self, scopes: tuple[Scope, ...], pause_left_s: float) -> Refused | None:
        """A call no limit books, whose provider pause runs `pause_left_s` more: not now.

        None when the pause is over (0 or less); else the wait is counted (`fleet metrics`).
        """
        if pause_left_s <= 0:
            return None
        self.count_waited(scopes)
        return Refused(pause_left_s, "pause")

    def count_waited(self, scopes: tuple[Scope, ...]) -> None:
        """Count a call held back by a pause, as `admit` does (`fleet metrics`)."""
        raise NotImplementedError

    def pause(self, scope: Scope, pause_s: float, why: str = "paused") -> None:
        """Hold every worker back from this provider for `pause_s` (at most `MAX_PAUSE_S`)."""
        raise NotImplementedError

    def overloaded(self, scopes: tuple[Scope, ...], retry_after_s: float | None) -> float:
        """A 429/503/529: pause the provider scopes; the seconds to wait before asking again."""
        asked_s = OVERLOAD_PAUSE_S if retry_after_s is None else retry_after_s
        pause_s = min(max(asked_s, 0.001), MAX_PAUSE_S)
        for scope in scopes:
            if scope.provider:
                self.pause(scope, pause_s, "overloaded")
        return pause_s

    def observe(self, scopes: tuple[Scope, ...], signal: RateSignal | None) -> None:
        """Headers saying the provider has nothing left pause it until one unit is back."""
        pause_s = signal.pause_s() if signal is not None else None
        if not pause_s:
            return
        for scope in scopes:
            if scope.provider:
                self.pause(scope, pause_s, "exhausted")

"""Before and after every model call: the provider limits every worker shares.

The runner asks `Gate.before` ahead of each call and gets `Go` (send, after a wait of at
most a second) or `Wait` (hand the trace back; ask again in `retry_in_s`). After the call,
`Gate.after` settles what was booked with what was used; a 429/503/529 goes to
`Gate.overloaded`, which pauses the provider for the whole fleet.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from fleet.errors import ProviderOverloaded
from fleet.limits import Limiter, Scope, estimate_tokens, scopes_for
from fleet.llm.base import LLMResponse
from fleet.llm.config import FleetConfig
from fleet.store import TraceStore

DEFAULT_OUTPUT_BOOKING = 4096
"""Tokens booked for the answer of a model without `max_output_tokens` in fleet.yaml."""


@dataclass(frozen=True)
class Go:
    """Send the call after `wait_s`; hand this back to `after`."""

    holder: str
    scopes: tuple[Scope, ...]
    est_tokens: int
    max_output_tokens: int | None
    """What to send as `max_tokens` (None: the provider's default)."""
    wait_s: float = 0.0
    kind: Literal["go"] = "go"


@dataclass(frozen=True)
class Wait:
    """Not now: the trace is handed back and asks again in `retry_in_s`."""

    retry_in_s: float
    reason: str
    kind: Literal["wait"] = "wait"


Verdict = Go | Wait


class Gate:
    """Provider limits in front of the model calls of one process."""

    def __init__(
        self, config: FleetConfig, env: Mapping[str, str], limiter: Limiter | None = None
    ) -> None:
        """No `limiter` (in-process runs): every call goes at once."""
        self.config = config
        self.limiter = limiter
        self._env = env
        self._scopes: dict[str, tuple[Scope, ...]] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_store(cls, store: TraceStore, config: FleetConfig, env: Mapping[str, str]) -> Gate:
        """A gate on the store's Redis, or none for the in-memory store."""
        from fleet.redis_store import RedisStore

        limiter = Limiter(store.client) if isinstance(store, RedisStore) else None
        return cls(config, env, limiter)

    def scopes(self, model_name: str) -> tuple[Scope, ...]:
        """The scopes of a model, resolved once per process."""
        with self._lock:
            if model_name not in self._scopes:
                try:
                    self._scopes[model_name] = scopes_for(self.config, model_name, self._env)
                except Exception:  # a model the config cannot name (a test's client): unlimited
                    self._scopes[model_name] = ()
            return self._scopes[model_name]

    def max_output_tokens(self, model_name: str) -> int | None:
        """fleet.yaml's `max_output_tokens` of this alias, if any."""
        alias = self.config.models.get(model_name)
        return alias.max_output_tokens if alias is not None else None

    def before(self, holder: str, model_name: str, request_chars: int) -> Verdict:
        """Book the call of `holder` (a trace id): one Redis round trip when limited."""
        max_output = self.max_output_tokens(model_name)
        est = estimate_tokens(request_chars, max_output or DEFAULT_OUTPUT_BOOKING)
        scopes = self.scopes(model_name)
        go = Go(holder, scopes, est, max_output)
        if self.limiter is None or not scopes:
            return go
        admission = self.limiter.admit(holder, scopes, est)
        if admission.kind == "refused":
            return Wait(admission.retry_in_s, admission.reason)
        return Go(holder, scopes, est, max_output, admission.wait_s)

    def after(self, go: Go, response: LLMResponse | None, duration_ms: int | None) -> None:
        """Settle the booking: real usage (None: the call failed, refund it) and headers."""
        if self.limiter is None or not go.scopes:
            return
        used = None
        if response is not None:
            used = response.usage.prompt_tokens + response.usage.completion_tokens
        self.limiter.settle(go.holder, go.scopes, go.est_tokens, used, duration_ms)
        if response is not None:
            self.limiter.observe(go.scopes, response.rate)

    def overloaded(self, go: Go, exc: ProviderOverloaded) -> Wait:
        """Pause the provider for every worker; this trace waits out the pause."""
        if self.limiter is None or not go.scopes:
            raise exc
        self.after(go, None, None)
        pause_s = self.limiter.overloaded(go.scopes, exc.retry_after_s)
        return Wait(pause_s, f"overloaded ({exc.status})")

"""Before and after every model call: the tree's budget, then the provider limits.

The runner asks `Gate.before` ahead of each call and gets `Go` (send, after a wait of at
most a second), `Wait` (hand the trace back; ask again in `retry_in_s`) or `Spent` (the
tree's budget is used up: stop with what you have). A booked call asks `Gate.sending`
as it leaves: its send is counted in the provider's window, and a 429 elsewhere in the
meantime sends it back. After the call, `Gate.after` settles what was booked with what was
used; a 429/503/529 goes to `Gate.overloaded`, which pauses the provider for the whole
fleet.

Round trips per call, before + after: a provider without `limits:` only checks its pause
(0 + 0 when the runner's last store round trip before the call read it, see `pauses_for`;
else 1 + 0; inside the budget's reservation script when the tree has a budget: 1 + 1); a
limited one books, counts its send and settles (3; 2 without a requests/min limit when it
did not sleep on its turn; plus 2 with a budget);
`scripted:` models have no provider (0, or 1 + 1 with a budget).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from fleet.errors import ProviderOverloaded
from fleet.limits.budget import UNBUDGETED, Exhausted, Paused, Reserved
from fleet.limits.capability import LIMITS
from fleet.limits.protocols import ProviderLimits, TreeBudgets
from fleet.limits.providers import (
    CHARS_PER_TOKEN,
    Refused,
    Scope,
    booked,
    pause_keys,
    scopes_for,
)
from fleet.llm.base import LLMResponse
from fleet.llm.config import FleetConfig, resolve_target
from fleet.llm.pricing import cost_usd
from fleet.llm.vision import content_image_tokens
from fleet.models import Content, Message, Trace, text_of
from fleet.storage.store import Services
from fleet.storage.writes import PauseRead

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
    root_trace_id: str = ""
    budget: Reserved = UNBUDGETED
    """`budget.final`: the root's one last turn, after the tree's budget ran out."""
    model_name: str = ""
    booked: bool = False
    """The limiter booked this call (a scope has limits): `after` settles the booking."""
    kind: Literal["go"] = "go"


@dataclass(frozen=True)
class Wait:
    """Not now: the trace is handed back and asks again in `retry_in_s`."""

    retry_in_s: float
    reason: str
    kind: Literal["wait"] = "wait"


@dataclass(frozen=True)
class Spent:
    """The tree's budget is used up (`reason`: tokens, usd or wall_s): stop here."""

    reason: str
    kind: Literal["spent"] = "spent"


Verdict = Go | Wait | Spent


@dataclass(frozen=True)
class Terms:
    """What the gate asks of one model's calls in one tree, resolved once (`Gate.terms`).

    A run resolves them before its first call: each call then books without resolving its
    scopes, their pause keys or the tree's budget again.
    """

    model_name: str
    scopes: tuple[Scope, ...]
    max_output_tokens: int | None
    budgeted: bool
    """The tree has a budget (asked once per tree and process on Redis)."""
    limited: bool
    """A limiter books the call (a scope has limits); else it only checks its pauses."""
    pauses: tuple[str, ...]
    """The pause keys an unbooked call checks (none without a limiter)."""


class Gate:
    """Provider limits in front of the model calls of one process."""

    def __init__(
        self,
        config: FleetConfig,
        env: Mapping[str, str],
        limiter: ProviderLimits | None = None,
        budgets: TreeBudgets | None = None,
    ) -> None:
        """No `limiter` or `budgets`: every call goes at once."""
        self.config = config
        self.limiter = limiter
        self.budgets = budgets
        self._env = env
        self._scopes: dict[str, tuple[Scope, ...]] = {}
        self._tree_pauses: dict[str, tuple[str, ...]] = {}
        """Root trace id -> the pause keys its last call in this process checked."""
        self._lock = threading.Lock()

    @classmethod
    def for_store(cls, store: Services, config: FleetConfig, env: Mapping[str, str]) -> Gate:
        """A gate on the limits the store keeps (Redis, or their memory twins)."""
        limits = store.capability(LIMITS)
        return cls(config, env, limits.limiter, limits.budgets)

    def scopes(self, model_name: str) -> tuple[Scope, ...]:
        """The scopes of a model, resolved once per process."""
        with self._lock:
            if model_name not in self._scopes:
                try:
                    self._scopes[model_name] = scopes_for(self.config, model_name, self._env)
                except Exception:  # a model the config cannot name (a test's client): unlimited
                    self._scopes[model_name] = ()
            return self._scopes[model_name]

    def pauses_for(self, model_name: str, root_trace_id: str) -> tuple[str, ...]:
        """The pause keys a call of this model would check with a command of its own.

        The runner reads them in its last store round trip before the call and hands the
        read to `before`. None to read for a booked call (its admission checks them), a
        budgeted tree's (the reservation does), or without a limiter.
        """
        if self.limiter is None:
            return ()
        scopes = self.scopes(model_name)
        budgeted = self.budgets is not None and self.budgets.has(root_trace_id)
        found = () if booked(scopes) or budgeted else tuple(pause_keys(scopes))
        with self._lock:
            if len(self._tree_pauses) > 100_000:  # a long-lived worker sees many trees
                self._tree_pauses.clear()
            self._tree_pauses[root_trace_id] = found
        return found

    def learn_budget(self, root_trace_id: str, budgeted: bool | None) -> None:
        """Whether the tree has a budget, as `begin_run` read it (None: it did not)."""
        if budgeted is not None and self.budgets is not None:
            self.budgets.learn(root_trace_id, budgeted)

    def known_pauses(self, root_trace_id: str) -> tuple[str, ...]:
        """The pause keys `begin_run` reads for a trace of this tree, before its model is known.

        Those its tree's last call in this process checked; for a tree new here, those of
        every model this process called unbooked (a worker calls few). A call whose keys
        are not among them (the first of a model in a process) checks with a command.
        """
        if self.limiter is None:
            return ()
        with self._lock:
            if root_trace_id in self._tree_pauses:
                return self._tree_pauses[root_trace_id]
            resolved = list(self._scopes.values())
        return tuple(dict.fromkeys(k for s in resolved if not booked(s) for k in pause_keys(s)))

    def terms(self, model_name: str, root_trace_id: str) -> Terms:
        """What a call of this model in this tree is booked with (see `Terms`)."""
        scopes = self.scopes(model_name)
        limited = self.limiter is not None and booked(scopes)
        pauses = tuple(pause_keys(scopes)) if self.limiter is not None and not limited else ()
        budgeted = self.budgets is not None and self.budgets.has(root_trace_id)
        max_output = self.max_output_tokens(model_name)
        return Terms(model_name, scopes, max_output, budgeted, limited, pauses)

    def max_output_tokens(self, model_name: str) -> int | None:
        """fleet.yaml's `max_output_tokens` of this alias, if any."""
        alias = self.config.models.get(model_name)
        return alias.max_output_tokens if alias is not None else None

    def before(
        self,
        trace: Trace,
        model: str | Terms,
        request_chars: int,
        read: PauseRead | None = None,
        *,
        batch: bool = False,
    ) -> Verdict:
        """Reserve the tree's budget, then book the provider (or only check its pause).

        `model`: its name, or the terms a run resolved for it (`terms`). `read`: the
        pauses the runner's last store round trip read; an unbooked call that finds its
        pause keys there checks nothing more. `batch`: the call goes through the
        provider's Batch API, whose limits are its own (`fleet.batchapi`): the budget is
        reserved as for a live call, the live limits and pauses are not touched.
        """
        root = trace.root_trace_id
        terms = self.terms(model, root) if isinstance(model, str) else model
        model_name, max_output = terms.model_name, terms.max_output_tokens
        output = max_output or DEFAULT_OUTPUT_BOOKING
        est = estimate_tokens(request_chars, output)
        scopes = () if batch else terms.scopes
        go = Go(trace.trace_id, scopes, est, max_output, root_trace_id=root, model_name=model_name)
        limited = not batch and terms.limited
        # A call nothing books checks only its provider's pause: in the budget's script if
        # the tree has a budget (one round trip for both), else with one command below.
        pauses = [] if batch or limited else list(terms.pauses)
        if self.budgets is not None and terms.budgeted:
            usd = self.cost(model_name, request_chars // CHARS_PER_TOKEN, output)
            match self.budgets.reserve(trace.trace_id, root, est, usd, pauses):
                case Exhausted(reason=reason):
                    return Spent(reason)
                case Paused(retry_in_s=retry_in_s):
                    self._count_waited(go.scopes)
                    return Wait(retry_in_s, "pause")
                case Reserved() as reservation:
                    go, pauses = replace(go, budget=reservation), []
        if self.limiter is None or not go.scopes:
            return go
        if not limited:
            paused = self._paused(go.scopes, pauses, read) if pauses else None
            return go if paused is None else Wait(paused.retry_in_s, paused.reason)
        admission = self.limiter.admit(go.holder, go.scopes, est)
        if admission.kind == "refused":
            self._refund(go)
            return Wait(admission.retry_in_s, admission.reason)
        return replace(go, wait_s=admission.wait_s, booked=True)

    def _paused(
        self, scopes: tuple[Scope, ...], pauses: list[str], read: PauseRead | None
    ) -> Refused | None:
        """The pause check of an unbooked call: from the runner's read, else a command."""
        assert self.limiter is not None
        left_s = read.left_s(pauses) if read is not None else None
        if left_s is None:
            return self.limiter.paused(scopes)
        return self.limiter.held(scopes, left_s)

    def _count_waited(self, scopes: tuple[Scope, ...]) -> None:
        if self.limiter is not None:
            self.limiter.count_waited(scopes)

    def cost(self, model_name: str, prompt_tokens: int, completion_tokens: int) -> float:
        """What a call of this size costs on this model (0.0 when the price is unknown)."""
        try:
            target = resolve_target(self.config, model_name)
        except Exception:  # a test's client under a name the config cannot resolve
            return 0.0
        return cost_usd(
            target.model, prompt_tokens, completion_tokens, target.pricing, kind=target.kind
        )

    def ended(self, trace_id: str, root_trace_id: str, *, reopened: bool = False) -> None:
        """A trace's end: its budget's reservations go (`reopened`: a root continues).

        A call settles itself; this covers a settle that never came (a write refused by a
        failover, then a stop) and the root's unused set-aside, so an ended tree holds none.
        """
        if self.budgets is None or not self.budgets.has(root_trace_id):
            return
        if reopened:
            self.budgets.rearm(root_trace_id)
        else:
            self.budgets.release(trace_id, root_trace_id)

    def _refund(self, go: Go) -> None:
        """Nothing was used: the reservation goes (a final turn's set-aside comes back)."""
        if self.budgets is not None and go.budget.budgeted:
            final = go.budget.final
            self.budgets.settle(go.holder, go.root_trace_id, 0, 0.0, final_refund=final)

    def after(self, go: Go, response: LLMResponse | None, duration_ms: int | None) -> None:
        """Settle the booking: real usage (None: the call failed, refund it) and headers."""
        if response is None:
            self._refund(go)
        elif self.budgets is not None and go.budget.budgeted:
            usage = response.usage
            used = usage.prompt_tokens + usage.completion_tokens
            self.budgets.settle(go.holder, go.root_trace_id, used, usage.cost_usd)
        if self.limiter is None or not go.scopes:
            return
        used_tokens = None
        if response is not None:
            used_tokens = response.usage.prompt_tokens + response.usage.completion_tokens
        if go.booked:  # an unbooked call has nothing to give back
            self.limiter.settle(go.holder, go.scopes, go.est_tokens, used_tokens, duration_ms)
        if response is not None:
            self.limiter.observe(go.scopes, response.rate)

    def sending(self, go: Go) -> Wait | None:
        """Right before a booked call leaves (after its sleep): go (None), or not now.

        Its send is counted against the provider's window (a starved worker's late calls
        must not leave together), waiting out what the window asks within the thread's
        sleep allowance; a pause set meanwhile (a 429 elsewhere), or a longer wait, hands
        the call back and its booking is settled as unused. One round trip per try.
        """
        if self.limiter is None or not go.booked:
            return None
        if go.wait_s == 0 and not any(s.limits.requests_per_minute for s in go.scopes):
            return None  # no sends to count, and no sleep a pause could have begun in
        allowance_s = max(self.limiter.max_wait_s - go.wait_s, 0.0)
        while (refused := self.limiter.send(go.holder, go.scopes)) is not None:
            if refused.reason != "window" or refused.retry_in_s > allowance_s:
                self.after(go, None, None)
                return Wait(refused.retry_in_s, refused.reason)
            time.sleep(refused.retry_in_s)
            allowance_s -= refused.retry_in_s
        return None

    def overloaded(self, go: Go, exc: ProviderOverloaded) -> Wait:
        """Pause the provider for every worker; this trace waits out the pause."""
        if self.limiter is None or not go.scopes:
            raise exc
        # The pause first: every call that leaves before it is set goes into a full window.
        pause_s = self.limiter.overloaded(go.scopes, exc.retry_after_s)
        self.after(go, None, None)
        return Wait(pause_s, f"overloaded ({exc.status})")


def estimate_tokens(request_chars: int, max_output_tokens: int) -> int:
    """What a call books before it is sent: its input estimate plus the longest answer."""
    return math.ceil(request_chars / CHARS_PER_TOKEN) + max_output_tokens


FINAL_NOTE = (
    "The budget of this task is used up: this is your last turn. Do not call any tool. "
    "Answer now, as well as you can, from what you and your sub-agents have found so far, "
    "and say what is missing."
)


def last_answer(path: list[Message]) -> str | None:
    """The most recent assistant text on the path: what a run cut short has to show."""
    for message in reversed(path):
        if message.role == "assistant" and message.content:
            return text_of(message.content)
    return None


def request_chars(path: list[Message], tools: list[dict[str, Any]]) -> int:
    """The size of a request, for the token estimate a call books.

    The length `json.dumps` gives the tool calls and the tools, without encoding every
    schema each turn: the schemas are shared between turns (`tool_schemas`), so each one's
    length is kept (a message without tool calls counts as `""`, 2 characters, as before).
    """
    text = sum(
        _content_chars(m.content) + (len(json.dumps(m.tool_calls)) if m.tool_calls else 2)
        for m in path
    )
    separators = 2 * len(tools) if tools else 2  # "[", "]" and ", " between schemas
    return text + separators + sum(_schema_chars(schema) for schema in tools)


def _content_chars(content: Content) -> int:
    """Text as its length; an image as its tokens (the larger provider formula) x 4."""
    if content is None or isinstance(content, str):
        return len(content or "")
    return len(text_of(content)) + content_image_tokens(content) * 4


_SCHEMA_CHARS: dict[int, tuple[dict[str, Any], int]] = {}
"""id of a schema -> (the schema, kept so its id stays its own; its encoded length)."""
_SCHEMA_CHARS_MAX = 1024


def _schema_chars(schema: dict[str, Any]) -> int:
    """`len(json.dumps(schema))`, remembered for a schema dict that is shared."""
    known = _SCHEMA_CHARS.get(id(schema))
    if known is not None and known[0] is schema:
        return known[1]
    chars = len(json.dumps(schema))
    if len(_SCHEMA_CHARS) >= _SCHEMA_CHARS_MAX:  # schemas built per call: never reused
        _SCHEMA_CHARS.clear()
    _SCHEMA_CHARS[id(schema)] = (schema, chars)
    return chars

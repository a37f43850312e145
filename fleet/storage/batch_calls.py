"""The calls waiting on a provider's Batch API, in Redis and in memory (`fleet.batchapi`).

A call is one model turn of a trace (its custom id). Its request body is written once
(`keys.batch_calls()`); its state moves `queued -> submitting -> submitted -> answered`
(or `cancelled`) in `keys.batch_state()`, each move one Lua script, so a runner queuing, the
poller flushing and a stop cancelling never see half a move. The flush record
(`keys.batch_submitting()`) is written before the upload and swapped for the in-flight record
(`keys.batch_in_flight()`) after it: a poller that dies in between leaves the record for the
next one to reconcile with the provider. A call sent again (its batch expired, its request
errored) gets a new attempt number, so no wire id (`custom_id-attempt`) is sent twice.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from fleet.storage.backends.memory.batch_calls import MemoryBatchCalls
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.backends.redis.batch_calls import RedisBatchCalls
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.batch_types import CallState, CallStatus, Flush, PendingCall

__all__ = [
    "BatchCalls",
    "CallState",
    "CallStates",
    "CallStatus",
    "Flush",
    "Flushes",
    "MemoryBatchCalls",
    "PendingCall",
    "RedisBatchCalls",
    "batch_calls",
]


class CallStates(Protocol):
    """Each call on its own: queued with its body, its status, answered, cancelled, let go.

    What a run parks and takes back, and what a stop and the owner check ask of a call.
    """

    def enqueue(self, call: PendingCall, deadline_ms: int | None = None) -> bool: ...  # noqa: D102
    def overdue(self, at_ms: int, limit: int) -> list[str]: ...  # noqa: D102
    def calls(self, custom_ids: list[str]) -> list[PendingCall | None]: ...  # noqa: D102
    def statuses(self, custom_ids: list[str]) -> list[CallStatus | None]: ...  # noqa: D102
    def answer(self, custom_id: str, answer: dict[str, Any]) -> bool: ...  # noqa: D102
    def answer_of(self, custom_id: str) -> dict[str, Any] | None: ...  # noqa: D102
    def cancel(self, custom_id: str) -> str: ...  # noqa: D102
    def wake(self) -> None: ...  # noqa: D102
    def forget(self, custom_id: str) -> None: ...  # noqa: D102
    def release(self, custom_id: str) -> None: ...  # noqa: D102


class Flushes(Protocol):
    """Calls gathered into provider batches: the poller's side of the queue.

    The queue's order, the flush and in-flight records, and the claims that let one poller
    of the fleet work at a time.
    """

    def queued(self, limit: int) -> list[tuple[str, int]]: ...  # noqa: D102
    def begin_flush(self, flush: Flush) -> list[str]: ...  # noqa: D102
    def submitted(self, flush: Flush) -> None: ...  # noqa: D102
    def requeue(self, custom_ids: list[str], at_ms: int) -> None: ...  # noqa: D102
    def drop_flush(self, flush_id: str) -> None: ...  # noqa: D102
    def submitting(self) -> list[Flush]: ...  # noqa: D102
    def in_flight(self) -> list[Flush]: ...  # noqa: D102
    def batch_done(self, batch_id: str) -> None: ...  # noqa: D102
    def woken(self, timeout_s: float) -> bool: ...  # noqa: D102
    def claim(self, key: str, owner: str, ttl_ms: int) -> bool: ...  # noqa: D102
    def unclaim(self, key: str, owner: str) -> None: ...  # noqa: D102


class BatchCalls(CallStates, Flushes, Protocol):
    """The pending-call queue: both roles; `RedisBatchCalls` and `MemoryBatchCalls` implement it.

    A caller annotates the narrowest role it needs; the poller needs both.
    """


_KNOWN: dict[int, tuple[object, BatchCalls]] = {}
"""id of a Redis client or of a memory store's tables -> (that object, its queue)."""
_KNOWN_LOCK = threading.Lock()


def batch_calls(store: object) -> BatchCalls:
    """The pending-call queue of this store, one per Redis client or memory store.

    A fenced view shares its store's client (or tables), so it shares the queue too.
    """
    if isinstance(store, RedisStore):
        anchor: object = store.client
    elif isinstance(store, MemoryStore):
        anchor = store._lock  # every view of one memory store shares its lock and tables
    else:
        raise TypeError(f"no batch queue for {type(store).__name__}")
    with _KNOWN_LOCK:
        known = _KNOWN.get(id(anchor))
        if known is None or known[0] is not anchor:
            made: BatchCalls
            if isinstance(store, RedisStore):
                made = RedisBatchCalls(store.client)
            else:
                made = MemoryBatchCalls()
            known = _KNOWN[id(anchor)] = (anchor, made)
        return known[1]

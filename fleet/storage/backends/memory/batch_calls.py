"""The provider-batch call queue in this process (tests, `--inline`): `BatchCalls` in memory.

The same moves as `fleet.storage.backends.redis.batch_calls.RedisBatchCalls`, each under one lock.
"""

from __future__ import annotations

import threading
from typing import Any

from fleet.models import now_ms
from fleet.storage.batch_types import CallStatus, Flush, PendingCall


class MemoryBatchCalls:
    """The same queue in this process (tests, `--inline`); one lock, the same moves."""

    def __init__(self) -> None:
        """An empty queue."""
        self._lock = threading.Lock()
        self._calls: dict[str, PendingCall] = {}
        self._state: dict[str, CallStatus] = {}
        self._queued: dict[str, int] = {}
        self._submitting: dict[str, Flush] = {}
        self._in_flight: dict[str, Flush] = {}
        self._answers: dict[str, dict[str, Any]] = {}
        self._claims: dict[str, tuple[str, int]] = {}
        self._deadlines: dict[str, int] = {}
        self._wake = threading.Event()

    def enqueue(self, call: PendingCall, deadline_ms: int | None = None) -> bool:  # noqa: D102
        with self._lock:
            if call.custom_id in self._calls:
                return False
            self._calls[call.custom_id] = call
            self._state[call.custom_id] = CallStatus()
            self._queued[call.custom_id] = call.queued_at_ms
            if deadline_ms is not None:
                self._deadlines[call.custom_id] = deadline_ms
            return True

    def overdue(self, at_ms: int, limit: int) -> list[str]:  # noqa: D102
        with self._lock:
            due = sorted((d, c) for c, d in self._deadlines.items() if d <= at_ms)
            return [c for _, c in due[:limit]]

    def calls(self, custom_ids: list[str]) -> list[PendingCall | None]:  # noqa: D102
        with self._lock:
            return [self._calls.get(c) for c in custom_ids]

    def statuses(self, custom_ids: list[str]) -> list[CallStatus | None]:  # noqa: D102
        with self._lock:
            return [self._state[c].model_copy() if c in self._state else None for c in custom_ids]

    def queued(self, limit: int) -> list[tuple[str, int]]:  # noqa: D102
        with self._lock:
            return sorted(self._queued.items(), key=lambda item: (item[1], item[0]))[:limit]

    def begin_flush(self, flush: Flush) -> list[str]:  # noqa: D102
        with self._lock:
            moved = [c for c in flush.custom_ids if self._queued.pop(c, None) is not None]
            for custom_id in moved:
                self._state[custom_id].state = "submitting"
                self._state[custom_id].flush_id = flush.flush_id
            if moved:
                self._submitting[flush.flush_id] = flush.model_copy(update={"custom_ids": moved})
            return moved

    def submitted(self, flush: Flush) -> None:  # noqa: D102
        with self._lock:
            self._submitting.pop(flush.flush_id, None)
            self._in_flight[flush.batch_id] = flush
            for custom_id in flush.custom_ids:
                st = self._state.get(custom_id)
                if st is None or st.flush_id != flush.flush_id:
                    continue  # queued again meanwhile: not this batch's
                if st.state in ("submitting", "cancelled"):
                    st.batch_id = flush.batch_id
                    if st.state == "submitting":
                        st.state = "submitted"

    def requeue(self, custom_ids: list[str], at_ms: int) -> None:  # noqa: D102
        with self._lock:
            for custom_id in custom_ids:
                st = self._state.get(custom_id)
                if st is None or st.state in ("answered", "cancelled", "queued"):
                    continue
                st.state, st.attempt, st.flush_id, st.batch_id = "queued", st.attempt + 1, "", ""
                self._queued[custom_id] = at_ms

    def drop_flush(self, flush_id: str) -> None:  # noqa: D102
        with self._lock:
            self._submitting.pop(flush_id, None)

    def submitting(self) -> list[Flush]:  # noqa: D102
        with self._lock:
            return list(self._submitting.values())

    def in_flight(self) -> list[Flush]:  # noqa: D102
        with self._lock:
            return list(self._in_flight.values())

    def answer(self, custom_id: str, answer: dict[str, Any]) -> bool:  # noqa: D102
        with self._lock:
            st = self._state.get(custom_id)
            if st is None or st.state in ("answered", "cancelled"):
                return False
            st.state = "answered"
            self._queued.pop(custom_id, None)
            self._answers[custom_id] = answer
            return True

    def answer_of(self, custom_id: str) -> dict[str, Any] | None:  # noqa: D102
        with self._lock:
            return self._answers.get(custom_id)

    def cancel(self, custom_id: str) -> str:  # noqa: D102
        with self._lock:
            st = self._state.get(custom_id)
            self._deadlines.pop(custom_id, None)
            if st is None:
                return "gone"
            if st.state in ("submitting", "submitted"):
                st.state = "cancelled"
                return "cancelled"
            self._drop(custom_id)
            return "dropped"

    def forget(self, custom_id: str) -> None:  # noqa: D102
        with self._lock:
            self._drop(custom_id)

    def release(self, custom_id: str) -> None:  # noqa: D102
        with self._lock:
            self._calls.pop(custom_id, None)
            self._state.pop(custom_id, None)
            self._deadlines.pop(custom_id, None)

    def _drop(self, custom_id: str) -> None:
        for table in (self._calls, self._state, self._queued, self._answers, self._deadlines):
            table.pop(custom_id, None)

    def wake(self) -> None:  # noqa: D102
        self._wake.set()

    def woken(self, timeout_s: float) -> bool:  # noqa: D102
        came = self._wake.wait(timeout_s)
        self._wake.clear()
        return came

    def batch_done(self, batch_id: str) -> None:  # noqa: D102
        with self._lock:
            self._in_flight.pop(batch_id, None)

    def claim(self, key: str, owner: str, ttl_ms: int) -> bool:  # noqa: D102
        with self._lock:
            holder, until_ms = self._claims.get(key, ("", 0))
            if holder and until_ms > now_ms():
                return False
            self._claims[key] = (owner, now_ms() + ttl_ms)
            return True

    def unclaim(self, key: str, owner: str) -> None:  # noqa: D102
        with self._lock:
            if self._claims.get(key, ("", 0))[0] == owner:
                del self._claims[key]

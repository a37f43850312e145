"""The inbox's memory twin (`fleet.storage.inbox`): every trace's messages in this process.

It decides what the Redis script decides, except whether the trace lives: it cannot see
the trace store, so `fleet.conversation.messages.send` checks that first (on Redis the
script checks it again, in the same step as the append).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from fleet.storage.inbox_types import InboxEntry, InboxLimits, Posted, Refused, entry_key

WINDOW_MS = 60_000


class MemoryInbox:
    """Every trace's inbox, thread-safe."""

    def __init__(self) -> None:
        """Empty inboxes."""
        self._lock = threading.Lock()
        self._entries: dict[str, list[InboxEntry]] = defaultdict(list)
        self._sends: dict[str, list[int]] = defaultdict(list)
        self._last = (0, 0)

    def post(
        self, trace_id: str, posted: Posted, limits: InboxLimits, *, sender_trace_id: str | None
    ) -> str:
        """See `Inbox.post`."""
        with self._lock:
            now_ms = int(time.time() * 1000)
            entries = self._entries[trace_id]
            recent = [e for e in entries if entry_key(e.entry_id)[0] > now_ms - WINDOW_MS]
            if len(entries) >= limits.max_messages:
                raise Refused("full")
            if len(recent) >= limits.per_minute:
                raise Refused("rate")
            if sender_trace_id is not None:
                sends = [t for t in self._sends[sender_trace_id] if t > now_ms - WINDOW_MS]
                if len(sends) >= limits.sends_per_minute:
                    raise Refused("sender_rate")
                self._sends[sender_trace_id] = [*sends, now_ms]
            entry_id = self._next_id(now_ms)
            entries.append(InboxEntry(entry_id, posted))
            return entry_id

    def _next_id(self, now_ms: int) -> str:
        ms, seq = self._last
        self._last = (now_ms, 0) if now_ms > ms else (ms, seq + 1)
        return f"{self._last[0]}-{self._last[1]}"

    def after(self, trace_id: str, cursor: str | None, limit: int) -> list[InboxEntry]:
        """See `Inbox.after`."""
        start = entry_key(cursor) if cursor else (-1, -1)
        with self._lock:
            entries = list(self._entries.get(trace_id, ()))
        return [e for e in entries if entry_key(e.entry_id) > start][:limit]

    def newest(self, trace_id: str) -> str | None:
        """See `Inbox.newest`."""
        with self._lock:
            entries = self._entries.get(trace_id)
            return entries[-1].entry_id if entries else None

    def count(self, trace_id: str) -> int:
        """See `Inbox.count`."""
        with self._lock:
            return len(self._entries.get(trace_id, ()))

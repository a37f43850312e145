"""A running trace's inbox: the messages people and agents send it (`fleet send`).

One stream per trace (`keys.inbox`), appended to and never trimmed while the trace lives:
what the trace has read is not kept here but in its own messages, written under its lease
(`fleet.conversation.messages`), so a run that dies mid-turn reads the same entries again
and none twice. `post` refuses, in one step with the append (one Lua script on Redis): a
trace that ended or does not exist, an inbox over `InboxLimits.per_minute` this minute or
`max_messages` in all, and a sending trace over `sends_per_minute` (`send_message`).

`INBOX` is the capability: `store.capability(INBOX)` gives the Redis inbox or its memory
twin (`fleet.storage.backends.memory.inbox`), which decides what the script decides.
"""

from __future__ import annotations

from typing import Protocol

import redis

from fleet.storage.backends.memory.inbox import MemoryInbox
from fleet.storage.backends.redis.inbox import RedisInbox
from fleet.storage.capability import Capability
from fleet.storage.inbox_types import InboxEntry, InboxLimits, Posted


class Inbox(Protocol):
    """Post to a trace's inbox and read it from a cursor."""

    def post(
        self, trace_id: str, posted: Posted, limits: InboxLimits, *, sender_trace_id: str | None
    ) -> str:
        """Append `posted`; its entry id. `Refused` when a rule says no (nothing written).

        `sender_trace_id` counts the message against that trace's sends this minute.
        """
        ...

    def after(self, trace_id: str, cursor: str | None, limit: int) -> list[InboxEntry]:
        """At most `limit` entries after `cursor` (None: from the start), oldest first."""
        ...

    def newest(self, trace_id: str) -> str | None:
        """The newest entry's id, if any."""
        ...

    def count(self, trace_id: str) -> int:
        """How many messages the trace ever received."""
        ...


def _on_redis(client: redis.Redis) -> Inbox:
    return RedisInbox(client)


INBOX: Capability[Inbox] = Capability("inbox", _on_redis, MemoryInbox)
"""The store's inbox of every trace (`store.capability(INBOX)`)."""

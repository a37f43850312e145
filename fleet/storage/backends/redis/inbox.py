"""The inbox on the fleet's Redis (`fleet.storage.inbox`): one stream per trace, one script.

The post script checks the trace (present, not ended: a packed trace has ended), the
inbox's caps and the sender's, then appends, all in one step: a message never lands in a
trace that had already ended when it arrived. Its keys are the trace's, the inbox's and
the sender's counter: one tree's, so one slot on a Redis Cluster (`send_message` never
crosses trees).
"""

from __future__ import annotations

import json
from typing import Any, cast

import redis

from fleet.models import TERMINAL
from fleet.storage import keys
from fleet.storage.backends.redis.connect import Lua
from fleet.storage.compaction import PACKED_FIELD
from fleet.storage.inbox_types import InboxEntry, InboxLimits, Posted, Refusal, Refused

_ENDED = " or ".join(f"status == '{json.dumps(s)}'" for s in sorted(TERMINAL))

# KEYS: trace hash, inbox stream[, the sender's counter]
# ARGV: message JSON, per minute, max messages, ttl_s, sends per minute
_POST = f"""
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  if redis.call('HEXISTS', KEYS[1], '{PACKED_FIELD}') == 1 then return {{'ended'}} end
  return {{'missing'}}
end
if {_ENDED} then return {{'ended'}} end
if redis.call('XLEN', KEYS[2]) >= tonumber(ARGV[3]) then return {{'full'}} end
local now = redis.call('TIME')
local since = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - 60000
local recent = redis.call('XRANGE', KEYS[2], '(' .. since, '+', 'COUNT', ARGV[2])
if #recent >= tonumber(ARGV[2]) then return {{'rate'}} end
if #KEYS == 3 then
  local sent = tonumber(redis.call('GET', KEYS[3]) or '0')
  if sent >= tonumber(ARGV[5]) then return {{'sender_rate'}} end
  if redis.call('INCR', KEYS[3]) == 1 then redis.call('PEXPIRE', KEYS[3], 60000) end
end
local id = redis.call('XADD', KEYS[2], '*', 'm', ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return {{'ok', id}}
"""


class RedisInbox:
    """Every trace's inbox on one Redis (a client that decodes responses)."""

    def __init__(self, client: redis.Redis) -> None:
        """On `client`."""
        self._client = client
        self._post = Lua(_POST)

    def post(
        self, trace_id: str, posted: Posted, limits: InboxLimits, *, sender_trace_id: str | None
    ) -> str:
        """See `Inbox.post`."""
        script_keys = [keys.trace(trace_id), keys.inbox(trace_id)]
        if sender_trace_id is not None:
            script_keys.append(keys.message_sends(sender_trace_id))
        args = [
            posted.model_dump_json(),
            limits.per_minute,
            limits.max_messages,
            keys.TRACE_TTL_S,
            limits.sends_per_minute,
        ]
        reply = cast(list[Any], self._post(self._client, script_keys, args))
        if reply[0] != "ok":
            raise Refused(cast(Refusal, str(reply[0])))
        return str(reply[1])

    def after(self, trace_id: str, cursor: str | None, limit: int) -> list[InboxEntry]:
        """See `Inbox.after`."""
        start = f"({cursor}" if cursor else "-"
        raw = self._client.xrange(keys.inbox(trace_id), start, "+", count=limit)
        return [
            InboxEntry(str(i), Posted.model_validate_json(fields["m"]))
            for i, fields in cast(list[tuple[str, dict[str, str]]], raw)
        ]

    def newest(self, trace_id: str) -> str | None:
        """See `Inbox.newest`."""
        raw = cast(list[Any], self._client.xrevrange(keys.inbox(trace_id), "+", "-", count=1))
        return str(raw[0][0]) if raw else None

    def count(self, trace_id: str) -> int:
        """See `Inbox.count`."""
        return int(self._client.xlen(keys.inbox(trace_id)))

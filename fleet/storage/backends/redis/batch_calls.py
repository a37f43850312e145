"""The provider-batch call queue on the fleet's Redis: each move of a call one Lua script.

cjson re-encodes what a script decodes, and writes an empty array as `{}`: scripts decode
only the small `CallStatus` (strings and numbers) and never a request body.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from fleet.storage import keys
from fleet.storage.batch_types import CallStatus, Flush, PendingCall

_ENQUEUE = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
if ARGV[5] ~= '' then redis.call('ZADD', KEYS[4], ARGV[5], ARGV[1]) end
return 1
"""

_BEGIN_FLUSH = """
local moved = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[2], id) == 1 then
    local st = cjson.decode(redis.call('HGET', KEYS[1], id))
    st.state = 'submitting'
    st.flush_id = ARGV[1]
    redis.call('HSET', KEYS[1], id, cjson.encode(st))
    moved[#moved + 1] = id
  end
end
if #moved > 0 then
  local flush = cjson.decode(ARGV[2])
  flush.wire_ids = nil  -- cjson writes an empty array as {}: the record has none yet
  flush.custom_ids = moved
  redis.call('HSET', KEYS[3], ARGV[1], cjson.encode(flush))
end
return moved
"""

_SUBMITTED = """
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
for i = 4, #ARGV do
  local raw = redis.call('HGET', KEYS[1], ARGV[i])
  if raw then
    local st = cjson.decode(raw)
    if st.flush_id == ARGV[1] and (st.state == 'submitting' or st.state == 'cancelled') then
      st.batch_id = ARGV[2]  -- a call queued again meanwhile is not this batch's
      if st.state == 'submitting' then st.state = 'submitted' end
      redis.call('HSET', KEYS[1], ARGV[i], cjson.encode(st))
    end
  end
end
return 1
"""

_REQUEUE = """
for i = 2, #ARGV do
  local raw = redis.call('HGET', KEYS[1], ARGV[i])
  if raw then
    local st = cjson.decode(raw)
    if st.state ~= 'answered' and st.state ~= 'cancelled' and st.state ~= 'queued' then
      st.state = 'queued'
      st.attempt = st.attempt + 1
      st.flush_id = ''
      st.batch_id = ''
      redis.call('HSET', KEYS[1], ARGV[i], cjson.encode(st))
      redis.call('ZADD', KEYS[2], ARGV[1], ARGV[i])
    end
  end
end
return 1
"""

_ANSWER = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
local st = cjson.decode(raw)
if st.state == 'answered' or st.state == 'cancelled' then return 0 end
st.state = 'answered'
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(st))
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[3])
return 1
"""

WAKE_TTL_MS = 60_000
"""A wake no worker took (none runs) goes after this: a later one has the poll for it."""

_CANCEL = """
redis.call('ZREM', KEYS[5], ARGV[1])
local function drop()
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('DEL', KEYS[4])
end
if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then drop() return 'dropped' end
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 'gone' end
local st = cjson.decode(raw)
if st.state == 'submitting' or st.state == 'submitted' then
  st.state = 'cancelled'
  redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(st))
  return 'cancelled'
end
drop()
return 'dropped'
"""


class RedisBatchCalls:
    """The queue on the fleet's Redis."""

    def __init__(self, client: redis.Redis) -> None:
        """Use `client` (decoded responses)."""
        self._client = client
        self._enqueue = client.register_script(_ENQUEUE)
        self._begin_flush = client.register_script(_BEGIN_FLUSH)
        self._submitted = client.register_script(_SUBMITTED)
        self._requeue = client.register_script(_REQUEUE)
        self._answer = client.register_script(_ANSWER)
        self._cancel = client.register_script(_CANCEL)

    def enqueue(self, call: PendingCall, deadline_ms: int | None = None) -> bool:
        """Queue a call once; False if its custom id is known (a redelivered run).

        `deadline_ms`: its tree's `wall_s` deadline, if it has one (`overdue` finds it).
        """
        status = CallStatus().model_dump_json()
        args: list[str | int] = [call.custom_id, call.model_dump_json(), status, call.queued_at_ms]
        args.append("" if deadline_ms is None else deadline_ms)
        script_keys = [
            keys.batch_calls(),
            keys.batch_state(),
            keys.batch_queued(),
            keys.batch_deadlines(),
        ]
        return bool(self._enqueue(keys=script_keys, args=args))

    def overdue(self, at_ms: int, limit: int) -> list[str]:
        """Custom ids of calls whose tree's `wall_s` deadline is at or before `at_ms`."""
        found = self._client.zrangebyscore(keys.batch_deadlines(), "-inf", at_ms, 0, limit)
        return [str(c) for c in found]

    def calls(self, custom_ids: list[str]) -> list[PendingCall | None]:
        """The calls' requests (None where unknown)."""
        if not custom_ids:
            return []
        raws = self._client.hmget(keys.batch_calls(), custom_ids)
        return [PendingCall.model_validate_json(r) if r else None for r in raws]

    def statuses(self, custom_ids: list[str]) -> list[CallStatus | None]:
        """The calls' states (None where unknown)."""
        if not custom_ids:
            return []
        raws = self._client.hmget(keys.batch_state(), custom_ids)
        return [CallStatus.model_validate_json(r) if r else None for r in raws]

    def queued(self, limit: int) -> list[tuple[str, int]]:
        """(custom id, queued_at_ms) of up to `limit` queued calls, oldest first."""
        found: list[Any] = self._client.zrange(keys.batch_queued(), 0, limit - 1, withscores=True)
        return [(str(member), int(score)) for member, score in found]

    def begin_flush(self, flush: Flush) -> list[str]:
        """Move these queued calls into a flush record (before the upload); those moved."""
        record = flush.model_dump_json(exclude={"custom_ids"})
        script_keys = [keys.batch_state(), keys.batch_queued(), keys.batch_submitting()]
        moved = self._begin_flush(
            keys=script_keys, args=[flush.flush_id, record, *flush.custom_ids]
        )
        return [str(m) for m in moved]

    def submitted(self, flush: Flush) -> None:
        """The provider took the flush as batch `flush.batch_id`: in flight now."""
        script_keys = [keys.batch_state(), keys.batch_submitting(), keys.batch_in_flight()]
        args = [flush.flush_id, flush.batch_id, flush.model_dump_json(), *flush.custom_ids]
        self._submitted(keys=script_keys, args=args)

    def requeue(self, custom_ids: list[str], at_ms: int) -> None:
        """Queue these calls again, each with its next attempt number (a new wire id)."""
        if custom_ids:
            self._requeue(keys=[keys.batch_state(), keys.batch_queued()], args=[at_ms, *custom_ids])

    def drop_flush(self, flush_id: str) -> None:
        """Forget a flush record (its calls were requeued or adopted)."""
        self._client.hdel(keys.batch_submitting(), flush_id)

    def submitting(self) -> list[Flush]:
        """Flushes whose upload was begun and never recorded as done."""
        return [Flush.model_validate_json(v) for v in self._client.hvals(keys.batch_submitting())]

    def in_flight(self) -> list[Flush]:
        """Provider batches in flight."""
        return [Flush.model_validate_json(v) for v in self._client.hvals(keys.batch_in_flight())]

    def answer(self, custom_id: str, answer: dict[str, Any]) -> bool:
        """Store a call's answer once; False if it was answered or cancelled already."""
        script_keys = [keys.batch_state(), keys.batch_queued(), keys.batch_answer(custom_id)]
        args: list[str | int] = [custom_id, json.dumps(answer), keys.TRACE_TTL_S]
        return bool(self._answer(keys=script_keys, args=args))

    def answer_of(self, custom_id: str) -> dict[str, Any] | None:
        """The stored answer of a call, if any."""
        raw = self._client.get(keys.batch_answer(custom_id))
        return json.loads(raw) if raw else None

    def cancel(self, custom_id: str) -> str:
        """Take a call out: `dropped`, `cancelled` (in a batch: its answer is ignored), `gone`."""
        script_keys = [
            keys.batch_calls(),
            keys.batch_state(),
            keys.batch_queued(),
            keys.batch_answer(custom_id),
            keys.batch_deadlines(),
        ]
        return str(self._cancel(keys=script_keys, args=[custom_id]))

    def forget(self, custom_id: str) -> None:
        """The trace consumed the answer (or ended): nothing of the call stays."""
        pipe = self._client.pipeline(transaction=True)
        pipe.hdel(keys.batch_calls(), custom_id)
        pipe.hdel(keys.batch_state(), custom_id)
        pipe.zrem(keys.batch_queued(), custom_id)
        pipe.zrem(keys.batch_deadlines(), custom_id)
        pipe.delete(keys.batch_answer(custom_id))
        pipe.execute()

    def release(self, custom_id: str) -> None:
        """The trace was resumed with the answer: the call's records go, its answer stays."""
        pipe = self._client.pipeline(transaction=True)
        pipe.hdel(keys.batch_calls(), custom_id)
        pipe.hdel(keys.batch_state(), custom_id)
        pipe.zrem(keys.batch_deadlines(), custom_id)
        pipe.execute()

    def wake(self) -> None:
        """A stop cancelled a call in a batch: wake one worker's waker (`woken`)."""
        pipe = self._client.pipeline(transaction=False)
        pipe.rpush(keys.batch_wake(), "stop")
        pipe.pexpire(keys.batch_wake(), WAKE_TTL_MS)
        pipe.execute()

    def woken(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a wake; True if one came (every wake so far is taken).

        One pass after the wakes are taken sees every cancel made before them (each stop
        cancels its call before it wakes), so the rest of the list is dropped.
        """
        if self._client.blpop([keys.batch_wake()], timeout=timeout_s) is None:
            return False
        self._client.delete(keys.batch_wake())
        return True

    def batch_done(self, batch_id: str) -> None:
        """A provider batch was read to its end."""
        self._client.hdel(keys.batch_in_flight(), batch_id)

    def claim(self, key: str, owner: str, ttl_ms: int) -> bool:
        """`keys.batch_poll()` or `keys.batch_polling()` for `ttl_ms`, if no one holds it."""
        return bool(self._client.set(key, owner, nx=True, px=ttl_ms))

    def unclaim(self, key: str, owner: str) -> None:
        """Give the claim back if `owner` still holds it."""
        if self._client.get(key) == owner:  # a lapsed claim taken over is not ours
            self._client.delete(key)

"""The Redis TraceStore: MemoryStore's contract on the schema in `fleet.storage.keys`.

Every write to a trace is a `TraceWrite` run by one Lua script (`redis_scripts.APPLY`); the
single-purpose writes (append_message, update_trace, add_stats, record_turn, the `*_and_emit`
writes that carry their event along) are one-op writes. Reads are one pipeline each. The
client must decode responses (`decode_responses=True`); `RedisStore.from_url` builds one that
does.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, Unpack, cast

import redis

from fleet.errors import ConfigError, NewerRecord, TraceExists, TraceNotFound
from fleet.models import Collaborator, Event, Message, Trace, TracePatch
from fleet.runstate import RunPatch
from fleet.storage import keys
from fleet.storage.backends.redis import begin as redis_begin
from fleet.storage.backends.redis import compact as redis_compact
from fleet.storage.backends.redis import connect as redis_connect
from fleet.storage.backends.redis import entries as redis_entries
from fleet.storage.backends.redis import scripts as redis_scripts
from fleet.storage.backends.redis import split as redis_split
from fleet.storage.backends.redis import submit as redis_submit
from fleet.storage.backends.redis import writes as redis_writes
from fleet.storage.backends.redis.connect import Lua, close_client, connect, is_cluster, unreachable
from fleet.storage.backends.redis.fence import FencedScript, applying, lease_lost
from fleet.storage.backends.redis.indexes import RedisIndexes
from fleet.storage.backends.redis.lease_scripts import RENEW_LEASES
from fleet.storage.capability import Capability, Kept, T
from fleet.storage.root_queue import queue_in_steps
from fleet.storage.store import OutboxDue, Serving, StartRun, TraceSnapshot
from fleet.storage.writes import PauseRead, TraceWrite, WriteResult

BLOCK_MARGIN_MS = 1_000
"""How far below the socket timeout a blocking XREAD must return."""

THAW_ATTEMPTS = 3
"""A write finding its trace packed thaws it and tries again, this often at most (compaction
may pack it again in between: it packs only ended traces, and a continue's write ends that)."""


class RedisStore(RedisIndexes):
    """A TraceStore on Redis, safe to share between threads."""

    def __init__(
        self, client: redis.Redis, *, url: str | None = None, owns_client: bool = False
    ) -> None:
        """Wrap a client that decodes responses; `owns_client` makes `close` close it."""
        self._cluster = is_cluster(client)
        """A Redis Cluster: fleet-wide keys are written apart from a trace's (`redis_split`)."""
        kwargs = self._connection_kwargs(client)
        if not kwargs.get("decode_responses"):
            raise ConfigError("RedisStore needs a client with decode_responses=True")
        self._client = client
        self._url = url or f"redis://{kwargs.get('host')}:{kwargs.get('port')}/{kwargs.get('db')}"
        self._owns_client = owns_client
        timeout_s = kwargs.get("socket_timeout")
        self._max_block_ms = None if timeout_s is None else int(timeout_s * 1000) - BLOCK_MARGIN_MS
        self._dicts = redis_compact.DictCache(client)
        """The dictionaries of compacted trees this store read (`fleet.storage.compaction`)."""
        self._fence: tuple[str, str, str] | None = None
        """(trace id, lease key, owner) in a `fenced` view: every write script checks it."""
        self._kept = Kept()
        self._create = FencedScript(redis_scripts.CREATE_TRACES)
        self._append_once = FencedScript(redis_scripts.APPEND_ONCE)
        self._put_collaborator = FencedScript(redis_entries.PUT_COLLABORATOR)
        self._emit = FencedScript(redis_scripts.EMIT)
        self._request_stop = Lua(redis_scripts.REQUEST_STOP)
        self._renew_all = client.register_script(RENEW_LEASES)  # in a pipeline
        self._begin = Lua(redis_begin.BEGIN_RUN)

    @classmethod
    def from_url(
        cls, url: str, sentinel_master: str | None = None, *, cluster: bool = False
    ) -> RedisStore:
        """A store with its own client (see `connect`); `close` closes it."""
        return cls(connect(url, sentinel_master, cluster=cluster), url=url, owns_client=True)

    @staticmethod
    def _connection_kwargs(client: redis.Redis) -> dict[str, Any]:
        if is_cluster(client):
            return dict(client.get_connection_kwargs())
        return dict(client.connection_pool.connection_kwargs)

    @property
    def client(self) -> redis.Redis:
        """The Redis client, for other fleet-wide state on the same server (limits, budgets)."""
        return self._client

    def capability(self, kind: Capability[T]) -> T:
        """The service `kind` on this store's Redis, built once per store."""
        return self._kept.get(kind, lambda: kind.on_redis(self._client))

    def ping(self) -> None:
        """Pre-flight check: `ConfigError` naming the (password-free) URL if Redis is away."""
        try:
            self._client.ping()
        except redis.RedisError as exc:
            raise unreachable(self._url, exc) from exc

    def fenced(self, trace_id: str, owner: str) -> RedisStore:
        """A view sharing this client whose write scripts first check `owner`'s lease."""
        view = copy.copy(self)
        view._owns_client = False
        view._fence = (trace_id, keys.lease(trace_id), owner)
        return view

    def _script(self, script: FencedScript, script_keys: list[str], args: Sequence[Any]) -> Any:
        """Run a write script, behind the lease check when this is a fenced view."""
        fence = self._fence
        try:  # a write refused for a stop (`StopLanded`) is an error reply too
            if fence is None:
                return script.plain(self._client, script_keys, args)
            return script.fenced(self._client, [fence[1], *script_keys], [fence[2], *args])
        except redis.ResponseError as exc:
            raise lease_lost(fence[0] if fence else script_keys[0], exc) from None

    def close(self) -> None:
        """Close the client if this store created it, with every connection it holds."""
        if self._owns_client:
            close_client(self._client)

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- traces --------------------------------------------------------------

    def create_trace(self, trace: Trace) -> None:
        if not self.create_traces([trace])[0]:
            raise TraceExists(f"trace {trace.trace_id!r} already exists")

    def create_traces(self, traces: Sequence[Trace], outbox: OutboxDue | None = None) -> list[bool]:
        if self._cluster and outbox:  # the outbox is in another slot: put first
            self.outbox_put(*outbox)
        script_keys, args = redis_writes.create_call(traces, None if self._cluster else outbox)
        if self._cluster:  # the traces index is in another slot: indexed after
            script_keys[0], args[1] = script_keys[1], ""
        created = [bool(c) for c in self._script(self._create, script_keys, args)]
        if self._cluster and any(created):
            new = {t.trace_id: t.created_at_ms for t, c in zip(traces, created, strict=True) if c}
            self._client.zadd(keys.TRACES, new)
        return created

    def get_trace(self, trace_id: str) -> Trace:
        trace = self._get_traces([trace_id])[0]
        if trace is None:
            raise TraceNotFound(f"no trace {trace_id!r}")
        return trace

    def get_traces(self, trace_ids: Sequence[str]) -> list[Trace]:
        found = self._get_traces(list(trace_ids))
        for trace_id, trace in zip(trace_ids, found, strict=True):
            if trace is None:
                raise TraceNotFound(f"no trace {trace_id!r}")
        return [t for t in found if t is not None]

    def update_trace(self, trace_id: str, **fields: Unpack[TracePatch]) -> None:
        self.apply(TraceWrite(trace_id, trace_id).update(None, **fields))

    def update_trace_and_emit(
        self, trace_id: str, root_trace_id: str, event: Event, /, **fields: Unpack[TracePatch]
    ) -> None:
        self.apply(TraceWrite(trace_id, root_trace_id).update(event, **fields))

    def update_run(self, trace_id: str, **fields: Unpack[RunPatch]) -> None:
        self.apply(TraceWrite(trace_id, trace_id).update_run(**fields))

    def snapshot(self, trace_id: str) -> TraceSnapshot:
        data = self._hash(trace_id)  # the messages are in it
        trace = redis_writes.decode_trace(data)
        if trace is None:
            raise TraceNotFound(f"no trace {trace_id!r}")
        return TraceSnapshot(
            trace, redis_writes.decode_messages(data), redis_writes.STOP_FIELD in data
        )

    def begin_run(
        self,
        trace_id: str,
        owner: str,
        ttl_ms: int,
        start: StartRun | None = None,
        pauses: Sequence[str] = (),
    ) -> TraceSnapshot | None:
        root = start.root_trace_id if start else trace_id
        script_keys, args, deadline_ms = redis_begin.begin_call(
            trace_id, owner, ttl_ms, start, pauses, cluster=self._cluster
        )
        reply = self._begin(self._client, script_keys, args)
        if reply == -1:
            raise TraceNotFound(f"no trace {trace_id!r}")
        if reply == -2:
            raise NewerRecord(f"trace {trace_id!r} is for a newer release than this one")
        if reply == 0:
            return None
        if self._cluster:
            self._client.zadd(keys.RUNNING, {trace_id: deadline_ms})
            reply = [reply[0], redis_split.pause_ttls(self._client, pauses), *reply[2:]]
        packed = redis_writes.pairs(reply[0])  # a packed trace is read, never started
        data = self._dicts.unpacked(packed)
        trace = redis_writes.decode_trace(data)
        assert trace is not None, "BEGIN_RUN returned an empty trace"
        read = PauseRead.of(pauses, reply[1]) if pauses else None
        stop, inbox = redis_writes.STOP_FIELD in data, redis_writes.inbox_seen(reply[2])
        budgeted = bool(reply[3]) if trace.root_trace_id == root else None  # a guess missed
        messages = redis_writes.decode_messages(data)
        learnt = (reply[4][0] or None, int(reply[4][1])) if reply[4] else None
        return TraceSnapshot(trace, messages, stop, read, inbox, budgeted, learnt)

    def apply(self, write: TraceWrite) -> WriteResult:
        fenced_by = self._fence[2] if self._fence else None
        script_keys, args = redis_writes.apply_call(write, fenced_by, split=self._cluster)
        for _ in range(THAW_ATTEMPTS):
            reply = self._script(applying(redis_writes.extension_of(write)), script_keys, args)
            result = redis_writes.apply_result(write, reply)
            if result is not None:
                return self._after_split(write, reply, result) if self._cluster else result
            if not redis_compact.thaw(self._client, write.trace_id, self._dicts):
                break  # not packed: there is no such trace
            args[redis_writes.THAWED_ARG] = "1"  # its TTLs are refreshed with the write
        raise TraceNotFound(f"no trace {write.trace_id!r}")

    def _after_split(self, write: TraceWrite, reply: Any, result: WriteResult) -> WriteResult:
        """A cluster's second step of a write: usage, the running index, the pauses."""
        redis_split.count_usage(self._client, reply[4] or [])
        if reply[5]:
            self._client.zrem(keys.RUNNING, write.trace_id)
        if not write.pauses:
            return result
        ttls = redis_split.pause_ttls(self._client, write.pauses)
        return replace(result, pauses=PauseRead.of(write.pauses, ttls))

    def queue_root(
        self, trace: Trace, event: Event, serving: Serving | None = None, *, listed: bool = True
    ) -> None:
        if self._cluster or self._fence is not None:  # in slots apart; or behind a lease
            queue_in_steps(self, trace, event, serving, listed)
        else:
            redis_submit.queue_root(self._client, trace, event, serving, listed)

    def list_traces(self, limit: int = 50) -> list[Trace]:
        traces: list[Trace] = []
        start = 0
        while len(traces) < limit:
            ids = [str(i) for i in self._client.zrevrange(keys.TRACES, start, start + limit - 1)]
            if not ids:
                break
            found = self._get_traces(ids)
            expired = [i for i, trace in zip(ids, found, strict=True) if trace is None]
            if expired:  # their hashes hit the TTL; the index has no TTL of its own
                self._client.zrem(keys.TRACES, *expired)
            start += len(ids) - len(expired)
            traces.extend(trace for trace in found if trace is not None)
        return traces[:limit]

    def children(self, trace_id: str) -> list[str]:
        return [str(i) for i in self._client.zrange(keys.children(trace_id), 0, -1)]

    def _get_traces(self, trace_ids: list[str]) -> list[Trace | None]:
        # MULTI: every trace as of one instant (a cluster: one trace at a time, trees apart)
        pipe = self._client.pipeline(transaction=not self._cluster)
        for trace_id in trace_ids:  # the trace's fields, not its messages (unless packed)
            pipe.hmget(keys.trace(trace_id), redis_writes.READ_FIELDS)
        return [redis_writes.decode_fields(v, self._dicts.unpacked) for v in pipe.execute()]

    # -- messages and stats --------------------------------------------------

    def append_message(self, message: Message) -> Message:
        write = TraceWrite(message.trace_id, message.trace_id).append(message)
        return self.apply(write).messages[0]

    def record_turn(
        self, root_trace_id: str, message: Message, event: Event, *, iteration: int | None = None
    ) -> Message:
        write = TraceWrite(message.trace_id, root_trace_id)
        return self.apply(write.append(message, event, iteration=iteration)).messages[0]

    def messages(self, trace_id: str) -> list[Message]:
        return redis_writes.decode_messages(self._hash(trace_id))

    def _hash(self, trace_id: str) -> dict[str, str]:
        return self._dicts.unpacked(
            cast(dict[str, str], self._client.hgetall(keys.trace(trace_id)))
        )

    def set_head(self, trace_id: str, sequence: int | None) -> None:
        self.update_trace(trace_id, head_sequence=sequence)

    def add_stats(self, trace_id: str, **deltas: float) -> None:
        self.apply(TraceWrite(trace_id, trace_id).add_stats(**deltas))  # all land together

    # -- collaborators and events --------------------------------------------

    def put_collaborator(self, parent_trace_id: str, collaborator: Collaborator) -> None:
        self._put_entry(parent_trace_id, collaborator, None)

    def put_collaborator_and_emit(
        self, parent_trace_id: str, root_trace_id: str, collaborator: Collaborator, event: Event
    ) -> None:
        self._put_entry(parent_trace_id, collaborator, (root_trace_id, event))

    def _put_entry(self, parent: str, entry: Collaborator, emit: tuple[str, Event] | None) -> None:
        script_keys = [keys.collaborators(parent), keys.collaborator_order(parent)]
        args: list[str | int] = [keys.TRACE_TTL_S, entry.trace_id, entry.model_dump_json()]
        if emit is not None:
            script_keys.append(keys.events(emit[0]))
            args += [keys.EVENTS_MAXLEN, emit[1].model_dump_json()]
        self._script(self._put_collaborator, script_keys, args)

    def collaborators(self, parent_trace_id: str) -> list[Collaborator]:
        pipe = self._client.pipeline()
        pipe.lrange(keys.collaborator_order(parent_trace_id), 0, -1)
        pipe.hgetall(keys.collaborators(parent_trace_id))
        order, entries = pipe.execute()
        order, entries = redis_compact.merged_collaborators(order, entries, self._dicts)
        return [Collaborator.model_validate_json(entries[c]) for c in order if c in entries]

    def emit(self, root_trace_id: str, event: Event) -> str:
        args = [keys.TRACE_TTL_S, keys.EVENTS_MAXLEN, event.model_dump_json()]
        return str(self._script(self._emit, [keys.events(root_trace_id)], args))

    def read_events(
        self, root_trace_id: str, after: str = "0", *, block_ms: int | None = None, count: int = 500
    ) -> list[tuple[str, Event]]:
        block = block_ms or None  # 0 means "don't block", as in MemoryStore, not "forever"
        if block is not None and self._max_block_ms is not None:
            block = max(1, min(block, self._max_block_ms))  # a longer wait hits the read timeout
        reply = self._client.xread({keys.events(root_trace_id): after}, count=count, block=block)
        entries = redis_writes.stream_entries(reply)
        if not entries:  # a compacted tree's events are in its archive
            entries = redis_compact.events_after(self._client, root_trace_id, after, count)
        return redis_writes.readable_events(entries)

    # -- stop, leases, collection, cache -------------------------------------

    def request_stop(self, trace_id: str) -> None:
        self._request_stop(self._client, [keys.trace(trace_id)], ())

    def stop_requested(self, trace_id: str) -> bool:
        return bool(self._client.hexists(keys.trace(trace_id), redis_writes.STOP_FIELD))

    def clear_stop(self, trace_id: str) -> None:
        self._client.hdel(keys.trace(trace_id), redis_writes.STOP_FIELD)
        if redis_compact.thaw(self._client, trace_id, self._dicts):  # a flag packed with it
            self._client.hdel(keys.trace(trace_id), redis_writes.STOP_FIELD)

    def unavailable(self, exc: BaseException) -> bool:
        return redis_connect.away(exc)  # a failover's answers too

    # -- collection, cache, counters -----------------------------------------

    def append_collected(self, message: Message) -> Message | None:
        if message.tool_call_id is None:
            raise ValueError("append_collected needs a tool result (tool_call_id)")
        body = message.model_dump_json(exclude={"sequence", "parent_sequence"})
        trace_id = message.trace_id
        script_keys = [keys.trace(trace_id), keys.collected(trace_id, message.tool_call_id)]
        reply = self._script(self._append_once, script_keys, [keys.TRACE_TTL_S, body])
        if reply is None and redis_compact.thaw(self._client, trace_id, self._dicts):
            reply = self._script(self._append_once, script_keys, [keys.TRACE_TTL_S, body])
        if reply == 0:
            return None
        stored = redis_writes.stored_message(message, reply)
        if stored is None:
            raise TraceNotFound(f"no trace {trace_id!r}")
        return stored

    def cache_get(self, key: str) -> str | None:
        value = self._client.get(key)
        return None if value is None else str(value)

    def cache_set(self, key: str, value: str, ttl_s: int) -> None:
        if ttl_s <= 0:  # already expired; Redis refuses EX 0
            self._client.delete(key)
        else:
            self._client.set(key, value, ex=ttl_s)

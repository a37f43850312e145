"""The Redis TraceStore: MemoryStore's contract on the schema in `fleet.keys`.

Every hot-path call (append_message, update_trace, add_stats, put_collaborator, emit,
get_trace, snapshot, and the `*_and_emit` / `record_turn` writes that carry their event
along) is one round trip: a Lua script (in `fleet.redis_scripts`) or a pipeline. The client
must decode responses (`decode_responses=True`); `RedisStore.from_url` builds one that does.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Unpack
from urllib.parse import urlsplit

import redis

from fleet import keys, redis_scripts, redis_writes
from fleet.errors import ConfigError, LeaseLost, RedisUnreachable, TraceExists, TraceNotFound
from fleet.keys import CounterName
from fleet.models import (
    Collaborator,
    Event,
    Message,
    Trace,
    TracePatch,
    TraceStats,
    WorkerPresence,
    now_ms,
)
from fleet.store import STATS_FIELDS, TraceSnapshot, with_sequence
from fleet.writes import TraceWrite, WriteResult

SOCKET_TIMEOUT_S = 30.0
"""Read timeout of `from_url` clients; blocking event reads are clamped below it."""
CONNECT_TIMEOUT_S = 5.0
HEALTH_CHECK_INTERVAL_S = 30
MAX_CONNECTIONS = 100
"""Connections per client; further threads wait up to POOL_TIMEOUT_S for one."""
POOL_TIMEOUT_S = 20.0
BLOCK_MARGIN_MS = 1_000
"""How far below the socket timeout a blocking XREAD must return."""

_FLOAT_STATS = frozenset({"cost_usd"})
CONSUMER_TRIM_MS = 60_000
"""A consumer entry dead this long is dropped from its queue's set by the next heartbeat."""
# The required Trace fields, so that an update's fields validate without reading the trace.
log = logging.getLogger(__name__)

_PLACEHOLDER: dict[str, Any] = {"trace_id": "_", "root_trace_id": "_", "task": ""}


def connect(url: str) -> redis.Redis:
    """A client as the store wants it: decoded replies, timeouts and health checks.

    Its pool makes a thread wait for a free connection instead of failing past the cap.
    """
    pool = redis.BlockingConnectionPool.from_url(
        url,
        decode_responses=True,
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_TIMEOUT_S,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_keepalive=True,
    )
    return redis.Redis.from_pool(pool)


def redact_url(url: str) -> str:
    """The URL without its password (in the userinfo or a `password=` query), safe to print."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    user = f"{parts.username}@" if parts.username else ""
    query = "&".join(p for p in parts.query.split("&") if p and not p.startswith("password="))
    return f"{parts.scheme}://{user}{host}{parts.path}" + (f"?{query}" if query else "")


class RedisStore:
    """A TraceStore on Redis, safe to share between threads."""

    def __init__(
        self, client: redis.Redis, *, url: str | None = None, owns_client: bool = False
    ) -> None:
        """Wrap a client that decodes responses; `owns_client` makes `close` close it."""
        kwargs = client.connection_pool.connection_kwargs
        if not kwargs.get("decode_responses"):
            raise ConfigError("RedisStore needs a client with decode_responses=True")
        self._client = client
        self._url = url or f"redis://{kwargs.get('host')}:{kwargs.get('port')}/{kwargs.get('db')}"
        self._owns_client = owns_client
        timeout_s = kwargs.get("socket_timeout")
        self._max_block_ms = None if timeout_s is None else int(timeout_s * 1000) - BLOCK_MARGIN_MS
        self._fence: tuple[str, str, str] | None = None
        """(trace id, lease key, owner) in a `fenced` view: every write script checks it."""
        self._create = _Script(client, redis_scripts.CREATE_TRACE)
        self._update = _Script(client, redis_scripts.UPDATE_TRACE)
        self._append = _Script(client, redis_scripts.APPEND_MESSAGE)
        self._append_once = _Script(client, redis_scripts.APPEND_ONCE)
        self._record = _Script(client, redis_scripts.RECORD_TURN)
        self._put_collaborator = _Script(client, redis_scripts.PUT_COLLABORATOR)
        self._apply = _Script(client, redis_scripts.APPLY)
        self._add_stats = _Script(client, redis_scripts.ADD_STATS)
        self._emit = _Script(client, redis_scripts.EMIT)
        self._renew_all = client.register_script(redis_scripts.RENEW_LEASES)
        self._claim_due = client.register_script(redis_scripts.CLAIM_DUE)
        self._begin = client.register_script(redis_scripts.BEGIN_RUN)
        self._acquire = client.register_script(redis_scripts.ACQUIRE_LEASE)
        self._renew = client.register_script(redis_scripts.RENEW_LEASE)
        self._release = client.register_script(redis_scripts.RELEASE_LEASE)

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        """A store with its own client (see `connect`); `close` closes it."""
        return cls(connect(url), url=url, owns_client=True)

    @property
    def client(self) -> redis.Redis:
        """The Redis client, for other fleet-wide state on the same server (limits, budgets)."""
        return self._client

    def ping(self) -> None:
        """Pre-flight check: `ConfigError` naming the (password-free) URL if Redis is away."""
        try:
            self._client.ping()
        except redis.RedisError as exc:
            reason = str(exc) or type(exc).__name__
            password = urlsplit(self._url).password
            if password:  # belt and braces: no redis-py message should carry it
                reason = reason.replace(password, "***")
            raise RedisUnreachable(
                f"cannot reach Redis at {redact_url(self._url)!r}: {reason}"
            ) from exc

    def fenced(self, trace_id: str, owner: str) -> RedisStore:
        """A view sharing this client whose write scripts first check `owner`'s lease."""
        view = copy.copy(self)
        view._owns_client = False
        view._fence = (trace_id, keys.lease(trace_id), owner)
        return view

    def _script(
        self, script: _Script, script_keys: list[str], args: Sequence[Any], client: Any = None
    ) -> Any:
        """Run a write script, behind the lease check when this is a fenced view."""
        if self._fence is None:
            return script.plain(keys=script_keys, args=args, client=client)
        trace_id, lease_key, owner = self._fence
        fenced_keys, fenced_args = [lease_key, *script_keys], [owner, *args]
        if client is not None:  # a pipeline: its reply is checked by `_unfenced`
            return script.fenced(keys=fenced_keys, args=fenced_args, client=client)
        try:
            return script.fenced(keys=fenced_keys, args=fenced_args)
        except redis.ResponseError as exc:
            raise _lease_lost(trace_id, exc) from None

    def close(self) -> None:
        """Close the client if this store created it."""
        if self._owns_client:
            self._client.close()

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
        script_keys, args = _create_call(trace)
        if not self._script(self._create, script_keys, args):
            raise TraceExists(f"trace {trace.trace_id!r} already exists")

    def create_traces(self, traces: Sequence[Trace]) -> list[bool]:
        pipe = self._client.pipeline(transaction=False)
        for trace in traces:
            script_keys, args = _create_call(trace)
            self._script(self._create, script_keys, args, client=pipe)
        replies = pipe.execute(raise_on_error=False)
        return [bool(_unfenced(self._fence, created)) for created in replies]

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
        self._update_trace(trace_id, None, dict(fields))

    def update_trace_and_emit(
        self, trace_id: str, root_trace_id: str, event: Event, /, **fields: Unpack[TracePatch]
    ) -> None:
        self._update_trace(trace_id, (root_trace_id, event), dict(fields))

    def _update_trace(
        self, trace_id: str, emit: tuple[str, Event] | None, fields: dict[str, Any]
    ) -> None:
        fields.setdefault("updated_at_ms", now_ms())
        patch = Trace.model_validate({**_PLACEHOLDER, **fields}).model_dump(
            mode="json", include=set(fields)
        )
        script_keys = _own_keys(trace_id)
        args: list[str | int] = [keys.TRACE_TTL_S, keys.EVENTS_MAXLEN, ""]
        if emit is not None:
            script_keys.append(keys.events(emit[0]))
            args[2] = emit[1].model_dump_json()
        if not self._script(self._update, script_keys, [*args, *_encode(patch)]):
            raise TraceNotFound(f"no trace {trace_id!r}")

    def snapshot(self, trace_id: str) -> TraceSnapshot:
        pipe = self._client.pipeline()  # MULTI: one instant, one round trip
        pipe.hgetall(keys.trace(trace_id))
        pipe.hgetall(keys.stats(trace_id))
        pipe.hgetall(keys.messages(trace_id))
        pipe.exists(keys.stop(trace_id))
        data, stats, stored, stop = pipe.execute()
        trace = _decode_trace(data, stats)
        if trace is None:
            raise TraceNotFound(f"no trace {trace_id!r}")
        return TraceSnapshot(trace, _decode_messages(stored), bool(stop))

    def begin_run(self, trace_id: str, owner: str, ttl_ms: int) -> TraceSnapshot | None:
        script_keys = [keys.lease(trace_id), keys.RUNNING, *_own_keys(trace_id)]
        script_keys.append(keys.stop(trace_id))
        args: list[str | int] = [owner, ttl_ms, now_ms() + ttl_ms, trace_id]
        reply = self._begin(keys=script_keys, args=args)
        if reply == -1:
            raise TraceNotFound(f"no trace {trace_id!r}")
        if reply == 0:
            return None
        data, stats, stored, stop = reply
        pairs = redis_writes.pairs
        trace = _decode_trace(pairs(data), pairs(stats))
        assert trace is not None, "BEGIN_RUN returned an empty trace"
        return TraceSnapshot(trace, _decode_messages(pairs(stored)), bool(stop))

    def apply(self, write: TraceWrite) -> WriteResult:
        script_keys, args = redis_writes.apply_call(write)
        result = redis_writes.apply_result(write, self._script(self._apply, script_keys, args))
        if result is None:
            raise TraceNotFound(f"no trace {write.trace_id!r}")
        return result

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
        pipe = self._client.pipeline()  # MULTI: a trace and its stats from one instant
        for trace_id in trace_ids:
            pipe.hgetall(keys.trace(trace_id))
            pipe.hgetall(keys.stats(trace_id))
        replies = pipe.execute()
        pairs = zip(replies[0::2], replies[1::2], strict=True)
        return [_decode_trace(data, stats) for data, stats in pairs]

    # -- messages and stats --------------------------------------------------

    def append_message(self, message: Message) -> Message:
        body = message.model_dump_json(exclude={"sequence", "parent_sequence"})
        script_keys = _own_keys(message.trace_id)
        args: list[str | float] = [keys.TRACE_TTL_S, body]
        if message.model:  # a model turn: its usage also counts fleet-wide (`fleet metrics`)
            script_keys.append(keys.USAGE)
            args += [message.model, message.prompt_tokens, message.completion_tokens]
            args.append(message.cost_usd)
        return _stored(message, self._script(self._append, script_keys, args))

    def record_turn(
        self, root_trace_id: str, message: Message, event: Event, *, iteration: int | None = None
    ) -> Message:
        body = message.model_dump_json(exclude={"sequence", "parent_sequence"})
        # The script writes the sequence where the placeholder -1 stood.
        head, found, tail = with_sequence(event, -1).model_dump_json().partition('"sequence":-1')
        assert found, "the event JSON lost its sequence placeholder"
        script_keys = [*_own_keys(message.trace_id), keys.events(root_trace_id)]
        args: list[str | float] = [keys.TRACE_TTL_S, keys.EVENTS_MAXLEN, body, head + found[:-2]]
        args += [tail, "" if iteration is None else iteration, json.dumps(now_ms())]
        args += [message.prompt_tokens, message.completion_tokens, message.cost_usd]
        if message.model:  # a model turn: its usage also counts fleet-wide (`fleet metrics`)
            script_keys.append(keys.USAGE)
            args.append(message.model)
        return _stored(message, self._script(self._record, script_keys, args))

    def messages(self, trace_id: str) -> list[Message]:
        return _decode_messages(self._client.hgetall(keys.messages(trace_id)))

    def set_head(self, trace_id: str, sequence: int | None) -> None:
        self.update_trace(trace_id, head_sequence=sequence)

    def add_stats(self, trace_id: str, **deltas: float) -> None:
        for name in deltas:
            if name not in STATS_FIELDS:
                raise ValueError(f"unknown stats field {name!r}")
        args: list[str | float] = [keys.TRACE_TTL_S]
        for name, delta in deltas.items():
            float_stat = name in _FLOAT_STATS
            args += [name, "f" if float_stat else "i", delta if float_stat else _whole(name, delta)]
        self._script(self._add_stats, [keys.stats(trace_id)], args)  # all deltas land together

    # -- collaborators and events --------------------------------------------

    def put_collaborator(self, parent_trace_id: str, collaborator: Collaborator) -> None:
        self._script(
            self._put_collaborator,
            [keys.collaborators(parent_trace_id), keys.collaborator_order(parent_trace_id)],
            [keys.TRACE_TTL_S, collaborator.trace_id, collaborator.model_dump_json()],
        )

    def put_collaborator_and_emit(
        self, parent_trace_id: str, root_trace_id: str, collaborator: Collaborator, event: Event
    ) -> None:
        script_keys = [
            keys.collaborators(parent_trace_id),
            keys.collaborator_order(parent_trace_id),
            keys.events(root_trace_id),
        ]
        args: list[str | int] = [keys.TRACE_TTL_S, collaborator.trace_id]
        args += [collaborator.model_dump_json(), keys.EVENTS_MAXLEN, event.model_dump_json()]
        self._script(self._put_collaborator, script_keys, args)

    def collaborators(self, parent_trace_id: str) -> list[Collaborator]:
        pipe = self._client.pipeline()
        pipe.lrange(keys.collaborator_order(parent_trace_id), 0, -1)
        pipe.hgetall(keys.collaborators(parent_trace_id))
        order, entries = pipe.execute()
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
        return [(str(i), Event.model_validate_json(f["e"])) for i, f in _stream_entries(reply)]

    # -- stop, leases, collection, cache -------------------------------------

    def request_stop(self, trace_id: str) -> None:
        self._client.set(keys.stop(trace_id), "1", ex=keys.STOP_TTL_S)

    def stop_requested(self, trace_id: str) -> bool:
        return bool(self._client.exists(keys.stop(trace_id)))

    def clear_stop(self, trace_id: str) -> None:
        self._client.delete(keys.stop(trace_id))

    def index_human_wait(self, trace_id: str, deadline_ms: int) -> None:
        self._client.zadd(keys.HUMAN_WAITS, {trace_id: deadline_ms})

    def expired_human_waits(self, at_ms: int) -> list[str]:
        return [str(i) for i in self._client.zrangebyscore(keys.HUMAN_WAITS, "-inf", f"({at_ms}")]

    def forget_human_wait(self, trace_id: str) -> bool:
        return self._client.zrem(keys.HUMAN_WAITS, trace_id) == 1

    def acquire_lease(self, trace_id: str, owner: str, ttl_ms: int) -> bool:
        args: list[str | int] = [owner, ttl_ms, now_ms() + ttl_ms, trace_id]
        return bool(self._acquire(keys=[keys.lease(trace_id), keys.RUNNING], args=args))

    def renew_lease(self, trace_id: str, owner: str, ttl_ms: int) -> bool:
        args: list[str | int] = [owner, ttl_ms, now_ms() + ttl_ms, trace_id]
        return bool(self._renew(keys=[keys.lease(trace_id), keys.RUNNING], args=args))

    def release_lease(self, trace_id: str, owner: str) -> None:
        self._release(keys=[keys.lease(trace_id), keys.RUNNING], args=[owner, trace_id])

    def expired_leases(self, at_ms: int) -> list[str]:
        return [str(i) for i in self._client.zrangebyscore(keys.RUNNING, "-inf", f"({at_ms}")]

    def forget_running(self, trace_id: str) -> bool:
        return self._client.zrem(keys.RUNNING, trace_id) == 1

    def unavailable(self, exc: BaseException) -> bool:
        # BusyLoadingError (a restarted Redis reading its file) is a ConnectionError too.
        return isinstance(exc, redis.ConnectionError | redis.TimeoutError)

    def lease_holder(self, trace_id: str) -> str | None:
        holder = self._client.get(keys.lease(trace_id))
        return None if holder is None else str(holder)

    # -- worker heartbeat, presence, outbox -----------------------------------

    def beat(
        self, leases: Sequence[tuple[str, str]], ttl_ms: int, presence: WorkerPresence | None
    ) -> list[bool]:
        now = now_ms()
        pipe = self._client.pipeline(transaction=False)
        if leases:
            lease_keys = [keys.lease(trace_id) for trace_id, _ in leases]
            args: list[str | int] = [ttl_ms, now + ttl_ms]
            args += [item for trace_id, owner in leases for item in (owner, trace_id)]
            self._renew_all(keys=[keys.RUNNING, *lease_keys], args=args, client=pipe)
        if presence is not None:
            pipe.set(keys.worker(presence.node), presence.model_dump_json(), px=ttl_ms)
            for queue in presence.queues:
                pipe.zadd(keys.consumers(queue), {presence.node: now + ttl_ms})
                pipe.zremrangebyscore(keys.consumers(queue), "-inf", now - CONSUMER_TRIM_MS)
        replies = pipe.execute()
        return [bool(r) for r in replies[0]] if leases else []

    def drop_presence(self, presence: WorkerPresence) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.delete(keys.worker(presence.node))
        for queue in presence.queues:
            pipe.zrem(keys.consumers(queue), presence.node)
        pipe.execute()

    def live_consumers(self, queue: str) -> list[str]:
        return [str(n) for n in self._client.zrangebyscore(keys.consumers(queue), now_ms(), "+inf")]

    def outbox_put(self, entry: str, due_ms: int) -> None:
        self._client.zadd(keys.OUTBOX, {entry: due_ms})

    def outbox_done(self, entry: str) -> None:
        self._client.zrem(keys.OUTBOX, entry)

    def outbox_claim(self, at_ms: int, retry_ms: int, limit: int = 100) -> list[str]:
        due = self._claim_due(keys=[keys.OUTBOX], args=[at_ms, at_ms + retry_ms, limit])
        return [str(m) for m in due]

    def append_collected(self, message: Message) -> Message | None:
        if message.tool_call_id is None:
            raise ValueError("append_collected needs a tool result (tool_call_id)")
        body = message.model_dump_json(exclude={"sequence", "parent_sequence"})
        script_keys = [
            *_own_keys(message.trace_id),
            keys.collected(message.trace_id, message.tool_call_id),
        ]
        reply = self._script(self._append_once, script_keys, [keys.TRACE_TTL_S, body])
        return None if reply == 0 else _stored(message, reply)

    def cache_get(self, key: str) -> str | None:
        value = self._client.get(key)
        return None if value is None else str(value)

    def cache_set(self, key: str, value: str, ttl_s: int) -> None:
        if ttl_s <= 0:  # already expired; Redis refuses EX 0
            self._client.delete(key)
        else:
            self._client.set(key, value, ex=ttl_s)

    def count(self, counter: CounterName, by: int = 1) -> None:
        try:
            self._client.hincrby(keys.COUNTERS, counter, by)
        except redis.RedisError:  # a metric must never fail the work it counts
            log.warning("fleet counter %r not updated", counter, exc_info=True)


def _create_call(trace: Trace) -> tuple[list[str], list[str | float]]:
    """The KEYS and ARGV of CREATE_TRACE."""
    fields = _encode(trace.model_dump(mode="json", exclude={"stats"}))
    stats: list[str | float] = [item for pair in trace.stats.model_dump().items() for item in pair]
    script_keys = [keys.trace(trace.trace_id), keys.stats(trace.trace_id), keys.TRACES]
    if trace.parent_trace_id:
        script_keys.append(keys.children(trace.parent_trace_id))
    args: list[str | float] = [trace.trace_id, trace.created_at_ms, keys.TRACE_TTL_S, len(fields)]
    return script_keys, [*args, *fields, *stats]


def _stored(message: Message, reply: Any) -> Message:
    """The message as an append script stored it: `[sequence, parent JSON]`, or nil."""
    if reply is None:
        raise TraceNotFound(f"no trace {message.trace_id!r}")
    sequence, parent = reply
    return message.model_copy(
        update={"sequence": int(sequence), "parent_sequence": json.loads(parent)}
    )


def _own_keys(trace_id: str) -> list[str]:
    """The keys a trace's scripts touch and keep alive together."""
    return [keys.trace(trace_id), keys.stats(trace_id), keys.messages(trace_id)]


def _encode(fields: Mapping[str, Any]) -> list[str]:
    """Field/value items for HSET, each value as JSON."""
    return [item for k, v in fields.items() for item in (k, json.dumps(v, ensure_ascii=False))]


def _decode_messages(stored: Mapping[Any, Any]) -> list[Message]:
    return [Message.model_validate_json(stored[s]) for s in sorted(stored, key=int)]


def _decode_trace(data: Mapping[str, str], stats: Mapping[str, str]) -> Trace | None:
    if not data:
        return None
    fields = {name: json.loads(value) for name, value in data.items()}
    return Trace.model_validate({**fields, "stats": TraceStats.model_validate(stats)})


def _whole(name: str, delta: float) -> int:
    if isinstance(delta, int) or float(delta).is_integer():
        return int(delta)
    raise ValueError(f"stats field {name!r} counts whole units, got {delta!r}")


def _stream_entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """The entries of the one stream an XREAD read; RESP2 and RESP3 shape the reply apart."""
    if not reply:
        return []
    if isinstance(reply, dict):
        (entries,) = reply.values()
        return list(entries[0]) if entries and isinstance(entries[0], list) else list(entries)
    return list(reply[0][1])


class _Script:
    """A write script registered twice: as it is, and behind the lease check (`fenced`)."""

    def __init__(self, client: redis.Redis, source: str) -> None:
        self.plain = client.register_script(source)
        self.fenced = client.register_script(redis_scripts.fenced(source))


def _lease_lost(trace_id: str, exc: redis.ResponseError) -> Exception:
    """`LeaseLost` for a fenced script's refusal; any other script error as it is."""
    if str(exc).startswith(redis_scripts.FENCED_PREFIX):
        return LeaseLost(f"the lease of {trace_id!r} is no longer held by this runner")
    return exc


def _unfenced(fence: tuple[str, str, str] | None, reply: Any) -> Any:
    """A pipelined script's reply, raising what `_script` would have raised."""
    if isinstance(reply, redis.ResponseError):
        raise _lease_lost(fence[0] if fence else "", reply)
    return reply

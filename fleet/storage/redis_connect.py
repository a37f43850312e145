"""How the fleet connects to Redis: one client per process, timeouts, a bounded pool."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import urlsplit

import redis
from redis.exceptions import NoScriptError

from fleet.errors import RedisUnreachable

SOCKET_TIMEOUT_S = 30.0
"""Read timeout of `from_url` clients; blocking event reads are clamped below it."""
CONNECT_TIMEOUT_S = 5.0
HEALTH_CHECK_INTERVAL_S = 30
MAX_CONNECTIONS = 100
"""Connections per client; further threads wait up to POOL_TIMEOUT_S for one."""
POOL_TIMEOUT_S = 20.0


def connect(url: str, *, cluster: bool = False) -> redis.Redis:
    """A client as the store wants it: decoded replies, timeouts and health checks.

    Its pool makes a thread wait for a free connection instead of failing past the cap.
    `cluster` (FLEET_REDIS_CLUSTER=1): redis-py's cluster client, seeded by this node's URL,
    and keys named with hash tags from now on in this process (`keys.use_cluster_layout`).
    """
    if cluster:
        return connect_cluster(url)
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


def connect_cluster(url: str) -> redis.Redis:
    """A `RedisCluster` client (typed as the `Redis` it stands in for: the same commands)."""
    from redis.cluster import RedisCluster

    from fleet.storage import keys

    keys.use_cluster_layout(True)
    client = RedisCluster.from_url(
        url,
        decode_responses=True,
        # As `connect`'s pool: a thread past the cap waits for a connection (the default
        # pool raises "Too many connections" at once: a worker's 100 runners and its
        # heartbeat share one node's pool when their trees live there).
        connection_pool_class=redis.BlockingConnectionPool,
        max_connections=MAX_CONNECTIONS,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_keepalive=True,
    )
    return cast(redis.Redis, client)


def is_cluster(client: object) -> bool:
    """Whether `client` is redis-py's cluster client."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


class Lua:
    """A Lua script run by its SHA1 (EVALSHA), loaded again when the server lost it.

    The fleet's own hot-path scripts, and kombu's unacked bookkeeping (`workers.kombu_fix`).
    On a plain `redis.Redis` client (`_lean`) the EVALSHA goes straight to a connection of
    the client's pool: redis-py's per-command wrappers (its retry closure, the deprecation
    check around `get_connection`, the observability records) cost more than sending the
    command, ~35 of ~105 us of CPU per call here. Only a connection whose `Retry` retries
    nothing (the store's clients, `connect`, and kombu's) is used so; one lost there is
    dropped and:
    - lost while *sending*, the script did not run: it is sent once more on redis-py's own
      path (where redis-py would have raised; harmless, as nothing ran);
    - lost while *reading the reply*, it may have run (an `APPLY` twice appends a turn
      twice): the error is raised, as redis-py raises it.
    Any other client (one whose policy retries, so that redis-py decides what is resent and
    how often; a pipeline, a single-connection client, fakeredis, a subclass) takes
    redis-py's path from the start.
    A restarted or flushed Redis answers NOSCRIPT: the script is loaded and run once more.
    """

    def __init__(self, source: str) -> None:
        """Hash the source; nothing is sent until the first call."""
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run the script on `client` with these KEYS and ARGV."""
        try:
            if type(client) is redis.Redis and client.connection is None:
                return self._lean(client, keys, args)
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def _lean(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        pool = client.connection_pool
        connection = _take(pool)
        try:
            if connection.retry.get_retries() == 0 and _sent(
                connection, ("EVALSHA", self.sha, len(keys), *keys, *args)
            ):
                return connection.read_response()  # a lost reply raises: it may have run
        finally:
            pool.release(connection)
        return client.evalsha(self.sha, len(keys), *keys, *args)


LOST = (redis.ConnectionError, redis.TimeoutError, OSError)
"""What a lost or stalled connection raises (redis-py's retry policies name the same)."""


def _sent(connection: Any, command: tuple[Any, ...]) -> bool:
    """Whether `command` went out; if not, it did not run and the connection is dropped."""
    try:
        connection.send_command(*command)
    except LOST:
        connection.disconnect()
        return False
    return True


def _take(pool: redis.ConnectionPool) -> Any:
    """A connection of `pool`, as `pool.get_connection()` gives it, without its wrapper.

    redis-py 8 wraps `get_connection` in `deprecated_args` (a warning for callers that pass
    the old arguments; this passes none), which inspects every call's arguments; the
    function it wraps is its `__wrapped__`. Without one (another redis-py), the method.
    """
    method = type(pool).get_connection
    return getattr(method, "__wrapped__", method)(pool)


def redact_url(url: str) -> str:
    """The URL without its password (in the userinfo or a `password=` query), safe to print."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    user = f"{parts.username}@" if parts.username else ""
    query = "&".join(p for p in parts.query.split("&") if p and not p.startswith("password="))
    return f"{parts.scheme}://{user}{host}{parts.path}" + (f"?{query}" if query else "")


def unreachable(url: str, exc: BaseException) -> RedisUnreachable:
    """`RedisUnreachable` naming the (password-free) URL of a Redis that could not be reached."""
    reason = str(exc) or type(exc).__name__
    password = urlsplit(url).password
    if password:  # belt and braces: no redis-py message should carry it
        reason = reason.replace(password, "***")
    return RedisUnreachable(f"cannot reach Redis at {redact_url(url)!r}: {reason}")

"""How the fleet connects to Redis: one client per process, timeouts, a bounded pool."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.exceptions import NoScriptError
from redis.sentinel import Sentinel, SentinelConnectionPool

from fleet.errors import ConfigError, RedisUnreachable
from fleet.storage.backends.redis import sentinel as redis_sentinel
from fleet.storage.backends.redis.urls import SENTINEL_SEPARATOR, is_sentinel, parse_sentinel

SOCKET_TIMEOUT_S = 30.0
"""Read timeout of `from_url` clients; blocking event reads are clamped below it."""
CONNECT_TIMEOUT_S = 5.0
HEALTH_CHECK_INTERVAL_S = 30
MAX_CONNECTIONS = 100
"""Connections per client; further threads wait up to POOL_TIMEOUT_S for one."""
POOL_TIMEOUT_S = 20.0


SENTINEL_TIMEOUT_S = 2.0
"""Connect and read timeout of one sentinel's answer (who the master is): a dead sentinel
costs this long before the next one is asked."""


UNAVAILABLE = (
    redis.ConnectionError,  # BusyLoadingError (a restarted Redis reading its file) too
    redis.TimeoutError,
    redis.exceptions.ClusterDownError,  # MasterDownError too
    redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError,
)
"""What a store away for a moment raises: a Cluster failing a master over answers CLUSTERDOWN
or TRYAGAIN, a Sentinel master just demoted READONLY, until the new one serves. A run cut off
by them is interrupted and recovered, not failed (bench/chaos saw a branch fail "crashed" on
a CLUSTERDOWN while a killed master's replica was being promoted)."""


def away(exc: BaseException) -> bool:
    """Whether `exc` says the store is away for a moment (the next try may succeed).

    `UNAVAILABLE`, or a Cluster client's redirections used up while slots move or a master
    is replaced (redis-py's "TTL exhausted": a chaos run's branches failed "crashed" on it
    during a slot migration).
    """
    if isinstance(exc, UNAVAILABLE):
        return True
    return isinstance(exc, redis.exceptions.ClusterError) and str(exc).startswith("TTL exhausted")


def connect(
    url: str,
    sentinel_master: str | None = None,
    *,
    timeout_s: float | None = None,
    cluster: bool = False,
) -> redis.Redis:
    """A client as the store wants it: decoded replies, timeouts and health checks.

    Its pool makes a thread wait for a free connection instead of failing past the cap.
    `rediss://` URLs carry their TLS options in the query (redis-py reads them);
    a `sentinel://h:p;sentinel://h2:p` URL gives a client of the master named
    `sentinel_master`, which asks the sentinels again whenever a connection to it is made
    (after a failover, the promoted replica). `timeout_s` shortens the socket timeouts
    (a probe: `fleet doctor`, discovery). `cluster` (FLEET_REDIS_CLUSTER=1): redis-py's
    cluster client, seeded by this node's URL, and keys named with hash tags from now on in
    this process (`keys.use_cluster_layout`).

    Raises:
        ConfigError: a `sentinel://` URL without a master name, or a malformed one; a
            `sentinel://` URL with `cluster` (a cluster has no sentinels).
    """
    options: dict[str, Any] = {
        "decode_responses": True,
        "max_connections": MAX_CONNECTIONS,
        "timeout": POOL_TIMEOUT_S,
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        "socket_timeout": timeout_s or SOCKET_TIMEOUT_S,
        "socket_connect_timeout": timeout_s or CONNECT_TIMEOUT_S,
        "socket_keepalive": True,
    }
    if cluster:
        if is_sentinel(url):
            raise ConfigError(
                "FLEET_REDIS_CLUSTER=1 takes a redis:// or rediss:// URL of a cluster node,"
                " not a sentinel:// URL"
            )
        return connect_cluster(url, timeout_s=timeout_s)
    if is_sentinel(url):
        return _sentinel_client(url, sentinel_master, options)
    return redis.Redis.from_pool(redis.BlockingConnectionPool.from_url(url, **options))


def answers(url: str, sentinel_master: str | None = None, *, timeout_s: float = 1.0) -> bool:
    """Whether a Redis at `url` answers PING within `timeout_s` (the master, for Sentinel).

    A probe that writes nothing: discovery asks it of a `fleet up`'s Redis before trusting
    its `up.json`, and of the default Redis before a client would write there.
    """
    try:
        client = connect(url, sentinel_master, timeout_s=timeout_s)
    except ConfigError:  # a sentinel:// URL without its master's name
        return False
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """redis-py's Sentinel pool of the master, blocking at its cap as `connect`'s pools do.

    `SentinelConnectionPool` resolves the master through the sentinels when a connection
    connects and drops idle connections to a master that changed; `BlockingConnectionPool`
    makes a thread wait for a free connection. Neither overrides what the other defines
    but `__init__`, `reset` and `owns_connection`, which call on along the chain.
    """


def _sentinel_client(url: str, master: str | None, options: dict[str, Any]) -> redis.Redis:
    if not master:
        raise ConfigError(
            "FLEET_REDIS_URL is a sentinel:// URL: set FLEET_REDIS_SENTINEL_MASTER to the"
            " name of the master the sentinels monitor"
        )
    parsed = parse_sentinel(url)
    timeout_s = min(SENTINEL_TIMEOUT_S, options["socket_connect_timeout"])
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(parsed.sentinels),
        sentinel_kwargs=redis_sentinel.sentinel_kwargs(parsed.options, timeout_s),
    )
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        master,
        redis_class=redis.Redis,
        connection_pool_class=BlockingSentinelPool,
        db=parsed.db,
        username=parsed.username,
        password=parsed.password,
        **redis_sentinel.redis_kwargs(parsed.options),  # TLS: SentinelManagedSSLConnection
        **options,
    )
    return client


def connect_cluster(url: str, *, timeout_s: float | None = None) -> redis.Redis:
    """A `RedisCluster` client (typed as the `Redis` it stands in for: the same commands)."""
    from fleet.storage import keys

    keys.use_cluster_layout(True)
    client = _cluster_class().from_url(
        url,
        decode_responses=True,
        # As `connect`'s pool: a thread past the cap waits for a connection (the default
        # pool raises "Too many connections" at once: a worker's 100 runners and its
        # heartbeat share one node's pool when their trees live there).
        connection_pool_class=redis.BlockingConnectionPool,
        max_connections=MAX_CONNECTIONS,
        socket_timeout=timeout_s or SOCKET_TIMEOUT_S,
        socket_connect_timeout=timeout_s or CONNECT_TIMEOUT_S,
        socket_keepalive=True,
    )
    return cast(redis.Redis, client)


def _cluster_class() -> type[Any]:
    """`RedisCluster` whose registered scripts run as EVAL on NOSCRIPT (see `Lua`)."""
    from redis.cluster import RedisCluster
    from redis.commands.core import Script

    class EvalOnNoScript(Script):
        def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
            try:
                return super().__call__(keys, args, client)
            except NoScriptError:  # SCRIPT LOAD went to masters that do not serve the keys
                keys, args = list(keys or []), list(args or [])
                target = client if client is not None else self.registered_client
                return target.eval(str(self.script), len(keys), *keys, *args)

    class FleetCluster(RedisCluster):
        def register_script(self, script: Any) -> Script:
            return EvalOnNoScript(self, script)

    return FleetCluster


def close_client(client: redis.Redis) -> None:
    """Close `client` and disconnect every connection of its pools.

    redis-py 8.1's `RedisCluster.close` closes each node's client, but a node client built
    around a given pool (as `from_url` builds them) leaves its pool connected: the sockets
    stay open until the garbage collector finds them, with a ResourceWarning.
    """
    if is_cluster(client):
        cast(Any, client).disconnect_connection_pools()
    client.close()


def is_cluster(client: object) -> bool:
    """Whether `client` is redis-py's cluster client."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


class Lua:
    """A Lua script run by its SHA1 (EVALSHA), loaded again when the server lost it.

    The fleet's own hot-path scripts, and kombu's unacked bookkeeping
    (`workers.patches.kombu_redis`).
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
    A restarted or flushed Redis answers NOSCRIPT: the script is run once more as EVAL.
    Not SCRIPT LOAD then EVALSHA: on a Cluster just failed over, the client's SCRIPT LOAD
    goes to the masters it knows, which need not be the promoted replica now serving the
    keys, and the second EVALSHA met NOSCRIPT again (a chaos run failed a trace "crashed").
    The lean path takes only connections of the classes in LEAN_CONNECTIONS (TCP, TLS, a
    Unix socket); others (a Sentinel-managed one, which re-resolves the master and turns
    a demoted master's READONLY into a reconnect) go through redis-py.
    """

    def __init__(self, source: str) -> None:
        """Hash the source; nothing is sent until the first call."""
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run the script on `client` with these KEYS and ARGV."""
        try:
            if (
                type(client) is redis.Redis
                and client.connection is None
                and client.connection_pool.connection_class in LEAN_CONNECTIONS
            ):
                return self._lean(client, keys, args)
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:  # EVAL goes where the keys are (and caches the script there)
            return client.eval(self.source, len(keys), *keys, *args)

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


LEAN_CONNECTIONS = (redis.Connection, redis.SSLConnection, redis.UnixDomainSocketConnection)
"""Connection classes `Lua` sends on directly. `SSLConnection` differs from `Connection` only
in how it opens its socket (a TLS error is an `OSError`, counted as LOST)."""

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
    """The URL without its password (in the userinfo or a `password=` query), safe to print.

    A Sentinel group's URL (`sentinel://h:p;sentinel://h2:p`) is redacted part by part.
    """
    if SENTINEL_SEPARATOR in url and is_sentinel(url):
        return SENTINEL_SEPARATOR.join(map(_redact_one, url.split(SENTINEL_SEPARATOR)))
    return _redact_one(url)


def _redact_one(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket: say nothing of the URL
        return "<malformed URL>"
    host = parts.netloc.rpartition("@")[2]
    user = f"{parts.username}@" if parts.username else ""
    query = "&".join(p for p in parts.query.split("&") if p and not _secret_option(p))
    return f"{parts.scheme}://{user}{host}{parts.path}" + (f"?{query}" if query else "")


def _secret_option(item: str) -> bool:
    """`password=...`, `sentinel_password=...`: a query option that holds a password."""
    return item.partition("=")[0].lower().endswith("password")


def unreachable(url: str, exc: BaseException) -> RedisUnreachable:
    """`RedisUnreachable` naming the (password-free) URL of a Redis that could not be reached."""
    reason = str(exc) or type(exc).__name__
    for part in url.split(SENTINEL_SEPARATOR):
        try:
            password = urlsplit(part).password
        except ValueError:
            password = None
        sentinels = parse_qs(part.partition("?")[2]).get(redis_sentinel.SENTINEL_PASSWORD, [])
        for secret in filter(None, [password, *sentinels]):  # no redis-py message should say it
            reason = reason.replace(secret, "***").replace(unquote(secret), "***")
    return RedisUnreachable(f"cannot reach Redis at {redact_url(url)!r}: {reason}")

"""How the fleet connects to Redis: one client per process, timeouts, a bounded pool."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any
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


class Lua:
    """A Lua script run by its SHA1 (EVALSHA), loaded again when the server lost it.

    The fleet's own hot-path scripts: one `evalsha` (redis-py's pooling, reconnect and retry
    as for any command) without `redis.commands.Script`'s per-call work (tuples of the keys
    and arguments, a pipeline check, an import), a few microseconds a call. A restarted or
    flushed Redis answers NOSCRIPT: the script is loaded and run once more.
    """

    def __init__(self, source: str) -> None:
        """Hash the source; nothing is sent until the first call."""
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run the script on `client` with these KEYS and ARGV."""
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys), *keys, *args)


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

"""The Redis URL forms the fleet takes, read once: one node, TLS, or a Sentinel group.

- `redis://[user:password@]host:port/db`, `unix://...`: one node, as redis-py reads them.
- `rediss://user:password@host:port/db?ssl_ca_certs=CA&ssl_certfile=CERT&ssl_keyfile=KEY
  &ssl_cert_reqs=required`: TLS, the options in the query as redis-py, kombu and Celery's
  result backend each read them. `check_url` adds `ssl_cert_reqs=required` when it is
  missing: kombu would otherwise connect without checking the certificate (its default)
  and Celery's backend would refuse the URL.
- `sentinel://[user:password@]host:port[/db][?options];sentinel://host2:port2`: a Sentinel
  group as Celery writes it; the master's name comes from `FLEET_REDIS_SENTINEL_MASTER`. The
  user, password and database (of the first part, as Celery reads them) are the master's;
  the first part's options (`fleet.storage.backends.redis.sentinel`) add TLS to the master and the
  sentinels' own password.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from fleet.errors import ConfigError
from fleet.storage.backends.redis.sentinel import SentinelOptions, parse_options

REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel")
SENTINEL_SCHEME = "sentinel"
SENTINEL_SEPARATOR = ";"
DEFAULT_SENTINEL_PORT = 26379
CERT_REQS = ("required", "optional", "none")
"""`ssl_cert_reqs` values all three readers take (redis-py, kombu, Celery's backend)."""


@dataclass(frozen=True)
class SentinelUrl:
    """What a `sentinel://` URL names: the sentinels, and how to talk to the master."""

    sentinels: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    options: SentinelOptions = SentinelOptions()
    """The first part's query: TLS to the master, the sentinels' password."""


def is_sentinel(url: str) -> bool:
    """Whether `url` names a Sentinel group (`sentinel://...`)."""
    return url.partition("://")[0].lower() == SENTINEL_SCHEME


def parse_sentinel(url: str, name: str = "FLEET_REDIS_URL") -> SentinelUrl:
    """The parts of a `sentinel://h:p;sentinel://h2:p` URL.

    Raises:
        ConfigError: a part that is not `sentinel://host[:port][/db]`; the message names
            `name` and the part's position, never the URL (it may hold a password).
    """
    chunks = [c.strip() for c in url.split(SENTINEL_SEPARATOR) if c.strip()]
    sentinels: list[tuple[str, int]] = []
    for index, chunk in enumerate(chunks, 1):
        try:
            parts = urlsplit(chunk)
            port = parts.port or DEFAULT_SENTINEL_PORT
        except ValueError:
            parts, port = None, 0
        if parts is None or parts.scheme != SENTINEL_SCHEME or not parts.hostname:
            raise ConfigError(f"{name}: part {index} is not sentinel://host:port")
        if parts.query and index > 1:
            raise ConfigError(f"{name}: part {index}: only the first part takes ?options")
        sentinels.append((parts.hostname, port))
    if not sentinels:
        raise ConfigError(f"{name}: no sentinel://host:port in the URL")
    first = urlsplit(chunks[0])
    db_text = first.path.strip("/") or "0"
    if not db_text.isdecimal():
        raise ConfigError(f"{name}: the database {db_text!r} is not a number")
    return SentinelUrl(
        tuple(sentinels),
        int(db_text),
        unquote(first.username) if first.username else None,
        unquote(first.password) if first.password else None,
        parse_options(first.query, name),
    )


def check_url(url: str, name: str) -> str:
    """`url` as the fleet uses it: a `rediss://` URL gets `ssl_cert_reqs=required` if unset.

    Raises:
        ConfigError: a bad `ssl_cert_reqs`, or a malformed `sentinel://` URL.
    """
    scheme = url.partition("://")[0].lower()
    if scheme == SENTINEL_SCHEME:
        parse_sentinel(url, name)
        return url
    if scheme != "rediss":
        return url
    query = url.partition("?")[2]
    reqs = [v for k, v in parse_qsl(query, keep_blank_values=True) if k == "ssl_cert_reqs"]
    if not reqs:
        return url + ("&" if query else "" if url.endswith("?") else "?") + "ssl_cert_reqs=required"
    if any(v not in CERT_REQS for v in reqs):
        raise ConfigError(f"{name}: ssl_cert_reqs must be one of {', '.join(CERT_REQS)}")
    return url


def fleet_url(url: str, name: str) -> str:
    """FLEET_REDIS_URL (or the variable `name`) as the fleet uses it (`check_url`).

    Raises:
        ConfigError: a scheme the fleet does not take, or a malformed TLS or Sentinel URL;
            the message names the scheme or the part, never the URL (it may hold a password).
    """
    scheme = urlsplit(url).scheme
    if url and scheme not in REDIS_SCHEMES:
        raise ConfigError(
            f"{name} must start with redis://, rediss://, unix:// or sentinel://"
            + (f" (not {scheme}://)" if scheme else "")
        )
    return check_url(url, name)


def sentinel_master(env: Mapping[str, str], *urls: str) -> str | None:
    """FLEET_REDIS_SENTINEL_MASTER; `ConfigError` if a sentinel:// URL needs it and it is unset."""
    master = (env.get("FLEET_REDIS_SENTINEL_MASTER") or "").strip() or None
    if master is None and any(map(is_sentinel, urls)):
        raise ConfigError(
            "a sentinel:// URL needs FLEET_REDIS_SENTINEL_MASTER: the name of the master"
            " its sentinels monitor"
        )
    return master


def result_backend_url(env: Mapping[str, str], redis_url: str, cluster: bool) -> str:
    """FLEET_RESULT_BACKEND_URL, a single Redis: required apart from a cluster store."""
    url = env.get("FLEET_RESULT_BACKEND_URL", "").strip()
    if cluster and not url:
        raise ConfigError(
            "FLEET_REDIS_CLUSTER=1 needs FLEET_RESULT_BACKEND_URL: a single Redis for Celery's"
            " results (Celery cannot use a Redis Cluster)"
        )
    if cluster and url == redis_url:  # Celery's plain client on a cluster node: CROSSSLOT, MOVED
        raise ConfigError(
            "FLEET_RESULT_BACKEND_URL names the cluster (it is FLEET_REDIS_URL): Celery's"
            " results need a single Redis apart from the cluster"
        )
    return fleet_url(url, "FLEET_RESULT_BACKEND_URL") if url else redis_url

"""What a `sentinel://` URL's query adds: TLS to the master, a password on the sentinels.

    sentinel://:MASTER-PW@h1:26379/0?ssl_ca_certs=CA&ssl_certfile=CERT&ssl_keyfile=KEY
        &sentinel_password=SENTINEL-PW;sentinel://h2:26379

The first part's query (the part that also names the master's credentials and database)
holds the options; later parts take none. Any `ssl_*` option, or `ssl=true`, reaches the
master (and whichever replica the sentinels promote) over TLS, with the certificate
checked (`ssl_cert_reqs=required` unless the URL says otherwise), as a `rediss://` URL
does; the sentinels themselves are asked over plain TCP. `sentinel_password` is the
sentinels' `requirepass` (the master's password stays in the userinfo).

Three readers take these apart from the URL, each in its own form: the store's redis-py
client (`redis_kwargs`, `sentinel_kwargs`), kombu's Sentinel transport and Celery's
Sentinel result backend (`ssl_options` as `broker_use_ssl`/`redis_backend_use_ssl`,
`sentinel_kwargs` in their transport options). Celery and kombu are handed the URL
without its query (`without_query`): neither reads these options there, and Celery's
worker banner would print the query (the sentinels' password) as it is.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from fleet.errors import ConfigError

SENTINEL_PASSWORD = "sentinel_password"
TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
"""`ssl_cert_reqs` values, and the `ssl` constants Celery's and kombu's TLS settings take."""
SWITCH = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
OPTIONS = ("ssl", "ssl_cert_reqs", *TLS_FILES, SENTINEL_PASSWORD)


@dataclass(frozen=True)
class SentinelOptions:
    """TLS to the master (its options, or none) and the sentinels' password."""

    tls: tuple[tuple[str, str], ...] = ()
    """`ssl_*` options as redis-py names them, `ssl_cert_reqs` included; empty: plain TCP."""
    sentinel_password: str | None = field(default=None, repr=False)


def parse_options(query: str, name: str) -> SentinelOptions:
    """The options of a `sentinel://` URL's first part.

    Raises:
        ConfigError: an option not in OPTIONS, an `ssl` or `ssl_cert_reqs` value not
            understood; the message names the option, never a value.
    """
    items = parse_qsl(query, keep_blank_values=True)
    for key, _ in items:
        if key not in OPTIONS:
            raise ConfigError(
                f"{name}: sentinel:// takes only the options {', '.join(OPTIONS)} (not {key!r})"
            )
    given = dict(items)
    switch = SWITCH.get(given.get("ssl", "").lower()) if "ssl" in given else None
    if "ssl" in given and switch is None:
        raise ConfigError(f"{name}: ssl must be true or false")
    reqs = given.get("ssl_cert_reqs", "required")
    if reqs not in CERT_REQS:
        raise ConfigError(f"{name}: ssl_cert_reqs must be one of {', '.join(CERT_REQS)}")
    files = tuple((k, given[k]) for k in TLS_FILES if given.get(k))
    tls_on = switch if switch is not None else bool(files or "ssl_cert_reqs" in given)
    tls = (*files, ("ssl_cert_reqs", reqs)) if tls_on else ()
    return SentinelOptions(tls, given.get(SENTINEL_PASSWORD) or None)


def without_query(url: str, separator: str = ";") -> str:
    """The URL as Celery and kombu get it: every part without its `?options`."""
    return separator.join(part.partition("?")[0] for part in url.split(separator))


def redis_kwargs(options: SentinelOptions) -> dict[str, Any]:
    """redis-py's keyword arguments for the master's connections (`master_for`)."""
    return {"ssl": True, **dict(options.tls)} if options.tls else {}


def ssl_options(options: SentinelOptions) -> dict[str, Any] | None:
    """Celery's `redis_backend_use_ssl` / `broker_use_ssl`: the options, `ssl` constants."""
    if not options.tls:
        return None
    found = dict(options.tls)
    return {**found, "ssl_cert_reqs": CERT_REQS[found["ssl_cert_reqs"]]}


def sentinel_kwargs(options: SentinelOptions, timeout_s: float) -> dict[str, Any]:
    """How a sentinel is asked who the master is: short timeouts, and its password."""
    asking: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if options.sentinel_password:
        asking["password"] = options.sentinel_password
    return asking


def for_celery(url: str, name: str = "FLEET_BROKER_URL") -> tuple[str, dict[str, Any] | None]:
    """A URL as Celery and kombu take it, and its TLS settings (None: as the URL says).

    A `sentinel://` URL loses its options (`without_query`) and gives its TLS as
    `ssl_options`; any other URL is theirs as it is.
    """
    if url.partition("://")[0].lower() != "sentinel":
        return url, None
    first_query = url.split(";", 1)[0].partition("?")[2]
    return without_query(url), ssl_options(parse_options(first_query, name))

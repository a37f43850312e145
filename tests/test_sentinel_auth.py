"""Sentinel with TLS to the master and a password on the sentinels (`backends.redis.sentinel`).

The first `sentinel://` part's options: `ssl_*` (TLS to the master, as `rediss://` takes
them) and `sentinel_password` (the sentinels' `requirepass`). Each of the three readers
gets them: the store's redis-py client, kombu's Sentinel transport, Celery's Sentinel
result backend; none of them prints the sentinels' password.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from redis.sentinel import SentinelManagedSSLConnection

from fleet.errors import ConfigError
from fleet.settings import Settings
from fleet.storage.backends.redis.connect import redact_url, unreachable
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.backends.redis.urls import parse_sentinel
from fleetops.doctor import check_broker
from tests.redis_topologies import MASTER_NAME, SentinelGroup, make_certs, sentinel_group
from workers.app import create_app, make_config

SENTINEL_PW = "sentinel-Pw-7"
TLS_GROUP = (
    "sentinel://:master-Pw-3@10.0.0.1:26379/2?ssl_ca_certs=/ca.crt&ssl_certfile=/c.crt"
    f"&ssl_keyfile=/c.key&sentinel_password={SENTINEL_PW};sentinel://10.0.0.2:26380/2"
)


def settings_of(url: str) -> Settings:
    return Settings.from_env({"FLEET_REDIS_URL": url, "FLEET_REDIS_SENTINEL_MASTER": MASTER_NAME})


def test_the_first_part_names_tls_to_the_master_and_the_sentinels_password() -> None:
    parsed = parse_sentinel(TLS_GROUP)
    assert parsed.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
    assert (parsed.db, parsed.password) == (2, "master-Pw-3")
    assert dict(parsed.options.tls) == {
        "ssl_ca_certs": "/ca.crt",
        "ssl_certfile": "/c.crt",
        "ssl_keyfile": "/c.key",
        "ssl_cert_reqs": "required",  # checked unless the URL says otherwise
    }
    assert parsed.options.sentinel_password == SENTINEL_PW
    assert SENTINEL_PW not in repr(parsed)
    plain = parse_sentinel("sentinel://h:1?ssl=true;sentinel://h:2")
    assert dict(plain.options.tls) == {"ssl_cert_reqs": "required"}
    assert parse_sentinel("sentinel://h:1?sentinel_password=x").options.tls == ()


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("sentinel://h:1?ssl_cert_reqs=sometimes", "ssl_cert_reqs must be one of"),
        ("sentinel://h:1?ssl=maybe", "ssl must be true or false"),
        ("sentinel://h:1?socket_timeout=1", "(not 'socket_timeout')"),
        ("sentinel://h:1;sentinel://h:2?sentinel_password=pw-in-2", "only the first part"),
        ("sentinel://h:1?password=pw-in-q", "(not 'password')"),
    ],
)
def test_a_bad_option_is_one_line_without_its_value(url: str, complaint: str) -> None:
    with pytest.raises(ConfigError) as bad:
        settings_of(url)
    message = str(bad.value)
    assert complaint in message and "\n" not in message
    assert "pw-in" not in message and "FLEET_REDIS_URL" in message


def test_celery_and_kombu_get_the_url_without_its_options_and_tls_and_password_apart() -> None:
    config = make_config(settings_of(TLS_GROUP))
    for name in ("broker_url", "result_backend"):
        assert "?" not in config[name] and SENTINEL_PW not in config[name]
        assert config[name].startswith("sentinel://:master-Pw-3@10.0.0.1:26379/2;")
    for name in ("broker_use_ssl", "redis_backend_use_ssl"):
        assert config[name]["ssl_cert_reqs"] == ssl.CERT_REQUIRED
        assert config[name]["ssl_ca_certs"] == "/ca.crt"
    for name in ("broker_transport_options", "result_backend_transport_options"):
        assert config[name]["sentinel_kwargs"]["password"] == SENTINEL_PW
    plain = make_config(settings_of("sentinel://h:1;sentinel://h:2"))
    assert "broker_use_ssl" not in plain and "redis_backend_use_ssl" not in plain
    assert "password" not in plain["broker_transport_options"]["sentinel_kwargs"]


def test_the_sentinels_password_is_never_printed() -> None:
    assert SENTINEL_PW not in redact_url(TLS_GROUP)
    assert "ssl_ca_certs=/ca.crt" in redact_url(TLS_GROUP)
    error = unreachable(TLS_GROUP, redis.AuthenticationError(f"AUTH {SENTINEL_PW} refused"))
    assert SENTINEL_PW not in str(error)


# -- real groups ----------------------------------------------------------------------------


def assert_every_reader_reaches_the_master(url: str, connection_class: type) -> None:
    """The store, Celery's result backend and kombu's broker, through the sentinels."""
    with RedisStore.from_url(url, MASTER_NAME) as store:
        store.ping()
        assert store.client.set("fleet:probe", "store")
        assert store.client.connection_pool.connection_class is connection_class
    settings = settings_of(url)
    app = create_app(settings, set_as_current=False)
    try:
        app.backend.client.set("celery-probe", "backend")
        assert app.backend.client.get("celery-probe") == b"backend"
    finally:
        app.close()
    check = check_broker(settings.broker_url, MASTER_NAME)
    assert check.status == "ok", check


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[SentinelGroup]:
    """Sentinels that require SENTINEL_PW."""
    with sentinel_group(tmp_path / "redis", sentinels=2, sentinel_password=SENTINEL_PW) as group:
        yield group


@pytest.mark.integration
def test_sentinels_with_a_password_are_reached_and_it_is_never_printed(
    guarded: SentinelGroup,
) -> None:
    assert "sentinel_password=" in guarded.url
    from redis.sentinel import SentinelManagedConnection

    assert_every_reader_reaches_the_master(guarded.url, SentinelManagedConnection)
    wrong = guarded.url.replace(quote(SENTINEL_PW, safe=""), "wrong-Pw-0")
    with RedisStore.from_url(wrong, MASTER_NAME) as store:
        with pytest.raises(ConfigError) as refused:
            store.ping()
    assert "wrong-Pw-0" not in str(refused.value) and "\n" not in str(refused.value)
    without = guarded.url.split("?", 1)[0] + ";" + guarded.url.split(";", 1)[1]
    with RedisStore.from_url(without, MASTER_NAME) as store:
        with pytest.raises(ConfigError):  # the sentinels refuse to say who the master is
            store.ping()


@pytest.mark.integration
def test_a_tls_master_behind_password_protected_sentinels(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    options = (
        f"ssl_ca_certs={certs.ca}&ssl_certfile={certs.client_cert}"
        f"&ssl_keyfile={certs.client_key}&sentinel_password={SENTINEL_PW}"
    )
    with sentinel_group(
        tmp_path / "redis", password="master-Pw-3", sentinel_password=SENTINEL_PW, certs=certs
    ) as group:
        url = group.url.split("?", 1)[0] + "?" + options
        assert_every_reader_reaches_the_master(url, SentinelManagedSSLConnection)
        plain = group.url  # the same group without TLS: the master refuses plain TCP
        with RedisStore.from_url(plain, MASTER_NAME) as store:
            with pytest.raises(ConfigError):
                store.ping()

"""The fleet behind Sentinel: `sentinel://h:p;sentinel://h2:p` + FLEET_REDIS_SENTINEL_MASTER.

The store and the limiter follow the master the sentinels name (a failover included); the
Celery broker and result backend use kombu's and Celery's Sentinel classes; a tree whose
master dies mid-explore still ends (`bench/failover.py`, 20 runs in the large suite).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.backends.redis import SentinelBackend
from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection

from fleet.errors import ConfigError
from fleet.limits.backends.redis.limiter import Limiter
from fleet.limits.providers import Admitted, Scope
from fleet.llm.config import RateLimits
from fleet.security.redact import Redactor
from fleet.settings import Settings
from fleet.storage.backends.redis.connect import Lua, connect, redact_url, unreachable
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.backends.redis.urls import parse_sentinel
from tests.redis_topologies import MASTER_NAME, SentinelGroup, sentinel_group
from workers.app import create_app, make_config
from workers.patches.result_backend import SendOnlySentinelBackend

GROUP = "sentinel://:s3cret-pw@10.0.0.1:26379/2;sentinel://:s3cret-pw@10.0.0.2:26380/2"


# -- reading the URL (no server) ----------------------------------------------------------


def test_a_sentinel_url_names_every_sentinel_and_the_masters_database() -> None:
    parsed = parse_sentinel(GROUP)
    assert parsed.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
    assert (parsed.db, parsed.password) == (2, "s3cret-pw")
    assert "s3cret" not in repr(parsed)


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("sentinel://h:1;redis://h:2", "part 2 is not sentinel://host:port"),
        ("sentinel://h:1/x", "the database 'x' is not a number"),
        ("sentinel://h:1;sentinel://h:2?ssl=true", "only the first part takes ?options"),
        ("sentinel://h:notaport", "part 1 is not sentinel://host:port"),
    ],
)
def test_a_malformed_sentinel_url_is_one_line_naming_the_part(url: str, complaint: str) -> None:
    env = {"FLEET_REDIS_URL": url, "FLEET_REDIS_SENTINEL_MASTER": MASTER_NAME}
    with pytest.raises(ConfigError) as bad:
        Settings.from_env(env)
    assert complaint in str(bad.value) and "\n" not in str(bad.value)


def test_a_sentinel_url_without_the_master_name_is_refused_without_the_password() -> None:
    with pytest.raises(ConfigError) as bad:
        Settings.from_env({"FLEET_REDIS_URL": GROUP})
    assert "FLEET_REDIS_SENTINEL_MASTER" in str(bad.value)
    assert "s3cret" not in str(bad.value)
    with pytest.raises(ConfigError):  # the broker alone on Sentinel needs it too
        Settings.from_env({"FLEET_BROKER_URL": GROUP})


def test_the_password_of_every_sentinel_part_is_redacted() -> None:
    assert redact_url(GROUP) == "sentinel://10.0.0.1:26379/2;sentinel://10.0.0.2:26380/2"
    error = unreachable(GROUP, redis.ConnectionError("AUTH s3cret-pw refused"))
    assert "s3cret" not in str(error)
    two = "sentinel://:first-pw-11@h:1;sentinel://:second-pw-22@h:2"
    redactor = Redactor.from_env({"FLEET_REDIS_URL": two})
    assert "-pw-" not in redactor.values_only("tried first-pw-11, then second-pw-22")


def test_celery_gets_the_master_name_and_the_fleets_sentinel_backend() -> None:
    settings = Settings.from_env(
        {"FLEET_REDIS_URL": GROUP, "FLEET_REDIS_SENTINEL_MASTER": MASTER_NAME}
    )
    config = make_config(settings)
    for name in ("broker_transport_options", "result_backend_transport_options"):
        assert config[name]["master_name"] == MASTER_NAME
        assert config[name]["visibility_timeout"] > 0
    app = create_app(settings, set_as_current=False)
    backend = app.backend
    assert isinstance(backend, SendOnlySentinelBackend) and isinstance(backend, SentinelBackend)
    # The fleet's chord join, not Celery's, on the Sentinel backend too.
    assert type(backend).on_chord_part_return is not SentinelBackend.on_chord_part_return
    app.close()


# -- a real group --------------------------------------------------------------------------


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    """Primary, replica and two sentinels on free ports."""
    with sentinel_group(tmp_path / "redis", sentinels=2) as started:
        yield started


def master_port(pool: SentinelConnectionPool) -> int:
    """The port of the master the client's pool connects to now."""
    return int(pool.get_master_address()[1])


@pytest.mark.integration
def test_the_store_and_limiter_follow_the_master_through_a_failover(
    group: SentinelGroup,
) -> None:
    client = connect(group.url, MASTER_NAME)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    store = RedisStore(client)
    limiter = Limiter(client)
    scope = (Scope("provider:p:k", RateLimits(requests_per_minute=6000), provider=True),)
    assert store.client.set("fleet:probe", "before")
    assert isinstance(limiter.admit("t1", scope, 10), Admitted)
    old = group.master_port()
    assert old is not None and master_port(pool) == old
    group.kill_primary()
    group.wait_promoted(old)
    deadline = time.monotonic() + 30
    while True:  # the first commands after the kill may fail: the caller's retry policy
        try:
            store.client.set("fleet:probe", "after")
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "the client never found the new master"
            time.sleep(0.2)
    new = group.master_port()
    assert new != old and master_port(pool) == new
    assert store.client.get("fleet:probe") == "after"
    assert isinstance(limiter.admit("t2", scope, 10), Admitted)  # its scripts, on the new master
    client.close()


@pytest.mark.integration
def test_scripts_take_redis_pys_path_on_sentinel_connections(
    group: SentinelGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = connect(group.url, MASTER_NAME)
    assert client.connection_pool.connection_class is SentinelManagedConnection

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("the lean path took a Sentinel-managed connection")

    monkeypatch.setattr(Lua, "_lean", refuse)
    echo = Lua("return {KEYS[1], ARGV[1]}")
    assert echo(client, ["fleet:k"], ["v"]) == ["fleet:k", "v"]
    client.close()


@pytest.mark.integration
def test_a_sentinel_url_whose_master_name_is_wrong_fails_in_one_line(
    group: SentinelGroup,
) -> None:
    with RedisStore.from_url(group.url, "no-such-master") as store:
        with pytest.raises(ConfigError) as refused:
            store.ping()
    assert "No master found for 'no-such-master'" in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.integration
def test_an_explore_ends_when_the_master_dies_mid_way() -> None:
    from bench import failover

    row = failover.run(1)
    (outcome,) = row.outcomes
    assert outcome.ended and not outcome.stuck, outcome.detail
    assert outcome.recovery_s <= failover.RUN_TIMEOUT_S
    assert outcome.duplicated == 0, outcome.detail


@pytest.mark.integration
def test_fleet_doctor_reaches_redis_and_the_broker_through_the_sentinels(
    group: SentinelGroup, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "FLEET_REDIS_URL": group.url,
        "FLEET_REDIS_SENTINEL_MASTER": MASTER_NAME,
        "FLEET_WORKSPACE": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "doctor"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = (done.stdout + done.stderr).splitlines()
    redis_line = next(line for line in lines if line.startswith("redis "))
    broker_line = next(line for line in lines if line.startswith("broker "))
    assert " ok " in redis_line and group.url in redis_line and "(Redis 7" in redis_line
    assert " ok " in broker_line and "sentinel" in broker_line


@pytest.mark.integration
def test_a_password_protected_master_is_reached_and_its_password_never_printed(
    tmp_path: Path,
) -> None:
    password = "sentinel-Pass-9"
    with sentinel_group(tmp_path / "redis", sentinels=1, password=password) as locked:
        with RedisStore.from_url(locked.url, MASTER_NAME) as store:
            store.ping()
            assert store.client.set("fleet:probe", "1")
        with RedisStore.from_url(locked.url.replace(password, "wrong"), MASTER_NAME) as store:
            with pytest.raises(ConfigError) as refused:
                store.ping()
        assert "wrong" not in str(refused.value) and password not in str(refused.value)
        env = {
            **os.environ,
            "FLEET_REDIS_URL": locked.url,
            "FLEET_REDIS_SENTINEL_MASTER": MASTER_NAME,
            "FLEET_WORKSPACE": str(tmp_path),
        }
        done = subprocess.run(
            [sys.executable, "-m", "fleetops.cli.main", "doctor"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    output = done.stdout + done.stderr
    assert password not in output
    broker = next(line for line in output.splitlines() if line.startswith("broker "))
    assert " ok " in broker, output  # kombu's sentinel transport logged in to the master

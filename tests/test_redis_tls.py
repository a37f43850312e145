"""The fleet on a TLS-only Redis whose clients show a certificate and log in as an ACL user.

The user is `tests.redis_topologies.FLEET_ACL` (the line docs/operations.md documents): the
store and limiter suites, and an explore on real worker processes (broker and result
backend on the same `rediss://` URL), run as that user without one command or key refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from fleet.errors import ConfigError
from fleet.storage.backends.redis.connect import Lua, connect
from fleet.storage.backends.redis.store import RedisStore
from tests.conftest import CHECKOUT, REDIS_ADMIN_URL_ENV, REDIS_URL_ENV
from tests.fleetkit import client, explore_script, fleet_settings
from tests.procs import start_worker, wait_for_workers
from tests.redis_topologies import TlsRedis, make_certs, tls_redis

SUITES = ("test_store.py", "test_limits.py", "test_budget.py", "test_gate.py")
"""The store's and the limiter's own tests, run again against the TLS Redis."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """One TLS Redis for the module."""
    with tls_redis(tmp_path_factory.mktemp("tls")) as started:
        yield started


@pytest.fixture
def admin(server: TlsRedis) -> Iterator[redis.Redis]:
    """The all-powerful user: empties the database first, reads the ACL log after."""
    client = connect(server.admin_url)
    client.flushdb()
    client.acl_log_reset()
    yield client
    client.close()


def refusals(admin: redis.Redis) -> list[str]:
    """What the ACL refused the fleet's user since the log was reset."""
    return [f"{e['reason']} {e['object']}" for e in admin.acl_log(100) if e["username"] == "fleet"]


@pytest.mark.integration
@pytest.mark.timeout(660)  # its own pytest process gets 600 s (four test files, a loaded machine)
def test_store_and_limiter_suites_pass_as_the_fleet_acl_user(
    server: TlsRedis, admin: redis.Redis
) -> None:
    env = {**os.environ, REDIS_URL_ENV: server.url, REDIS_ADMIN_URL_ENV: server.admin_url}
    # Not the `serial` ones: their time bounds need the machine to themselves, and the
    # suite may be running on other processes meanwhile (the scripts they run are tested).
    argv = [sys.executable, "-m", "pytest", "-q", "-m", "integration and not serial"]
    argv += ["-p", "no:cacheprovider"]
    done = subprocess.run(
        [*argv, *(f"tests/{name}" for name in SUITES)],
        cwd=CHECKOUT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in summary and int(summary.split()[0]) >= 50, summary
    assert refusals(admin) == []
    assert server.password not in done.stdout + done.stderr


@pytest.mark.integration
def test_an_explore_runs_on_real_workers_over_tls(
    server: TlsRedis, admin: redis.Redis, tmp_path: Path
) -> None:
    with start_worker(server.url, concurrency=8) as worker:
        wait_for_workers(server.url, [worker.name], timeout_s=60)
        fleet = client(fleet_settings(server.url, tmp_path))
        try:
            model = explore_script(tmp_path / "m.yaml", 12)
            trace = fleet.submit("survey", model=model).wait(timeout_s=120)
            collaborators = fleet.store.collaborators(trace.trace_id)
        finally:
            assert isinstance(fleet.store, RedisStore)
            fleet.store.close()
        log = worker.log()
    assert trace.status == "completed", trace.error
    assert [c.status for c in collaborators] == ["completed"] * 12
    assert refusals(admin) == []  # the ACL line is enough for workers, broker and backend
    assert server.password not in log
    assert "insecure SSL" not in log  # kombu's fallback for a rediss:// URL without options


def test_the_settings_never_drop_certificate_checks() -> None:
    url = "rediss://fleet:pw@h:6380/0?ssl_ca_certs=/ca.crt"
    settings = fleet_settings(url, Path.cwd())
    assert settings.redis_url == url + "&ssl_cert_reqs=required"
    assert settings.broker_url == settings.redis_url
    bare = fleet_settings("rediss://h/0", Path.cwd(), FLEET_BROKER_URL="rediss://b/1")
    assert bare.redis_url == "rediss://h/0?ssl_cert_reqs=required"
    assert bare.broker_url == "rediss://b/1?ssl_cert_reqs=required"
    kept = "rediss://h/0?ssl_cert_reqs=none"  # an operator's explicit choice stays
    assert fleet_settings(kept, Path.cwd()).redis_url == kept
    with pytest.raises(ConfigError) as bad:
        fleet_settings("rediss://fleet:s3cret-pw@h/0?ssl_cert_reqs=CERT_NOPE", Path.cwd())
    assert "ssl_cert_reqs must be one of" in str(bad.value) and "s3cret" not in str(bad.value)


@pytest.mark.integration
def test_a_server_signed_by_another_ca_is_refused_without_leaking_the_password(
    server: TlsRedis, tmp_path: Path
) -> None:
    other = make_certs(tmp_path / "other")
    url = server.url.replace(str(server.certs.ca), str(other.ca))
    with RedisStore.from_url(url) as store, pytest.raises(ConfigError) as refused:
        store.ping()
    message = str(refused.value)
    assert "certificate verify failed" in message and "\n" not in message
    assert server.password not in message and "fleet@127.0.0.1" in message


@pytest.mark.integration
def test_a_client_without_a_certificate_is_refused(server: TlsRedis) -> None:
    url = server.url.split("&ssl_certfile")[0] + "&ssl_cert_reqs=required"
    with RedisStore.from_url(url) as store, pytest.raises(ConfigError) as refused:
        store.ping()
    assert server.password not in str(refused.value)


@pytest.mark.integration
def test_the_fleet_user_cannot_reach_other_keys_or_wipe_the_database(server: TlsRedis) -> None:
    with connect(server.url) as fleet_user:
        with pytest.raises(redis.exceptions.NoPermissionError):
            fleet_user.set("someone-elses-key", "1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            fleet_user.flushdb()


@pytest.mark.integration
def test_fleet_doctor_names_the_tls_redis_without_its_password(
    server: TlsRedis, tmp_path: Path
) -> None:
    env = {**os.environ, "FLEET_REDIS_URL": server.url, "FLEET_WORKSPACE": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "doctor"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert f"rediss://fleet@127.0.0.1:{server.node.port}/0" in output, output
    assert server.password not in output


@pytest.mark.integration
def test_scripts_take_the_lean_path_on_tls_connections(
    server: TlsRedis, admin: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = connect(server.url)
    assert client.connection_pool.connection_class is redis.SSLConnection
    echo = Lua("return {KEYS[1], ARGV[1]}")
    assert echo(client, ["fleet:k"], ["first"]) == ["fleet:k", "first"]  # loaded (NOSCRIPT)

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("went through redis-py's EVALSHA")

    monkeypatch.setattr(redis.Redis, "evalsha", refuse)
    assert echo(client, ["fleet:k"], ["again"]) == ["fleet:k", "again"]
    client.close()

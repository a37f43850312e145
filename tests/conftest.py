"""Shared fixtures: a real Redis for the session, and a `store` over every backend.

Two tiers. `make unit` (`-m "not integration"`) needs no server: the Redis store runs on
fakeredis, its Lua scripts in lupa. Everything that needs one (redis-server, a Celery
worker, RabbitMQ, Chromium, a subprocess fleet) is marked `integration`; `make` runs both.
A test that asks for `redis_url` without the mark is a collection error, so the unit tier
cannot start a server by accident.

`make` runs the suite on several processes (pytest-xdist, `--dist loadfile`: a file on one
process, so its module fixtures, a worker or a whole fleet, start once); the modules that
purge the shared RabbitMQ's fleet queues take turns (`rabbitmq_to_itself`). Tests marked
`serial` hold a time bound that other processes' load would break: they run afterwards,
one at a time in each of two lanes (the `in_process` ones beside the rest).
"""

from __future__ import annotations

import fcntl
import functools
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import fakeredis
import pytest
import redis

import fleet.llm.base
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.backends.redis.connect import connect
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.store import TraceStore
from fleetops.redis_server import start_redis_server

if TYPE_CHECKING:
    from selenium import webdriver

    from fleet.client import Fleet

REDIS_URL_ENV = "FLEET_TEST_REDIS_URL"
"""A Redis to test against instead of a private redis-server; its database is flushed."""
REDIS_ADMIN_URL_ENV = "FLEET_TEST_REDIS_ADMIN_URL"
"""Who empties that database, when the tests' user may not (an ACL user without FLUSHDB)."""


CHECKOUT = Path(__file__).resolve().parent.parent


@functools.cache
def suite_temp_root() -> Path:
    """The folder every temp file of the suite goes under (tmp_path, mkdtemp, workers').

    Not the system temp folder itself: a checkout cloned under /tmp (as CI may) would then
    lie inside the workspace root, and workers refuse to start when a root holds their code.
    0755 so that bash's unprivileged user can reach the workspaces made in it. One folder
    for every test process: it sets TMPDIR to itself, which xdist's workers inherit, so a
    temp folder already named so is the root (before, each call nested one level deeper, and
    `rabbitmq_to_itself`'s lock file differed between processes: it held nothing back).
    """
    base, name = Path(tempfile.gettempdir()).resolve(), f"fleet-tests-{os.geteuid()}"
    root = base if base.name == name else base / name
    if CHECKOUT.is_relative_to(root):
        raise pytest.UsageError(f"the checkout {CHECKOUT} lies inside the suite's temp {root}")
    root.mkdir(exist_ok=True)
    root.chmod(0o755)
    tempfile.tempdir = str(root)
    os.environ["TMPDIR"] = str(root)  # the processes a test starts make theirs there too
    return root


def pytest_configure(config: pytest.Config) -> None:
    # The global switches the suite flips: no test can reach a real model; scripted
    # models may load, and workspaces under the temp folder (tmp_path) are allowed, here
    # and in every worker process a test starts (they inherit this environment). Not the
    # checkout: its .venv and fleet/ are the workers' own code, which no root may hold.
    fleet.llm.base.ALLOW_MODEL_REQUESTS = False
    os.environ["FLEET_ALLOW_SCRIPTED"] = "1"
    os.environ.setdefault("FLEET_WORKSPACE_ROOTS", str(suite_temp_root()))
    # A shell without job control starts background jobs with SIGINT ignored, and the
    # CLI processes the tests interrupt would inherit that: restore the default so the
    # Ctrl-C tests test the CLI, not how the suite was launched.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


SERVER_FIXTURES = frozenset({"redis_url"})
"""Fixtures that start or reach a server; every fixture of a real Redis goes through it."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A unit test that reaches a real Redis would start a server in `make unit`.
    unmarked = [
        item.nodeid
        for item in items
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("integration") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "these tests need a server but are not marked integration: " + ", ".join(unmarked)
        )


@pytest.fixture(scope="module")
def rabbitmq_to_itself() -> Iterator[None]:
    """The shared RabbitMQ for this module alone: its tests purge the fleet queues there
    and start workers on them, so no other test process may use them meanwhile."""
    with (suite_temp_root() / "rabbitmq.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """`FLEET_TEST_REDIS_URL` if set, else a private redis-server for the session."""
    url = os.environ.get(REDIS_URL_ENV)
    if url:
        yield url
        return
    with start_redis_server() as server:
        yield server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client configured as in production, on an emptied database (FLUSHDB first)."""
    client = connect(redis_url)
    flush(redis_url)
    yield client
    client.close()


def flush(redis_url: str) -> None:
    """Empty the test database (as `FLEET_TEST_REDIS_ADMIN_URL`'s user, if set)."""
    with connect(os.environ.get(REDIS_ADMIN_URL_ENV) or redis_url) as admin:
        admin.flushdb()


def fake_redis() -> redis.Redis:
    """A fakeredis client on a server of its own, configured as `connect` configures one."""
    return fakeredis.FakeRedis(
        server=fakeredis.FakeServer(), decode_responses=True, max_connections=1024
    )


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.integration)])
def redis_db(request: pytest.FixtureRequest) -> redis.Redis:
    """A decoded client, emptied: on fakeredis, then on a real Redis (the integration tier)."""
    if request.param == "fakeredis":
        return fake_redis()
    client: redis.Redis = request.getfixturevalue("redis_client")
    return client


@pytest.fixture(
    params=["memory", "fakeredis", pytest.param("redis", marks=pytest.mark.integration)]
)
def store(request: pytest.FixtureRequest) -> TraceStore:
    """Each TraceStore implementation in turn; the Redis one on fakeredis and on a real Redis."""
    if request.param == "memory":
        return MemoryStore()
    if request.param == "fakeredis":
        return RedisStore(fake_redis())
    client: redis.Redis = request.getfixturevalue("redis_client")
    return RedisStore(client)


@pytest.fixture(scope="module")
def one_chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    """One headless Chromium for a module's page tests (each start is ~20 processes)."""
    from tests.browserkit import chromium

    with chromium(tmp_path_factory.mktemp("chromium")) as chrome:
        yield chrome


@pytest.fixture
def browser(one_chromium: webdriver.Chrome) -> Iterator[webdriver.Chrome]:
    """The module's Chromium on a blank page with its log read empty, so an earlier test's
    errors are not this one's (each test serves the page on a port, an origin, of its own)."""
    one_chromium.get("about:blank")
    one_chromium.get_log("browser")
    yield one_chromium


@pytest.fixture(scope="module")
def worker_url(redis_url: str) -> Iterator[str]:
    """A real worker process (threads pool, all fleet queues) on the session Redis, emptied."""
    from tests.procs import start_worker, wait_for_workers

    flush(redis_url)
    with start_worker(redis_url, concurrency=16) as worker:
        wait_for_workers(redis_url, [worker.name], timeout_s=30)
        yield redis_url


@pytest.fixture
def worker_fleet(worker_url: str, tmp_path: Path) -> Iterator[Fleet]:
    """A `Fleet` client of `worker_url`'s worker (workspace `tmp_path`), closed afterwards."""
    from tests.fleetkit import client, fleet_settings

    fleet = client(fleet_settings(worker_url, tmp_path))
    yield fleet
    assert isinstance(fleet.store, RedisStore)
    fleet.store.close()

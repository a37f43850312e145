"""`fleet.redis_connect.Lua` on a real Redis: straight to a pooled connection, the same
replies and errors as redis-py's EVALSHA, no connection kept, a dropped one retried."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fleet.redis_connect import Lua, connect

pytestmark = pytest.mark.integration

ECHO = Lua("return {KEYS[1], ARGV[1], tonumber(ARGV[2]), false, {1, 'x'}}")
FAILS = Lua("return redis.error_reply('FENCED the lease is not held by this runner')")


def in_use(pool: Any) -> int:
    """Connections taken from the pool and not given back."""
    if isinstance(pool, redis.BlockingConnectionPool):
        idle = sum(c is not None for c in pool.pool.queue)
        return len(pool._connections) - idle
    return len(pool._in_use_connections)


@pytest.fixture(params=["decoded", "bytes"])
def client(request: pytest.FixtureRequest, redis_url: str) -> Iterator[redis.Redis]:
    """The store's client (decoded, a blocking pool) and a plain one, as kombu's."""
    made = connect(redis_url) if request.param == "decoded" else redis.Redis.from_url(redis_url)
    yield made
    made.close()


def no_redis_py_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("went through redis-py's EVALSHA")

    monkeypatch.setattr(redis.Redis, "evalsha", refuse)


def test_a_call_returns_what_evalsha_returns_and_keeps_no_connection(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.script_load(ECHO.source)
    expected = client.evalsha(ECHO.sha, 1, "k", "é", "42")
    no_redis_py_path(monkeypatch)
    assert ECHO(client, ["k"], ["é", 42]) == expected
    assert in_use(client.connection_pool) == 0


def test_a_script_error_is_raised_as_redis_py_raises_it_and_the_connection_goes_back(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.script_load(FAILS.source)
    with pytest.raises(redis.ResponseError) as by_redis_py:
        client.evalsha(FAILS.sha, 0)
    no_redis_py_path(monkeypatch)
    with pytest.raises(redis.ResponseError) as ours:
        FAILS(client, [], [])
    assert str(ours.value) == str(by_redis_py.value)
    assert in_use(client.connection_pool) == 0
    assert ECHO(client, ["k"], ["a", 1])[1] in ("a", b"a"), "the pool still serves"


def test_a_flushed_script_is_loaded_and_run_again(client: redis.Redis) -> None:
    client.script_flush()
    assert ECHO(client, ["k"], ["a", 1])[2] == 1
    assert in_use(client.connection_pool) == 0


def test_a_connection_the_server_dropped_is_replaced_and_the_call_succeeds(
    client: redis.Redis, redis_url: str
) -> None:
    assert ECHO(client, ["k"], ["a", 1])[2] == 1  # loaded, one pooled connection
    pooled = client.client_id()  # the same idle connection (the only one)
    with redis.Redis.from_url(redis_url) as other:  # only ours: other tests share the server
        assert other.client_kill_filter(_id=pooled) == 1
    assert ECHO(client, ["k"], ["b", 2])[2] == 2
    assert in_use(client.connection_pool) == 0


def test_a_pipeline_queues_the_call_as_redis_py_does(client: redis.Redis) -> None:
    client.script_load(ECHO.source)
    with client.pipeline() as pipe:
        assert ECHO(pipe, ["k"], ["a", 1]) is pipe
        assert pipe.execute()[0][2] == 1


def test_a_connection_lost_mid_call_is_dropped_and_the_call_runs_on_redis_pys_path(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.script_load(ECHO.source)
    read = redis.connection.AbstractConnection.read_response
    lost: list[Any] = []

    def read_once_lost(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not lost:
            lost.append((self, self._sock))
            raise redis.ConnectionError("Connection closed by server.")
        return read(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", read_once_lost)
    assert ECHO(client, ["k"], ["a", 7])[2] == 7
    connection, broken = lost[0]
    assert connection._sock is not broken, "the broken socket was dropped, not reused"
    assert in_use(client.connection_pool) == 0

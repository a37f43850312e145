"""`fleet.storage.backends.redis.connect.Lua` on a real Redis: straight to a pooled
connection, the same replies and errors as redis-py's EVALSHA, no connection kept, a
dropped one replaced, a lost reply raised as redis-py raises it (never resent behind the
caller's back)."""

from __future__ import annotations

import contextlib
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from fleet.storage.backends.redis.connect import Lua, connect

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


COUNTS = Lua("return redis.call('INCR', KEYS[1])")


@dataclass
class Link:
    """One proxied connection: the client's side, Redis's side, and whether it is cut."""

    near: socket.socket
    far: socket.socket
    muted: threading.Event = field(default_factory=threading.Event)
    """The next reply is to be dropped."""
    dropped: threading.Event = field(default_factory=threading.Event)
    """It was: Redis ran the command and answered."""


class ReplyCutter:
    """A TCP proxy in front of Redis that can lose the replies to the next EVALSHAs.

    `cut(n)`: each of the next `n` EVALSHAs reaches Redis and runs; its reply is read and
    dropped, and both sides of that connection are closed, as when a connection drops
    mid-call.
    """

    def __init__(self, redis_url: str) -> None:
        target = urlsplit(redis_url)
        self.target = (target.hostname or "127.0.0.1", target.port or 6379)
        self.db = target.path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.lock = threading.Lock()
        self.to_cut = 0
        self.cuts = 0
        self.ends: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.listener.getsockname()[1]}{self.db}"

    def cut(self, n: int = 1) -> None:
        with self.lock:
            self.to_cut = n

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            far = socket.create_connection(self.target)
            with self.lock:
                self.ends += [near, far]
            link = Link(near, far)
            threading.Thread(target=self._replies, args=(link,), daemon=True).start()
            threading.Thread(target=self._commands, args=(link,), daemon=True).start()

    def _commands(self, link: Link) -> None:
        try:
            while chunk := _recv(link.near):
                with self.lock:
                    if b"EVALSHA" in chunk and self.to_cut:
                        self.to_cut -= 1
                        link.muted.set()
                link.far.sendall(chunk)
                if link.muted.is_set():
                    assert link.dropped.wait(10), "Redis ran the script and answered"
                    with self.lock:
                        self.cuts += 1
                    return
        finally:
            _close(link.near, link.far)

    def _replies(self, link: Link) -> None:
        try:
            while chunk := _recv(link.far):
                if link.muted.is_set():
                    link.dropped.set()
                    continue
                link.near.sendall(chunk)
        except OSError:
            pass
        finally:
            _close(link.near, link.far)

    def close(self) -> None:
        _close(self.listener)  # shut down first: a bare close leaves accept() waiting
        with self.lock:
            _close(*self.ends)


def _close(*ends: socket.socket) -> None:
    for end in ends:
        with contextlib.suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)
        end.close()


def _recv(end: socket.socket) -> bytes:
    try:
        return end.recv(65536)
    except OSError:
        return b""


@pytest.fixture
def cutter(redis_url: str) -> Iterator[ReplyCutter]:
    proxy = ReplyCutter(redis_url)
    yield proxy
    proxy.close()


class Runs:
    """How many times `COUNTS` ran on one key, read past the proxy."""

    def __init__(self, redis_url: str) -> None:
        self.key = f"lean-{uuid.uuid4().hex}"
        self.direct = redis.Redis.from_url(redis_url)

    def __call__(self) -> int:
        return int(self.direct.get(self.key) or 0)


@pytest.fixture
def runs(redis_url: str) -> Iterator[Runs]:
    counted = Runs(redis_url)
    yield counted
    counted.direct.delete(counted.key)
    counted.direct.close()


def with_retries(url: str, retries: int) -> redis.Redis:
    """A client that retries lost connections, as `redis.Redis(host=...)` does by default."""
    return redis.Redis.from_url(url, retry=Retry(NoBackoff(), retries))


def test_a_reply_lost_mid_call_is_raised_and_the_script_is_not_sent_again(
    cutter: ReplyCutter, runs: Runs
) -> None:
    key = runs.key
    with connect(cutter.url) as client:
        assert COUNTS(client, [key], []) == 1  # loaded; the pool holds one connection
        cutter.cut()
        with pytest.raises(redis.ConnectionError):
            COUNTS(client, [key], [])
        assert cutter.cuts == 1
        assert runs() == 2, "ran once for the lost reply, never resent"
        assert in_use(client.connection_pool) == 0
        assert COUNTS(client, [key], []) == 3, "the pool serves a new connection"


def test_a_reply_lost_mid_call_is_sent_again_when_the_clients_policy_retries(
    cutter: ReplyCutter, runs: Runs
) -> None:
    key = runs.key
    with with_retries(cutter.url, 1) as client:
        assert COUNTS(client, [key], []) == 1
        cutter.cut()
        assert COUNTS(client, [key], []) == 3, "redis-py's own retry resent it, as it would"
        assert cutter.cuts == 1
        assert in_use(client.connection_pool) == 0


def test_a_client_whose_policy_retries_runs_the_script_as_often_as_redis_py_would(
    cutter: ReplyCutter, runs: Runs
) -> None:
    """One try and one retry: twice, every reply lost; never a try of the lean path's own."""
    key = runs.key
    with with_retries(cutter.url, 1) as client:
        client.script_load(COUNTS.source)
        cutter.cut(5)
        with pytest.raises(redis.ConnectionError):
            COUNTS(client, [key], [])
        assert runs() == 2
        assert cutter.cuts == 2
        assert in_use(client.connection_pool) == 0


def test_the_lean_path_and_redis_pys_agree_on_a_lost_reply(cutter: ReplyCutter, runs: Runs) -> None:
    """The comparison the rule comes from: redis-py with no retries raises as well."""
    key = runs.key
    with connect(cutter.url) as client:
        client.script_load(COUNTS.source)
        cutter.cut()
        with pytest.raises(redis.ConnectionError):
            client.evalsha(COUNTS.sha, 1, key)
        assert runs() == 1


def test_a_connection_lost_while_sending_is_dropped_and_the_call_runs_once_on_redis_pys_path(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch, runs: Runs
) -> None:
    key = runs.key
    client.script_load(COUNTS.source)
    send = redis.connection.AbstractConnection.send_packed_command
    lost: list[Any] = []

    def send_once_lost(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not lost:
            lost.append((self, self._sock))
            raise redis.ConnectionError("Error 32 while writing to socket. Broken pipe.")
        return send(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", send_once_lost)
    assert COUNTS(client, [key], []) == 1, "not sent the first time, run once the second"
    connection, broken = lost[0]
    assert connection._sock is not broken, "the broken socket was dropped, not reused"
    assert in_use(client.connection_pool) == 0
    assert runs() == 1

"""Long-term memory's storage: the same rules on the memory twin, fakeredis and a real Redis."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import redis

from fleet.errors import MemoryRefused
from fleet.memory.backends.memory import MemoryBoard
from fleet.memory.backends.redis import RedisBoard
from fleet.memory.board import Board
from fleet.memory.model import Landed, Lost, Write, WriteOutcome
from fleet.memory.names import MemoryCaps
from fleet.storage.backends.redis.connect import connect
from tests.conftest import fake_redis

NS = "user:alice"
CAPS = MemoryCaps(history_depth=200)

BoardMaker = Callable[[], Board]
"""Each call is one more "machine": its own client on the same data."""


@pytest.fixture(
    params=["memory", "fakeredis", pytest.param("redis", marks=pytest.mark.integration)]
)
def boards(request: pytest.FixtureRequest) -> BoardMaker:
    if request.param == "memory":
        shared = MemoryBoard()
        return lambda: shared
    if request.param == "fakeredis":
        client = fake_redis()
        return lambda: RedisBoard(client)
    request.getfixturevalue("redis_client")  # emptied
    url: str = request.getfixturevalue("redis_url")
    return lambda: RedisBoard(connect(url))


def _write(key: str, value: object, expected: int | None, **extra: str) -> Write:
    return Write(NS, key, value, expected, writer="test", **extra)


def test_a_write_lands_with_versions_and_history(boards: BoardMaker) -> None:
    board = boards()
    assert board.write(_write("profile", {"city": "Tongzhou"}, 0)) == Landed(1)
    assert board.write(_write("profile", {"city": "Chaoyang"}, 1)) == Landed(2)
    entry = board.read(NS, "profile")
    assert entry is not None
    assert (entry.value, entry.version, entry.writer) == ({"city": "Chaoyang"}, 2, "test")
    assert [e.version for e in board.history(NS, "profile")] == [2, 1]
    assert [e.key for e in board.entries(NS)] == ["profile"]
    assert board.namespaces() == [NS]


def test_a_stale_version_is_told_it_lost(boards: BoardMaker) -> None:
    board = boards()
    board.write(_write("k", 1, 0))
    assert board.write(_write("k", 2, 0)) == Lost(1)  # "new key" but it exists
    assert board.write(_write("k", 2, 5)) == Lost(1)
    assert board.write(_write("k", 3, None)) == Landed(2)  # the operator's force


def test_a_redelivered_write_lands_nothing_twice(boards: BoardMaker) -> None:
    board = boards()
    first = board.write(_write("k", "v", 0, write_id="rec-1:k"))
    again = board.write(_write("k", "v", 0, write_id="rec-1:k"))
    assert (first, again) == (Landed(1), Landed(1, duplicate=True))
    assert len(board.history(NS, "k")) == 1


def test_caps_are_refused_with_one_line(boards: BoardMaker) -> None:
    board = boards()
    with pytest.raises(MemoryRefused, match="over the cap") as big:
        board.write(_write("k", "x" * 100, 0), MemoryCaps(max_value_bytes=50))
    assert "\n" not in str(big.value)
    caps = MemoryCaps(max_keys=2, history_depth=2)
    for key in ("a", "b"):
        board.write(_write(key, 1, 0), caps)
    with pytest.raises(MemoryRefused, match="holds 2 keys"):
        board.write(_write("c", 1, 0), caps)
    for version in (1, 2, 3):
        board.write(_write("a", version, version), caps)
    assert [e.version for e in board.history(NS, "a")] == [4, 3]
    assert board.read(NS, "c") is None


@pytest.mark.parametrize(
    ("namespace", "key"),
    [("USER:alice", "k"), ("user:", "k"), ("user:a b", "k"), ("user:alice", "a:b"),
     ("user:alice", "*"), ("user:alice", ""), ("fleet:x\x1b]0;t\x07", "k")],
)  # fmt: skip
def test_bad_names_are_refused_before_redis(boards: BoardMaker, namespace: str, key: str) -> None:
    with pytest.raises(MemoryRefused) as refused:
        boards().write(Write(namespace, key, 1, 0, writer="test"))
    assert "\n" not in str(refused.value) and "\x1b" not in str(refused.value)


def test_remove_forgets_the_key_and_its_history(boards: BoardMaker) -> None:
    board = boards()
    board.write(_write("k", 1, 0))
    assert board.remove(NS, "k") and not board.remove(NS, "k")
    assert board.read(NS, "k") is None and board.history(NS, "k") == []


def test_proposals_wait_once_per_write_id(boards: BoardMaker) -> None:
    board = boards()
    write = _write("profile", {"city": "x"}, 0, write_id="rec-1:profile")
    assert board.propose(write).id == board.propose(write).id == "rec-1:profile"
    assert [p.key for p in board.proposals(NS)] == ["profile"]
    taken = board.take_proposal(NS, "rec-1:profile")
    assert taken is not None and board.take_proposal(NS, "rec-1:profile") is None
    assert board.write(taken.write()) == Landed(1)


def test_a_namespace_ttl_is_set_on_redis() -> None:
    client: redis.Redis = fake_redis()
    RedisBoard(client).write(_write("k", 1, 0), MemoryCaps(ttl_s={"user": 60}))
    assert 0 < client.ttl("fleet:memory:user:alice:entries") <= 60


def test_the_twin_expires_a_namespace_after_its_ttl() -> None:
    now = [0.0]
    board = MemoryBoard(clock=lambda: now[0])
    board.write(_write("k", 1, 0), MemoryCaps(ttl_s={NS: 10}))
    now[0] = 9.0
    assert board.read(NS, "k") is not None
    now[0] = 10.0
    assert board.read(NS, "k") is None and board.namespaces() == []


def test_sixteen_writers_racing_on_one_key_lose_nothing_silently(boards: BoardMaker) -> None:
    # Two "machines" (two clients), eight writers each; every writer reads then writes
    # with the version it read, three times, and keeps what each write was told.
    machines = [boards(), boards()]
    outcomes: list[tuple[int, int, WriteOutcome]] = []
    lock, start = threading.Lock(), threading.Barrier(16)

    def writer(n: int) -> None:
        board = machines[n % 2]
        start.wait()
        for attempt in range(3):
            seen = board.read(NS, "shared")
            expected = 0 if seen is None else seen.version
            outcome = board.write(_write("shared", {"w": n, "a": attempt}, expected), CAPS)
            with lock:
                outcomes.append((n, expected, outcome))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(outcomes) == 48
    landed = {o.version: (n, e) for n, e, o in outcomes if isinstance(o, Landed)}
    assert sorted(landed) == list(range(1, len(landed) + 1))  # one write per version
    assert all(landed[v][1] == v - 1 for v in landed)  # each landed on the version it read
    lost = [(e, o) for _, e, o in outcomes if isinstance(o, Lost)]
    assert all(o.current_version > e for e, o in lost)  # told, with a newer version
    assert len(landed) + len(lost) == 48
    history = machines[0].history(NS, "shared")
    assert sorted(e.version for e in history) == sorted(landed)
    assert all(e.value["w"] == landed[e.version][0] for e in history)  # nothing overwritten

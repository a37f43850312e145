"""The lexical index of memory: the same ranking as BM25 over every entry, without reading them.

On the memory twin, fakeredis and a real Redis: `memory_search` without embeddings ranks as
`rank_texts` over the whole namespace did, writes and removals keep the index exact, a
search never reads the namespace's entries hash (HGETALL is made to fail), and entries
written before the index existed (0.2.0) are indexed once, by the first search.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import redis

from fleet.experiences.retrieval import rank_texts
from fleet.loop.memory_calls import search
from fleet.memory.backends.memory import MemoryBoard
from fleet.memory.backends.redis import RedisBoard
from fleet.memory.board import Board
from fleet.memory.index import postings_of, text_of, words
from fleet.memory.model import Entry, Write
from fleet.memory.names import MemoryCaps
from fleet.models import now_ms
from fleet.storage import keys
from fleet.storage.backends.redis.connect import connect
from tests.conftest import fake_redis

ALICE, ACME = "user:alice", "project:acme"
CAPS = MemoryCaps(max_keys=10_000, ttl_s={"project": 600})
VOCABULARY = "tongzhou pollen allergy weather api 500 lives cat tabs release friday backup".split()
QUERIES = ["where does she live tongzhou", "pollen", "weather api 500 friday", "cat tabs", "zzz"]

BoardMaker = Callable[[], Board]


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


def fill(board: Board, namespace: str, count: int, seed: int) -> None:
    pick = random.Random(seed)
    for n in range(count):
        # n filler words: every entry has its own length, so no two scores tie.
        value = {"said": " ".join(pick.choices(VOCABULARY, k=3)), "filler": ["x"] * n}
        board.write(Write(namespace, f"fact{n}", value, None, "test"), CAPS)


def expected(board: Board, spaces: list[str], query: str) -> list[tuple[str, str]]:
    entries = [e for ns in spaces for e in board.entries(ns)]
    order = rank_texts([text_of(e.key, e.value) for e in entries], query)
    return [(entries[i].namespace, entries[i].key) for i in order]


def found(board: Board, spaces: list[str], query: str, k: int = 1000) -> list[tuple[str, str]]:
    return [(e.namespace, e.key) for e in search(board, spaces, query, None, k)]


def test_indexed_search_ranks_as_bm25_over_every_entry(boards: BoardMaker) -> None:
    board = boards()
    fill(board, ALICE, 120, seed=1)
    fill(board, ACME, 40, seed=2)
    for query in QUERIES:
        for spaces in ([ALICE], [ACME, ALICE]):
            assert found(board, spaces, query) == expected(board, spaces, query), query
    assert found(board, [ALICE], "tongzhou", k=3) == expected(board, [ALICE], "tongzhou")[:3]
    assert found(board, [ALICE], "zzz") == [] and found(board, [ALICE], "!!") == []


def test_writes_and_removals_keep_the_index_exact(boards: BoardMaker) -> None:
    board = boards()
    fill(board, ALICE, 30, seed=3)
    board.write(Write(ALICE, "profile", {"lives": "Tongzhou"}, 0, "test"), CAPS)
    assert found(board, [ALICE], "tongzhou lives")[0] == (ALICE, "profile")
    board.write(Write(ALICE, "profile", {"moved_to": "Shunyi"}, 1, "test"), CAPS)
    assert (ALICE, "profile") not in found(board, [ALICE], "tongzhou lives")
    assert found(board, [ALICE], "shunyi") == [(ALICE, "profile")]
    board.write(Write(ALICE, "nothing", None, 0, "test"), CAPS)  # a JSON null is a value
    assert found(board, [ALICE], "null") == [(ALICE, "nothing")]
    assert board.remove(ALICE, "profile") and found(board, [ALICE], "shunyi") == []
    board.remove(ALICE, "fact7")
    entries = board.entries(ALICE)
    size = board.postings(ALICE, [])
    assert size.entries == len(entries) == 30
    assert size.length == sum(postings_of(e.key, e.value)[0] for e in entries)
    for query in QUERIES:
        assert found(board, [ALICE], query) == expected(board, [ALICE], query)
    newest = board.newest(ALICE, 3)
    assert len(newest) == 3 and newest[0].updated_at_ms == max(e.updated_at_ms for e in entries)


def test_a_search_never_reads_the_whole_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    client = fake_redis()
    board = RedisBoard(client)
    fill(board, ALICE, 50, seed=4)
    board.write(Write(ALICE, "profile", {"lives": "Tongzhou"}, 0, "test"), CAPS)
    want = expected(board, [ALICE], "tongzhou")

    def refused(*_: object, **__: object) -> None:
        raise AssertionError("a search read the whole namespace")

    monkeypatch.setattr(client, "hgetall", refused)
    monkeypatch.setattr(client, "hvals", refused)
    assert found(board, [ALICE], "tongzhou") == want
    assert [e.key for e in board.newest(ALICE, 1)] == ["profile"]


def test_entries_written_before_the_index_are_indexed_once_by_a_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = fake_redis()
    board = RedisBoard(client)
    for n, city in enumerate(["Tongzhou", "Shunyi", "Tongzhou"]):  # as 0.2.0 wrote them
        entry = Entry(namespace=ALICE, key=f"old{n}", value={"lives": city}, version=1,
                      updated_at_ms=now_ms() - 1000 + n, writer="recorder")  # fmt: skip
        client.hset(keys.memory_entries(ALICE), entry.key, entry.model_dump_json())
    board.write(Write(ALICE, "new", {"lives": "Tongzhou"}, 0, "test"), CAPS)
    assert found(board, [ALICE], "tongzhou") == expected(board, [ALICE], "tongzhou")
    assert {k for _, k in found(board, [ALICE], "tongzhou")} == {"old0", "old2", "new"}
    assert board.postings(ALICE, []).length == 4 * len(words('old0 {"lives": "Tongzhou"}'))
    monkeypatch.setattr(client, "hgetall", lambda *_: pytest.fail("indexed twice"))
    assert len(found(board, [ALICE], "shunyi")) == 1
    assert [e.key for e in board.newest(ALICE, 4)][0] == "new"


@pytest.mark.integration
def test_the_index_lives_as_long_as_its_namespace(redis_client: redis.Redis) -> None:
    board = RedisBoard(redis_client)
    board.write(Write(ACME, "style", {"indent": 4}, 0, "test"), CAPS)
    for name in (keys.memory_index(ACME), keys.memory_terms(ACME), keys.memory_recent(ACME)):
        assert 0 < int(redis_client.ttl(name)) <= 600, name

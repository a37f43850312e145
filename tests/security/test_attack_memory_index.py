"""Attacks on memory's lexical index (`fleet.memory.index`, the Redis board's scripts).

Every `memory_search` query and every `memory_write` key and value is the model's, so an
attacker's: a query of thousands of words, a value of thousands of distinct words, words
of 16 KB, Unicode that lowercases into ASCII, keys that look like the index's own
separators or its `#length` field. Cost is bounded (a search reads the postings of at most
`MAX_QUERY_WORDS` words; an entry has at most `MAX_ENTRY_WORDS` postings) and the index
stays exact through rewrites and removals, on the twin, fakeredis and a real Redis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import redis

from fleet.experiences.retrieval import rank_texts
from fleet.loop.memory_calls import search
from fleet.memory.backends.memory import MemoryBoard
from fleet.memory.backends.redis import RedisBoard
from fleet.memory.board import Board
from fleet.memory.index import MAX_ENTRY_WORDS, MAX_QUERY_WORDS, Postings, postings_of, text_of
from fleet.memory.model import Write
from fleet.memory.names import MemoryCaps
from fleet.storage import keys
from fleet.storage.backends.redis.connect import connect
from tests.conftest import fake_redis

NS = "user:mallory"
CAPS = MemoryCaps(max_value_bytes=16_000, max_keys=1_000)

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


def distinct_words(count: int, start: int = 0) -> list[str]:
    """`count` distinct words of lowercase letters (base 26), none a prefix of another."""
    found = []
    for n in range(start, start + count):
        word = ""
        for _ in range(4):
            word, n = chr(ord("a") + n % 26) + word, n // 26
        found.append(word)
    return found


class Counting:
    """A board that records how many words each `postings` call asked for."""

    def __init__(self, board: Board) -> None:
        self.board = board
        self.asked: list[int] = []

    def postings(self, namespace: str, words: Sequence[str]) -> Postings:
        self.asked.append(len(words))
        return self.board.postings(namespace, words)

    def __getattr__(self, name: str) -> object:
        return getattr(self.board, name)


def test_a_query_of_thousands_of_words_reads_the_postings_of_a_bounded_few(
    boards: BoardMaker,
) -> None:
    board = boards()
    board.write(Write(NS, "profile", {"lives": "tongzhou"}, 0, "test"), CAPS)
    flood = " ".join(["tongzhou", *distinct_words(20_000)])  # one tool argument, ~100 KB
    counting = Counting(board)
    found = search(counting, [NS], flood, None, 5)  # type: ignore[arg-type]
    assert [e.key for e in found] == ["profile"]  # its first words still search
    assert counting.asked and max(counting.asked) <= MAX_QUERY_WORDS
    # An ordinary query ranks exactly as BM25 over every entry (the cap never bites).
    query = "where does she live tongzhou"
    assert [e.key for e in search(board, [NS], query, None, 5)] == ["profile"]


def test_a_value_of_thousands_of_distinct_words_keeps_a_bounded_index(
    boards: BoardMaker,
) -> None:
    board = boards()
    flood = " ".join(distinct_words(3_000))  # 15 KB: under the value cap, 3,000 words
    board.write(Write(NS, "flood", flood, 0, "test"), CAPS)
    board.write(Write(NS, "profile", {"lives": "tongzhou"}, 0, "test"), CAPS)
    length, postings = postings_of("flood", flood)
    assert length == 3_001 and len(postings) <= MAX_ENTRY_WORDS
    # The entry is still found by its words (those it keeps), and counts its whole length.
    assert [e.key for e in search(board, [NS], "flood aaaa", None, 5)] == ["flood"]
    assert board.postings(NS, []).length == length + postings_of("profile", {"lives": "x"})[0]
    assert [e.key for e in search(board, [NS], "tongzhou", None, 5)] == ["profile"]
    # Rewritten, then removed: nothing of it is left in the index.
    board.write(Write(NS, "flood", "calm", 1, "test"), CAPS)
    assert search(board, [NS], "aaaa aaab", None, 5) == []
    board.remove(NS, "flood")
    assert board.postings(NS, ["calm", "aaaa"]).hits == {"calm": [], "aaaa": []}


@pytest.mark.integration
def test_the_redis_index_of_a_full_namespace_stays_within_its_budget(
    redis_client: redis.Redis,
) -> None:
    """100 entries of 3,000 distinct words: the index is a few times the values, not 30x."""
    board = RedisBoard(redis_client)
    values = 0
    for n in range(100):
        value = " ".join(distinct_words(3_000, start=n * 3_000))
        values += len(value)
        board.write(Write(NS, f"flood{n}", value, 0, "test"), CAPS)
    index = int(redis_client.memory_usage(keys.memory_index(NS)) or 0)
    terms = int(redis_client.memory_usage(keys.memory_terms(NS)) or 0)
    assert index + terms < 8 * values, (index, terms, values)


HOSTILE_KEYS = ["0", "a.b-c_d", "length", "z" * 100, "9-9", "key.with.dots"]
HOSTILE_VALUES = [
    "\u212a\u0130 \uff21\uff11 \u202eevil\u202c",  # Kelvin sign, dotted I, fullwidth, bidi
    {"#length": -(10**9), "nested": [["deep"] * 3], "\n": "a\nb 1 2\nc"},
    "x" * 15_000,  # one word of 15,000 letters
    "#length 0 0\nprofile 1 1",  # the index's own separators as text
    ["WORD KEY TF LENGTH", "tongzhou tongzhou tongzhou"],
]


def test_hostile_keys_and_values_leave_the_index_exact(boards: BoardMaker) -> None:
    board = boards()
    for i, key in enumerate(HOSTILE_KEYS):
        for n in range(len(HOSTILE_VALUES)):  # each key ends on a value of its own
            value = HOSTILE_VALUES[(i + n) % len(HOSTILE_VALUES)]
            board.write(Write(NS, key, value, n, "test"), CAPS)
    board.remove(NS, "length")
    entries = board.entries(NS)
    size = board.postings(NS, [])
    assert size.entries == len(entries) == len(HOSTILE_KEYS) - 1
    assert size.length == sum(postings_of(e.key, e.value)[0] for e in entries)
    for query in ["tongzhou", "word key", "length", "kelvin k i", "x" * 15_000, "deep 1 2"]:
        texts = [text_of(e.key, e.value) for e in entries]
        want = [entries[i].key for i in rank_texts(texts, query)]
        assert [e.key for e in search(board, [NS], query, None, 20)] == want, query

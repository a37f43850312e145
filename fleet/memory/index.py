"""The lexical index of a namespace: an inverted index of words, kept by every write.

Each entry's text is its key and its value's JSON; its words are the runs of lowercase
letters and digits (the experiences' BM25 words, `fleet.experiences.retrieval`). A
namespace keeps one **posting** per (word, key): `WORD KEY TF LENGTH` (how often the word
is in the entry, how many words the entry has), its entries' total length, and the newest
write time of each key. Every write replaces its key's postings in the same atomic step
as the entry (the Redis script, the twin's lock), so a search reads only the postings of
the query's words and the k entries it returns, never the whole namespace.

`rank` is BM25 exactly as `fleet.experiences.retrieval.rank_texts` scores the same texts
(same words, k1, b and idf; `tests/test_memory_index.py` holds them equal), over one or
several namespaces as if their entries were one list.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_WORD = re.compile(r"[a-z0-9]+")
_K1, _B = 1.2, 0.75


def words(text: str) -> list[str]:
    """The text's words, lowercase letters and digits, in order."""
    return _WORD.findall(text.lower())


def text_of(key: str, value: Any) -> str:
    """What an entry is searched by: its key and its value's JSON."""
    return f"{key} {json.dumps(value, ensure_ascii=False)}"


def postings_of(key: str, value: Any) -> tuple[int, list[str]]:
    """The entry's length in words and its postings (`WORD KEY TF LENGTH`), by word."""
    found = words(text_of(key, value))
    length = len(found)
    counts = Counter(found)
    return length, [f"{word} {key} {tf} {length}" for word, tf in sorted(counts.items())]


def parse_posting(posting: str) -> tuple[str, str, int, int]:
    """`WORD KEY TF LENGTH` as its four parts (keys and words have no spaces)."""
    word, key, tf, length = posting.split(" ")
    return word, key, int(tf), int(length)


@dataclass
class Postings:
    """What a search reads of one namespace: its size and the query words' postings."""

    entries: int
    """How many keys the namespace holds."""
    length: int
    """The sum of its entries' lengths in words."""
    hits: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)
    """Each query word's postings: (key, tf, entry length)."""


def rank(query: str, spaces: Sequence[tuple[str, Postings]]) -> list[tuple[str, str]]:
    """(namespace, key) of every entry sharing a word with `query`, best BM25 score first.

    Ties keep the namespaces' order, then the keys' (as `rank_texts` over entries listed
    namespace by namespace, key by key).
    """
    total = sum(p.entries for _, p in spaces)
    if total == 0:
        return []
    average = sum(p.length for _, p in spaces) / total or 1.0
    order = {ns: i for i, (ns, _) in enumerate(spaces)}
    scores: dict[tuple[str, str], float] = {}
    for term in sorted(set(words(query))):
        frequency = sum(len(p.hits.get(term, ())) for _, p in spaces)
        if not frequency:
            continue
        idf = math.log(1 + (total - frequency + 0.5) / (frequency + 0.5))
        for namespace, postings in spaces:
            for key, tf, length in postings.hits.get(term, ()):
                part = idf * tf * (_K1 + 1) / (tf + _K1 * (1 - _B + _B * length / average))
                scores[namespace, key] = scores.get((namespace, key), 0.0) + part
    best = sorted(scores.items(), key=lambda item: (-item[1], order[item[0][0]], item[0][1]))
    return [where for where, score in best if score > 0]

"""What ranking experiences costs a run at its start: BM25 vs embeddings, side by side.

python bench/experiences_bench.py [--counts 10,100,1000] [--dims 1536] [--repeat 9]
                                  [--redis-url redis://127.0.0.1:6379/12]

Each cell is the median wall time of `fleet.experiences.retrieval.select` for one trace
(what `first_messages` pays once per run) over N approved experiences of its scope:
- `bm25`: no embedding model named;
- `embed`: vectors stored, the task embedded through a local OpenAI-wire `/v1/embeddings`
  (tests/fake_embeddings.py, padded to `--dims`) over loopback HTTP.
Runs alternate (bm25, embed, bm25, ...) so drift hits both alike. The store is in memory,
or the Redis at `--redis-url` (its database is emptied first).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fleet.llm.base  # noqa: E402
from fleet.experiences.backends.memory import MemoryExperiences  # noqa: E402
from fleet.experiences.backends.redis import RedisExperiences  # noqa: E402
from fleet.experiences.embedding import Embedder, index  # noqa: E402
from fleet.experiences.model import new_experience  # noqa: E402
from fleet.experiences.retrieval import select  # noqa: E402
from fleet.experiences.store import ExperienceStore  # noqa: E402
from fleet.llm.embeddings import EmbeddingsClient  # noqa: E402
from fleet.models import Trace  # noqa: E402
from tests import fake_embeddings  # noqa: E402
from tests.fake_embeddings import FakeEmbeddings  # noqa: E402

WORDS = "migration schema backup disk release notes deploy cache index query".split()


def make_store(url: str | None) -> ExperienceStore:
    if url is None:
        return MemoryExperiences()
    client = redis.Redis.from_url(url)
    client.flushdb()
    return RedisExperiences(client)


def fill(store: ExperienceStore, count: int) -> None:
    for n in range(count):
        a, b = WORDS[n % len(WORDS)], WORDS[(n * 7) % len(WORDS)]
        store.put(new_experience("agent:default", f"when the {a} {n} fails", f"check {b}"))
    for experience in store.all():
        experience.approved = True
        store.put(experience)


def timed(store: ExperienceStore, trace: Trace, embedder: Embedder | None) -> float:
    started = time.perf_counter()
    select(store, trace, embedder=embedder)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", default="10,100,1000")
    parser.add_argument("--dims", type=int, default=1536)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    fleet.llm.base.ALLOW_MODEL_REQUESTS = True  # loopback only: the fake server below
    fake_embeddings.DIMENSIONS = args.dims
    trace = Trace(trace_id="t", root_trace_id="t", task="the schema upgrade broke the backup")
    print(f"store: {'redis' if args.redis_url else 'memory'}, {args.dims} dimensions")
    print("| experiences | bm25 ms | embed ms | embed/bm25 |")
    print("|---:|---:|---:|---:|")
    with FakeEmbeddings() as server:
        client = EmbeddingsClient(server.url + "/v1", "", "fake-embed")
        embedder = Embedder(client, "emb", 0.3)
        for count in (int(c) for c in args.counts.split(",")):
            store = make_store(args.redis_url)
            fill(store, count)
            index(store, embedder, store.all())  # as `experience approve` would have
            bm25, embed = [], []
            for _ in range(args.repeat):
                bm25.append(timed(store, trace, None))
                embed.append(timed(store, trace, embedder))
            b, e = statistics.median(bm25) * 1000, statistics.median(embed) * 1000
            print(f"| {count} | {b:.2f} | {e:.2f} | {e / b:.1f} |")


if __name__ == "__main__":
    main()

"""Long-term memory: what a `memory_read` and a `memory_search` cost at 100 and 10,000 keys.

python bench/memory_bench.py [--counts 100,10000] [--repeat 21] [--redis-url URL]

Each cell is the median wall time of one call, on the memory twin and on a real Redis (a
private redis-server started for the run unless `--redis-url` names one; its database is
emptied first), over one namespace holding N keys of small JSON profiles (each has one of
8 cities and the words `fact number`):
- `read`: `Board.read` of one key (an HGET), what `memory_read` and each injected key cost;
- `search`: `fleet.loop.memory_calls.search` without an embedding model, what
  `memory_search` costs: the lexical index's postings of the query's words and the 5
  entries found. The query's one indexed word (a city) is in 1/8 of the entries;
- `common`: the same for a query whose word (`fact`) is in every entry: the worst case,
  every posting of that word is read;
- `scan`: the baseline, side by side: what search did before the index (every entry read,
  HGETALL, and ranked by `rank_texts`); `x` is scan / search;
- `write`: one compare-and-set write (the Lua script, index included), key at random.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import machine  # noqa: E402
from fleet.experiences.retrieval import rank_texts  # noqa: E402
from fleet.loop.memory_calls import search  # noqa: E402
from fleet.memory.backends.memory import MemoryBoard  # noqa: E402
from fleet.memory.backends.redis import RedisBoard  # noqa: E402
from fleet.memory.board import Board  # noqa: E402
from fleet.memory.index import text_of  # noqa: E402
from fleet.memory.model import Write  # noqa: E402
from fleet.memory.names import MemoryCaps  # noqa: E402
from fleet.storage.backends.redis.connect import connect  # noqa: E402
from fleetops.redis_server import start_redis_server  # noqa: E402

NS = "user:bench"
CITIES = "Tongzhou Chaoyang Haidian Xicheng Dongcheng Fengtai Shunyi Daxing".split()
CAPS = MemoryCaps(max_keys=1_000_000)


def fill(board: Board, count: int) -> None:
    for n in range(count):
        value = {"lives": CITIES[n % len(CITIES)], "note": f"fact number {n}", "n": n}
        board.write(Write(NS, f"key{n}", value, None, "bench"), CAPS)


def median_ms(action: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


@contextlib.contextmanager
def redis_board(url: str | None) -> Iterator[RedisBoard]:
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(start_redis_server()).url
        client = connect(url)
        client.flushdb()
        yield RedisBoard(client)
        client.flushdb()


Cells = tuple[float, float, float, float, float]


def cells(board: Board, count: int, repeat: int) -> Cells:
    fill(board, count)
    pick = random.Random(7)
    read = median_ms(lambda: board.read(NS, f"key{pick.randrange(count)}"), repeat)
    query = "where does she live Tongzhou"
    found = median_ms(lambda: search(board, [NS], query, None, 5), repeat)
    common = median_ms(lambda: search(board, [NS], "fact", None, 5), max(3, repeat // 4))

    def scan() -> None:
        entries = board.entries(NS)
        rank_texts([text_of(e.key, e.value) for e in entries], query)[:5]

    scanned = median_ms(scan, max(3, repeat // 4))

    def write() -> None:
        key = f"key{pick.randrange(count)}"
        board.write(Write(NS, key, {"lives": "Shunyi"}, None, "bench"), CAPS)

    return read, found, common, scanned, median_ms(write, repeat)


def row(backend: str, count: int, cells: Cells) -> str:
    read, found, common, scanned, wrote = cells
    return (
        f"| {backend} | {count:,} | {read:.3f} | {found:.2f} | {common:.1f} | {scanned:.1f}"
        f" | {scanned / found:.0f}x | {wrote:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", default="100,10000")
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    print(machine())
    print("| backend | keys | read ms | search ms | common ms | scan ms | x | write ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for count in (int(c) for c in args.counts.split(",")):
        print(row("memory twin", count, cells(MemoryBoard(), count, args.repeat)))
        with redis_board(args.redis_url) as board:
            print(row("Redis", count, cells(board, count, args.repeat)))


if __name__ == "__main__":
    main()

"""Long-term memory: what a `memory_read` and a `memory_search` cost at 100 and 10,000 keys.

python bench/memory_bench.py [--counts 100,10000] [--repeat 21] [--redis-url URL]

Each cell is the median wall time of one call, on the memory twin and on a real Redis (a
private redis-server started for the run unless `--redis-url` names one; its database is
emptied first), over one namespace holding N keys of small JSON profiles:
- `read`: `Board.read` of one key (an HGET), what `memory_read` and each injected key cost;
- `search`: `Board.entries` (an HGETALL of the namespace) and BM25 over every entry
  (`fleet.loop.memory_calls.search` without an embedding model), what `memory_search` costs;
- `write`: one compare-and-set write (the Lua script), key chosen at random.
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
from fleet.loop.memory_calls import search  # noqa: E402
from fleet.memory.backends.memory import MemoryBoard  # noqa: E402
from fleet.memory.backends.redis import RedisBoard  # noqa: E402
from fleet.memory.board import Board  # noqa: E402
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


def cells(board: Board, count: int, repeat: int) -> tuple[float, float, float]:
    fill(board, count)
    pick = random.Random(7)
    read = median_ms(lambda: board.read(NS, f"key{pick.randrange(count)}"), repeat)
    query = "where does she live Tongzhou"
    found = median_ms(lambda: search(board.entries(NS), query, None)[:5], max(3, repeat // 4))

    def write() -> None:
        key = f"key{pick.randrange(count)}"
        board.write(Write(NS, key, {"lives": "Shunyi"}, None, "bench"), CAPS)

    return read, found, median_ms(write, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", default="100,10000")
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    print(machine())
    print("| backend | keys | read ms | search ms | write ms |")
    print("|---|---:|---:|---:|---:|")
    for count in (int(c) for c in args.counts.split(",")):
        read, found, wrote = cells(MemoryBoard(), count, args.repeat)
        print(f"| memory | {count} | {read:.3f} | {found:.1f} | {wrote:.3f} |")
        with redis_board(args.redis_url) as board:
            read, found, wrote = cells(board, count, args.repeat)
        print(f"| redis | {count} | {read:.3f} | {found:.1f} | {wrote:.3f} |")


if __name__ == "__main__":
    main()

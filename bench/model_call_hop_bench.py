"""A model call in the run's own thread against the same call handed to a spare thread.

python bench/model_call_hop_bench.py [--threads 16] [--calls 400] [--repeat 3]

`fleet.loop.cut.cuttable` with `in_place=True` (the HTTP clients since issue 40's hop
pass) and `in_place=False` (the spare-thread hop, kept for clients a cancel cannot end),
each watched by a `CallWatcher` as a run's call is, on one `OpenAIClient` against the
local OpenAI-wire server at 0 ms (`bench/openai_server.py`, its own process). `--threads`
threads each make calls back to back (a worker's runs); the two modes alternate within
each repeat, and which goes first alternates too. Prints calls/s and the per-call time
p50/p90 (`cuttable` entered → returned), medians of the repeats, with their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import load, openai_server  # noqa: E402
from fleet.llm.openai import OpenAIClient  # noqa: E402
from fleet.loop.cut import CallWatcher, cuttable  # noqa: E402
from fleet.storage.writes import InboxSeen  # noqa: E402

REQUEST = [{"role": "user", "content": "answer in one word"}]


class _Quiet:
    """No stop flag, no message: the watcher reads but never cuts."""

    def stop_requested(self, trace_id: str) -> bool:
        return False

    def after(self, trace_id: str, cursor: str | None, limit: int) -> list[Any]:
        return []

    def newest(self, trace_id: str) -> str | None:
        return None


def one_mode(client: OpenAIClient, in_place: bool, threads: int, calls: int) -> dict[str, float]:
    """`calls` calls over `threads` threads: calls/s and the per-call p50/p90, ms."""
    watcher = CallWatcher(_Quiet(), _Quiet())  # type: ignore[arg-type]
    times: list[float] = []
    lock = threading.Lock()
    each = calls // threads

    def work(n: int) -> None:
        mine = []
        for _ in range(each):
            started = time.perf_counter()
            with watcher.watching(f"t{n}", seen=InboxSeen(None)) as watch:
                cuttable(watch, lambda: client.complete(REQUEST, []), in_place=in_place)
            mine.append(1000 * (time.perf_counter() - started))
        with lock:
            times.extend(mine)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - started
    times.sort()
    return {
        "calls/s": len(times) / wall,
        "call p50 ms": statistics.median(times),
        "call p90 ms": times[int(len(times) * 0.9)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"# load average before: {load()}; threads={args.threads} calls={args.calls}")
    with openai_server() as base_url:
        client = OpenAIClient(base_url, "", "lat0")
        assert client.ends_on_cancel
        one_mode(client, True, args.threads, args.threads * 4)  # warm: every connection
        rows: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for n in range(args.repeat):
            for in_place in (True, False) if n % 2 == 0 else (False, True):
                rows[in_place].append(one_mode(client, in_place, args.threads, args.calls))
        client.close()
    print(f"# medians of {args.repeat} repeat(s); load average after: {load()}")
    for name in rows[True][0]:
        here = statistics.median(r[name] for r in rows[True])
        hop = statistics.median(r[name] for r in rows[False])
        better = "higher" if name == "calls/s" else "lower"
        print(
            f"{name:12s} in place {here:8.2f}  spare thread {hop:8.2f}  "
            f"ratio {here / hop:5.2f}x  ({better} is better)"
        )


if __name__ == "__main__":
    main()

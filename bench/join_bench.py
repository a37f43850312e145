"""A chord header part's end, as its worker pays for it: Celery's join vs the fleet's.

python bench/join_bench.py [--parts 1000] [--rounds 3]

In one process, on a real Redis (a private redis-server), the workers' app's backend is
handed every header part of one chord of `--parts` the way Celery's tracer hands it a
succeeded task (`mark_as_done` with the task's request): for a plain chord (the result
stored, Celery's Redis join with its size key) and for a fleet chord (`ignore_result`, the
body `fleet.children.collect` with `chord_size`: `workers.patches.chord_join`). Each ends by
sending its body to the broker. Per part: Redis commands (INFO commandstats delta, commands
inside Lua scripts count), round trips (redis-py `send_packed_command` calls) and this process's CPU
(`time.process_time`), medians over `--rounds` rounds that alternate the two.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from celery._state import _set_task_join_will_block
from celery.app.task import Context
from celery.canvas import Signature
from redis.connection import Connection

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetops.redis_server import start_redis_server  # noqa: E402
from workers.app import app  # noqa: E402
from workers.patches import chord_join  # noqa: E402


def one_chord(parts: int, fleet: bool) -> Callable[[], None]:
    """Report every part of a new chord (a plain one, or a fleet one)."""
    group_id = str(uuid.uuid4())
    options: dict[str, Any] = {"task_id": str(uuid.uuid4())}
    if fleet:
        options[chord_join.SIZE_OPTION] = parts
    else:
        app.backend.set_chord_size(group_id, parts)
    body = dict(Signature(chord_join.BODY_TASK, args=("root", "call_1"), options=options))
    requests = [
        Context(
            id=str(uuid.uuid4()),
            group=group_id,
            group_index=i,
            chord=body,
            args=[f"root@explore-{i:03d}"],
            ignore_result=fleet,
            task="fleet.run_agent",
        )
        for i in range(parts)
    ]

    def run() -> None:
        for request in requests:
            result = {"trace_id": request.args[0], "outcome": "completed"}
            app.backend.mark_as_done(request.id, result, request=request)

    return run


def commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info",))


def measure(client: redis.Redis, parts: int, fleet: bool) -> tuple[float, float, float]:
    """Commands, round trips and CPU ms per part for one chord."""
    run = one_chord(parts, fleet)
    sent = 0
    original = Connection.send_packed_command

    def counting(self: Connection, *args: Any, **kwargs: Any) -> None:
        nonlocal sent
        sent += 1
        original(self, *args, **kwargs)

    before = commands(client)
    Connection.send_packed_command = counting  # type: ignore[method-assign]
    start = time.process_time()
    try:
        run()
    finally:
        cpu_s = time.process_time() - start
        Connection.send_packed_command = original  # type: ignore[method-assign]
    return (commands(client) - before - 1) / parts, sent / parts, cpu_s * 1000 / parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with start_redis_server() as server, redis.Redis.from_url(server.url) as client:
        app.conf.broker_url = app.conf.result_backend = server.url
        _set_task_join_will_block(True)
        one_chord(10, True)()  # warm-up: connections, scripts
        one_chord(10, False)()
        rows: dict[str, list[tuple[float, float, float]]] = {"celery": [], "fleet": []}
        for _ in range(args.rounds):
            for kind in rows:
                client.flushdb()
                rows[kind].append(measure(client, args.parts, kind == "fleet"))
    print(f"# {args.parts} parts per chord, medians of {args.rounds} alternated rounds")
    print(f"{'join':8} {'cmds/part':>10} {'trips/part':>11} {'cpu ms/part':>12}")
    for kind, samples in rows.items():
        cmds, trips, cpu = (statistics.median(column) for column in zip(*samples, strict=True))
        print(f"{kind:8} {cmds:10.2f} {trips:11.2f} {cpu:12.3f}")


if __name__ == "__main__":
    main()

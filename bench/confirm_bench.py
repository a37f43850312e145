"""What RabbitMQ publisher confirms (`workers.confirmed`) cost per task sent.

Sends the same tasks through one fleet app, side by side in alternating rounds: through the
app's own producers (a spawn) and through `workers.confirmed.producer` (a recovered run).
Each send is a persistent task message and its task-sent event. The queue is the bench's
own (never a fleet queue) and deleted afterwards.

    python -m bench.confirm_bench --sends 500 --rounds 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from contextlib import nullcontext

from celery import Celery
from kombu.connection import Connection

from fleet.settings import Settings
from workers import confirmed
from workers.app import create_app

DEFAULT_URL = os.environ.get("FLEET_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def send_times(app: Celery, queue: str, sends: int, confirm: bool) -> list[float]:
    """Seconds per `send_task` of `sends` sends, confirmed or not."""
    taken = []
    for _ in range(sends):
        start = time.perf_counter()
        with confirmed.producer(app) if confirm else nullcontext() as producer:
            app.send_task(
                "fleet.bench.nothing",
                args=("x" * 400,),
                queue=queue,
                ignore_result=True,
                producer=producer,
            )
        taken.append(time.perf_counter() - start)
    return taken


def main() -> None:
    """Print per-send p50/p90 and sends/s for both apps, and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--sends", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    queue = f"fleet.bench.confirm.{os.getpid()}"
    app = create_app(Settings(broker_url=args.url), set_as_current=False)
    ways = {"plain": False, "confirm": True}
    taken: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for confirm in ways.values():  # warm: connections, declarations
            send_times(app, queue, 20, confirm)
        for _ in range(args.rounds):
            for name, confirm in ways.items():
                taken[name] += send_times(app, queue, args.sends, confirm)
    finally:
        with Connection(args.url) as conn:
            conn.default_channel.queue_delete(queue)
        app.close()
    p50 = {n: statistics.median(t) * 1e3 for n, t in taken.items()}
    p90 = {n: statistics.quantiles(t, n=10)[-1] * 1e3 for n, t in taken.items()}
    rate = {n: len(t) / sum(t) for n, t in taken.items()}
    for name in ways:
        print(f"{name:8} p50 {p50[name]:.3f} ms  p90 {p90[name]:.3f} ms  {rate[name]:.0f} sends/s")
    print(
        f"confirm/plain: p50 x{p50['confirm'] / p50['plain']:.2f}, "
        f"p90 x{p90['confirm'] / p90['plain']:.2f}, rate x{rate['confirm'] / rate['plain']:.2f}"
    )


if __name__ == "__main__":
    main()

"""A root's task message as kombu would put it on a Redis broker: recorded, not sent.

For `fleet.storage.root_message`: the script that queues a root puts its message in the
same round trip. The message is kombu's own, built and routed by Celery and kombu as every
send is (`send_answered`): only its last step, the broker commands, is recorded instead of
run. kombu 5.7's `Producer._publish` hands a message to the producer's batch state, when
one is set (`Producer.batch`), as `publish(channel, message, **kwargs)`, and the Redis
channel's `_put` and `_put_fanout` give a batch each final command through
`add(name, *args)` (the task's `LPUSH`, its task-sent event's `PUBLISH`).
tests/test_root_message.py holds both points on kombu itself; if they go, nothing is
recorded and the message is sent apart, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery

from fleet.storage.root_message import Command


class _Recording:
    """Stands in for kombu's batch state on one producer: the commands kept, not sent."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []

    def publish(self, channel: Any, message: Any, **kwargs: Any) -> Any:
        return channel.basic_publish(message, _publish_batch=self, **kwargs)

    def add(self, name: str, *args: Any) -> None:
        self.commands.append((name, *args))


def recorded(app: Celery, send: Callable[[], None]) -> tuple[Command, ...] | None:
    """What `send()` through `app` would put on its Redis broker; None: not only that.

    `app` is a `workers.app.FleetCelery`: every send of this thread in `send()` takes the
    producer recorded here. None when kombu recorded nothing, or a command other than a
    list push or a publish of text (a queue with an expiry: the caller sends it apart).
    """
    recording = _Recording()
    with app.producer_or_acquire() as producer:
        producer._batch_local.current = recording
        app._pipelined.producer = producer
        try:
            send()
        finally:
            del app._pipelined.producer
            del producer._batch_local.current
    commands = recording.commands
    if not commands or not all(_plain(c) for c in commands):
        return None
    return tuple((str(c[0]), str(c[1]), str(c[2])) for c in commands)


def _plain(command: tuple[Any, ...]) -> bool:
    return (
        len(command) == 3
        and command[0] in ("lpush", "publish")
        and all(isinstance(part, str) for part in command[1:])
    )

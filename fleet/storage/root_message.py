"""A root's task message, put by the step that queues the root when the broker is the store.

`Fleet.submit` made two dependent round trips before a worker could take a new root: the
root's script (`TraceStore.queue_root`), then kombu's publish of the task message. When the
broker is the store's own Redis, the client's backend hands the message over as the Redis
commands kombu would send (`workers.root_message`), and the script that writes the root
runs them after its writes, only if it wrote it: one round trip, and a worker still never
takes a task whose trace is not there yet. Anywhere else (another broker, a cluster, a
fenced view, the memory store) they are not run, `sent` stays False, and the caller sends
the message itself, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleet.models import Trace

Command = tuple[str, str, str]
"""`('lpush', queue key, payload)` or `('publish', channel, payload)`."""


@dataclass
class RootMessage:
    """The task message of a root about to be queued, and whether it went with the root."""

    commands: Callable[[Trace], tuple[Command, ...] | None]
    """The broker commands of the message for the root as queued; None: send it apart."""
    sent: bool = False
    """Set by the step that queued the root when it ran the commands."""

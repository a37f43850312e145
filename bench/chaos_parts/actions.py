"""What the harness does to a tree while it runs, and once it ended.

`act` runs in a thread of its own beside the round's faults: it answers an `ask-reply`
tree's question once the tree waits on it, and sends a `message` tree a note while its
branches run. `follow_up` continues or rewinds a tree that completed (one more turn).
Refusals (the tree ended first, a stop came between) are expected: the fault decided.
"""

from __future__ import annotations

import contextlib
import time

import redis

from bench.chaos_parts.workload import Tree
from fleet.client import Fleet
from fleet.errors import FleetError

REPLY_WAIT_S = 30.0


def act(fleet: Fleet, tree: Tree, draw: float) -> None:
    """Reply or send, per `tree.action`; `draw` in [0, 1) picks the instant."""
    with contextlib.suppress(FleetError, redis.RedisError, OSError):
        if tree.action == "reply":
            deadline_s = time.monotonic() + REPLY_WAIT_S
            while fleet.trace(tree.root_id).status != "waiting":
                if time.monotonic() > deadline_s:
                    return
                time.sleep(0.1)
            fleet.reply(tree.root_id, "yes, go on")
        elif tree.action == "send":
            time.sleep(0.3 + 2 * draw)
            fleet.send(tree.root_id, "a note from the operator: carry on")


def follow_up(fleet: Fleet, tree: Tree) -> bool:
    """Continue or rewind a completed tree; whether it runs again."""
    if tree.action not in ("continue", "rewind"):
        return False
    with contextlib.suppress(FleetError, redis.RedisError, OSError):
        if fleet.trace(tree.root_id).status != "completed":
            return False
        after = None
        if tree.action == "rewind":
            first = next(m for m in fleet.store.messages(tree.root_id) if m.role == "user")
            after = first.sequence
        fleet.continue_trace(tree.root_id, "once more", after_sequence=after)
        return True
    return False

"""What the harness does to a tree while it runs, and once it ended.

`act` runs in a thread of its own beside the round's faults: it answers an `ask-reply`
tree's question, approves or denies an approval tree's call once the tree waits on
it, and sends a `message` tree a note while its branches run. `follow_up` continues or
rewinds a tree that completed (one more turn).
Refusals (the tree ended first, a stop came between) are expected: the fault decided.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import redis

from bench.chaos_parts.workload import Tree
from fleet.client import Fleet
from fleet.errors import FleetError

REPLY_WAIT_S = 30.0
REFLECT_WAIT_S = 60.0
ANSWERS: dict[str, Callable[[Fleet, str], object]] = {
    "reply": lambda fleet, root: fleet.reply(root, "yes, go on"),
    "approve": lambda fleet, root: fleet.approve(root),
    "deny": lambda fleet, root: fleet.deny(root, "not now"),
}
"""How a tree waiting on a person is answered, by its action."""


def act(fleet: Fleet, tree: Tree, draw: float) -> None:
    """Reply, approve, deny or send, per `tree.action`; `draw` in [0, 1) picks the instant.

    A store away (a fault of the round) is waited out: the person answers once it is back.
    """
    deadline_s = time.monotonic() + REPLY_WAIT_S
    while time.monotonic() < deadline_s:
        try:
            if _act_once(fleet, tree, draw):
                return
        except (redis.RedisError, OSError):
            pass
        except FleetError:  # refused: the tree ended or moved on first (a stop, a timeout)
            return
        time.sleep(0.2)


def _act_once(fleet: Fleet, tree: Tree, draw: float) -> bool:
    """Whether the action is done (or there is none)."""
    if tree.action in ANSWERS:
        if fleet.trace(tree.root_id).status != "waiting":
            return False
        ANSWERS[tree.action](fleet, tree.root_id)
    elif tree.action == "send":
        time.sleep(0.3 + 2 * draw)
        fleet.send(tree.root_id, "a note from the operator: carry on")
    return True


def follow_up(fleet: Fleet, tree: Tree) -> bool:
    """Continue or rewind a completed tree (whether it runs again), or reflect on it."""
    if tree.action == "learn":
        _learn(fleet, tree)
        return False
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


def _learn(fleet: Fleet, tree: Tree) -> None:
    """Reflect on a completed tree; `outcome["reflected"]` when the reflection answered."""
    with contextlib.suppress(FleetError, redis.RedisError, OSError):
        if fleet.trace(tree.root_id).status != "completed":
            return
        fleet.reflect(tree.root_id, timeout_s=REFLECT_WAIT_S)
        tree.outcome["reflected"] = True

"""The faults a round draws, with weights, and how each is injected.

Every backend has the worker and client faults (`stop` of a random tree, SIGKILL of a
worker, SIGSTOP of one for a few seconds, SIGKILL of the MCP servers a worker started)
and the providers' (an outage, a rate limit hit, a hostile Batch API output file); each
backend adds its own data faults (`Backend.data_faults`): a Redis restart or SIGKILL and a
broker restart on a single Redis, a Sentinel failover, a Cluster master killed and its
replica promoted or a tree's slot migrated to another master, a restart of the private
RabbitMQ node. A fault that cannot act (no live worker, no MCP server started yet) is
still counted: it landed, and nothing was there to break.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import redis

from bench.chaos_parts.backends import Backend
from fleet.errors import FleetError

COMMON = {"stop": 4, "worker-kill": 3, "worker-freeze": 2, "mcp-kill": 1}
DATA = {
    "redis-restart": 1,
    "redis-kill": 1,
    "broker-restart": 1,
    "sentinel-failover": 2,
    "cluster-master-kill": 2,
    "provider-down": 1,
    "provider-429": 1,
    "batch-malformed": 1,
    "cluster-slot-migrate": 2,
    "rabbitmq-restart": 1,
}
MCP_COMMANDS = (b"mcp_test_server", b"mcp_raw_server", b"mcp-server-git")
"""What the MCP servers' command lines hold (`mcp-kill` kills each)."""
FREEZE_S = (1.0, 8.0)
"""How long a frozen worker stays stopped (its leases lapse past the 5 s TTL)."""


def kinds_of(the: Backend, only: tuple[str, ...] = ()) -> tuple[list[str], list[int]]:
    """The faults this backend can take (of `only`, when it names any it takes), weights."""
    names = [*COMMON, *the.data_faults]
    names = [n for n in names if n in only] or names if only else names
    return names, [COMMON.get(n) or DATA[n] for n in names]


def inject(
    kind: str,
    the: Backend,
    roots: list[str],
    rng: random.Random,
    freeze_s: tuple[float, float] = FREEZE_S,
) -> None:
    """Inject one fault of `kind` now (a frozen worker thaws within `freeze_s`)."""
    actions: dict[str, Callable[[], object]] = {
        "stop": lambda: _stop(the, rng.choice(roots)) if roots else None,
        "worker-kill": lambda: _signal_worker(the, rng, signal.SIGKILL),
        "worker-freeze": lambda: _freeze(the, rng, freeze_s),
        "mcp-kill": lambda: _kill_mcp_servers(the),
    }
    action = actions.get(kind) or (lambda: the.data_faults[kind](rng.randrange(1 << 16)))
    action()


def _stop(the: Backend, root_id: str) -> None:
    with contextlib.suppress(FleetError, redis.RedisError, OSError):
        the.fleet.stop(root_id)


def _signal_worker(the: Backend, rng: random.Random, signum: int) -> int | None:
    alive = [w for w in the.workers if w.process.poll() is None]
    if not alive:
        return None
    victim = rng.choice(alive)
    victim.signal(signum)
    return victim.pid


def _freeze(the: Backend, rng: random.Random, freeze_s: tuple[float, float]) -> None:
    pid = _signal_worker(the, rng, signal.SIGSTOP)
    if pid is None:
        return
    thaw = threading.Timer(rng.uniform(*freeze_s), _thaw, args=(pid,))
    thaw.daemon = True
    thaw.start()


def _thaw(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGCONT)


def _kill_mcp_servers(the: Backend) -> None:
    """SIGKILL every MCP server process the live workers started (their descendants)."""
    roots = {w.pid for w in the.workers if w.process.poll() is None}
    for pid in _mcp_server_pids(roots):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _mcp_server_pids(roots: set[int]) -> list[int]:
    parent: dict[int, int] = {}
    commands: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                commands[int(entry.name)] = (entry / "cmdline").read_bytes()
    found: list[int] = []
    for pid, command in commands.items():
        ancestor = parent.get(pid, 0)
        while ancestor > 1 and ancestor not in roots:
            ancestor = parent.get(ancestor, 0)
        if ancestor in roots and any(name in command for name in MCP_COMMANDS):
            found.append(pid)
    return found

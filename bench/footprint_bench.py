"""Redis memory per finished explore branch, before and after compaction (issue 30, item 4).

    python bench/footprint_bench.py [--sizes 100,1000] [--branch-turns 1]

Starts its own redis-server, runs an explore of N branches in this process on a scripted
model (the explore bench's shape: each branch calls `list_dir`, then answers) with the
Redis store, and reads `used_memory` after the tree finished and again after
`compact_tree` packed it (what the owner check does once the tree is quiet). The Lua VM is
reset (`SCRIPT FLUSH`) before each reading and the clients' buffers are left out, so that
neither counts. Prints KiB per branch before, after, and the ratio; then the same by
`MEMORY USAGE ... SAMPLES 0` of the tree's own keys (without the traces index's entries).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from fleet.inprocess import InProcessFleet  # noqa: E402
from fleet.settings import Settings  # noqa: E402
from fleet.storage import keys  # noqa: E402
from fleet.storage.backends.redis.compact import compact_tree, tree_ids  # noqa: E402
from fleet.storage.backends.redis.store import RedisStore  # noqa: E402
from fleetops.redis_server import start_redis_server  # noqa: E402
from tests.fleetkit import explore_script  # noqa: E402


def used_bytes(client: redis.Redis) -> int:
    """`used_memory` less the clients' buffers, with the Lua VM's garbage dropped first.

    The in-process fleet's threads hold up to 100 connections whose query buffers come and
    go with the load (tens of KiB each): they are not what the tree keeps.
    """
    client.script_flush()
    info = client.info("memory")
    return int(info["used_memory"]) - int(info["mem_clients_normal"])


def tree_bytes(client: redis.Redis, root: str) -> int:
    """`MEMORY USAGE` of every key of the tree (traces, children, collaborators, events)."""
    total = 0
    for trace_id in tree_ids(client, root):
        for key in (keys.trace, keys.children, keys.collaborators, keys.collaborator_order):
            total += client.memory_usage(key(trace_id), samples=0) or 0
    for key in (keys.events(root), keys.events_archive(root), keys.tree_dict(root)):
        total += client.memory_usage(key, samples=0) or 0
    return total


def measure(local: InProcessFleet, client: redis.Redis, tmp: Path, n: int, turns: int) -> None:
    """One explore of `n` branches: its KiB per branch before and after compaction."""
    model = explore_script(tmp / f"explore-{n}.yaml", n, branch_turns=turns)
    before = used_bytes(client)
    root = local.run("survey", model=model)
    assert root.status == "completed", root.error
    full, full_keys = used_bytes(client) - before, tree_bytes(client, root.trace_id)
    compact_tree(client, root.trace_id, keys.TRACE_TTL_S)
    packed, packed_keys = used_bytes(client) - before, tree_bytes(client, root.trace_id)
    kib = 1024 * n
    print(
        f"N={n:<5} used_memory KiB/br {full / kib:6.2f} -> {packed / kib:5.2f}"
        f" ({full / packed:4.1f}x)   keys KiB/br {full_keys / kib:6.2f} ->"
        f" {packed_keys / kib:5.2f} ({full_keys / packed_keys:4.1f}x)"
    )


def main(argv: list[str] | None = None) -> None:
    """Parse, start Redis, measure each size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--branch-turns", type=int, default=1)
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="footprint-"))
    with start_redis_server() as server:
        store = RedisStore.from_url(server.url)
        env = {"FLEET_REDIS_URL": server.url, "FLEET_WORKSPACE": str(tmp)}
        env |= {"FLEET_ALLOW_SCRIPTED": "1", "FLEET_WORKSPACE_ROOTS": str(tmp)}
        local = InProcessFleet.from_settings(Settings.from_env(env), store=store)
        local.run("warm-up", model=explore_script(tmp / "warm.yaml", 2))
        for n in (int(size) for size in args.sizes.split(",")):
            measure(local, store.client, tmp, n, args.branch_turns)
        store.close()


if __name__ == "__main__":
    main()

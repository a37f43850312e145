"""A local Redis Cluster of three masters, each with a replica, whose masters can be killed.

`kill_master` SIGKILLs a master (never the one the fleet's URL names: a worker started
later must find the cluster through it); its replica is promoted within the node timeout,
and the killed node comes back on its port as a replica of the new master, synced before
the next fault (else a second kill finds an empty replica to promote).

What made the first runs lose trees was this rig, not the fleet (a kill of a master
holding 3,000 keys, nothing of the fleet running: 992 gone before, 0 after): the
replicas had not made their first sync (a replica that never synced refuses to be
promoted), the killed node was restarted as soon as the first node flagged it `fail?`
(suspected, not failed over), and without persistence it came back empty as the master of
its slots, and its replica synced that emptiness. Now every replica has synced before the
first fault, the node comes back only once another master serves its slots, and nodes
keep an append-only file as the single Redis does.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from fleetops.redis_server import find_redis_server
from tests.redis_cluster import _ports, _wait_ping, _wait_state_ok

NODE_TIMEOUT_MS = 2000
"""A master silent this long is failed and its replica promoted (the default is 15 s)."""
PROMOTION_TIMEOUT_S = 30.0


@dataclass
class Cluster:
    """Six cluster nodes on 127.0.0.1."""

    folder: Path
    ports: list[int]
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The node the fleet starts from (never killed)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self, port: int) -> None:
        """Start (or restart) the node of `port` from its own folder."""
        node = self.folder / str(port)
        node.mkdir(exist_ok=True)
        argv = [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1"]
        argv += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        argv += ["--cluster-node-timeout", str(NODE_TIMEOUT_MS)]
        # Persisted as the single Redis is (fsync every second): a node that comes back has
        # its data, whatever the instant; a replica's full sync replaces it.
        argv += ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"]
        argv += ["--repl-diskless-sync-delay", "0"]  # a replica's sync starts at once
        argv += ["--dir", str(node)]
        self.processes[port] = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

    def masters(self) -> list[int]:
        """Ports of the nodes that are masters now, as the first node sees it."""
        return [port for port, _ in self._slot_owners()]

    def _slot_owners(self) -> list[tuple[int, str]]:
        """(port, first slot) of each healthy master holding slots, as the first node sees it.

        A node flagged `fail?` (PFAIL: only suspected, its replica not promoted yet) is
        not healthy either.
        """
        with redis.Redis(port=self.ports[0], decode_responses=True, socket_timeout=2) as client:
            nodes = client.execute_command("CLUSTER", "NODES")
        lines = nodes.splitlines() if isinstance(nodes, str) else []
        return [
            (int(parts[1].split(":")[1].split("@")[0]), parts[8].split("-")[0])
            for parts in (line.split() for line in lines)
            if "master" in parts[2] and "fail" not in parts[2] and len(parts) > 8
        ]

    def kill_master(self, choose: int) -> int:
        """SIGKILL the `choose`-th master but the first node; back as a replica. Its port.

        Back only once another node serves its slots: a node restarted before its replica
        was promoted (the first node showed it `fail?`, not yet failed over) took its slots
        back, and its replica synced from it; without persistence that emptied those slots
        (the trees the first runs counted gone: the rig's loss, not the fleet's).
        """
        owners = dict(self._slot_owners())
        victims = [p for p in owners if p != self.ports[0]]
        port = victims[choose % len(victims)]
        slot = owners[port]
        process = self.processes[port]
        process.kill()
        process.wait()
        deadline = time.monotonic() + PROMOTION_TIMEOUT_S
        while not self._served_elsewhere(slot, port) or not _state_ok(self.ports[0]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replica of {port} promoted in {PROMOTION_TIMEOUT_S} s")
            time.sleep(0.1)
        self.start(port)
        _wait_ping(port)
        _wait_synced(port)
        return port

    def _served_elsewhere(self, slot: str, port: int) -> bool:
        """Whether a healthy master other than the node on `port` holds `slot` now."""
        with contextlib.suppress(redis.RedisError, OSError):
            return any(p != port and first == slot for p, first in self._slot_owners())
        return False

    def migrate_slot(self, choose: int) -> int:
        """Move the slot of a tree's key (else any slot) to another master, mid-run; the slot.

        As `redis-cli --cluster reshard` does: the target IMPORTING, the source MIGRATING,
        the keys moved with MIGRATE in batches (clients meanwhile get ASK, a script over
        keys split between the two TRYAGAIN), then every master told the slot's new node.
        A step the cluster refuses (a view not settled after a master kill) is the rig's
        `RuntimeError`; a migration under way is finished, one not begun is left stable.
        """
        masters = sorted(set(self._owners().values()))  # serving slots (a settled view)
        with _client(masters[choose % len(masters)]) as probe:
            slot = _slot_of_a_tree(probe, choose)
        owner = self._owner(slot)
        others = [m for m in masters if m != owner]
        if owner is None or not others:
            raise RuntimeError(f"slot {slot} has no master to move from or to")
        target = others[choose % len(others)]
        begun = False
        try:
            with _client(owner) as src, _client(target) as dst:
                source_id = src.execute_command("CLUSTER", "MYID")
                target_id = dst.execute_command("CLUSTER", "MYID")
                dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
                src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
                begun = True
                while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                    src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
                self._assign(slot, target_id, [target, owner, *others])
        except redis.RedisError as exc:
            with contextlib.suppress(redis.RedisError):
                if begun:
                    self._assign(slot, target_id, [target, owner, *others])
                else:
                    for port in (owner, target):
                        with _client(port) as node:
                            node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
            raise RuntimeError(f"slot {slot} migration {owner} -> {target}: {exc}") from None
        return slot

    def _owners(self) -> dict[tuple[int, int], int]:
        """Slot range -> the port of the master serving it, as the first node sees it."""
        with _client(self.ports[0]) as node:
            ranges = node.execute_command("CLUSTER", "SLOTS")
        return {(int(start), int(end)): int(master[1]) for start, end, master, *_ in ranges}

    def _owner(self, slot: int) -> int | None:
        """The port of the master serving `slot`."""
        owners = self._owners().items()
        return next((port for (start, end), port in owners if start <= slot <= end), None)

    @staticmethod
    def _assign(slot: int, target_id: str, ports: list[int]) -> None:
        for port in ports:
            with _client(port) as node:
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def close(self) -> None:
        """Stop every node and remove the files."""
        for process in self.processes.values():
            process.kill()
            process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _wait_synced(port: int, timeout_s: float = PROMOTION_TIMEOUT_S) -> None:
    """Until the node back on `port` is a replica with its master's data.

    Without this wait a later kill of the promoted master could land before its new
    replica synced: the replica promoted then holds nothing, and every tree of those
    slots is gone (the first runs counted 13 trees gone in 11 kills).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            with redis.Redis(port=port, decode_responses=True, socket_timeout=2) as client:
                info = client.info("replication")
            if info.get("role") == "slave" and info.get("master_link_status") == "up":
                return
        time.sleep(0.2)
    raise TimeoutError(f"the node on {port} did not sync as a replica in {timeout_s:.0f} s")


def _role(port: int) -> str:
    with redis.Redis(port=port, decode_responses=True, socket_timeout=2) as client:
        return str(client.info("replication").get("role"))


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, decode_responses=True, socket_timeout=10)


def _slot_of_a_tree(node: Any, choose: int) -> int:
    """The slot of a tree key on `node` (a hash-tagged key), else any slot."""
    for _ in range(20):
        key = node.randomkey()
        if key is None:
            break
        if "{" in str(key) and "{batch}" not in str(key):
            return int(node.execute_command("CLUSTER", "KEYSLOT", key))
    return choose % 16384


def _state_ok(port: int) -> bool:
    with contextlib.suppress(redis.RedisError, OSError):
        with redis.Redis(port=port, decode_responses=True, socket_timeout=2) as client:
            return "cluster_state:ok" in str(client.execute_command("CLUSTER", "INFO"))
    return False


@contextlib.contextmanager
def replicated_cluster() -> Iterator[Cluster]:
    """Three masters covering every slot, each with one replica."""
    cli = shutil.which("redis-cli")
    if cli is None:
        raise RuntimeError("redis-cli is needed to create a cluster")
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="fleet-chaos-cluster-")), _ports(6))
    try:
        for port in cluster.ports:
            cluster.start(port)
        for port in cluster.ports:
            _wait_ping(port)
        nodes = [f"127.0.0.1:{port}" for port in cluster.ports]
        subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for port in cluster.ports:
            _wait_state_ok(port)
        # Every replica synced before the first fault: one that never synced refuses to be
        # promoted (its data counts as too old), so a master killed in the first seconds
        # (the first sync waited out `repl-diskless-sync-delay`, 5 s) was never failed over.
        for port in cluster.ports:
            if _role(port) == "slave":
                _wait_synced(port)
        yield cluster
    finally:
        cluster.close()

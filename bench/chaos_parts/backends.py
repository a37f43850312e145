"""Where a chaos session runs: the store, the broker, the workers, and their data faults.

    with backend("sentinel", "redis", folder, extra_env) as b:  # b.fleet, b.workers, b.env

- `redis`: one redis-server with its append-only file (fsync every second).
- `sentinel`: a primary with a password, its replica, a sentinel; a failover SIGKILLs the
  master, waits for the sentinel to promote the replica, and brings the killed node back
  as the new master's replica (so a later round can fail over again).
- `cluster`: three masters with a replica each (`chaos_parts.cluster`); Celery's broker and
  results on a single Redis beside it, as docs/operations.md says.

The broker is that Redis (the cluster's side Redis), or `rabbitmq`: a vhost of its own on
the machine's RabbitMQ (other people's queues are never touched; the vhost is deleted at
the end), or `rabbitmq-node`: a private RabbitMQ node (`chaos_parts.rabbit`) that the
`rabbitmq-restart` fault restarts (the shared one is never restarted).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench.chaos_parts.cluster import Cluster, replicated_cluster
from bench.chaos_parts.rabbit import private_node
from bench.fault_rig import Redis, Worker, start_worker, wait_consuming
from fleet.client import Fleet
from fleet.settings import Settings
from fleet.storage import keys
from fleetops.redis_server import start_redis_server
from tests.redis_topologies import (
    BASE_CONFIG,
    FAILOVER_TIMEOUT_MS,
    MASTER_NAME,
    Node,
    SentinelGroup,
    _synced,
    sentinel_group,
    start_node,
)

BACKENDS = ("redis", "sentinel", "cluster")
BROKERS = ("redis", "rabbitmq", "rabbitmq-node")
REDIS_PASSWORD = "chaos-Redis-pw-41f7"
"""The Sentinel group's password: a secret that must never show in a log."""
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672/"
CONCURRENCY = 8


@dataclass
class Backend:
    """A started store and broker, the workers on them and a client."""

    name: str
    broker: str
    env: dict[str, str]
    fleet: Fleet
    workers: list[Worker] = field(default_factory=list)
    dead_logs: list[Path] = field(default_factory=list)
    """Logs of the workers a fault took (scanned with the live ones')."""
    data_faults: dict[str, Callable[[int], None]] = field(default_factory=dict)
    """Fault kind -> injector (given a random number) for this store and broker."""

    def add_worker(self) -> Worker:
        """One more `fleet worker`, once it consumes."""
        worker = start_worker(self.env, CONCURRENCY)
        self.workers.append(worker)
        wait_consuming(self.fleet.store, [worker.name], timeout_s=120.0)
        return worker

    def replace_dead(self) -> None:
        """A fresh worker for each one a fault took."""
        for dead in [w for w in self.workers if w.process.poll() is not None]:
            self.dead_logs.append(dead.log_path)
            self.workers.remove(dead)
            self.add_worker()

    def logs(self) -> list[Path]:
        """Every worker log of the session."""
        return [*self.dead_logs, *(w.log_path for w in self.workers)]


@contextlib.contextmanager
def backend(
    name: str,
    broker: str,
    folder: Path,
    extra_env: dict[str, str],
    workers: int = 2,
    extra_faults: dict[str, Callable[[int], None]] | None = None,
) -> Iterator[Backend]:
    """Start the store `name` with broker `broker`, `workers` workers, and a client.

    `extra_faults` join the store's (the provider's outage, which any backend takes).
    """
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        env, faults = stack.enter_context(_STORES[name](folder))
        if broker == "rabbitmq":
            env["FLEET_BROKER_URL"] = stack.enter_context(_rabbitmq_vhost())
            faults.pop("broker-restart", None)
        elif broker == "rabbitmq-node":
            node = stack.enter_context(private_node(folder / "rabbitmq"))
            env["FLEET_BROKER_URL"] = node.url
            faults.pop("broker-restart", None)
            faults["rabbitmq-restart"] = node.restart
        faults |= extra_faults or {}
        env |= {
            "FLEET_WORKSPACE": str(folder),
            "FLEET_WORKSPACE_ROOTS": str(folder),
            "FLEET_ALLOW_SCRIPTED": "1",
            **extra_env,
        }
        # The key layout is set once per process (keys.use_cluster_layout): this process
        # serves the backends in turn, so it goes back to the plain one after a cluster.
        stack.callback(keys.use_cluster_layout, False)
        fleet = Fleet.from_env(Settings.from_env({**os.environ, **env}))
        the = Backend(name, broker, env, fleet, data_faults=faults)
        stack.callback(_stop_workers, the)
        for _ in range(workers):
            the.add_worker()
        yield the


def _stop_workers(the: Backend) -> None:
    for worker in the.workers:
        worker.stop()


Store = Iterator[tuple[dict[str, str], dict[str, Callable[[int], None]]]]


@contextlib.contextmanager
def _single(folder: Path) -> Store:
    server = Redis()
    try:

        def kill(_: int) -> None:
            server.server.process.kill()
            server.server.process.wait()
            server.server = start_redis_server(server.port, server.data_dir, appendonly=True)

        def restart(_: int) -> None:
            server.restart()

        faults: dict[str, Callable[[int], None]] = {
            "redis-restart": restart,
            "redis-kill": kill,
            "broker-restart": restart,
        }
        yield {"FLEET_REDIS_URL": server.url, "FLEET_BROKER_URL": server.url}, faults
    finally:
        server.close()


@contextlib.contextmanager
def _sentinel(folder: Path) -> Store:
    with sentinel_group(folder / "sentinel", sentinels=1, password=REDIS_PASSWORD) as group:
        env = {
            "FLEET_REDIS_URL": group.url,
            "FLEET_BROKER_URL": group.url,
            "FLEET_REDIS_SENTINEL_MASTER": MASTER_NAME,
        }
        fresh: list[Node] = []  # the nodes failovers start: the group knows only its own
        try:
            yield env, {"sentinel-failover": lambda _: fresh.append(failover(group))}
        finally:
            for node in fresh:
                node.kill()


def failover(group: SentinelGroup) -> Node:
    """SIGKILL the master, wait for the promotion, restart the old node as a replica (it)."""
    old = group.master_port()
    group.kill_primary()
    assert old is not None
    group.wait_promoted(old)
    new = group.master_port()
    survivor = next(n for n in (group.primary, group.replica) if n.port == new)
    auth = f'requirepass "{REDIS_PASSWORD}"\nmasterauth "{REDIS_PASSWORD}"\n'
    config = BASE_CONFIG + auth + "port {port}\n" + f"replicaof 127.0.0.1 {new}\n"
    name = f"replica-{os.urandom(3).hex()}"
    fresh = start_node(group.directory, config, _synced(REDIS_PASSWORD), name)
    group.primary, group.replica = survivor, fresh
    _wait_known(group, fresh.port)
    return fresh


def _wait_known(group: SentinelGroup, port: int, timeout_s: float = 60.0) -> None:
    """Until the sentinel lists the new replica as healthy and its failover may run again.

    A sentinel learns a replica from the master's INFO (every 10 s) and fails the same
    master over again only after twice its failover timeout: a master killed before both
    stays dead (a run once waited 30 s for a failover that could not come).
    """
    deadline_s = time.monotonic() + timeout_s
    ready_after_s = time.monotonic() + 2 * FAILOVER_TIMEOUT_MS / 1000
    sentinel = group.sentinels[0]
    while time.monotonic() < deadline_s:
        with contextlib.suppress(redis.RedisError, OSError):
            with redis.Redis("127.0.0.1", sentinel.port, socket_timeout=1) as client:
                replicas = client.sentinel_slaves(MASTER_NAME)
            healthy = [
                r for r in replicas if int(r["port"]) == port and "down" not in str(r["flags"])
            ]
            if healthy and time.monotonic() >= ready_after_s:
                return
        time.sleep(0.2)
    raise TimeoutError(f"the sentinel did not take the replica on port {port} in {timeout_s} s")


@contextlib.contextmanager
def _cluster(folder: Path) -> Store:
    with replicated_cluster() as cluster, start_redis_server() as side:
        env = {
            "FLEET_REDIS_URL": cluster.url,
            "FLEET_REDIS_CLUSTER": "1",
            "FLEET_BROKER_URL": side.url,
            "FLEET_RESULT_BACKEND_URL": f"{side.url.rsplit('/', 1)[0]}/1",
        }
        yield (
            env,
            {
                "cluster-master-kill": lambda n: _kill_master(cluster, n),
                "cluster-slot-migrate": lambda n: _migrate(cluster, n),
            },
        )


def _kill_master(cluster: Cluster, choose: int) -> None:
    cluster.kill_master(choose)


def _migrate(cluster: Cluster, choose: int) -> None:
    cluster.migrate_slot(choose)


_STORES: dict[
    str,
    Callable[
        [Path],
        contextlib.AbstractContextManager[tuple[dict[str, str], dict[str, Callable[[int], None]]]],
    ],
] = {
    "redis": _single,
    "sentinel": _sentinel,
    "cluster": _cluster,
}


@contextlib.contextmanager
def _rabbitmq_vhost() -> Iterator[str]:
    """A vhost of this run's own on the local RabbitMQ, deleted afterwards."""
    vhost = f"fleet-chaos-{os.getpid()}"
    _rabbitmqctl("add_vhost", vhost)
    try:
        _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield RABBITMQ + vhost
    finally:
        _rabbitmqctl("delete_vhost", vhost)


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)

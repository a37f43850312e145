"""A local Redis Cluster of three masters for tests: redis-server processes on free ports."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from fleetops.redis_server import find_redis_server

MASTERS = 3
BUS_OFFSET = 10_000
"""Redis Cluster's bus port is the client port plus this."""


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ports(count: int) -> list[int]:
    """Free ports whose bus ports are free too (the bus port must stay below 65536)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + BUS_OFFSET < 65536 and port not in ports and _free(port + BUS_OFFSET):
            ports.append(port)
    return ports


@contextmanager
def redis_cluster() -> Iterator[list[str]]:
    """Three cluster-enabled masters covering every slot; yields their redis:// URLs."""
    cli = shutil.which("redis-cli")
    if cli is None:
        raise RuntimeError("redis-cli is needed to create a cluster")
    folder = Path(tempfile.mkdtemp(prefix="fleet-cluster-"))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        ports = _ports(MASTERS)
        for port in ports:
            node = folder / str(port)
            node.mkdir()
            argv = [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1"]
            argv += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            argv += ["--save", "", "--appendonly", "no", "--dir", str(node)]
            processes.append(
                subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        for port in ports:
            _wait_ping(port)
        nodes = [f"127.0.0.1:{port}" for port in ports]
        subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for port in ports:
            _wait_state_ok(port)
        yield [f"redis://127.0.0.1:{port}/0" for port in ports]
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def _wait_ping(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with redis.Redis(port=port) as client:
                client.ping()
                return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _wait_state_ok(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    with redis.Redis(port=port, decode_responses=True) as client:
        while "cluster_state:ok" not in str(client.execute_command("CLUSTER", "INFO")):
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster node {port} never reached cluster_state:ok")
            time.sleep(0.1)

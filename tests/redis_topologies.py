"""The Redis deployments production runs, started locally: TLS with ACL users, and Sentinel.

with tls_redis(tmp_dir) as server:                 # a CA, certificates, an ACL user
    server.url                                     # rediss://fleet:...@127.0.0.1:P/0?ssl_...
with sentinel_group(tmp_dir, sentinels=3) as group:
    group.url                                      # sentinel://127.0.0.1:S1;sentinel://...
    group.kill_primary()                           # SIGKILL; a sentinel promotes the replica

Every process is a `redis-server` on PATH (7.0, built with TLS) on free ports, in its own
session, stopped (SIGKILL) when the block ends; nothing is written outside `directory`.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis

from fleetops.redis_server import HOST, find_redis_server, free_port

START_TIMEOUT_S = 15.0
POLL_S = 0.05
MASTER_NAME = "fleetmaster"
DOWN_AFTER_MS = 1000
"""Sentinel: a master silent this long is subjectively down (the failover's first step)."""
FAILOVER_TIMEOUT_MS = 5000

FLEET_ACL = (
    "user fleet on >{password} resetkeys resetchannels"
    " ~fleet:* ~fleet.* ~celery* ~chord-unlock* ~_kombu.* ~unacked*"
    " ~*.celery.pidbox* &* -@all +@read +@write +@stream +@pubsub +@scripting"
    " +@transaction +@connection +@keyspace -@dangerous +info +time"
)
"""The ACL line docs/operations.md documents: the fleet's keys and Celery's (queues, results,
bindings, unacked bookkeeping, control replies), every pub/sub channel (Celery's events and
result notifications), and the commands of those categories without the dangerous ones
(no FLUSHDB, KEYS, CONFIG, DEBUG...), plus INFO (`fleet doctor`)."""


@dataclass(frozen=True)
class Certs:
    """A throw-away CA and the server's and client's certificates, signed by it."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certs(directory: Path) -> Certs:
    """Generate the CA and both certificates with `openssl` (P-256, valid one day)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    _openssl(["req", "-x509", "-nodes", "-days", "1", "-subj", "/CN=fleet-test-ca"], ca_key, ca)
    for name in ("server", "client"):
        key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
        _openssl(["req", "-nodes", "-subj", f"/CN={name}"], key, csr)
        extensions = directory / f"{name}.ext"
        extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        subprocess.run(
            ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key)]
            + ["-CAcreateserial", "-days", "1", "-out", str(cert), "-extfile", str(extensions)],
            check=True,
            capture_output=True,
        )
    server, client = (directory / "server", directory / "client")
    keys = (server.with_suffix(".crt"), server.with_suffix(".key"))
    return Certs(ca, *keys, client.with_suffix(".crt"), client.with_suffix(".key"))


def _openssl(args: list[str], key: Path, out: Path) -> None:
    newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    subprocess.run(
        ["openssl", *args[:1], *newkey, *args[1:], "-keyout", str(key), "-out", str(out)],
        check=True,
        capture_output=True,
    )


@dataclass
class Node:
    """One redis-server (or sentinel) process on 127.0.0.1."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def kill(self) -> None:
        """SIGKILL, as a lost machine."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def log_tail(self, lines: int = 8) -> str:
        """The end of its log, for a failure message."""
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return " | ".join(text[-lines:])


def start_node(directory: Path, config: str, ready: Callable[[int], bool], name: str) -> Node:
    """redis-server reading `config` (its port is `{port}` in it) from a file in `directory`."""
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / f"{name}.conf"
    log = directory / f"{name}.log"
    conf.write_text(config.format(port=port, dir=directory, log=log))
    conf.chmod(0o600)  # it may hold a password
    sentinel = ["--sentinel"] if "sentinel monitor" in config else []
    process = subprocess.Popen(
        [find_redis_server(), str(conf), *sentinel],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=directory,
        start_new_session=True,
    )
    node = Node(process, port, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready(port):
        if process.poll() is not None or time.monotonic() > deadline:
            node.kill()
            raise RuntimeError(f"{name} did not start: {node.log_tail()}")
        time.sleep(POLL_S)
    return node


def _answers(**options: object) -> Callable[[int], bool]:
    def ready(port: int) -> bool:
        try:
            with redis.Redis(HOST, port, socket_timeout=0.5, **options) as client:  # type: ignore[arg-type]
                return bool(client.ping())
        except (redis.RedisError, OSError):
            return False

    return ready


BASE_CONFIG = 'bind 127.0.0.1\nsave ""\nappendonly no\ndir {dir}\nlogfile {log}\n'


# -- TLS with ACL users ----------------------------------------------------------------------


@dataclass
class TlsRedis:
    """A redis-server that speaks only TLS, with the fleet's ACL user and an admin."""

    node: Node
    certs: Certs
    password: str = field(repr=False)
    admin_password: str = field(repr=False)

    def url_for(self, user: str, password: str) -> str:
        """A `rediss://` URL of database 0 with the CA and the client certificate."""
        query = (
            f"ssl_ca_certs={self.certs.ca}&ssl_certfile={self.certs.client_cert}"
            f"&ssl_keyfile={self.certs.client_key}&ssl_cert_reqs=required"
        )
        return f"rediss://{user}:{quote(password, safe='')}@{HOST}:{self.node.port}/0?{query}"

    @property
    def url(self) -> str:
        """The fleet user's URL."""
        return self.url_for("fleet", self.password)

    @property
    def admin_url(self) -> str:
        """An all-powerful user's URL (to empty the database between tests)."""
        return self.url_for("admin", self.admin_password)


@contextlib.contextmanager
def tls_redis(directory: Path, password: str = "fleet-Pass-1") -> Iterator[TlsRedis]:
    """A TLS-only redis-server whose clients must show a certificate; ACL users as above."""
    certs = make_certs(directory / "certs")
    admin_password = "admin-Pass-2"
    config = BASE_CONFIG + (
        "port 0\ntls-port {port}\n"
        f"tls-cert-file {certs.server_cert}\ntls-key-file {certs.server_key}\n"
        f"tls-ca-cert-file {certs.ca}\ntls-auth-clients yes\n"
        "user default off\n"
        f"user admin on >{admin_password} ~* &* +@all\n"
        + FLEET_ACL.format(password=password)
        + "\n"
    )
    tls = {
        "ssl": True,
        "ssl_ca_certs": str(certs.ca),
        "ssl_certfile": str(certs.client_cert),
        "ssl_keyfile": str(certs.client_key),
        "username": "admin",
        "password": admin_password,
    }
    node = start_node(directory, config, _answers(**tls), "tls-redis")
    try:
        yield TlsRedis(node, certs, password, admin_password)
    finally:
        node.kill()


# -- Sentinel ---------------------------------------------------------------------------------


@dataclass
class SentinelGroup:
    """A primary, a replica of it, and sentinels that monitor it as MASTER_NAME."""

    primary: Node
    replica: Node
    sentinels: list[Node]
    directory: Path
    password: str | None = field(default=None, repr=False)
    """The data nodes' `requirepass`, if any (in the URL's userinfo)."""
    sentinel_password: str | None = field(default=None, repr=False)
    """The sentinels' `requirepass`, if any (`?sentinel_password=` in the URL)."""

    @property
    def url(self) -> str:
        """`sentinel://127.0.0.1:S1/0;sentinel://127.0.0.1:S2/0`, as Celery writes it."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        parts = [f"sentinel://{auth}{HOST}:{s.port}/0" for s in self.sentinels]
        if self.sentinel_password:  # the options go on the first part
            parts[0] += f"?sentinel_password={quote(self.sentinel_password, safe='')}"
        return ";".join(parts)

    def master_port(self) -> int | None:
        """The master's port as the first live sentinel reports it."""
        for node in self.sentinels:
            with contextlib.suppress(redis.RedisError):
                with redis.Redis(
                    HOST, node.port, socket_timeout=1, password=self.sentinel_password
                ) as client:
                    address = client.sentinel_get_master_addr_by_name(MASTER_NAME)
                    return int(address[1]) if address else None
        return None

    def kill_primary(self, replica_behind_s: float = 0.0) -> int:
        """SIGKILL whichever node is the master now; bytes of writes the replica missed.

        With `replica_behind_s`, the replica is frozen (SIGSTOP) that long first, so the
        master acknowledges writes the replica never gets: the replica promoted lacks them.
        The count is the master's replication offset at the kill minus what the replica
        had acknowledged: an upper bound of what it lacks (it acknowledges once a second).
        """
        port = self.master_port()
        master = next(n for n in (self.primary, self.replica) if n.port == port)
        replica = self.replica if master is self.primary else self.primary
        if replica_behind_s:
            replica.process.send_signal(signal.SIGSTOP)
            time.sleep(replica_behind_s)
        missed = _replica_lag_bytes(master.port, self.password)
        master.kill()
        if replica_behind_s:
            replica.process.send_signal(signal.SIGCONT)
        return missed

    def wait_promoted(self, old_port: int, timeout_s: float = 30.0) -> float:
        """Seconds until the sentinels name another master than `old_port`."""
        started_s = time.monotonic()
        while (port := self.master_port()) in (old_port, None):
            if time.monotonic() - started_s > timeout_s:
                raise TimeoutError(f"no failover after {timeout_s:.0f} s (master {port})")
            time.sleep(POLL_S)
        return time.monotonic() - started_s

    def nodes(self) -> list[Node]:
        """Every process of the group."""
        return [self.primary, self.replica, *self.sentinels]


@contextlib.contextmanager
def sentinel_group(
    directory: Path,
    sentinels: int = 1,
    password: str | None = None,
    sentinel_password: str | None = None,
    certs: Certs | None = None,
) -> Iterator[SentinelGroup]:
    """Start the primary, its replica (synced) and `sentinels` sentinels (quorum 1).

    With `password`, both data nodes require it (and use it to replicate); the sentinels
    know it (`auth-pass`). With `sentinel_password`, the sentinels require it too
    (`requirepass`, and `sentinel-pass` among themselves). With `certs`, the data nodes
    speak only TLS (replication too, clients showing a certificate), and the sentinels
    reach them over TLS while answering on plain TCP.
    """
    started: list[Node] = []
    auth = f'requirepass "{password}"\nmasterauth "{password}"\n' if password else ""
    tls = _tls_config(certs) if certs else ""
    client_tls = _client_tls(certs) if certs else {}
    try:
        config = (
            BASE_CONFIG + auth + tls + ("port 0\ntls-port {port}\n" if certs else "port {port}\n")
        )
        answers = _answers(password=password, **client_tls)
        primary = start_node(directory, config, answers, "primary")
        started.append(primary)
        replica_config = config + f"replicaof {HOST} {primary.port}\n"
        replica = start_node(directory, replica_config, _synced(password, client_tls), "replica")
        started.append(replica)
        sentinel_auth = f"sentinel auth-pass {MASTER_NAME} {password}\n" if password else ""
        if sentinel_password:
            sentinel_auth += f'requirepass "{sentinel_password}"\n'
            sentinel_auth += f'sentinel sentinel-pass "{sentinel_password}"\n'
        sentinel_config = (
            sentinel_auth
            + tls
            + (
                "bind 127.0.0.1\nport {port}\ndir {dir}\nlogfile {log}\n"
                f"sentinel monitor {MASTER_NAME} {HOST} {primary.port} 1\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n"
            )
        )
        group = SentinelGroup(primary, replica, [], directory, password, sentinel_password)
        for i in range(sentinels):
            ready = _knows_replica(sentinel_password)
            node = start_node(directory, sentinel_config, ready, f"sentinel{i}")
            started.append(node)
            group.sentinels.append(node)
        yield group
    finally:
        for node in started:
            node.kill()


def _replica_lag_bytes(port: int, password: str | None) -> int:
    """The master's replication offset minus its replica's acknowledged one."""
    try:
        with redis.Redis(HOST, port, socket_timeout=1, password=password) as client:
            info = client.info("replication")
    except (redis.RedisError, OSError):
        return -1
    replica = info.get("slave0") or {}
    return int(info.get("master_repl_offset", 0)) - int(replica.get("offset", 0))


def _tls_config(certs: Certs) -> str:
    """A node that speaks TLS to its clients and its replicas (a sentinel: to the nodes)."""
    return (
        f"tls-cert-file {certs.server_cert}\ntls-key-file {certs.server_key}\n"
        f"tls-ca-cert-file {certs.ca}\ntls-replication yes\n"
        f"tls-client-cert-file {certs.client_cert}\ntls-client-key-file {certs.client_key}\n"
    )


def _client_tls(certs: Certs) -> dict[str, Any]:
    """redis-py's options for a client of a TLS node."""
    return {
        "ssl": True,
        "ssl_ca_certs": str(certs.ca),
        "ssl_certfile": str(certs.client_cert),
        "ssl_keyfile": str(certs.client_key),
    }


def _synced(password: str | None, tls: dict[str, Any] | None = None) -> Callable[[int], bool]:
    def synced(port: int) -> bool:
        try:
            with redis.Redis(
                HOST, port, socket_timeout=0.5, password=password, **(tls or {})
            ) as client:
                info = client.info("replication")
        except (redis.RedisError, OSError):
            return False
        return bool(info.get("master_link_status") == "up")

    return synced


def _knows_replica(password: str | None = None) -> Callable[[int], bool]:
    def knows(port: int) -> bool:
        """A sentinel that has found the replica (it can fail over to it)."""
        try:
            with redis.Redis(HOST, port, socket_timeout=0.5, password=password) as client:
                return bool(client.sentinel_slaves(MASTER_NAME))
        except (redis.RedisError, OSError):
            return False

    return knows

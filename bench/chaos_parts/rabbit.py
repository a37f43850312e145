"""A RabbitMQ node of the chaos run's own, so that it can be restarted mid-round.

The machine's RabbitMQ (127.0.0.1:5672) is shared with CI and never restarted. This starts
`rabbitmq-server` again from its installed scripts as a second, private node: its own node
name, AMQP and distribution ports, data, logs, an empty env file and no plugins (so none of
the shared node's settings or ports are taken), its own Erlang cookie (HOME is the node's
folder). It registers its name with the machine's epmd, as any second node does, and
touches nothing else. `restart(n)` stops it (SIGKILL of the node for odd `n`, a clean
`rabbitmqctl stop` for even) and starts it on the same data: durable queues and persistent
messages survive, as after a real broker restart.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from bench.fault_rig import wait_for

START_TIMEOUT_S = 300.0
"""A node's boot: 10-60 s alone; three `make chaos` seeds booting theirs at once at load 20
took over 120 s (seven sessions of a run were not run for it)."""


def installed() -> Path | None:
    """The directory of the installed server's own scripts (`sbin`), if any."""
    found = sorted(glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin"))
    return Path(found[-1]) if found else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Node:
    """One private RabbitMQ node in `folder`."""

    def __init__(self, sbin: Path, folder: Path) -> None:
        """Prepared: ports chosen, files written; `start` runs it."""
        self.sbin, self.folder = sbin, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port, dist = _free_port(), _free_port()
        self.name = f"chaos{os.getpid()}p{self.port}@localhost"
        (folder / "enabled_plugins").write_text("[].\n")
        (folder / "env.conf").write_text("")
        (folder / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{self.port}\n")
        self.env = {
            **os.environ,
            "HOME": str(folder),
            "RABBITMQ_CONF_ENV_FILE": str(folder / "env.conf"),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(dist),
            "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(folder / "log"),
            "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(folder / "pid"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The broker URL workers are given."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def start(self) -> None:
        """Start the node and wait until it takes AMQP connections."""
        with (self.folder / "server.log").open("ab") as log:  # the node keeps its own copy
            self.process = subprocess.Popen(
                [str(self.sbin / "rabbitmq-server")],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self._answers, START_TIMEOUT_S, f"the private RabbitMQ node {self.name}")

    def _answers(self) -> bool:
        ctl = [str(self.sbin / "rabbitmqctl"), "-n", self.name, "await_startup", "-t", "5"]
        with contextlib.suppress(subprocess.TimeoutExpired):
            done = subprocess.run(ctl, env=self.env, capture_output=True, timeout=30)
            return done.returncode == 0
        return False

    def stop(self, kill: bool = False) -> None:
        """Stop the node: a clean `rabbitmqctl stop`, or SIGKILL of its process group."""
        if self.process is None:
            return
        if not kill:
            ctl = [str(self.sbin / "rabbitmqctl"), "-n", self.name, "stop"]
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(ctl, env=self.env, capture_output=True, timeout=60)
        _kill_group(self.process.pid)
        self.process.wait()
        self.process = None
        time.sleep(0.5)  # epmd forgets the name once the node's connection closed

    def restart(self, choose: int) -> None:
        """Stop (killed for odd `choose`) and start again on the same data."""
        self.stop(kill=choose % 2 == 1)
        self.start()


def _kill_group(pgid: int) -> None:
    """SIGKILL the node's processes (its process group), never an epmd: that one may be
    the machine's, which the shared node's name is registered with."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            if b"epmd" in (entry / "cmdline").read_bytes():
                continue
            os.kill(int(entry.name), signal.SIGKILL)


@contextlib.contextmanager
def private_node(folder: Path) -> Iterator[Node]:
    """A started private node, stopped (and its files left in `folder`) afterwards."""
    sbin = installed()
    if sbin is None:
        raise RuntimeError("rabbitmq-server is not installed: no private broker node")
    node = Node(sbin, folder)
    try:
        node.start()
        yield node
    finally:
        node.stop(kill=True)

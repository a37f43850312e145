"""Issue 39, route 5: `fleet mcp --http` on another loopback address.

Bound to 127.0.0.2 (any 127.0.0.0/8 address but 127.0.0.1) it counted as loopback: it
asked no token, and the MCP SDK's Host/Origin check, switched on only for 127.0.0.1,
localhost and ::1, was off, so a DNS-rebinding page (`Host: evil.example:P`) created trees.
Linux routes the whole of 127.0.0.0/8 to `lo`, so a real server binds 127.0.0.2 here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from fleetops.cli.mcp import allowed_hosts, mcp_token
from fleetops.cli.serve import serve_token

pytestmark = pytest.mark.integration

OTHER_LOOPBACK = "127.0.0.2"
TOKEN = "a-long-enough-test-token"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "rebinding-page", "version": "1"},
    },
}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def mcp_argv(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fleetops.cli.main", "mcp", "--http", str(port), *extra]


def base_env(redis_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_SERVE")}
    return {**env, "FLEET_REDIS_URL": redis_url, "FLEET_BROKER_URL": redis_url, **extra}


@contextmanager
def mcp_http(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def post(url: str, headers: dict[str, str]) -> httpx.Response:
    """POST initialize once the server listens (its Python may start slowly on a loaded machine)."""
    deadline = time.monotonic() + 90
    while True:
        try:
            return httpx.post(url, json=INITIALIZE, headers={**ACCEPT, **headers}, timeout=10)
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_without_a_token_another_loopback_address_is_refused_at_start(redis_url: str) -> None:
    """Route: on 127.0.0.2 the server asked no token and answered a rebinding page.
    Control: every address but 127.0.0.1/::1/localhost needs the token: one line, exit 2,
    nothing listens."""
    port = free_port(OTHER_LOOPBACK)
    argv = mcp_argv(port, "--address", OTHER_LOOPBACK)
    with mcp_http(argv, base_env(redis_url)) as process:
        assert process.stdout is not None
        first = process.stdout.readline().decode()  # the ready line, or the refusal
        if first.startswith("fleet mcp: http://"):
            answer = post(f"http://{OTHER_LOOPBACK}:{port}/mcp", {"Host": f"evil.example:{port}"})
            pytest.fail(f"it served without a token; a rebinding page got {answer.status_code}")
        code = process.wait(30)
        rest = process.stdout.read().decode()
    assert code == 2 and rest == "", first + rest
    line = first.strip()
    assert "'127.0.0.2' would be open to the network: set FLEET_SERVE_TOKEN" in line


def test_a_rebinding_host_or_origin_on_127_0_0_2_is_refused(redis_url: str) -> None:
    """Route: a DNS-rebinding page reaches the server under its own name. Control: the
    Host and Origin checks are on at every address and answer only the bound address
    (and `localhost` on loopback); the token is checked as well."""
    port = free_port(OTHER_LOOPBACK)
    argv = mcp_argv(port, "--address", OTHER_LOOPBACK)
    url = f"http://{OTHER_LOOPBACK}:{port}/mcp"
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with mcp_http(argv, base_env(redis_url, FLEET_SERVE_TOKEN=TOKEN)):
        rebound = post(url, {**bearer, "Host": f"evil.example:{port}"})
        other_origin = post(url, {**bearer, "Origin": f"http://evil.example:{port}"})
        no_token = post(url, {"Host": f"{OTHER_LOOPBACK}:{port}"})
        own = post(url, bearer)
        localhost = post(url, {**bearer, "Host": f"localhost:{port}"})
    assert rebound.status_code == 421, rebound.text
    assert other_origin.status_code == 403, other_origin.text
    assert no_token.status_code == 401
    assert own.status_code == 200 and localhost.status_code == 200, own.text


def test_the_token_and_host_rules_at_each_address() -> None:
    """The rule, address by address: the token on all but 127.0.0.1/::1/localhost (`fleet
    serve` too); the Hosts answered; a wildcard address names its hosts or is refused."""
    for address in ("127.0.0.1", "::1", "localhost"):
        assert mcp_token(address, None) is None
        assert serve_token(address, {}) is None
    for address in ("127.0.0.2", "127.255.255.254", "0.0.0.0", "10.0.0.5", "::"):
        with pytest.raises(Exception, match="set FLEET_SERVE_TOKEN"):
            mcp_token(address, None)
        with pytest.raises(Exception, match="set FLEET_SERVE_TOKEN"):
            serve_token(address, {})
    assert allowed_hosts("127.0.0.2", 80) == ["127.0.0.2:80", "localhost:80"]
    assert allowed_hosts("::1", 80) == ["[::1]:80", "localhost:80"]
    assert allowed_hosts("10.0.0.5", 80) == ["10.0.0.5:80"]
    assert allowed_hosts("0.0.0.0", 80, ["mcp.internal"]) == ["mcp.internal:*", "mcp.internal"]
    with pytest.raises(Exception, match="--allow-host"):
        allowed_hosts("0.0.0.0", 80)

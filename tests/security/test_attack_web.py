"""Route 4: `web_fetch` steered at loopback, private networks, metadata, or a redirect there."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from fleet.inprocess import InProcessFleet
from fleet.models import text_of
from fleet.settings import Settings
from fleet.testing import ScriptedModel, calls, text
from fleet.tools.base import ToolContext
from fleet.tools.web import web_fetch
from tests.security.attacker import Attacker, attacker_server


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    with attacker_server() as server:
        yield server


def internal_urls(port: int) -> list[str]:
    """Every spelling of "this machine" or "the network next to it" the issue lists."""
    return [
        f"http://127.0.0.1:{port}/",
        f"http://localhost:{port}/",
        f"http://[::ffff:127.0.0.1]:{port}/",
        f"http://[::1]:{port}/",
        f"http://2130706433:{port}/",  # decimal
        f"http://0x7f.0.0.1:{port}/",  # hex
        f"http://0177.0.0.1:{port}/",  # octal
        f"http://0.0.0.0:{port}/",  # Linux connects this to loopback
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata
        "http://100.64.0.1/",  # CGNAT
        "http://10.0.0.1/",
        "http://192.168.1.1/",
    ]


def fetch_all(tmp_path: Path, urls: list[str], allow: str = "") -> list[tuple[bool, str]]:
    """A main agent that web_fetches every url in one turn; (is_error, output) per call."""
    model = ScriptedModel([calls(*[("web_fetch", {"url": url}) for url in urls]), text("fetched")])
    env = {"FLEET_WORKSPACE": str(tmp_path), "FLEET_WEB_ALLOW": allow}
    local = InProcessFleet.from_settings(Settings.from_env(env), clients={"m": model})
    trace = local.run("read these pages", model="m")
    tools = [m for m in local.store.messages(trace.trace_id) if m.role == "tool"]
    return [(bool(m.metadata.get("is_error")), text_of(m.content)) for m in tools]


def test_web_fetch_refuses_every_internal_address(tmp_path: Path, attacker: Attacker) -> None:
    """Route: web_fetch reached 127.0.0.1, localhost, [::ffff:127.0.0.1], 2130706433 (and
    with Flower on loopback read other trees' task text). Control: every hop is resolved
    once and refused unless public or in FLEET_WEB_ALLOW."""
    port = int(attacker.url.rsplit(":", 1)[1])

    results = fetch_all(tmp_path, internal_urls(port))

    assert len(results) == len(internal_urls(port))
    for url, (is_error, output) in zip(internal_urls(port), results, strict=True):
        assert is_error and "web_fetch refuses" in output, (url, output)
    assert attacker.requests == []


def test_a_redirect_to_loopback_is_refused_at_the_hop(tmp_path: Path) -> None:
    """Route: an allowed page answered 302 to loopback and web_fetch followed it.
    Control: redirects are followed by hand and every hop is checked again."""
    with ExitStack() as stack:
        secret = stack.enter_context(attacker_server())
        redirector = stack.enter_context(attacker_server(host="127.0.0.2"))
        redirector.redirect_to = f"{secret.url}/flower/api/tasks"

        results = fetch_all(tmp_path, [f"{redirector.url}/start"], allow="127.0.0.2")

    assert len(redirector.requests) == 1  # the first hop was allowed by the operator
    assert results[0][0] and "web_fetch refuses '127.0.0.1'" in results[0][1]
    assert secret.requests == []


def test_the_connection_goes_to_the_address_that_was_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control (DNS rebinding): the name is resolved once; a second lookup that now says
    loopback is never made, the request goes to the checked address with the name as Host."""
    with ExitStack() as stack:
        checked = stack.enter_context(attacker_server(host="127.0.0.2"))
        port = int(checked.url.rsplit(":", 1)[1])
        rebound = stack.enter_context(attacker_server(port=port))
        real = socket.getaddrinfo
        answers = iter(["127.0.0.2"])

        def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
            if host == "rebind.test":
                return real(next(answers, "127.0.0.1"), *args, **kwargs)
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", rebinding)
        ctx = ToolContext(workspace=tmp_path, web_allow=("127.0.0.2",))
        result = web_fetch(ctx, f"http://rebind.test:{port}/page")

    assert not result.is_error, result.output
    assert len(checked.requests) == 1 and "Host: rebind.test" in checked.requests[0]["headers"]
    assert rebound.requests == []
